// Parity of the CPU backend with an independent PyTorch implementation.
//
// The reference: test/data/ref_model.bin and ref_state.bin (format and origin: test/ref_data.h).
//
// Metric, per tensor (a = ours, b = reference), both must hold:
//   norm-relative  ||a - b||_2 / ||b||_2            <= 1e-5
//   max-relative   max_i |a_i - b_i| / max_i |b_i|  <= 1e-5
// Losses (and gradient norms): |a - b| <= 1e-5 * |b|.
//
// AdamW (as in the script, run twice: directly over Ops::adamw, and through llmc/model/optimizer.h): global-norm clip coef = min(1, clip / (norm + 1e-6)) applied to
// the gradients, bias-corrected moments, decoupled weight decay only on the 2-D weights.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/model/model.h"
#include "llmc/backend/ops.h"
#include "llmc/model/optimizer.h"

#include "test/ref_data.h"
#include "test/test_data_files.h"
#include "test/whole_model.h"

namespace {

constexpr double kTol = 1e-5;

const RefData& ref_data() {
    static std::unique_ptr<RefData> cached;
    if (cached) return *cached;
    auto r = std::make_unique<RefData>();
    const std::string err = load_ref_data(find_data_file("ref_model.bin"), find_data_file("ref_state.bin"), *r);
    INFO(err);
    REQUIRE(err.empty());
    cached = std::move(r);
    return *cached;
}

// The llm.c checkpoint layout, computed here independently of the model's table.
struct Slice {
    std::string name;
    size_t offset, numel;
};

std::vector<Slice> llmc_slices(const ModelShape& s) {
    const size_t C = s.d_model, L = s.n_layer, Vp = s.padded_vocab, maxT = s.max_seq_len;
    struct Kind {
        const char* name;
        size_t per_layer;  // 0: not per layer
        size_t total;
    };
    const Kind kinds[] = {{"wte", 0, Vp * C},           {"wpe", 0, maxT * C},
                          {"ln1w", C, L * C},           {"ln1b", C, L * C},
                          {"qkvw", 3 * C * C, 0},       {"qkvb", 3 * C, 0},
                          {"attprojw", C * C, 0},       {"attprojb", C, 0},
                          {"ln2w", C, 0},               {"ln2b", C, 0},
                          {"fcw", 4 * C * C, 0},        {"fcb", 4 * C, 0},
                          {"fcprojw", 4 * C * C, 0},    {"fcprojb", C, 0},
                          {"lnfw", 0, C},               {"lnfb", 0, C}};
    std::vector<Slice> out;
    size_t off = 0;
    for (const Kind& k : kinds) {
        if (k.per_layer) {
            for (size_t l = 0; l < L; l++) {
                out.push_back({"h." + std::to_string(l) + "." + k.name, off, k.per_layer});
                off += k.per_layer;
            }
        } else {
            out.push_back({k.name, off, k.total});
            off += k.total;
        }
    }
    return out;
}

struct Err {
    double rel_norm, rel_max;
};

Err compare(const float* a, const float* b, size_t n) {
    double d2 = 0, b2 = 0, dmax = 0, bmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        d2 += d * d;
        b2 += static_cast<double>(b[i]) * b[i];
        dmax = std::max(dmax, std::fabs(d));
        bmax = std::max(bmax, std::fabs(static_cast<double>(b[i])));
    }
    Err e;
    // An all-zero reference must be matched exactly (up to denormals).
    e.rel_norm = b2 > 0 ? std::sqrt(d2 / b2) : (d2 > 1e-60 ? INFINITY : 0.0);
    e.rel_max = bmax > 0 ? dmax / bmax : (dmax > 1e-30 ? INFINITY : 0.0);
    return e;
}

void check_tensor(const std::string& name, const float* ours, const float* ref, size_t n) {
    Err e = compare(ours, ref, n);
    INFO("tensor " << name << " (" << n << " elements): norm-relative error " << e.rel_norm
                   << ", max-abs error / max|ref| " << e.rel_max);
    CHECK(e.rel_norm <= kTol);
    CHECK(e.rel_max <= kTol);
}

bool close_rel(double a, double b) { return std::fabs(a - b) <= kTol * std::fabs(b); }

}  // namespace

TEST_CASE("parity: reference files are consistent", "[parity]") {
    const RefData& r = ref_data();
    REQUIRE(r.shape.padded_vocab % 128 == 0);
    REQUIRE(r.T <= r.shape.max_seq_len);
    auto slices = llmc_slices(r.shape);
    REQUIRE(slices.back().offset + slices.back().numel == r.num_params);
    // padded wte rows are zero in the weights and in the gradients
    const size_t C = r.shape.d_model;
    for (size_t i = static_cast<size_t>(r.shape.vocab_size) * C; i < static_cast<size_t>(r.shape.padded_vocab) * C;
         i++) {
        REQUIRE(r.weights[i] == 0.0f);
        REQUIRE(r.grads[i] == 0.0f);
    }
    REQUIRE(r.losses[0] == r.loss);
}

TEST_CASE("parity: model parameter table matches the llm.c layout", "[parity]") {
    const RefData& r = ref_data();
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    REQUIRE(model.params.num_params == r.num_params);
    // set_params_whole / get_params_whole round-trip exactly
    model.set_params_whole(r.weights.data());
    std::vector<float> back(r.num_params);
    model.get_params_whole(back.data());
    REQUIRE(std::memcmp(back.data(), r.weights.data(), r.num_params * sizeof(float)) == 0);
    // decay exactly on the 2-D weights
    for (const ParamSpec& p : model.params.specs) {
        INFO("param " << p.name);
        bool want = p.role == TokEmb || p.role == PosEmb || p.role == QkvW || p.role == AttnOutW || p.role == FcW ||
                    p.role == FcOutW;
        CHECK(p.decay == want);
    }
}

TEST_CASE("parity: forward logits and loss match the PyTorch reference", "[parity]") {
    const RefData& r = ref_data();
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.weights.data());
    float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 0.0f);
    INFO("loss " << loss << " reference " << r.loss);
    CHECK(close_rel(loss, r.loss));

    const int V = r.shape.vocab_size;
    std::vector<float> logits(static_cast<size_t>(r.B) * r.T * V);
    for (int b = 0; b < r.B; b++)
        for (int t = 0; t < r.T; t++) model.get_logits(b, t, &logits[(static_cast<size_t>(b) * r.T + t) * V]);
    check_tensor("logits", logits.data(), r.logits.data(), logits.size());
}

TEST_CASE("parity: every parameter gradient matches the PyTorch reference", "[parity]") {
    const RefData& r = ref_data();
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.weights.data());
    model.zero_grads();
    float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, 1.0f / (r.B * r.T));
    CHECK(close_rel(loss, r.loss));
    model.backward();
    std::vector<float> grads(r.num_params);
    model.get_grads_whole(grads.data());
    for (const Slice& s : llmc_slices(r.shape))
        check_tensor(s.name + " grad", grads.data() + s.offset, r.grads.data() + s.offset, s.numel);
    check_tensor("all grads", grads.data(), r.grads.data(), r.num_params);
}

TEST_CASE("parity: 10 AdamW steps match the PyTorch reference losses", "[parity]") {
    const RefData& r = ref_data();
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.weights.data());
    // The optimizer written directly over Ops (llmc/model/optimizer.h may replace this loop).
    float* m = static_cast<float*>(ops->alloc(model.params.num_params * sizeof(float)));
    float* v = static_cast<float*>(ops->alloc(model.params.num_params * sizeof(float)));
    const float dloss = 1.0f / (r.B * r.T);
    for (int step = 1; step <= r.n_steps; step++) {
        model.zero_grads();
        float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, dloss);
        model.backward();
        double ss = 0;
        for (const ParamSpec& p : model.params.specs) ss += ops->sum_squares(wm.store.grads.slice(p.offset, p.numel));
        const double norm = std::sqrt(ss);
        const float coef = std::min(1.0f, r.grad_clip / (static_cast<float>(norm) + 1e-6f));
        {
            INFO("step " << step << ": loss " << loss << " reference " << r.losses[step - 1]);
            CHECK(close_rel(loss, r.losses[step - 1]));
        }
        {
            INFO("step " << step << ": grad norm " << norm << " reference " << r.grad_norms[step - 1]);
            CHECK(close_rel(norm, r.grad_norms[step - 1]));
        }
        for (const ParamSpec& p : model.params.specs) {
            ops->adamw(wm.store.params.slice(p.offset, p.numel), nullptr, wm.store.grads.slice(p.offset, p.numel),
                       m + p.offset, v + p.offset, r.lr, r.beta1, r.beta2, r.eps, p.decay ? r.weight_decay : 0.0f,
                       coef, step, 0u);
        }
    }
    ops->release(m);
    ops->release(v);
}

TEST_CASE("parity: 10 steps of the AdamW optimizer class match the PyTorch reference losses", "[parity]") {
    const RefData& r = ref_data();
    auto ops = make_cpu_ops();
    WholeModel wm(r.shape, *ops, r.B, r.T);
    Model& model = wm.model;
    model.set_params_whole(r.weights.data());
    AdamW opt(wm.layout, *ops, 0, model.params.num_params, wm.store.params.slice(0, model.params.num_params),
              wm.store.grads.slice(0, model.params.num_params));
    const AdamWHyper h{r.lr, r.beta1, r.beta2, r.eps, r.weight_decay};
    const float dloss = 1.0f / (r.B * r.T);
    for (int step = 1; step <= r.n_steps; step++) {
        model.zero_grads();
        float loss = model.forward(r.x.data(), r.y.data(), r.B, r.T, dloss);
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
}
