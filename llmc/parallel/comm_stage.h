// CommStage: collectives and transfers of backend tensors over a communicator, whatever memory
// the communicator reads (llmc/comm/comm.h: on_device) and whatever the tensors' dtype. One of:
//  - direct: the communicator reads the backend's memory (NCCL over CUDA; MPI over the CPU
//    backend) and the tensors are fp32: the collective runs on the tensors themselves;
//  - device fp32 copies: it reads the backend's memory but the tensors are another dtype (bf16 on
//    NCCL): reductions run on fp32 copies in backend memory, so that sums keep fp32 precision;
//  - host fp32 copies: a host communicator over device memory (MPI with CUDA: several ranks may
//    share a GPU), or host_staging (tests compare the routes).
// Point-to-point moves bytes unchanged, so a transfer sends the tensor's own bytes (bf16 as bf16,
// half an fp32's traffic) on a communicator that reads the backend's memory; a host communicator
// gets fp32 host copies.
// Host values (a few floats the host computed) reach a device communicator through backend
// scratch. Every route gives bitwise the same result: only the bytes' path differs.
#pragma once
#include <functional>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/backend/ops.h"

class CommStage {
public:
    CommStage(Ops& ops, Comm* comm, bool host_staging = false);
    ~CommStage();
    CommStage(const CommStage&) = delete;
    CommStage& operator=(const CommStage&) = delete;

    Comm* comm() const { return comm_; }
    // The communicator reads the backend's memory (and no host staging is forced).
    bool direct() const { return direct_; }
    // f(in, out) runs a collective on fp32 buffers in the communicator's memory that hold `in`
    // (read) and become `out` (after f returns); in and out may be the same tensor (in place:
    // one buffer).
    void run(Tensor in, Tensor out, const std::function<void(const float*, float*)>& f);
    // x: n host floats, read and overwritten by f in the communicator's memory.
    void run_host(float* x, size_t n, const std::function<void(float*)>& f);
    // in: n_in host floats f reads, out: n_out host floats f writes, in the communicator's memory.
    void run_host(const float* in, size_t n_in, float* out, size_t n_out,
                  const std::function<void(const float*, float*)>& f);

    // x: n host floats summed over the communicator in place, in pieces of `piece` floats. Collective.
    void all_reduce_host(float* x, size_t n, size_t piece);
    // Rank `from`'s host vector x (every rank passes a vector of its own, of one size) gathered to
    // rank 0 in pieces of `piece` floats: rank 0 gets it, the others an empty vector. Collective.
    std::vector<float> gather_host(const std::vector<float>& x, int from, size_t piece);
    // Point-to-point: a tensor as the communicator carries it. words(t): the fp32 words of a
    // message for t (a bf16 tensor of n elements: n / 2 words on the direct route, which needs n
    // even; n words through the host). A message buffer holds one tensor: on the direct route
    // backend memory of the tensor's dtype, else fp32 host memory.
    size_t words(Tensor t) const;
    struct Message {
        Tensor dev;               // direct: backend memory (at least the message's words)
        std::vector<float> host;  // else fp32 host copy
        float* data() { return dev.ptr ? static_cast<float*>(dev.ptr) : host.data(); }
    };
    // A buffer for a message like t (from a pool: release it when the transfer is done).
    Message take_message(Tensor like);
    // One pooled buffer for the largest message like t ahead of use (the direct route; else
    // nothing): a message that fits it takes it, so that the pool need not grow mid-step (a
    // device allocation waits for the whole device).
    void reserve(Tensor like);
    void release_message(Message&& m);
    void pack(Message& m, Tensor src);    // m = src
    void unpack(Tensor dst, Message& m);  // dst = m

private:
    Ops& ops_;
    Comm* comm_;
    bool direct_;
    // backend fp32 scratch (device route of other dtypes, host values on a device communicator)
    Tensor scratch_[2];
    std::vector<float> host_[2];
    std::vector<Tensor> pool_;  // released message buffers (backend memory)
    Tensor scratch(int i, size_t n);
};
