// CpuOps: causal grouped-query self-attention (flash-style backward from the log-sum-exp) and
// rotary position embeddings.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) {
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t BT = (size_t)B * T;
    cpu::attention_forward(cpu_f32(out, BT * NH * HS, "attention out"), lse,
                           cpu_f32(qkv, BT * (NH + 2 * NKV) * HS, "qkv"), B, T, NH, NKV, HS);
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                                int NH, int NKV, int HS) {
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t BT = (size_t)B * T, W = BT * (NH + 2 * NKV) * HS;
    cpu::attention_backward(cpu_f32(dqkv, W, "dqkv"), cpu_f32(dout, BT * NH * HS, "attention dout"),
                            cpu_f32(qkv, W, "qkv"), cpu_f32(out, BT * NH * HS, "attention out"), lse, B, T, NH, NKV,
                            HS);
}

void CpuOps::rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta) {
    LLMC_ASSERT(HS % 2 == 0, "rope: odd head size");
    cpu::rope(cpu_f32(qkv, (size_t)B * T * (NH + 2 * NKV) * HS, "rope qkv"), B, T, NH, NKV, HS, theta, false);
}

void CpuOps::rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta) {
    LLMC_ASSERT(HS % 2 == 0, "rope: odd head size");
    cpu::rope(cpu_f32(dqkv, (size_t)B * T * (NH + 2 * NKV) * HS, "rope dqkv"), B, T, NH, NKV, HS, theta, true);
}
