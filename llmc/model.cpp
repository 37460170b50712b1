#include "llmc/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/rng.h"
#include "llmc/tensor_parallel.h"

// ---------------------------------------------------------------------------------
// parameter table

namespace {

const char* kind_name(ParamKind k) {
    static const char* names[] = {"wte",      "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
                                  "ln2w",     "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
    return names[k];
}

// The whole tensor of a kind as a row-major [rows, cols] matrix (vectors are [n, 1]).
void kind_shape(const ModelShape& s, ParamKind k, size_t* rows, size_t* cols) {
    const size_t C = s.d_model;
    *cols = 1;
    switch (k) {
        case WTE: *rows = size_t(s.padded_vocab), *cols = C; return;
        case WPE: *rows = size_t(s.max_seq_len), *cols = C; return;
        case LN1W: case LN1B: case LN2W: case LN2B: case ATTPROJB: case FCPROJB: case LNFW: case LNFB: *rows = C; return;
        case QKVW: *rows = 3 * C, *cols = C; return;
        case QKVB: *rows = 3 * C; return;
        case ATTPROJW: *rows = C, *cols = C; return;
        case FCW: *rows = 4 * C, *cols = C; return;
        case FCB: *rows = 4 * C; return;
        case FCPROJW: *rows = C, *cols = 4 * C; return;
        default: break;
    }
    LLMC_ASSERT(false, "unknown parameter kind");
}

size_t kind_numel(const ModelShape& s, ParamKind k) {
    size_t r, c;
    kind_shape(s, k, &r, &c);
    return r * c;
}

bool is_layer_kind(ParamKind k) { return k != WTE && k != WPE && k != LNFW && k != LNFB; }
bool is_decayed(ParamKind k) {
    return k == WTE || k == WPE || k == QKVW || k == ATTPROJW || k == FCW || k == FCPROJW;
}

const ParamKind kLayerKinds[] = {LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB};

// Index of (kind, layer) in the one-process table: a stable identity for random-init streams.
size_t whole_index(const ModelShape& s, ParamKind k, int layer) {
    if (k == WTE) return 0;
    if (k == WPE) return 1;
    if (k == LNFW || k == LNFB) return 2 + size_t(s.n_layer) * 12 + (k - LNFW);
    return 2 + size_t(layer) * 12 + (k - LN1W);
}

std::vector<std::pair<int, int>> layout_chunks(const ModelShape& s, const ModelLayout& L) {
    if (L.chunks.empty()) return {{0, s.n_layer}};
    return L.chunks;
}

}  // namespace

size_t gpt2_num_params(const ModelShape& s) {
    size_t n = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++)
        n += kind_numel(s, ParamKind(k)) * (is_layer_kind(ParamKind(k)) ? s.n_layer : 1);
    return n;
}

void check_model_layout(const ModelShape& s, const ModelLayout& L, int T) {
    const int tp = L.tp;
    if (s.n_head % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide model.n_head = %d (attention heads are split "
                               "whole across tensor-parallel ranks)", tp, s.n_head));
    if (s.padded_vocab % tp != 0)
        throw UserError(strfmt("parallel.tp: %d does not divide the padded vocabulary %d (model.vocab_size %d "
                               "rounded up to a multiple of 128)", tp, s.padded_vocab, s.vocab_size));
    if (L.sequence_parallel && tp > 1 && T % tp != 0)
        throw UserError(strfmt("parallel.sequence_parallel: train.seq_len = %d must be a multiple of parallel.tp "
                               "= %d (the tokens are split evenly)", T, tp));
    for (const auto& c : layout_chunks(s, L))
        LLMC_ASSERT(c.first >= 0 && c.first < c.second && c.second <= s.n_layer, "bad chunk layer range");
}

std::vector<ParamSpec> gpt2_param_table(const ModelShape& s, const ModelLayout& L, size_t* num_local) {
    size_t llmc_base[NUM_PARAM_KINDS];
    size_t acc = 0;
    for (int k = 0; k < NUM_PARAM_KINDS; k++) {
        llmc_base[k] = acc;
        acc += kind_numel(s, ParamKind(k)) * (is_layer_kind(ParamKind(k)) ? s.n_layer : 1);
    }
    const size_t tp = size_t(L.tp), r = size_t(L.tp_rank);
    std::vector<ParamSpec> table;
    size_t offset = 0;
    auto add = [&](ParamKind k, int layer, bool tied_copy) {
        ParamSpec p;
        p.kind = k;
        p.layer = layer;
        p.name = layer >= 0 ? strfmt("h.%d.%s", layer, kind_name(k)) : std::string(kind_name(k));
        if (tied_copy) p.name += " (head copy)";
        size_t rows, cols;
        kind_shape(s, k, &rows, &cols);
        p.rows = {{0, rows}};
        p.cols = cols;
        p.col_begin = 0;
        p.col_end = cols;
        p.tp_replicated = false;
        switch (k) {
            case WTE: case FCW: case FCB:  // column-parallel / vocabulary-parallel: a block of rows
                p.rows = {{r * rows / tp, (r + 1) * rows / tp}};
                break;
            case QKVW: case QKVB: {  // column-parallel by heads: this rank's rows of q, of k and of v
                const size_t C = rows / 3;
                p.rows = {{r * C / tp, (r + 1) * C / tp}, {C + r * C / tp, C + (r + 1) * C / tp},
                          {2 * C + r * C / tp, 2 * C + (r + 1) * C / tp}};
                break;
            }
            case ATTPROJW: case FCPROJW:  // row-parallel: a block of input columns
                p.col_begin = r * cols / tp;
                p.col_end = (r + 1) * cols / tp;
                break;
            default:
                p.tp_replicated = true;
                break;
        }
        p.numel = 0;
        for (const auto& rr : p.rows) p.numel += (rr.second - rr.first) * (p.col_end - p.col_begin);
        p.offset = offset;
        p.decay = is_decayed(k);
        p.tied_copy = tied_copy;
        p.primary = !tied_copy && (!p.tp_replicated || r == 0);
        p.llmc_offset = llmc_base[k] + (layer >= 0 ? size_t(layer) * kind_numel(s, k) : 0);
        table.push_back(p);
        offset += p.numel;
    };
    if (L.first) {
        add(WTE, -1, false);
        add(WPE, -1, false);
    }
    for (const auto& c : layout_chunks(s, L))
        for (int l = c.first; l < c.second; l++)
            for (ParamKind k : kLayerKinds) add(k, l, false);
    if (L.last) {
        add(LNFW, -1, false);
        add(LNFB, -1, false);
        if (!L.first) add(WTE, -1, true);
    }
    *num_local = offset;
    return table;
}

// ---------------------------------------------------------------------------------
// activations: one allocation, carved into views

// One layer's saved activations for one micro-batch. nl = rows of the residual stream this
// rank holds (N, or N/tp with sequence parallelism); the TP-split ones hold N rows of 1/tp width.
struct GPT2::LayerActs {
    Tensor ln1, qkv, atty, residual2, ln2, fch_pre, fch_gelu, residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *att_lse;
};

// A chunk's activations for one micro-batch in flight.
struct GPT2::SlotActs {
    Tensor input;  // the residual stream entering the chunk (the embedding's output in the first chunk)
    std::vector<LayerActs> layers;
    Tensor lnf, logits;  // the head (last chunk of the model only)
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
    int32_t *tokens = nullptr, *targets = nullptr;  // backend copies of this micro-batch's ids
    int b = 0, t = 0;
    bool have_dlogits = false;
};

// Buffers one op sequence at a time uses, shared by every slot and chunk.
struct GPT2::Scratch {
    Tensor full, full_grad;  // [N, C]: gathered LayerNorm outputs / gathered residual gradients (SP)
    Tensor partial;          // [N, C]: row-parallel outputs and column-parallel input gradients before the TP reduction
    Tensor rows;             // [nl, C]: the reduce-scattered result (SP)
    Tensor dresidual;        // [nl, C]: the residual stream's gradient
    Tensor dqkv, datty, dfch;
    Tensor ln_grads;         // [2C]: one LayerNorm's weight and bias gradients before the TP reduction (SP)
    float* stats = nullptr;  // [N, 3]: vocabulary-parallel cross-entropy statistics
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

int GPT2::tp_size() const { return layout.tp; }

GPT2::GPT2(const ModelShape& s, Ops& o, DType dt, int b, int t, size_t pad_multiple, const ModelLayout& lay,
           TensorParallel* tp, std::vector<int> slots, ModelStorage storage)
    : shape(s), ops(o), dtype(dt), B(b), T(t), layout(lay), tp_(tp), storage_(storage) {
    if (!tp_) {
        own_tp_.reset(new TensorParallel(ops, nullptr, false));
        tp_ = own_tp_.get();
    }
    LLMC_ASSERT(pad_multiple >= 1, "pad_multiple must be >= 1");
    LLMC_ASSERT(s.d_model % s.n_head == 0, "d_model must divide by n_head");
    LLMC_ASSERT(s.padded_vocab >= s.vocab_size, "padded vocab too small");
    LLMC_ASSERT(lay.tp == tp_->size() && lay.tp_rank == tp_->rank(), "layout and TP group disagree");
    LLMC_ASSERT(!lay.sequence_parallel || lay.tp == 1 || tp_->sequence_parallel(), "SP flag mismatch");
    check_model_layout(s, lay, t);
    params = gpt2_param_table(s, lay, &num_params);
    total_params = gpt2_num_params(s);
    lookup_.assign(size_t(NUM_PARAM_KINDS) * (s.n_layer + 1), -1);
    for (size_t i = 0; i < params.size(); i++)
        if (!params[i].tied_copy) lookup_[size_t(params[i].kind) * (s.n_layer + 1) + (params[i].layer + 1)] = int(i);

    padded_params = (num_params + pad_multiple - 1) / pad_multiple * pad_multiple;
    if (storage != ModelStorage::Sharded) param_buf = Tensor(ops.alloc(padded_params * dtype_size(dt)), padded_params, dt);
    if (storage == ModelStorage::Full) grad_buf = Tensor(ops.alloc(padded_params * dtype_size(dt)), padded_params, dt);

    // units: the embedding, each layer, the head; consecutive in memory
    layer_unit_.assign(size_t(s.n_layer), -1);
    param_unit_.resize(params.size());
    for (size_t i = 0; i < params.size(); i++) {
        const ParamSpec& p = params[i];
        const ParamUnit::Kind k = p.layer >= 0 ? ParamUnit::Layer
                                  : (p.kind == LNFW || p.kind == LNFB || p.tied_copy) ? ParamUnit::Head
                                                                                       : ParamUnit::Embedding;
        if (units.empty() || units.back().kind != k || units.back().layer != p.layer) {
            units.push_back({k, p.offset, p.offset, p.layer});
            if (k == ParamUnit::Layer) layer_unit_[size_t(p.layer)] = int(units.size()) - 1;
            if (k == ParamUnit::Embedding) embed_unit_ = int(units.size()) - 1;
            if (k == ParamUnit::Head) head_unit_ = int(units.size()) - 1;
        }
        LLMC_ASSERT(units.back().end == p.offset, "units must be contiguous");
        units.back().end = p.offset + p.numel;
        param_unit_[i] = int(units.size()) - 1;
    }
    if (!units.empty()) units.back().end = padded_params;
    unit_params_.resize(units.size());
    unit_grads_.resize(units.size());
    param_refs_.assign(units.size(), 0);
    grad_refs_.assign(units.size(), 0);
    for (size_t u = 0; u < units.size(); u++) {
        if (param_buf.ptr) unit_params_[u] = param_buf.slice(units[u].begin, units[u].numel());
        if (grad_buf.ptr) unit_grads_[u] = grad_buf.slice(units[u].begin, units[u].numel());
    }

    // chunks and their activation slots
    const auto ranges = layout_chunks(s, lay);
    if (slots.empty()) slots.assign(ranges.size(), 1);
    LLMC_ASSERT(slots.size() == ranges.size(), "one slot count per chunk");
    for (size_t c = 0; c < ranges.size(); c++) {
        Chunk ch;
        ch.begin = ranges[c].first;
        ch.end = ranges[c].second;
        ch.starts = lay.first && c == 0;
        ch.ends = lay.last && c + 1 == ranges.size();
        ch.slots.resize(size_t(std::max(1, slots[c])));
        chunks_.push_back(ch);
    }
    scratch_ = new Scratch();

    activation_bytes = carve_activations(nullptr, layout.sequence_parallel, chunks_, *scratch_);
    act_mem_ = ops.alloc(activation_bytes);
    carve_activations(static_cast<char*>(act_mem_), layout.sequence_parallel, chunks_, *scratch_);
}

size_t GPT2::carve_activations(char* base, bool sp, std::vector<Chunk>& chunks, Scratch& S) const {
    const size_t tpn = size_t(layout.tp);
    const DType dt = dtype;
    const size_t N = size_t(B) * T, C = shape.d_model, NHl = shape.n_head / tpn, Cl = C / tpn;
    const size_t Vl = shape.padded_vocab / tpn, nl = sp && tpn > 1 ? N / tpn : N;
    Carver cv{base};
    for (Chunk& ch : chunks) {
        for (SlotActs& sa : ch.slots) {
            sa.input = cv.take(nl * C, dt);
            sa.layers.resize(size_t(ch.end - ch.begin));
            for (LayerActs& L : sa.layers) {
                L.ln1 = cv.take(nl * C, dt);
                L.ln1_mean = cv.take_f32(nl);
                L.ln1_rstd = cv.take_f32(nl);
                L.qkv = cv.take(N * 3 * Cl, dt);
                L.atty = cv.take(N * Cl, dt);
                L.att_lse = cv.take_f32(N * NHl);
                L.residual2 = cv.take(nl * C, dt);
                L.ln2 = cv.take(nl * C, dt);
                L.ln2_mean = cv.take_f32(nl);
                L.ln2_rstd = cv.take_f32(nl);
                L.fch_pre = cv.take(N * 4 * Cl, dt);
                L.fch_gelu = cv.take(N * 4 * Cl, dt);
                L.residual3 = cv.take(nl * C, dt);
            }
            if (ch.ends) {
                sa.lnf = cv.take(nl * C, dt);
                sa.lnf_mean = cv.take_f32(nl);
                sa.lnf_rstd = cv.take_f32(nl);
                sa.logits = cv.take(N * Vl, dt);
                sa.losses = cv.take_f32(N);
            }
            Tensor ids = cv.take(2 * N, DType::F32);  // int32 tokens and targets
            sa.tokens = static_cast<int32_t*>(ids.ptr);
            sa.targets = sa.tokens ? sa.tokens + N : nullptr;
        }
    }
    S.full = cv.take(N * C, dt);
    S.full_grad = cv.take(N * C, dt);
    S.partial = cv.take(N * C, dt);
    S.rows = cv.take(nl * C, dt);
    S.dresidual = cv.take(nl * C, dt);
    S.dqkv = cv.take(N * 3 * Cl, dt);
    S.datty = cv.take(N * Cl, dt);
    S.dfch = cv.take(N * 4 * Cl, dt);
    S.ln_grads = cv.take(2 * C, dt);
    S.stats = cv.take_f32(3 * N);
    return cv.used;
}

size_t GPT2::activation_bytes_without_sp() const {
    std::vector<Chunk> chunks = chunks_;
    Scratch s;
    return carve_activations(nullptr, false, chunks, s);
}

GPT2::~GPT2() {
    ops.release(act_mem_);
    ops.release(grad_buf.ptr);
    ops.release(param_buf.ptr);
    delete scratch_;
}

bool GPT2::holds(ParamKind k, int layer) const {
    if (layer < -1 || layer >= shape.n_layer) return false;
    return lookup_[size_t(k) * (shape.n_layer + 1) + (layer + 1)] >= 0;
}

const ParamSpec& GPT2::spec(ParamKind k, int layer) const {
    LLMC_ASSERT(holds(k, layer), strfmt("parameter %s (layer %d) is not held by this rank", kind_name(k), layer));
    return params[size_t(lookup_[size_t(k) * (shape.n_layer + 1) + (layer + 1)])];
}

const ParamSpec& GPT2::wte_spec() const {
    if (layout.first) return spec(WTE);
    LLMC_ASSERT(layout.last && params.back().tied_copy, "this rank holds no wte");
    return params.back();  // the last stage's copy comes last
}

Tensor GPT2::param(ParamKind k, int layer) const { return param_of(spec(k, layer)); }
Tensor GPT2::grad(ParamKind k, int layer) const { return grad_of(spec(k, layer)); }

Tensor GPT2::param_of(const ParamSpec& p) const {
    const int u = unit_of(p);
    const Tensor& base = unit_params_[size_t(u)];
    LLMC_ASSERT(base.ptr, strfmt("parameters of %s used outside acquire_params", p.name.c_str()));
    return base.slice(p.offset - units[size_t(u)].begin, p.numel);
}

Tensor GPT2::grad_of(const ParamSpec& p) const {
    const int u = unit_of(p);
    const Tensor& base = unit_grads_[size_t(u)];
    LLMC_ASSERT(base.ptr, strfmt("gradients of %s used outside acquire_grads", p.name.c_str()));
    return base.slice(p.offset - units[size_t(u)].begin, p.numel);
}

size_t GPT2::max_unit(ParamUnit::Kind k) const {
    size_t n = 0;
    for (const ParamUnit& u : units)
        if (u.kind == k) n = std::max(n, u.numel());
    return n;
}

void GPT2::set_store(ParamStore* store) {
    LLMC_ASSERT(storage_ != ModelStorage::Full, "a model with whole buffers has no store");
    store_ = store;
}

// Reference counts: a unit acquired twice (the head's wte when it sits in the head unit) is
// released by the second release; units of whole buffers stay in place. One pair for
// parameters and gradients: the store's calls are picked by `grads`.
void GPT2::acquire_unit(int u, bool grads) {
    int& refs = (grads ? grad_refs_ : param_refs_)[size_t(u)];
    if (refs++ > 0 || (grads ? grad_buf : param_buf).ptr) return;
    LLMC_ASSERT(store_, "sharded parameters and gradients need a ParamStore (set_store)");
    (grads ? unit_grads_ : unit_params_)[size_t(u)] = grads ? store_->acquire_grads(u) : store_->acquire_params(u);
}

void GPT2::release_unit(int u, bool grads) {
    int& refs = (grads ? grad_refs_ : param_refs_)[size_t(u)];
    LLMC_ASSERT(refs > 0, "a unit released more often than acquired");
    if (--refs > 0 || (grads ? grad_buf : param_buf).ptr) return;
    (grads ? unit_grads_ : unit_params_)[size_t(u)] = Tensor();
    if (grads) store_->release_grads(u);
    else store_->release_params(u);
}

void GPT2::prefetch_params(int u) {
    if (u >= 0 && !param_buf.ptr && param_refs_[size_t(u)] == 0) store_->prefetch_params(u);
}

void GPT2::load_params_mem(const float* mem) {
    if (param_buf.ptr) {
        ops.from_host_f32(param_buf, mem);
        return;
    }
    LLMC_ASSERT(store_, "sharded parameters need a ParamStore (set_store)");
    store_->load_params(mem);
}

// ---------------------------------------------------------------------------------
// host I/O in llm.c order

std::vector<float> GPT2::from_llmc_order(const float* llmc) const {
    std::vector<float> out(padded_params, 0.0f);
    for (const ParamSpec& p : params)
        for_each_run(p, [&](size_t local, size_t src, size_t n) {
            std::memcpy(&out[p.offset + local], llmc + src, n * sizeof(float));
        });
    return out;
}

std::vector<float> GPT2::to_llmc_order(const std::vector<float>& mem) const {
    LLMC_ASSERT(mem.size() == padded_params, "to_llmc_order needs this rank's whole buffer in memory order");
    LLMC_ASSERT(num_params == total_params, "to_llmc_order needs a layout that holds the whole model");
    std::vector<float> out(total_params);
    for (const ParamSpec& p : params)
        for_each_run(p, [&](size_t local, size_t dst, size_t n) {
            std::memcpy(&out[dst], &mem[p.offset + local], n * sizeof(float));
        });
    return out;
}

void GPT2::set_params_llmc(const float* host) { load_params_mem(from_llmc_order(host).data()); }

static void buffer_to_llmc(const GPT2& m, Tensor buf, float* host) {
    LLMC_ASSERT(buf.ptr, "get_params_llmc / get_grads_llmc need the model's whole buffers (ModelStorage::Full)");
    std::vector<float> mem(m.padded_params);
    m.ops.to_host_f32(mem.data(), buf);
    std::vector<float> out = m.to_llmc_order(mem);
    std::memcpy(host, out.data(), out.size() * sizeof(float));
}

void GPT2::get_params_llmc(float* host) const { buffer_to_llmc(*this, param_buf, host); }
void GPT2::get_grads_llmc(float* host) const { buffer_to_llmc(*this, grad_buf, host); }

void GPT2::init_random(uint64_t seed) {
    // Each tensor is drawn whole from streams named by its identity, then this rank keeps its
    // pieces: every layout starts from the same model.
    std::vector<float> mem(padded_params, 0.0f), whole;
    const float std_base = 0.02f;
    const float std_resid = 0.02f / std::sqrt(2.0f * shape.n_layer);
    const size_t chunk = 1 << 20;
    for (const ParamSpec& p : params) {
        whole.assign(kind_numel(shape, p.kind), 0.0f);
        if (p.kind == LN1W || p.kind == LN2W || p.kind == LNFW) {
            std::fill(whole.begin(), whole.end(), 1.0f);
        } else if (p.decay) {  // biases and LN biases stay 0
            const float stdv = (p.kind == ATTPROJW || p.kind == FCPROJW) ? std_resid : std_base;
            const size_t n = p.kind == WTE ? size_t(shape.vocab_size) * shape.d_model : whole.size();  // padded rows 0
            const uint64_t stream = whole_index(shape, p.kind, p.layer);
            // each chunk has its own stream: the result does not depend on the thread count
            const long nchunks = long((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
            for (long c = 0; c < nchunks; c++) {
                Rng rng(seed, stream * 1000003ull + uint64_t(c));
                const size_t end = std::min(n, size_t(c + 1) * chunk);
                for (size_t i = size_t(c) * chunk; i < end; i++) whole[i] = stdv * rng.normal();
            }
        }
        for_each_run(p, [&](size_t local, size_t src, size_t n) {
            std::memcpy(&mem[p.offset + local], &whole[src - p.llmc_offset], n * sizeof(float));
        });
    }
    load_params_mem(mem.data());
}

void GPT2::zero_grads() {
    if (grad_buf.ptr) ops.zero(grad_buf);
    else store_->zero_grads();
}

// ---------------------------------------------------------------------------------
// forward / backward
//
// Shapes per rank: N = b*t tokens; nl = N (or N/tp with sequence parallelism) rows of the
// residual stream; column-parallel outputs are N x (width/tp); row-parallel outputs N x C
// partial sums until the TP reduction (all-reduce, or reduce-scatter to nl rows with SP).
// With tp == 1 every TP call is a no-op and this is plain GPT-2.

size_t GPT2::local_rows(int b, int t) const {
    const size_t N = size_t(b) * t;
    if (!layout.sequence_parallel || layout.tp == 1) return N;
    LLMC_ASSERT(N % size_t(layout.tp) == 0, "sequence parallelism needs b*t divisible by tp");
    return N / size_t(layout.tp);
}

Tensor GPT2::chunk_input(int c, int slot, int b, int t) const {
    return chunks_[size_t(c)].slots[size_t(slot)].input.slice(0, local_rows(b, t) * shape.d_model);
}

Tensor GPT2::chunk_output(int c, int slot, int b, int t) const {
    const SlotActs& s = chunks_[size_t(c)].slots[size_t(slot)];
    return s.layers.back().residual3.slice(0, local_rows(b, t) * shape.d_model);
}

Tensor GPT2::residual_grad(int b, int t) const {
    return scratch_->dresidual.slice(0, local_rows(b, t) * shape.d_model);
}

// The linears of a block. In fp8 the forward records the amaxes of the input and the weight;
// the backward records the output gradient's and casts input and weight again with the
// forward's scales but records nothing (same tensors: their amaxes are already in).
void GPT2::linear_forward(int l, Fp8Linear lin, Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N,
                          int IC, int OC, bool gelu) {
    // A forward-only pass with a row count the fp8 GEMM cannot take (sampling's short windows
    // on CUDA; training shapes are checked at start-up) runs this linear in the model's dtype.
    if (!fp8_ || N % ops.fp8_dim_multiple() != 0) {
        ops.matmul_forward(out, pre_gelu, inp, w, bias, N, IC, OC, gelu);
        return;
    }
    ops.matmul_forward_fp8(out, pre_gelu, inp, w, bias, N, IC, OC, gelu,
                           fp8_->cast(l, lin, Fp8Operand::Input, fp8_amax_),
                           fp8_->cast(l, lin, Fp8Operand::Weight, fp8_amax_));
}

void GPT2::linear_backward(int l, Fp8Linear lin, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp,
                           Tensor w, Tensor pre_gelu, int N, int IC, int OC) {
    if (!fp8_) {
        ops.matmul_backward(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC);
        return;
    }
    ops.matmul_backward_fp8(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC,
                            fp8_->cast(l, lin, Fp8Operand::GradOutput, fp8_amax_),
                            fp8_->cast(l, lin, Fp8Operand::Input, nullptr),
                            fp8_->cast(l, lin, Fp8Operand::Weight, nullptr));
}

void GPT2::layer_forward(int l, LayerActs& L, Tensor res, int b, int t) {
    TensorParallel& tp = *tp_;
    const int tpn = tp_size();
    const int C = shape.d_model, NHl = shape.n_head / tpn, HS = C / shape.n_head, Cl = C / tpn;
    const size_t N = size_t(b) * t, nl = local_rows(b, t), nC = N * C;
    Scratch& S = *scratch_;
    const bool bias_here = tp.rank() == 0;  // a row-parallel bias is added once, before the reduction
    Tensor ln1 = L.ln1.slice(0, nl * C), qkv = L.qkv.slice(0, N * 3 * Cl), atty = L.atty.slice(0, N * Cl);
    Tensor res2 = L.residual2.slice(0, nl * C), ln2 = L.ln2.slice(0, nl * C), res3 = L.residual3.slice(0, nl * C);
    Tensor fch_pre = L.fch_pre.slice(0, N * 4 * Cl), fch_gelu = L.fch_gelu.slice(0, N * 4 * Cl);
    Tensor full = S.full.slice(0, nC), partial = S.partial.slice(0, nC), rows = S.rows.slice(0, nl * C);

    ops.layernorm_forward(ln1, L.ln1_mean, L.ln1_rstd, res, param(LN1W, l), param(LN1B, l), int(nl), C);
    Tensor x = tp.gather_rows(ln1, full);
    linear_forward(l, Fp8Linear::Qkv, qkv, Tensor(), x, param(QKVW, l), param(QKVB, l), int(N), C, 3 * Cl, false);
    ops.attention_forward(atty, L.att_lse, qkv, b, t, NHl, HS);
    linear_forward(l, Fp8Linear::AttnProj, partial, Tensor(), atty, param(ATTPROJW, l),
                   bias_here ? param(ATTPROJB, l) : Tensor(), int(N), Cl, C, false);
    Tensor y = tp.reduce_rows(partial, rows);
    ops.fused_residual_layernorm_forward(res2, ln2, L.ln2_mean, L.ln2_rstd, res, y, param(LN2W, l), param(LN2B, l),
                                         int(nl), C);
    x = tp.gather_rows(ln2, full);
    linear_forward(l, Fp8Linear::Fc, fch_gelu, fch_pre, x, param(FCW, l), param(FCB, l), int(N), C, 4 * Cl, true);
    linear_forward(l, Fp8Linear::FcProj, partial, Tensor(), fch_gelu, param(FCPROJW, l),
                   bias_here ? param(FCPROJB, l) : Tensor(), int(N), 4 * Cl, C, false);
    y = tp.reduce_rows(partial, rows);
    ops.residual_forward(res3, res2, y);
}

// LayerNorm backward into the parameter gradients; with sequence parallelism each rank saw only
// its tokens, so the weight and bias gradients of this micro-batch are summed over TP first.
static void layernorm_backward_tp(GPT2& m, TensorParallel& tp, Tensor ln_grads, Tensor dres, Tensor dw, Tensor db,
                                  Tensor dout, Tensor inp, Tensor w, const float* mean, const float* rstd, int nl,
                                  int C) {
    if (!tp.sequence_parallel()) {
        m.ops.layernorm_backward(dres, dw, db, dout, inp, w, mean, rstd, nl, C);
        return;
    }
    Tensor g = ln_grads.slice(0, 2 * size_t(C));
    m.ops.zero(g);
    m.ops.layernorm_backward(dres, g.slice(0, C), g.slice(C, C), dout, inp, w, mean, rstd, nl, C);
    tp.all_reduce(g);
    m.ops.residual_forward(dw, dw, g.slice(0, C));
    m.ops.residual_forward(db, db, g.slice(C, C));
}

void GPT2::layer_backward(int l, LayerActs& L, Tensor res_in, int b, int t) {
    TensorParallel& tp = *tp_;
    const int tpn = tp_size();
    const int C = shape.d_model, NHl = shape.n_head / tpn, HS = C / shape.n_head, Cl = C / tpn;
    const size_t N = size_t(b) * t, nl = local_rows(b, t), nC = N * C;
    Scratch& S = *scratch_;
    Tensor dres = S.dresidual.slice(0, nl * C), rows = S.rows.slice(0, nl * C);
    Tensor full = S.full.slice(0, nC), full_grad = S.full_grad.slice(0, nC), partial = S.partial.slice(0, nC);
    Tensor dfch = S.dfch.slice(0, N * 4 * Cl), dqkv = S.dqkv.slice(0, N * 3 * Cl), datty = S.datty.slice(0, N * Cl);

    // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    Tensor dy = tp.gather_rows(dres, full_grad);
    linear_backward(l, Fp8Linear::FcProj, dfch, grad(FCPROJW, l), grad(FCPROJB, l), dy, L.fch_gelu.slice(0, N * 4 * Cl),
                    param(FCPROJW, l), Tensor(), int(N), 4 * Cl, C);
    Tensor x = tp.gather_rows(L.ln2.slice(0, nl * C), full);  // SP: gathered again rather than kept
    linear_backward(l, Fp8Linear::Fc, partial, grad(FCW, l), grad(FCB, l), dfch, x, param(FCW, l),
                    L.fch_pre.slice(0, N * 4 * Cl), int(N), C, 4 * Cl);
    Tensor dx = tp.reduce_rows(partial, rows);
    layernorm_backward_tp(*this, tp, S.ln_grads, dres, grad(LN2W, l), grad(LN2B, l), dx, L.residual2.slice(0, nl * C),
                          param(LN2W, l), L.ln2_mean, L.ln2_rstd, int(nl), C);
    // attention: res2 = res + attproj(attention(qkv(ln1(res))))
    dy = tp.gather_rows(dres, full_grad);
    linear_backward(l, Fp8Linear::AttnProj, datty, grad(ATTPROJW, l), grad(ATTPROJB, l), dy, L.atty.slice(0, N * Cl),
                    param(ATTPROJW, l), Tensor(), int(N), Cl, C);
    ops.attention_backward(dqkv, datty, L.qkv.slice(0, N * 3 * Cl), L.atty.slice(0, N * Cl), L.att_lse, b, t, NHl, HS);
    x = tp.gather_rows(L.ln1.slice(0, nl * C), full);
    linear_backward(l, Fp8Linear::Qkv, partial, grad(QKVW, l), grad(QKVB, l), dqkv, x, param(QKVW, l), Tensor(), int(N),
                    C, 3 * Cl);
    dx = tp.reduce_rows(partial, rows);
    layernorm_backward_tp(*this, tp, S.ln_grads, dres, grad(LN1W, l), grad(LN1B, l), dx, res_in, param(LN1W, l),
                          L.ln1_mean, L.ln1_rstd, int(nl), C);
}

namespace {
int vocab_begin_of(const ModelShape& s, const ModelLayout& L) { return L.tp_rank * (s.padded_vocab / L.tp); }
}  // namespace

float GPT2::head_forward(SlotActs& sa, Tensor res, const int32_t* targets, int b, int t, float dloss) {
    TensorParallel& tp = *tp_;
    const int C = shape.d_model, V = shape.vocab_size, Vl = shape.padded_vocab / tp_size();
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    const ParamSpec& w = wte_spec();
    const int wu = unit_of(w);
    acquire_params(head_unit_);
    acquire_params(wu);
    Tensor lnf = sa.lnf.slice(0, nl * C), logits = sa.logits.slice(0, N * size_t(Vl));
    ops.layernorm_forward(lnf, sa.lnf_mean, sa.lnf_rstd, res, param(LNFW), param(LNFB), int(nl), C);
    Tensor x = tp.gather_rows(lnf, scratch_->full.slice(0, N * C));
    ops.matmul_forward(logits, Tensor(), x, param_of(w), Tensor(), int(N), C, Vl, false);
    release_params(wu);
    release_params(head_unit_);
    sa.have_dlogits = false;
    if (!targets) return 0.0f;
    ops.from_host_bytes(sa.targets, targets, N * sizeof(int32_t));
    if (tp.size() == 1) {
        ops.cross_entropy(logits, sa.losses, sa.targets, int(N), V, Vl, dloss);
    } else {  // vocabulary-parallel: only per-row statistics cross the TP group
        const int v0 = vocab_begin_of(shape, layout);
        ops.cross_entropy_partial(scratch_->stats, logits, sa.targets, int(N), Vl, v0, V);
        tp.combine_cross_entropy_stats(scratch_->stats, N);
        ops.cross_entropy_finish(logits, sa.losses, scratch_->stats, sa.targets, int(N), Vl, v0, V, dloss);
    }
    sa.have_dlogits = dloss != 0.0f;
    std::vector<float> losses(N);
    ops.to_host_bytes(losses.data(), sa.losses, N * sizeof(float));
    double sum = 0.0;
    for (float v : losses) sum += v;
    return float(sum / double(N));
}

void GPT2::head_backward(SlotActs& sa, Tensor res, int b, int t) {
    TensorParallel& tp = *tp_;
    const int C = shape.d_model, Vl = shape.padded_vocab / tp_size();
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    Scratch& S = *scratch_;
    const ParamSpec& w = wte_spec();
    const int wu = unit_of(w);
    acquire_params(head_unit_);
    acquire_params(wu);
    acquire_grads(head_unit_);
    acquire_grads(wu);
    Tensor dres = S.dresidual.slice(0, nl * C), partial = S.partial.slice(0, N * C);
    Tensor x = tp.gather_rows(sa.lnf.slice(0, nl * C), S.full.slice(0, N * C));
    ops.matmul_backward(partial, grad_of(w), Tensor(), sa.logits.slice(0, N * size_t(Vl)), x, param_of(w), Tensor(),
                        int(N), C, Vl);
    Tensor dx = tp.reduce_rows(partial, S.rows.slice(0, nl * C));
    ops.zero(dres);
    layernorm_backward_tp(*this, tp, S.ln_grads, dres, grad(LNFW), grad(LNFB), dx, res, param(LNFW), sa.lnf_mean,
                          sa.lnf_rstd, int(nl), C);
    release_grads(wu);
    release_grads(head_unit_);
    release_params(wu);
    release_params(head_unit_);
}

float GPT2::forward_chunk(int c, int slot, const int32_t* tokens, const int32_t* targets, int b, int t, float dloss) {
    LLMC_ASSERT(b >= 1 && b <= B && t >= 1 && t <= T, "forward: batch larger than the activation buffers");
    TensorParallel& tp = *tp_;
    Chunk& ch = chunks_[size_t(c)];
    SlotActs& sa = ch.slots[size_t(slot)];
    const int C = shape.d_model;
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    sa.b = b;
    sa.t = t;
    sa.have_dlogits = false;
    Tensor res = sa.input.slice(0, nl * C);
    if (ch.starts) {  // vocabulary-parallel embedding: each rank looks up its rows, the TP group sums
        LLMC_ASSERT(tokens, "the first chunk needs tokens");
        ops.from_host_bytes(sa.tokens, tokens, N * sizeof(int32_t));
        const int v0 = vocab_begin_of(shape, layout);
        acquire_params(embed_unit_);
        Tensor wpe = tp.rank() == 0 ? param(WPE) : Tensor();
        if (tp.sequence_parallel()) {
            Tensor partial = scratch_->partial.slice(0, N * C);
            ops.encoder_forward(partial, sa.tokens, param(WTE), wpe, b, t, C, v0);
            tp.reduce_scatter_rows(partial, res);
        } else {
            ops.encoder_forward(res, sa.tokens, param(WTE), wpe, b, t, C, v0);
            tp.all_reduce(res);
        }
        release_params(embed_unit_);
    }
    for (int l = ch.begin; l < ch.end; l++) {
        LayerActs& L = sa.layers[size_t(l - ch.begin)];
        const int u = layer_unit_[size_t(l)];
        acquire_params(u);
        prefetch_params(l + 1 < ch.end ? layer_unit_[size_t(l + 1)] : ch.ends ? head_unit_ : -1);
        layer_forward(l, L, res, b, t);
        release_params(u);
        res = L.residual3.slice(0, nl * C);
    }
    if (!ch.ends) return 0.0f;
    return head_forward(sa, res, targets, b, t, dloss);
}

void GPT2::backward_chunk(int c, int slot, const std::function<void(size_t)>& grads_ready) {
    TensorParallel& tp = *tp_;
    Chunk& ch = chunks_[size_t(c)];
    SlotActs& sa = ch.slots[size_t(slot)];
    const int b = sa.b, t = sa.t, C = shape.d_model;
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    auto res_in = [&](int l) {
        return l == ch.begin ? sa.input.slice(0, nl * C) : sa.layers[size_t(l - 1 - ch.begin)].residual3.slice(0, nl * C);
    };
    if (ch.ends) {
        LLMC_ASSERT(sa.have_dlogits, "backward needs a forward with targets and dloss != 0");
        prefetch_params(layer_unit_[size_t(ch.end - 1)]);
        head_backward(sa, res_in(ch.end), b, t);
        sa.have_dlogits = false;
    }
    for (int l = ch.end - 1; l >= ch.begin; l--) {
        const int u = layer_unit_[size_t(l)];
        acquire_params(u);
        prefetch_params(l > ch.begin ? layer_unit_[size_t(l - 1)] : -1);  // the encoder's backward reads no parameters
        acquire_grads(u);
        layer_backward(l, sa.layers[size_t(l - ch.begin)], res_in(l), b, t);
        release_grads(u);
        release_params(u);
        // layer l and everything after it in memory are final (wte still gets the encoder's part)
        if (grads_ready) grads_ready(spec(LN1W, l).offset);
    }
    if (ch.starts) {
        Tensor dres = scratch_->dresidual.slice(0, nl * C);
        Tensor d = tp.gather_rows(dres, scratch_->full_grad.slice(0, N * C));
        acquire_grads(embed_unit_);
        ops.encoder_backward(grad(WTE), grad(WPE), d, sa.tokens, b, t, C, vocab_begin_of(shape, layout));
        release_grads(embed_unit_);
        if (grads_ready) grads_ready(0);
    }
}

float GPT2::forward(const int32_t* tokens, const int32_t* targets, int b, int t, float dloss) {
    LLMC_ASSERT(num_chunks() == 1 && chunks_[0].starts && chunks_[0].ends, "forward() needs the whole model");
    return forward_chunk(0, 0, tokens, targets, b, t, dloss);
}

void GPT2::backward(const std::function<void(size_t)>& grads_ready) {
    LLMC_ASSERT(num_chunks() == 1 && chunks_[0].starts && chunks_[0].ends, "backward() needs the whole model");
    backward_chunk(0, 0, grads_ready);
}

int GPT2::get_logits_slice(int b, int t, float* host_row, int* vocab_begin) const {
    const Chunk& ch = chunks_.back();
    LLMC_ASSERT(ch.ends, "logits live on the last pipeline stage");
    const SlotActs& sa = ch.slots[0];
    LLMC_ASSERT(!sa.have_dlogits, "logits were overwritten by their gradient");
    LLMC_ASSERT(b < sa.b && t < sa.t, "get_logits: row outside the last forward");
    const int Vl = shape.padded_vocab / tp_size(), v0 = vocab_begin_of(shape, layout);
    const int n = std::max(0, std::min(Vl, shape.vocab_size - v0));
    std::vector<float> row(static_cast<size_t>(Vl));
    ops.to_host_f32(row.data(), sa.logits.slice((size_t(b) * sa.t + t) * Vl, size_t(Vl)));
    std::memcpy(host_row, row.data(), size_t(n) * sizeof(float));
    *vocab_begin = v0;
    return n;
}

void GPT2::get_logits(int b, int t, float* host_row) const {
    LLMC_ASSERT(tp_size() == 1, "get_logits needs the whole vocabulary (tp 1)");
    int v0 = 0;
    get_logits_slice(b, t, host_row, &v0);
}
