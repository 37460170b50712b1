// CpuOps: the mixture-of-experts ops (router, permutation, combine) over llmc/cpu/moe_kernels.h.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/moe_kernels.h"

void CpuOps::moe_router_forward(float* probs, int32_t* expert, float* gate, Tensor logits, int N, int E, int K) {
    ++counters_.launches;
    LLMC_ASSERT(K >= 1 && K <= E, "moe router: need 1 <= K <= E");
    cpu::moe_router_forward(probs, expert, gate, cpu_f32(logits, (size_t)N * E, "moe router logits"), N, E, K);
}

void CpuOps::moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                                 const int32_t* expert, const float* gate, int N, int E, int K) {
    ++counters_.launches;
    cpu::moe_router_backward(cpu_f32(dlogits, (size_t)N * E, "moe router dlogits"), dgate, daux, probs, expert, gate, N,
                             E, K);
}

void CpuOps::moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) {
    ++counters_.launches;
    cpu::moe_permute(cpu_f32(out, 0, "moe permute out"), cpu_f32(inp, (size_t)N * C, "moe permute inp"), row_of, N, K,
                     C);
}

void CpuOps::moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) {
    ++counters_.launches;
    cpu::moe_permute_backward(cpu_f32(dinp, (size_t)N * C, "moe permute dinp"), cpu_f32(dout, 0, "moe permute dout"),
                              row_of, N, K, C);
}

void CpuOps::moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) {
    ++counters_.launches;
    cpu::moe_combine(cpu_f32(out, (size_t)N * C, "moe combine out"), cpu_f32(y, 0, "moe combine y"), gate, row_of, N, K,
                     C);
}

void CpuOps::moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate,
                                  const int32_t* row_of, int N, int K, int C) {
    ++counters_.launches;
    cpu::moe_combine_backward(cpu_f32(dy, 0, "moe combine dy"), dgate, cpu_f32(dout, (size_t)N * C, "moe combine dout"),
                              cpu_f32(y, 0, "moe combine y"), gate, row_of, N, K, C);
}
