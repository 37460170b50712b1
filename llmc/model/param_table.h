// The parameter table as data: a model family declares its tensors (name, whole shape, how
// tensor parallelism splits it, init, weight decay, which part of the model holds it), and
// everything generic works from those declarations alone: this rank's pieces under a layout
// (ParamSpec), the runs that map them to the whole tensor in the file order (checkpoints,
// model files, whole-model assembly), the ZeRO units, the parameter count. Nothing here names
// a family's tensors; the families' declarations live in llmc/model/families.cpp.
//
// Orders. The file order is the declarations in order, a per-layer declaration expanded over
// the layers (kind-major: all layers' ln1w, then all layers' ln1b, ... for GPT-2, which is
// llm.c's checkpoint order). The memory order of a rank is [embedding part] [its layers, each
// layer's tensors contiguous in declaration order] [head part, then the tied copy of the token
// embedding on a last stage that lacks the first].
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "llmc/model/moe.h"

enum class Arch { GPT2, Llama };
const char* arch_name(Arch a);

struct ModelShape {
    int n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, padded_vocab = 0, max_seq_len = 0;
    Arch arch = Arch::GPT2;
    int n_kv_head = 0;            // key/value heads (grouped-query attention); 0 = n_head
    int ffn_dim = 0;              // MLP width; 0 = 4 * d_model
    float rope_theta = 10000.0f;  // Llama's rotary base
    float norm_eps = 1e-5f;       // RMSNorm's eps (GPT-2's LayerNorm eps is 1e-5)
    bool tie_embeddings = true;   // the LM head is the token embedding (GPT-2 always)
    MoeShape moe{};               // mixture-of-experts layers (model.moe; none by default)
    int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    int ffn() const { return ffn_dim > 0 ? ffn_dim : 4 * d_model; }
    int head_dim() const { return d_model / n_head; }
    // Rows of the vocabulary (embedding, LM head, logits) each of tp ranks holds: the vocabulary
    // padded to a multiple of 128 * tp (Megatron's rule), split evenly. The rows past the file's
    // padded_vocab exist only in memory, stay zero, and are never written to a file.
    int vocab_shard(int tp) const { return (vocab_size + 128 * tp - 1) / (128 * tp) * 128; }
    bool operator==(const ModelShape& o) const {
        return n_layer == o.n_layer && n_head == o.n_head && d_model == o.d_model && vocab_size == o.vocab_size &&
               padded_vocab == o.padded_vocab && max_seq_len == o.max_seq_len && arch == o.arch &&
               kv_heads() == o.kv_heads() && ffn() == o.ffn() && rope_theta == o.rope_theta &&
               norm_eps == o.norm_eps && tie_embeddings == o.tie_embeddings && moe == o.moe;
    }
    bool operator!=(const ModelShape& o) const { return !(*this == o); }
};

// What a tensor is for: the block code asks for tensors by role. A family declares the roles it has.
enum Role {
    TokEmb, PosEmb,                                    // embedding part
    Norm1W, Norm1B, QkvW, QkvB, QW, KW, VW,            // attention (QkvW fused, or QW, KW, VW adjacent)
    AttnOutW, AttnOutB, Norm2W, Norm2B,
    FcW, FcB, GateW, UpW, FcOutW, FcOutB,              // MLP (FcW, or GateW, UpW adjacent); an expert's MLP too
    RouterW,                                           // a mixture-of-experts layer's router
    NormFW, NormFB, HeadW,                             // head part (HeadW: an untied LM head)
    NUM_ROLES
};

// How tensor parallelism splits a [rows, cols] tensor (Megatron's attributes).
enum class TpSplit {
    Replicated,  // every TP rank holds it whole
    Column,      // output rows split: `stride` equal blocks of rows, each cut into tp pieces (fused QKV: 3)
    Row,         // input columns split
    Vocab,       // vocabulary rows split in tp blocks (embedding, LM head)
};
enum class ModelPart { Embedding, Layer, Head };
// Which layers a per-layer tensor exists in (model.moe: an MoE layer's experts replace the MLP).
enum class LayerSet { All, Dense, Moe };

struct TensorDecl {
    Role role;
    std::string name;  // per-layer: a printf pattern with one %d for the layer ("h.%d.qkvw")
    ModelPart part;
    size_t rows, cols;  // whole shape, row-major; vectors are [n, 1]
    TpSplit split;
    int stride;         // Column only
    bool decay;         // weight decay applies
    float init_std;     // > 0: N(0, init_std); else every element is init_value
    float init_value;
    size_t init_rows;   // rows initialised (the rest stay zero: vocabulary padding)
    // The tensor in Hugging Face's format (llmc/io/hf_format.h): its name there, a pattern like
    // `name` ("" = `name` itself), and whether it is stored transposed, [cols, rows] (GPT-2's
    // Conv1D weights are [in, out] in transformers, [out, in] here).
    std::string hf_name;
    bool hf_transposed = false;
    LayerSet layers = LayerSet::All;  // per-layer tensors: the layers that hold one
    // One per expert of each layer in `layers`: the name patterns take the layer, then the
    // expert ("h.%d.moe.e%d.fcw"). File order: layer-major, then expert. Memory order: within a
    // layer, a run of consecutive per-expert declarations is laid out expert by expert (expert
    // 0's tensors of the run, then expert 1's, ...), so one expert's tensors are adjacent.
    bool per_expert = false;
};

// The whole-model declarations of a shape's family, in file order.
std::vector<TensorDecl> model_tensors(const ModelShape& s);
// The instances of a declaration in file order: (layer, expert), -1 where not per layer / per expert.
std::vector<std::pair<int, int>> decl_instances(const ModelShape& s, const TensorDecl& d);
// An instance's name from a declaration's pattern (its name or hf_name).
std::string instance_name(const std::string& pattern, int layer, int expert);
// Elements of the whole model (padded vocabulary rows included), and of its real tensors only.
size_t num_params(const ModelShape& s);
size_t num_params_unpadded(const ModelShape& s);
// The elements of every expert of every MoE layer (0 without MoE).
size_t num_expert_params(const ModelShape& s);
// num_params in double: never wraps, whatever the shape (for checks before trusting a shape).
double num_params_double(const ModelShape& s);

// Which part of the model one process holds.
struct ModelLayout {
    int tp = 1, tp_rank = 0;
    bool sequence_parallel = false;
    int cp = 1;  // context-parallel ranks: the activations hold T / cp tokens of each sequence
    // Expert parallelism: this rank holds experts [ep_rank E/ep, (ep_rank+1) E/ep) of each MoE
    // layer (and every other tensor whole, as before); its MoE layers trade tokens over the ep group.
    int ep = 1, ep_rank = 0;
    int experts_begin(int E) const { return ep_rank * (E / ep); }
    int experts_end(int E) const { return (ep_rank + 1) * (E / ep); }
    std::vector<std::pair<int, int>> chunks;  // [begin, end) layers of each chunk, in order; empty = all, one chunk
    bool first = true;  // holds the embedding (runs the pipeline's first chunk as its chunk 0)
    bool last = true;   // holds the final norm and the head (runs the pipeline's last chunk as its last)
};

// One tensor as this rank holds it.
struct ParamSpec {
    std::string name;  // e.g. "h.3.qkvw"
    Role role;
    int decl;       // index into model_tensors()
    ModelPart part;  // the head for the tied copy
    int layer;      // -1 outside the layers
    int expert;     // -1 unless one expert's tensor (TensorDecl::per_expert)
    size_t offset;  // element offset in the local parameter (and gradient) buffer
    size_t numel;   // local elements (a vocabulary split's memory-only padding rows included, last)
    bool decay;
    // This copy is the one that counts: checkpoints are assembled from it and the gradient
    // norm sums it. False for replicated tensors on tp_rank > 0, the tied head copy, and (expert
    // parallelism) every tensor but the experts on ep_rank > 0.
    bool primary;
    // As primary, but true on every ep rank for the tensors that are not experts: under expert
    // parallelism ZeRO splits their optimizer elements over the ep group, and the gradient norm
    // counts each element on its owner (DataParallel::grad_norm).
    bool ep_primary;
    bool tp_replicated;  // every TP rank holds the whole tensor
    bool tied_copy;      // the last stage's copy of the token embedding (the tied LM head)
    // Where the local elements sit in the whole tensor: rows `rows` (ranges, in local order) x
    // columns [col_begin, col_end) of a row-major [.., cols] tensor at file_offset in file order.
    size_t file_offset;
    size_t cols;
    std::vector<std::pair<size_t, size_t>> rows;
    size_t col_begin, col_end;
};

// Calls f(local element offset within the tensor, file element offset, count) for every
// contiguous run of p's local elements.
template <class F>
void for_each_run(const ParamSpec& p, F f) {
    const size_t w = p.col_end - p.col_begin;
    size_t local = 0;
    for (const auto& r : p.rows) {
        if (w == p.cols) {  // whole rows: one run per range
            f(local, p.file_offset + r.first * p.cols, (r.second - r.first) * w);
            local += (r.second - r.first) * w;
            continue;
        }
        for (size_t row = r.first; row < r.second; row++, local += w) f(local, p.file_offset + row * p.cols + p.col_begin, w);
    }
}

// The parameter table of one layout (memory order) and its element count.
std::vector<ParamSpec> param_table(const ModelShape& s, const ModelLayout& layout, size_t* num_local);

// A contiguous range of the flat buffer that ZeRO-3 gathers, and ZeRO-2/3 reduce-scatter, as
// one: the embedding part, each layer, the head part. The padding at the end of the buffer
// belongs to the last unit.
struct ParamUnit {
    enum Kind { Embedding, Layer, Head } kind;
    size_t begin, end;  // elements of the flat buffer
    int layer;          // Layer units; -1 otherwise
    size_t numel() const { return end - begin; }
};
// The units of a table padded to padded_params elements; param_unit[i] = the unit of table[i].
std::vector<ParamUnit> param_units(const std::vector<ParamSpec>& table, size_t padded_params,
                                   std::vector<int>* param_unit);

// Elements of a local parameter buffer of num_params real elements padded to pad_multiple.
inline size_t padded_param_count(size_t num_params, size_t pad_multiple) {
    return (num_params + pad_multiple - 1) / pad_multiple * pad_multiple;
}

// This rank's parameters as its flat buffers hold them: the table (memory order), padded to a
// multiple of pad_multiple (zeros that belong to no tensor, so that ZeRO shards divide the
// buffers evenly) and cut into units. It sizes the parameter store (llmc/model/param_store.h); the
// model finds its tensors in it, DataParallel cuts it into buckets and shards, AdamW walks it,
// and the planner computes the same for every rank without building anything.
struct ParamLayout {
    std::vector<ParamSpec> specs;  // memory order
    size_t num_params = 0;         // local elements of the real tensors
    size_t padded_params = 0;      // elements of the flat buffers (num_params + zero padding)
    size_t total_params = 0;       // elements of the whole model (num_params(shape))
    std::vector<ParamUnit> units;  // memory order, covering [0, padded_params)
    std::vector<int> spec_unit;    // specs index -> unit
    int unit_of(const ParamSpec& p) const { return spec_unit[size_t(&p - specs.data())]; }
};
ParamLayout param_layout(const ModelShape& s, const ModelLayout& layout, size_t pad_multiple);

// A whole model's array in file order, handed out in pieces: read(first, n, out) writes elements
// [first, first + n) to out (a checkpoint's file read where it lies, or a whole copy in memory).
using ReadFileOrder = std::function<void(size_t first, size_t n, float* out)>;
// All n elements of read, in order, a chunk at a time (up to 1M elements, 4 MB, read into one
// buffer): f(first, chunk, k) for elements [first, first + k). What a save streams to its files.
void for_each_chunk(const ReadFileOrder& read, size_t n, const std::function<void(size_t, const float*, size_t)>& f);
// This layout's elements at the memory positions in runs ([begin, end) of the padded flat buffer,
// ascending, disjoint), packed one run after another, taken from read. Only those elements are
// read (replicated tensors and the tied head copy included: this rank holds them); padding is 0.
// A rank that resumes reads its piece of the model ({{0, padded_params}}) and its ZeRO shard of the
// optimizer state (AdamW::runs()), not the whole checkpoint.
std::vector<float> pick_file_order(const ParamLayout& layout, const ReadFileOrder& read,
                                   const std::vector<std::pair<size_t, size_t>>& runs);

// Checks that a layout can split this shape; throws UserError naming the config key.
// T: the whole sequence length (context parallelism cuts it into 2 x cp chunks, then sequence
// parallelism splits each rank's T / cp tokens evenly over TP).
void check_model_layout(const ModelShape& s, const ModelLayout& layout, int T);
