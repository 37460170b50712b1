// The process runtime: MPI when launched by mpirun/srun (more than one process) or another
// PMI/PMIx launcher, a single process otherwise.
// This and the stop-signal flag (llmc/run/preempt.h) are the only process-wide state; everything
// else is passed explicitly.
#pragma once
#include <string>

class Runtime {
public:
    Runtime(int* argc, char*** argv);
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    int rank = 0;
    int world = 1;
    int local_rank = 0;  // rank within the node (GPU selection): the launcher's (launch_env()), else MPI's
    // The most ranks any one node runs (the same on every rank): ranks share GPUs when it exceeds
    // a node's GPUs, which NCCL cannot do.
    int ranks_per_node = 1;
    bool mpi = false;    // MPI was initialised

    bool is_main() const { return rank == 0; }
    void barrier() const;
    // Start-up agreement: every rank calls it once with whether its own set-up failed. Returns
    // Collective: true when any rank's error is non-empty. Prints "[rank r] error: <error>" to
    // stderr so that an error every rank sees alike appears once, from rank 0 (when rank 0 has
    // it, the others stay quiet), and one only some ranks see appears from each of them.
    bool any_failed(const std::string& error) const;
    // Ends every process of the job with this exit code (MPI_Abort when distributed).
    [[noreturn]] void abort_job(int code) const;
};

// Where this process sits in the job, as its launcher says through the environment:
//   mpirun  OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE (OpenMPI's, also under mpirun inside an
//           sbatch allocation, where every rank inherits the batch shell's SLURM_PROCID=0: those
//           SLURM_* say nothing about the rank then, and are ignored)
//   srun    SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, in a job step only (SLURM_STEP_ID set; a
//           batch script itself has SLURM_PROCID=0 and the allocation's SLURM_NTASKS)
//   ""      neither: one process (or another MPI launcher, announced by PMI_SIZE or PMIX_RANK)
// Throws UserError naming the variable when a value is not a number in range.
struct LaunchEnv {
    std::string launcher;
    int rank = 0, local_rank = 0, world = 1;
};
LaunchEnv launch_env();

// This process's peak resident host memory so far, in bytes (getrusage's ru_maxrss).
double host_peak_bytes();

