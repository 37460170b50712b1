#include "llmc/run/runtime.h"

#include <mpi.h>
#include <sys/resource.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "llmc/core/common.h"
#include "llmc/core/exit_codes.h"

namespace {

// The integer value of environment variable name, within [lo, hi]; fallback when unset.
int env_int(const char* name, int lo, int hi, int fallback) {
    const char* v = std::getenv(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < lo || x > hi)
        throw UserError(strfmt("environment variable %s=\"%s\": expected an integer in [%d, %d] (set by the launcher)",
                               name, v, lo, hi));
    return int(x);
}

}  // namespace

LaunchEnv launch_env() {
    LaunchEnv e;
    const char *rank = nullptr, *local = nullptr, *size = nullptr;
    if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
        e.launcher = "mpirun";
        rank = "OMPI_COMM_WORLD_RANK", local = "OMPI_COMM_WORLD_LOCAL_RANK", size = "OMPI_COMM_WORLD_SIZE";
    } else if (std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_PROCID")) {
        e.launcher = "srun";
        rank = "SLURM_PROCID", local = "SLURM_LOCALID", size = "SLURM_NTASKS";
    } else {
        return e;
    }
    e.world = env_int(size, 1, INT_MAX, 1);
    e.rank = env_int(rank, 0, e.world - 1, 0);
    e.local_rank = env_int(local, 0, e.world - 1, 0);
    return e;
}

Runtime::Runtime(int* argc, char*** argv) {
    LaunchEnv env;
    try {
        env = launch_env();
    } catch (const UserError& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        std::exit(kExitUserError);
    }
    if (env.world == 1 && !std::getenv("PMI_SIZE") && !std::getenv("PMIX_RANK")) return;
    // MPI_THREAD_MULTIPLE: the communicators' watchdog threads end a stalled job with MPI_Abort
    // while the main thread is blocked inside an MPI call (llmc/comm/comm_mpi.cpp), and each
    // communicator's helper thread runs its posted non-blocking operations while the main thread
    // computes or makes other calls. Where the library offers less, the watchdog falls back to
    // _exit and posted operations run inside their post.
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) log_rank() = rank;
    // what the launcher said must be what MPI found (it is, unless the environment was tampered with)
    if (!env.launcher.empty() && (env.rank != rank || env.world != world)) {
        std::fprintf(stderr, "%serror: %s's environment says rank %d of %d, MPI says rank %d of %d\n",
                     rank_prefix().c_str(), env.launcher.c_str(), env.rank, env.world, rank, world);
        abort_job(kExitUserError);
    }
    // local rank: the launcher's, else the rank within the node's ranks
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int node_rank = 0, node_size = 1;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    local_rank = env.launcher.empty() ? node_rank : env.local_rank;
    MPI_Allreduce(&node_size, &ranks_per_node, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
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

double host_peak_bytes() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return 1024.0 * double(u.ru_maxrss);  // (Linux: kilobytes)
}
