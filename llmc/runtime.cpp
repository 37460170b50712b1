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
    MPI_Init(argc, argv);
    mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // local rank: the launcher's variable when present, else an MPI shared-memory split
    local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", env_int("MPI_LOCALRANKID", -1)));
    if (local_rank < 0) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
    }
    if (world > 1) log_rank() = rank;
}

Runtime::~Runtime() {
    if (mpi) MPI_Finalize();
}

void Runtime::barrier() const {
    if (mpi) MPI_Barrier(MPI_COMM_WORLD);
}

bool Runtime::any_failed(bool failed, bool* rank0_failed) const {
    int mine[2] = {failed ? 1 : 0, (failed && rank == 0) ? 1 : 0}, all[2] = {mine[0], mine[1]};
    if (mpi && world > 1) MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank0_failed) *rank0_failed = all[1] != 0;
    return all[0] != 0;
}

void Runtime::abort_job(int code) const {
    std::fflush(stdout);
    std::fflush(stderr);
    if (mpi && world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    if (mpi) MPI_Finalize();
    std::exit(code);
}
