#include "llmc/runtime.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "llmc/common.h"

static int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

bool launched_by_mpi() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
           (std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS") && env_int("SLURM_NTASKS", 1) > 1);
}

Runtime::Runtime(int* argc, char*** argv) {
    if (!launched_by_mpi()) return;
    // MPI_THREAD_MULTIPLE: the communicators' watchdog threads end a stalled job with MPI_Abort
    // while the main thread is blocked inside an MPI call (llmc/comm_mpi.cpp). Only the main
    // thread communicates. Where the library offers less, the watchdog falls back to _exit.
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // local rank: the launcher's variable when present, else the rank within the node's ranks
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int node_rank = 0, node_size = 1;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", env_int("MPI_LOCALRANKID", node_rank)));
    MPI_Allreduce(&node_size, &ranks_per_node, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (world > 1) log_rank() = rank;
}

Runtime::~Runtime() {
    if (mpi) MPI_Finalize();
}

void Runtime::barrier() const {
    if (mpi) MPI_Barrier(MPI_COMM_WORLD);
}

bool Runtime::any_failed(const std::string& error) const {
    const bool failed = !error.empty();
    int mine[2] = {failed ? 1 : 0, (failed && rank == 0) ? 1 : 0}, all[2] = {mine[0], mine[1]};
    if (mpi && world > 1) MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const bool rank0_failed = all[1] != 0;
    if (failed && (is_main() || !rank0_failed))
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), error.c_str());
    return all[0] != 0;
}

void Runtime::abort_job(int code) const {
    std::fflush(stdout);
    std::fflush(stderr);
    if (mpi && world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    if (mpi) MPI_Finalize();
    std::exit(code);
}
