// CpuFp16Ops: precision "fp16" on the CPU, emulated exactly in fp32 storage. CUDA keeps the model's
// tensors (parameters, gradients, activations: every Tensor an op writes) in IEEE half and the
// accurate statistics (LayerNorm mean/rstd, attention lse, losses, AdamW moments, master weights:
// float*) in fp32. This backend runs CpuOps' fp32 math, then rounds every Tensor the op wrote (and
// every Tensor that copy and from_host_f32 write) to the nearest half (llmc/precision/fp16.h: ties
// to even, past 65504 +-inf), so that values and overflows are those of fp16 storage; float* is never
// rounded. The parameters are the rounded copy of fp32 master weights, which AdamW keeps
// (Ops::emulates_fp16). What a CUDA fp16 kernel would differ in: its products accumulate in fp32 in
// another order, and its intermediates inside one kernel may be rounded where these are not.
#pragma once
#include "llmc/cpu/cpu_ops.h"

class CpuFp16Ops : public CpuOps {
public:
    bool emulates_fp16() const override { return true; }

    void copy(Tensor dst, Tensor src) override;
    void copy_f32(float* dst, const float* src, size_t n) override {  // fp32 statistics: not rounded
        CpuOps::copy(Tensor(dst, n, DType::F32), Tensor(const_cast<float*>(src), n, DType::F32));
    }
    void from_host_f32(Tensor dst, const float* src) override;

    void encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                         int vocab_begin) override;
    void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                          int vocab_begin) override;
    void layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N,
                           int C) override;
    void fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a, Tensor b,
                                          Tensor w, Tensor bias, int N, int C) override;
    void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, const float* mean,
                            const float* rstd, int N, int C) override;
    void residual_forward(Tensor out, Tensor a, Tensor b) override;
    void matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC,
                        bool gelu) override;
    void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu,
                         int N, int IC, int OC, Tensor dinp_gelu = Tensor()) override;
    void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int NKV, int HS) override;
    void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B, int T,
                            int NH, int NKV, int HS) override;
    void attention_block_forward(Tensor out, float* lse, Tensor qkv_q, Tensor qkv_kv, int B, int Tq, int Tk, int NH,
                                 int NKV, int HS, SeqPositions qp, SeqPositions kp) override;
    void attention_merge(Tensor out, float* lse, Tensor blk_out, const float* blk_lse, int B, int T, int NH,
                         int HS) override;
    void attention_block_backward(Tensor dq, Tensor dkv, Tensor dout, Tensor qkv_q, Tensor qkv_kv, Tensor out,
                                  const float* lse, int B, int Tq, int Tk, int NH, int NKV, int HS, SeqPositions qp,
                                  SeqPositions kp) override;
    void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override;
    void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int HS, float theta, SeqPositions pos) override;
    void rmsnorm_forward(Tensor out, float* rstd, Tensor inp, Tensor w, int N, int C, float eps) override;
    void rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, const float* rstd, int N,
                          int C) override;
    void swiglu_forward(Tensor out, Tensor inp, int N, int F) override;
    void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, int N, int F) override;
    void moe_router_backward(Tensor dlogits, const float* dgate, const float* daux, const float* probs,
                             const int32_t* expert, const float* gate, int N, int E, int K) override;
    void moe_permute(Tensor out, Tensor inp, const int32_t* row_of, int N, int K, int C) override;
    void moe_permute_backward(Tensor dinp, Tensor dout, const int32_t* row_of, int N, int K, int C) override;
    void moe_combine(Tensor out, Tensor y, const float* gate, const int32_t* row_of, int N, int K, int C) override;
    void moe_combine_backward(Tensor dy, float* dgate, Tensor dout, Tensor y, const float* gate, const int32_t* row_of,
                              int N, int K, int C) override;
    void cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                       float dloss) override;
    void cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets, int N, int Vl,
                              int vocab_begin, int V, float dloss) override;
    // the parameters: the master weights rounded (the pieces always carry master weights here)
    void adamw_multi(const std::vector<AdamWPiece>& pieces, const float* ctl, float lr, float beta1, float beta2,
                     float eps, int t) override;
    void adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1, float beta2,
               float eps, float weight_decay, float grad_scale, int t, uint32_t seed, uint32_t index_base = 0) override;
    // fp8 is a precision of its own
    bool fp8_supported(std::string* why) const override {
        if (why) *why = "the fp16 emulation has no fp8 matmuls";
        return false;
    }
};

// Rounds every element of an fp32 tensor to the nearest fp16 value, in place.
void round_tensor_f16(Tensor t);
std::unique_ptr<Ops> make_cpu_fp16_ops();
