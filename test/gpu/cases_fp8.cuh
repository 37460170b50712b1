// test_gpu's fp8 filter: CudaFp8 (casts, cuBLASLt's fp8 GEMMs, the device scaling state) against
// the CPU's exact emulation of the recipe. Part of test_gpu.cu.
#pragma once
#include <random>

#include "test/gpu/harness.h"

namespace gpu_test {

// FP8 matmuls: CUDA (fp8 casts, cuBLASLt fp8 GEMM) against the CPU's exact emulation. Both
// cast the same values with the same scales, so they differ only by the GEMM's accumulation
// order and the output rounding, except that a value upstream of a cast that differs in its
// last bit (bf16 GELU'd dout, or the current recipe's scale from it) can land on the other
// side of an fp8 rounding boundary: hence tolerances of 5e-3 (fp32) and 5e-2 (bf16). Layout
// or scale mistakes give errors of order 1. Amaxes are compared exactly where their tensor is
// the same on both sides.
// `off` > 0 places the outputs (out, pre_gelu, dinp, dw) `off` elements past an aligned address
// (a parameter slice can sit so): cuBLASLt's fp8 GEMM takes only 16-byte aligned C/D, so these
// run the GEMM into the fp32 scratch and add from there (CudaFp8::gemm's second way).
// `off_in` > 0 places the cast inputs (inp, w, dout) so: the casts then go element by element
// (cast_kernel; aligned inputs take cast_vec_kernel).
// `inp_gelu`: inp is a GELU's pre-activation, the GELU applied in its casts (Fp8Cast::gelu, as the
// model's fc_proj in fp8), in each backend's own fp32 GELU: its amax is compared to 1e-5.
void test_fp8_matmul(H& h, int N, int IC, int OC, bool has_bias, bool gelu, bool current, bool hybrid,
                     int off = 0, int off_in = 0, bool inp_gelu = false) {
    const std::string sh =
        strfmt("[%s N=%d IC=%d OC=%d bias=%d gelu=%d %s %s%s%s%s]", dtype_name(h.dt), N, IC, OC, (int)has_bias,
               (int)gelu, current ? "current" : "delayed", hybrid ? "hybrid" : "e4m3",
               off ? strfmt(" outputs+%d", off).c_str() : "", off_in ? strfmt(" inputs+%d", off_in).c_str() : "",
               inp_gelu ? " inp_gelu" : "");
    const double tol = h.low() ? 5e-2 : 5e-3;
    const size_t no = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)OC * IC;
    Pair inp = h.make_at(ni, off_in), w = h.make_at(nw, off_in), out = h.make_at(no, off),
         pre = h.make_at(no, off), bias = h.make(OC);
    Pair amax = h.make(3, true);
    const float wsig = 1.0f / std::sqrt((float)IC);
    h.up(inp, h.rnd(ni, 1.0f));
    h.up(w, h.rnd(nw, wsig));
    h.up(bias, h.rnd(OC, 0.5f));
    const Fp8Format gf = hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3;
    // delayed: scales that put about 3.5 sigma at the format's max (a few values saturate);
    // current: fallbacks the ops must not need
    auto cast = [&](Fp8Format f, float sigma, float* a) {
        Fp8Cast c;
        c.format = f;
        c.scale = current ? 1.0f : fp8_max(f) / (3.5f * sigma);
        c.current = current;
        c.margin = current ? 1 : 0;
        c.amax = a;
        return c;
    };
    auto cast_inp = [&](float* a) {
        Fp8Cast c = cast(Fp8Format::E4M3, 1.0f, a);
        c.gelu = inp_gelu;
        return c;
    };
    const std::vector<float> zeros(3, 0.0f);
    auto exact = [&](const std::string& name, std::vector<float> g, const std::vector<float>& c) {
        if (inp_gelu) {  // the input's amax is of each backend's GELU
            H::compare_vec(name + "_input", sh, {g[0]}, {c[0]}, 1e-5);
            g[0] = c[0];
        }
        report(g == c, name, sh, strfmt("gpu=%.9g,%.9g,%.9g cpu=%.9g,%.9g,%.9g", g[0], g[1], g[2], c[0], c[1], c[2]));
    };
    Tensor bc = has_bias ? bias.c : Tensor(), bg = has_bias ? bias.g : Tensor();
    Tensor pc = gelu ? pre.c : Tensor(), pg = gelu ? pre.g : Tensor();

    h.up(amax, zeros);
    h.cpu.matmul_forward_fp8(out.c, pc, inp.c, w.c, bc, N, IC, OC, gelu, cast_inp(amax.c.f32()),
                             cast(Fp8Format::E4M3, wsig, amax.c.f32() + 1));
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(pre);
        h.up_gpu(amax, zeros);
        h.gpu.matmul_forward_fp8(out.g, pg, inp.g, w.g, bg, N, IC, OC, gelu, cast_inp(amax.g.f32()),
                                 cast(Fp8Format::E4M3, wsig, amax.g.f32() + 1));
        r[rep] = gelu ? h.raw({out, pre, amax}) : h.raw({out, amax});
    }
    h.det("matmul_forward_fp8", sh, r[0], r[1]);
    const std::vector<uint8_t> fwd_plain = r[0];
    H::compare_vec("matmul_forward_fp8.out", sh, h.get_gpu(out), h.get_cpu(out), tol);
    if (gelu) H::compare_vec("matmul_forward_fp8.pre_gelu", sh, h.get_gpu(pre), h.get_cpu(pre), tol);
    exact("matmul_forward_fp8.amax", h.get_gpu(amax), h.get_cpu(amax));

    // backward: dinp overwrite (poisoned), dw/dbias accumulate, dout modified in place with gelu
    Pair dout = h.make_at(no, off_in), dinp = h.make_at(ni, off), dw = h.make_at(nw, off), dbias = h.make(OC);
    auto dout0 = h.rnd(no, 1.0f), dw0 = h.rnd(nw, 1.0f), db0 = h.rnd(OC, 1.0f);
    const std::vector<float> pre_b = h.rnd(no, 1.5f);
    h.up(pre, pre_b);
    h.up(dout, dout0), h.up(dw, dw0), h.up(dbias, db0), h.up(amax, zeros);
    Tensor dbc = has_bias ? dbias.c : Tensor(), dbg = has_bias ? dbias.g : Tensor();
    auto bwd_casts = [&](float* a) {
        return std::vector<Fp8Cast>{cast(gf, 1.0f, a + 2), cast_inp(a), cast(Fp8Format::E4M3, wsig, a + 1)};
    };
    auto cc = bwd_casts(amax.c.f32());
    h.cpu.matmul_backward_fp8(dinp.c, dw.c, dbc, dout.c, inp.c, w.c, pc, N, IC, OC, cc[0], cc[1], cc[2]);
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(dout, dout0), h.up_gpu(dw, dw0), h.up_gpu(dbias, db0), h.up_gpu(amax, zeros);
        h.poison(dinp);
        auto cg = bwd_casts(amax.g.f32());
        h.gpu.matmul_backward_fp8(dinp.g, dw.g, dbg, dout.g, inp.g, w.g, pg, N, IC, OC, cg[0], cg[1], cg[2]);
        r[rep] = h.raw({dinp, dw, dbias, dout, amax});
    }
    h.det("matmul_backward_fp8", sh, r[0], r[1]);
    const std::vector<uint8_t> bwd_plain = h.raw({dinp, dw, dbias});
    const std::vector<float> amax_plain = h.get_gpu(amax);
    H::compare_vec("matmul_backward_fp8.dinp", sh, h.get_gpu(dinp), h.get_cpu(dinp), tol);
    // dw accumulates onto N(0,1) values: compare the increments, which carry the fp8 GEMM
    auto dwg = h.get_gpu(dw), dwc = h.get_cpu(dw);
    for (size_t i = 0; i < nw; i++) dwg[i] -= dw0[i], dwc[i] -= dw0[i];
    H::compare_vec("matmul_backward_fp8.dw_increment", sh, dwg, dwc, tol);
    if (has_bias) h.compare("matmul_backward_fp8.dbias", sh, dbias);
    auto ag = h.get_gpu(amax), ac = h.get_cpu(amax);
    if (gelu) {  // dout's amax is of the GELU'd dout, computed in each backend's own precision
        H::compare_vec("matmul_backward_fp8.amax_dout", sh, {ag[2]}, {ac[2]}, h.low() ? 1e-2 : 1e-5);
        ag[2] = ac[2];
    }
    exact("matmul_backward_fp8.amax", ag, ac);

    // Fp8Stash (the model's way): the forward also writes inp's transposed cast and 1/s there, the
    // backward reads them instead of casting inp again: the same bits as without (CUDA's backward
    // then records no input amax, the forward did; the CPU keeps no stash and casts again)
    {
        const bool keeps = h.gpu.name() != h.cpu.name();
        Pair stq = h.make((ni + 3) / 4, true), sti = h.make(4, true);
        const Fp8Stash st{stq.g.ptr, sti.g.f32()};
        h.poison(out), h.poison(pre), h.poison(stq), h.poison(sti);
        h.up_gpu(amax, zeros);
        h.gpu.matmul_forward_fp8(out.g, pg, inp.g, w.g, bg, N, IC, OC, gelu, cast_inp(amax.g.f32()),
                                 cast(Fp8Format::E4M3, wsig, amax.g.f32() + 1), st);
        h.det("matmul_forward_fp8_stash", sh, fwd_plain, gelu ? h.raw({out, pre, amax}) : h.raw({out, amax}));
        h.up_gpu(pre, pre_b), h.up_gpu(dout, dout0), h.up_gpu(dw, dw0), h.up_gpu(dbias, db0), h.up_gpu(amax, zeros);
        h.poison(dinp);
        auto cg = bwd_casts(amax.g.f32());
        h.gpu.matmul_backward_fp8(dinp.g, dw.g, dbg, dout.g, inp.g, w.g, pg, N, IC, OC, cg[0], cg[1], cg[2], st);
        h.det("matmul_backward_fp8_stash", sh, bwd_plain, h.raw({dinp, dw, dbias}));
        const std::vector<float> a = h.get_gpu(amax);
        const float want0 = keeps ? 0.0f : amax_plain[0];
        report(a[0] == want0 && a[1] == amax_plain[1] && a[2] == amax_plain[2], "matmul_backward_fp8_stash.amax", sh,
               strfmt("input %g (want %g), weight %g (%g), output gradient %g (%g)", a[0], want0, a[1],
                      amax_plain[1], a[2], amax_plain[2]));
    }
}

// The trainer's fp8 scaling state on the backend (Fp8Device, Ops::fp8_widen_amaxes and
// fp8_update_scales) against the host state's update, bit for bit: 300 tensors (more than the
// update kernel's block of threads), a 5-step history and the current recipe, zeros, inf and NaN
// amaxes, the widened (several ranks') form every other step; and a cast that reads its scale from
// backend memory (Fp8Cast::scale_at) gives the same codes as one given the value.
void test_fp8_scales(H& h) {
    for (const char* recipe : {"delayed", "current"}) {
        const std::string sh = strfmt("[%s %s]", dtype_name(h.dt), recipe);
        Fp8Config cfg;
        cfg.recipe = recipe;
        cfg.amax_history = 5;
        cfg.margin = 1;
        Fp8State host(25, fp8_options(cfg));
        const int n = host.size(), H = host.image_history();
        // the state in one block as Fp8Converter holds it (fp8_device_in), the step's word beside it
        const size_t ni = size_t(n) * kFp8InvStride;
        void* block = h.gpu.alloc(fp8_device_bytes(n, H));
        const Fp8Device d = fp8_device_in(block, n, H, 1, true);
        float* f = d.scale;
        float* word = static_cast<float*>(h.gpu.alloc(sizeof(float)));
        std::vector<float> img(fp8_image_floats(n, H), 0.0f);
        host.export_image(img.data(), img.data() + n);
        h.gpu.from_host_bytes(f, img.data(), img.size() * 4);
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> ud(1e-3f, 1e3f);
        bool same = true;
        std::string first;
        for (int step = 0; step < 7; step++) {
            std::vector<float> a(n);
            for (float& x : a) x = ud(rng);
            if (step == 1) a[0] = 0.0f, a[299] = INFINITY;
            if (step == 3) a[257] = NAN, a[5] = 0.0f;
            if (step == 5) a[100] = NAN;
            const int bad = host.update(a.data());
            h.gpu.from_host_bytes(d.amax, a.data(), a.size() * 4);
            const bool widened = step % 2 == 1;
            if (widened) h.gpu.fp8_widen_amaxes(d);
            h.gpu.fp8_update_scales(d, widened, word);
            std::vector<float> got(img.size() + 1), want(img.size());
            h.gpu.to_host_bytes(got.data(), f, img.size() * 4);
            h.gpu.to_host_bytes(&got[img.size()], word, 4);
            host.export_image(want.data(), want.data() + n);
            std::vector<float> inv(ni);
            h.gpu.to_host_bytes(inv.data(), d.inv, ni * 4);
            bool inv_ok = true;  // 1/scale beside every scale (the delayed casts' GEMM scale pointers)
            for (int i = 0; i < n; i++) inv_ok = inv_ok && inv[size_t(i) * kFp8InvStride] == 1.0f / want[i];
            const bool ok = std::memcmp(got.data(), want.data(), size_t(n) * (H + 1) * 4) == 0 && got[img.size()] == bad &&
                            inv_ok;
            if (!ok && same) first = strfmt("step %d: overflows %g (want %d)", step, got[img.size()], bad);
            same = same && ok;
            if (step == 6) {  // the overflow counters: one for each non-finite amax, on its tensor
                const uint32_t* o = reinterpret_cast<const uint32_t*>(got.data() + size_t(n) * (H + 1));
                const bool counts = o[299] == 1 && o[257] == 1 && o[100] == 1 && o[0] == 0 && o[5] == 0;
                report(counts, "fp8_update_scales.overflow_counters", sh,
                       strfmt("%u %u %u %u %u", o[299], o[257], o[100], o[0], o[5]));
            }
        }
        report(same, "fp8_update_scales.equals_host_state", sh, first);
        // a cast with scale_at = the same scale in backend memory (and, delayed, inv_at = its inverse:
        // no scale kernel): the same outputs and amaxes
        const int N = 32, IC = 64, OC = 48;
        Pair inp = h.make((size_t)N * IC), w = h.make((size_t)OC * IC), out = h.make((size_t)N * OC), amax = h.make(2, true);
        h.up(inp, h.rnd((size_t)N * IC, 1.0f));
        h.up(w, h.rnd((size_t)OC * IC, 0.1f));
        const float scales[2] = {37.5f, 1024.0f};
        h.gpu.from_host_bytes(d.scale, scales, sizeof(scales));
        for (int i = 0; i < 2; i++) {
            const float v = 1.0f / scales[i];
            h.gpu.from_host_bytes(d.inv + i * kFp8InvStride, &v, sizeof(v));
        }
        std::vector<uint8_t> r[2];
        for (int by_pointer = 0; by_pointer < 2; by_pointer++) {
            h.up_gpu(amax, {0.0f, 0.0f});
            h.poison(out);
            Fp8Cast ci, cw;
            ci.current = cw.current = std::string(recipe) == "current";
            ci.amax = amax.g.f32(), cw.amax = amax.g.f32() + 1;
            if (by_pointer) ci.scale_at = d.scale, cw.scale_at = d.scale + 1;  // (ci.scale, cw.scale stay 1: unread)
            if (by_pointer && !ci.current) ci.inv_at = d.inv, cw.inv_at = d.inv + kFp8InvStride;
            else ci.scale = scales[0], cw.scale = scales[1];
            h.gpu.matmul_forward_fp8(out.g, Tensor(), inp.g, w.g, Tensor(), N, IC, OC, false, ci, cw);
            r[by_pointer] = h.raw({out, amax});
        }
        report(r[0] == r[1], "matmul_forward_fp8.scale_at_equals_value", sh, "");
        h.gpu.release(block);
        h.gpu.release(word);
    }
}

// Shapes the fp8 GEMM cannot take are a UserError, not a crash.
void test_fp8_bad_shape(H& h) {
    Pair inp = h.make(17 * 32), w = h.make(32 * 32), out = h.make(17 * 32);
    Fp8Cast c;
    bool threw = false;
    try {
        h.gpu.matmul_forward_fp8(out.g, Tensor(), inp.g, w.g, Tensor(), 17, 32, 32, false, c, c);
    } catch (const UserError&) {
        threw = true;
    }
    report(threw, "matmul_forward_fp8.rejects_N_not_multiple_of_16", strfmt("[%s]", dtype_name(h.dt)), "");
}

}  // namespace gpu_test
