// CpuFp16Ops: CpuOps' fp32 math, then the Tensors each op wrote rounded to fp16
// (llmc/cpu/fp16_ops.h).
#include "llmc/cpu/fp16_ops.h"

#include "llmc/cpu/kernels.h"
#include "llmc/precision/fp16.h"

void round_tensor_f16(Tensor t) {
    if (!t.ptr || !t.n) return;
    float* x = cpu_f32(t, t.n, "fp16 rounding");
#pragma omp parallel for simd schedule(static) if (cpu::parallel_worth(t.n))
    for (size_t i = 0; i < t.n; i++) x[i] = round_f16(x[i]);
}

void CpuFp16Ops::copy(Tensor dst, Tensor src) {
    CpuOps::copy(dst, src);
    round_tensor_f16(dst);
}

void CpuFp16Ops::from_host_f32(Tensor dst, const float* src) {
    CpuOps::from_host_f32(dst, src);
    round_tensor_f16(dst);
}

// The ops: CpuOps' result, then what the op wrote rounded (a tensor it
// accumulates into is rounded whole: its old values are halves already, and
// rounding a half changes nothing)
void CpuFp16Ops::encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                                 int vocab_begin) {
    CpuOps::encoder_forward(out, tokens, wte, wpe, B, T, C, vocab_begin);
    round_tensor_f16(out);
}
void CpuFp16Ops::encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                                  int vocab_begin) {
    CpuOps::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin);
    round_tensor_f16(dwte);
    round_tensor_f16(dwpe);
}
void CpuFp16Ops::layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N, int C) {
    CpuOps::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    round_tensor_f16(out);
}
void CpuFp16Ops::fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a,
                                                  Tensor b, Tensor w, Tensor bias, int N, int C) {
    CpuOps::fused_residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C);
    round_tensor_f16(residual);
    round_tensor_f16(out);
}
void CpuFp16Ops::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                                    const float* mean, const float* rstd, int N, int C) {
    CpuOps::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    round_tensor_f16(dinp);
    round_tensor_f16(dw);
    round_tensor_f16(db);
}
void CpuFp16Ops::residual_forward(Tensor out, Tensor a, Tensor b) {
    CpuOps::residual_forward(out, a, b);
    round_tensor_f16(out);
}
void CpuFp16Ops::matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                                bool gelu) {
    CpuOps::matmul_forward(out, pre_gelu, inp, w, bias, N, IC, OC, gelu);
    round_tensor_f16(out);
    round_tensor_f16(pre_gelu);
}
void CpuFp16Ops::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                 Tensor pre_gelu, int N, int IC, int OC, Tensor dinp_gelu) {
    CpuOps::matmul_backward(dinp, dw, dbias, dout, inp, w, pre_gelu, N, IC, OC, dinp_gelu);  // dinp rounded once
    round_tensor_f16(dinp);
    round_tensor_f16(dw);
    round_tensor_f16(dbias);
    round_tensor_f16(pre_gelu ? dout : Tensor());
}
void CpuFp16Ops::attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) {
    CpuOps::attention_forward(out, lse, qkv, B, T, NH, NKV, HS);
    round_tensor_f16(out);
}
void CpuFp16Ops::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                                    int NH, int NKV, int HS) {
    CpuOps::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
    round_tensor_f16(dqkv);
}
void CpuFp16Ops::attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk,
                                         int NH, int NKV, int HS, SeqPositions qp, SeqPositions kp) {
    CpuOps::attention_block_forward(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, HS, qp, kp);
    round_tensor_f16(out);
}
void CpuFp16Ops::attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                                 int HS) {
    CpuOps::attention_merge(out, lse, blk_out, blk_lse, B, T, NH, HS);
    round_tensor_f16(out);
}
void CpuFp16Ops::attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                          const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS,
                                          SeqPositions qp, SeqPositions kp) {
    CpuOps::attention_block_backward(dq, dkv, dout, qkv_q, qkv_kv, out, lse, B, Tq, Tk, NH, NKV, HS, qp, kp);
    round_tensor_f16(dq);
    round_tensor_f16(dq.ptr == dkv.ptr ? Tensor() : dkv);
}
void CpuFp16Ops::rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) {
    CpuOps::rope_forward(qkv, B, T, NH, NKV, HS, theta, pos);
    round_tensor_f16(qkv);
}
void CpuFp16Ops::rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) {
    CpuOps::rope_backward(dqkv, B, T, NH, NKV, HS, theta, pos);
    round_tensor_f16(dqkv);
}
void CpuFp16Ops::rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) {
    CpuOps::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    round_tensor_f16(out);
}
void CpuFp16Ops::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                                  int C) {
    CpuOps::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    round_tensor_f16(dinp);
    round_tensor_f16(dw);
}
void CpuFp16Ops::swiglu_forward(Tensor out, Tensor inp, int N, int F) {
    CpuOps::swiglu_forward(out, inp, N, F);
    round_tensor_f16(out);
}
void CpuFp16Ops::swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) {
    CpuOps::swiglu_backward(dinp, dout, inp, N, F);
    round_tensor_f16(dinp);
}
void CpuFp16Ops::moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                                     const int32_t* expert, const float* gate, int N, int E, int K) {
    CpuOps::moe_router_backward(dlogits, dgate, daux, probs, expert, gate, N, E, K);
    round_tensor_f16(dlogits);
}
void CpuFp16Ops::moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) {
    CpuOps::moe_permute(out, inp, row_of, N, K, C);
    round_tensor_f16(out);
}
void CpuFp16Ops::moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) {
    CpuOps::moe_permute_backward(dinp, dout, row_of, N, K, C);
    round_tensor_f16(dinp);
}
void CpuFp16Ops::moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) {
    CpuOps::moe_combine(out, y, gate, row_of, N, K, C);
    round_tensor_f16(out);
}
void CpuFp16Ops::moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate,
                                      const int32_t* row_of, int N, int K, int C) {
    CpuOps::moe_combine_backward(dy, dgate, dout, y, gate, row_of, N, K, C);
    round_tensor_f16(dy);
}
void CpuFp16Ops::cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                               float dloss) {
    CpuOps::cross_entropy(logits, losses, targets, N, V, Vp, dloss);
    round_tensor_f16(dloss != 0.0f ? logits : Tensor());
}
void CpuFp16Ops::cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets, int N,
                                      int Vl, int vocab_begin, int V, float dloss) {
    CpuOps::cross_entropy_finish(logits, losses, stats, targets, N, Vl, vocab_begin, V, dloss);
    round_tensor_f16(dloss != 0.0f ? logits : Tensor());
}

void CpuFp16Ops::adamw_multi(const std::vector<AdamWPiece> &pieces, const float* ctl, float lr, float beta1,
                             float beta2, float eps, int t) {
    CpuOps::adamw_multi(pieces, ctl, lr, beta1, beta2, eps, t);
    for (const AdamWPiece &p : pieces) {
        LLMC_ASSERT(p.master, "fp16 emulation: AdamW without master weights");
        round_tensor_f16(p.params);
    }
}

void CpuFp16Ops::adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int t, uint32_t seed,
                       uint32_t index_base) {
    LLMC_ASSERT(master, "fp16 emulation: AdamW without master weights");
    CpuOps::adamw(params, master, grads, m, v, lr, beta1, beta2, eps, weight_decay, grad_scale, t, seed, index_base);
    round_tensor_f16(params);
}

std::unique_ptr<Ops> make_cpu_fp16_ops() {
    return std::make_unique<CpuFp16Ops>();
}
