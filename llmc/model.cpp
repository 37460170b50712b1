#include "llmc/model.h"

#include <cmath>
#include <cstring>

#include "llmc/rng.h"

// ---------------------------------------------------------------------------------
// parameter table

namespace {

const char* kind_name(ParamKind k) {
    static const char* names[] = {"wte",      "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
                                  "ln2w",     "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
    return names[k];
}

// elements of one instance of a kind (per layer for the layer kinds)
size_t kind_numel(const ModelShape& s, ParamKind k) {
    const size_t C = s.d_model;
    switch (k) {
        case WTE: return size_t(s.padded_vocab) * C;
        case WPE: return size_t(s.max_seq_len) * C;
        case LN1W: case LN1B: case LN2W: case LN2B: case ATTPROJB: case FCPROJB: case LNFW: case LNFB: return C;
        case QKVW: return 3 * C * C;
        case QKVB: return 3 * C;
        case ATTPROJW: return C * C;
        case FCW: return 4 * C * C;
        case FCB: return 4 * C;
        case FCPROJW: return 4 * C * C;
        default: break;
    }
    LLMC_ASSERT(false, "unknown parameter kind");
    return 0;
}

bool is_layer_kind(ParamKind k) { return k != WTE && k != WPE && k != LNFW && k != LNFB; }
bool is_decayed(ParamKind k) {
    return k == WTE || k == WPE || k == QKVW || k == ATTPROJW || k == FCW || k == FCPROJW;
}

const ParamKind kLayerKinds[] = {LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB};

}  // namespace

size_t gpt2_num_params(const ModelShape& s) {
    size_t n = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        n += kind_numel(s, ParamKind(k)) * (is_layer_kind(ParamKind(k)) ? s.n_layer : 1);
    return n;
}

// ---------------------------------------------------------------------------------
// activations: one allocation, carved into views

struct GPT2::Acts {
    Tensor encoded;
    struct Layer {
        Tensor ln1, qkv, atty, residual2, ln2, fch_pre, fch_gelu, residual3;
        float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *att_lse;
    };
    std::vector<Layer> layers;
    Tensor lnf, logits, scratch;
    float *lnf_mean, *lnf_rstd, *losses;
    // backward scratch, reused by every layer
    Tensor dresidual, dln, dqkv, datty, dfch;
};

namespace {
// Hands out 256-byte aligned pieces of one allocation; a first pass with base == nullptr measures.
struct Carver {
    char* base;
    size_t used = 0;
    Tensor take(size_t n, DType t) {
        used = (used + 255) / 256 * 256;
        Tensor out(base ? base + used : nullptr, n, t);
        used += n * dtype_size(t);
        return out;
    }
    float* take_f32(size_t n) { return static_cast<float*>(take(n, DType::F32).ptr); }
};
}  // namespace

GPT2::GPT2(const ModelShape& s, Ops& o, DType dt, int b, int t, size_t pad_multiple)
    : shape(s), ops(o), dtype(dt), B(b), T(t) {
    LLMC_ASSERT(pad_multiple >= 1, "pad_multiple must be >= 1");
    LLMC_ASSERT(s.d_model % s.n_head == 0, "d_model must divide by n_head");
    LLMC_ASSERT(s.padded_vocab >= s.vocab_size, "padded vocab too small");
    // parameter table: [wte, wpe] [layer 0 kinds] ... [layer L-1 kinds] [lnfw, lnfb]
    size_t llmc_base[NUM_PARAM_KINDS];
    size_t acc = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++) {
        llmc_base[k] = acc;
        acc += kind_numel(s, ParamKind(k)) * (is_layer_kind(ParamKind(k)) ? s.n_layer : 1);
    }
    auto add = [&](ParamKind k, int layer) {
        ParamSpec p;
        p.kind = k;
        p.layer = layer;
        p.name = layer >= 0 ? strfmt("h.%d.%s", layer, kind_name(k)) : std::string(kind_name(k));
        p.numel = kind_numel(s, k);
        p.offset = num_params;
        p.decay = is_decayed(k);
        p.llmc_offset = llmc_base[k] + (layer >= 0 ? size_t(layer) * p.numel : 0);
        params.push_back(p);
        num_params += p.numel;
    };
    add(WTE, -1);
    add(WPE, -1);
    for (int l = 0; l < s.n_layer; l++)
        for (ParamKind k : kLayerKinds) add(k, l);
    add(LNFW, -1);
    add(LNFB, -1);
    LLMC_ASSERT(num_params == gpt2_num_params(s), "parameter table size mismatch");

    padded_params = (num_params + pad_multiple - 1) / pad_multiple * pad_multiple;
    param_buf = Tensor(ops.alloc(padded_params * dtype_size(dt)), padded_params, dt);
    grad_buf = Tensor(ops.alloc(padded_params * dtype_size(dt)), padded_params, dt);

    // activations
    const size_t N = size_t(B) * T, C = s.d_model, NH = s.n_head, Vp = s.padded_vocab;
    acts_ = new Acts();
    for (int pass = 0; pass < 2; pass++) {
        Carver cv{pass == 0 ? nullptr : static_cast<char*>(act_mem_)};
        Acts& a = *acts_;
        a.encoded = cv.take(N * C, dt);
        a.layers.resize(s.n_layer);
        for (auto& L : a.layers) {
            L.ln1 = cv.take(N * C, dt);
            L.ln1_mean = cv.take_f32(N);
            L.ln1_rstd = cv.take_f32(N);
            L.qkv = cv.take(N * 3 * C, dt);
            L.atty = cv.take(N * C, dt);
            L.att_lse = cv.take_f32(N * NH);
            L.residual2 = cv.take(N * C, dt);
            L.ln2 = cv.take(N * C, dt);
            L.ln2_mean = cv.take_f32(N);
            L.ln2_rstd = cv.take_f32(N);
            L.fch_pre = cv.take(N * 4 * C, dt);
            L.fch_gelu = cv.take(N * 4 * C, dt);
            L.residual3 = cv.take(N * C, dt);
        }
        a.lnf = cv.take(N * C, dt);
        a.lnf_mean = cv.take_f32(N);
        a.lnf_rstd = cv.take_f32(N);
        a.logits = cv.take(N * Vp, dt);
        a.losses = cv.take_f32(N);
        a.scratch = cv.take(N * C, dt);
        a.dresidual = cv.take(N * C, dt);
        a.dln = cv.take(N * C, dt);
        a.dqkv = cv.take(N * 3 * C, dt);
        a.datty = cv.take(N * C, dt);
        a.dfch = cv.take(N * 4 * C, dt);
        Tensor tok = cv.take(2 * N, DType::F32);  // int32 tokens and targets
        if (pass == 1) {
            tokens_dev_ = static_cast<int32_t*>(tok.ptr);
            targets_dev_ = tokens_dev_ + N;
        } else {
            activation_bytes = cv.used;
            act_mem_ = ops.alloc(activation_bytes);
        }
    }
}

GPT2::~GPT2() {
    ops.release(act_mem_);
    ops.release(grad_buf.ptr);
    ops.release(param_buf.ptr);
    delete acts_;
}

Tensor GPT2::param(ParamKind k, int layer) const {
    size_t idx = is_layer_kind(k) ? 2 + size_t(layer) * 12 + (k - LN1W) : (k == WTE ? 0 : k == WPE ? 1 : params.size() - 2 + (k - LNFW));
    const ParamSpec& p = params[idx];
    LLMC_ASSERT(p.kind == k && p.layer == (is_layer_kind(k) ? layer : -1), "parameter lookup mismatch");
    return param_buf.slice(p.offset, p.numel);
}

Tensor GPT2::grad(ParamKind k, int layer) const {
    Tensor p = param(k, layer);
    return grad_buf.slice((static_cast<char*>(p.ptr) - static_cast<char*>(param_buf.ptr)) / dtype_size(dtype), p.n);
}

// ---------------------------------------------------------------------------------
// host I/O in llm.c order

std::vector<float> GPT2::to_llmc_order(const std::vector<float>& mem) const {
    LLMC_ASSERT(mem.size() == padded_params, "to_llmc_order needs the whole model in memory order");
    std::vector<float> out(num_params);
    for (const ParamSpec& p : params) std::memcpy(&out[p.llmc_offset], &mem[p.offset], p.numel * sizeof(float));
    return out;
}

std::vector<float> GPT2::from_llmc_order(const float* llmc) const {
    std::vector<float> out(padded_params, 0.0f);
    for (const ParamSpec& p : params) std::memcpy(&out[p.offset], llmc + p.llmc_offset, p.numel * sizeof(float));
    return out;
}

void GPT2::set_params_llmc(const float* host) { ops.from_host_f32(param_buf, from_llmc_order(host).data()); }

static void buffer_to_llmc(const GPT2& m, Tensor buf, float* host) {
    std::vector<float> mem(m.padded_params);
    m.ops.to_host_f32(mem.data(), buf);
    std::vector<float> out = m.to_llmc_order(mem);
    std::memcpy(host, out.data(), out.size() * sizeof(float));
}

void GPT2::get_params_llmc(float* host) const { buffer_to_llmc(*this, param_buf, host); }
void GPT2::get_grads_llmc(float* host) const { buffer_to_llmc(*this, grad_buf, host); }

void GPT2::init_random(uint64_t seed) {
    std::vector<float> mem(padded_params, 0.0f);
    const float std_base = 0.02f;
    const float std_resid = 0.02f / std::sqrt(2.0f * shape.n_layer);
    const size_t chunk = 1 << 20;
    for (size_t pi = 0; pi < params.size(); pi++) {
        const ParamSpec& p = params[pi];
        float* dst = &mem[p.offset];
        if (p.kind == LN1W || p.kind == LN2W || p.kind == LNFW) {
            for (size_t i = 0; i < p.numel; i++) dst[i] = 1.0f;
            continue;
        }
        if (!p.decay) continue;  // biases and LN biases stay 0
        float stdv = (p.kind == ATTPROJW || p.kind == FCPROJW) ? std_resid : std_base;
        size_t n = p.kind == WTE ? size_t(shape.vocab_size) * shape.d_model : p.numel;  // padded rows stay 0
        // each chunk has its own stream: the result does not depend on the thread count
        const long nchunks = long((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (long c = 0; c < nchunks; c++) {
            Rng rng(seed, pi * 1000003ull + uint64_t(c));
            size_t end = std::min(n, size_t(c + 1) * chunk);
            for (size_t i = size_t(c) * chunk; i < end; i++) dst[i] = stdv * rng.normal();
        }
    }
    ops.from_host_f32(param_buf, mem.data());
}

void GPT2::zero_grads() { ops.zero(grad_buf); }

// ---------------------------------------------------------------------------------
// forward / backward

float GPT2::forward(const int32_t* tokens, const int32_t* targets, int b, int t, float dloss) {
    LLMC_ASSERT(b >= 1 && b <= B && t >= 1 && t <= T, "forward: batch larger than the activation buffers");
    const int C = shape.d_model, NH = shape.n_head, HS = C / NH, V = shape.vocab_size, Vp = shape.padded_vocab;
    const size_t N = size_t(b) * t;
    const size_t nC = N * C;
    Acts& a = *acts_;
    cur_b_ = b;
    cur_t_ = t;
    ops.from_host_bytes(tokens_dev_, tokens, N * sizeof(int32_t));

    ops.encoder_forward(a.encoded.slice(0, nC), tokens_dev_, param(WTE), param(WPE), b, t, C);
    Tensor res = a.encoded.slice(0, nC);
    for (int l = 0; l < shape.n_layer; l++) {
        Acts::Layer& L = a.layers[l];
        Tensor ln1 = L.ln1.slice(0, nC), qkv = L.qkv.slice(0, 3 * nC), atty = L.atty.slice(0, nC);
        Tensor res2 = L.residual2.slice(0, nC), ln2 = L.ln2.slice(0, nC), res3 = L.residual3.slice(0, nC);
        Tensor fch_pre = L.fch_pre.slice(0, 4 * nC), fch_gelu = L.fch_gelu.slice(0, 4 * nC);
        Tensor scratch = a.scratch.slice(0, nC);
        ops.layernorm_forward(ln1, L.ln1_mean, L.ln1_rstd, res, param(LN1W, l), param(LN1B, l), N, C);
        ops.matmul_forward(qkv, Tensor(), ln1, param(QKVW, l), param(QKVB, l), N, C, 3 * C, false);
        ops.attention_forward(atty, L.att_lse, qkv, b, t, NH, HS);
        ops.matmul_forward(scratch, Tensor(), atty, param(ATTPROJW, l), param(ATTPROJB, l), N, C, C, false);
        ops.fused_residual_layernorm_forward(res2, ln2, L.ln2_mean, L.ln2_rstd, res, scratch, param(LN2W, l),
                                             param(LN2B, l), N, C);
        ops.matmul_forward(fch_gelu, fch_pre, ln2, param(FCW, l), param(FCB, l), N, C, 4 * C, true);
        ops.matmul_forward(scratch, Tensor(), fch_gelu, param(FCPROJW, l), param(FCPROJB, l), N, 4 * C, C, false);
        ops.residual_forward(res3, res2, scratch);
        res = res3;
    }
    Tensor lnf = a.lnf.slice(0, nC), logits = a.logits.slice(0, N * Vp);
    ops.layernorm_forward(lnf, a.lnf_mean, a.lnf_rstd, res, param(LNFW), param(LNFB), N, C);
    ops.matmul_forward(logits, Tensor(), lnf, param(WTE), Tensor(), N, C, Vp, false);
    have_dlogits_ = false;
    if (!targets) return 0.0f;
    ops.from_host_bytes(targets_dev_, targets, N * sizeof(int32_t));
    ops.cross_entropy(logits, a.losses, targets_dev_, N, V, Vp, dloss);
    have_dlogits_ = dloss != 0.0f;
    std::vector<float> losses(N);
    ops.to_host_bytes(losses.data(), a.losses, N * sizeof(float));
    double sum = 0.0;
    for (float x : losses) sum += x;
    return float(sum / double(N));
}

void GPT2::backward(const std::function<void(size_t)>& grads_ready) {
    LLMC_ASSERT(have_dlogits_, "backward() needs a forward with targets and dloss != 0");
    const int b = cur_b_, t = cur_t_;
    const int C = shape.d_model, NH = shape.n_head, HS = C / NH, Vp = shape.padded_vocab;
    const size_t N = size_t(b) * t;
    const size_t nC = N * C;
    Acts& a = *acts_;
    Tensor dres = a.dresidual.slice(0, nC), dln = a.dln.slice(0, nC);
    Tensor last = shape.n_layer > 0 ? a.layers[shape.n_layer - 1].residual3.slice(0, nC) : a.encoded.slice(0, nC);

    ops.zero(dres);
    ops.matmul_backward(dln, grad(WTE), Tensor(), a.logits.slice(0, N * Vp), a.lnf.slice(0, nC), param(WTE), Tensor(),
                        N, C, Vp);
    ops.layernorm_backward(dres, grad(LNFW), grad(LNFB), dln, last, param(LNFW), a.lnf_mean, a.lnf_rstd, N, C);
    for (int l = shape.n_layer - 1; l >= 0; l--) {
        Acts::Layer& L = a.layers[l];
        Tensor res_in = l == 0 ? a.encoded.slice(0, nC) : a.layers[l - 1].residual3.slice(0, nC);
        Tensor dfch = a.dfch.slice(0, 4 * nC), dqkv = a.dqkv.slice(0, 3 * nC), datty = a.datty.slice(0, nC);
        ops.matmul_backward(dfch, grad(FCPROJW, l), grad(FCPROJB, l), dres, L.fch_gelu.slice(0, 4 * nC),
                            param(FCPROJW, l), Tensor(), N, 4 * C, C);
        ops.matmul_backward(dln, grad(FCW, l), grad(FCB, l), dfch, L.ln2.slice(0, nC), param(FCW, l),
                            L.fch_pre.slice(0, 4 * nC), N, C, 4 * C);
        ops.layernorm_backward(dres, grad(LN2W, l), grad(LN2B, l), dln, L.residual2.slice(0, nC), param(LN2W, l),
                               L.ln2_mean, L.ln2_rstd, N, C);
        ops.matmul_backward(datty, grad(ATTPROJW, l), grad(ATTPROJB, l), dres, L.atty.slice(0, nC),
                            param(ATTPROJW, l), Tensor(), N, C, C);
        ops.attention_backward(dqkv, datty, L.qkv.slice(0, 3 * nC), L.atty.slice(0, nC), L.att_lse, b, t, NH, HS);
        ops.matmul_backward(dln, grad(QKVW, l), grad(QKVB, l), dqkv, L.ln1.slice(0, nC), param(QKVW, l), Tensor(), N,
                            C, 3 * C);
        ops.layernorm_backward(dres, grad(LN1W, l), grad(LN1B, l), dln, res_in, param(LN1W, l), L.ln1_mean,
                               L.ln1_rstd, N, C);
        // layer l and everything after it (later layers, lnf) are final; wte still gets the encoder's part
        if (grads_ready) grads_ready(params[2 + size_t(l) * 12].offset);
    }
    ops.encoder_backward(grad(WTE), grad(WPE), dres, tokens_dev_, b, t, C);
    have_dlogits_ = false;
    if (grads_ready) grads_ready(0);
}

void GPT2::get_logits(int b, int t, float* host_row) const {
    LLMC_ASSERT(!have_dlogits_, "logits were overwritten by their gradient");
    LLMC_ASSERT(b < cur_b_ && t < cur_t_, "get_logits: row outside the last forward");
    const size_t Vp = shape.padded_vocab;
    std::vector<float> row(Vp);
    ops.to_host_f32(row.data(), acts_->logits.slice((size_t(b) * cur_t_ + t) * Vp, Vp));
    std::memcpy(host_row, row.data(), shape.vocab_size * sizeof(float));
}
