// CpuOps: causal grouped-query self-attention (flash-style backward from the log-sum-exp), its
// block form for context parallelism's ring, and rotary position embeddings.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) {
    ++counters_.launches;
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t BT = (size_t)B * T;
    cpu::attention_forward(cpu_f32(out, BT * NH * HS, "attention out"), lse,
                           cpu_f32(qkv, BT * (NH + 2 * NKV) * HS, "qkv"), B, T, NH, NKV, HS);
}

void CpuOps::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                                int NH, int NKV, int HS) {
    ++counters_.launches;
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t BT = (size_t)B * T, W = BT * (NH + 2 * NKV) * HS;
    cpu::attention_backward(cpu_f32(dqkv, W, "dqkv"), cpu_f32(dout, BT * NH * HS, "attention dout"),
                            cpu_f32(qkv, W, "qkv"), cpu_f32(out, BT * NH * HS, "attention out"), lse, B, T, NH, NKV,
                            HS);
}

void CpuOps::attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk,
                                     int NH, int NKV, int HS, SeqPositions qp, SeqPositions kp) {
    ++counters_.launches;
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t W = size_t(NH + 2 * NKV) * HS;
    cpu::attention_block_forward(cpu_f32(out, size_t(B) * Tq * NH * HS, "attention out"), lse,
                                 cpu_f32(qkv_q, size_t(B) * Tq * W, "qkv_q"), cpu_f32(qkv_kv, size_t(B) * Tk * W, "qkv_kv"),
                                 B, Tq, Tk, NH, NKV, HS, qp, kp);
}

void CpuOps::attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                             int HS) {
    ++counters_.launches;
    const size_t n = size_t(B) * T * NH * HS;
    cpu::attention_merge(cpu_f32(out, n, "attention out"), lse, cpu_f32(blk_out, n, "block out"), blk_lse, B, T, NH,
                         HS);
}

void CpuOps::attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                      const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS,
                                      SeqPositions qp, SeqPositions kp) {
    ++counters_.launches;
    LLMC_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV must divide NH");
    const size_t W = size_t(NH + 2 * NKV) * HS, nq = size_t(B) * Tq * W, nk = size_t(B) * Tk * W;
    cpu::attention_block_backward(cpu_f32(dq, nq, "dq"), cpu_f32(dkv, nk, "dkv"),
                                  cpu_f32(dout, size_t(B) * Tq * NH * HS, "attention dout"), cpu_f32(qkv_q, nq, "qkv_q"),
                                  cpu_f32(qkv_kv, nk, "qkv_kv"), cpu_f32(out, size_t(B) * Tq * NH * HS, "attention out"),
                                  lse, B, Tq, Tk, NH, NKV, HS, qp, kp);
}

void CpuOps::rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) {
    ++counters_.launches;
    LLMC_ASSERT(HS % 2 == 0, "rope: odd head size");
    cpu::rope(cpu_f32(qkv, (size_t)B * T * (NH + 2 * NKV) * HS, "rope qkv"), B, T, NH, NKV, HS, theta, false, pos);
}

void CpuOps::rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) {
    ++counters_.launches;
    LLMC_ASSERT(HS % 2 == 0, "rope: odd head size");
    cpu::rope(cpu_f32(dqkv, (size_t)B * T * (NH + 2 * NKV) * HS, "rope dqkv"), B, T, NH, NKV, HS, theta, true, pos);
}
