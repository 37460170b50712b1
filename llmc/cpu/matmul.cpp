// CpuOps: linear layers (optionally fused with GELU) and the SwiGLU activation.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                            bool gelu) {
    ++counters_.launches;
    const size_t NO = (size_t)N * OC;
    float* pg = gelu ? cpu_f32(pre_gelu, NO, "pre_gelu") : nullptr;
    float* bp = bias ? cpu_f32(bias, OC, "bias") : nullptr;
    cpu::matmul_forward(cpu_f32(out, NO, "matmul out"), pg, cpu_f32(inp, (size_t)N * IC, "matmul inp"),
                        cpu_f32(w, (size_t)OC * IC, "matmul w"), bp, N, IC, OC, gelu);
}

void CpuOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                             Tensor pre_gelu, int N, int IC, int OC, Tensor dinp_gelu) {
    ++counters_.launches;
    const size_t NO = (size_t)N * OC, NI = (size_t)N * IC;
    float* di = dinp ? cpu_f32(dinp, NI, "matmul dinp") : nullptr;
    float* db = dbias ? cpu_f32(dbias, OC, "matmul dbias") : nullptr;
    const float* pg = pre_gelu ? cpu_f32(pre_gelu, NO, "pre_gelu") : nullptr;
    cpu::matmul_backward(di, cpu_f32(dw, (size_t)OC * IC, "matmul dw"), db, cpu_f32(dout, NO, "matmul dout"),
                         cpu_f32(inp, NI, "matmul inp"), cpu_f32(w, (size_t)OC * IC, "matmul w"), pg, N, IC, OC);
    if (dinp_gelu) {  // in fp32 the product has no rounding to skip: the GELU's backward as pre_gelu's
        LLMC_ASSERT(di, "matmul_backward: dinp_gelu without dinp");
        const float* g = cpu_f32(dinp_gelu, NI, "dinp_gelu");
#pragma omp parallel for simd schedule(static) if (cpu::parallel_worth(NI))
        for (size_t i = 0; i < NI; ++i) di[i] *= cpu::gelu_grad(g[i]);
    }
}

void CpuOps::swiglu_forward(Tensor out, Tensor inp, int N, int F) {
    ++counters_.launches;
    cpu::swiglu_forward(cpu_f32(out, (size_t)N * F, "swiglu out"), cpu_f32(inp, (size_t)N * 2 * F, "swiglu inp"), N, F);
}

void CpuOps::swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) {
    ++counters_.launches;
    cpu::swiglu_backward(cpu_f32(dinp, (size_t)N * 2 * F, "swiglu dinp"), cpu_f32(dout, (size_t)N * F, "swiglu dout"),
                         cpu_f32(inp, (size_t)N * 2 * F, "swiglu inp"), N, F);
}
