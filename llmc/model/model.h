// GPT-2: the parameter table, one allocation per category, and the forward/backward
// of this process's part of the model, written once over Ops (kernels) and TensorParallel
// (the TP group's collectives).
//
// A ModelLayout says which part a process holds. Tensor parallelism (Megatron's split) cuts
// every block: the QKV projection and fc are column-parallel (output rows split, heads stay
// whole), the attention and MLP output projections row-parallel (input columns split, the
// partial outputs summed over TP), the token embedding and LM head vocabulary-parallel (wte
// rows split). LayerNorms, wpe and the row-parallel biases are replicated. With sequence
// parallelism the residual stream and the LayerNorms hold only this rank's 1/tp of the
// tokens, gathered before each column-parallel block and reduce-scattered after each
// row-parallel one. Pipeline parallelism gives a process one or more chunks (consecutive
// layer ranges); the first stage also holds the embedding, the last the final LayerNorm and
// the head (a copy of wte when the first stage is another process: the tied weight). Context
// parallelism (llmc/parallel/context_parallel.h) gives a rank T of each sequence's tokens (two chunks):
// only the attention core (a ring over the CP group) and the positions (wpe rows, RoPE angles at
// the tokens' global indices) know it.
//
// Memory layout of the local parameters: [wte, wpe] [chunk 0's layers] ... [lnf, (wte copy)],
// each layer's tensors contiguous. Every ParamSpec maps its local elements to runs of the
// whole tensor in llm.c's checkpoint order, so checkpoints stay layout-independent. The same
// order cut into units (the embedding, each layer, the head) is what ZeRO-2/3 move at once.
// The buffers live in a ParamStore built before the model (llmc/model/param_store.h): the model
// reaches a tensor only while its unit is acquired from it, whatever the store.
//
// Activations live in slots: a chunk keeps one set per micro-batch in flight (pipeline
// schedules run several forwards before the matching backwards); the backward's scratch
// buffers are shared. Recomputation (train.recompute) keeps fewer of them per layer and
// recomputes the rest in backward into buffers every layer shares; the kernels are
// deterministic, so the recomputed values, and the whole run, are bitwise those of no recompute.
//
// Activation offload (train.offload_activations, with Full recompute): what Full keeps of the
// layers, each layer's input (the residual stream between layers), goes to host memory
// (Ops::alloc_host: pinned on CUDA) per chunk, slot and layer. On the device only two staging
// buffers stay, shared by every slot and chunk: layer i of a chunk reads its input from
// staging[i % 2] and writes its output to the other (the last chunk's last layer into its slot's
// buffer: the head's input stays beside the head's own kept activations, and the backward starts
// on it while the last layer's input comes up). The forward copies each input down
// (Ops::copy_to_host_async) as soon as it is written, while the next layer computes (a forward with
// dloss == 0, which no backward follows, copies nothing); the backward
// copies layer i's input up while layer i + 1 is recomputed and differentiated, so a copy stream
// works beside the compute stream (CUDA; the CPU backend copies at once). The staging buffer's next
// writer waits for its copy on the device (Ops::order_after_copy): the host never waits. Every
// forward_chunk and backward_chunk returns with no copy pending on a staging buffer, so between
// calls chunk_input (staging[0]) and chunk_output are what the pipeline engine expects: a chunk's
// input is valid from its write until forward_chunk, its output until the next call. The copies
// move bytes, so training is bitwise that of Full recompute without offload.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmc/backend/ops.h"
#include "llmc/model/param_store.h"
#include "llmc/model/param_table.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/core/tensor.h"

class TensorParallel;
class ContextParallel;
class Comm;

// Which activations a layer keeps for its backward (train.recompute).
enum class Recompute {
    None,       // everything its backward reads
    Selective,  // all but the attention core's output and statistics and the MLP activation's output
                // (recomputed from the kept QKV; a GELU MLP's activation by its first linear again,
                // GEMM and epilogue, a SwiGLU's from the kept pre-activation)
    Full,       // only its output (the next layer's input): the layer runs forward again in backward
};
// "none" | "selective" | "full" (the config's values; validated there).
Recompute parse_recompute(const std::string& name);

class Model : public PipelineStage {
public:
    // store: where the parameters and gradients live; its layout must be this shape's under
    // `layout` (param_layout). slots: activation sets per chunk (micro-batches in flight; empty =
    // one each). tp: the TP group (null = tp 1). cp: the context-parallel group (null = cp 1); T is
    // then this rank's T / cp tokens of each sequence (llmc/parallel/context_parallel.h: two chunks, at
    // their global positions). ep: the expert-parallel group (layout.ep ranks, a host communicator;
    // null = ep 1): the MoE layers send their routed rows to the experts' owners over it.
    Model(const ModelShape& shape, Ops& ops, DType dtype, int B, int T, ParamStore& store,
          const ModelLayout& layout = ModelLayout(), TensorParallel* tp = nullptr, std::vector<int> slots = {},
          Recompute recompute = Recompute::None, ContextParallel* cp = nullptr, Comm* ep = nullptr,
          bool offload_activations = false, bool fp8 = false);
    // fp8 (the run's linears are fp8: set_fp8 follows before the first step): a GELU MLP keeps no
    // GELU output per layer (fc_proj's casts apply the GELU to the kept pre-activation), only one
    // buffer for a forward whose rows the fp8 GEMM cannot take (sampling's short windows).
    // The bytes of activations such a model allocates (activation_bytes), without building it;
    // offload: activation offload (needs Recompute::Full).
    static size_t activation_bytes_of(const ModelShape& shape, DType dtype, int B, int T, const ModelLayout& layout,
                                      const std::vector<int>& slots, Recompute recompute, bool offload = false,
                                      bool fp8 = false);
    // The host memory of activation offload (activation_host_bytes): per chunk and slot each layer's
    // input, B*T (/ tp with sequence parallelism) rows of d_model, 256-byte aligned. Each crosses
    // twice a step: down in forward, up in backward.
    static size_t activation_host_bytes_of(const ModelShape& shape, DType dtype, int B, int T,
                                           const ModelLayout& layout, const std::vector<int>& slots);
    ~Model() override;
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelShape shape;
    Ops& ops;
    const DType dtype;  // parameters, gradients and activations
    const int B, T;     // the activation buffers' size
    const ModelLayout layout;
    const Recompute recompute;
    const bool offload_activations;
    const bool fp8_acts;  // constructed for fp8 linears (no GELU output kept per layer)

    const ParamLayout& params;  // the store's: this rank's tensors in memory order, its units
    size_t activation_bytes = 0;
    size_t activation_host_bytes = 0;  // activation offload's host memory (0 without)
    size_t activation_bytes_without_sp() const;  // the same layout's activations without sequence parallelism
    size_t activation_bytes_without_cp() const;  // ... without context parallelism (whole sequences, no ring)

    // expert: one expert's tensor of an MoE layer (-1: the layer's own)
    bool holds(Role r, int layer = -1, int expert = -1) const;
    const ParamSpec& spec(Role r, int layer = -1, int expert = -1) const;
    // The LM head's weight on a last stage: the untied head, else the token embedding this rank
    // holds (the embedding's, or on a last stage without it the tied copy, which the pipeline
    // keeps in sync with the first stage's).
    const ParamSpec& head_weight_spec() const;
    bool tied_head() const override { return shape.tie_embeddings; }
    // A tensor's parameters and gradients: they exist while their unit is acquired
    // (forward_chunk and backward_chunk acquire what they use). expert: an MoE layer's expert.
    Tensor param(Role r, int layer = -1, int expert = -1) const;
    Tensor grad(Role r, int layer = -1, int expert = -1) const;
    // Adjacent tensors first..last of a layer as one (Llama's q, k, v and gate, up: one fused linear).
    Tensor param_span(Role first, Role last, int layer, int expert = -1) const;
    Tensor grad_span(Role first, Role last, int layer, int expert = -1) const;
    Tensor param_of(const ParamSpec& p) const;
    Tensor grad_of(const ParamSpec& p) const;
    void acquire_params(int unit) { acquire_unit(unit, false); }
    void release_params(int unit) { release_unit(unit, false); }
    void prefetch_params(int unit);  // unit < 0: nothing
    void acquire_grads(int unit) { acquire_unit(unit, true); }
    void release_grads(int unit) { release_unit(unit, true); }
    // Sets every parameter from this rank's whole buffer (host fp32, memory order, padded_params).
    void load_params_mem(const float* mem);

    // Host fp32 arrays: this rank's memory order (padded_params elements) <-> the whole model
    // in file order (total_params; llm.c's order for GPT-2). from_file_order picks this rank's
    // pieces of a whole model; to_file_order needs a layout that holds everything (one process).
    std::vector<float> from_file_order(const float* whole) const;
    // The same, read in pieces; runs: only those memory positions, packed (pick_file_order).
    std::vector<float> from_file_order(const ReadFileOrder& read) const;
    std::vector<float> from_file_order(const ReadFileOrder& read, const std::vector<std::pair<size_t, size_t>>& runs) const;
    std::vector<float> to_file_order(const std::vector<float>& mem) const;
    void set_params_whole(const float* host);  // whole model, file order
    // The same, read in pieces: only what the store keeps (ZeRO-3: its shard; ParamStore::params_held).
    void set_params_whole(const ReadFileOrder& read);
    // One-process layouts, unit by unit from the store (a WholeStore for the gradients: ZeRO-2/3's
    // acquire_grads starts a unit's gradient afresh).
    void get_params_whole(float* host);
    void get_grads_whole(float* host);
    // Each tensor as its declaration says (llmc/model/families.cpp); every layout draws the same whole model.
    void init_random(uint64_t seed);

    void zero_grads();

    // ---- one chunk, one micro-batch slot (PipelineStage: the pipeline engine's view) ----
    int num_chunks() const override { return int(chunks_.size()); }
    // Rows of the residual stream this rank holds for a b x t batch (b*t/tp with sequence parallelism).
    size_t local_rows(int b, int t) const;
    size_t boundary_numel(int b, int t) const override { return local_rows(b, t) * size_t(shape.d_model); }
    Tensor chunk_input(int chunk, int slot, int b, int t) const override;
    Tensor chunk_output(int chunk, int slot, int b, int t) const override;
    // The gradient buffer of the residual stream (PipelineStage::residual_grad).
    Tensor residual_grad(int b, int t) const override;
    // With dloss != 0 the MoE layers' load-balancing losses (times aux_loss_coef) are added to the
    // returned loss, also on chunks that do not end the model.
    float forward_chunk(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int b, int t,
                        float dloss) override;
    void backward_chunk(int chunk, int slot, const std::function<void(size_t)>& grads_ready = {}) override;
    void update_head_weight_grad(const std::function<void(Tensor)>& f) override;

    // ---- the whole model on this rank (layouts with one chunk that starts and ends it) ----
    float forward(const int32_t* tokens, const int32_t* targets, int b, int t, float dloss);
    void backward(const std::function<void(size_t)>& grads_ready = {});
    // This rank's slice of row (b, t) of the last forward's logits in slot 0 of the last chunk:
    // the real vocabulary columns [*vocab_begin, *vocab_begin + returned count). Valid only after
    // a forward with dloss == 0.
    int get_logits_slice(int b, int t, float* host_row, int* vocab_begin) const;
    // All vocab_size logits of row (b, t) (tp == 1).
    void get_logits(int b, int t, float* host_row) const;
    // Forwards with dloss == 0 (sampling): the tokens of each sequence that count (0 = all). A
    // window padded at its end to the split of sequence or context parallelism holds padding
    // past them, which MoE layers leave out of capacity (one process runs the window unpadded).
    void set_valid_tokens(int n) { valid_tokens_ = n; }

    // ---- FP8 linear layers (precision "fp8"; llmc/precision/fp8.h) ----
    // With a state, the four linears of every block (QKV, attention projection, fc, fc
    // projection) run through Ops::matmul_forward_fp8 / matmul_backward_fp8 with the state's
    // casts, on this rank's TP shards; the embedding, attention core, LayerNorms and head keep
    // the model's dtype. amax: backend memory of state->size() floats, indexed by global layer,
    // where the casts record this step's amaxes (each pipeline stage and TP shard fills its
    // part; the trainer zeroes it per step and max-reduces it over the world). The caller owns
    // both; nullptr turns fp8 off.
    // ---- mixture of experts (model.moe; llmc/model/moe.h) ----
    // What the MoE layers saw in the forwards with dloss != 0 since the last take_moe_stats():
    // the sum of their load-balancing losses (without aux_loss_coef; one per layer and
    // micro-batch), the smallest and largest fraction of (token, slot) pairs routed to one expert,
    // and the pairs dropped past capacity. The loss forward_chunk returns with dloss != 0
    // includes aux_loss_coef times this chunk's load-balancing losses.
    struct MoeStats {
        double aux_sum = 0.0;
        int aux_terms = 0;  // layers x micro-batches
        double load_min = 1.0, load_max = 0.0;
        long long dropped = 0, pairs = 0;
    };
    MoeStats take_moe_stats() {
        MoeStats s = moe_stats_;
        moe_stats_ = MoeStats();
        return s;
    }

    // ---- losses kept on the backend (the training step's single read back) ----
    // While dst is set (backend memory, capacity floats), the forwards with targets copy their
    // per-token losses there, one after another, instead of reading them back, and return 0 for
    // them (the MoE load-balancing part as before). take_deferred_rows() lists the rows of each
    // such forward in call order and starts again at dst; the caller reads the losses back and
    // forms the mean of each forward as the model would have: deferred_loss. dst null: off.
    void defer_losses(float* dst, size_t capacity) {
        defer_ = dst;
        defer_cap_ = capacity;
        defer_rows_.clear();
        defer_used_ = 0;
    }
    std::vector<size_t> take_deferred_rows() {
        std::vector<size_t> r = std::move(defer_rows_);
        defer_rows_.clear();
        defer_used_ = 0;
        return r;
    }
    // The mean loss of one forward from its rows' per-token losses (what forward_chunk returns).
    static float deferred_loss(const float* losses, size_t rows) {
        double sum = 0.0;
        for (size_t i = 0; i < rows; i++) sum += losses[i];
        return float(sum / double(rows));
    }

    // fp8 linears: the casts of `state`'s formats and recipe, recording into amax and reading
    // their scales from scale and inv (backend arrays: Fp8Device)
    void set_fp8(const Fp8State* state, float* amax, const float* scale, const float* inv) {
        fp8_ = state;
        fp8_amax_ = amax;
        fp8_scale_ = scale;
        fp8_inv_ = inv;
    }

private:
    // What distinguishes a family's block (llmc/model/model.cpp's layer_forward), from the shape's arch.
    struct Block {
        bool layernorm;          // LayerNorm with bias (else RMSNorm)
        bool biases;             // the linears have biases
        bool learned_positions;  // a position embedding table (else rotary positions on q and k)
        bool rope;
        bool swiglu;             // SiLU-gated MLP over fused [gate | up] (else GELU)
        Role qkv_first, qkv_last;  // the QKV projection: one fused tensor or adjacent q, k, v
    };
    static Block block_of(Arch a);
    const Block block_;
    struct LayerActs;
    struct SlotActs;
    struct Scratch;
    struct Chunk {
        int begin, end;  // layers
        bool starts, ends;  // holds the embedding / the head
        std::vector<SlotActs> slots;
    };
    TensorParallel* tp_;
    ParamStore& store_;
    ContextParallel* cp_;
    Comm* ep_;
    CommStage ep_stage_;  // the routed rows' route to the ep group (llmc/parallel/comm_stage.h)
    std::vector<int> layer_unit_;  // layer -> unit, -1 when not held
    int embed_unit_ = -1, head_unit_ = -1;
    std::vector<Tensor> unit_params_, unit_grads_;  // a unit's buffers while acquired
    std::vector<int> param_refs_, grad_refs_;
    void acquire_unit(int unit, bool grads);
    void release_unit(int unit, bool grads);
    void units_to_whole(bool grads, float* host);
    std::unique_ptr<TensorParallel> own_tp_;  // a group of one when no TP group is given
    std::unique_ptr<ContextParallel> own_cp_;  // likewise for CP
    std::vector<int> lookup_;  // (role, layer + 1, expert + 1) -> index into params, -1 when not held
    size_t lookup_index(Role r, int layer, int expert) const;
    MoeStats moe_stats_;
    float* defer_ = nullptr;  // defer_losses
    size_t defer_cap_ = 0, defer_used_ = 0;
    std::vector<size_t> defer_rows_;
    bool recomputing_ = false;  // Full recompute's second forward of a layer
    int valid_tokens_ = 0;      // set_valid_tokens
    std::vector<Chunk> chunks_;
    Scratch* scratch_ = nullptr;
    void* act_mem_ = nullptr;
    void* act_host_mem_ = nullptr;  // activation offload: every slot's kept tensors
    // Activation offload: the copy in flight on each staging buffer (0: none), and the calls that
    // start copies (down from / up to staging[i % 2]) and make the device wait for them.
    uint64_t staging_copy_[2] = {0, 0};
    void staging_ready(int buffer);
    void offload_down(SlotActs& s, int i, size_t bytes);
    void offload_up(SlotActs& s, int i, size_t bytes);
    int tp_size() const;
    // The layout's chunks with their activation slots (not yet carved).
    static std::vector<Chunk> make_chunks(const ModelShape& shape, const ModelLayout& layout, std::vector<int> slots);
    // Lays the activations of chunks out from base (nullptr: only measures); returns the bytes.
    // sequence_parallel: the layout's, or false to measure the same layout without it.
    static size_t carve_activations(char* base, const ModelShape& shape, DType dtype, int B, int T,
                                    const ModelLayout& layout, bool sequence_parallel, Recompute recompute,
                                    bool offload, bool fp8, std::vector<Chunk>& chunks, Scratch& s);

    Tensor positions_table(int t);                   // this rank's rows of wpe (context parallelism)
    void scatter_positions_grad(Tensor drows, int t);  // and their gradient into wpe's
    // Returns the layer's part of the loss (an MoE layer's aux_loss_coef * load-balancing loss when dloss != 0).
    float layer_forward(int l, LayerActs& L, Tensor res_in, int b, int t, float dloss);
    // An MoE layer's experts in place of the MLP: out (N x C) from x (N = b*t rows, this cp rank's
    // t of each of b sequences); forward_chunk's dloss scales the load-balancing loss's gradient
    // (0: no statistics, no gradient)
    float moe_forward(int l, LayerActs& L, Tensor out, Tensor x, int b, int t, float dloss);
    void moe_backward(int l, LayerActs& L, Tensor dx, Tensor dy, Tensor x, int N);
    // The expert MLPs of layer l over rows: count[i] rows at offset[i] of expert e0 + i, from xin
    // (forward) into y; the backward turns dy's rows into their input gradients in place.
    void experts_forward(int l, LayerActs& L, Tensor y, int e0, const std::vector<int>& count,
                         const std::vector<int>& offset);
    void experts_backward(int l, LayerActs& L, Tensor dy, int e0, const std::vector<int>& count,
                          const std::vector<int>& offset);
    // Expert parallelism: rows (C wide) between this rank's plan order (local: `local` rows of
    // every expert, in expert order) and its experts' order (expert-major, the route's blocks),
    // over the ep group; the combine and the backward's return go the other way.
    void ep_dispatch(const MoeEpRoute& route, Tensor local, Tensor experts);
    void ep_return(const MoeEpRoute& route, Tensor experts, Tensor local);
    // rows per peer as the message words all_to_all_v moves (a row's words on CommStage's route)
    std::vector<size_t> ep_words(const std::vector<size_t>& rows, DType dt) const;
    void layer_backward(int l, LayerActs& L, Tensor res_in, int b, int t);
    // One of layer l's linears: matmul_forward / matmul_backward, or their fp8 ops (set_fp8).
    const Fp8State* fp8_ = nullptr;
    float* fp8_amax_ = nullptr;
    const float* fp8_scale_ = nullptr;
    const float* fp8_inv_ = nullptr;
    // inp_gelu (fp8 only): inp is a GELU's pre-activation, the GELU applied in the input's cast
    // (L: the layer's activations, whose Fp8Stash of lin the fp8 ops take)
    void linear_forward(int l, const LayerActs& L, Fp8Linear lin, Tensor out, Tensor pre_gelu, Tensor inp, Tensor w,
                        Tensor bias, int N, int IC, int OC, bool gelu, bool inp_gelu = false);
    void linear_backward(int l, const LayerActs& L, Fp8Linear lin, Tensor dinp, Tensor dw, Tensor dbias, Tensor dout,
                         Tensor inp, Tensor w, Tensor pre_gelu, int N, int IC, int OC, Tensor dinp_gelu = Tensor(),
                         bool inp_gelu = false);
    // whether the linears of N rows run in fp8 (a forward-only pass of other N runs the model's dtype)
    bool fp8_linear(int N) const { return fp8_ && N % ops.fp8_dim_multiple() == 0; }
    float head_forward(SlotActs& s, Tensor res, const int32_t* targets, int b, int t, float dloss);
    void head_backward(SlotActs& s, Tensor res, int b, int t);
    // The family's norm (LayerNorm with bias, or RMSNorm), and its backward with sequence
    // parallelism's reduction of the weight gradients over TP.
    void norm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Role w, int layer, int n);
    void norm_backward(Tensor dinp, Tensor dout, Tensor inp, Role w, int layer, const float* mean, const float* rstd,
                       int n);
};
