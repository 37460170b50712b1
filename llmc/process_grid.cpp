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

std::string ProcessGrid::describe() const {
    return strfmt("dp %d x tp %d x pp %d", dp, tp, pp);
}

ProcessGrid make_process_grid(const ParallelConfig& pc, int world, int rank) {
    if (pc.tp > 1)
        throw UserError(strfmt("parallel.tp > 1 is not supported yet (got %d; tensor parallelism is planned)", pc.tp));
    if (pc.pp > 1)
        throw UserError(strfmt("parallel.pp > 1 is not supported yet (got %d; pipeline parallelism is planned)", pc.pp));
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

ProcessGroups make_process_groups(const ProcessGrid& grid, const std::string& comm_kind) {
    ProcessGroups pg;
    if (grid.world == 1) {
        pg.world = make_self_comm(0);
        pg.dp = make_self_comm(0);
        pg.tp = make_self_comm(0);
        pg.pp = make_self_comm(0);
        return pg;
    }
    LLMC_ASSERT(comm_kind == "mpi", "unknown communicator " + comm_kind);
    std::vector<int> all;
    for (int r = 0; r < grid.world; r++) all.push_back(r);
    pg.world = make_mpi_comm({all}, grid.rank);
    pg.dp = make_mpi_comm(grid.dp_groups(), grid.rank);
    pg.tp = make_mpi_comm(grid.tp_groups(), grid.rank);
    pg.pp = make_mpi_comm(grid.pp_groups(), grid.rank);
    return pg;
}
