#include "llmc/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

TensorParallel::TensorParallel(Ops& ops, Comm* comm, bool sequence_parallel, bool host_staging)
    : ops_(ops), comm_(comm), sp_(sequence_parallel), stage_(ops, comm, host_staging) {}

void TensorParallel::all_reduce(Tensor t) {
    if (size() == 1) return;
    stage_.run(t, t, [&](const float*, float* buf) { comm_->all_reduce(buf, t.n, ReduceOp::Sum); });
}

void TensorParallel::all_gather_rows(Tensor local, Tensor full) {
    LLMC_ASSERT(full.n == local.n * size_t(size()), "all_gather_rows: full must be tp x local");
    if (size() == 1) {
        ops_.copy(full, local);
        return;
    }
    if (stage_.direct() && local.dtype != DType::F32 && full.dtype == local.dtype && local.bytes() % sizeof(float) == 0) {
        // no sum: the pieces travel as their own bytes (bf16: half the fp32 traffic)
        const std::vector<size_t> words(size_t(size()), local.bytes() / sizeof(float));
        comm_->all_gather(static_cast<const float*>(local.ptr), static_cast<float*>(full.ptr), words);
        return;
    }
    const std::vector<size_t> counts(size_t(size()), local.n);
    stage_.run(local, full, [&](const float* in, float* out) { comm_->all_gather(in, out, counts); });
}

void TensorParallel::reduce_scatter_rows(Tensor full, Tensor local) {
    LLMC_ASSERT(full.n == local.n * size_t(size()), "reduce_scatter_rows: full must be tp x local");
    if (size() == 1) {
        ops_.copy(local, full);
        return;
    }
    const std::vector<size_t> counts(size_t(size()), local.n);
    stage_.run(full, local, [&](const float* in, float* out) { comm_->reduce_scatter(in, out, counts); });
}

Tensor TensorParallel::reduce_rows(Tensor partial, Tensor out) {
    if (sequence_parallel()) {
        reduce_scatter_rows(partial, out);
        return out;
    }
    all_reduce(partial);
    return partial;
}

Tensor TensorParallel::gather_rows(Tensor x, Tensor full) {
    if (!sequence_parallel()) return x;
    all_gather_rows(x, full);
    return full;
}

TensorParallel::~TensorParallel() { ops_.release(ce_scratch_.ptr); }

void TensorParallel::combine_cross_entropy_stats(float* stats, size_t rows) {
    if (size() == 1) return;
    // (max_r, sum_r, target_r) per rank -> (M = max_r max_r, S = sum_r sum_r * exp(max_r - M), target = sum_r target_r),
    // on the backend (Ops::cross_entropy_stats): only the collectives' buffers may cross to the host (staged routes)
    if (ce_scratch_.n < 3 * rows) {  // sized at the first step's first head, kept
        ops_.release(ce_scratch_.ptr);
        ce_scratch_ = Tensor(ops_.alloc(3 * rows * sizeof(float)), 3 * rows, DType::F32);
    }
    Tensor mx = ce_scratch_.slice(0, rows), rest = ce_scratch_.slice(rows, 2 * rows);
    ops_.cross_entropy_stats(0, stats, mx.f32(), rest.f32(), rows);
    stage_.run(mx, mx, [&](const float*, float* x) { comm_->all_reduce(x, rows, ReduceOp::Max); });
    ops_.cross_entropy_stats(1, stats, mx.f32(), rest.f32(), rows);
    stage_.run(rest, rest, [&](const float*, float* x) { comm_->all_reduce(x, 2 * rows, ReduceOp::Sum); });
    ops_.cross_entropy_stats(2, stats, mx.f32(), rest.f32(), rows);
}
