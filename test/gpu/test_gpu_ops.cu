// Op-parity test of the CUDA backend against the CPU reference backend (like ggml's
// test-backend-ops). For every op, forward and backward, fp32, bf16 and fp16:
//  - fresh random inputs (for bf16 and fp16, rounded to the dtype first, so both backends see the
//    same values), several shapes including odd ones;
//  - GPU outputs poisoned (all bytes 0xFF = NaN in fp32, bf16 and fp16) before each run, so an
//    unwritten element fails; accumulate-outputs start from the same random values on
//    both backends instead;
//  - the GPU op runs twice and the two results must be bitwise identical (determinism); with
//    LLMC_GPU_DIGEST=FILE each such result's hash is written to FILE, so that two processes can
//    be compared (scripts/gpu_check.sh's ops stage compares its plain and its memcheck run);
//  - GPU vs CPU: norm-relative error ||gpu - cpu|| / ||cpu|| <= 1e-4 (fp32) / 2e-2 (bf16) / 2e-3 (fp16);
//    fp32 statistics (mean, rstd, lse, losses, master weights, moments) <= 1e-4 / 1e-3.
// Attention is also compared row by row (each head's output row, each dqkv row), so that one bad
// row cannot hide in a norm over many. The whole GPT-2 in fp32 against the committed PyTorch
// debug state (test_reference: loss, logits, gradients, the AdamW steps' losses and norms). Also
// optimizer offload: AdamW on the host (llmc/model/optimizer.h) against AdamW on the GPU (test_offload).
// One whole training step of a small GPT-2 and Llama against the CPU backend (model_step), and on the
// GPU activation offload against none, bit for bit.
// `test_gpu big` runs only the large cases (logits past 2^31 elements), which are too slow under
// compute-sanitizer and are left out of the default run.
// Prints one line per check and "N passed, M failed"; exit code 1 on any failure. Every case runs
// guarded, with checks_throw() set: a failed CUDA/cuBLASLt check, LLMC_ASSERT or an exception
// inside a case is one FAIL line naming the case, and the next case runs (after a sticky CUDA
// error, such as an illegal address, the later cases fail too: the device is lost).
// Prints "GPU tests: skipped (no CUDA device)" and exits 0 without a device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cuda/cuda_ops.h"
#include "llmc/core/common.h"
#include "llmc/core/config.h"
#include "llmc/model/moe.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/flash_backward_fused.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/ptx.cuh"
#include "llmc/model/model.h"
#include "llmc/backend/ops.h"
#include "llmc/model/optimizer.h"
#include "llmc/model/param_store.h"
#include "llmc/core/tensor.h"
#include "test/op_cases.h"
#include "test/ref_data.h"
#include "test/whole_model.h"

namespace {

int g_pass = 0, g_fail = 0;
std::vector<std::string> g_digest;  // "check shape hash" of every determinism-checked result

void digest(const std::string& name, const std::string& shape, const void* bytes, size_t n) {
    g_digest.push_back(strfmt("%s %s %016llx", name.c_str(), shape.c_str(), (unsigned long long)fnv1a(bytes, n)));
}

// LLMC_TEST_FAIL_FAST=1: the first FAIL ends the process (exit 1): test/cuemu/planted_bugs.sh needs
// one failure per mutant, not all of them
void report(bool ok, const std::string& name, const std::string& shape, const std::string& detail) {
    std::printf("%s %s %s %s\n", ok ? "PASS" : "FAIL", name.c_str(), shape.c_str(), detail.c_str());
    std::fflush(stdout);
    (ok ? g_pass : g_fail)++;
    static const bool fail_fast = std::getenv("LLMC_TEST_FAIL_FAST") && std::string(std::getenv("LLMC_TEST_FAIL_FAST")) == "1";
    if (!ok && fail_fast) std::exit(1);
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return (float)((next() >> 40) * (1.0 / 16777216.0)); }  // [0, 1)
    float normal() {
        float u1 = uniform(), u2 = uniform();
        if (u1 < 1e-7f) u1 = 1e-7f;
        return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
    int below(int n) { return (int)(next() % (uint64_t)n); }
};

// One tensor on both backends: c = CPU (fp32), g = GPU (the test dtype, or fp32 for statistics).
struct Pair {
    Tensor c, g;
    bool stat = false;
    size_t n() const { return c.n; }
};

class H {
public:
    Ops& cpu;
    Ops& gpu;
    DType dt;
    Rng rng;
    H(Ops& c, Ops& g, DType d, uint64_t seed) : cpu(c), gpu(g), dt(d), rng(seed) {}
    ~H() {
        for (void* p : cpu_allocs_) cpu.release(p);
        for (void* p : gpu_allocs_) gpu.release(p);
    }
    // a 16-bit dtype (bf16 or fp16): inputs rounded to it, looser tolerances
    bool low() const { return dt != DType::F32; }
    double tol(bool stat) const {
        return dt == DType::BF16 ? (stat ? 1e-3 : 2e-2) : dt == DType::F16 ? (stat ? 1e-3 : 2e-3) : 1e-4;
    }

    Pair make(size_t n, bool stat = false) {
        Pair p;
        p.stat = stat;
        void* pc = cpu.alloc(n * 4);
        DType gd = stat ? DType::F32 : dt;
        void* pg = gpu.alloc(n * dtype_size(gd));
        cpu_allocs_.push_back(pc);
        gpu_allocs_.push_back(pg);
        p.c = Tensor(pc, n, DType::F32);
        p.g = Tensor(pg, n, gd);
        return p;
    }
    // n elements of p from element `off` on (both backends)
    static Pair shifted(const Pair& p, size_t off, size_t n) {
        Pair q = p;
        q.c = p.c.slice(off, n);
        q.g = p.g.slice(off, n);
        return q;
    }
    // n new elements `off` past an aligned address (as a slice of a larger tensor can sit)
    Pair make_at(size_t n, size_t off) { return off ? shifted(make(n + off), off, n) : make(n); }
    // int32 array on both backends
    std::pair<int32_t*, int32_t*> ints(const std::vector<int32_t>& v) {
        void* pc = cpu.alloc(v.size() * 4);
        void* pg = gpu.alloc(v.size() * 4);
        cpu_allocs_.push_back(pc);
        gpu_allocs_.push_back(pg);
        cpu.from_host_bytes(pc, v.data(), v.size() * 4);
        gpu.from_host_bytes(pg, v.data(), v.size() * 4);
        return {(int32_t*)pc, (int32_t*)pg};
    }
    static float q_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }
    // x rounded to the test dtype (unchanged in fp32)
    float q(float x) const { return dt == DType::BF16 ? q_bf16(x) : dt == DType::F16 ? round_f16(x) : x; }
    // random N(0, scale^2) values, rounded to the dtype unless stat
    std::vector<float> rnd(size_t n, float scale, bool stat = false) {
        std::vector<float> v(n);
        for (auto& x : v) {
            x = scale * rng.normal();
            if (!stat) x = q(x);
        }
        return v;
    }
    std::vector<float> rnd_for(const Pair& p, float scale) { return rnd(p.n(), scale, p.stat); }
    void up(const Pair& p, const std::vector<float>& v) {
        cpu.from_host_f32(p.c, v.data());
        gpu.from_host_f32(p.g, v.data());
    }
    void up_gpu(const Pair& p, const std::vector<float>& v) { gpu.from_host_f32(p.g, v.data()); }
    void poison(const Pair& p) {
        std::vector<uint8_t> ff(p.g.bytes(), 0xFF);
        gpu.from_host_bytes(p.g.ptr, ff.data(), ff.size());
    }
    std::vector<uint8_t> raw(std::initializer_list<Pair> ps) {
        gpu.synchronize();
        std::vector<uint8_t> out;
        for (const Pair& p : ps) {
            size_t o = out.size();
            out.resize(o + p.g.bytes());
            gpu.to_host_bytes(out.data() + o, p.g.ptr, p.g.bytes());
        }
        return out;
    }
    std::vector<float> get_gpu(const Pair& p) {
        std::vector<float> v(p.n());
        gpu.to_host_f32(v.data(), p.g);
        return v;
    }
    std::vector<float> get_cpu(const Pair& p) {
        std::vector<float> v(p.n());
        cpu.to_host_f32(v.data(), p.c);
        return v;
    }
    // norm-relative error of gpu vs cpu; NaN anywhere fails
    void compare(const std::string& name, const std::string& shape, const Pair& p) {
        std::vector<float> g = get_gpu(p), c = get_cpu(p);
        compare_vec(name, shape, g, c, tol(p.stat));
    }
    static void compare_vec(const std::string& name, const std::string& shape, const std::vector<float>& g,
                            const std::vector<float>& c, double tol) {
        double num = 0, den = 0;
        size_t bad = 0, first_bad = (size_t)-1;
        for (size_t i = 0; i < g.size(); i++) {
            if (!std::isfinite(g[i]) || !std::isfinite(c[i])) {
                bad++;
                if (first_bad == (size_t)-1) first_bad = i;
                continue;
            }
            double d = (double)g[i] - (double)c[i];
            num += d * d;
            den += (double)c[i] * c[i];
        }
        double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        bool ok = bad == 0 && err <= tol;
        std::string detail = strfmt("err=%.3e tol=%.0e", err, tol);
        if (bad)
            detail += strfmt(" non-finite=%zu (first at %zu: gpu=%g cpu=%g)", bad, first_bad, g[first_bad],
                             c[first_bad]);
        report(ok, name, shape, detail);
    }
    // row by row: the largest ||g_r - c_r|| / (||c_r|| + floor) over rows of `row` values, floor a
    // tenth of the rows' root-mean-square norm (a near-zero row is judged against typical rows)
    static void compare_rows(const std::string& name, const std::string& shape, const std::vector<float>& g,
                             const std::vector<float>& c, size_t row, double tol) {
        const size_t rows = row ? c.size() / row : 0;
        double all = 0;
        for (float x : c) all += (double)x * x;
        const double floor = rows ? 0.1 * std::sqrt(all / rows) : 0.0;
        double worst = 0;
        size_t at = 0;
        bool finite = g.size() == c.size();
        for (size_t r = 0; r < rows && finite; r++) {
            double num = 0, den = 0;
            for (size_t i = r * row; i < (r + 1) * row; i++) {
                finite = finite && std::isfinite(g[i]) && std::isfinite(c[i]);
                const double d = (double)g[i] - (double)c[i];
                num += d * d;
                den += (double)c[i] * c[i];
            }
            const double e = std::sqrt(num) / (std::sqrt(den) + floor);
            if (e > worst) worst = e, at = r;
        }
        report(finite && rows > 0 && worst <= tol, name + ".rows", shape,
               strfmt("worst row %zu of %zu: err=%.3e tol=%.0e%s", at, rows, worst, tol, finite ? "" : " non-finite"));
    }
    void det(const std::string& name, const std::string& shape, const std::vector<uint8_t>& a,
             const std::vector<uint8_t>& b) {
        size_t diff = 0;
        for (size_t i = 0; i < a.size(); i++) diff += a[i] != b[i];
        report(a.size() == b.size() && diff == 0, name + ".determinism", shape, strfmt("differing_bytes=%zu", diff));
        digest(name, shape, a.data(), a.size());
    }

private:
    std::vector<void*> cpu_allocs_, gpu_allocs_;
};

// ---------------------------------------------------------------- tests
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

// qkv [BT, NH + 2*NKV, HS] -> [BT, 3, NH, HS] with every key/value head repeated for the query
// heads of its group: multi-head attention on it is grouped-query attention on qkv.
std::vector<float> expand_kv(const std::vector<float>& qkv, size_t BT, int NH, int NKV, int HS) {
    const int G = NH / NKV, NQ = NH + 2 * NKV;
    std::vector<float> e(BT * 3 * NH * HS);
    for (size_t bt = 0; bt < BT; bt++)
        for (int s = 0; s < 3; s++)
            for (int hd = 0; hd < NH; hd++) {
                const int src = s == 0 ? hd : NH + (s - 1) * NKV + hd / G;
                std::copy_n(&qkv[(bt * NQ + src) * HS], HS, &e[((bt * 3 + s) * NH + hd) * HS]);
            }
    return e;
}
// the gradient through expand_kv: the repeated heads' gradients summed over each group (in double)
std::vector<float> reduce_kv(const std::vector<float>& de, size_t BT, int NH, int NKV, int HS) {
    const int G = NH / NKV, NQ = NH + 2 * NKV;
    std::vector<double> acc(BT * NQ * HS, 0.0);
    for (size_t bt = 0; bt < BT; bt++)
        for (int s = 0; s < 3; s++)
            for (int hd = 0; hd < NH; hd++) {
                const int dst = s == 0 ? hd : NH + (s - 1) * NKV + hd / G;
                for (int d = 0; d < HS; d++) acc[(bt * NQ + dst) * HS + d] += de[((bt * 3 + s) * NH + hd) * HS + d];
            }
    return std::vector<float>(acc.begin(), acc.end());
}

// Attention with NKV key/value heads (NKV == NH: multi-head). The reference is the CPU's
// multi-head attention on the expanded qkv (expand_kv), its dqkv reduced over the groups;
// with NKV < NH the CPU's grouped-query attention is compared as well (last: it may be missing).
void test_attention(H& h, int B, int T, int NH, int NKV, int HS) {
    const std::string sh = strfmt("[%s B=%d T=%d NH=%d NKV=%d HS=%d]", dtype_name(h.dt), B, T, NH, NKV, HS);
    const int NQ = NH + 2 * NKV;
    const size_t BT = (size_t)B * T, nqkv = BT * NQ * HS, no = BT * NH * HS, nl = (size_t)B * NH * T;
    Pair qkv = h.make(nqkv), out = h.make(no), lse = h.make(nl, true);
    const std::vector<float> vqkv = h.rnd(nqkv, 1.0f);
    h.up(qkv, vqkv);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(lse);
        h.gpu.attention_forward(out.g, lse.g.f32(), qkv.g, B, T, NH, NKV, HS);
        r[rep] = h.raw({out, lse});
    }
    h.det("attention_forward", sh, r[0], r[1]);
    const std::vector<float> gout = h.get_gpu(out), glse = h.get_gpu(lse);
    std::vector<float> eqkv = expand_kv(vqkv, BT, NH, NKV, HS), rout(no), rlse(nl);
    const Tensor teqkv(eqkv.data(), eqkv.size(), DType::F32);
    h.cpu.attention_forward(Tensor(rout.data(), no, DType::F32), rlse.data(), teqkv, B, T, NH, NH, HS);
    H::compare_vec("attention_forward.out", sh, gout, rout, h.tol(false));
    H::compare_rows("attention_forward.out", sh, gout, rout, HS, h.tol(false));
    H::compare_vec("attention_forward.lse", sh, glse, rlse, h.tol(true));

    // backward: both sides get the reference forward's out (rounded to bf16 in bf16) and lse
    std::vector<float> vout = rout;
    for (auto& x : vout) x = h.q(x);
    h.up(out, vout);
    h.up(lse, rlse);
    Pair dout = h.make(no), dqkv = h.make(nqkv);
    const std::vector<float> vdout = h.rnd(no, 1.0f);
    h.up(dout, vdout);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(dqkv);
        h.gpu.attention_backward(dqkv.g, dout.g, qkv.g, out.g, lse.g.f32(), B, T, NH, NKV, HS);
        r[rep] = h.raw({dqkv});
    }
    h.det("attention_backward", sh, r[0], r[1]);
    const std::vector<float> gdqkv = h.get_gpu(dqkv);
    std::vector<float> edqkv(eqkv.size()), edout = vdout;
    h.cpu.attention_backward(Tensor(edqkv.data(), edqkv.size(), DType::F32), Tensor(edout.data(), no, DType::F32),
                             teqkv, Tensor(vout.data(), no, DType::F32), rlse.data(), B, T, NH, NH, HS);
    const std::vector<float> ref = reduce_kv(edqkv, BT, NH, NKV, HS);
    // whole dqkv, then per slot (q, k, v) to help localise a bug
    H::compare_vec("attention_backward.dqkv", sh, gdqkv, ref, h.tol(false));
    H::compare_rows("attention_backward.dqkv", sh, gdqkv, ref, HS, h.tol(false));
    const char* names[3] = {"dq", "dk", "dv"};
    const int first[4] = {0, NH, NH + NKV, NQ};
    for (int s = 0; s < 3; s++) {
        std::vector<float> gs, cs;
        for (size_t bt = 0; bt < BT; bt++)
            for (size_t i = (size_t)first[s] * HS; i < (size_t)first[s + 1] * HS; i++) {
                gs.push_back(gdqkv[bt * NQ * HS + i]);
                cs.push_back(ref[bt * NQ * HS + i]);
            }
        H::compare_vec(std::string("attention_backward.") + names[s], sh, gs, cs, h.tol(false));
    }

    if (NKV == NH) return;
    // the CPU backend's grouped-query attention on the same inputs
    h.cpu.attention_forward(out.c, lse.c.f32(), qkv.c, B, T, NH, NKV, HS);
    H::compare_vec("attention_forward_cpu_gqa.out", sh, gout, h.get_cpu(out), h.tol(false));
    H::compare_vec("attention_forward_cpu_gqa.lse", sh, glse, h.get_cpu(lse), h.tol(true));
    h.up(out, vout);
    h.up(lse, rlse);
    h.cpu.attention_backward(dqkv.c, dout.c, qkv.c, out.c, lse.c.f32(), B, T, NH, NKV, HS);
    H::compare_vec("attention_backward_cpu_gqa.dqkv", sh, gdqkv, h.get_cpu(dqkv), h.tol(false));
}

// Context parallelism's ring ops (attention_block_forward, attention_merge,
// attention_block_backward) on the blocks of the load-balanced split of B sequences of T tokens
// over cp ranks: every (rank, block) pair in the ring's order, each op on the same inputs on both
// backends (the CPU's results of the previous op, rounded to bf16 in bf16). Rows that see no key
// of a block must have lse -inf on both (and out 0).
// The fused backward's splits of a head's key tiles (flash::split_tile, host code): for every count
// of splits S and tiles, each tile in exactly one split, each split's tiles increasing (the order
// its dQ reductions take), and the splits' query-tile work (a causal tile's: tiles - its index)
// less than 2S apart (every S-th tile instead would drift apart each round: 20 at 39 tiles, 2
// splits); fused_splits within [1, tiles]. The op cases reach a few of these (at most 5 tiles, one
// split or one tile a split).
void test_fused_splits() {
    std::string why;
    for (int tiles = 1; tiles <= 40 && why.empty(); tiles++)
        for (int S = 1; S <= tiles && why.empty(); S++) {
            std::vector<int> seen(tiles, 0);
            long long lo = 1LL << 40, hi = 0;
            for (int s = 0; s < S; s++) {
                long long work = 0;
                for (int m = 0, prev = -1;; m++) {
                    const int kt = flash::split_tile(s, S, m);
                    if (kt >= tiles) break;
                    if (kt <= prev) why = strfmt("split %d of %d: tile %d after %d", s, S, kt, prev);
                    seen[kt]++, prev = kt, work += tiles - kt;
                }
                lo = std::min(lo, work), hi = std::max(hi, work);
            }
            for (int t = 0; t < tiles && why.empty(); t++)
                if (seen[t] != 1) why = strfmt("%d tiles, %d splits: tile %d in %d splits", tiles, S, t, seen[t]);
            if (why.empty() && hi - lo >= 2 * S)
                why = strfmt("%d tiles, %d splits: work %lld to %lld", tiles, S, lo, hi);
            const int f = flash::fused_splits(S * 7, tiles, 396);
            if (why.empty() && (f < 1 || f > tiles)) why = strfmt("fused_splits(%d, %d, 396) = %d", S * 7, tiles, f);
        }
    report(why.empty(), "attention_fused.splits", "[1-40 key tiles, every split count]",
           why.empty() ? "every tile once, in order; work within a round" : why);
}

void test_attention_ring(H& h, int B, int T, int NH, int NKV, int HS, int cp) {
    const std::string sh =
        strfmt("[%s B=%d T=%d NH=%d NKV=%d HS=%d cp=%d]", dtype_name(h.dt), B, T, NH, NKV, HS, cp);
    const int NQ = NH + 2 * NKV, t = T / cp;
    const size_t W = (size_t)NQ * HS, nq = (size_t)B * t * W, no = (size_t)B * t * NH * HS, nl = (size_t)B * NH * t;
    const std::vector<float> whole = h.rnd((size_t)B * T * W, 1.0f);
    std::vector<std::vector<float>> blk(cp, std::vector<float>(nq));
    for (int r = 0; r < cp; r++) {
        const SeqPositions p = cp_positions(t, cp, r);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < t; i++)
                std::copy_n(whole.begin() + ((size_t)b * T + p.at(i)) * W, W, blk[r].begin() + ((size_t)b * t + i) * W);
    }
    auto round = [&](std::vector<float> v) {
        for (auto& x : v) x = h.q(x);
        return v;
    };
    // lse with -inf rows: the same rows on both sides, compared without them
    auto compare_lse = [&](const std::string& name, std::vector<float> g, std::vector<float> c) {
        size_t mismatch = 0;
        for (size_t i = 0; i < g.size(); i++)
            if (std::isinf(g[i]) || std::isinf(c[i])) {
                mismatch += !(g[i] == -INFINITY && c[i] == -INFINITY);
                g[i] = c[i] = 0.0f;
            }
        report(mismatch == 0, name + ".no_key_rows", sh, strfmt("mismatched=%zu", mismatch));
        H::compare_vec(name, sh, g, c, h.tol(true));
    };
    Pair q = h.make(nq), kv = h.make(nq), out = h.make(no), lse = h.make(nl, true), bo = h.make(no),
         bl = h.make(nl, true), dout = h.make(no), dq = h.make(nq), dkv = h.make(nq);
    std::vector<uint8_t> r2[2];
    for (int r = 0; r < cp; r++) {
        const SeqPositions qp = cp_positions(t, cp, r);
        h.up(q, blk[r]);
        std::vector<float> run_out, run_lse;  // the CPU's running result
        for (int s = 0; s < cp; s++) {
            const int o = (r + cp - s) % cp;
            const SeqPositions kp = cp_positions(t, cp, o);
            h.up(kv, blk[o]);
            h.cpu.attention_block_forward(bo.c, bl.c.f32(), q.c, kv.c, B, t, t, NH, NKV, HS, qp, kp);
            for (int rep = 0; rep < 2; rep++) {
                h.poison(bo), h.poison(bl);
                h.gpu.attention_block_forward(bo.g, bl.g.f32(), q.g, kv.g, B, t, t, NH, NKV, HS, qp, kp);
                r2[rep] = h.raw({bo, bl});
            }
            h.det("attention_block_forward", sh, r2[0], r2[1]);
            h.compare("attention_block_forward.out", sh, bo);
            compare_lse("attention_block_forward.lse", h.get_gpu(bl), h.get_cpu(bl));
            if (s == 0) {
                run_out = h.get_cpu(bo), run_lse = h.get_cpu(bl);
                continue;
            }
            // merge: the CPU's running result and block on both sides
            const std::vector<float> vbo = round(h.get_cpu(bo)), vbl = h.get_cpu(bl), vout = round(run_out);
            h.up(bo, vbo), h.up(bl, vbl), h.up(out, vout), h.up(lse, run_lse);
            h.cpu.attention_merge(out.c, lse.c.f32(), bo.c, bl.c.f32(), B, t, NH, HS);
            for (int rep = 0; rep < 2; rep++) {
                h.up_gpu(out, vout), h.up_gpu(lse, run_lse);
                h.gpu.attention_merge(out.g, lse.g.f32(), bo.g, bl.g.f32(), B, t, NH, HS);
                r2[rep] = h.raw({out, lse});
            }
            h.det("attention_merge", sh, r2[0], r2[1]);
            h.compare("attention_merge.out", sh, out);
            compare_lse("attention_merge.lse", h.get_gpu(lse), h.get_cpu(lse));
            run_out = h.get_cpu(out), run_lse = h.get_cpu(lse);
        }
        // backward of each block, from the whole (merged) out and lse, accumulating onto random values
        h.up(out, round(run_out)), h.up(lse, run_lse);
        h.up(dout, h.rnd(no, 1.0f));
        for (int o = 0; o < cp; o++) {
            const SeqPositions kp = cp_positions(t, cp, o);
            h.up(kv, blk[o]);
            const std::vector<float> dq0 = h.rnd(nq, 1.0f), dkv0 = h.rnd(nq, 1.0f);
            h.up(dq, dq0), h.up(dkv, dkv0);
            h.cpu.attention_block_backward(dq.c, dkv.c, dout.c, q.c, kv.c, out.c, lse.c.f32(), B, t, t, NH, NKV, HS, qp,
                                           kp);
            for (int rep = 0; rep < 2; rep++) {
                h.up_gpu(dq, dq0), h.up_gpu(dkv, dkv0);
                h.gpu.attention_block_backward(dq.g, dkv.g, dout.g, q.g, kv.g, out.g, lse.g.f32(), B, t, t, NH, NKV, HS,
                                               qp, kp);
                r2[rep] = h.raw({dq, dkv});
            }
            h.det("attention_block_backward", sh, r2[0], r2[1]);
            h.compare("attention_block_backward.dq", sh, dq);
            h.compare("attention_block_backward.dkv", sh, dkv);
        }
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
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.up_gpu(logits, vg);
        h.poison(losses);
        h.gpu.cross_entropy(logits.g, losses.g.f32(), tg, N, V, Vp, dloss);
        r[rep] = h.raw({logits, losses});
    }
    h.det("cross_entropy", sh, r[0], r[1]);
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

#include "test/gpu/ptx_test.cuh"

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

void guarded(const std::string& what, const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        report(false, what, "", std::string("exception: ") + e.what());
    }
}

}  // namespace

int main(int argc, char** argv) {
    // LLMC_TEST_GPU_ON_CPU=1: the CPU backend stands in for the GPU (every comparison is then CPU
    // against CPU): checks this harness itself (its cases, indexing, digests) on a machine without one
    const bool on_cpu = std::getenv("LLMC_TEST_GPU_ON_CPU") && std::string(std::getenv("LLMC_TEST_GPU_ON_CPU")) == "1";
    if (!on_cpu && !cuda_device_available()) {
        std::printf("GPU tests: skipped (no CUDA device)\n");
        return 0;
    }
    checks_throw() = true;  // a failed check ends its case (a FAIL line), not the process
    std::unique_ptr<Ops> cpu = make_cpu_ops();
    std::unique_ptr<Ops> gpu = on_cpu ? make_cpu_ops() : make_cuda_ops(0);
    if (on_cpu) {
        std::printf("GPU tests with the CPU backend in the GPU's place (LLMC_TEST_GPU_ON_CPU=1)\n");
    } else {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("GPU tests on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    }
    const std::string only = argc > 1 ? argv[1] : "";  // optional filter: encoder, layernorm, rope, ...
    auto want = [&](const char* s) { return only.empty() || only == s; };
    if (only == "big") {  // the large cases alone (not in the default run: too slow under compute-sanitizer)
        H h(*cpu, *gpu, on_cpu ? DType::F32 : DType::BF16, 3);
        guarded("cross_entropy_big", [&] { test_cross_entropy_big(h); });
        std::printf("%d passed, %d failed\n", g_pass, g_fail);
        return g_fail ? 1 : 0;
    }

    // (the CPU backend computes in fp32 only: in its place, fp32 alone). LLMC_TEST_DTYPES (e.g.
    // "fp32,bf16") runs only the dtypes it names (test/cuemu/run.sh's second schedule leaves fp16 out).
    // names(list, d): a comma-separated list of dtype names ("fp32,bf16") holds d's
    auto names = [](const char* list, DType d) {
        return ("," + std::string(list) + ",").find("," + std::string(dtype_name(d)) + ",") != std::string::npos;
    };
    std::vector<DType> dtypes;
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
        const char* only_dt = std::getenv("LLMC_TEST_DTYPES");
        if ((on_cpu && d != DType::F32) || (only_dt && !names(only_dt, d))) continue;
        dtypes.push_back(d);
    }
    for (DType dt : dtypes) {
        H h(*cpu, *gpu, dt, dt == DType::F32 ? 1 : dt == DType::BF16 ? 2 : 5);
        // every case of the op-case table marked Gpu (test/op_cases.h)
        // LLMC_TEST_SKIP_LONG=1 leaves out the cases marked Long (the emulator's second schedule);
        // LLMC_TEST_LONG_DTYPES (e.g. "fp32,bf16") runs them only in the dtypes it names (the first
        // schedule: fp16's are bf16's templates, 25 s of T = 1024 attention there)
        static const bool skip_long_always =
            std::getenv("LLMC_TEST_SKIP_LONG") && std::string(std::getenv("LLMC_TEST_SKIP_LONG")) == "1";
        const char* long_dt = std::getenv("LLMC_TEST_LONG_DTYPES");
        const bool skip_long = skip_long_always || (long_dt && !names(long_dt, dt));
        auto run = [&](const char* op, const char* filter, const std::function<void(const op_cases::Case&)>& f) {
            if (!want(filter)) return;
            int i = 0;
            for (const op_cases::Case& c : op_cases::of(op, op_cases::Gpu)) {
                // each case draws its inputs from its own seed (dtype, filter, index): the same values
                // whatever ran before it (a filter alone, a case left out)
                h.rng = Rng(fnv1a(filter, std::strlen(filter)) ^ (uint64_t(i) << 8) ^ uint64_t(dt));
                if (skip_long && (c.modes & op_cases::Long)) {
                    i++;
                    continue;
                }
                guarded(strfmt("%s case %d", filter, i++), [&] { f(c); });
            }
        };
        using C = op_cases::Case;
        run("encoder", "encoder", [&](const C& c) { test_encoder(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3]); });
        run("encoder_slice", "encoder_slice", [&](const C& c) {
            test_encoder_slice(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5], c.dims[6] != 0);
        });
        run("layernorm", "layernorm",
            [&](const C& c) { test_layernorm(h, c.dims[0], c.dims[1], c.dims.size() > 2 ? c.dims[2] : 0); });
        // (CUDA's rule: the backward's shared-memory accumulators bound d_model; the CPU has none)
        if (want("layernorm") && !on_cpu) guarded("layernorm_too_wide", [&] { test_layernorm_too_wide(h); });
        run("residual", "residual",
            [&](const C& c) { test_residual(h, size_t(c.dims[0]), c.dims.size() > 1 ? c.dims[1] : 0); });
        run("matmul", "matmul", [&](const C& c) {
            test_matmul(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0, c.dims[4] != 0, c.dims[5],
                        c.dims.size() > 6 ? c.dims[6] : 0);
        });
#ifdef LLMC_CUEMU
        // The cases again on a backend whose (emulated) cuBLASLt refuses the GELU-aux and
        // bias-gradient epilogues, as a GPU with no algorithm for them would: CudaOps's kernels
        // in their place (a fresh backend: the algorithm choices are its own), against the CPU.
        if (want("matmul") && !on_cpu) {
            setenv("CUEMU_LT_REFUSE_EPILOGUES", "1", 1);
            std::unique_ptr<Ops> plain = make_cuda_ops(0);
            {
                H hp(*cpu, *plain, dt, dt == DType::F32 ? 3 : dt == DType::BF16 ? 4 : 6);
                int i = 0;
                for (const C& c : op_cases::of("matmul", op_cases::Gpu))
                    guarded(strfmt("matmul (kernels for the epilogues) case %d", i++), [&] {
                        test_matmul(hp, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0, c.dims[4] != 0, c.dims[5],
                                    c.dims.size() > 6 ? c.dims[6] : 0, " kernels");
                    });
            }
            unsetenv("CUEMU_LT_REFUSE_EPILOGUES");
        }
#endif
        // "attention" runs the multi-head cases, "attention_gqa" the grouped-query ones
        run("attention", "attention", [&](const C& c) {
            if (c.dims[2] == c.dims[3]) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        run("attention", "attention_gqa", [&](const C& c) {
            if (c.dims[2] != c.dims[3]) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        // the flash forward's two m-tiles a warp where the trainer does not take them (Q reloaded
        // from shared memory; dev/cuda/attention_forward v5 above head size 64, v6 at 64 with
        // 128-key tiles; the trainer's choices until a GPU has timed them)
        // (bf16 and fp16 only, here and in attention_bwd32: fp32 runs the general kernels, which
        // `attention` tests; on the emulator T <= 257: T = 1024 is the same tile loops with more
        // tiles, which `attention` runs there with the trainer's choices; 7-11 s a case in bf16)
        const bool flash_dtype = dt != DType::F32;
#ifdef LLMC_CUEMU
        const int variant_max_t = 257;
#else
        const int variant_max_t = 1 << 30;
#endif
        // (each variant on this CudaOps's ways, then its defaults again)
        auto ways = [&](const KernelWays& w) { set_cuda_kernel_ways(*gpu, w); };
        KernelWays w;
        w.fwd_rows_per_warp = 32;
        run("attention", "attention_mt2", [&](const C& c) {
            const int hs = c.dims[4];
            if (!flash_dtype || hs % 16 || hs > 128 || hs < 64 || (hs == 64 && c.dims[1] > 257) ||
                c.dims[1] > variant_max_t)
                return;
            w.fwd_key_tile = hs == 64 ? 128 : 0;
            ways(w);
            test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], hs);
        });
        w = KernelWays();
        // the flash backward's ways that `attention` does not take (its choice: dev/cuda/attention_backward
        // v6 at head size 64, two m-tiles at 32, v3 above): the 32-row tiles, 16 rows a warp, that a
        // device short of shared memory (sm_86/sm_89 at head size 128) runs (v5); the dK/dV kernel's
        // two passes of 32 query columns at head size 128 (v6); at head size 64 two m-tiles (v4) and
        // one pass (v3); dQ from dS^T in memory (v7)
        w.bwd_rows_per_warp = 16, w.bwd_tile = 32;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= 257 && c.dims[4] % 16 == 0 && c.dims[4] >= 32 && c.dims[4] <= 128)
                test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        w.bwd_tile = 0, w.bwd_pass = 32;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= 257 && c.dims[4] == 128) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        for (int rows : {32, 16}) {
            w.bwd_rows_per_warp = rows, w.bwd_pass = 64;
            ways(w);
            run("attention", "attention_bwd32", [&](const C& c) {
                if (flash_dtype && c.dims[1] <= 257 && c.dims[4] == 64) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
            });
        }
        // dQ from the dS^T the dK/dV kernel writes (v7) at head sizes 64 and 128, every GQA case
        w = KernelWays();
        w.bwd_dq = 1;
        ways(w);
        run("attention", "attention_bwd32", [&](const C& c) {
            if (flash_dtype && c.dims[1] <= variant_max_t && (c.dims[4] == 64 || c.dims[4] == 128)) test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
        });
        // one kernel, dQ in fp32 accumulators (v8) at head sizes 64 and 128: the splits the device's size
        // chooses (several for these small grids), then one split
        if (want("attention_fused") && dt == DType::BF16) guarded("attention_fused splits", [&] { test_fused_splits(); });
        w.bwd_dq = 2;
        for (int splits : {0, 1}) {
            w.fused_splits = splits;
            ways(w);
            run("attention", "attention_fused", [&](const C& c) {
                if (flash_dtype && c.dims[1] <= variant_max_t && (c.dims[4] == 64 || c.dims[4] == 128))
                    test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
            });
        }
        // the flash forward and the backward on Hopper's wgmma at head sizes 64 and 128, the
        // multi-head, grouped-query and ring-block cases (positions): attention_forward v7 with
        // attention_backward v9 (the dQ kernel), v8 (pipelined) with v10 (the dK/dV kernel too; v12
        // at head size 128), v7 with v11 (both kernels pipelined; at 128 the dQ kernel alone, Q and
        // dO from shared memory) and v7 with v12 (K and V from shared memory) at 64; V, K, Q and dO
        // read MN-major (filter attention_wgmma_mn): v10 with v15 (v11's), v9 with v13 (v10/v12's),
        // v10 with v14 (v12's, at 64); where the build or the device has no wgmma, one SKIP line a
        // filter
        if (want("attention_wgmma") && flash_dtype) {  // the config's names for them reach KernelWays
            const KernelWays parsed = cuda_kernel_ways("wgmma", "wgmma_dq", "auto");
            const KernelWays both = cuda_kernel_ways("wgmma_pipelined", "wgmma", "auto");
            const KernelWays pipe = cuda_kernel_ways("auto", "wgmma_pipelined", "auto");
            const KernelWays ss = cuda_kernel_ways("auto", "wgmma_ss", "auto");
            const KernelWays mn = cuda_kernel_ways("wgmma", "wgmma", "auto", "mn_major");
            report(parsed.fwd_wgmma == 1 && parsed.fwd_key_tile == 0 && parsed.bwd_dq == 3 && both.bwd_dq == 4 &&
                       both.fwd_wgmma == 2 && both.fwd_key_tile == 0 && pipe.bwd_dq == 5 && pipe.fwd_wgmma == 0 &&
                       ss.bwd_dq == 6 && !ss.wgmma_mn && mn.wgmma_mn && mn.bwd_dq == 4 && mn.fwd_wgmma == 1,
                   "attention_wgmma.config", dtype_name(dt),
                   strfmt("kernels.attention_forward=wgmma, attention_backward=wgmma_dq: fwd_wgmma %d, "
                          "fwd_key_tile %d, bwd_dq %d; =wgmma_pipelined, =wgmma: fwd_wgmma %d, bwd_dq %d; "
                          "attention_backward=wgmma_pipelined: bwd_dq %d; =wgmma_ss: %d, wgmma_mn %d; "
                          "attention_wgmma_layout=mn_major: %d",
                          parsed.fwd_wgmma, parsed.fwd_key_tile, parsed.bwd_dq, both.fwd_wgmma, both.bwd_dq,
                          pipe.bwd_dq, ss.bwd_dq, (int)ss.wgmma_mn, (int)mn.wgmma_mn));
        }
        struct WgPass {
            int fwd, bwd;  // KernelWays::fwd_wgmma, bwd_dq
            bool mn;       // KernelWays::wgmma_mn: its own filter (an abort on a GPU ends only it)
        };
        auto wgmma_skip = [&](const char* filter, bool wanted) {
            if (wanted && flash_dtype && !flash::wgmma_available())
                std::printf("SKIP %s [%s]: not an sm_90 device with sm_90a code\n", filter, dtype_name(dt));
        };
        wgmma_skip("attention_wgmma", want("attention_wgmma"));
        wgmma_skip("attention_wgmma_mn", want("attention_wgmma_mn"));
        // (the pipelined passes first: a kernel that fails in several fails there soonest; the MN
        // passes in bf16 alone, fp16 being the same templates with another type, which the
        // transposed passes and ptx.wgmma_mn_major run)
        if (flash::wgmma_available())
            for (const WgPass p : {WgPass{2, 4, false}, WgPass{1, 5, false}, WgPass{1, 3, false}, WgPass{1, 6, false},
                                   WgPass{2, 5, true}, WgPass{1, 4, true}, WgPass{2, 6, true}}) {
                if (p.mn && dt == DType::F16) continue;
                const char* filter = p.mn ? "attention_wgmma_mn" : "attention_wgmma";
                const int bwd = p.bwd;
                w = KernelWays();
                w.fwd_wgmma = p.fwd;
                w.bwd_dq = bwd;
                w.wgmma_mn = p.mn;
                ways(w);
                // (at head size 128, 6 is 4's kernels)
                auto hs_ok = [&](int hs) { return hs == 64 || (hs == 128 && bwd != 6); };
                run("attention", filter, [&](const C& c) {
                    if (flash_dtype && c.dims[1] <= variant_max_t && hs_ok(c.dims[4]))
                        test_attention(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4]);
                });
                run("attention_ring", filter, [&](const C& c) {
                    if (flash_dtype && c.dims[1] <= variant_max_t && hs_ok(c.dims[4]))
                        test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
                });
            }
        w = KernelWays();
        ways(w);
        run("rmsnorm", "rmsnorm", [&](const C& c) { test_rmsnorm(h, c.dims[0], c.dims[1], c.x); });
        run("rope", "rope", [&](const C& c) {
            test_rope(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.x, SeqPositions());
            // two runs of positions (a context-parallel rank's rows)
            test_rope(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.x,
                      SeqPositions{7, 3 * c.dims[1] + 1, c.dims[1] / 2});
        });
        run("attention_ring", "attention_ring", [&](const C& c) {
            test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
        });
        // the same blocks with dQ from the dS^T in memory (attention_backward v7: positions, +=)
        for (int dq : {1, 2}) {  // and with the fused kernel (v8)
            w.bwd_dq = dq;
            ways(w);
            run("attention_ring", "attention_ring", [&](const C& c) {
                if (c.dims[4] == 64 || c.dims[4] == 128)
                    test_attention_ring(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]);
            });
        }
        ways(KernelWays());
        run("swiglu", "swiglu", [&](const C& c) { test_swiglu(h, c.dims[0], c.dims[1]); });
        run("moe", "moe", [&](const C& c) {
            test_moe(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4] ? c.dims[4] : c.dims[0] * c.dims[2]);
        });
        run("cross_entropy", "cross_entropy",
            [&](const C& c) { test_cross_entropy(h, c.dims[0], c.dims[1], c.dims[2], c.dims[3] != 0); });
        // (CUDA's contract for a target outside [0, V): a NaN loss; the CPU backend's reference
        // refuses such a target as an internal error, so the case has no CPU stand-in)
        if (want("cross_entropy") && !on_cpu)
            guarded("cross_entropy_bad_targets", [&] { test_cross_entropy_bad_targets(h); });
        run("cross_entropy_vp", "cross_entropy_vp", [&](const C& c) {
            test_cross_entropy_vocab_parallel(h, c.dims[0], c.dims[1], c.dims[2],
                                              std::vector<int>(c.dims.begin() + 4, c.dims.end()), c.dims[3] != 0);
        });
        run("adamw", "adamw", [&](const C& c) { test_adamw(h, size_t(c.dims[0]), c.dims[1] != 0, c.dims[2]); });
        run("sum_squares", "sum_squares", [&](const C& c) { test_sum_squares(h, size_t(c.dims[0])); });
        if (want("step_ops")) guarded("step_ops", [&] { test_step_ops(h); });
        if (want("step_graph") && !on_cpu && dt == DType::F32) guarded("step_graph", [&] { test_step_graph(); });
        if (want("offload") && !on_cpu) guarded("offload", [&] { test_offload(*gpu, dt); });  // CUDA's copies
        if (want("ptx") && !on_cpu && dt == DType::BF16) {
            guarded("ptx bf16", [&] { test_ptx<bf16>(); });
            guarded("ptx fp16", [&] { test_ptx<f16>(); });
            guarded("ptx exp2", [&] { test_ptx_exp2(); });
            guarded("ptx wgmma bf16", [&] { test_ptx_wgmma<bf16>(); });
            guarded("ptx wgmma fp16", [&] { test_ptx_wgmma<f16>(); });
        }
        if (want("reference") && dt == DType::F32) guarded("reference", [&] { test_reference(*gpu); });
        if (want("model_step") && dt == DType::F32)
            guarded("model_step", [&] {
                test_model_step(*cpu, *gpu, ModelShape{2, 2, 32, 100, 128, 16}, "gpt2");
                ModelShape llama{2, 4, 64, 100, 128, 16};
                llama.arch = Arch::Llama, llama.n_kv_head = 2, llama.ffn_dim = 96, llama.tie_embeddings = false;
                test_model_step(*cpu, *gpu, llama, "llama");
                if (!on_cpu) test_model_recompute(*gpu);  // (a bf16 model: the CPU backend has fp32 only)
            });
        if (want("fp8") && dt != DType::F16) {  // (fp8 is a precision of its own, beside bf16's tensors)
            std::string why;
            if (!gpu->fp8_supported(&why)) {
                std::printf("SKIP fp8 [%s] %s\n", dtype_name(dt), why.c_str());
            } else {
                // each case guarded on its own: a GEMM cuBLASLt refuses fails that case only
                auto fp8_case = [&](int N, int IC, int OC, bool bias, bool gelu, bool current, bool hybrid,
                                    int off = 0, int off_in = 0, bool inp_gelu = false) {
                    guarded(strfmt("fp8 N=%d IC=%d OC=%d bias=%d gelu=%d current=%d hybrid=%d off=%d off_in=%d "
                                   "inp_gelu=%d",
                                   N, IC, OC, (int)bias, (int)gelu, (int)current, (int)hybrid, off, off_in,
                                   (int)inp_gelu),
                            [&] { test_fp8_matmul(h, N, IC, OC, bias, gelu, current, hybrid, off, off_in, inp_gelu); });
                };
                for (bool current : {false, true})
                    for (bool hybrid : {true, false}) {
                        fp8_case(32, 64, 48, true, false, current, hybrid);
                        fp8_case(64, 96, 384, true, true, current, hybrid);
                        fp8_case(48, 32, 16, false, false, current, hybrid);
                    }
                // the weight-gradient GEMM of the H200 report (k=64, m=48, n=32: D fp32 in place)
                fp8_case(64, 48, 32, true, true, false, false);
                // outputs not 16-byte aligned: the fp32-scratch way, forward (bias, gelu) and backward
                fp8_case(64, 48, 32, true, true, false, true, 1);
                fp8_case(32, 64, 48, true, false, true, false, 2);
                // cast inputs not 16-byte aligned: the casts element by element, delayed and current
                fp8_case(64, 96, 384, true, true, false, true, 0, 1);
                fp8_case(32, 64, 48, false, false, true, false, 0, 3);
                // the GELU in the input's casts (fp8's fc_proj): vector and element-by-element casts,
                // delayed and current
                fp8_case(64, 384, 96, true, false, false, true, 0, 0, true);
                fp8_case(32, 64, 48, true, false, true, false, 0, 1, true);
                guarded("fp8 scales", [&] { test_fp8_scales(h); });
                if (!on_cpu) guarded("fp8 bad shape", [&] { test_fp8_bad_shape(h); });  // (no CPU shape rule)
                // the large ones last (the emulator's planted bugs stop at the first FAIL: 10 s of
                // the 11 s fp32 pass there): GPT-2's shapes, and the weight-gradient GEMM's k is the
                // token count: 16k and 64k tokens
                fp8_case(256, 768, 2304, true, false, false, true);
                fp8_case(128, 768, 3072, true, true, true, true);
                fp8_case(16384, 64, 128, true, false, false, true);
                fp8_case(65536, 64, 64, false, false, true, true);
            }
        }
    }
    if (const char* path = std::getenv("LLMC_GPU_DIGEST")) {  // the determinism-checked results, for another process
        FILE* f = std::fopen(path, "w");
        if (!f) {
            std::printf("FAIL digest: cannot write LLMC_GPU_DIGEST=%s\n", path);
            return 1;
        }
        for (const std::string& line : g_digest) std::fprintf(f, "%s\n", line.c_str());
        std::fclose(f);
    }
    std::printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
