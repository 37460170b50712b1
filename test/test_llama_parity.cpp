// Parity of the CPU backend's Llama with an independent PyTorch implementation.
//
// dev/reference/llama_reference.py (float64, Debian's python3-torch; transformers' LlamaForCausalLM
// written from its definition) writes, per case,
//   test/data/<case>_model.safetensors  the initial weights under transformers' names (F32, real
//     vocabulary rows); __metadata__: n_layer, n_head, n_kv_head, d_model, ffn_dim, vocab_size,
//     max_seq_len, rope_theta, norm_eps, tie_embeddings, num_params (elements in the file)
//   test/data/<case>_state.safetensors  tokens, targets [B, T] (integers as F32), logits [B, T, V],
//     loss [1], grad.<name> for every weight, losses and grad_norms [n_steps] (10 AdamW steps on
//     the same batch: the loss and gradient norm before each update), final.<name> (the weights
//     after them); __metadata__: B, T, n_steps, lr, beta1, beta2, eps, weight_decay, grad_clip.
// Regenerate with: /usr/bin/python3 dev/reference/llama_reference.py
// Cases: llama_gqa (n_kv_head 2 of 4 heads, untied head, rope_theta 1e4, norm_eps 1e-5) and
// llama_mqa_tied (one kv head, tied embeddings, rope_theta 5e5, norm_eps 1e-6); vocabulary 61,
// so the model pads it to 128.
//
// Metric, as in test/test_parity.cpp, per tensor (a = ours, b = reference), both must hold:
//   ||a - b||_2 / ||b||_2 <= 1e-5   and   max_i |a_i - b_i| / max_i |b_i| <= 1e-5;
// losses and gradient norms: |a - b| <= 1e-5 |b|. Padded vocabulary rows must be exactly zero.
// The file order of the whole model (which hf_read_weights returns and Model takes) is derived
// here independently of the model's table: the declarations in transformers' order, each
// per-layer tensor expanded over the layers before the next (llmc/model/param_table.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/io/hf_format.h"
#include "llmc/model/model.h"
#include "llmc/backend/ops.h"
#include "llmc/model/optimizer.h"
#include "llmc/io/safetensors.h"

#include "test/temp_dir.h"
#include "test/test_data_files.h"
#include "test/whole_model.h"

namespace {

constexpr double kTol = 1e-5;

const std::string& meta(const SafetensorsReader& r, const std::string& key) {
    auto it = r.metadata().find(key);
    if (it == r.metadata().end()) FAIL(r.path() << ": no metadata key " << key);
    return it->second;
}
int meta_int(const SafetensorsReader& r, const std::string& key) { return std::stoi(meta(r, key)); }
double meta_double(const SafetensorsReader& r, const std::string& key) { return std::stod(meta(r, key)); }

// One whole tensor in the file order: `rows` rows (vocabulary padded) at `offset`, of which the
// file holds the first file_rows.
struct Slice {
    std::string name;
    size_t offset, rows, cols, file_rows;
    size_t file_numel() const { return file_rows * cols; }
    std::vector<int64_t> file_shape() const {
        return cols == 1 ? std::vector<int64_t>{int64_t(rows)} : std::vector<int64_t>{int64_t(file_rows), int64_t(cols)};
    }
};

std::vector<Slice> llama_slices(const ModelShape& s) {
    const size_t C = s.d_model, HS = s.d_model / s.n_head, Q = s.n_head * HS, KV = s.n_kv_head * HS, F = s.ffn_dim;
    const size_t V = s.vocab_size, Vp = s.padded_vocab;
    struct Kind {
        const char* name;
        size_t rows, cols;
    };
    const Kind per_layer[] = {{"input_layernorm", C, 1},        {"self_attn.q_proj", Q, C}, {"self_attn.k_proj", KV, C},
                              {"self_attn.v_proj", KV, C},      {"self_attn.o_proj", C, Q}, {"post_attention_layernorm", C, 1},
                              {"mlp.gate_proj", F, C},          {"mlp.up_proj", F, C},      {"mlp.down_proj", C, F}};
    std::vector<Slice> out;
    size_t off = 0;
    auto add = [&](const std::string& name, size_t rows, size_t cols, size_t file_rows) {
        out.push_back({name, off, rows, cols, file_rows});
        off += rows * cols;
    };
    add("model.embed_tokens.weight", Vp, C, V);
    for (const Kind& k : per_layer)
        for (int l = 0; l < s.n_layer; l++)
            add("model.layers." + std::to_string(l) + "." + k.name + ".weight", k.rows, k.cols, k.rows);
    add("model.norm.weight", C, 1, C);
    if (!s.tie_embeddings) add("lm_head.weight", Vp, C, V);
    return out;
}

struct LlamaRef {
    std::string name, model_path;
    ModelShape shape;
    size_t ref_num_params = 0;  // elements in the reference's files (real vocabulary)
    int B = 0, T = 0, n_steps = 0;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
    std::vector<Slice> slices;
    std::vector<float> whole;  // hf_read_weights of the model file
    std::vector<int32_t> x, y;
    std::unique_ptr<SafetensorsReader> state;
    std::vector<float> logits, losses, grad_norms;
    float loss = 0;
};

std::vector<int32_t> token_ids(const SafetensorsReader& r, const char* name, int n, int V) {
    const std::vector<float> f = r.read(name);
    REQUIRE(f.size() == size_t(n));
    std::vector<int32_t> ids(f.size());
    for (size_t i = 0; i < f.size(); i++) {
        ids[i] = int32_t(f[i]);
        REQUIRE(float(ids[i]) == f[i]);
        REQUIRE(ids[i] >= 0);
        REQUIRE(ids[i] < V);
    }
    return ids;
}

const LlamaRef& ref_case(const std::string& name) {
    static std::map<std::string, std::unique_ptr<LlamaRef>> cache;
    auto& slot = cache[name];
    if (slot) return *slot;
    auto r = std::make_unique<LlamaRef>();
    r->name = name;
    r->model_path = find_data_file(name + "_model.safetensors");
    const SafetensorsReader m(r->model_path);
    ModelShape& s = r->shape;
    s.arch = Arch::Llama;
    s.n_layer = meta_int(m, "n_layer");
    s.n_head = meta_int(m, "n_head");
    s.n_kv_head = meta_int(m, "n_kv_head");
    s.d_model = meta_int(m, "d_model");
    s.ffn_dim = meta_int(m, "ffn_dim");
    s.vocab_size = meta_int(m, "vocab_size");
    s.padded_vocab = (s.vocab_size + 127) / 128 * 128;
    s.max_seq_len = meta_int(m, "max_seq_len");
    s.rope_theta = float(meta_double(m, "rope_theta"));
    s.norm_eps = float(meta_double(m, "norm_eps"));
    const std::string tied = meta(m, "tie_embeddings");
    REQUIRE((tied == "true" || tied == "false"));
    s.tie_embeddings = tied == "true";
    r->ref_num_params = size_t(std::stoull(meta(m, "num_params")));
    r->slices = llama_slices(s);
    r->whole = hf_read_weights(r->model_path, s);

    r->state = std::make_unique<SafetensorsReader>(find_data_file(name + "_state.safetensors"));
    const SafetensorsReader& st = *r->state;
    r->B = meta_int(st, "B");
    r->T = meta_int(st, "T");
    r->n_steps = meta_int(st, "n_steps");
    r->lr = float(meta_double(st, "lr"));
    r->beta1 = float(meta_double(st, "beta1"));
    r->beta2 = float(meta_double(st, "beta2"));
    r->eps = float(meta_double(st, "eps"));
    r->weight_decay = float(meta_double(st, "weight_decay"));
    r->grad_clip = float(meta_double(st, "grad_clip"));
    const int N = r->B * r->T;
    r->x = token_ids(st, "tokens", N, s.vocab_size);
    r->y = token_ids(st, "targets", N, s.vocab_size);
    r->logits = st.read("logits");
    REQUIRE(r->logits.size() == size_t(N) * s.vocab_size);
    const std::vector<float> loss = st.read("loss");
    REQUIRE(loss.size() == 1);
    r->loss = loss[0];
    r->losses = st.read("losses");
    r->grad_norms = st.read("grad_norms");
    REQUIRE(r->losses.size() == size_t(r->n_steps));
    REQUIRE(r->grad_norms.size() == size_t(r->n_steps));
    slot = std::move(r);
    return *slot;
}

struct Err {
    double rel_norm, rel_max;
};

Err compare(const float* a, const float* b, size_t n) {
    double d2 = 0, b2 = 0, dmax = 0, bmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = double(a[i]) - double(b[i]);
        d2 += d * d;
        b2 += double(b[i]) * b[i];
        dmax = std::max(dmax, std::fabs(d));
        bmax = std::max(bmax, std::fabs(double(b[i])));
    }
    Err e;
    e.rel_norm = b2 > 0 ? std::sqrt(d2 / b2) : (d2 > 1e-60 ? INFINITY : 0.0);
    e.rel_max = bmax > 0 ? dmax / bmax : (dmax > 1e-30 ? INFINITY : 0.0);
    return e;
}

void check_tensor(const std::string& what, const float* ours, const std::vector<float>& ref) {
    Err e = compare(ours, ref.data(), ref.size());
    INFO(what << " (" << ref.size() << " elements): norm-relative error " << e.rel_norm
              << ", max-abs error / max|ref| " << e.rel_max);
    CHECK(e.rel_norm <= kTol);
    CHECK(e.rel_max <= kTol);
}

bool close_rel(double a, double b) { return std::fabs(a - b) <= kTol * std::fabs(b); }

// The padded vocabulary rows of a whole-model vector (file order) are all zero.
void check_padding_zero(const std::string& what, const std::vector<float>& whole, const std::vector<Slice>& slices) {
    for (const Slice& s : slices) {
        size_t nonzero = 0;
        for (size_t i = s.offset + s.file_numel(); i < s.offset + s.rows * s.cols; i++) nonzero += whole[i] != 0.0f;
        INFO(what << ": " << s.name << " padded rows");
        CHECK(nonzero == 0);
    }
}

// Each tensor of a whole-model vector against the state file's prefix.<name>.
void check_whole(const std::string& what, const LlamaRef& r, const std::vector<float>& whole,
                 const std::string& prefix) {
    for (const Slice& s : r.slices) {
        const std::vector<float> ref = r.state->read(prefix + s.name);
        REQUIRE(ref.size() == s.file_numel());
        check_tensor(r.name + ": " + what + " " + s.name, whole.data() + s.offset, ref);
    }
    check_padding_zero(r.name + ": " + what, whole, r.slices);
}

}  // namespace

TEST_CASE("llama parity: reference files are consistent and hf_read_weights places every tensor", "[llama]") {
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    const ModelShape& s = r.shape;
    REQUIRE(s.vocab_size % 128 != 0);  // the padding is exercised
    REQUIRE(r.T <= s.max_seq_len);
    REQUIRE(s.n_head % s.n_kv_head == 0);
    // the test's layout covers the model's whole vector; the files hold the real rows
    size_t file_elems = 0;
    for (const Slice& sl : r.slices) file_elems += sl.file_numel();
    CHECK(file_elems == r.ref_num_params);
    CHECK(r.slices.back().offset + r.slices.back().rows * r.slices.back().cols == r.whole.size());
    CHECK(r.whole.size() == num_params(s));
    CHECK(num_params_unpadded(s) == r.ref_num_params);
    // every file tensor at its place, bit for bit; nothing else in the file
    const SafetensorsReader m(r.model_path);
    CHECK(m.entries().size() == r.slices.size());
    for (const Slice& sl : r.slices) {
        INFO("tensor " << sl.name);
        REQUIRE(m.has(sl.name));
        CHECK(m.entry(sl.name).shape == sl.file_shape());
        const std::vector<float> t = m.read(sl.name);
        REQUIRE(t.size() == sl.file_numel());
        CHECK(std::memcmp(t.data(), r.whole.data() + sl.offset, t.size() * sizeof(float)) == 0);
        REQUIRE(r.state->has("grad." + sl.name));
        REQUIRE(r.state->has("final." + sl.name));
        CHECK(r.state->entry("grad." + sl.name).shape == sl.file_shape());
        CHECK(r.state->entry("final." + sl.name).shape == sl.file_shape());
    }
    CHECK(m.has("lm_head.weight") == !s.tie_embeddings);
    check_padding_zero(r.name + ": loaded weights", r.whole, r.slices);
    CHECK(r.losses[0] == r.loss);
}

TEST_CASE("llama parity: the model's parameter table and weight decay", "[llama]") {
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    REQUIRE(model.params.num_params == r.whole.size());
    REQUIRE(model.params.specs.size() == r.slices.size());
    for (const ParamSpec& p : model.params.specs) {
        INFO("param " << p.name);
        auto it = std::find_if(r.slices.begin(), r.slices.end(), [&](const Slice& sl) { return sl.name == p.name; });
        REQUIRE(it != r.slices.end());
        CHECK(p.numel == it->rows * it->cols);
        // the reference decays every 2-D weight (embedding and head included), not the norms
        CHECK(p.decay == (it->cols > 1));
    }
    model.set_params_whole(r.whole.data());
    std::vector<float> back(r.whole.size());
    model.get_params_whole(back.data());
    CHECK(std::memcmp(back.data(), r.whole.data(), back.size() * sizeof(float)) == 0);
}

TEST_CASE("llama parity: export of the loaded model round-trips bit for bit", "[llama]") {
    const TempDir tmp("llmc_llama_parity");
    const std::string dir = tmp.path;
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    std::vector<float> out(model.params.num_params);
    model.get_params_whole(out.data());
    const std::string path = dir + "/" + name + ".safetensors";
    hf_write_weights(path, r.shape, out);
    const std::vector<float> back = hf_read_weights(path, r.shape);
    REQUIRE(back.size() == r.whole.size());
    CHECK(std::memcmp(back.data(), r.whole.data(), back.size() * sizeof(float)) == 0);
    check_padding_zero(r.name + ": exported weights", back, r.slices);
    // the exported file holds the reference's tensors, real rows only, bit for bit
    const SafetensorsReader a(path), b(r.model_path);
    CHECK(a.entries().size() == b.entries().size());
    for (const Slice& sl : r.slices) {
        INFO("tensor " << sl.name);
        CHECK(a.entry(sl.name).shape == sl.file_shape());
        CHECK(a.read(sl.name) == b.read(sl.name));
    }
}

TEST_CASE("llama parity: forward logits and loss match the PyTorch reference", "[llama]") {
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    const float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 0.0f);
    INFO("loss " << loss << " reference " << r.loss);
    CHECK(close_rel(loss, r.loss));
    const int V = r.shape.vocab_size;
    std::vector<float> logits(size_t(r.B) * r.T * V);
    for (int b = 0; b < r.B; b++)
        for (int t = 0; t < r.T; t++) model.get_logits(b, t, &logits[(size_t(b) * r.T + t) * V]);
    check_tensor(r.name + ": logits", logits.data(), r.logits);
}

TEST_CASE("llama parity: every parameter gradient matches the PyTorch reference", "[llama]") {
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    model.zero_grads();
    const float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 1.0f / float(r.B * r.T));
    CHECK(close_rel(loss, r.loss));
    model.backward();
    std::vector<float> grads(model.params.num_params);
    model.get_grads_whole(grads.data());
    check_whole("gradient", r, grads, "grad.");
}

TEST_CASE("llama parity: 10 AdamW steps match the PyTorch reference (losses, norms, weights)", "[llama]") {
    const std::string name = GENERATE(as<std::string>{}, "llama_gqa", "llama_mqa_tied");
    const LlamaRef& r = ref_case(name);
    INFO("case " << name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    AdamW opt(wm.layout, *ops, 0, model.params.num_params, wm.store.params.slice(0, model.params.num_params),
              wm.store.grads.slice(0, model.params.num_params));
    const AdamWHyper h{r.lr, r.beta1, r.beta2, r.eps, r.weight_decay};
    const float dloss = 1.0f / float(r.B * r.T);
    for (int step = 1; step <= r.n_steps; step++) {
        model.zero_grads();
        const float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, dloss);
        model.backward();
        const double norm = std::sqrt(ops->sum_squares(wm.store.grads.slice(0, model.params.num_params)));
        {
            INFO("step " << step << ": loss " << loss << " reference " << r.losses[step - 1]);
            CHECK(close_rel(loss, r.losses[step - 1]));
        }
        {
            INFO("step " << step << ": grad norm " << norm << " reference " << r.grad_norms[step - 1]);
            CHECK(close_rel(norm, r.grad_norms[step - 1]));
        }
        opt.step(h, step, clip_scale(norm, r.grad_clip), 0u);
    }
    std::vector<float> final_w(model.params.num_params);
    model.get_params_whole(final_w.data());
    check_whole("weights after the steps", r, final_w, "final.");
}
