#include "llmc/model/model.h"
#include "llmc/model/model_acts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/comm/comm.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/model/moe.h"
#include "llmc/core/rng.h"
#include "llmc/parallel/tensor_parallel.h"

// ---------------------------------------------------------------------------------
// activations: one allocation, carved into views

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

// One kept tensor of activation offload in host memory: the residual stream's rows this rank holds
// of a B x T micro-batch, 256-byte aligned like the device's pieces.
static size_t kept_bytes(const ModelShape& s, DType dt, int B, int T, const ModelLayout& lay) {
    const size_t N = size_t(B) * T, nl = lay.sequence_parallel && lay.tp > 1 ? N / size_t(lay.tp) : N;
    return (nl * size_t(s.d_model) * dtype_size(dt) + 255) / 256 * 256;
}

Model::Block Model::block_of(Arch a) {
    if (a == Arch::Llama) return Block{false, false, false, true, true, QW, VW};
    return Block{true, true, true, false, false, QkvW, QkvW};
}

int Model::tp_size() const { return layout.tp; }

Recompute parse_recompute(const std::string& name) {
    if (name == "selective") return Recompute::Selective;
    if (name == "full") return Recompute::Full;
    LLMC_ASSERT(name == "none", strfmt("unknown recompute mode \"%s\"", name.c_str()));
    return Recompute::None;
}

Model::Model(const ModelShape& s, Ops& o, DType dt, int b, int t, ParamStore& store, const ModelLayout& lay,
           TensorParallel* tp, std::vector<int> slots, Recompute rc, ContextParallel* cp, Comm* ep, bool offload,
           bool fp8)
    : shape(s), ops(o), dtype(dt), B(b), T(t), layout(lay), recompute(rc), offload_activations(offload), fp8_acts(fp8),
      params(store.layout()),
      block_(block_of(s.arch)), tp_(tp), store_(store), cp_(cp), ep_(ep), ep_stage_(o, ep) {
    if (!tp_) {
        own_tp_.reset(new TensorParallel(ops, nullptr, false));
        tp_ = own_tp_.get();
    }
    if (!cp_) {
        own_cp_.reset(new ContextParallel(ops, nullptr));
        cp_ = own_cp_.get();
    }
    LLMC_ASSERT(lay.cp == cp_->size(), "layout and CP group disagree");
    LLMC_ASSERT(lay.ep == (ep_ ? ep_->size() : 1) && (!ep_ || lay.ep_rank == ep_->rank()), "layout and EP group disagree");
    LLMC_ASSERT(s.d_model % s.n_head == 0, "d_model must divide by n_head");
    LLMC_ASSERT(s.padded_vocab >= s.vocab_size, "padded vocab too small");
    LLMC_ASSERT(lay.tp == tp_->size() && lay.tp_rank == tp_->rank(), "layout and TP group disagree");
    LLMC_ASSERT(!lay.sequence_parallel || lay.tp == 1 || tp_->sequence_parallel(), "SP flag mismatch");
    check_model_layout(s, lay, t * lay.cp);
    size_t local = 0;
    LLMC_ASSERT(param_table(s, lay, &local).size() == params.specs.size() && local == params.num_params,
                "the store's parameter layout is not this shape's under this layout");
    lookup_.assign(size_t(NUM_ROLES) * (s.n_layer + 1) * size_t(s.moe.num_experts + 1), -1);
    for (size_t i = 0; i < params.specs.size(); i++) {
        const ParamSpec& p = params.specs[i];
        if (!p.tied_copy) lookup_[lookup_index(p.role, p.layer, p.expert)] = int(i);
    }

    // units: the embedding, each layer, the head; consecutive in memory
    const std::vector<ParamUnit>& units = params.units;
    layer_unit_.assign(size_t(s.n_layer), -1);
    for (size_t u = 0; u < units.size(); u++) {
        if (units[u].kind == ParamUnit::Layer) layer_unit_[size_t(units[u].layer)] = int(u);
        if (units[u].kind == ParamUnit::Embedding) embed_unit_ = int(u);
        if (units[u].kind == ParamUnit::Head) head_unit_ = int(u);
    }
    unit_params_.resize(units.size());
    unit_grads_.resize(units.size());
    param_refs_.assign(units.size(), 0);
    grad_refs_.assign(units.size(), 0);

    chunks_ = make_chunks(s, lay, std::move(slots));
    scratch_ = new Scratch();
    activation_bytes =
        carve_activations(nullptr, s, dt, b, t, lay, lay.sequence_parallel, rc, offload, fp8, chunks_, *scratch_);
    act_mem_ = ops.alloc(activation_bytes);
    carve_activations(static_cast<char*>(act_mem_), s, dt, b, t, lay, lay.sequence_parallel, rc, offload, fp8, chunks_,
                      *scratch_);
    // expert parallelism: the routed rows' message buffer (ep_dispatch, ep_return: one at a time),
    // sized for the most rows this rank's experts can receive, so that it never grows mid-step
    if (s.moe.enabled() && lay.ep > 1)
        ep_stage_.reserve(Tensor(nullptr, moe_ep_max_rows(s.moe, b * t, lay.ep, lay.cp) * size_t(s.d_model), dt));
    if (offload) {  // each slot's layer inputs, one after another (activation_host_bytes_of's sizes)
        std::vector<int> counts;
        for (const Chunk& ch : chunks_) {
            LLMC_ASSERT(ch.begin < ch.end, "activation offload: a chunk without layers");  // (its input would be staged)
            counts.push_back(int(ch.slots.size()));
        }
        activation_host_bytes = activation_host_bytes_of(s, dt, b, t, lay, counts);
        act_host_mem_ = ops.alloc_host(activation_host_bytes);
        const size_t each = kept_bytes(s, dt, b, t, lay);
        char* at = static_cast<char*>(act_host_mem_);
        for (Chunk& ch : chunks_)
            for (SlotActs& sa : ch.slots)
                for (int i = ch.begin; i < ch.end; i++, at += each) sa.kept.push_back(at);
    }
}

std::vector<Model::Chunk> Model::make_chunks(const ModelShape& s, const ModelLayout& lay, std::vector<int> slots) {
    const auto ranges = lay.chunks.empty() ? std::vector<std::pair<int, int>>{{0, s.n_layer}} : lay.chunks;
    if (slots.empty()) slots.assign(ranges.size(), 1);
    LLMC_ASSERT(slots.size() == ranges.size(), "one slot count per chunk");
    std::vector<Chunk> chunks;
    for (size_t c = 0; c < ranges.size(); c++) {
        Chunk ch;
        ch.begin = ranges[c].first;
        ch.end = ranges[c].second;
        ch.starts = lay.first && c == 0;
        ch.ends = lay.last && c + 1 == ranges.size();
        ch.slots.resize(size_t(std::max(1, slots[c])));
        chunks.push_back(ch);
    }
    return chunks;
}

size_t Model::activation_bytes_of(const ModelShape& s, DType dt, int b, int t, const ModelLayout& lay,
                                  const std::vector<int>& slots, Recompute rc, bool offload, bool fp8) {
    // A slot's buffers take the same bytes wherever they fall (every take starts 256-aligned), so the
    // total is affine in each chunk's slot count: carved with one slot per chunk, and once more with
    // two for each chunk that holds more, it is known for any count without building the slots
    // (the planner asks for layouts with thousands of micro-batches in flight)
    std::vector<int> ones(slots.empty() ? 1 : slots.size(), 1);
    const auto carved = [&](const std::vector<int>& sl) {
        std::vector<Chunk> chunks = make_chunks(s, lay, sl);
        Scratch scratch;
        return carve_activations(nullptr, s, dt, b, t, lay, lay.sequence_parallel, rc, offload, fp8, chunks, scratch);
    };
    const size_t one = carved(ones);
    size_t total = one;
    for (size_t c = 0; c < slots.size(); c++) {
        if (slots[c] <= 1) continue;
        std::vector<int> two = ones;
        two[c] = 2;
        total += size_t(slots[c] - 1) * (carved(two) - one);
    }
    return total;
}

size_t Model::activation_host_bytes_of(const ModelShape& s, DType dt, int b, int t, const ModelLayout& lay,
                                       const std::vector<int>& slots) {
    // (chunks of one slot: the planner's counts of micro-batches in flight may be huge)
    const std::vector<Chunk> chunks = make_chunks(s, lay, std::vector<int>(slots.size(), 1));
    size_t n = 0;
    for (size_t c = 0; c < chunks.size(); c++)
        n += size_t(std::max(1, slots.empty() ? 1 : slots[c])) * size_t(chunks[c].end - chunks[c].begin);
    return n * kept_bytes(s, dt, b, t, lay);
}

size_t Model::carve_activations(char* base, const ModelShape& shape, DType dt, int B, int T, const ModelLayout& layout,
                                bool sp, Recompute rc, bool offload, bool fp8, std::vector<Chunk>& chunks, Scratch& S) {
    const Block block = block_of(shape.arch);
    const size_t tpn = size_t(layout.tp);
    const size_t N = size_t(B) * T, C = shape.d_model, NHl = shape.n_head / tpn, Cl = C / tpn;
    const size_t QKVl = size_t(shape.n_head + 2 * shape.kv_heads()) * shape.head_dim() / tpn;
    const size_t Fl = size_t(shape.ffn()) / tpn, PREl = block.swiglu ? 2 * Fl : Fl;  // the MLP's hidden width
    const size_t Vl = size_t(shape.vocab_shard(tpn)), nl = sp && tpn > 1 ? N / tpn : N;
    const bool mean = block.layernorm;  // RMSNorm keeps no mean
    const MoeShape& moe = shape.moe;
    const size_t NK = N * size_t(moe.top_k), E = size_t(moe.num_experts), Fe = size_t(moe.expert_ffn_dim) / tpn;
    const size_t PREe = block.swiglu ? 2 * Fe : Fe;
    // the experts' rows: this rank's pairs, or under expert parallelism the rows its experts receive
    const size_t R = moe.enabled() ? moe_ep_max_rows(moe, int(N), layout.ep, layout.cp) : 0;
    Carver cv{base};
    // fp8 with a GELU MLP: no GELU output per layer (one for the forwards the fp8 GEMM cannot take)
    const bool gelu_in_cast = fp8 && !block.swiglu;
    // A layer's buffers; with core = false the attention core's and the activation's outputs are
    // left as they are (the shared ones of Selective). An MoE layer's MLP buffers hold its
    // permuted rows, all kept (Selective recomputes only its attention core). Full recompute's
    // shared set serves dense and MoE layers (dense_mlp and moe_mlp: the larger of each buffer).
    auto carve_layer = [&](LayerActs& L, bool core, bool dense_mlp, bool moe_mlp) {
        L.ln1 = cv.take(nl * C, dt);
        L.ln1_mean = mean ? cv.take_f32(nl) : nullptr;
        L.ln1_rstd = cv.take_f32(nl);
        L.qkv = cv.take(N * QKVl, dt);
        if (core) L.atty = cv.take(N * Cl, dt);
        if (core) L.att_lse = cv.take_f32(N * NHl);
        L.residual2 = cv.take(nl * C, dt);
        L.ln2 = cv.take(nl * C, dt);
        L.ln2_mean = mean ? cv.take_f32(nl) : nullptr;
        L.ln2_rstd = cv.take_f32(nl);
        size_t pre = dense_mlp ? N * PREl : 0, act = dense_mlp && core && !gelu_in_cast ? N * Fl : 0;
        if (moe_mlp) {
            L.router_logits = cv.take(N * E, dt);
            L.probs = cv.take_f32(N * E);
            L.gate = cv.take_f32(NK);
            L.expert = static_cast<int32_t*>(cv.take(NK, DType::F32).ptr);  // int32
            L.row_of = static_cast<int32_t*>(cv.take(NK, DType::F32).ptr);
            L.xperm = cv.take(R * C, dt);
            L.yperm = cv.take(NK * C, dt);
            pre = std::max(pre, R * PREe);
            act = std::max(act, R * Fe);
        }
        L.fch_pre = cv.take(pre, dt);
        if (act) L.fch_gelu = cv.take(act, dt);
        L.residual3 = cv.take(nl * C, dt);
        if (fp8) {  // the linears' Fp8Stash: their inputs' codes (bytes), then the four 1/s 16 bytes apart
            auto codes = [&](size_t cols) { return cv.take((N * cols + 3) / 4, DType::F32).ptr; };
            L.fp8[int(Fp8Linear::Qkv)].qT = codes(C);
            L.fp8[int(Fp8Linear::AttnProj)].qT = codes(Cl);
            if (dense_mlp) {
                L.fp8[int(Fp8Linear::Fc)].qT = codes(C);
                L.fp8[int(Fp8Linear::FcProj)].qT = codes(Fl);
            }
            float* inv = cv.take_f32(16);
            for (int i = 0; i < 4; i++) L.fp8[i].inv = inv ? inv + 4 * i : nullptr;
        }
    };
    LayerActs& shared = S.recomputed;
    if (rc == Recompute::Full) carve_layer(shared, true, true, moe.enabled());
    LLMC_ASSERT(!offload || rc == Recompute::Full, "activation offload needs full recompute");
    if (offload)
        for (Tensor& st : S.staging) st = cv.take(nl * C, dt);
    if (rc == Recompute::Selective) {
        shared.atty = cv.take(N * Cl, dt);
        shared.att_lse = cv.take_f32(N * NHl);
        shared.fch_gelu = cv.take(N * Fl, dt);
    } else if (gelu_in_cast) {
        S.gelu_out = cv.take(N * Fl, dt);
    }
    for (Chunk& ch : chunks) {
        for (SlotActs& sa : ch.slots) {
            sa.input = offload ? S.staging[0] : cv.take(nl * C, dt);
            sa.layers.assign(size_t(ch.end - ch.begin), shared);
            for (size_t i = 0; i < sa.layers.size(); i++) {
                LayerActs& L = sa.layers[i];
                const bool head_input = ch.ends && i + 1 == sa.layers.size();  // (the slot's own with offload)
                if (offload && !head_input) L.residual3 = S.staging[(i + 1) % 2];  // the next layer's input
                else if (rc == Recompute::Full) L.residual3 = cv.take(nl * C, dt);
                else carve_layer(L, rc == Recompute::None, !moe.is_moe_layer(ch.begin + int(i)),
                                 moe.is_moe_layer(ch.begin + int(i)));
            }
            if (ch.ends) {
                sa.lnf = cv.take(nl * C, dt);
                sa.lnf_mean = mean ? cv.take_f32(nl) : nullptr;
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
    S.dqkv = cv.take(N * QKVl, dt);
    S.datty = cv.take(N * Cl, dt);
    S.dfch = cv.take(std::max(N * Fl, R * Fe), dt);
    if (block.swiglu) S.dpre = cv.take(std::max(N * PREl, R * PREe), dt);
    if (moe.enabled()) {
        S.dperm = cv.take(NK * C, dt);
        if (layout.ep > 1) S.erows = cv.take(std::max(NK, R) * C, dt);
        S.drouter = cv.take(N * E, dt);
        S.dgate = cv.take_f32(NK);
        S.daux = cv.take_f32(E);
    }
    S.ln_grads = cv.take(2 * C, dt);
    S.stats = cv.take_f32(3 * N);
    if (layout.cp > 1) {
        for (int i = 0; i < 2; i++) S.ring.kv[i] = cv.take(N * QKVl, dt);
        for (int i = 0; i < 2; i++) S.ring.dkv[i] = cv.take(N * QKVl, dt);
        S.ring.blk_out = cv.take(N * Cl, dt);
        S.ring.blk_lse = cv.take_f32(N * NHl);
        if (block.learned_positions) {
            S.wpe = cv.take(size_t(T) * C, dt);
            S.dwpe = cv.take(size_t(T) * C, dt);
        }
    }
    return cv.used;
}

size_t Model::activation_bytes_without_sp() const {
    std::vector<Chunk> chunks = chunks_;
    Scratch s;
    return carve_activations(nullptr, shape, dtype, B, T, layout, false, recompute, offload_activations, fp8_acts,
                             chunks, s);
}

size_t Model::activation_bytes_without_cp() const {
    std::vector<Chunk> chunks = chunks_;
    ModelLayout whole = layout;
    whole.cp = 1;
    Scratch s;
    return carve_activations(nullptr, shape, dtype, B, T * layout.cp, whole, layout.sequence_parallel, recompute,
                             offload_activations, fp8_acts, chunks, s);
}

Model::~Model() {
    ops.release_host(act_host_mem_);  // (CUDA: after the copies in flight)
    ops.release(act_mem_);
    delete scratch_;
}

size_t Model::lookup_index(Role r, int layer, int expert) const {
    return (size_t(r) * (shape.n_layer + 1) + size_t(layer + 1)) * size_t(shape.moe.num_experts + 1) + size_t(expert + 1);
}

bool Model::holds(Role r, int layer, int expert) const {
    if (layer < -1 || layer >= shape.n_layer || expert < -1 || expert >= shape.moe.num_experts) return false;
    return lookup_[lookup_index(r, layer, expert)] >= 0;
}

const ParamSpec& Model::spec(Role r, int layer, int expert) const {
    LLMC_ASSERT(holds(r, layer, expert), strfmt("parameter of role %d (layer %d, expert %d) is not held by this rank",
                                                int(r), layer, expert));
    return params.specs[size_t(lookup_[lookup_index(r, layer, expert)])];
}

const ParamSpec& Model::head_weight_spec() const {
    if (!tied_head()) return spec(HeadW);
    if (layout.first) return spec(TokEmb);
    LLMC_ASSERT(layout.last && params.specs.back().tied_copy, "this rank holds no token embedding");
    return params.specs.back();  // the last stage's copy comes last
}

Tensor Model::param(Role r, int layer, int expert) const { return param_of(spec(r, layer, expert)); }
Tensor Model::grad(Role r, int layer, int expert) const { return grad_of(spec(r, layer, expert)); }

// The tensors first..last of a layer are adjacent in memory (declared so): one view over them.
static Tensor span_of(const Model& m, Tensor first, const ParamSpec& a, const ParamSpec& b) {
    LLMC_ASSERT(a.offset <= b.offset, "param_span: roles out of memory order");
    return Tensor(first.ptr, b.offset + b.numel - a.offset, first.dtype);
}
Tensor Model::param_span(Role first, Role last, int layer, int expert) const {
    return span_of(*this, param(first, layer, expert), spec(first, layer, expert), spec(last, layer, expert));
}
Tensor Model::grad_span(Role first, Role last, int layer, int expert) const {
    return span_of(*this, grad(first, layer, expert), spec(first, layer, expert), spec(last, layer, expert));
}

Tensor Model::param_of(const ParamSpec& p) const {
    const int u = params.unit_of(p);
    const Tensor& base = unit_params_[size_t(u)];
    LLMC_ASSERT(base.ptr, strfmt("parameters of %s used outside acquire_params", p.name.c_str()));
    return base.slice(p.offset - params.units[size_t(u)].begin, p.numel);
}

Tensor Model::grad_of(const ParamSpec& p) const {
    const int u = params.unit_of(p);
    const Tensor& base = unit_grads_[size_t(u)];
    LLMC_ASSERT(base.ptr, strfmt("gradients of %s used outside acquire_grads", p.name.c_str()));
    return base.slice(p.offset - params.units[size_t(u)].begin, p.numel);
}

// Reference counts: a unit acquired twice (the head's wte when it sits in the head unit) is
// released by the second release. One pair for parameters and gradients: the store's calls
// are picked by `grads`.
void Model::acquire_unit(int u, bool grads) {
    int& refs = (grads ? grad_refs_ : param_refs_)[size_t(u)];
    if (refs++ > 0) return;
    (grads ? unit_grads_ : unit_params_)[size_t(u)] = grads ? store_.acquire_grads(u) : store_.acquire_params(u);
}

void Model::release_unit(int u, bool grads) {
    int& refs = (grads ? grad_refs_ : param_refs_)[size_t(u)];
    LLMC_ASSERT(refs > 0, "a unit released more often than acquired");
    if (--refs > 0) return;
    (grads ? unit_grads_ : unit_params_)[size_t(u)] = Tensor();
    if (grads) store_.release_grads(u);
    else store_.release_params(u);
}

void Model::prefetch_params(int u) {
    if (u >= 0 && param_refs_[size_t(u)] == 0) store_.prefetch_params(u);
}

void Model::load_params_mem(const float* mem) { store_.load_params(mem); }

// The tied weight's gradient, for the pipeline's sum over the first and the last stage (under
// ZeRO-2/3 before the DP reduce-scatter: the store keeps the wte's unit whole for the step).
void Model::update_head_weight_grad(const std::function<void(Tensor)>& f) {
    const ParamSpec& w = head_weight_spec();
    acquire_grads(params.unit_of(w));
    f(grad_of(w));
    release_grads(params.unit_of(w));
}

// ---------------------------------------------------------------------------------
// host I/O in llm.c order

std::vector<float> Model::from_file_order(const float* whole) const {
    return from_file_order([whole](size_t first, size_t n, float* out) {
        std::memcpy(out, whole + first, n * sizeof(float));
    });
}
std::vector<float> Model::from_file_order(const ReadFileOrder& read) const {
    std::vector<std::pair<size_t, size_t>> all;
    if (params.padded_params > 0) all.push_back({0, params.padded_params});
    return pick_file_order(params, read, all);
}
std::vector<float> Model::from_file_order(const ReadFileOrder& read,
                                          const std::vector<std::pair<size_t, size_t>>& runs) const {
    return pick_file_order(params, read, runs);
}

std::vector<float> Model::to_file_order(const std::vector<float>& mem) const {
    LLMC_ASSERT(mem.size() == params.padded_params, "to_file_order needs this rank's whole buffer in memory order");
    LLMC_ASSERT(params.num_params == params.total_params, "to_file_order needs a layout that holds the whole model");
    std::vector<float> out(params.total_params);
    for (const ParamSpec& p : params.specs)
        for_each_run(p, [&](size_t local, size_t dst, size_t n) {
            std::memcpy(&out[dst], &mem[p.offset + local], n * sizeof(float));
        });
    return out;
}

void Model::set_params_whole(const float* host) { load_params_mem(from_file_order(host).data()); }
void Model::set_params_whole(const ReadFileOrder& read) {
    const std::pair<size_t, size_t> held = store_.params_held();
    std::vector<std::pair<size_t, size_t>> runs;
    if (held.second > held.first) runs.push_back(held);
    store_.load_params_held(from_file_order(read, runs).data());
}

void Model::units_to_whole(bool grads, float* host) {
    std::vector<float> mem(params.padded_params);
    for (size_t u = 0; u < params.units.size(); u++) {
        acquire_unit(int(u), grads);
        ops.to_host_f32(mem.data() + params.units[u].begin, (grads ? unit_grads_ : unit_params_)[u]);
        release_unit(int(u), grads);
    }
    std::vector<float> out = to_file_order(mem);
    std::memcpy(host, out.data(), out.size() * sizeof(float));
}

void Model::get_params_whole(float* host) { units_to_whole(false, host); }
void Model::get_grads_whole(float* host) { units_to_whole(true, host); }

// The random stream of a tensor: its index in the one-process memory order (the embedding's
// tensors, then each layer's, then the head's); the tied copy draws its original's stream.
static uint64_t init_stream(const std::vector<TensorDecl>& decls, const ParamSpec& p, int n_layer) {
    size_t before = 0, per_layer = 0, within = 0;
    for (size_t i = 0; i < decls.size(); i++) per_layer += decls[i].part == ModelPart::Layer;
    const ModelPart part = decls[size_t(p.decl)].part;
    for (size_t i = 0; i < size_t(p.decl); i++) within += decls[i].part == part;
    for (size_t i = 0; i < decls.size(); i++) {
        if (part == ModelPart::Embedding) break;
        before += decls[i].part == ModelPart::Embedding;
    }
    if (part == ModelPart::Head) before += per_layer * size_t(n_layer);
    if (part == ModelPart::Layer) before += per_layer * size_t(p.layer);
    // an expert's tensors: streams of their own, past every other tensor's
    return uint64_t(before + within) + (p.expert >= 0 ? (uint64_t(p.expert) + 1) << 32 : 0);
}

void Model::init_random(uint64_t seed) {
    // Each tensor is drawn whole from streams named by its identity, then this rank keeps its
    // pieces: every layout starts from the same model.
    // (the buffers' pages first touched by every thread: zeroed_floats, the draws, parallel_copy)
    const std::vector<TensorDecl> decls = model_tensors(shape);
    std::unique_ptr<float[]> mem = zeroed_floats(params.padded_params);
    size_t largest = 0;
    for (const ParamSpec& p : params.specs)
        largest = std::max(largest, decls[size_t(p.decl)].rows * decls[size_t(p.decl)].cols);
    std::unique_ptr<float[]> whole_buf(new float[largest]);
    float* whole = whole_buf.get();
    const size_t chunk = 1 << 20;
    for (const ParamSpec& p : params.specs) {
        const TensorDecl& d = decls[size_t(p.decl)];
        const size_t n = d.init_rows * d.cols;  // rows past init_rows (vocabulary padding) stay 0
        std::fill(whole + n, whole + d.rows * d.cols, 0.0f);
        if (d.init_std > 0.0f) {
            const uint64_t stream = init_stream(decls, p, shape.n_layer);
            // each chunk has its own stream: the result does not depend on the thread count
            const long nchunks = long((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
            for (long c = 0; c < nchunks; c++) {
                Rng rng(seed, stream * 1000003ull + uint64_t(c));
                const size_t end = std::min(n, size_t(c + 1) * chunk);
                for (size_t i = size_t(c) * chunk; i < end; i++) whole[i] = d.init_std * rng.normal();
            }
        } else {
            std::fill(whole, whole + n, d.init_value);
        }
        for_each_run(p, [&](size_t local, size_t src, size_t cnt) {
            parallel_copy(&mem[p.offset + local], &whole[src - p.file_offset], cnt * sizeof(float));
        });
    }
    load_params_mem(mem.get());
}

void Model::zero_grads() { store_.zero_grads(); }

// ---------------------------------------------------------------------------------
// forward / backward
//
// Shapes per rank: N = b*t tokens; nl = N (or N/tp with sequence parallelism) rows of the
// residual stream; column-parallel outputs are N x (width/tp); row-parallel outputs N x C
// partial sums until the TP reduction (all-reduce, or reduce-scatter to nl rows with SP).
// With tp == 1 every TP call is a no-op and this is plain GPT-2.

size_t Model::local_rows(int b, int t) const {
    const size_t N = size_t(b) * t;
    if (!layout.sequence_parallel || layout.tp == 1) return N;
    LLMC_ASSERT(N % size_t(layout.tp) == 0, "sequence parallelism needs b*t divisible by tp");
    return N / size_t(layout.tp);
}

Tensor Model::chunk_input(int c, int slot, int b, int t) const {
    return chunks_[size_t(c)].slots[size_t(slot)].input.slice(0, local_rows(b, t) * shape.d_model);
}

Tensor Model::chunk_output(int c, int slot, int b, int t) const {
    const SlotActs& s = chunks_[size_t(c)].slots[size_t(slot)];
    return s.layers.back().residual3.slice(0, local_rows(b, t) * shape.d_model);
}

Tensor Model::residual_grad(int b, int t) const {
    return scratch_->dresidual.slice(0, local_rows(b, t) * shape.d_model);
}

// The linears of a block. In fp8 the forward records the amaxes of the input and the weight,
// and writes the input's transposed cast into the layer's Fp8Stash (L.fp8, where the model was
// built for fp8 and the backend keeps one: CUDA); the backward records the output gradient's and
// reads that stash, or casts the input again (the CPU), and casts the weight again, all with the
// forward's scales and recording nothing (same tensors: their amaxes are already in).
void Model::linear_forward(int l, const LayerActs& L, Fp8Linear lin, Tensor out, Tensor pre_gelu, Tensor inp, Tensor w,
                           Tensor bias, int N, int IC, int OC, bool gelu, bool inp_gelu) {
    // A forward-only pass with a row count the fp8 GEMM cannot take (sampling's short windows
    // on CUDA; training shapes are checked at start-up) runs this linear in the model's dtype.
    if (!fp8_linear(N)) {
        LLMC_ASSERT(!inp_gelu, "linear_forward: the GELU in the input's cast is fp8's");
        ops.matmul_forward(out, pre_gelu, inp, w, bias, N, IC, OC, gelu);
        return;
    }
    Fp8Cast ci = fp8_->cast(l, lin, Fp8Operand::Input, fp8_amax_, fp8_scale_, fp8_inv_);
    ci.gelu = inp_gelu;
    ops.matmul_forward_fp8(out, pre_gelu, inp, w, bias, N, IC, OC, gelu, ci,
                           fp8_->cast(l, lin, Fp8Operand::Weight, fp8_amax_, fp8_scale_, fp8_inv_), L.fp8[int(lin)]);
}

void Model::linear_backward(int l, const LayerActs& L, Fp8Linear lin, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout,
                            Tensor inp, Tensor w, Tensor pre_gelu, int N, int IC, int OC, Tensor dinp_gelu,
                            bool inp_gelu) {
    if (!fp8_) {
        LLMC_ASSERT(!inp_gelu, "linear_backward: the GELU in the input's cast is fp8's");
        ops.matmul_backward(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC, dinp_gelu);
        return;
    }
    LLMC_ASSERT(!dinp_gelu, "linear_backward: fp8 takes the GELU's backward in the next linear (pre_gelu)");
    Fp8Cast ci = fp8_->cast(l, lin, Fp8Operand::Input, nullptr, fp8_scale_, fp8_inv_);
    ci.gelu = inp_gelu;
    ops.matmul_backward_fp8(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC,
                            fp8_->cast(l, lin, Fp8Operand::GradOutput, fp8_amax_, fp8_scale_, fp8_inv_), ci,
                            fp8_->cast(l, lin, Fp8Operand::Weight, nullptr, fp8_scale_, fp8_inv_), L.fp8[int(lin)]);
}

// The family's norm: LayerNorm (weight and bias) or RMSNorm (weight only, fp32 statistics).
void Model::norm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Role w, int layer, int n) {
    if (block_.layernorm)
        ops.layernorm_forward(out, mean, rstd, inp, param(w, layer), param(Role(w + 1), layer), n, shape.d_model);
    else
        ops.rmsnorm_forward(out, rstd, inp, param(w, layer), n, shape.d_model, shape.norm_eps);
}

// Norm backward into the parameter gradients (dinp accumulates); with sequence parallelism each
// rank saw only its tokens, so the weight (and bias) gradients of this micro-batch are summed
// over TP first.
void Model::norm_backward(Tensor dinp, Tensor dout, Tensor inp, Role w, int layer, const float* mean,
                          const float* rstd, int n) {
    const int C = shape.d_model;
    const bool ln = block_.layernorm;
    auto run = [&](Tensor dw, Tensor db) {
        if (ln) ops.layernorm_backward(dinp, dw, db, dout, inp, param(w, layer), mean, rstd, n, C);
        else ops.rmsnorm_backward(dinp, dw, dout, inp, param(w, layer), rstd, n, C);
    };
    TensorParallel& tp = *tp_;
    if (!tp.sequence_parallel()) {
        run(grad(w, layer), ln ? grad(Role(w + 1), layer) : Tensor());
        return;
    }
    Tensor g = scratch_->ln_grads.slice(0, (ln ? 2 : 1) * size_t(C));
    ops.zero(g);
    run(g.slice(0, C), ln ? g.slice(C, C) : Tensor());
    tp.all_reduce(g);
    ops.residual_forward(grad(w, layer), grad(w, layer), g.slice(0, C));
    if (ln) ops.residual_forward(grad(Role(w + 1), layer), grad(Role(w + 1), layer), g.slice(C, C));
}

// One pre-norm transformer block, the same code for every family (Megatron's split):
//   res2 = res + out_proj(attention(rope?(qkv(norm1(res)))))
//   res3 = res2 + down(act(up(norm2(res2))))      act: GELU (GPT-2) or SwiGLU on [gate | up] (Llama)
// qkv and up are column-parallel (the SP gather before them), out_proj and down row-parallel
// (their bias added once, on TP rank 0, before the reduction or the SP reduce-scatter).
float Model::layer_forward(int l, LayerActs& L, Tensor res, int b, int t, float dloss) {
    TensorParallel& tp = *tp_;
    const int tpn = tp_size();
    const int C = shape.d_model, HS = shape.head_dim(), NHl = shape.n_head / tpn, NKVl = shape.kv_heads() / tpn;
    const int Cl = C / tpn, QKVl = (NHl + 2 * NKVl) * HS, Fl = shape.ffn() / tpn;
    const size_t N = size_t(b) * t, nl = local_rows(b, t), nC = N * C;
    const Block& k = block_;
    Scratch& S = *scratch_;
    const bool bias_here = k.biases && tp.rank() == 0;  // a row-parallel bias is added once, before the reduction
    Tensor ln1 = L.ln1.slice(0, nl * C), qkv = L.qkv.slice(0, N * QKVl), atty = L.atty.slice(0, N * Cl);
    Tensor res2 = L.residual2.slice(0, nl * C), ln2 = L.ln2.slice(0, nl * C), res3 = L.residual3.slice(0, nl * C);
    const bool dense_mlp = !shape.moe.is_moe_layer(l);  // an MoE layer's buffers hold its permuted rows
    Tensor pre = dense_mlp ? L.fch_pre.slice(0, N * (k.swiglu ? 2 : 1) * Fl) : Tensor();
    // (fp8 with a GELU MLP keeps no GELU output per layer: S.gelu_out, for a forward whose rows the
    // fp8 GEMM cannot take, read within the layer)
    Tensor act = dense_mlp ? (S.gelu_out.ptr ? S.gelu_out : L.fch_gelu).slice(0, N * Fl) : Tensor();
    Tensor full = S.full.slice(0, nC), partial = S.partial.slice(0, nC), rows = S.rows.slice(0, nl * C);

    norm_forward(ln1, L.ln1_mean, L.ln1_rstd, res, Norm1W, l, int(nl));
    Tensor x = tp.gather_rows(ln1, full);
    linear_forward(l, L, Fp8Linear::Qkv, qkv, Tensor(), x, param_span(k.qkv_first, k.qkv_last, l),
                   k.biases ? param(QkvB, l) : Tensor(), int(N), C, QKVl, false);
    if (k.rope) ops.rope_forward(qkv, b, t, NHl, NKVl, HS, shape.rope_theta, cp_->positions(t));
    cp_->attention_forward(atty, L.att_lse, qkv, b, t, NHl, NKVl, HS, S.ring);
    linear_forward(l, L, Fp8Linear::AttnProj, partial, Tensor(), atty, param(AttnOutW, l),
                   bias_here ? param(AttnOutB, l) : Tensor(), int(N), Cl, C, false);
    Tensor y = tp.reduce_rows(partial, rows);
    if (k.layernorm) {
        ops.fused_residual_layernorm_forward(res2, ln2, L.ln2_mean, L.ln2_rstd, res, y, param(Norm2W, l),
                                             param(Norm2B, l), int(nl), C);
    } else {
        ops.residual_forward(res2, res, y);
        norm_forward(ln2, L.ln2_mean, L.ln2_rstd, res2, Norm2W, l, int(nl));
    }
    x = tp.gather_rows(ln2, full);
    if (shape.moe.is_moe_layer(l)) {  // the experts in place of the MLP, split like it
        const float aux = moe_forward(l, L, partial, x, b, t, dloss);
        y = tp.reduce_rows(partial, rows);
        ops.residual_forward(res3, res2, y);
        return aux;
    }
    // fp8 with a GELU: fc writes the pre-activation alone and fc_proj's input cast applies the
    // GELU (in fp32, no GELU output written and read again)
    const bool gelu_in_cast = !k.swiglu && fp8_linear(int(N));
    if (k.swiglu) {
        linear_forward(l, L, Fp8Linear::Fc, pre, Tensor(), x, param_span(GateW, UpW, l), Tensor(), int(N), C, 2 * Fl,
                       false);
        ops.swiglu_forward(act, pre, int(N), Fl);
    } else if (gelu_in_cast) {
        linear_forward(l, L, Fp8Linear::Fc, pre, Tensor(), x, param(FcW, l), param(FcB, l), int(N), C, Fl, false);
    } else {
        linear_forward(l, L, Fp8Linear::Fc, act, pre, x, param(FcW, l), param(FcB, l), int(N), C, Fl, true);
    }
    linear_forward(l, L, Fp8Linear::FcProj, partial, Tensor(), gelu_in_cast ? pre : act, param(FcOutW, l),
                   bias_here ? param(FcOutB, l) : Tensor(), int(N), Fl, C, false, gelu_in_cast);
    y = tp.reduce_rows(partial, rows);
    ops.residual_forward(res3, res2, y);
    return 0.0f;
}

void Model::layer_backward(int l, LayerActs& L, Tensor res_in, int b, int t) {
    TensorParallel& tp = *tp_;
    const int tpn = tp_size();
    const int C = shape.d_model, HS = shape.head_dim(), NHl = shape.n_head / tpn, NKVl = shape.kv_heads() / tpn;
    const int Cl = C / tpn, QKVl = (NHl + 2 * NKVl) * HS, Fl = shape.ffn() / tpn;
    const size_t N = size_t(b) * t, nl = local_rows(b, t), nC = N * C;
    const Block& k = block_;
    Scratch& S = *scratch_;
    Tensor dres = S.dresidual.slice(0, nl * C), rows = S.rows.slice(0, nl * C);
    Tensor full = S.full.slice(0, nC), full_grad = S.full_grad.slice(0, nC), partial = S.partial.slice(0, nC);
    Tensor dact = S.dfch.slice(0, N * Fl), dqkv = S.dqkv.slice(0, N * QKVl), datty = S.datty.slice(0, N * Cl);
    const bool dense_mlp = !shape.moe.is_moe_layer(l);  // an MoE layer's buffers hold its permuted rows
    Tensor pre = dense_mlp ? L.fch_pre.slice(0, N * (k.swiglu ? 2 : 1) * Fl) : Tensor();
    Tensor act = dense_mlp ? (S.gelu_out.ptr ? S.gelu_out : L.fch_gelu).slice(0, N * Fl) : Tensor();
    LLMC_ASSERT(!(S.gelu_out.ptr && dense_mlp && !k.swiglu && !fp8_linear(int(N))),
                "Model: built for fp8 linears (no GELU output kept per layer), but this backward is not fp8");
    Tensor x = tp.gather_rows(L.ln2.slice(0, nl * C), full);  // SP: gathered again rather than kept
    if (recompute == Recompute::Selective) {  // the attention core and the activation again, into the shared buffers
        cp_->attention_forward(L.atty.slice(0, N * Cl), L.att_lse, L.qkv.slice(0, N * QKVl), b, t, NHl, NKVl, HS,
                               S.ring);
        // (an MoE layer keeps its experts' activations.) The GELU again with its linear: a backend
        // may apply it in the GEMM's epilogue to the unrounded pre-activation (CUDA's cuBLASLt
        // GELU_AUX_BIAS), which no elementwise GELU of the kept pre-activation reproduces bit for
        // bit; the linear run again writes the kept pre-activation again, with the same bits.
        // (fp8 keeps no GELU output: fc_proj's casts apply the GELU to the kept pre-activation)
        if (dense_mlp && k.swiglu) ops.swiglu_forward(act, pre, int(N), Fl);
        else if (dense_mlp && !fp8_linear(int(N)))
            linear_forward(l, L, Fp8Linear::Fc, act, pre, x, param(FcW, l), param(FcB, l), int(N), C, Fl, true);
    }

    // MLP
    Tensor dy = tp.gather_rows(dres, full_grad);
    if (shape.moe.is_moe_layer(l)) {
        moe_backward(l, L, partial, dy, x, int(N));
    } else if (k.swiglu) {
        linear_backward(l, L, Fp8Linear::FcProj, dact, grad(FcOutW, l), Tensor(), dy, act, param(FcOutW, l), Tensor(),
                        int(N), Fl, C);
        Tensor dpre = S.dpre.slice(0, N * 2 * Fl);
        ops.swiglu_backward(dpre, dact, pre, int(N), Fl);
        linear_backward(l, L, Fp8Linear::Fc, partial, grad_span(GateW, UpW, l), Tensor(), dpre, x,
                        param_span(GateW, UpW, l), Tensor(), int(N), C, 2 * Fl);
    } else {  // dact: the pre-activation's gradient, the GELU's backward in fc_proj's dinp GEMM (fp8: in fc's;
              // fp8's fc_proj casts GELU(pre) as its input, as in the forward)
        const bool in_dinp = !fp8_;
        linear_backward(l, L, Fp8Linear::FcProj, dact, grad(FcOutW, l), k.biases ? grad(FcOutB, l) : Tensor(), dy,
                        in_dinp ? act : pre, param(FcOutW, l), Tensor(), int(N), Fl, C, in_dinp ? pre : Tensor(),
                        !in_dinp);
        linear_backward(l, L, Fp8Linear::Fc, partial, grad(FcW, l), grad(FcB, l), dact, x, param(FcW, l),
                        in_dinp ? Tensor() : pre, int(N), C, Fl);
    }
    Tensor dx = tp.reduce_rows(partial, rows);
    norm_backward(dres, dx, L.residual2.slice(0, nl * C), Norm2W, l, L.ln2_mean, L.ln2_rstd, int(nl));
    // attention
    dy = tp.gather_rows(dres, full_grad);
    linear_backward(l, L, Fp8Linear::AttnProj, datty, grad(AttnOutW, l), k.biases ? grad(AttnOutB, l) : Tensor(), dy,
                    L.atty.slice(0, N * Cl), param(AttnOutW, l), Tensor(), int(N), Cl, C);
    cp_->attention_backward(dqkv, datty, L.qkv.slice(0, N * QKVl), L.atty.slice(0, N * Cl), L.att_lse, b, t, NHl,
                            NKVl, HS, S.ring);
    if (k.rope) ops.rope_backward(dqkv, b, t, NHl, NKVl, HS, shape.rope_theta, cp_->positions(t));
    x = tp.gather_rows(L.ln1.slice(0, nl * C), full);
    linear_backward(l, L, Fp8Linear::Qkv, partial, grad_span(k.qkv_first, k.qkv_last, l),
                    k.biases ? grad(QkvB, l) : Tensor(), dqkv, x, param_span(k.qkv_first, k.qkv_last, l), Tensor(),
                    int(N), C, QKVl);
    dx = tp.reduce_rows(partial, rows);
    norm_backward(dres, dx, res_in, Norm1W, l, L.ln1_mean, L.ln1_rstd, int(nl));
}

namespace {
int vocab_begin_of(const ModelShape& s, const ModelLayout& L) { return L.tp_rank * s.vocab_shard(L.tp); }
}  // namespace

float Model::head_forward(SlotActs& sa, Tensor res, const int32_t* targets, int b, int t, float dloss) {
    TensorParallel& tp = *tp_;
    const int C = shape.d_model, V = shape.vocab_size, Vl = shape.vocab_shard(tp_size());
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    const ParamSpec& w = head_weight_spec();
    const int wu = params.unit_of(w);
    acquire_params(head_unit_);
    acquire_params(wu);
    Tensor lnf = sa.lnf.slice(0, nl * C), logits = sa.logits.slice(0, N * size_t(Vl));
    norm_forward(lnf, sa.lnf_mean, sa.lnf_rstd, res, NormFW, -1, int(nl));
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
    if (defer_) {  // stays on the backend: the trainer reads every forward's losses back at once
        LLMC_ASSERT(defer_used_ + N <= defer_cap_, "deferred losses: more rows than the step's buffer holds");
        ops.copy_f32(defer_ + defer_used_, sa.losses, N);
        defer_used_ += N;
        defer_rows_.push_back(N);
        return 0.0f;
    }
    std::vector<float> losses(N);
    ops.to_host_bytes(losses.data(), sa.losses, N * sizeof(float));
    return deferred_loss(losses.data(), N);
}

void Model::head_backward(SlotActs& sa, Tensor res, int b, int t) {
    TensorParallel& tp = *tp_;
    const int C = shape.d_model, Vl = shape.vocab_shard(tp_size());
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    Scratch& S = *scratch_;
    const ParamSpec& w = head_weight_spec();
    const int wu = params.unit_of(w);
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
    norm_backward(dres, dx, res, NormFW, -1, sa.lnf_mean, sa.lnf_rstd, int(nl));
    release_grads(wu);
    release_grads(head_unit_);
    release_params(wu);
    release_params(head_unit_);
}

// Context parallelism: this rank's t rows of wpe (its two chunks' positions) in one table.
Tensor Model::positions_table(int t) {
    if (cp_->size() == 1) return param(PosEmb);
    const SeqPositions p = cp_->positions(t);
    const size_t C = shape.d_model, half = size_t(t) / 2;
    Tensor wpe = param(PosEmb), rows = scratch_->wpe.slice(0, size_t(t) * C);
    ops.copy(rows.slice(0, half * C), wpe.slice(size_t(p.start0) * C, half * C));
    ops.copy(rows.slice(half * C, half * C), wpe.slice(size_t(p.start1) * C, half * C));
    return rows;
}

// Adds the gradient of this rank's rows of wpe (positions_table) to wpe's gradient.
void Model::scatter_positions_grad(Tensor drows, int t) {
    const SeqPositions p = cp_->positions(t);
    const size_t C = shape.d_model, half = size_t(t) / 2;
    for (int k = 0; k < 2; k++) {
        Tensor g = grad(PosEmb).slice(size_t(k == 0 ? p.start0 : p.start1) * C, half * C);
        ops.residual_forward(g, g, drows.slice(size_t(k) * half * C, half * C));
    }
}

float Model::forward_chunk(int c, int slot, const int32_t* tokens, const int32_t* targets, int b, int t, float dloss) {
    LLMC_ASSERT(b >= 1 && b <= B && t >= 1 && t <= T, "forward: batch larger than the activation buffers");
    TensorParallel& tp = *tp_;
    Chunk& ch = chunks_[size_t(c)];
    SlotActs& sa = ch.slots[size_t(slot)];
    const int C = shape.d_model;
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    sa.b = b;
    sa.t = t;
    sa.dloss = dloss;
    sa.have_dlogits = false;
    // activation offload: the layers' inputs go down as they are written (not in a forward without a backward)
    sa.offloaded = offload_activations && dloss != 0.0f;
    const size_t kept = nl * C * dtype_size(dtype);
    Tensor res = sa.input.slice(0, nl * C);
    if (ch.starts) {  // vocabulary-parallel embedding: each rank looks up its rows, the TP group sums
        LLMC_ASSERT(tokens, "the first chunk needs tokens");
        ops.from_host_bytes(sa.tokens, tokens, N * sizeof(int32_t));
        const int v0 = vocab_begin_of(shape, layout);
        if (ch.begin < ch.end) prefetch_params(layer_unit_[size_t(ch.begin)]);  // arrives during the lookup
        acquire_params(embed_unit_);
        Tensor wpe = block_.learned_positions && tp.rank() == 0 ? positions_table(t) : Tensor();
        if (tp.sequence_parallel()) {
            Tensor partial = scratch_->partial.slice(0, N * C);
            ops.encoder_forward(partial, sa.tokens, param(TokEmb), wpe, b, t, C, v0);
            tp.reduce_scatter_rows(partial, res);
        } else {
            ops.encoder_forward(res, sa.tokens, param(TokEmb), wpe, b, t, C, v0);
            tp.all_reduce(res);
        }
        release_params(embed_unit_);
    }
    if (sa.offloaded && ch.begin < ch.end) offload_down(sa, 0, kept);
    float aux = 0.0f;  // the MoE layers' load-balancing losses (training forwards only)
    for (int l = ch.begin; l < ch.end; l++) {
        const int i = l - ch.begin;
        LayerActs& L = sa.layers[size_t(i)];
        const int u = layer_unit_[size_t(l)];
        acquire_params(u);
        prefetch_params(l + 1 < ch.end ? layer_unit_[size_t(l + 1)] : ch.ends ? head_unit_ : -1);
        const bool to_staging = offload_activations && !(ch.ends && l + 1 == ch.end);  // (else the head's input)
        if (to_staging) staging_ready((i + 1) % 2);  // its output's buffer: the copy down of layer i - 1's input
        aux += layer_forward(l, L, res, b, t, dloss);
        release_params(u);
        res = L.residual3.slice(0, nl * C);
        if (sa.offloaded && l + 1 < ch.end) offload_down(sa, i + 1, kept);  // during the next layer
    }
    const float loss = ch.ends ? head_forward(sa, res, targets, b, t, dloss) : 0.0f;
    if (offload_activations) staging_ready(0), staging_ready(1);  // the pipeline's to use
    return loss + aux;
}

void Model::backward_chunk(int c, int slot, const std::function<void(size_t)>& grads_ready) {
    TensorParallel& tp = *tp_;
    Chunk& ch = chunks_[size_t(c)];
    SlotActs& sa = ch.slots[size_t(slot)];
    const int b = sa.b, t = sa.t, C = shape.d_model;
    const size_t N = size_t(b) * t, nl = local_rows(b, t);
    auto res_in = [&](int l) {
        return l == ch.begin ? sa.input.slice(0, nl * C) : sa.layers[size_t(l - 1 - ch.begin)].residual3.slice(0, nl * C);
    };
    // activation offload: layer i's input comes up into staging[i % 2] while layer i + 1 (or the
    // head) computes; `ready` makes the device wait for it before its use
    const size_t kept = nl * C * dtype_size(dtype);
    LLMC_ASSERT(!offload_activations || ch.begin == ch.end || sa.offloaded,
                "backward needs a forward with dloss != 0 (activation offload kept nothing)");
    auto up = [&](int i) {
        if (offload_activations && i >= 0) offload_up(sa, i, kept);
    };
    auto ready = [&](int i) {
        if (offload_activations) staging_ready(i % 2);
    };
    up(ch.end - 1 - ch.begin);  // the last layer's input (the head's stays on the device)
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
        up(l - 1 - ch.begin);  // (the buffer layer l + 1's backward read, queued before the copy)
        ready(l - ch.begin);
        // Full recompute: the layer forward again from its kept input, into the shared buffers
        // (its output too: the kept one is the next layer's input, already used)
        if (recompute == Recompute::Full) {
            recomputing_ = true;  // the same routing and gradients; statistics counted once
            layer_forward(l, scratch_->recomputed, res_in(l), b, t, sa.dloss);
            recomputing_ = false;
        }
        layer_backward(l, recompute == Recompute::Full ? scratch_->recomputed : sa.layers[size_t(l - ch.begin)],
                       res_in(l), b, t);
        release_grads(u);
        release_params(u);
        // layer l and everything after it in memory are final (wte still gets the encoder's part)
        if (grads_ready) grads_ready(params.units[size_t(u)].begin);
    }
    if (ch.starts) {
        Tensor dres = scratch_->dresidual.slice(0, nl * C);
        Tensor d = tp.gather_rows(dres, scratch_->full_grad.slice(0, N * C));
        acquire_grads(embed_unit_);
        const bool rows = block_.learned_positions && cp_->size() > 1;  // this rank's rows of wpe, gathered
        Tensor dwpe = !block_.learned_positions ? Tensor() : rows ? scratch_->dwpe.slice(0, size_t(t) * C) : grad(PosEmb);
        if (rows) ops.zero(dwpe);
        ops.encoder_backward(grad(TokEmb), dwpe, d, sa.tokens, b, t, C, vocab_begin_of(shape, layout));
        if (rows) scatter_positions_grad(dwpe, t);
        release_grads(embed_unit_);
        if (grads_ready) grads_ready(0);
    }
    sa.offloaded = false;
}

// ---- activation offload: the copies of the kept tensors and the device's waits for them ----

void Model::staging_ready(int buffer) {
    uint64_t& id = staging_copy_[buffer];
    if (id) ops.order_after_copy(id);
    id = 0;
}

// Layer i's input (staging[i % 2]) down to its host copy; its buffer's next writer waits (staging_ready).
void Model::offload_down(SlotActs& sa, int i, size_t bytes) {
    LLMC_ASSERT(staging_copy_[i % 2] == 0, "activation offload: a staging buffer copied down while in use");
    staging_copy_[i % 2] = ops.copy_to_host_async(sa.kept[size_t(i)], scratch_->staging[i % 2].ptr, bytes);
}

// Layer i's input up into staging[i % 2], after the ops queued so far (the last readers of what it held).
void Model::offload_up(SlotActs& sa, int i, size_t bytes) {
    staging_ready(i % 2);  // a copy down from the same buffer still in flight: first that
    staging_copy_[i % 2] = ops.copy_from_host_async(scratch_->staging[i % 2].ptr, sa.kept[size_t(i)], bytes);
}

float Model::forward(const int32_t* tokens, const int32_t* targets, int b, int t, float dloss) {
    LLMC_ASSERT(num_chunks() == 1 && chunks_[0].starts && chunks_[0].ends, "forward() needs the whole model");
    return forward_chunk(0, 0, tokens, targets, b, t, dloss);
}

void Model::backward(const std::function<void(size_t)>& grads_ready) {
    LLMC_ASSERT(num_chunks() == 1 && chunks_[0].starts && chunks_[0].ends, "backward() needs the whole model");
    backward_chunk(0, 0, grads_ready);
}

int Model::get_logits_slice(int b, int t, float* host_row, int* vocab_begin) const {
    const Chunk& ch = chunks_.back();
    LLMC_ASSERT(ch.ends, "logits live on the last pipeline stage");
    const SlotActs& sa = ch.slots[0];
    LLMC_ASSERT(!sa.have_dlogits, "logits were overwritten by their gradient");
    LLMC_ASSERT(b < sa.b && t < sa.t, "get_logits: row outside the last forward");
    const int Vl = shape.vocab_shard(tp_size()), v0 = vocab_begin_of(shape, layout);
    const int n = std::max(0, std::min(Vl, shape.vocab_size - v0));
    std::vector<float> row(static_cast<size_t>(Vl));
    ops.to_host_f32(row.data(), sa.logits.slice((size_t(b) * sa.t + t) * Vl, size_t(Vl)));
    std::memcpy(host_row, row.data(), size_t(n) * sizeof(float));
    *vocab_begin = v0;
    return n;
}

void Model::get_logits(int b, int t, float* host_row) const {
    LLMC_ASSERT(tp_size() == 1, "get_logits needs the whole vocabulary (tp 1)");
    int v0 = 0;
    get_logits_slice(b, t, host_row, &v0);
}
