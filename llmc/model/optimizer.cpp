#include "llmc/model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "llmc/precision/bf16.h"
#include "llmc/precision/fp16.h"
#include "llmc/cpu/kernels.h"

AdamW::AdamW(const ParamLayout& layout, Ops& ops, size_t begin, size_t end, Tensor params, Tensor grads,
             OptimizerOffload offload, Runs runs)
    : layout_(layout), ops_(ops), begin_(begin), end_(end), runs_(std::move(runs)), params_(params), grads_(grads),
      offload_(offload) {
    LLMC_ASSERT(begin <= end && end <= layout.padded_params, "optimizer range outside the parameter buffer");
    LLMC_ASSERT(params.n == end - begin && grads.n == end - begin && grads.dtype == params.dtype,
                "optimizer: parameter and gradient views must cover its range");
    if (runs_.empty() && end > begin) runs_.push_back({begin, end});
    for (size_t i = 0; i < runs_.size(); i++) {
        const auto& r = runs_[i];
        LLMC_ASSERT(r.first < r.second && r.first >= (i ? runs_[i - 1].second : begin) && r.second <= end,
                    "optimizer runs must be ascending, disjoint, non-empty and within its range");
        run_state_.push_back(owned_);
        owned_ += r.second - r.first;
    }
    const size_t n = owned_;
    auto alloc = [&](size_t bytes) { return offload_.enabled ? ops.alloc_host(bytes) : ops.alloc(bytes); };
    m_ = static_cast<float*>(alloc(n * sizeof(float)));
    v_ = static_cast<float*>(alloc(n * sizeof(float)));
    if (keeps_master(params.dtype) || ops.emulates_fp16()) master_ = static_cast<float*>(alloc(n * sizeof(float)));
    ctl_ = static_cast<float*>(ops.alloc(2 * sizeof(float)));
    if (offload_.enabled) {
        // master weights exactly for bf16 and fp16 (keeps_master): the host update rounds them
        LLMC_ASSERT(params.dtype == DType::F32 || params.dtype == DType::BF16 || params.dtype == DType::F16,
                    "optimizer offload: fp32, bf16 or fp16 models");
        offload_.piece = offload_piece(n, offload_.piece);
        for (size_t i = 0; i < runs_.size(); i++)
            for (size_t b = runs_[i].first; b < runs_[i].second; b += offload_.piece)
                pieces_.push_back({b, std::min(offload_.piece, runs_[i].second - b), run_state_[i] + (b - runs_[i].first)});
        const size_t k = dtype_size(params.dtype);
        for (int s = 0; s < kStageSlots; s++) {
            stage_grads_[s] = ops.alloc_host(offload_.piece * k);
            stage_params_[s] = ops.alloc_host(offload_.piece * k);
        }
        if (params.dtype != DType::F32) grads_f32_ = static_cast<float*>(ops.alloc_host(offload_.piece * sizeof(float)));
        if (master_) {
            std::vector<std::pair<size_t, size_t>> covered;
            for (const ParamSpec& p : layout.specs) covered.push_back({p.offset, p.offset + p.numel});
            std::sort(covered.begin(), covered.end());
            for (const auto& r : runs_) {
                size_t at = r.first;
                for (const auto& c : covered) {
                    const size_t lo = std::max(c.first, r.first), hi = std::min(c.second, r.second);
                    if (lo >= hi) continue;
                    if (lo > at) gaps_.push_back({at, lo});
                    at = std::max(at, hi);
                }
                if (at < r.second) gaps_.push_back({at, r.second});
            }
        }
    }
    sync_master_from_params();
}

AdamW::~AdamW() {
    Ops& ops = ops_;
    for (float* p : {m_, v_, master_}) {
        if (!p) continue;
        if (offload_.enabled) ops.release_host(p);
        else ops.release(p);
    }
    ops.release(ctl_);
    for (int s = 0; s < kStageSlots; s++) {
        ops.release_host(stage_grads_[s]);
        ops.release_host(stage_params_[s]);
    }
    ops.release_host(grads_f32_);
}

size_t AdamW::device_bytes() const {
    return offload_.enabled ? 0 : owned_ * sizeof(float) * (master_ ? 3 : 2);
}

size_t AdamW::host_bytes() const {
    return offload_.enabled ? offload_host_bytes(owned_, offload_.piece, dtype_size(params_.dtype), master_)
                            : 0;
}

void AdamW::step(const AdamWHyper& h, int t, float grad_scale, uint32_t seed) {
    const float ctl[2] = {grad_scale, 1.0f};
    ops_.from_host_bytes(ctl_, ctl, sizeof(ctl));
    step(h, t, ctl_, seed);
}

void AdamW::step(const AdamWHyper& h, int t, const float* ctl, uint32_t seed) {
    if (offload_.enabled) {
        step_offloaded(h, t, ctl, seed);
        return;
    }
    std::vector<AdamWPiece> pieces;
    for (size_t i = 0; i < runs_.size(); i++) {
        const size_t rb = runs_[i].first, re = runs_[i].second;
        for (const ParamSpec& p : layout_.specs) {
            const size_t lo = std::max(rb, p.offset), hi = std::min(re, p.offset + p.numel);
            if (lo >= hi) continue;
            const size_t n = hi - lo, o = lo - begin_, q = run_state_[i] + (lo - rb);  // in the views, in the state
            // bf16 stochastic rounding hashes (the tensor's seed, the index in the tensor): a seed of
            // its own per tensor keeps tensors from sharing random bits at equal indices
            pieces.push_back({params_.slice(o, n), master_ ? master_ + q : nullptr, grads_.slice(o, n), m_ + q, v_ + q,
                              p.decay ? h.weight_decay : 0.0f, tensor_seed(seed, p.offset), uint32_t(lo - p.offset)});
        }
    }
    if (!pieces.empty()) ops_.adamw_multi(pieces, ctl, h.lr, h.beta1, h.beta2, h.eps, t);
}

// Staging slots in turn: piece i + 1 downloads into its slot while the host updates piece i and
// piece i - 1 uploads from theirs; a slot is downloaded into again only once its previous piece's
// upload is done.
void AdamW::step_offloaded(const AdamWHyper& h, int t, const float* ctl, uint32_t seed) {
    Ops& ops = ops_;
    const size_t k = dtype_size(params_.dtype), pieces = pieces_.size();
    if (pieces == 0) return;
    float c[2];  // the host updates: it reads the decision
    ops.to_host_bytes(c, ctl, sizeof(c));
    if (c[1] == 0.0f) return;
    const float grad_scale = c[0];
    uint64_t down[kStageSlots] = {}, up[kStageSlots] = {};
    auto fetch = [&](size_t i) {
        const int s = int(i % kStageSlots);
        const Piece& p = pieces_[i];
        ops.wait_copy(up[s]);
        down[s] = ops.copy_to_host_async(stage_grads_[s], grads_.slice(p.begin - begin_, p.n).ptr, p.n * k);
        // without master weights the update reads the parameters (same copy stream: waiting for
        // this copy waits for the gradients' too)
        if (!master_) down[s] = ops.copy_to_host_async(stage_params_[s], params_.slice(p.begin - begin_, p.n).ptr, p.n * k);
    };
    fetch(0);
    for (size_t i = 0; i < pieces; i++) {
        if (i + 1 < pieces) fetch(i + 1);
        const int s = int(i % kStageSlots);
        const Piece& p = pieces_[i];
        ops.wait_copy(down[s]);
        update_piece(p, s, h, t, grad_scale, seed);
        up[s] = ops.copy_from_host_async(params_.slice(p.begin - begin_, p.n).ptr, stage_params_[s], p.n * k);
    }
    for (uint64_t id : up) ops.wait_copy(id);
}

void AdamW::update_piece(const Piece& pc, int s, const AdamWHyper& h, int t, float grad_scale, uint32_t seed) {
    const bool bf16 = params_.dtype == DType::BF16, f16 = params_.dtype == DType::F16;
    const size_t a0 = pc.begin, b0 = a0 + pc.n;  // the piece in the flat buffer
    const AdamWScales sc = adamw_scales(h.lr, h.beta1, h.beta2, t);
    for (const ParamSpec& p : layout_.specs) {
        // the tensor's intersection with the piece (which lies in one owned run)
        const size_t a = std::max(p.offset, a0), b = std::min(p.offset + p.numel, b0);
        if (a >= b) continue;
        const size_t cnt = b - a, r = pc.state + (a - a0), j = a - a0;  // offsets in the state and in the piece
        const float* g = static_cast<const float*>(stage_grads_[s]) + j;
        if (bf16 || f16) {
            const uint16_t* gb = static_cast<const uint16_t*>(stage_grads_[s]) + j;
#pragma omp parallel for simd schedule(static) if (cpu::parallel_worth(cnt))
            for (size_t i = 0; i < cnt; i++) grads_f32_[i] = bf16 ? bf16_bits_to_f32(gb[i]) : f16_bits_to_f32(gb[i]);
            g = grads_f32_;
        }
        // with master weights the kernel's parameter output is the master itself
        float* params = master_ ? master_ + r : static_cast<float*>(stage_params_[s]) + j;
        cpu::adamw(params, master_ ? master_ + r : nullptr, g, m_ + r, v_ + r, cnt, h.lr, sc.step, sc.inv_sqrt_bc2,
                   h.beta1, h.beta2, h.eps, p.decay ? h.weight_decay : 0.0f, grad_scale);
        if (bf16) {  // the CUDA kernel's rounding: hash of (the tensor's seed, the index in the tensor)
            const uint32_t ts = tensor_seed(seed, p.offset);
            uint16_t* pb = static_cast<uint16_t*>(stage_params_[s]) + j;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(cnt))
            for (size_t i = 0; i < cnt; i++)
                pb[i] = f32_to_bf16_stochastic(master_[r + i], hash_u32(ts, uint32_t(a - p.offset + i)));
        } else if (f16) {  // CUDA's fp16 kernel's rounding: the master to the nearest half
            uint16_t* ph = static_cast<uint16_t*>(stage_params_[s]) + j;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(cnt))
            for (size_t i = 0; i < cnt; i++) ph[i] = f32_to_f16_bits(master_[r + i]);
        } else if (master_) {  // the CPU's fp16 emulation (fp32 storage): the master rounded to the nearest half
            float* pf = static_cast<float*>(stage_params_[s]) + j;
            for (size_t i = 0; i < cnt; i++) pf[i] = round_f16(master_[r + i]);
        }
    }
    // the padding's parameters go back as they were (the master holds them exactly: synced from them)
    for (const auto& gap : gaps_) {
        const size_t a = std::max(gap.first, a0), b = std::min(gap.second, b0);
        for (size_t x = a; x < b; x++) {
            const float w = master_[pc.state + (x - a0)];
            if (bf16) static_cast<uint16_t*>(stage_params_[s])[x - a0] = f32_to_bf16_bits(w);
            else if (f16) static_cast<uint16_t*>(stage_params_[s])[x - a0] = f32_to_f16_bits(w);
            else static_cast<float*>(stage_params_[s])[x - a0] = w;
        }
    }
}

void AdamW::get_state(std::vector<float>& m, std::vector<float>& v, std::vector<float>& master) const {
    get_state(Array::M, m);
    get_state(Array::V, v);
    master.clear();
    if (master_) get_state(Array::Master, master);
}

void AdamW::get_state(Array which, std::vector<float>& out) const {
    out.resize(owned_);
    read_state(which, 0, owned_, out.data());
}

float* AdamW::array(Array which) const {
    float* p = which == Array::M ? m_ : which == Array::V ? v_ : master_;
    LLMC_ASSERT(p, "AdamW: this optimizer keeps no master weights");
    return p;
}

void AdamW::read_state(Array which, size_t at, size_t n, float* out) const {
    const float* src = array(which);
    LLMC_ASSERT(at <= owned_ && n <= owned_ - at, "read_state: past the state's end");
    if (offload_.enabled) std::copy(src + at, src + at + n, out);
    else ops_.to_host_bytes(out, src + at, n * sizeof(float));
}

void AdamW::set_state(Array which, const std::vector<float>& x) {
    float* dst = array(which);
    LLMC_ASSERT(x.size() == owned_, "optimizer state size mismatch");
    if (offload_.enabled) std::copy(x.begin(), x.end(), dst);
    else ops_.from_host_bytes(dst, x.data(), owned_ * sizeof(float));
}

void AdamW::sync_master_from_params() {
    if (!master_) return;
    std::vector<float> host(end_ - begin_), packed(owned_);
    ops_.to_host_f32(host.data(), params_);
    for (size_t i = 0; i < runs_.size(); i++)
        std::copy(host.begin() + long(runs_[i].first - begin_), host.begin() + long(runs_[i].second - begin_),
                  packed.begin() + long(run_state_[i]));
    if (offload_.enabled) std::copy(packed.begin(), packed.end(), master_);
    else ops_.from_host_bytes(master_, packed.data(), owned_ * sizeof(float));
}

std::vector<float> AdamW::get_weights() const {
    std::vector<float> w(owned_);
    if (master_) {
        if (offload_.enabled) std::copy(master_, master_ + owned_, w.begin());
        else ops_.to_host_bytes(w.data(), master_, owned_ * sizeof(float));
        return w;
    }
    for (size_t i = 0; i < runs_.size(); i++)
        ops_.to_host_f32(w.data() + run_state_[i], params_.slice(runs_[i].first - begin_, runs_[i].second - runs_[i].first));
    return w;
}

void AdamW::set_weights(const std::vector<float>& w) {
    LLMC_ASSERT(w.size() == owned_, "optimizer weights size mismatch");
    if (master_) {
        if (offload_.enabled) std::copy(w.begin(), w.end(), master_);
        else ops_.from_host_bytes(master_, w.data(), owned_ * sizeof(float));
    }
    for (size_t i = 0; i < runs_.size(); i++)
        ops_.from_host_f32(params_.slice(runs_[i].first - begin_, runs_[i].second - runs_[i].first), w.data() + run_state_[i]);
}

float clip_scale(double grad_norm, double clip) { return clip_factor(grad_norm, clip); }

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
