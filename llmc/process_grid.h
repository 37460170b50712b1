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
    std::string describe() const;  // "dp 4 x tp 1 x pp 1 (rank 3 = dp 3, tp 0, pp 0)"
};

// Resolves parallel.dp ("auto" = world / (tp * pp)) and checks the layout against the world
// size. Throws UserError (the same one on every rank) when they disagree or when a layout
// is asked for that is not supported yet (tp > 1, pp > 1).
ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank);

// One communicator per group kind this rank belongs to, plus the world.
struct ProcessGroups {
    std::unique_ptr<Comm> world, dp, tp, pp;
};
// comm_kind: "mpi" (or "self" when the world is one process). Collective over the world.
ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind);
