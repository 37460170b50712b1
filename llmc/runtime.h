// The process runtime: MPI when launched by mpirun/srun, a single process otherwise.
// This is the only process-wide state; everything else is passed explicitly.
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
    int local_rank = 0;  // rank within the node (GPU selection)
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

// True when the environment shows an MPI launcher (OpenMPI, PMI/PMIx, Slurm srun).
bool launched_by_mpi();
