// test_gpu's model-level cases: optimizer offload (offload), the whole GPT-2 against the PyTorch
// reference state (reference), one training step of GPT-2 and Llama against the CPU and
// recomputation bit for bit (model_step). Part of test_gpu.cu.
#pragma once
#include <memory>

#include "llmc/model/optimizer.h"
#include "llmc/model/param_store.h"
#include "test/gpu/harness.h"
#include "test/ref_data.h"

namespace gpu_test {

// Optimizer offload (llmc/model/optimizer.h) against AdamW on the GPU, from the same state: 3 steps over
// a small model's whole buffer, streamed in pieces of 1000 elements (the last one short). The host
// kernel rounds differently from the device's (FMA contraction; the bias corrections' pow in fp32
// there, fp64 here), so moments and master agree to float rounding (norm-relative 1e-5); bf16
// parameters share the stochastic rounding's random bits (llmc/precision/bf16.h), so they are bitwise equal
// except where the two masters straddle a rounding step (at most 1% of them), and the padding
// past the tensors stays zero. First the asynchronous copies: a round trip through pinned memory,
// and a copy ordered after queued ops.
void test_offload(Ops& gpu, DType dt) {
    const std::string sh = strfmt("[%s]", dtype_name(dt));
    {
        const size_t n = 4099;
        std::vector<float> src(n);
        for (size_t i = 0; i < n; i++) src[i] = float(i) * 0.5f + 1.0f;
        float* pin = static_cast<float*>(gpu.alloc_host(n * 4));
        void* dev = gpu.alloc(n * 4);
        std::memcpy(pin, src.data(), n * 4);
        const uint64_t up = gpu.copy_from_host_async(dev, pin, n * 4);
        gpu.wait_copy(up);
        std::memset(pin, 0, n * 4);
        const uint64_t down = gpu.copy_to_host_async(pin, dev, n * 4);
        gpu.wait_copy(down);
        report(std::memcmp(pin, src.data(), n * 4) == 0 && up != 0 && down != up, "offload.async_copy_round_trip", sh,
               "");
        gpu.zero(Tensor(dev, n, DType::F32));                    // queued on the compute stream
        gpu.wait_copy(gpu.copy_to_host_async(pin, dev, n * 4));  // runs after it
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i++) nonzero += pin[i] != 0.0f;
        report(nonzero == 0, "offload.async_copy_after_queued_ops", sh, strfmt("nonzero=%zu", nonzero));
        gpu.release(dev);
        gpu.release_host(pin);
    }
    {  // order_after_copy (activation offload): the compute stream waits for a copy, the host does not.
        // 64 MiB, so that the copy outlasts the queued op that would race it without the wait.
        const size_t n = size_t(1) << 24;
        float* pin = static_cast<float*>(gpu.alloc_host(n * 4));
        void* dev = gpu.alloc(n * 4);
        void* dev2 = gpu.alloc(n * 4);
        for (size_t i = 0; i < n; i++) pin[i] = float(i % 1000) + 1.0f;
        const uint64_t up = gpu.copy_from_host_async(dev, pin, n * 4);
        gpu.order_after_copy(up);
        gpu.copy(Tensor(dev2, n, DType::F32), Tensor(dev, n, DType::F32));  // reads what the copy wrote
        const uint64_t down = gpu.copy_to_host_async(pin, dev2, n * 4);
        gpu.order_after_copy(down);
        gpu.zero(Tensor(dev2, n, DType::F32));  // overwrites what the copy reads
        gpu.wait_copy(down);
        gpu.synchronize();
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += pin[i] != float(i % 1000) + 1.0f;
        std::vector<float> back(16);
        gpu.to_host_f32(back.data(), Tensor(dev2, 16, DType::F32));
        report(wrong == 0 && back[0] == 0.0f, "offload.order_after_copy", sh,
               strfmt("%zu of %zu wrong after the round trip", wrong, n));
        gpu.release(dev2);
        gpu.release(dev);
        gpu.release_host(pin);
    }
    const ModelShape s{2, 2, 32, 200, 256, 16};
    const ParamLayout lay = param_layout(s, ModelLayout(), 1024);  // 34176 parameters padded to 34816
    WholeStore sa(gpu, lay, dt), sb(gpu, lay, dt);
    Model a(s, gpu, dt, 2, 8, sa), b(s, gpu, dt, 2, 8, sb);
    a.init_random(7);
    b.init_random(7);
    const size_t n = lay.padded_params;
    AdamW on_gpu(lay, gpu, 0, n, sa.params, sa.grads);
    AdamW offloaded(lay, gpu, 0, n, sb.params, sb.grads, OptimizerOffload{true, 1000});
    const AdamWHyper hyp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    Rng rng(11);
    for (int step = 1; step <= 3; step++) {
        std::vector<float> g(n);
        for (float& x : g) x = 0.1f * rng.normal();
        gpu.from_host_f32(sa.grads, g.data());
        gpu.from_host_f32(sb.grads, g.data());
        on_gpu.step(hyp, step, 0.5f, 42u + uint32_t(step));
        offloaded.step(hyp, step, 0.5f, 42u + uint32_t(step));
    }
    std::vector<float> ma, va, wa, mb, vb, wb;
    on_gpu.get_state(ma, va, wa);
    offloaded.get_state(mb, vb, wb);
    H::compare_vec("offload.m", sh, mb, ma, 1e-5);
    H::compare_vec("offload.v", sh, vb, va, 1e-5);
    if (dt != DType::F32) H::compare_vec("offload.master", sh, wb, wa, 1e-5);
    std::vector<float> pa(n), pb(n);
    gpu.to_host_f32(pa.data(), sa.params);
    gpu.to_host_f32(pb.data(), sb.params);
    H::compare_vec("offload.params", sh, pb, pa, dt == DType::F32 ? 1e-5 : 1e-2);
    if (dt == DType::F16) {  // both round the same master to the nearest half
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) differ += pa[i] != pb[i];
        report(differ <= n / 1000, "offload.params_nearest_half", sh, strfmt("differing=%zu of %zu", differ, n));
    }
    if (dt == DType::BF16) {
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) differ += pa[i] != pb[i];
        report(differ <= n / 100, "offload.params_bitwise_but_rounding_straddles", sh,
               strfmt("differing=%zu of %zu", differ, n));
    }
    size_t padding = 0;  // the buffer past the tensors stays zero
    for (size_t i = lay.num_params; i < n; i++) padding += pb[i] != 0.0f;
    report(n > lay.num_params && padding == 0, "offload.padding_untouched", sh,
           strfmt("nonzero=%zu of %zu", padding, n - lay.num_params));
}


// The whole GPT-2 on the GPU (fp32) against the committed PyTorch debug state (test/ref_data.h;
// test/test_parity.cpp holds the CPU backend to it at 1e-5): the loss and every logit of the
// batch, every parameter's gradient, and the losses and gradient norms of the reference's AdamW
// steps (clipped as the script clips), to 1e-4 relative.
void test_reference(Ops& gpu) {
    const std::string sh = "[fp32 test/data/ref_state.bin]";
    RefData r;
    std::string err = "test/data/ref_model.bin and ref_state.bin not found (run from the repository root)";
    for (const char* dir : {"test/data/", "../test/data/"})
        if (FILE* f = std::fopen((std::string(dir) + "ref_model.bin").c_str(), "rb")) {
            std::fclose(f);
            err = load_ref_data(std::string(dir) + "ref_model.bin", std::string(dir) + "ref_state.bin", r);
            break;
        }
    if (!err.empty()) {
        report(false, "reference.files", sh, err);
        return;
    }
    const ModelShape& s = r.shape;
    const int B = r.B, T = r.T, steps = r.n_steps, V = s.vocab_size;
    const size_t N = (size_t)B * T;
    const double tol = 1e-4;
    auto close = [&](double a, double b) { return std::fabs(a - b) <= tol * std::fabs(b); };
    WholeModel wm(s, gpu, B, T);
    Model& model = wm.model;
    model.set_params_whole(r.weights.data());
    const float loss = model.forward(r.x.data(), r.y.data(), B, T, 0.0f);  // dloss 0: the logits stay
    report(close(loss, r.loss), "reference.loss", sh, strfmt("gpu=%.9g ref=%.9g", loss, r.loss));
    std::vector<float> got(N * V);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) model.get_logits(b, t, &got[((size_t)b * T + t) * V]);
    H::compare_vec("reference.logits", sh, got, r.logits, tol);
    const float dloss = 1.0f / (float)N;
    model.zero_grads();
    model.forward(r.x.data(), r.y.data(), B, T, dloss);
    model.backward();
    std::vector<float> g(r.num_params);
    model.get_grads_whole(g.data());
    H::compare_vec("reference.grads", sh, g, r.grads, tol);
    // the reference's AdamW steps, the same batch every step (as test_parity.cpp does on the CPU)
    model.set_params_whole(r.weights.data());
    float* m = static_cast<float*>(gpu.alloc(model.params.num_params * sizeof(float)));
    float* v = static_cast<float*>(gpu.alloc(model.params.num_params * sizeof(float)));
    gpu.zero(Tensor(m, model.params.num_params, DType::F32));
    gpu.zero(Tensor(v, model.params.num_params, DType::F32));
    double worst_loss = 0, worst_norm = 0;
    for (int step = 1; step <= steps; step++) {
        model.zero_grads();
        const float l = model.forward(r.x.data(), r.y.data(), B, T, dloss);
        model.backward();
        double ss = 0;
        for (const ParamSpec& p : model.params.specs) ss += gpu.sum_squares(wm.store.grads.slice(p.offset, p.numel));
        const double norm = std::sqrt(ss);
        const float coef = std::min(1.0f, r.grad_clip / ((float)norm + 1e-6f));
        // (a NaN difference sticks: it must fail, not vanish in a max)
        const double dl = std::fabs((double)l - r.losses[step - 1]) / std::fabs((double)r.losses[step - 1]);
        const double dn = std::fabs(norm - r.grad_norms[step - 1]) / std::fabs((double)r.grad_norms[step - 1]);
        if (!(dl <= worst_loss)) worst_loss = dl;
        if (!(dn <= worst_norm)) worst_norm = dn;
        for (const ParamSpec& p : model.params.specs)
            gpu.adamw(wm.store.params.slice(p.offset, p.numel), nullptr, wm.store.grads.slice(p.offset, p.numel),
                      m + p.offset, v + p.offset, r.lr, r.beta1, r.beta2, r.eps, p.decay ? r.weight_decay : 0.0f, coef,
                      step, 0u);
    }
    gpu.release(m);
    gpu.release(v);
    report(steps > 0 && worst_loss <= tol, "reference.adamw_losses", sh,
           strfmt("%d steps, worst relative difference %.3e tol=%.0e", steps, worst_loss, tol));
    report(steps > 0 && worst_norm <= tol, "reference.adamw_grad_norms", sh,
           strfmt("%d steps, worst relative difference %.3e tol=%.0e", steps, worst_norm, tol));
}

// One whole training step of a small model (fp32), the GPU backend against the CPU backend from
// the same random parameters and tokens: the loss, every gradient, and the loss after one AdamW
// step. Head size 16 (the CUDA attention's smallest). GPT-2, and Llama with grouped-query attention.
void test_model_step(Ops& cpu, Ops& gpu, const ModelShape& s, const char* name) {
    const std::string sh = strfmt("[fp32 %s L=%d H=%d KV=%d C=%d V=%d]", name, s.n_layer, s.n_head, s.kv_heads(),
                                  s.d_model, s.vocab_size);
    const int B = 2, T = 16;
    WholeModel wc(s, cpu, B, T), wg(s, gpu, B, T);
    const size_t np = wc.model.params.num_params;
    Rng rng(11);
    std::vector<float> w(np);
    for (float& x : w) x = 0.05f * rng.normal();
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; i++) x[i] = rng.below(s.vocab_size), y[i] = rng.below(s.vocab_size);
    const float dloss = 1.0f / (float)(B * T);
    float loss[2][2];
    std::vector<float> grads[2];
    Ops* ops[2] = {&cpu, &gpu};
    WholeModel* wm[2] = {&wc, &wg};
    for (int k = 0; k < 2; k++) {
        Model& m = wm[k]->model;
        m.set_params_whole(w.data());
        m.zero_grads();
        loss[k][0] = m.forward(x.data(), y.data(), B, T, dloss);
        m.backward();
        grads[k].resize(np);
        m.get_grads_whole(grads[k].data());
        float* mom = static_cast<float*>(ops[k]->alloc(np * sizeof(float)));
        float* var = static_cast<float*>(ops[k]->alloc(np * sizeof(float)));
        for (const ParamSpec& p : m.params.specs)
            ops[k]->adamw(wm[k]->store.params.slice(p.offset, p.numel), nullptr, wm[k]->store.grads.slice(p.offset, p.numel),
                          mom + p.offset, var + p.offset, 1e-3f, 0.9f, 0.95f, 1e-8f, p.decay ? 0.1f : 0.0f, 1.0f, 1, 0u);
        loss[k][1] = m.forward(x.data(), y.data(), B, T, 0.0f);
        ops[k]->release(mom);
        ops[k]->release(var);
    }
    for (int i = 0; i < 2; i++) {
        const double d = std::fabs((double)loss[1][i] - loss[0][i]) / std::fabs((double)loss[0][i]);
        report(d <= 1e-5, i ? "model_step.loss_after_adamw" : "model_step.loss", sh,
               strfmt("gpu=%.9g cpu=%.9g rel=%.2e tol=1e-05", loss[1][i], loss[0][i], d));
    }
    H::compare_vec("model_step.grads", sh, grads[1], grads[0], 1e-4);

    // Activation offload (llmc/model/model.h) on the GPU backend: full recompute with the kept layer
    // inputs through pinned host memory against full recompute without, two micro-batches in flight
    // (their backwards in reverse order, as a pipeline runs them), bit for bit: the copies run on the
    // copy streams beside the compute stream, so a missing wait shows as a different loss or gradient.
    const ParamLayout lay = param_layout(s, ModelLayout(), 1);
    float off_loss[2][2];
    std::vector<float> off_grads[2];
    OpsCounters moved[2];
    for (int k = 0; k < 2; k++) {
        WholeStore store(gpu, lay, DType::F32);
        Model m(s, gpu, DType::F32, B, T, store, ModelLayout(), nullptr, {2}, Recompute::Full, nullptr, nullptr, k == 1);
        m.set_params_whole(w.data());
        m.zero_grads();
        const OpsCounters before = gpu.counters();
        off_loss[k][0] = m.forward_chunk(0, 0, x.data(), y.data(), B, T, dloss);
        off_loss[k][1] = m.forward_chunk(0, 1, y.data(), x.data(), B, T, dloss);
        m.backward_chunk(0, 1);
        m.backward_chunk(0, 0);
        moved[k] = gpu.counters() - before;
        off_grads[k].resize(np);
        m.get_grads_whole(off_grads[k].data());
    }
    size_t differ = 0;
    for (size_t i = 0; i < np; i++) differ += std::memcmp(&off_grads[0][i], &off_grads[1][i], sizeof(float)) != 0;
    // each micro-batch's layer inputs down once and up once
    const uint64_t kept = uint64_t(2) * s.n_layer * B * T * s.d_model * sizeof(float);
    const uint64_t down = moved[1].d2h_bytes - moved[0].d2h_bytes, up = moved[1].h2d_bytes - moved[0].h2d_bytes;
    report(std::memcmp(off_loss[0], off_loss[1], sizeof off_loss[0]) == 0 && differ == 0 && down == kept && up == kept,
           "model_step.activation_offload_bitwise", sh,
           strfmt("losses %.9g %.9g vs %.9g %.9g, %zu of %zu gradients differ, %llu B down and %llu B up (want %llu)",
                  off_loss[1][0], off_loss[1][1], off_loss[0][0], off_loss[0][1], differ, np,
                  (unsigned long long)down, (unsigned long long)up, (unsigned long long)kept));
}

// Activation recomputation on the CUDA backend: a bf16 GPT-2 step (forward and backward) with
// train.recompute selective and full gives bitwise the loss and gradients of none. The MLP's GELU
// runs in the fc GEMM's epilogue (GELU_AUX_BIAS, on the unrounded pre-activation), so selective
// must run that GEMM again: a GELU of the kept bf16 pre-activation differs in the last bits.
void test_model_recompute(Ops& gpu) {
    ModelShape s{2, 2, 32, 100, 128, 16};
    const int B = 2, T = 16;
    const std::string sh = strfmt("[bf16 gpt2 L=%d C=%d]", s.n_layer, s.d_model);
    const ParamLayout layout = param_layout(s, ModelLayout(), 1);
    Rng rng(5);
    std::vector<float> w;
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; i++) x[i] = rng.below(s.vocab_size), y[i] = rng.below(s.vocab_size);
    float loss[3];
    std::vector<uint8_t> grads[3];
    const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
    for (int k = 0; k < 3; k++) {
        WholeStore store(gpu, layout, DType::BF16);
        Model m(s, gpu, DType::BF16, B, T, store, ModelLayout(), nullptr, {}, modes[k]);
        if (w.empty()) {
            w.resize(m.params.num_params);
            for (float& v : w) v = 0.05f * rng.normal();
        }
        m.set_params_whole(w.data());
        m.zero_grads();
        loss[k] = m.forward(x.data(), y.data(), B, T, 1.0f / (B * T));
        m.backward();
        gpu.synchronize();
        grads[k].resize(store.grads.bytes());
        gpu.to_host_bytes(grads[k].data(), store.grads.ptr, grads[k].size());
    }
    for (int k = 1; k < 3; k++) {
        size_t diff = 0;
        for (size_t i = 0; i < grads[0].size(); i++) diff += grads[k][i] != grads[0][i];
        const char* name = k == 1 ? "model_step.recompute_selective" : "model_step.recompute_full";
        report(loss[k] == loss[0] && diff == 0, name, sh,
               strfmt("loss %.9g vs none %.9g, %zu of %zu gradient bytes differ", loss[k], loss[0], diff,
                          grads[0].size()));
    }
}

}  // namespace gpu_test
