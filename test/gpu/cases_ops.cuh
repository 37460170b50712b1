// test_gpu's op cases but attention (cases_attention.cuh) and fp8 (cases_fp8.cuh): encoder,
// layernorm, residual, matmul, rmsnorm, rope, swiglu, moe, cross_entropy(_vp, big), adamw,
// sum_squares, step_ops, step_graph. Part of test_gpu.cu (one translation unit).
#pragma once
#include <algorithm>
#include <memory>

#include "test/gpu/harness.h"

namespace gpu_test {

void test_encoder(H& h, int B, int T, int C, int V) {
    const std::string sh = strfmt("[%s B=%d T=%d C=%d V=%d]", dtype_name(h.dt), B, T, C, V);
    std::vector<int32_t> tok(B * T);
    for (auto& t : tok) t = h.rng.below(V);
    auto [tc, tg] = h.ints(tok);
    Pair wte = h.make((size_t)V * C), wpe = h.make((size_t)T * C), out = h.make((size_t)B * T * C);
    h.up(wte, h.rnd_for(wte, 1.0f));
    h.up(wpe, h.rnd_for(wpe, 1.0f));
    h.cpu.encoder_forward(out.c, tc, wte.c, wpe.c, B, T, C, 0);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out);
        h.gpu.encoder_forward(out.g, tg, wte.g, wpe.g, B, T, C, 0);
        r[rep] = h.raw({out});
    }
    h.det("encoder_forward", sh, r[0], r[1]);
    h.compare("encoder_forward.out", sh, out);

    // backward: dwte/dwpe accumulate onto random initial values
    Pair dout = h.make((size_t)B * T * C);
    auto dwte0 = h.rnd_for(wte, 1.0f), dwpe0 = h.rnd_for(wpe, 1.0f);
    h.up(dout, h.rnd_for(dout, 1.0f));
    h.up(wte, dwte0);  // reuse as dwte
    h.up(wpe, dwpe0);
    h.cpu.encoder_backward(wte.c, wpe.c, dout.c, tc, B, T, C, 0);
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(wte, dwte0);
        h.up_gpu(wpe, dwpe0);
        h.gpu.encoder_backward(wte.g, wpe.g, dout.g, tg, B, T, C, 0);
        r[rep] = h.raw({wte, wpe});
    }
    h.det("encoder_backward", sh, r[0], r[1]);
    h.compare("encoder_backward.dwte", sh, wte);
    h.compare("encoder_backward.dwpe", sh, wpe);
}

// Vocabulary slice [c0, c1) of a [Vp, C] table (tensor parallelism): the GPU op on the slice
// against the CPU op on the slice. Tokens span the whole vocabulary (most fall outside the
// slice); dwte is compared over the whole table (rows outside the slice stay untouched).
void test_encoder_slice(H& h, int B, int T, int C, int Vp, int c0, int c1, bool with_wpe) {
    const std::string sh =
        strfmt("[%s B=%d T=%d C=%d Vp=%d slice=[%d,%d) wpe=%d]", dtype_name(h.dt), B, T, C, Vp, c0, c1, (int)with_wpe);
    std::vector<int32_t> tok(B * T);
    for (auto& t : tok) t = h.rng.below(Vp);
    if (c1 > c0) tok.front() = c0, tok.back() = c1 - 1;  // the slice's edges
    if (c0 > 0) tok[1] = c0 - 1;
    if (c1 < Vp) tok[2] = c1;
    auto [tc, tg] = h.ints(tok);
    Pair wte = h.make((size_t)Vp * C), wpe = h.make((size_t)T * C), out = h.make((size_t)B * T * C);
    h.up(wte, h.rnd_for(wte, 1.0f));
    h.up(wpe, h.rnd_for(wpe, 1.0f));
    Pair ws = wte;  // the slice's rows
    ws.c = wte.c.slice((size_t)c0 * C, (size_t)(c1 - c0) * C);
    ws.g = wte.g.slice((size_t)c0 * C, (size_t)(c1 - c0) * C);
    const Tensor pc = with_wpe ? wpe.c : Tensor(), pg = with_wpe ? wpe.g : Tensor();
    h.cpu.encoder_forward(out.c, tc, ws.c, pc, B, T, C, c0);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out);
        h.gpu.encoder_forward(out.g, tg, ws.g, pg, B, T, C, c0);
        r[rep] = h.raw({out});
    }
    h.det("encoder_forward_slice", sh, r[0], r[1]);
    h.compare("encoder_forward_slice.out", sh, out);

    // backward: dwte (the whole table) and dwpe accumulate onto random initial values
    Pair dout = h.make((size_t)B * T * C);
    auto dwte0 = h.rnd_for(wte, 1.0f), dwpe0 = h.rnd_for(wpe, 1.0f);
    h.up(dout, h.rnd_for(dout, 1.0f));
    h.up(wte, dwte0);  // reuse as dwte
    h.up(wpe, dwpe0);
    h.cpu.encoder_backward(ws.c, pc, dout.c, tc, B, T, C, c0);
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(wte, dwte0);
        h.up_gpu(wpe, dwpe0);
        h.gpu.encoder_backward(ws.g, pg, dout.g, tg, B, T, C, c0);
        r[rep] = h.raw({wte, wpe});
    }
    h.det("encoder_backward_slice", sh, r[0], r[1]);
    h.compare("encoder_backward_slice.dwte", sh, wte);
    h.compare("encoder_backward_slice.dwpe", sh, wpe);
}

// off > 0: the input views (inp, and a of the fused variant) start `off` elements past an
// aligned address (the kernels then move one element at a time instead of 16-byte packs)
void test_layernorm(H& h, int N, int C, int off) {
    const std::string sh = strfmt("[%s N=%d C=%d%s]", dtype_name(h.dt), N, C, off ? strfmt(" inp+%d", off).c_str() : "");
    const size_t n = (size_t)N * C;
    Pair inp = h.make_at(n, off), w = h.make(C), b = h.make(C), out = h.make(n), mean = h.make(N, true),
         rstd = h.make(N, true);
    auto vin = h.rnd(n, 1.0f);
    for (size_t i = 0; i < n; i++) vin[i] = h.q(vin[i] + 0.5f);  // non-zero mean
    h.up(inp, vin);
    h.up(w, h.rnd(C, 1.0f));
    h.up(b, h.rnd(C, 1.0f));
    h.cpu.layernorm_forward(out.c, mean.c.f32(), rstd.c.f32(), inp.c, w.c, b.c, N, C);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(mean), h.poison(rstd);
        h.gpu.layernorm_forward(out.g, mean.g.f32(), rstd.g.f32(), inp.g, w.g, b.g, N, C);
        r[rep] = h.raw({out, mean, rstd});
    }
    h.det("layernorm_forward", sh, r[0], r[1]);
    h.compare("layernorm_forward.out", sh, out);
    h.compare("layernorm_forward.mean", sh, mean);
    h.compare("layernorm_forward.rstd", sh, rstd);

    // fused residual variant
    Pair a = h.make_at(n, off), res = h.make(n);
    h.up(a, h.rnd(n, 1.0f));
    h.cpu.fused_residual_layernorm_forward(res.c, out.c, mean.c.f32(), rstd.c.f32(), a.c, inp.c, w.c, b.c, N, C);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(res), h.poison(out), h.poison(mean), h.poison(rstd);
        h.gpu.fused_residual_layernorm_forward(res.g, out.g, mean.g.f32(), rstd.g.f32(), a.g, inp.g, w.g, b.g, N,
                                               C);
        r[rep] = h.raw({res, out, mean, rstd});
    }
    h.det("fused_residual_layernorm_forward", sh, r[0], r[1]);
    h.compare("fused_residual_layernorm_forward.residual", sh, res);
    h.compare("fused_residual_layernorm_forward.out", sh, out);
    h.compare("fused_residual_layernorm_forward.mean", sh, mean);
    h.compare("fused_residual_layernorm_forward.rstd", sh, rstd);

    // backward on the (inp, mean, rstd) of the plain forward, computed by the CPU and
    // given to both backends; dinp/dw/db accumulate onto random values
    h.cpu.layernorm_forward(out.c, mean.c.f32(), rstd.c.f32(), inp.c, w.c, b.c, N, C);
    auto vmean = h.get_cpu(mean), vrstd = h.get_cpu(rstd);
    h.up_gpu(mean, vmean);
    h.up_gpu(rstd, vrstd);
    Pair dout = h.make(n), dinp = h.make(n), dw = h.make(C), db = h.make(C);
    h.up(dout, h.rnd(n, 1.0f));
    auto dinp0 = h.rnd(n, 1.0f), dw0 = h.rnd(C, 1.0f), db0 = h.rnd(C, 1.0f);
    h.up(dinp, dinp0), h.up(dw, dw0), h.up(db, db0);
    h.cpu.layernorm_backward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c.f32(), rstd.c.f32(), N, C);
    // (a third run streams every row twice instead of keeping it in registers: the same bits)
    std::vector<uint8_t> streamed;
    for (int rep = 0; rep < 3; rep++) {
        h.up_gpu(dinp, dinp0), h.up_gpu(dw, dw0), h.up_gpu(db, db0);
        KernelWays ways;
        ways.ln_bwd_registers = rep < 2;
        set_cuda_kernel_ways(h.gpu, ways);
        h.gpu.layernorm_backward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g.f32(), rstd.g.f32(), N, C);
        set_cuda_kernel_ways(h.gpu, KernelWays());
        (rep < 2 ? r[rep] : streamed) = h.raw({dinp, dw, db});
    }
    h.det("layernorm_backward", sh, r[0], r[1]);
    h.det("layernorm_backward_streamed_rows", sh, r[0], streamed);
    h.compare("layernorm_backward.dinp", sh, dinp);
    h.compare("layernorm_backward.dw", sh, dw);
    h.compare("layernorm_backward.db", sh, db);
}

// A d_model whose backward accumulators (one warp's: 2 x C floats) pass the device's shared memory
// per block is a UserError naming model.d_model, not a crash (30000: 240 KB, past H100's 227 KB).
void test_layernorm_too_wide(H& h) {
    const int N = 1, C = 30000;
    Pair x = h.make(C), w = h.make(C), dw = h.make(C), db = h.make(C), st = h.make(2, true);
    std::string what = "no error";
    try {
        h.gpu.layernorm_backward(x.g, dw.g, db.g, x.g, x.g, w.g, st.g.f32(), st.g.f32() + 1, N, C);
    } catch (const UserError& e) {
        what = e.what();
    }
    report(what.find("model.d_model: 30000 is too wide") != std::string::npos, "layernorm_backward.too_wide",
           strfmt("[%s C=%d]", dtype_name(h.dt), C), what.substr(0, 120));
}

// A 16-bit tensor longer than the backend's slice of one copy (64M elements): from_host_f32 and
// to_host_f32 convert through one buffer, a slice at a time. Every element comes back where it was,
// and the device holds the dtype's bits of each value (read raw), on both sides of the slices' seams.
void test_host_copies(H& h) {
    const size_t n = (size_t(1) << 26) + 4099;
    const std::string sh = strfmt("[%s n=%zu]", dtype_name(h.dt), n);
    auto value = [](size_t i) { return float(int(i % 251) - 125) * 0.25f; };  // exact in bf16 and fp16
    std::vector<float> up(n), back(n, NAN);
    for (size_t i = 0; i < n; i++) up[i] = value(i);
    void* d = h.gpu.alloc(n * dtype_size(h.dt));
    const Tensor t(d, n, h.dt);
    h.gpu.from_host_f32(t, up.data());
    h.gpu.to_host_f32(back.data(), t);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += std::memcmp(&up[i], &back[i], 4) != 0;
    report(wrong == 0, "host_copies.round_trip", sh, strfmt("%zu of %zu elements differ", wrong, n));
    const size_t seam = size_t(1) << 26;
    bool bits_ok = true;
    for (size_t at : {size_t(0), seam - 2, n - 3}) {
        uint16_t raw[3];
        h.gpu.to_host_bytes(raw, static_cast<const uint16_t*>(d) + at, sizeof(raw));
        for (size_t k = 0; k < 3; k++) {
            const float v = value(at + k);
            bits_ok = bits_ok && raw[k] == (h.dt == DType::F16 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v));
        }
    }
    report(bits_ok, "host_copies.device_bits", sh, "elements 0-2, at the seam and the last three");
    h.gpu.release(d);
}

// off > 0: every view starts `off` elements past an aligned address (no 16-byte packs)
void test_residual(H& h, size_t n, int off) {
    const std::string sh = strfmt("[%s n=%zu%s]", dtype_name(h.dt), n, off ? strfmt(" off=%d", off).c_str() : "");
    Pair a = h.make_at(n, off), b = h.make_at(n, off), out = h.make_at(n, off);
    h.up(a, h.rnd(n, 1.0f));
    h.up(b, h.rnd(n, 1.0f));
    h.cpu.residual_forward(out.c, a.c, b.c);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out);
        h.gpu.residual_forward(out.g, a.g, b.g);
        r[rep] = h.raw({out});
    }
    h.det("residual_forward", sh, r[0], r[1]);
    h.compare("residual_forward.out", sh, out);
}

// bias_offset: the bias is a view starting bias_offset elements into its buffer
// (exercises the unaligned-bias path)
// op_offset > 0: every operand starts op_offset elements into its allocation (misaligned for
// vector loads and cuBLASLt's 16-byte alignment), as tensors inside a flat buffer may.
// way: appended to the shape's text (the cases run twice under the emulator, see main).
void test_matmul(H& h, int N, int IC, int OC, bool has_bias, bool gelu, int bias_offset = 0, int op_offset = 0,
                 const char* way = "") {
    const std::string sh = strfmt("[%s N=%d IC=%d OC=%d bias=%d gelu=%d bias_off=%d op_off=%d%s]", dtype_name(h.dt),
                                  N, IC, OC, (int)has_bias, (int)gelu, bias_offset, op_offset, way);
    const size_t no = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)OC * IC;
    auto make = [&](size_t n) {
        Pair p = h.make(n + op_offset);
        p.c = p.c.slice(op_offset, n);
        p.g = p.g.slice(op_offset, n);
        return p;
    };
    Pair inp = make(ni), w = make(nw), out = make(no), pre = make(no);
    Pair biasbuf = h.make(OC + bias_offset);
    Pair bias = biasbuf;
    bias.c = biasbuf.c.slice(bias_offset, OC);
    bias.g = biasbuf.g.slice(bias_offset, OC);
    const float ws = 1.0f / std::sqrt((float)IC);
    h.up(inp, h.rnd(ni, 1.0f));
    h.up(w, h.rnd(nw, ws));
    h.up(biasbuf, h.rnd(OC + bias_offset, 0.5f));
    Tensor bc = has_bias ? bias.c : Tensor(), bg = has_bias ? bias.g : Tensor();
    Tensor pc = gelu ? pre.c : Tensor(), pg = gelu ? pre.g : Tensor();
    h.cpu.matmul_forward(out.c, pc, inp.c, w.c, bc, N, IC, OC, gelu);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(pre);
        h.gpu.matmul_forward(out.g, pg, inp.g, w.g, bg, N, IC, OC, gelu);
        r[rep] = gelu ? h.raw({out, pre}) : h.raw({out});
    }
    h.det("matmul_forward", sh, r[0], r[1]);
    h.compare("matmul_forward.out", sh, out);
    if (gelu) h.compare("matmul_forward.pre_gelu", sh, pre);

    // backward: dinp overwrite (poisoned), dw/dbias accumulate, dout modified in place with gelu
    for (int with_dinp = 1; with_dinp >= 0; with_dinp--) {
        const std::string sh2 = sh.substr(0, sh.size() - 1) + strfmt(" dinp=%d]", with_dinp);
        Pair dout = make(no), dinp = make(ni), dw = make(nw), dbias = h.make(OC);
        auto dout0 = h.rnd(no, 1.0f), dw0 = h.rnd(nw, 1.0f), db0 = h.rnd(OC, 1.0f);
        auto pre0 = h.rnd(no, 1.5f);
        h.up(pre, pre0);
        h.up(dout, dout0), h.up(dw, dw0), h.up(dbias, db0);
        Tensor dbc = has_bias ? dbias.c : Tensor(), dbg = has_bias ? dbias.g : Tensor();
        Tensor dic = with_dinp ? dinp.c : Tensor(), dig = with_dinp ? dinp.g : Tensor();
        h.cpu.matmul_backward(dic, dw.c, dbc, dout.c, inp.c, w.c, pc, N, IC, OC);
        for (int rep = 0; rep < 2; rep++) {
            h.up_gpu(dout, dout0), h.up_gpu(dw, dw0), h.up_gpu(dbias, db0);
            h.poison(dinp);
            h.gpu.matmul_backward(dig, dw.g, dbg, dout.g, inp.g, w.g, pg, N, IC, OC);
            r[rep] = h.raw({dinp, dw, dbias, dout});
        }
        h.det("matmul_backward", sh2, r[0], r[1]);
        if (with_dinp) h.compare("matmul_backward.dinp", sh2, dinp);
        h.compare("matmul_backward.dw", sh2, dw);
        if (has_bias) h.compare("matmul_backward.dbias", sh2, dbias);
        if (gelu) h.compare("matmul_backward.dout_after_gelu", sh2, dout);
    }
    // the backward of a linear after the GELU (GPT-2's fc_proj, here with inp in its place): dinp
    // through the GELU whose input is gin (CUDA: cuBLASLt's DGELU epilogue; under the emulator's
    // second run, which refuses it, the GEMM and then the kernel)
    if (gelu) {
        const std::string sh3 = sh.substr(0, sh.size() - 1) + " dinp through a GELU]";
        Pair dout = make(no), dinp = make(ni), dw = make(nw), gin = make(ni);
        auto dout0 = h.rnd(no, 1.0f), dw0 = h.rnd(nw, 1.0f);
        h.up(gin, h.rnd(ni, 1.5f));
        h.up(dout, dout0), h.up(dw, dw0);
        h.cpu.matmul_backward(dinp.c, dw.c, Tensor(), dout.c, inp.c, w.c, Tensor(), N, IC, OC, gin.c);
        for (int rep = 0; rep < 2; rep++) {
            h.up_gpu(dout, dout0), h.up_gpu(dw, dw0);
            h.poison(dinp);
            h.gpu.matmul_backward(dinp.g, dw.g, Tensor(), dout.g, inp.g, w.g, Tensor(), N, IC, OC, gin.g);
            r[rep] = h.raw({dinp, dw, dout});
        }
        h.det("matmul_backward", sh3, r[0], r[1]);
        h.compare("matmul_backward.dinp", sh3, dinp);
        h.compare("matmul_backward.dw", sh3, dw);
        h.compare("matmul_backward.dout_unchanged", sh3, dout);
    }
}

// RMSNorm: forward (out, rstd), then the backward on the CPU forward's rstd (given to both);
// dinp and dw accumulate onto random values.
void test_rmsnorm(H& h, int N, int C, float eps) {
    const std::string sh = strfmt("[%s N=%d C=%d eps=%g]", dtype_name(h.dt), N, C, eps);
    const size_t n = (size_t)N * C;
    Pair inp = h.make(n), w = h.make(C), out = h.make(n), rstd = h.make(N, true);
    auto vin = h.rnd(n, 1.0f);
    for (size_t i = 0; i < n; i++) vin[i] = h.q(vin[i] + 0.5f);  // non-zero mean
    h.up(inp, vin);
    h.up(w, h.rnd(C, 1.0f));
    h.cpu.rmsnorm_forward(out.c, rstd.c.f32(), inp.c, w.c, N, C, eps);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(rstd);
        h.gpu.rmsnorm_forward(out.g, rstd.g.f32(), inp.g, w.g, N, C, eps);
        r[rep] = h.raw({out, rstd});
    }
    h.det("rmsnorm_forward", sh, r[0], r[1]);
    h.compare("rmsnorm_forward.out", sh, out);
    h.compare("rmsnorm_forward.rstd", sh, rstd);

    h.up_gpu(rstd, h.get_cpu(rstd));
    Pair dout = h.make(n), dinp = h.make(n), dw = h.make(C);
    h.up(dout, h.rnd(n, 1.0f));
    auto dinp0 = h.rnd(n, 1.0f), dw0 = h.rnd(C, 1.0f);
    h.up(dinp, dinp0), h.up(dw, dw0);
    h.cpu.rmsnorm_backward(dinp.c, dw.c, dout.c, inp.c, w.c, rstd.c.f32(), N, C);
    std::vector<uint8_t> streamed;  // (as test_layernorm's)
    for (int rep = 0; rep < 3; rep++) {
        h.up_gpu(dinp, dinp0), h.up_gpu(dw, dw0);
        KernelWays ways;
        ways.ln_bwd_registers = rep < 2;
        set_cuda_kernel_ways(h.gpu, ways);
        h.gpu.rmsnorm_backward(dinp.g, dw.g, dout.g, inp.g, w.g, rstd.g.f32(), N, C);
        set_cuda_kernel_ways(h.gpu, KernelWays());
        (rep < 2 ? r[rep] : streamed) = h.raw({dinp, dw});
    }
    h.det("rmsnorm_backward", sh, r[0], r[1]);
    h.det("rmsnorm_backward_streamed_rows", sh, r[0], streamed);
    h.compare("rmsnorm_backward.dinp", sh, dinp);
    h.compare("rmsnorm_backward.dw", sh, dw);
}

// RoPE in place on qkv [B, T, NH + 2*NKV, HS]: forward and backward against the CPU (the value
// heads must come out unchanged, which the comparison covers), and on the GPU alone
// backward(forward(x)) == x (the backward is the inverse rotation).
void test_rope(H& h, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) {
    const std::string sh = strfmt("[%s B=%d T=%d NH=%d NKV=%d HS=%d theta=%g positions %d, %d from %d]",
                                  dtype_name(h.dt), B, T, NH, NKV, HS, theta, pos.start0, pos.start1,
                                  std::min(pos.split, T));
    const size_t n = (size_t)B * T * (NH + 2 * NKV) * HS;
    Pair x = h.make(n);
    const std::vector<float> x0 = h.rnd(n, 1.0f);
    for (int backward = 0; backward <= 1; backward++) {
        const std::string name = backward ? "rope_backward" : "rope_forward";
        h.up(x, x0);
        if (backward)
            h.cpu.rope_backward(x.c, B, T, NH, NKV, HS, theta, pos);
        else
            h.cpu.rope_forward(x.c, B, T, NH, NKV, HS, theta, pos);
        std::vector<uint8_t> r[2];
        for (int rep = 0; rep < 2; rep++) {
            h.up_gpu(x, x0);
            if (backward)
                h.gpu.rope_backward(x.g, B, T, NH, NKV, HS, theta, pos);
            else
                h.gpu.rope_forward(x.g, B, T, NH, NKV, HS, theta, pos);
            r[rep] = h.raw({x});
        }
        h.det(name, sh, r[0], r[1]);
        h.compare(name + ".out", sh, x);
    }
    if (!h.low()) {  // in bf16 and fp16 the intermediate rounding dominates
        h.up_gpu(x, x0);
        h.gpu.rope_forward(x.g, B, T, NH, NKV, HS, theta, pos);
        h.gpu.rope_backward(x.g, B, T, NH, NKV, HS, theta, pos);
        H::compare_vec("rope_backward_inverts_forward", sh, h.get_gpu(x), x0, 1e-5);
    }
}

// SwiGLU: forward out [N, F] from [gate | up], backward dinp [N, 2F] (overwrite, poisoned).
void test_swiglu(H& h, int N, int F) {
    const std::string sh = strfmt("[%s N=%d F=%d]", dtype_name(h.dt), N, F);
    const size_t n = (size_t)N * F;
    Pair inp = h.make(2 * n), out = h.make(n);
    h.up(inp, h.rnd(2 * n, 3.0f));  // gates well into both tails of the sigmoid
    h.cpu.swiglu_forward(out.c, inp.c, N, F);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out);
        h.gpu.swiglu_forward(out.g, inp.g, N, F);
        r[rep] = h.raw({out});
    }
    h.det("swiglu_forward", sh, r[0], r[1]);
    h.compare("swiglu_forward.out", sh, out);

    Pair dout = h.make(n), dinp = h.make(2 * n);
    h.up(dout, h.rnd(n, 1.0f));
    h.cpu.swiglu_backward(dinp.c, dout.c, inp.c, N, F);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(dinp);
        h.gpu.swiglu_backward(dinp.g, dout.g, inp.g, N, F);
        r[rep] = h.raw({dinp});
    }
    h.det("swiglu_backward", sh, r[0], r[1]);
    h.compare("swiglu_backward.dinp", sh, dinp);
}

// Mixture of experts (llmc/model/moe.h): the router forward (probabilities, choices, gates) and backward,
// the permutation and its backward (accumulating onto random values), the combine and its
// backward. Each op after the router takes the CPU's routing on both backends.
void test_moe(H& h, int N, int E, int K, int C, int cap) {
    const std::string sh = strfmt("[%s N=%d E=%d K=%d C=%d capacity=%d]", dtype_name(h.dt), N, E, K, C, cap);
    const size_t NK = (size_t)N * K;
    std::vector<uint8_t> r[2];
    Pair logits = h.make((size_t)N * E), probs = h.make((size_t)N * E, true), gate = h.make(NK, true);
    h.up(logits, h.rnd_for(logits, 2.0f));
    auto [ex_c, ex_g] = h.ints(std::vector<int32_t>(NK, -1));
    h.cpu.moe_router_forward(probs.c.f32(), ex_c, gate.c.f32(), logits.c, N, E, K);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(probs);
        h.poison(gate);
        h.gpu.moe_router_forward(probs.g.f32(), ex_g, gate.g.f32(), logits.g, N, E, K);
        r[rep] = h.raw({probs, gate});
    }
    h.det("moe_router_forward", sh, r[0], r[1]);
    h.compare("moe_router_forward.probs", sh, probs);
    h.compare("moe_router_forward.gate", sh, gate);
    std::vector<int32_t> ex(NK), ex_gpu(NK);
    h.cpu.to_host_bytes(ex.data(), ex_c, NK * 4);
    h.gpu.to_host_bytes(ex_gpu.data(), ex_g, NK * 4);
    report(ex == ex_gpu, "moe_router_forward.expert", sh, "the same choices");
    // from here on both backends take the CPU's routing
    const MoePlan plan = moe_plan(ex.data(), N, E, K, cap);
    auto [row_c, row_g] = h.ints(plan.row_of);
    h.gpu.from_host_bytes(ex_g, ex.data(), NK * 4);
    const std::vector<float> pv = h.get_cpu(probs), gv = h.get_cpu(gate);
    h.up(probs, pv);
    h.up(gate, gv);
    const size_t R = (size_t)std::max(plan.rows, 1);

    Pair dgate = h.make(NK, true), daux = h.make((size_t)E, true), dlogits = h.make((size_t)N * E);
    h.up(dgate, h.rnd(NK, 1.0f, true));
    h.up(daux, h.rnd((size_t)E, 0.1f, true));
    h.cpu.moe_router_backward(dlogits.c, dgate.c.f32(), daux.c.f32(), probs.c.f32(), ex_c, gate.c.f32(), N, E, K);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(dlogits);
        h.gpu.moe_router_backward(dlogits.g, dgate.g.f32(), daux.g.f32(), probs.g.f32(), ex_g, gate.g.f32(), N, E, K);
        r[rep] = h.raw({dlogits});
    }
    h.det("moe_router_backward", sh, r[0], r[1]);
    h.compare("moe_router_backward.dlogits", sh, dlogits);

    Pair x = h.make((size_t)N * C), xp = h.make(R * C);
    h.up(x, h.rnd_for(x, 1.0f));
    h.up(xp, std::vector<float>(R * C, 0.0f));
    h.cpu.moe_permute(xp.c, x.c, row_c, N, K, C);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(xp);
        h.gpu.moe_permute(xp.g, x.g, row_g, N, K, C);
        r[rep] = h.raw({xp});
    }
    h.det("moe_permute", sh, r[0], r[1]);
    if (plan.rows) h.compare("moe_permute.out", sh, xp);

    Pair y = h.make(R * C), out = h.make((size_t)N * C);
    h.up(y, h.rnd_for(y, 1.0f));
    h.cpu.moe_combine(out.c, y.c, gate.c.f32(), row_c, N, K, C);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out);
        h.gpu.moe_combine(out.g, y.g, gate.g.f32(), row_g, N, K, C);
        r[rep] = h.raw({out});
    }
    h.det("moe_combine", sh, r[0], r[1]);
    h.compare("moe_combine.out", sh, out);

    Pair dout = h.make((size_t)N * C), dy = h.make(R * C), dg = h.make(NK, true);
    h.up(dout, h.rnd_for(dout, 1.0f));
    h.up(dy, std::vector<float>(R * C, 0.0f));
    h.cpu.moe_combine_backward(dy.c, dg.c.f32(), dout.c, y.c, gate.c.f32(), row_c, N, K, C);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(dy);
        h.poison(dg);
        h.gpu.moe_combine_backward(dy.g, dg.g.f32(), dout.g, y.g, gate.g.f32(), row_g, N, K, C);
        r[rep] = h.raw({dy, dg});
    }
    h.det("moe_combine_backward", sh, r[0], r[1]);
    if (plan.rows) h.compare("moe_combine_backward.dy", sh, dy);
    h.compare("moe_combine_backward.dgate", sh, dg);

    Pair dx = h.make((size_t)N * C);
    const std::vector<float> dx0 = h.rnd_for(dx, 1.0f);
    h.cpu.from_host_f32(dx.c, dx0.data());
    h.cpu.moe_permute_backward(dx.c, dy.c, row_c, N, K, C);
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(dx, dx0);
        h.gpu.moe_permute_backward(dx.g, dy.g, row_g, N, K, C);
        r[rep] = h.raw({dx});
    }
    h.det("moe_permute_backward", sh, r[0], r[1]);
    h.compare("moe_permute_backward.dinp", sh, dx);
}

void test_cross_entropy(H& h, int N, int V, int Vp, bool backward) {
    const std::string sh = strfmt("[%s N=%d V=%d Vp=%d dloss=%s]", dtype_name(h.dt), N, V, Vp, backward ? "1/N" : "0");
    std::vector<int32_t> tgt(N);
    for (auto& t : tgt) t = h.rng.below(V);
    auto [tc, tg] = h.ints(tgt);
    const size_t n = (size_t)N * Vp;
    Pair logits = h.make(n), losses = h.make(N, true);
    auto v = h.rnd(n, 2.0f), vg = v;
    for (int i = 0; i < N; i++)
        for (int c = V; c < Vp; c++) {
            v[(size_t)i * Vp + c] = 0.0f;  // CPU: zeros in the padding
            vg[(size_t)i * Vp + c] = NAN;   // GPU: NaN in the padding (must be ignored and overwritten)
        }
    const float dloss = backward ? 1.0f / N : 0.0f;
    h.cpu.from_host_f32(logits.c, v.data());
    h.cpu.cross_entropy(logits.c, losses.c.f32(), tc, N, V, Vp, dloss);
    // (a third run keeps each row in shared memory between the passes where it fits: the same bits)
    std::vector<uint8_t> r[2], kept;
    for (int rep = 0; rep < 3; rep++) {
        h.up_gpu(logits, vg);
        h.poison(losses);
        KernelWays ways;
        ways.ce_row_in_smem = rep == 2;
        set_cuda_kernel_ways(h.gpu, ways);
        h.gpu.cross_entropy(logits.g, losses.g.f32(), tg, N, V, Vp, dloss);
        set_cuda_kernel_ways(h.gpu, KernelWays());
        (rep < 2 ? r[rep] : kept) = h.raw({logits, losses});
    }
    h.det("cross_entropy", sh, r[0], r[1]);
    h.det("cross_entropy_row_in_smem", sh, r[0], kept);
    h.compare("cross_entropy.losses", sh, losses);
    if (backward) {
        h.compare("cross_entropy.dlogits", sh, logits);
    } else {  // logits untouched in [0, V)
        auto g = h.get_gpu(logits);
        size_t diff = 0;
        for (int i = 0; i < N; i++)
            for (int c = 0; c < V; c++) diff += g[(size_t)i * Vp + c] != vg[(size_t)i * Vp + c];
        report(diff == 0, "cross_entropy.logits_unchanged", sh, strfmt("changed=%zu", diff));
    }
}

// Targets outside [0, V) (ops.h leaves them to the backend; the CUDA kernel's rule): a NaN loss,
// and the gradient dloss * softmax with no onehot. Checked against softmax in double on the host.
void test_cross_entropy_bad_targets(H& h) {
    const int N = 2, V = 50, Vp = 56;
    const float dloss = 0.5f;
    const std::string sh = strfmt("[%s N=%d V=%d Vp=%d targets=-1,V]", dtype_name(h.dt), N, V, Vp);
    auto [tc, tg] = h.ints({-1, V});
    (void)tc;
    Pair logits = h.make((size_t)N * Vp), losses = h.make(N, true);
    const std::vector<float> v = h.rnd((size_t)N * Vp, 2.0f);
    h.up_gpu(logits, v);
    h.poison(losses);
    h.gpu.cross_entropy(logits.g, losses.g.f32(), tg, N, V, Vp, dloss);
    const std::vector<float> gl = h.get_gpu(losses), gd = h.get_gpu(logits);
    std::vector<float> want((size_t)N * Vp, 0.0f);
    for (int i = 0; i < N; i++) {
        double mx = -INFINITY, se = 0;
        for (int c = 0; c < V; c++) mx = std::max(mx, (double)v[(size_t)i * Vp + c]);
        for (int c = 0; c < V; c++) se += std::exp((double)v[(size_t)i * Vp + c] - mx);
        for (int c = 0; c < V; c++) want[(size_t)i * Vp + c] = (float)(dloss * std::exp((double)v[(size_t)i * Vp + c] - mx) / se);
    }
    report(std::isnan(gl[0]) && std::isnan(gl[1]), "cross_entropy_bad_targets.losses_nan", sh,
           strfmt("losses=%g,%g", gl[0], gl[1]));
    H::compare_vec("cross_entropy_bad_targets.dlogits", sh, gd, want, h.tol(false));
}

// Per-row (max, sum-exp, target) statistics of vocabulary slices [N, 3] combined as the
// model does across the TP group (in double): M = max m_k, S = sum s_k exp(m_k - M),
// target = sum t_k.
std::vector<float> combine_ce_stats(const std::vector<std::vector<float>>& parts, int N) {
    std::vector<float> out((size_t)3 * N);
    for (int n = 0; n < N; n++) {
        double M = -INFINITY, S = 0, t = 0;
        for (const auto& p : parts) M = std::max(M, (double)p[3 * n]);
        for (const auto& p : parts) {
            if (p[3 * n + 1] != 0.0f) S += (double)p[3 * n + 1] * std::exp((double)p[3 * n] - M);
            t += p[3 * n + 2];
        }
        out[3 * n] = (float)M, out[3 * n + 1] = (float)S, out[3 * n + 2] = (float)t;
    }
    return out;
}

// Vocabulary-parallel cross-entropy: logits [N, Vp] split at cuts; on every slice the GPU's
// cross_entropy_partial against the CPU's, then each backend's statistics combined on the
// host, then cross_entropy_finish on every slice, GPU against CPU. With one slice the GPU
// pair must equal the GPU's fused cross_entropy bitwise.
void test_cross_entropy_vocab_parallel(H& h, int N, int V, int Vp, const std::vector<int>& cuts, bool backward) {
    std::string cs;
    for (size_t k = 0; k < cuts.size(); k++) cs += strfmt(k ? ",%d" : "%d", cuts[k]);
    const std::string sh = strfmt("[%s N=%d V=%d Vp=%d cuts=%s dloss=%s]", dtype_name(h.dt), N, V, Vp, cs.c_str(),
                                  backward ? "1/N" : "0");
    const int K = (int)cuts.size() - 1;
    std::vector<int32_t> tgt(N);
    for (auto& t : tgt) t = h.rng.below(V);
    for (int k = 0, i = 0; k < K && i < N; k++)  // a target in every slice with real columns
        if (cuts[k] < V) tgt[i++] = cuts[k];
    auto [tc, tg] = h.ints(tgt);
    const size_t n = (size_t)N * Vp;
    auto v = h.rnd(n, 2.0f), vg = v;
    for (int i = 0; i < N; i++)
        for (int c = V; c < Vp; c++) {
            v[(size_t)i * Vp + c] = 0.0f;  // CPU: zeros in the padding
            vg[(size_t)i * Vp + c] = NAN;   // GPU: NaN in the padding (must be ignored and overwritten)
        }
    auto cols = [&](const std::vector<float>& full, int c0, int c1) {
        std::vector<float> o((size_t)N * (c1 - c0));
        for (int i = 0; i < N; i++)
            for (int c = c0; c < c1; c++) o[(size_t)i * (c1 - c0) + (c - c0)] = full[(size_t)i * Vp + c];
        return o;
    };
    const float dloss = backward ? 1.0f / N : 0.0f;
    std::vector<Pair> lg(K);
    std::vector<std::vector<float>> parts_c(K), parts_g(K);
    std::vector<uint8_t> r[2];
    for (int k = 0; k < K; k++) {
        const int c0 = cuts[k], c1 = cuts[k + 1], Vl = c1 - c0;
        const std::string shk = sh.substr(0, sh.size() - 1) + strfmt(" slice=%d]", k);
        lg[k] = h.make((size_t)N * Vl);
        h.cpu.from_host_f32(lg[k].c, cols(v, c0, c1).data());
        h.up_gpu(lg[k], cols(vg, c0, c1));
        Pair st = h.make((size_t)3 * N, true);
        h.cpu.cross_entropy_partial(st.c.f32(), lg[k].c, tc, N, Vl, c0, V);
        for (int rep = 0; rep < 2; rep++) {
            h.poison(st);
            h.gpu.cross_entropy_partial(st.g.f32(), lg[k].g, tg, N, Vl, c0, V);
            r[rep] = h.raw({st});
        }
        h.det("cross_entropy_partial", shk, r[0], r[1]);
        parts_c[k] = h.get_cpu(st);
        parts_g[k] = h.get_gpu(st);
        if (c0 >= V) {  // padding only: exactly (-inf, 0, 0)
            size_t bad = 0;
            for (int i = 0; i < N; i++)
                bad += !(parts_g[k][3 * i] == -INFINITY && parts_g[k][3 * i + 1] == 0.0f &&
                         parts_g[k][3 * i + 2] == 0.0f);
            report(bad == 0, "cross_entropy_partial.padding_slice", shk, strfmt("bad_rows=%zu", bad));
        } else {
            h.compare("cross_entropy_partial.stats", shk, st);
        }
    }
    // each backend finishes with its own combined statistics
    Pair stats = h.make((size_t)3 * N, true), losses = h.make(N, true);
    h.cpu.from_host_f32(stats.c, combine_ce_stats(parts_c, N).data());
    h.up_gpu(stats, combine_ce_stats(parts_g, N));
    // every slice's losses against the CPU's fused cross-entropy over the whole logits (not one
    // slice's GPU losses against another's: that compared the GPU with itself)
    Pair whole = h.make(n), fused = h.make(N, true);
    h.cpu.from_host_f32(whole.c, v.data());
    h.cpu.cross_entropy(whole.c, fused.c.f32(), tc, N, V, Vp, dloss);
    const std::vector<float> fused_losses = h.get_cpu(fused);
    for (int k = 0; k < K; k++) {
        const int c0 = cuts[k], c1 = cuts[k + 1], Vl = c1 - c0;
        const std::string shk = sh.substr(0, sh.size() - 1) + strfmt(" slice=%d]", k);
        const auto lg0 = cols(vg, c0, c1);
        h.cpu.cross_entropy_finish(lg[k].c, losses.c.f32(), stats.c.f32(), tc, N, Vl, c0, V, dloss);
        for (int rep = 0; rep < 2; rep++) {
            h.up_gpu(lg[k], lg0);
            h.poison(losses);
            h.gpu.cross_entropy_finish(lg[k].g, losses.g.f32(), stats.g.f32(), tg, N, Vl, c0, V, dloss);
            r[rep] = h.raw({lg[k], losses});
        }
        h.det("cross_entropy_finish", shk, r[0], r[1]);
        h.compare("cross_entropy_finish.losses", shk, losses);
        H::compare_vec("cross_entropy_finish.losses_vs_fused_cpu", shk, h.get_gpu(losses), fused_losses, h.tol(true));
        if (backward) {
            h.compare("cross_entropy_finish.dlogits", shk, lg[k]);
        } else {  // logits untouched in the real columns
            auto g = h.get_gpu(lg[k]);
            const int nreal = std::max(0, std::min(c1, V) - c0);
            size_t diff = 0;
            for (int i = 0; i < N; i++)
                for (int c = 0; c < nreal; c++) diff += g[(size_t)i * Vl + c] != lg0[(size_t)i * Vl + c];
            report(diff == 0, "cross_entropy_finish.logits_unchanged", shk, strfmt("changed=%zu", diff));
        }
    }
    if (K == 1) {  // one slice: bitwise the fused kernel
        Pair full = h.make(n), fl = h.make(N, true);
        h.up_gpu(full, vg);
        h.poison(fl);
        h.gpu.cross_entropy(full.g, fl.g.f32(), tg, N, V, Vp, dloss);
        const auto a = h.raw({full, fl}), b = h.raw({lg[0], losses});
        h.det("cross_entropy_partial_finish.equals_fused", sh, a, b);
    }
}

// Logits past 2^31 elements (an int32 index overflow would show here): GPT-2's vocabulary over
// enough rows that the last ones lie beyond element 2^31. The logits are made on the host a chunk
// of rows at a time, each row from its own seed; the GPU's losses and dlogits of a sample of rows
// (every 997th, and every row from the one that holds element 2^31 on) are compared with the
// CPU's cross-entropy of those rows alone (dloss 1/N, as in the model).
void test_cross_entropy_big(H& h) {
    const int V = 50257, Vp = 50304;
    const long long edge = 1ll << 31;
    const int N = int(edge / Vp) + 8, first_past = int(edge / Vp);
    const size_t n = (size_t)N * Vp;
    const std::string sh = strfmt("[%s N=%d V=%d Vp=%d elements=%zu]", dtype_name(h.dt), N, V, Vp, n);
    std::vector<int32_t> tgt(N);
    for (auto& t : tgt) t = h.rng.below(V);
    const auto row_of = [&](int i) {
        Rng r(1000003ull + (uint64_t)i);
        std::vector<float> v(Vp);
        for (int c = 0; c < V; c++) v[c] = H::q_bf16(2.0f * r.normal());  // bf16 values: exact in both dtypes
        return v;
    };
    void* gp = h.gpu.alloc(n * dtype_size(h.dt));
    void* gl = h.gpu.alloc((size_t)N * 4);
    void* gt = h.gpu.alloc((size_t)N * 4);
    const Tensor logits(gp, n, h.dt), losses(gl, (size_t)N, DType::F32);
    h.gpu.from_host_bytes(gt, tgt.data(), (size_t)N * 4);
    const int chunk = 1024;
    for (int i0 = 0; i0 < N; i0 += chunk) {
        const int rows = std::min(chunk, N - i0);
        std::vector<float> v((size_t)rows * Vp);
#pragma omp parallel for
        for (int i = 0; i < rows; i++) {
            std::vector<float> r = row_of(i0 + i);
            std::fill(r.begin() + V, r.end(), NAN);  // the GPU must ignore and overwrite the padding
            std::copy(r.begin(), r.end(), v.begin() + (size_t)i * Vp);
        }
        h.gpu.from_host_f32(logits.slice((size_t)i0 * Vp, v.size()), v.data());
    }
    h.gpu.cross_entropy(logits, losses.f32(), static_cast<int32_t*>(gt), N, V, Vp, 1.0f / N);
    std::vector<int> sample;
    for (int i = 0; i < first_past; i += 997) sample.push_back(i);
    for (int i = first_past; i < N; i++) sample.push_back(i);
    std::vector<float> gloss, closs, gd, cd;
    std::vector<float> all_losses(N);
    h.gpu.to_host_f32(all_losses.data(), losses);
    for (int i : sample) {
        std::vector<float> row = row_of(i), dl(1), grow(Vp);  // the CPU: zeros in the padding
        int32_t t = tgt[i];
        h.cpu.cross_entropy(Tensor(row.data(), (size_t)Vp, DType::F32), dl.data(), &t, 1, V, Vp, 1.0f / N);
        h.gpu.to_host_f32(grow.data(), logits.slice((size_t)i * Vp, Vp));
        gloss.push_back(all_losses[i]), closs.push_back(dl[0]);
        gd.insert(gd.end(), grow.begin(), grow.begin() + V);
        cd.insert(cd.end(), row.begin(), row.begin() + V);
    }
    H::compare_vec("cross_entropy_big.losses", sh, gloss, closs, h.tol(true));
    H::compare_vec("cross_entropy_big.dlogits", sh, gd, cd, h.tol(false));
    H::compare_rows("cross_entropy_big.dlogits", sh, gd, cd, (size_t)V, h.tol(false));
    h.gpu.release(gp), h.gpu.release(gl), h.gpu.release(gt);
}

void test_adamw(H& h, size_t n, bool with_master, int t) {
    const std::string sh = strfmt("[%s n=%zu master=%d t=%d]", dtype_name(h.dt), n, (int)with_master, t);
    Pair params = h.make(n), grads = h.make(n), m = h.make(n, true), v = h.make(n, true), master = h.make(n, true);
    auto p0 = h.rnd(n, 1.0f), m0 = h.rnd(n, 0.01f, true), g0 = h.rnd(n, 0.1f);
    auto v0 = h.rnd(n, 0.01f, true);
    for (auto& x : v0) x = x * x;  // non-negative second moment
    std::vector<float> master0 = h.rnd(n, 1.0f, true);
    if (with_master)
        for (size_t i = 0; i < n; i++) p0[i] = h.q(master0[i]);  // params = rounded master
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    const uint32_t seed = 1234u + (uint32_t)t;
    h.up(params, p0), h.up(grads, g0), h.up(m, m0), h.up(v, v0), h.up(master, master0);
    h.cpu.adamw(params.c, with_master ? master.c.f32() : nullptr, grads.c, m.c.f32(), v.c.f32(), lr, b1, b2, eps, wd,
                gs, t, seed);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(params, p0), h.up_gpu(m, m0), h.up_gpu(v, v0), h.up_gpu(master, master0);
        h.gpu.adamw(params.g, with_master ? master.g.f32() : nullptr, grads.g, m.g.f32(), v.g.f32(), lr, b1, b2, eps,
                    wd, gs, t, seed);
        r[rep] = h.raw({params, m, v, master});
    }
    h.det("adamw", sh, r[0], r[1]);
    h.compare("adamw.params", sh, params);
    h.compare("adamw.m", sh, m);
    h.compare("adamw.v", sh, v);
    if (with_master) h.compare("adamw.master", sh, master);
    // the update itself (new - old) is small next to the values: check it separately
    // (not for bf16 params without master: their rounding step is larger than the update)
    if (with_master || !h.low()) {
        auto g = h.get_gpu(with_master ? master : params), c = h.get_cpu(with_master ? master : params);
        std::vector<float> dg(n), dc(n);
        const std::vector<float>& base = with_master ? master0 : p0;
        for (size_t i = 0; i < n; i++) dg[i] = g[i] - base[i], dc[i] = c[i] - base[i];
        H::compare_vec("adamw.update", sh, dg, dc, 1e-3);
    }
    if (h.dt == DType::BF16 && with_master) {  // stochastic rounding: each param is one of the two neighbours of master
        auto g = h.get_gpu(params), mm = h.get_gpu(master);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t lo = f32_to_bf16_bits(mm[i]);
            float a = bf16_bits_to_f32(lo);
            // neighbours: round-to-nearest value and the bf16 on the other side of master
            float x = g[i];
            bool ok = x == a;
            if (!ok) {
                uint32_t u;
                std::memcpy(&u, &mm[i], 4);
                float down = bf16_bits_to_f32((uint16_t)(u >> 16));
                float up = bf16_bits_to_f32((uint16_t)((u >> 16) + 1));
                ok = x == down || x == up;
            }
            bad += !ok;
        }
        report(bad == 0, "adamw.stochastic_rounding_neighbours", sh, strfmt("bad=%zu", bad));
    }
}

void test_sum_squares(H& h, size_t n) {
    const std::string sh = strfmt("[%s n=%zu]", dtype_name(h.dt), n);
    Pair g = h.make(n);
    h.up(g, h.rnd(n, 1.0f));
    double c = h.cpu.sum_squares(g.c);
    double a = h.gpu.sum_squares(g.g), b = h.gpu.sum_squares(g.g);
    report(std::memcmp(&a, &b, sizeof a) == 0, "sum_squares.determinism", sh, strfmt("a=%.17g b=%.17g", a, b));
    digest("sum_squares", sh, &a, sizeof a);
    double err = std::fabs(a - c) / std::max(std::fabs(c), 1e-300);
    report(std::isfinite(a) && err <= 1e-9, "sum_squares", sh, strfmt("err=%.3e gpu=%.17g cpu=%.17g", err, a, c));
}

// The step's multi-tensor ops (issue 29) against the per-tensor ops on the same GPU, bit for bit:
// sum_squares_multi equals the per-region sums added in order, step_control torch's clip factor
// and the non-finite decision, adamw_multi one adamw call per piece (a skip changes nothing).
void test_step_ops(H& h) {
    const std::string sh = strfmt("[%s]", dtype_name(h.dt));
    const size_t n = 300000;
    const size_t cuts[][2] = {{0, 5}, {5, 4096}, {4101, 0}, {4101, 200000}, {204101, 95899}};
    Pair g = h.make(n);
    h.up(g, h.rnd(n, 0.3f));
    std::vector<Tensor> regions;
    double want = 0.0, got = -1.0;
    for (const auto& c : cuts) {
        regions.push_back(g.g.slice(c[0], c[1]));
        want += h.gpu.sum_squares(regions.back());
    }
    Pair scal = h.make(8, true);  // 2 doubles, then 2 floats
    double* dss = static_cast<double*>(scal.g.ptr);
    float* dctl = scal.g.f32() + 4;
    h.gpu.sum_squares_multi(dss, regions);
    h.gpu.to_host_bytes(&got, dss, sizeof got);
    report(std::memcmp(&got, &want, sizeof got) == 0, "step_ops.sum_squares_multi", sh,
           strfmt("multi=%.17g per-region=%.17g", got, want));
    // {ss, loss check, clip, loss scale}
    const double cases[][4] = {{16.0, 0.0, 1.0, 1.0},   {0.25, 0.0, 1.0, 1.0},      {16.0, 0.0, 0.0, 1.0},
                               {NAN, 0.0, 1.0, 1.0},    {4.0, INFINITY, 1.0, 1.0},  {16.0 * 1048576.0, 0.0, 1.0, 1024.0},
                               {144.0, 0.0, 0.0, 3.0},  {INFINITY, 0.0, 1.0, 65536.0}};
    for (const auto& c : cases) {
        float ctl[2];
        h.gpu.from_host_bytes(dss, c, 2 * sizeof(double));
        h.gpu.step_control(dctl, dss, c[2], c[3]);
        h.gpu.to_host_bytes(ctl, dctl, sizeof ctl);
        // the contract written out (Ops::step_control), not the CPU's code
        const float want_scale = float(double(clip_factor(std::sqrt(c[0]) / c[3], c[2])) / c[3]),
                    want_update = std::isfinite(c[0]) && std::isfinite(c[1]);
        report((ctl[0] == want_scale || (std::isnan(ctl[0]) && std::isnan(want_scale))) && ctl[1] == want_update,
               "step_ops.step_control", sh,
               strfmt("ss=%g check=%g clip=%g loss scale=%g: ctl %g %g, want %g %g", c[0], c[1], c[2], c[3], ctl[0], ctl[1], want_scale,
                      want_update));
    }
    for (bool master : {false, true}) {
        Pair pa = h.make(n), pb = h.make(n), ma = h.make(n, true), mb = h.make(n, true), va = h.make(n, true),
             vb = h.make(n, true), wa = h.make(n, true), wb = h.make(n, true);
        const std::vector<float> p0 = h.rnd(n, 1.0f), m0 = h.rnd(n, 0.01f, true);
        std::vector<float> v0 = h.rnd(n, 0.01f, true), w0 = p0;
        for (auto& x : v0) x = x * x;
        for (const Pair& p : {pa, pb}) h.up(p, p0);
        for (const Pair& p : {ma, mb}) h.up(p, m0);
        for (const Pair& p : {va, vb}) h.up(p, v0);
        for (const Pair& p : {wa, wb}) h.up(p, w0);
        const float decay[] = {0.1f, 0.0f, 0.1f, 0.1f, 0.05f}, lr = 1e-2f;
        std::vector<AdamWPiece> pieces;
        for (int i = 0; i < 5; i++) {
            const size_t o = cuts[i][0], k = cuts[i][1];
            h.gpu.adamw(pa.g.slice(o, k), master ? wa.g.f32() + o : nullptr, g.g.slice(o, k), ma.g.f32() + o,
                        va.g.f32() + o, lr, 0.9f, 0.95f, 1e-8f, decay[i], 0.7f, 3, 5u + (uint32_t)i, (uint32_t)o);
            pieces.push_back({pb.g.slice(o, k), master ? wb.g.f32() + o : nullptr, g.g.slice(o, k), mb.g.f32() + o,
                              vb.g.f32() + o, decay[i], 5u + (uint32_t)i, (uint32_t)o});
        }
        const float skip[2] = {0.7f, 0.0f}, update[2] = {0.7f, 1.0f};
        const std::vector<uint8_t> before = h.raw({pb, mb, vb, wb});
        h.gpu.from_host_bytes(dctl, skip, sizeof skip);
        h.gpu.adamw_multi(pieces, dctl, lr, 0.9f, 0.95f, 1e-8f, 3);
        report(h.raw({pb, mb, vb, wb}) == before, "step_ops.adamw_multi_skip", sh, strfmt("master=%d", (int)master));
        h.gpu.from_host_bytes(dctl, update, sizeof update);
        h.gpu.adamw_multi(pieces, dctl, lr, 0.9f, 0.95f, 1e-8f, 3);
        report(h.raw({pa, ma, va, wa}) == h.raw({pb, mb, vb, wb}), "step_ops.adamw_multi", sh,
               strfmt("master=%d: equals adamw per piece", (int)master));
    }
}

// CUDA graphs of a step (Ops::graph_step_begin, llmc/cuda/step_graph.cuh), on a backend of its own:
// each step uploads its own input (x_i, small integers: the sum of squares is exact), reduces it
// on the device, derives the clip factor from that (step_control) and reads both back, which ends
// the region. After a warm-up outside any region (the ops' first use may allocate scratch), the
// rules of step_graph.cuh give the modes: a clean warm-up, the capture, then replays, each step's
// result its own input's (a replay refills the arena), an upload over kUploadNoSync too; an
// allocation or a free between steps, and a changed key, drop the graph (warm-up, capture, replay
// again); an allocation inside three regions in a row gives graphs up for the backend, and the
// work still runs.
void test_step_graph() {
    std::unique_ptr<Ops> gpu = make_cuda_ops(0);
    const size_t big = Ops::kUploadNoSync / sizeof(float) + 1000;  // an upload over the ring's slots
    size_t n = 1000;
    float* x = static_cast<float*>(gpu->alloc(big * sizeof(float)));
    char* back = static_cast<char*>(gpu->alloc(64));  // ss: 2 doubles, then ctl: 2 floats
    double* ss = reinterpret_cast<double*>(back);
    float* ctl = reinterpret_cast<float*>(back + 2 * sizeof(double));
    const double clip = 1.0;
    std::vector<void*> extra;
    int step = 0;
    // one step under key `key`; `inside`: allocate during the region. Returns "<mode>" or "<mode> WRONG ..."
    auto run_step = [&](uint64_t key, bool inside) {
        step++;
        std::vector<float> xi(n);
        double want_ss = 0.0;
        for (size_t j = 0; j < n; j++) {
            xi[j] = float(int((j * 7 + size_t(step)) % 5) - 2) * float(step % 3 + 1);
            want_ss += double(xi[j]) * double(xi[j]);
        }
        const std::string mode = key ? gpu->graph_step_begin(key) : "outside";
        const double zero = 0.0;
        gpu->from_host_bytes(x, xi.data(), n * sizeof(float));
        gpu->from_host_bytes(ss + 1, &zero, sizeof zero);
        if (inside) extra.push_back(gpu->alloc(256));
        gpu->sum_squares_multi(ss, {Tensor(x, n, DType::F32)});
        gpu->step_control(ctl, ss, clip, 1.0);
        char got[2 * sizeof(double) + 2 * sizeof(float)];
        gpu->to_host_bytes(got, back, sizeof got);
        double got_ss;
        float got_ctl[2];
        std::memcpy(&got_ss, got, sizeof got_ss);
        std::memcpy(got_ctl, got + 2 * sizeof(double), sizeof got_ctl);
        const float want_scale = clip_factor(std::sqrt(want_ss), clip);  // (Ops::step_control's contract)
        if (got_ss != want_ss || got_ctl[0] != want_scale || got_ctl[1] != 1.0f)
            return strfmt("%s WRONG (ss %.17g ctl %g %g, want %.17g %g 1)", mode.c_str(), got_ss, got_ctl[0],
                          got_ctl[1], want_ss, want_scale);
        return mode;
    };
    auto expect = [&](const char* what, const std::vector<std::string>& want, uint64_t key, bool inside = false) {
        std::string got, wanted;
        for (const std::string& w : want) {
            const std::string m = run_step(key, inside);
            got += (got.empty() ? "" : ", ") + m;
            wanted += (wanted.empty() ? "" : ", ") + w;
        }
        report(got == wanted, "step_graph", strfmt("[%s]", what),
               strfmt("modes %s; want %s", got.c_str(), wanted.c_str()));
    };
    run_step(0, false);  // the ops' first use, outside any region
    const std::vector<std::string> fresh = {"warm-up", "capture", "replay", "replay"};
    expect("first graph", fresh, 1);
    extra.push_back(gpu->alloc(256));
    expect("an allocation between steps", fresh, 1);
    gpu->release(extra.back());
    extra.pop_back();
    expect("a free between steps", fresh, 1);
    expect("a new key", fresh, 2);
    // an upload larger than kUploadNoSync (it waits for the stream outside a graph) goes through the
    // graph's arena like the small ones (its reduction's scratch first grown outside a region)
    n = big;
    run_step(0, false);
    expect("an upload over 1 MiB", fresh, 3);
    n = 1000;
    expect("a new key", fresh, 4);  // (a replay's uploads must be the captured step's)
    // an allocation in a replayed region drops the graph at the next region's start; three
    // warm-ups in a row that allocate give graphs up (the reason names the allocation)
    expect("allocations inside the region", {"replay", "warm-up", "warm-up", "warm-up"}, 4, true);
    const std::string off = run_step(4, false);
    report(off.rfind("off: 3 steps in a row", 0) == 0 && off.find("1 allocations or frees") != std::string::npos &&
               off.find("WRONG") == std::string::npos,
           "step_graph", "[given up]", off);
    for (void* p : extra) gpu->release(p);
    gpu->release(back);
    gpu->release(x);
}

}  // namespace gpu_test
