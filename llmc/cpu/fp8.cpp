// CpuOps: FP8 linear layers, emulated exactly (llmc/backend/ops.h "fp8", llmc/precision/fp8.h).
// Each operand is replaced by its quantize-dequantize q(x) in a scratch copy, then the fp32
// matmul kernels run on the copies: deterministic and independent of the thread count
// (elementwise casts; the amax is a max of integers, exact in any order).
#include <algorithm>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

namespace {

// max|x| in the fp8_abs_bits order (NaN > inf > finite)
uint32_t amax_bits(const float* x, size_t n) {
    uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (cpu::parallel_worth(n))
    for (size_t i = 0; i < n; ++i) m = std::max(m, fp8_abs_bits(x[i]));
    return m;
}

// The scale of one cast; records the tensor's amax when the cast asks for it.
float cast_scale(const Fp8Cast& c, const float* x, size_t n) {
    const float given = c.scale_at ? *c.scale_at : c.scale;
    float s = given;
    if (c.current || c.amax) {
        const uint32_t bits = amax_bits(x, n);
        if (c.amax) *c.amax = fp8_bits_to_float(std::max(fp8_abs_bits(*c.amax), bits));
        if (c.current) s = fp8_scale_from_amax(fp8_bits_to_float(bits), c.format, c.margin, given);
    }
    LLMC_ASSERT(s > 0.0f && fp8_is_finite(s), strfmt("fp8: scale must be finite and positive, got %g", s));
    return s;
}

// q(x) for every element, into a new buffer (c.gelu: of gelu(x))
std::vector<float> quantized(const Fp8Cast& c, const float* x, size_t n) {
    std::vector<float> g;
    if (c.gelu) {
        g.resize(n);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
        for (size_t i = 0; i < n; ++i) g[i] = cpu::gelu(x[i]);
        x = g.data();
    }
    const float s = cast_scale(c, x, n);
    const float inv = 1.0f / s;
    std::vector<float> q(n);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (size_t i = 0; i < n; ++i) q[i] = fp8_quantize(x[i], s, inv, c.format);
    return q;
}

}  // namespace

void CpuOps::matmul_forward_fp8(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                int OC, bool gelu, const Fp8Cast& inp_cast, const Fp8Cast& w_cast, const Fp8Stash&) {
    ++counters_.launches;
    const size_t NO = (size_t)N * OC, NI = (size_t)N * IC, NW = (size_t)OC * IC;
    float* pg = gelu ? cpu_f32(pre_gelu, NO, "pre_gelu") : nullptr;
    float* bp = bias ? cpu_f32(bias, OC, "bias") : nullptr;
    const std::vector<float> qi = quantized(inp_cast, cpu_f32(inp, NI, "matmul inp"), NI);
    const std::vector<float> qw = quantized(w_cast, cpu_f32(w, NW, "matmul w"), NW);
    cpu::matmul_forward(cpu_f32(out, NO, "matmul out"), pg, qi.data(), qw.data(), bp, N, IC, OC, gelu);
}

void CpuOps::matmul_backward_fp8(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                 Tensor pre_gelu, int N, int IC, int OC, const Fp8Cast& dout_cast,
                                 const Fp8Cast& inp_cast, const Fp8Cast& w_cast, const Fp8Stash&) {
    ++counters_.launches;
    const size_t NO = (size_t)N * OC, NI = (size_t)N * IC, NW = (size_t)OC * IC;
    float* di = dinp ? cpu_f32(dinp, NI, "matmul dinp") : nullptr;
    float* db = dbias ? cpu_f32(dbias, OC, "matmul dbias") : nullptr;
    float* dwp = cpu_f32(dw, NW, "matmul dw");
    float* d = cpu_f32(dout, NO, "matmul dout");
    const float* pg = pre_gelu ? cpu_f32(pre_gelu, NO, "pre_gelu") : nullptr;
    // The GELU backward and the bias gradient on the unquantized dout, bit for bit as the fp32
    // op: its kernel with IC = 0 runs only those two (its GEMMs have no columns).
    if (pg || db) cpu::matmul_backward<float>(nullptr, dwp, db, d, nullptr, nullptr, pg, N, 0, OC);
    const std::vector<float> qd = quantized(dout_cast, d, NO);
    const std::vector<float> qi = quantized(inp_cast, cpu_f32(inp, NI, "matmul inp"), NI);
    // w is read only for dinp (as on CUDA, its cast and amax are skipped without dinp)
    const std::vector<float> qw = di ? quantized(w_cast, cpu_f32(w, NW, "matmul w"), NW) : std::vector<float>();
    // dinp = q(dout) @ q(w); dw += q(dout)^T @ q(inp). (qd is a copy, so const_cast is safe:
    // the kernel writes dout only for the GELU, which is not asked for here.)
    cpu::matmul_backward<float>(di, dwp, nullptr, const_cast<float*>(qd.data()), qi.data(), di ? qw.data() : nullptr,
                                nullptr, N, IC, OC);
}

void CpuOps::fp8_widen_amaxes(const Fp8Device& d) {
    ++counters_.launches;
    for (int i = 0; i < d.n; ++i) d.wide[i] = double(fp8_abs_bits(d.amax[i]));
}

void CpuOps::fp8_update_scales(const Fp8Device& d, bool from_wide, float* step_overflows) {
    ++counters_.launches;
    int bad = 0;
    for (int i = 0; i < d.n; ++i) bad += !fp8_device_step(d, i, from_wide);
    *step_overflows = float(bad);
}
