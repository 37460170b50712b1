#include "llmc/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

MemoryPlan zero_memory_plan(size_t padded_params, int dp, int zero, size_t dtype_bytes, bool master,
                            size_t bucket_elems, size_t activation_bytes) {
    MemoryPlan m;
    m.padded_params = padded_params;
    m.dp = dp;
    m.zero = zero;
    const size_t psi = padded_params, shard = padded_params / size_t(dp), o = master ? 12 : 8;
    m.params = psi * dtype_bytes;
    m.grads = (zero >= 2 ? shard : psi) * dtype_bytes;
    m.optimizer = (zero >= 1 ? shard : psi) * o;
    m.comm_buffers = (zero == 0 ? 1 : 2) * bucket_elems * sizeof(float);
    m.activations = activation_bytes;
    return m;
}

DataParallel::DataParallel(GPT2& model, Comm& dp, int zero, double bucket_mb)
    : model_(model), comm_(dp), zero_(zero) {
    LLMC_ASSERT(zero >= 0 && zero <= 2, "ZeRO stage outside 0..2");
    LLMC_ASSERT(model.padded_params % pad_multiple(dp.size()) == 0, "model not padded for this dp");
    shard_ = model.padded_params / size_t(dp.size());
    const size_t want = size_t(std::max(1.0, bucket_mb * 1024.0 * 1024.0 / sizeof(float)));
    bucket_elems_ = std::min(want, model.padded_params);
    // buckets from the end backwards: the order in which backward finishes the gradients
    for (size_t end = model.padded_params; end > 0;) {
        const size_t begin = end > bucket_elems_ ? end - bucket_elems_ : 0;
        buckets_.push_back({begin, end});
        end = begin;
    }
    send_.resize(bucket_elems_);
    if (zero_ > 0) recv_.resize(bucket_elems_);
}

std::vector<size_t> DataParallel::shard_counts(size_t begin, size_t end) const {
    std::vector<size_t> c(static_cast<size_t>(dp()));
    for (int r = 0; r < dp(); r++) {
        const size_t lo = std::max(begin, size_t(r) * shard_), hi = std::min(end, size_t(r + 1) * shard_);
        c[size_t(r)] = hi > lo ? hi - lo : 0;
    }
    return c;
}

void DataParallel::launch(const Bucket& b) {
    Ops& ops = model_.ops;
    const size_t n = b.end - b.begin;
    ops.to_host_f32(send_.data(), model_.grad_buf.slice(b.begin, n));
    if (zero_ == 0) {
        comm_.all_reduce(send_.data(), n, ReduceOp::Sum);
        ops.from_host_f32(model_.grad_buf.slice(b.begin, n), send_.data());
        return;
    }
    const std::vector<size_t> counts = shard_counts(b.begin, b.end);
    const size_t mine = counts[size_t(dp_rank())];
    comm_.reduce_scatter(send_.data(), recv_.data(), counts);
    if (mine > 0)
        ops.from_host_f32(model_.grad_buf.slice(std::max(b.begin, opt_begin()), mine), recv_.data());
}

std::function<void(size_t)> DataParallel::grads_ready() {
    next_bucket_ = 0;
    return [this](size_t ready_from) {
        while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].begin >= ready_from)
            launch(buckets_[next_bucket_++]);
    };
}

void DataParallel::finish_grad_sync() {
    while (next_bucket_ < buckets_.size()) launch(buckets_[next_bucket_++]);
    next_bucket_ = 0;
}

double DataParallel::grad_norm(Comm* model_parallel) {
    // primary copies only: TP replicas and the tied head copy would count twice
    double ss = 0.0;
    for (const ParamSpec& p : model_.params) {
        if (!p.primary) continue;
        const size_t lo = std::max(opt_begin(), p.offset), hi = std::min(opt_end(), p.offset + p.numel);
        if (lo < hi) ss += model_.ops.sum_squares(model_.grad_buf.slice(lo, hi - lo));
    }
    if (zero_ > 0) comm_.all_reduce(&ss, 1, ReduceOp::Sum);
    if (model_parallel && model_parallel->size() > 1) model_parallel->all_reduce(&ss, 1, ReduceOp::Sum);
    return std::sqrt(ss);
}

void DataParallel::after_update() {
    if (zero_ == 0) return;
    Ops& ops = model_.ops;
    for (const Bucket& b : buckets_) {
        const std::vector<size_t> counts = shard_counts(b.begin, b.end);
        const size_t mine = counts[size_t(dp_rank())];
        if (mine > 0) ops.to_host_f32(send_.data(), model_.param_buf.slice(std::max(b.begin, opt_begin()), mine));
        comm_.all_gather(send_.data(), recv_.data(), counts);
        ops.from_host_f32(model_.param_buf.slice(b.begin, b.end - b.begin), recv_.data());
    }
}

double DataParallel::mean(double x) {
    comm_.all_reduce(&x, 1, ReduceOp::Sum);
    return x / dp();
}

void DataParallel::check_replicas() {
    if (dp() == 1) return;
    std::vector<float> host(model_.padded_params);
    model_.ops.to_host_f32(host.data(), model_.param_buf);
    const uint64_t h = fnv1a(host.data(), host.size() * sizeof(float));
    double v[2] = {double(h >> 12), -double(h >> 12)};  // 52 bits: exact in a double
    comm_.all_reduce(v, 2, ReduceOp::Max);
    LLMC_ASSERT(v[0] == -v[1], "parameter replicas differ between DP ranks");
}

std::vector<float> DataParallel::gather_shards(const float* shard) {
    // bucket by bucket: every rank sends its shard's intersection with the bucket
    std::vector<float> out(dp_rank() == 0 ? model_.padded_params : 0);
    for (const Bucket& b : buckets_) {
        const std::vector<size_t> counts = shard_counts(b.begin, b.end);
        const size_t mine = counts[size_t(dp_rank())];
        const float* src = mine ? shard + (std::max(b.begin, opt_begin()) - opt_begin()) : shard;
        comm_.gather(src, dp_rank() == 0 ? out.data() + b.begin : nullptr, counts, 0);
    }
    return out;
}

OptimizerState DataParallel::gather_optimizer_state(const AdamW& opt) {
    std::vector<float> m, v, master;
    opt.get_state(m, v, master);
    OptimizerState whole;
    if (zero_ == 0) {  // replicated: rank 0 already has it all
        if (dp_rank() == 0) whole = {std::move(m), std::move(v), std::move(master)};
        return whole;
    }
    whole.m = gather_shards(m.data());
    whole.v = gather_shards(v.data());
    if (opt.has_master()) whole.master = gather_shards(master.data());
    return whole;
}

std::vector<float> DataParallel::gather_gradients() {
    std::vector<float> g(model_.padded_params);
    model_.ops.to_host_f32(g.data(), model_.grad_buf);
    if (zero_ == 0) return dp_rank() == 0 ? g : std::vector<float>();
    return gather_shards(g.data() + opt_begin());
}

void DataParallel::load_optimizer_state(AdamW& opt, const OptimizerState& whole) {
    LLMC_ASSERT(whole.m.size() == model_.padded_params, "optimizer state is not the whole model");
    const size_t b = opt.begin(), e = opt.end();
    auto slice = [&](const std::vector<float>& x) {
        return x.empty() ? std::vector<float>() : std::vector<float>(x.begin() + long(b), x.begin() + long(e));
    };
    opt.set_state(slice(whole.m), slice(whole.v), slice(whole.master));
}

MemoryPlan DataParallel::memory_plan(bool master) const {
    return zero_memory_plan(model_.padded_params, dp(), zero_, dtype_size(model_.dtype), master, bucket_elems_,
                            model_.activation_bytes);
}

LoaderPosition convert_loader_position(const LoaderPosition& p, int saved_dp, int dp, bool shuffle) {
    if (saved_dp == dp) return p;
    // A window group holds one window per rank; the same data position is group * dp windows.
    if (shuffle)
        throw UserError(strfmt("checkpoint: saved at parallel.dp=%d with data.shuffle=true; the shuffled window "
                               "order depends on dp, so it resumes only at dp=%d (or start with data.shuffle=false)",
                               saved_dp, saved_dp));
    const uint64_t windows = p.window * uint64_t(saved_dp);
    if (windows % uint64_t(dp) != 0)
        throw UserError(strfmt("checkpoint: the data position (%llu windows into the shard) does not divide "
                               "among parallel.dp=%d ranks; resume with a dp that divides it",
                               (unsigned long long)windows, dp));
    LoaderPosition q = p;
    q.window = windows / uint64_t(dp);
    return q;
}
