// Comm over MPI on host buffers: one MPI_Comm per process group (MPI_Comm_split of the world).
// Errors use MPI's default handler (MPI_ERRORS_ARE_FATAL): a failed call ends the whole job.
#include <mpi.h>

#include <algorithm>
#include <climits>

#include "llmc/comm.h"
#include "llmc/common.h"

namespace {

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

std::vector<int> int_counts(const std::vector<size_t>& counts, std::vector<int>* displs) {
    std::vector<int> c(counts.size());
    size_t off = 0;
    displs->resize(counts.size());
    for (size_t i = 0; i < counts.size(); i++) {
        LLMC_ASSERT(counts[i] <= size_t(INT_MAX) && off <= size_t(INT_MAX),
                    "MPI v-collectives take int counts: split the call into buckets");
        c[i] = int(counts[i]);
        (*displs)[i] = int(off);
        off += counts[i];
    }
    return c;
}

class MpiComm : public Comm {
public:
    MpiComm(std::vector<int> members, int rank, MPI_Comm comm) : Comm(std::move(members), rank), comm_(comm) {}
    ~MpiComm() override {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm_);
    }
    std::string name() const override { return "mpi"; }

    void all_reduce(float* buf, size_t n, ReduceOp op) override { all_reduce_any(buf, n, MPI_FLOAT, op); }
    void all_reduce(double* buf, size_t n, ReduceOp op) override { all_reduce_any(buf, n, MPI_DOUBLE, op); }

    void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_counts(counts);
        std::vector<int> displs, c = int_counts(counts, &displs);
        MPI_Reduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_);
    }
    void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) override {
        check_counts(counts);
        std::vector<int> displs, c = int_counts(counts, &displs);
        MPI_Allgatherv(send, c[rank()], MPI_FLOAT, recv, c.data(), displs.data(), MPI_FLOAT, comm_);
    }
    void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) override {
        check_counts(counts);
        std::vector<int> displs, c = int_counts(counts, &displs);
        MPI_Gatherv(send, c[rank()], MPI_FLOAT, recv, c.data(), displs.data(), MPI_FLOAT, root, comm_);
    }
    void broadcast(float* buf, size_t n, int root) override {
        for (size_t off = 0; off < n; off += kChunk)
            MPI_Bcast(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, root, comm_);
    }
    void send(const float* buf, size_t n, int peer) override {
        for (size_t off = 0; off < n; off += kChunk)
            MPI_Send(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, peer, 0, comm_);
    }
    void recv(float* buf, size_t n, int peer) override {
        for (size_t off = 0; off < n; off += kChunk)
            MPI_Recv(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, peer, 0, comm_, MPI_STATUS_IGNORE);
    }
    void barrier() override { MPI_Barrier(comm_); }

private:
    static constexpr size_t kChunk = size_t(1) << 30;  // elements per call (MPI counts are int)
    MPI_Comm comm_;

    template <typename T>
    void all_reduce_any(T* buf, size_t n, MPI_Datatype type, ReduceOp op) {
        for (size_t off = 0; off < n; off += kChunk)
            MPI_Allreduce(MPI_IN_PLACE, buf + off, int(std::min(kChunk, n - off)), type, mpi_op(op), comm_);
    }
    void check_counts(const std::vector<size_t>& counts) const {
        LLMC_ASSERT(int(counts.size()) == size(), "counts must have one entry per group member");
    }
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(const std::vector<std::vector<int>>& partition, int world_rank) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    LLMC_ASSERT(initialized, "make_mpi_comm needs MPI (launch with mpirun/srun)");
    int color = -1, key = -1;
    for (size_t g = 0; g < partition.size(); g++)
        for (size_t i = 0; i < partition[g].size(); i++)
            if (partition[g][i] == world_rank) color = int(g), key = int(i);
    LLMC_ASSERT(color >= 0, "this rank is in no group of the partition");
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
    int r = -1;
    MPI_Comm_rank(comm, &r);
    LLMC_ASSERT(r == key, "MPI_Comm_split ordered the group differently");
    return std::unique_ptr<Comm>(new MpiComm(partition[color], r, comm));
}
