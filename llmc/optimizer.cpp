#include "llmc/optimizer.h"

#include <algorithm>
#include <cmath>

AdamW::AdamW(const ParamLayout& layout, Ops& ops, size_t begin, size_t end, Tensor params, Tensor grads)
    : layout_(layout), ops_(ops), begin_(begin), end_(end), params_(params), grads_(grads) {
    LLMC_ASSERT(begin <= end && end <= layout.padded_params, "optimizer range outside the parameter buffer");
    LLMC_ASSERT(params.n == end - begin && grads.n == end - begin && params.dtype == grads.dtype,
                "optimizer: parameter and gradient views must cover its range");
    const size_t n = end - begin;
    m_ = static_cast<float*>(ops.alloc(n * sizeof(float)));
    v_ = static_cast<float*>(ops.alloc(n * sizeof(float)));
    if (keeps_master(params.dtype)) {
        master_ = static_cast<float*>(ops.alloc(n * sizeof(float)));
        sync_master_from_params();
    }
}

AdamW::~AdamW() {
    ops_.release(m_);
    ops_.release(v_);
    if (master_) ops_.release(master_);
}

size_t AdamW::state_bytes() const { return (end_ - begin_) * sizeof(float) * (master_ ? 3 : 2); }

void AdamW::step(const AdamWHyper& h, int t, float grad_scale, uint32_t seed) {
    for (const ParamSpec& p : layout_.specs) {
        size_t lo = std::max(begin_, p.offset), hi = std::min(end_, p.offset + p.numel);
        if (lo >= hi) continue;
        const size_t n = hi - lo, o = lo - begin_;
        // bf16 stochastic rounding hashes (seed, index within the call): a seed of its own per
        // tensor (from its offset in the buffer) keeps tensors from sharing random bits at equal offsets
        const uint32_t tensor_seed = seed ^ uint32_t((uint64_t(lo) * 0x9E3779B97F4A7C15ull) >> 32);
        ops_.adamw(params_.slice(o, n), master_ ? master_ + o : nullptr, grads_.slice(o, n),
                         m_ + o, v_ + o, h.lr, h.beta1, h.beta2, h.eps, p.decay ? h.weight_decay : 0.0f, grad_scale,
                         t, tensor_seed);
    }
}

void AdamW::get_state(std::vector<float>& m, std::vector<float>& v, std::vector<float>& master) const {
    const size_t n = end_ - begin_;
    m.resize(n);
    v.resize(n);
    ops_.to_host_bytes(m.data(), m_, n * sizeof(float));
    ops_.to_host_bytes(v.data(), v_, n * sizeof(float));
    master.clear();
    if (master_) {
        master.resize(n);
        ops_.to_host_bytes(master.data(), master_, n * sizeof(float));
    }
}

void AdamW::set_state(const std::vector<float>& m, const std::vector<float>& v, const std::vector<float>& master) {
    const size_t n = end_ - begin_;
    LLMC_ASSERT(m.size() == n && v.size() == n, "optimizer state size mismatch");
    ops_.from_host_bytes(m_, m.data(), n * sizeof(float));
    ops_.from_host_bytes(v_, v.data(), n * sizeof(float));
    if (master_) {
        if (master.size() == n) ops_.from_host_bytes(master_, master.data(), n * sizeof(float));
        else sync_master_from_params();
    }
}

void AdamW::sync_master_from_params() {
    if (!master_) return;
    const size_t n = end_ - begin_;
    std::vector<float> host(n);
    ops_.to_host_f32(host.data(), params_);
    ops_.from_host_bytes(master_, host.data(), n * sizeof(float));
}

float clip_scale(double grad_norm, double clip) {
    if (clip <= 0.0) return 1.0f;
    return float(std::min(1.0, clip / (grad_norm + 1e-6)));
}

double lr_at(const TrainConfig& t, int step) {
    const double max_lr = t.lr, min_lr = t.lr * t.final_lr_frac;
    if (step < t.warmup_steps) return max_lr * double(step + 1) / double(t.warmup_steps);
    if (t.lr_schedule == "constant") return max_lr;
    const int decay_len = t.steps - t.warmup_steps;
    const double frac = decay_len > 0 ? double(step - t.warmup_steps) / double(decay_len) : 0.0;
    if (t.lr_schedule == "cosine") return min_lr + 0.5 * (1.0 + std::cos(M_PI * frac)) * (max_lr - min_lr);
    if (t.lr_schedule == "linear") return max_lr - frac * (max_lr - min_lr);
    if (t.lr_schedule == "wsd") {
        // warmup, stable at max_lr, then linear decay to min_lr over the last decay_frac of the steps
        const int decay_steps = std::max(1, int(std::lround(t.decay_frac * t.steps)));
        const int decay_start = t.steps - decay_steps;
        if (step < decay_start) return max_lr;
        return max_lr - double(step - decay_start + 1) / double(decay_steps) * (max_lr - min_lr);
    }
    LLMC_ASSERT(false, "unknown lr schedule " + t.lr_schedule);
    return max_lr;
}
