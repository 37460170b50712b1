// CpuOps: LayerNorm (plain and fused with the residual add), the residual add, and RMSNorm.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N, int C) {
    ++counters_.launches;
    const size_t NC = (size_t)N * C;
    cpu::layernorm_forward(cpu_f32(out, NC, "ln out"), mean, rstd, cpu_f32(inp, NC, "ln inp"), cpu_f32(w, C, "ln w"),
                           cpu_f32(b, C, "ln b"), N, C);
}

void CpuOps::fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a,
                                              Tensor b, Tensor w, Tensor bias, int N, int C) {
    ++counters_.launches;
    const size_t NC = (size_t)N * C;
    cpu::fused_residual_layernorm_forward(cpu_f32(residual, NC, "residual"), cpu_f32(out, NC, "ln out"), mean, rstd,
                                          cpu_f32(a, NC, "residual a"), cpu_f32(b, NC, "residual b"),
                                          cpu_f32(w, C, "ln w"), cpu_f32(bias, C, "ln b"), N, C);
}

void CpuOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                                const float* mean, const float* rstd, int N, int C) {
    ++counters_.launches;
    const size_t NC = (size_t)N * C;
    cpu::layernorm_backward(cpu_f32(dinp, NC, "ln dinp"), cpu_f32(dw, C, "ln dw"), cpu_f32(db, C, "ln db"),
                            cpu_f32(dout, NC, "ln dout"), cpu_f32(inp, NC, "ln inp"), cpu_f32(w, C, "ln w"), mean,
                            rstd, N, C);
}

void CpuOps::residual_forward(Tensor out, Tensor a, Tensor b) {
    ++counters_.launches;
    LLMC_ASSERT(a.n == out.n && b.n == out.n, "residual_forward: size mismatch");
    cpu::residual_forward(cpu_f32(out, out.n, "residual out"), cpu_f32(a, out.n, "residual a"),
                          cpu_f32(b, out.n, "residual b"), out.n);
}

void CpuOps::rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) {
    ++counters_.launches;
    const size_t NC = (size_t)N * C;
    cpu::rmsnorm_forward(cpu_f32(out, NC, "rmsnorm out"), rstd, cpu_f32(inp, NC, "rmsnorm inp"),
                         cpu_f32(w, C, "rmsnorm w"), N, C, eps);
}

void CpuOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                              int C) {
    ++counters_.launches;
    const size_t NC = (size_t)N * C;
    cpu::rmsnorm_backward(cpu_f32(dinp, NC, "rmsnorm dinp"), cpu_f32(dw, C, "rmsnorm dw"),
                          cpu_f32(dout, NC, "rmsnorm dout"), cpu_f32(inp, NC, "rmsnorm inp"),
                          cpu_f32(w, C, "rmsnorm w"), rstd, N, C);
}
