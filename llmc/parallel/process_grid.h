// The process grid: a mesh of named axes, slowest to fastest pp, dp, cp, tp (Megatron's order:
// a TP group is tp consecutive world ranks, so it sits inside a node):
//   world_rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank
// Any group is a slice of axes: the ranks that differ only in those coordinates. dp is the
// data-parallel axis, tp tensor (and sequence) parallelism, pp the pipeline stages, cp context
// parallelism (each sequence split over the cp ranks: llmc/parallel/context_parallel.h). The cp ranks of
// one dp rank hold the same parameters and see different tokens of the same sequences, so
// gradients are reduced, and ZeRO shards taken, over dp x cp: the "dp" group below is that
// slice (dp_cp ranks; of size dp when cp is 1).
// Expert parallelism (parallel.ep, model.moe) splits that dp x cp slice: its rank
// dp_cp_rank = edp_rank * ep + ep_rank. An "ep" group is ep consecutive members of the slice (the
// other coordinates equal; with cp > 1 they may be cp ranks of one sequence or several dp
// ranks): together they hold every expert of a layer once (ep_rank holds experts
// [ep_rank E/ep, (ep_rank+1) E/ep)) and trade routed tokens by all-to-all. An "expert-dp" group
// is the dp_cp/ep ranks with the same ep_rank (the same experts): the data-parallel group of the
// expert parameters, and ZeRO's shard group under expert parallelism (llmc/train/data_parallel.h).
// The groups' communicators live in ProcessGroups.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/core/config.h"

enum class Axis { pp, dp, cp, tp };
constexpr int kNumAxes = 4;
const char* axis_name(Axis a);

struct ProcessGrid {
    // One process: every axis of size 1.
    ProcessGrid() = default;
    // sizes in axis order (pp, dp, cp, tp); rank: this process's world rank
    // ep: expert-parallel ranks, a divisor of dp x cp (that slice split as above)
    ProcessGrid(std::array<int, kNumAxes> sizes, int rank, int ep = 1);

    int world = 1, rank = 0;
    // This rank's sizes and coordinates by name, set by the constructor (read-only by convention).
    int pp = 1, dp = 1, cp = 1, tp = 1;
    int pp_rank = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0;
    // The gradient-reduction (and ZeRO) group: dp x cp ranks; this rank's position in it.
    int dp_cp() const { return dp * cp; }
    int dp_cp_rank() const { return dp_rank * cp + cp_rank; }
    // Expert parallelism: the ep group's size and this rank's place in it, and the expert-dp group's.
    int ep = 1;
    int ep_rank() const { return dp_cp_rank() % ep; }
    int edp() const { return dp_cp() / ep; }
    int edp_rank() const { return dp_cp_rank() / ep; }
    // ZeRO's shard group: the dp x cp group, or the expert-dp group under expert parallelism.
    int shard_size() const { return ep > 1 ? edp() : dp_cp(); }
    int shard_rank() const { return ep > 1 ? edp_rank() : dp_cp_rank(); }

    int size(Axis a) const { return sizes_[size_t(a)]; }
    int coord(Axis a) const { return coords_[size_t(a)]; }
    int world_rank_of(std::array<int, kNumAxes> coords) const;
    // Every group spanning `axes` (a partition of the world ranks). Within a group ranks follow
    // mesh order (the slower axis first); the groups follow mesh order of the other axes.
    std::vector<std::vector<int>> groups(const std::vector<Axis>& axes) const;
    // The tied embedding's groups: the first and the last stage of each pipeline (a slice of
    // pp); the middle stages are groups of one.
    std::vector<std::vector<int>> embed_groups() const;
    // Expert parallelism's groups (above), and the model-parallel groups with ep: the pp x ep x tp
    // ranks with the same edp_rank, which hold one copy of the model; members in world order (member i: tp_rank i % tp, ep_rank i / tp % ep, pp_rank i / (tp ep)).
    std::vector<std::vector<int>> ep_groups() const;
    std::vector<std::vector<int>> expert_dp_groups() const;
    std::vector<std::vector<int>> model_groups() const;
    std::string describe() const;  // "dp 4 x tp 1 x pp 1" (cp named when > 1)

private:
    // The world ranks grouped by key(coordinates, ep_rank, edp_rank), groups in key order.
    std::vector<std::vector<int>> partition(long long (*key)(const ProcessGrid&, const std::array<int, kNumAxes>&)) const;
    std::array<int, kNumAxes> sizes_{{1, 1, 1, 1}}, coords_{{0, 0, 0, 0}};
};

// Resolves parallel.dp ("auto" = world / (tp * pp * cp)) and checks the layout against the world
// size. Throws UserError (the same one on every rank) when they disagree.
ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank);

// One communicator per group kind this rank belongs to, plus the world. dp: the dp x cp ranks
// (gradient reduction, ZeRO); cp: the context-parallel ring; mp: the model-parallel group (the
// pp x tp ranks that hold one copy of the model; pp x ep x tp under expert parallelism: model_groups).
// With parallel.comm "nccl" the groups that move tensors (world, dp, cp, tp, pp, embed, ep,
// expert-dp) are NCCL communicators on device buffers; mp and save stay on MPI (host data; see
// make_process_groups).
struct ProcessGroups {
    std::unique_ptr<Comm> world, dp, cp, tp, pp, mp, embed;
    // Expert parallelism (ep > 1; null otherwise): the ep group (the tokens' all-to-all, the dense
    // gradients' reduction over ep) and the expert-dp group (DataParallel's reduction and shard group, on the
    // dp group's communicator kind). mp then spans pp x ep x tp.
    std::unique_ptr<Comm> ep, edp;
    // The world again, on MPI, whose watchdog practically never fires (kCommTimeoutCapS): the
    // ranks wait on it while world rank 0 writes a checkpoint, so that a save longer than
    // parallel.timeout_s does not end the job (a rank that dies still does, through the launcher).
    std::unique_ptr<Comm> save;
    // The same again for checkpoint.async's threads (world rank 0's writer, every other rank's
    // server: PieceServer), so that no two threads of a process share a communicator.
    std::unique_ptr<Comm> async_save;
    // The model-parallel group again on the dp group's kind (NCCL: device-resident), for the
    // gradient norm's doubles in backend memory (DataParallel::grad_norm_squares); null when that
    // kind is MPI (mp serves) or the world is one process.
    std::unique_ptr<Comm> mp_dev;
    Comm* norm_group() const { return mp_dev ? mp_dev.get() : mp.get(); }
};
// comm_kind: "mpi" or "nccl" (every group is "self" when the world is one process); timeout_s:
// parallel.timeout_s, the watchdog of every blocking call; cuda_device: this rank's GPU (nccl).
// Collective over the world.
ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind, double timeout_s,
                                  int cuda_device);
