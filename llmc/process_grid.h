// The process grid: world = dp x tp x pp, Megatron's order. tp varies fastest (a TP group is
// tp consecutive world ranks, so it sits inside a node), then dp, then pp:
//   world_rank = (pp_rank * dp + dp_rank) * tp + tp_rank
// Each rank belongs to one group of each kind; a group is the ranks that differ only in that
// coordinate. The groups' communicators live in ProcessGroups.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "llmc/comm.h"
#include "llmc/config.h"

struct ProcessGrid {
    int world = 1, rank = 0;
    int dp = 1, tp = 1, pp = 1;
    int dp_rank = 0, tp_rank = 0, pp_rank = 0;

    int world_rank_of(int dp_r, int tp_r, int pp_r) const { return (pp_r * dp + dp_r) * tp + tp_r; }
    // Every group of one kind (a partition of the world ranks), each in group-rank order.
    std::vector<std::vector<int>> dp_groups() const;
    std::vector<std::vector<int>> tp_groups() const;
    std::vector<std::vector<int>> pp_groups() const;
    // Model-parallel groups: the tp x pp ranks of one DP coordinate (one copy of the model), by world rank.
    std::vector<std::vector<int>> mp_groups() const;
    // The tied embedding's groups: the first and the last stage of each (dp, tp) pipeline; the
    // middle stages are groups of one.
    std::vector<std::vector<int>> embed_groups() const;
    std::string describe() const;  // "dp 4 x tp 1 x pp 1 (rank 3 = dp 3, tp 0, pp 0)"
};

// Resolves parallel.dp ("auto" = world / (tp * pp)) and checks the layout against the world
// size. Throws UserError (the same one on every rank) when they disagree.
ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank);

// One communicator per group kind this rank belongs to, plus the world.
struct ProcessGroups {
    std::unique_ptr<Comm> world, dp, tp, pp, mp, embed;
};
// comm_kind: "mpi" or "nccl" (every group is "self" when the world is one process); timeout_s:
// parallel.timeout_s, the watchdog of every blocking call; cuda_device: this rank's GPU (nccl).
// Collective over the world.
ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind, double timeout_s,
                                  int cuda_device);
