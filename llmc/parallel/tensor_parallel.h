// Tensor parallelism: the TP group's collectives on model tensors (Megatron's f/g operators),
// the sequence-parallel gather/scatter along the tokens, and the vocabulary-parallel
// cross-entropy's reduction of per-row statistics. llmc/model/model.cpp calls these at the points
// the split defines; the split itself (which rows/columns a rank holds) is in the parameter
// table (param_table).
//
// Tensors are backend memory in the model's dtype; they reach the communicator as CommStage
// (llmc/parallel/comm_stage.h) routes them: in place (NCCL on fp32 device tensors, MPI on the CPU
// backend), through fp32 device copies (bf16 on NCCL) or through fp32 host copies (MPI with
// CUDA). With tp == 1 every call is a no-op (or a copy where out != in).
#pragma once
#include <cstddef>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/parallel/comm_stage.h"
#include "llmc/backend/ops.h"

class TensorParallel {
public:
    // comm: the TP group (null = a group of one). sequence_parallel: shard the token dimension.
    // host_staging: every tensor through host copies (tests compare the routes).
    TensorParallel(Ops& ops, Comm* comm, bool sequence_parallel, bool host_staging = false);

    int size() const { return comm_ ? comm_->size() : 1; }
    int rank() const { return comm_ ? comm_->rank() : 0; }
    bool sequence_parallel() const { return sp_ && size() > 1; }

    // t = sum over the group of every rank's t (in place).
    void all_reduce(Tensor t);
    // Sequence parallelism: full[N, C] = the ranks' local[N/tp, C] pieces in rank order.
    void all_gather_rows(Tensor local, Tensor full);
    // local[N/tp, C] = this rank's rows of the sum over the group of every rank's full[N, C].
    void reduce_scatter_rows(Tensor full, Tensor local);
    // The TP group's reduction of a row-parallel output: with sequence parallelism a
    // reduce-scatter into out (N/tp rows), else an all-reduce of `partial` that out then views.
    // Returns the tensor holding the result (out or partial).
    Tensor reduce_rows(Tensor partial, Tensor out);
    // The input of a column-parallel block: with sequence parallelism the gathered rows in full,
    // else x itself. Returns the tensor to use.
    Tensor gather_rows(Tensor x, Tensor full);

    // Vocabulary-parallel cross-entropy: combines every rank's per-row (max, sum of exp(x - max),
    // target logit) statistics (3 floats a row, backend memory) into the whole vocabulary's.
    void combine_cross_entropy_stats(float* stats, size_t rows);
    Comm* comm() const { return comm_; }

private:
    Ops& ops_;
    Comm* comm_;
    bool sp_;
    CommStage stage_;
    // combine_cross_entropy_stats' backend scratch: the rows' maxima, then (scaled sum, target)
    Tensor ce_scratch_;
public:
    ~TensorParallel();
    TensorParallel(const TensorParallel&) = delete;
    TensorParallel& operator=(const TensorParallel&) = delete;
};
