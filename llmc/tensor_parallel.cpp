#include "llmc/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

TensorParallel::TensorParallel(Ops& ops, Comm* comm, bool sequence_parallel)
    : ops_(ops), comm_(comm), sp_(sequence_parallel) {}

namespace {
bool direct(const Comm* c, Tensor t) { return c->on_device() && t.dtype == DType::F32; }
}  // namespace

void TensorParallel::all_reduce(Tensor t) {
    if (size() == 1) return;
    if (direct(comm_, t)) {
        comm_->all_reduce(t.f32(), t.n, ReduceOp::Sum);
        return;
    }
    host_.resize(t.n);
    ops_.to_host_f32(host_.data(), t);
    comm_->all_reduce(host_.data(), t.n, ReduceOp::Sum);
    ops_.from_host_f32(t, host_.data());
}

void TensorParallel::all_gather_rows(Tensor local, Tensor full) {
    LLMC_ASSERT(full.n == local.n * size_t(size()), "all_gather_rows: full must be tp x local");
    if (size() == 1) {
        ops_.copy(full, local);
        return;
    }
    const std::vector<size_t> counts(size_t(size()), local.n);
    if (direct(comm_, local)) {
        comm_->all_gather(local.f32(), full.f32(), counts);
        return;
    }
    host_.resize(local.n);
    host2_.resize(full.n);
    ops_.to_host_f32(host_.data(), local);
    comm_->all_gather(host_.data(), host2_.data(), counts);
    ops_.from_host_f32(full, host2_.data());
}

void TensorParallel::reduce_scatter_rows(Tensor full, Tensor local) {
    LLMC_ASSERT(full.n == local.n * size_t(size()), "reduce_scatter_rows: full must be tp x local");
    if (size() == 1) {
        ops_.copy(local, full);
        return;
    }
    const std::vector<size_t> counts(size_t(size()), local.n);
    if (direct(comm_, full)) {
        comm_->reduce_scatter(full.f32(), local.f32(), counts);
        return;
    }
    host_.resize(full.n);
    host2_.resize(local.n);
    ops_.to_host_f32(host_.data(), full);
    comm_->reduce_scatter(host_.data(), host2_.data(), counts);
    ops_.from_host_f32(local, host2_.data());
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

void TensorParallel::all_reduce_host(float* x, size_t n, ReduceOp op) {
    if (size() > 1) comm_->all_reduce(x, n, op);
}

void TensorParallel::combine_cross_entropy_stats(float* stats, size_t rows) {
    if (size() == 1) return;
    // (max_r, sum_r, target_r) per rank -> (M = max_r max_r, S = sum_r sum_r * exp(max_r - M), target = sum_r target_r)
    std::vector<float> s(3 * rows), mx(rows), rest(2 * rows);
    ops_.to_host_bytes(s.data(), stats, s.size() * sizeof(float));
    for (size_t i = 0; i < rows; i++) mx[i] = s[3 * i];
    comm_->all_reduce(mx.data(), rows, ReduceOp::Max);
    for (size_t i = 0; i < rows; i++) {
        const float m = s[3 * i];
        // a rank whose slice holds no real column reports (-inf, 0)
        rest[2 * i] = m == -std::numeric_limits<float>::infinity() ? 0.0f : s[3 * i + 1] * std::exp(m - mx[i]);
        rest[2 * i + 1] = s[3 * i + 2];
    }
    comm_->all_reduce(rest.data(), rest.size(), ReduceOp::Sum);
    for (size_t i = 0; i < rows; i++) {
        s[3 * i] = mx[i];
        s[3 * i + 1] = rest[2 * i];
        s[3 * i + 2] = rest[2 * i + 1];
    }
    ops_.from_host_bytes(stats, s.data(), s.size() * sizeof(float));
}
