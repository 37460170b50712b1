#include "llmc/parallel/process_grid.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/comm/device_sim.h"

const char* axis_name(Axis a) {
    static const char* names[kNumAxes] = {"pp", "dp", "cp", "tp"};
    return names[int(a)];
}

ProcessGrid::ProcessGrid(std::array<int, kNumAxes> sizes, int r, int e) : rank(r), ep(e), sizes_(sizes) {
    world = 1;
    for (int s : sizes) {
        LLMC_ASSERT(s >= 1, "every axis of the grid has size >= 1");
        world *= s;
    }
    LLMC_ASSERT(r >= 0 && r < world, "rank outside the grid");
    for (int a = kNumAxes - 1, rest = r; a >= 0; a--) {  // the last axis varies fastest
        coords_[size_t(a)] = rest % sizes[size_t(a)];
        rest /= sizes[size_t(a)];
    }
    pp = size(Axis::pp), dp = size(Axis::dp), cp = size(Axis::cp), tp = size(Axis::tp);
    pp_rank = coord(Axis::pp), dp_rank = coord(Axis::dp), cp_rank = coord(Axis::cp), tp_rank = coord(Axis::tp);
    LLMC_ASSERT(ep >= 1 && dp * cp % ep == 0, "ep must divide dp x cp");
}

namespace {
// A rank's position in the dp x cp slice (dp_cp_rank), from its coordinates.
long long dp_cp_of(const ProcessGrid& g, const std::array<int, kNumAxes>& c) {
    return (long long)c[size_t(Axis::dp)] * g.cp + c[size_t(Axis::cp)];
}
}  // namespace

std::vector<std::vector<int>> ProcessGrid::partition(
    long long (*key)(const ProcessGrid&, const std::array<int, kNumAxes>&)) const {
    std::vector<std::pair<long long, int>> keyed;
    for (int r = 0; r < world; r++) {
        std::array<int, kNumAxes> c{};
        for (int a = kNumAxes - 1, rest = r; a >= 0; a--) {
            c[size_t(a)] = rest % sizes_[size_t(a)];
            rest /= sizes_[size_t(a)];
        }
        keyed.push_back({key(*this, c), r});
    }
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const std::pair<long long, int>& a, const std::pair<long long, int>& b) { return a.first < b.first; });
    std::vector<std::vector<int>> out;
    for (size_t i = 0; i < keyed.size(); i++) {
        if (i == 0 || keyed[i].first != keyed[i - 1].first) out.emplace_back();
        out.back().push_back(keyed[i].second);
    }
    return out;
}

std::vector<std::vector<int>> ProcessGrid::ep_groups() const {  // same pp, edp_rank, tp
    return partition([](const ProcessGrid& g, const std::array<int, kNumAxes>& c) {
        const long long edp_rank = dp_cp_of(g, c) / g.ep;
        return (c[size_t(Axis::pp)] * (long long)g.edp() + edp_rank) * g.tp + c[size_t(Axis::tp)];
    });
}

std::vector<std::vector<int>> ProcessGrid::expert_dp_groups() const {  // same pp, ep_rank, tp
    return partition([](const ProcessGrid& g, const std::array<int, kNumAxes>& c) {
        const long long ep_rank = dp_cp_of(g, c) % g.ep;
        return (c[size_t(Axis::pp)] * (long long)g.ep + ep_rank) * g.tp + c[size_t(Axis::tp)];
    });
}

std::vector<std::vector<int>> ProcessGrid::model_groups() const {  // same edp_rank
    return partition([](const ProcessGrid& g, const std::array<int, kNumAxes>& c) { return dp_cp_of(g, c) / g.ep; });
}

int ProcessGrid::world_rank_of(std::array<int, kNumAxes> c) const {
    int r = 0;
    for (int a = 0; a < kNumAxes; a++) r = r * sizes_[size_t(a)] + c[size_t(a)];
    return r;
}

std::vector<std::vector<int>> ProcessGrid::groups(const std::vector<Axis>& axes) const {
    std::array<bool, kNumAxes> in{};
    for (Axis a : axes) in[size_t(a)] = true;
    // Walking the world ranks in order visits each group's members in mesh order; the group
    // index is the rank's position along the other axes, which also orders the groups.
    int n_groups = 1;
    for (int a = 0; a < kNumAxes; a++)
        if (!in[size_t(a)]) n_groups *= sizes_[size_t(a)];
    std::vector<std::vector<int>> out(static_cast<size_t>(n_groups));
    for (int r = 0; r < world; r++) {
        int g = 0;
        for (int a = 0, rest = r, div = world; a < kNumAxes; a++) {
            div /= sizes_[size_t(a)];
            const int c = rest / div;
            rest %= div;
            if (!in[size_t(a)]) g = g * sizes_[size_t(a)] + c;
        }
        out[size_t(g)].push_back(r);
    }
    return out;
}

std::vector<std::vector<int>> ProcessGrid::embed_groups() const {
    std::vector<std::vector<int>> out;
    for (const std::vector<int>& stages : groups({Axis::pp})) {
        out.push_back({stages.front()});
        if (stages.size() > 1) out.back().push_back(stages.back());
        for (size_t p = 1; p + 1 < stages.size(); p++) out.push_back({stages[p]});
    }
    return out;
}

std::string ProcessGrid::describe() const {
    return strfmt("dp %d x %s%stp %d x pp %d", dp, ep > 1 ? strfmt("(ep %d) x ", ep).c_str() : "",
                  cp > 1 ? strfmt("cp %d x ", cp).c_str() : "", tp, pp);
}

ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank) {
    const int tp = pc.tp, pp = pc.pp, cp = pc.cp, model_ranks = tp * pp * cp;
    if (pc.dp == 0 && world % model_ranks != 0)  // auto
        throw UserError(strfmt("parallel.dp: \"auto\" needs the world size (%d processes) to be a multiple of "
                               "parallel.tp * parallel.pp%s = %d",
                               world, cp > 1 ? " * parallel.cp" : "", model_ranks));
    const int dp = pc.dp == 0 ? world / model_ranks : pc.dp;
    if (dp * model_ranks != world) {  // cp named when it is in use
        const std::string product = cp > 1 ? strfmt("parallel.dp * parallel.cp * parallel.tp * parallel.pp = %d x %d x %d x %d",
                                                    dp, cp, tp, pp)
                                           : strfmt("parallel.dp * parallel.tp * parallel.pp = %d x %d x %d", dp, tp, pp);
        throw UserError(strfmt("%s = %d, but the job has %d process%s (launch with mpirun -np %d, or set "
                               "parallel.dp=\"auto\")",
                               product.c_str(), dp * model_ranks, world, world == 1 ? "" : "es", dp * model_ranks));
    }
    if (pc.ep < 1 || dp * cp % pc.ep != 0) {
        const std::string ranks = cp > 1 ? strfmt("parallel.dp * parallel.cp = %d x %d", dp, cp)
                                         : strfmt("parallel.dp = %d", dp);
        throw UserError(strfmt("parallel.ep: %d does not divide %s (the expert-parallel groups are ep consecutive "
                               "data-parallel ranks)", pc.ep, ranks.c_str()));
    }
    return ProcessGrid({{pp, dp, cp, tp}}, rank, pc.ep);
}

ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind, double timeout_s,
                                  int cuda_device) {
    ProcessGroups pg;
    // NCCL, or under the test hook LLMC_SIM_DEVICE its stand-in over the host communicator (llmc/comm/device_sim.h)
    auto device_comm = [&](std::unique_ptr<Comm> host) {
        return sim_device() ? make_device_check_comm(std::move(host)) : make_nccl_comm(*host, cuda_device, timeout_s);
    };
    if (grid.world == 1) {
        pg.world = make_self_comm(0);
        pg.dp = make_self_comm(0);
        // asked for NCCL: the DP group of one is NCCL as well (its collectives run, on device)
        if (comm_kind == "nccl") pg.dp = device_comm(std::move(pg.dp));
        pg.cp = make_self_comm(0);
        pg.tp = make_self_comm(0);
        pg.pp = make_self_comm(0);
        pg.mp = make_self_comm(0);
        pg.embed = make_self_comm(0);
        pg.save = make_self_comm(0);
        pg.async_save = make_self_comm(0);
        return pg;
    }
    LLMC_ASSERT(comm_kind == "mpi" || comm_kind == "nccl", "unknown communicator " + comm_kind);
    // Every group gets an MPI communicator; under NCCL it only bootstraps the group's NCCL
    // communicator (broadcasts rank 0's ncclUniqueId) and is freed. Groups of one are NCCL too,
    // so that a group's memory space does not depend on its size.
    auto make = [&](const std::vector<std::vector<int>>& partition, const char* name) {
        std::unique_ptr<Comm> mpi = make_mpi_comm(partition, grid.rank, name, timeout_s);
        return comm_kind == "nccl" ? device_comm(std::move(mpi)) : std::move(mpi);
    };
    std::vector<int> all;
    for (int r = 0; r < grid.world; r++) all.push_back(r);
    pg.world = make({all}, "world");
    pg.dp = make(grid.groups({Axis::dp, Axis::cp}), grid.cp > 1 ? "dp x cp" : "dp");
    // The groups that move tensors are device-resident under NCCL: the cp ring, tensor and
    // pipeline parallelism, the tied embedding's gradient and the experts' all-to-all (each
    // routes its tensors through CommStage, llmc/parallel/comm_stage.h). The model-parallel group stays on
    // MPI: it carries host data only (the checkpoint's and the gradient dump's assembly, memory
    // tables, the gradient norm's one double).
    pg.cp = make(grid.groups({Axis::cp}), "cp");
    pg.tp = make(grid.groups({Axis::tp}), "tp");
    pg.pp = make(grid.groups({Axis::pp}), "pp");
    pg.mp = make_mpi_comm(grid.model_groups(), grid.rank, "mp", timeout_s);
    if (comm_kind == "nccl") pg.mp_dev = make(grid.model_groups(), "mp");
    if (grid.ep > 1) {
        pg.ep = make(grid.ep_groups(), "ep");
        pg.edp = make(grid.expert_dp_groups(), "expert-dp");
    }
    pg.embed = make(grid.embed_groups(), "embed");
    pg.save = make_mpi_comm({all}, grid.rank, "save", kCommTimeoutCapS);
    pg.async_save = make_mpi_comm({all}, grid.rank, "async save", kCommTimeoutCapS);
    return pg;
}
