#include "llmc/process_grid.h"

#include "llmc/common.h"

std::vector<std::vector<int>> ProcessGrid::dp_groups() const {
    std::vector<std::vector<int>> g;
    for (int p = 0; p < pp; p++)
        for (int t = 0; t < tp; t++) {
            g.emplace_back();
            for (int d = 0; d < dp; d++) g.back().push_back(world_rank_of(d, t, p));
        }
    return g;
}

std::vector<std::vector<int>> ProcessGrid::tp_groups() const {
    std::vector<std::vector<int>> g;
    for (int p = 0; p < pp; p++)
        for (int d = 0; d < dp; d++) {
            g.emplace_back();
            for (int t = 0; t < tp; t++) g.back().push_back(world_rank_of(d, t, p));
        }
    return g;
}

std::vector<std::vector<int>> ProcessGrid::pp_groups() const {
    std::vector<std::vector<int>> g;
    for (int d = 0; d < dp; d++)
        for (int t = 0; t < tp; t++) {
            g.emplace_back();
            for (int p = 0; p < pp; p++) g.back().push_back(world_rank_of(d, t, p));
        }
    return g;
}

std::vector<std::vector<int>> ProcessGrid::mp_groups() const {
    std::vector<std::vector<int>> g;
    for (int d = 0; d < dp; d++) {
        g.emplace_back();
        for (int p = 0; p < pp; p++)
            for (int t = 0; t < tp; t++) g.back().push_back(world_rank_of(d, t, p));
    }
    return g;
}

std::vector<std::vector<int>> ProcessGrid::embed_groups() const {
    std::vector<std::vector<int>> g;
    for (int d = 0; d < dp; d++)
        for (int t = 0; t < tp; t++) {
            if (pp == 1) {
                g.push_back({world_rank_of(d, t, 0)});
                continue;
            }
            g.push_back({world_rank_of(d, t, 0), world_rank_of(d, t, pp - 1)});
            for (int p = 1; p < pp - 1; p++) g.push_back({world_rank_of(d, t, p)});
        }
    return g;
}

std::string ProcessGrid::describe() const {
    return strfmt("dp %d x tp %d x pp %d", dp, tp, pp);
}

ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank) {
    ProcessGrid g;
    g.world = world;
    g.rank = rank;
    g.tp = pc.tp;
    g.pp = pc.pp;
    const int model_ranks = g.tp * g.pp;
    if (pc.dp == 0) {  // auto
        if (world % model_ranks != 0)
            throw UserError(strfmt("parallel.dp: \"auto\" needs the world size (%d processes) to be a multiple of "
                                   "parallel.tp * parallel.pp = %d",
                                   world, model_ranks));
        g.dp = world / model_ranks;
    } else {
        g.dp = pc.dp;
    }
    if (g.dp * model_ranks != world)
        throw UserError(strfmt("parallel.dp * parallel.tp * parallel.pp = %d x %d x %d = %d, but the job has %d "
                               "process%s (launch with mpirun -np %d, or set parallel.dp=\"auto\")",
                               g.dp, g.tp, g.pp, g.dp * model_ranks, world, world == 1 ? "" : "es",
                               g.dp * model_ranks));
    g.tp_rank = rank % g.tp;
    g.dp_rank = (rank / g.tp) % g.dp;
    g.pp_rank = rank / (g.tp * g.dp);
    LLMC_ASSERT(g.world_rank_of(g.dp_rank, g.tp_rank, g.pp_rank) == rank, "grid coordinates do not invert");
    return g;
}

ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind, double timeout_s,
                                  int cuda_device) {
    ProcessGroups pg;
    if (grid.world == 1) {
        pg.world = make_self_comm(0);
        pg.dp = make_self_comm(0);
        // asked for NCCL: the DP group of one is NCCL as well (its collectives run, on device)
        if (comm_kind == "nccl") pg.dp = make_nccl_comm(*pg.dp, cuda_device, timeout_s);
        pg.tp = make_self_comm(0);
        pg.pp = make_self_comm(0);
        pg.mp = make_self_comm(0);
        pg.embed = make_self_comm(0);
        return pg;
    }
    LLMC_ASSERT(comm_kind == "mpi" || comm_kind == "nccl", "unknown communicator " + comm_kind);
    // Every group gets an MPI communicator; under NCCL it only bootstraps the group's NCCL
    // communicator (broadcasts rank 0's ncclUniqueId) and is freed. Groups of one are NCCL too,
    // so that a group's memory space does not depend on its size.
    auto make = [&](const std::vector<std::vector<int>>& partition, const char* name) {
        std::unique_ptr<Comm> mpi = make_mpi_comm(partition, grid.rank, name, timeout_s);
        return comm_kind == "nccl" ? make_nccl_comm(*mpi, cuda_device, timeout_s) : std::move(mpi);
    };
    std::vector<int> all;
    for (int r = 0; r < grid.world; r++) all.push_back(r);
    pg.world = make({all}, "world");
    pg.dp = make(grid.dp_groups(), "dp");
    // The model-parallel groups stay on MPI (host buffers) under NCCL too: tensor and pipeline
    // parallelism (llmc/tensor_parallel.cpp, llmc/pipeline.cpp) stage their tensors through the
    // host, and the checkpoint assembly and the gradient norm use host buffers.
    pg.tp = make_mpi_comm(grid.tp_groups(), grid.rank, "tp", timeout_s);
    pg.pp = make_mpi_comm(grid.pp_groups(), grid.rank, "pp", timeout_s);
    pg.mp = make_mpi_comm(grid.mp_groups(), grid.rank, "mp", timeout_s);
    pg.embed = make_mpi_comm(grid.embed_groups(), grid.rank, "embed", timeout_s);
    return pg;
}
