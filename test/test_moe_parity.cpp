// Parity of the CPU backend's mixture-of-experts models with an independent PyTorch reference.
//
// dev/reference/moe_reference.py (float64; the MoE layer written densely over the experts, with
// masks, from its definition in llmc/model/moe.h) writes, per case,
//   test/data/<case>_model.safetensors  the initial weights under train_gpt's Hugging Face names
//     (llmc/model/families.cpp); __metadata__: the shape and model.moe settings
//   test/data/<case>_state.safetensors  tokens, targets, logits, loss (with the load-balancing
//     term), aux (the MoE layers' load-balancing losses, summed, without the coefficient),
//     dropped (pairs past capacity in the first forward), grad.<name>, losses and grad_norms of
//     10 AdamW steps on the same batch, final.<name>.
// Regenerate with: /usr/bin/python3 dev/reference/moe_reference.py
// Cases: moe_gpt2 (GPT-2, both layers MoE, 4 experts, top-2, dropless) and moe_llama_cap (Llama,
// layer 1 MoE and layer 0 dense, 4 experts, top-2, capacity_factor 1.0: pairs are dropped).
//
// Metric as test/test_llama_parity.cpp: per tensor ||a-b||/||b|| <= 1e-5 and max|a-b|/max|b| <=
// 1e-5; losses, norms, aux: |a-b| <= 1e-5 |b|. Tensors are compared by name: ours are written
// with hf_write_weights and read back, so the reference's layout (GPT-2's transposed Conv1D
// weights) needs no second mapping here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

std::string meta(const SafetensorsReader& r, const std::string& key) {
    auto it = r.metadata().find(key);
    if (it == r.metadata().end()) FAIL(r.path() << ": no metadata key " << key);
    return it->second;
}
int meta_int(const SafetensorsReader& r, const std::string& key) { return std::stoi(meta(r, key)); }
double meta_double(const SafetensorsReader& r, const std::string& key) { return std::stod(meta(r, key)); }

struct MoeRef {
    std::string name, model_path;
    ModelShape shape;
    int B = 0, T = 0, n_steps = 0;
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
    std::vector<float> whole;
    std::vector<int32_t> x, y;
    std::unique_ptr<SafetensorsReader> state;
};

std::vector<int32_t> ids(const SafetensorsReader& r, const char* name) {
    std::vector<int32_t> out;
    for (float f : r.read(name)) {
        out.push_back(int32_t(f));
        REQUIRE(float(out.back()) == f);
    }
    return out;
}

MoeRef load(const std::string& name) {
    MoeRef r;
    r.name = name;
    r.model_path = find_data_file(name + "_model.safetensors");
    const SafetensorsReader m(r.model_path);
    ModelShape& s = r.shape;
    s.arch = meta(m, "arch") == "llama" ? Arch::Llama : Arch::GPT2;
    s.n_layer = meta_int(m, "n_layer");
    s.n_head = meta_int(m, "n_head");
    s.d_model = meta_int(m, "d_model");
    s.vocab_size = meta_int(m, "vocab_size");
    s.padded_vocab = (s.vocab_size + 127) / 128 * 128;
    s.max_seq_len = meta_int(m, "max_seq_len");
    if (s.arch == Arch::Llama) {
        s.n_kv_head = meta_int(m, "n_kv_head");
        s.ffn_dim = meta_int(m, "ffn_dim");
        s.rope_theta = float(meta_double(m, "rope_theta"));
        s.norm_eps = float(meta_double(m, "norm_eps"));
        s.tie_embeddings = false;
    }
    s.moe.num_experts = meta_int(m, "num_experts");
    s.moe.top_k = meta_int(m, "top_k");
    s.moe.expert_ffn_dim = meta_int(m, "expert_ffn_dim");
    s.moe.every = meta_int(m, "every");
    s.moe.aux_loss_coef = float(meta_double(m, "aux_loss_coef"));
    s.moe.capacity_factor = float(meta_double(m, "capacity_factor"));
    CHECK(num_params_unpadded(s) == size_t(std::stoull(meta(m, "num_params"))));
    r.whole = hf_read_weights(r.model_path, s);
    r.state = std::make_unique<SafetensorsReader>(find_data_file(name + "_state.safetensors"));
    const SafetensorsReader& st = *r.state;
    r.B = meta_int(st, "B");
    r.T = meta_int(st, "T");
    r.n_steps = meta_int(st, "n_steps");
    r.lr = float(meta_double(st, "lr"));
    r.beta1 = float(meta_double(st, "beta1"));
    r.beta2 = float(meta_double(st, "beta2"));
    r.eps = float(meta_double(st, "eps"));
    r.weight_decay = float(meta_double(st, "weight_decay"));
    r.grad_clip = float(meta_double(st, "grad_clip"));
    r.x = ids(st, "tokens");
    r.y = ids(st, "targets");
    REQUIRE(r.x.size() == size_t(r.B) * r.T);
    return r;
}

struct Err {
    double rel_norm, rel_max, max_abs;
};
Err compare(const std::vector<float>& a, const std::vector<float>& b) {
    double d2 = 0, b2 = 0, dmax = 0, bmax = 0;
    for (size_t i = 0; i < b.size(); i++) {
        const double d = double(a[i]) - double(b[i]);
        d2 += d * d;
        b2 += double(b[i]) * b[i];
        dmax = std::max(dmax, std::fabs(d));
        bmax = std::max(bmax, std::fabs(double(b[i])));
    }
    return {b2 > 0 ? std::sqrt(d2 / b2) : std::sqrt(d2), bmax > 0 ? dmax / bmax : dmax, dmax};
}

// The worst errors of a check, reported by the tests (the numbers docs/models.md quotes).
struct Worst {
    double rel_max = 0, max_abs = 0;
    void add(const Err& e) {
        rel_max = std::max(rel_max, e.rel_max);
        max_abs = std::max(max_abs, e.max_abs);
    }
};

void check_tensor(const std::string& what, const std::vector<float>& ours, const std::vector<float>& ref, Worst* w) {
    REQUIRE(ours.size() == ref.size());
    const Err e = compare(ours, ref);
    if (w) w->add(e);
    INFO(what << " (" << ref.size() << " elements): norm-relative " << e.rel_norm << ", max-relative " << e.rel_max);
    CHECK(e.rel_norm <= kTol);
    CHECK(e.rel_max <= kTol);
}

bool close_rel(double a, double b) { return std::fabs(a - b) <= kTol * std::fabs(b); }

// GPT-2's key bias (rows [C, 2C) of c_attn.bias) has a zero gradient in exact arithmetic (the
// softmax does not see q . b_k, the same for every key), so AdamW turns its gradient's rounding
// noise into steps of about lr: its trained value is noise, left out of the weight comparison
// (its gradient is still compared; see dev/reference/moe_reference.py).
std::vector<float> without_noise(const ModelShape& s, const std::string& name, std::vector<float> v) {
    const std::string suffix = "attn.c_attn.bias";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return v;
    v.erase(v.begin() + s.d_model, v.begin() + 2 * s.d_model);
    return v;
}

// Every tensor of a whole-model vector (file order) against the state file's prefix.<name>.
void check_whole(const MoeRef& r, const std::string& what, const std::vector<float>& whole, const std::string& prefix,
                 bool final_weights, Worst* w) {
    const TempDir tmp("llmc_moe_parity");
    const std::string path = tmp.file("ours.safetensors");
    hf_write_weights(path, r.shape, whole);
    const SafetensorsReader ours(path);
    const SafetensorsReader model(r.model_path);
    CHECK(ours.entries().size() == model.entries().size());
    for (const auto& e : model.entries()) {
        const std::string& n = e.first;
        INFO("tensor " << n);
        REQUIRE(ours.has(n));
        REQUIRE(r.state->has(prefix + n));
        std::vector<float> a = ours.read(n), b = r.state->read(prefix + n);
        if (final_weights) {
            a = without_noise(r.shape, n, a);
            b = without_noise(r.shape, n, b);
        }
        check_tensor(r.name + ": " + what + " " + n, a, b, w);
    }
}

const char* kCases[] = {"moe_gpt2", "moe_llama_cap"};

}  // namespace

TEST_CASE("moe parity: parameter table, names and weight decay", "[moe]") {
    const std::string name = GENERATE(as<std::string>{}, kCases[0], kCases[1]);
    const MoeRef r = load(name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    REQUIRE(model.params.num_params == r.whole.size());
    int experts = 0, routers = 0;
    for (const ParamSpec& p : model.params.specs) {
        INFO("param " << p.name);
        CHECK(p.decay == (p.cols > 1));  // every 2-D weight decays (the reference's rule), no vector
        experts += p.expert >= 0;
        routers += p.role == RouterW;
        CHECK((p.expert >= 0 || p.role == RouterW) == (p.layer >= 0 && r.shape.moe.is_moe_layer(p.layer) &&
                                                       (p.role == RouterW || p.role == FcW || p.role == FcB ||
                                                        p.role == GateW || p.role == UpW || p.role == FcOutW ||
                                                        p.role == FcOutB)));
    }
    const int moe_layers = r.shape.n_layer / r.shape.moe.every;
    CHECK(routers == moe_layers);
    CHECK(experts == moe_layers * r.shape.moe.num_experts * (r.shape.arch == Arch::GPT2 ? 4 : 3));
    model.set_params_whole(r.whole.data());
    std::vector<float> back(r.whole.size());
    model.get_params_whole(back.data());
    CHECK(back == r.whole);
}

TEST_CASE("moe parity: logits, loss with the load-balancing term, drops, every gradient", "[moe]") {
    const std::string name = GENERATE(as<std::string>{}, kCases[0], kCases[1]);
    const MoeRef r = load(name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    // logits (an evaluation forward: dloss 0, no load-balancing statistics)
    model.forward(r.x.data(), r.y.data(), r.B, r.T, 0.0f);
    CHECK(model.take_moe_stats().aux_terms == 0);
    const int V = r.shape.vocab_size;
    std::vector<float> logits(size_t(r.B) * r.T * V);
    for (int b = 0; b < r.B; b++)
        for (int t = 0; t < r.T; t++) model.get_logits(b, t, &logits[(size_t(b) * r.T + t) * V]);
    Worst wl;
    check_tensor(name + ": logits", logits, r.state->read("logits"), &wl);
    // the training forward: the loss includes aux_loss_coef * aux
    model.zero_grads();
    const float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 1.0f / float(r.B * r.T));
    const Model::MoeStats st = model.take_moe_stats();
    const double ref_loss = r.state->read("loss")[0], ref_aux = r.state->read("aux")[0];
    INFO("loss " << loss << " reference " << ref_loss << "; aux " << st.aux_sum << " reference " << ref_aux);
    CHECK(close_rel(loss, ref_loss));
    CHECK(close_rel(st.aux_sum, ref_aux));
    CHECK(st.aux_terms == r.shape.n_layer / r.shape.moe.every);
    CHECK(st.dropped == (long long)r.state->read("dropped")[0]);
    CHECK((st.dropped > 0) == (r.shape.moe.capacity_factor > 0));
    model.backward();
    std::vector<float> grads(model.params.num_params);
    model.get_grads_whole(grads.data());
    Worst wg;
    check_whole(r, "gradient", grads, "grad.", false, &wg);
    WARN(name << ": logits max|diff| " << wl.max_abs << " (max-relative " << wl.rel_max << "), loss |diff| "
              << std::fabs(loss - ref_loss) << ", gradients max|diff| " << wg.max_abs << " (max-relative "
              << wg.rel_max << ")");
}

TEST_CASE("moe parity: 10 AdamW steps (losses, norms, weights)", "[moe]") {
    const std::string name = GENERATE(as<std::string>{}, kCases[0], kCases[1]);
    const MoeRef r = load(name);
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.whole.data());
    const size_t n = model.params.num_params;
    AdamW opt(wm.layout, *ops, 0, n, wm.store.params.slice(0, n), wm.store.grads.slice(0, n));
    const AdamWHyper h{r.lr, r.beta1, r.beta2, r.eps, r.weight_decay};
    const std::vector<float> losses = r.state->read("losses"), norms = r.state->read("grad_norms");
    REQUIRE(losses.size() == size_t(r.n_steps));
    double worst_loss = 0;
    for (int step = 1; step <= r.n_steps; step++) {
        model.zero_grads();
        const float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 1.0f / float(r.B * r.T));
        model.backward();
        const double norm = std::sqrt(ops->sum_squares(wm.store.grads.slice(0, n)));
        INFO("step " << step << ": loss " << loss << " / " << losses[size_t(step - 1)] << ", norm " << norm << " / "
                     << norms[size_t(step - 1)]);
        CHECK(close_rel(loss, losses[size_t(step - 1)]));
        CHECK(close_rel(norm, norms[size_t(step - 1)]));
        worst_loss = std::max(worst_loss, std::fabs(double(loss) - losses[size_t(step - 1)]));
        opt.step(h, step, clip_scale(norm, r.grad_clip), 0u);
    }
    std::vector<float> w(n);
    model.get_params_whole(w.data());
    Worst ww;
    check_whole(r, "weights after the steps", w, "final.", true, &ww);
    WARN(name << ": 10 steps: losses max|diff| " << worst_loss << ", final weights max|diff| " << ww.max_abs
              << " (max-relative " << ww.rel_max << ")");
}
