// CpuOps: gradient norm and the AdamW update.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

#include <cmath>

double CpuOps::sum_squares(Tensor g) {
    ++counters_.launches;
    count_down(sizeof(double));  // the result is the host's
    return cpu::sum_squares(cpu_f32(g, g.n, "sum_squares"), g.n);
}

void CpuOps::sum_squares_multi(double* out, const std::vector<Tensor>& regions) {
    ++counters_.launches;
    double ss = 0.0;
    for (const Tensor& g : regions) ss += cpu::sum_squares(cpu_f32(g, g.n, "sum_squares_multi"), g.n);
    *out = ss;
}

void CpuOps::step_control(float* ctl, const double* ss, double clip, double loss_scale) {
    ++counters_.launches;
    ctl[0] = float(double(clip_factor(std::sqrt(ss[0]) / loss_scale, clip)) / loss_scale);
    ctl[1] = std::isfinite(ss[0]) && std::isfinite(ss[1]) ? 1.0f : 0.0f;
}

void CpuOps::adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1,
                   float beta2, float eps, float weight_decay, float grad_scale, int t, uint32_t seed,
                   uint32_t index_base) {
    ++counters_.launches;
    (void)seed, (void)index_base;  // stochastic rounding only matters for bf16 params (CUDA)
    LLMC_ASSERT(grads.n == params.n, "adamw: params and grads differ in size");
    LLMC_ASSERT(t >= 1, "adamw: step t is 1-based");
    const AdamWScales sc = adamw_scales(lr, beta1, beta2, t);
    cpu::adamw(cpu_f32(params, params.n, "adamw params"), master, cpu_f32(grads, params.n, "adamw grads"), m, v,
               params.n, lr, sc.step, sc.inv_sqrt_bc2, beta1, beta2, eps, weight_decay, grad_scale);
}

void CpuOps::adamw_multi(const std::vector<AdamWPiece>& pieces, const float* ctl, float lr, float beta1, float beta2,
                         float eps, int t) {
    ++counters_.launches;
    LLMC_ASSERT(t >= 1, "adamw: step t is 1-based");
    if (ctl[1] == 0.0f) return;  // skipped step
    const AdamWScales sc = adamw_scales(lr, beta1, beta2, t);
    for (const AdamWPiece& p : pieces) {
        LLMC_ASSERT(p.grads.n == p.params.n, "adamw_multi: params and grads differ in size");
        cpu::adamw(cpu_f32(p.params, p.params.n, "adamw params"), p.master, cpu_f32(p.grads, p.params.n, "adamw grads"),
                   p.m, p.v, p.params.n, lr, sc.step, sc.inv_sqrt_bc2, beta1, beta2, eps, p.weight_decay, ctl[0]);
    }
}
