// CpuOps: gradient norm and the AdamW update.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

double CpuOps::sum_squares(Tensor g) { return cpu::sum_squares(cpu_f32(g, g.n, "sum_squares"), g.n); }

void CpuOps::adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1,
                   float beta2, float eps, float weight_decay, float grad_scale, int t, uint32_t seed,
                   uint32_t index_base) {
    (void)seed, (void)index_base;  // stochastic rounding only matters for bf16 params (CUDA)
    LLMC_ASSERT(grads.n == params.n, "adamw: params and grads differ in size");
    LLMC_ASSERT(t >= 1, "adamw: step t is 1-based");
    cpu::adamw(cpu_f32(params, params.n, "adamw params"), master, cpu_f32(grads, params.n, "adamw grads"), m, v,
               params.n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
}
