// Comm: the collective-communication interface every parallel layout is written over.
//
// A Comm is one process group: an ordered set of world ranks; rank() and size() are this
// process's position in it and its size, and peers/roots are group ranks. Buffers are fp32
// (and double for a few scalars) in the communicator's memory space: host memory for MPI,
// device memory for NCCL (on_device()). Callers that hold device tensors and talk to a host
// communicator stage them through host buffers (llmc/data_parallel.cpp does).
//
// Every call is blocking and collective over the group (send/recv: over the pair), and every
// call must be made in the same order on all members. Results are deterministic for a fixed
// group and sizes, and every member receives bitwise the same reduction result.
//
// Implementations: SelfComm (a group of one: copies, no MPI needed), MPI (comm_mpi.cpp,
// one MPI_Comm per group). NCCL (llmc/cuda, bootstrapped over the MPI group) implements the
// same interface with on_device() = true.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

enum class ReduceOp { Sum, Max };

class Comm {
public:
    virtual ~Comm() = default;
    virtual std::string name() const = 0;  // "self", "mpi", "nccl"
    virtual bool on_device() const { return false; }

    int rank() const { return rank_; }
    int size() const { return int(members_.size()); }
    const std::vector<int>& members() const { return members_; }  // world ranks, in group order

    // buf[i] = op over the group of every member's buf[i]
    virtual void all_reduce(float* buf, size_t n, ReduceOp op) = 0;
    virtual void all_reduce(double* buf, size_t n, ReduceOp op) = 0;
    // send holds sum(counts) elements on every member; recv gets this member's piece
    // (counts[rank()] elements at offset sum(counts[0..rank()))) of their element-wise sum.
    virtual void reduce_scatter(const float* send, float* recv, const std::vector<size_t>& counts) = 0;
    // send holds counts[rank()] elements; recv (sum(counts)) gets every member's piece in group order.
    virtual void all_gather(const float* send, float* recv, const std::vector<size_t>& counts) = 0;
    // as all_gather, but only root's recv is written (others may pass nullptr)
    virtual void gather(const float* send, float* recv, const std::vector<size_t>& counts, int root) = 0;
    virtual void broadcast(float* buf, size_t n, int root) = 0;
    virtual void send(const float* buf, size_t n, int peer) = 0;
    virtual void recv(float* buf, size_t n, int peer) = 0;
    virtual void barrier() = 0;

protected:
    Comm(std::vector<int> members, int rank) : members_(std::move(members)), rank_(rank) {}

private:
    std::vector<int> members_;
    int rank_;
};

// A group of one process (no MPI needed): reductions are copies.
std::unique_ptr<Comm> make_self_comm(int world_rank);
// A group over MPI (host buffers). Collective over MPI_COMM_WORLD: every world rank calls it
// with the same list of groups (a partition of the world ranks) and gets the group holding it.
std::unique_ptr<Comm> make_mpi_comm(const std::vector<std::vector<int>>& partition, int world_rank);

// Prefix sums of counts: offsets[i] = counts[0] + ... + counts[i-1].
std::vector<size_t> count_offsets(const std::vector<size_t>& counts);
