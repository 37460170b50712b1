// CpuOps: causal multi-head self-attention (flash-style backward from the log-sum-exp).
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int HS) {
    const size_t BTC = (size_t)B * T * NH * HS;
    cpu::attention_forward(cpu_f32(out, BTC, "attention out"), lse, cpu_f32(qkv, 3 * BTC, "qkv"), B, T, NH, HS);
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                                int NH, int HS) {
    const size_t BTC = (size_t)B * T * NH * HS;
    cpu::attention_backward(cpu_f32(dqkv, 3 * BTC, "dqkv"), cpu_f32(dout, BTC, "attention dout"),
                            cpu_f32(qkv, 3 * BTC, "qkv"), cpu_f32(out, BTC, "attention out"), lse, B, T, NH, HS);
}
