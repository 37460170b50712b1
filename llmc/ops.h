// Ops: the kernel interface every backend implements (CPU reference in llmc/cpu/,
// CUDA in llmc/cuda/). The model, the optimizer and every parallel layout are written
// once over this interface; a backend only knows how to run one op on its own memory.
//
// Conventions
//  - N = B*T rows. Row-major everywhere. Linear weights are [OC, IC] (PyTorch layout):
//    out[N, OC] = inp[N, IC] @ w^T + bias.
//  - Tensors carry their dtype: fp32 on the CPU backend; fp32 or bf16 on CUDA
//    (activations, parameters and gradients share the model's dtype). Statistics that
//    must stay accurate (LayerNorm mean/rstd, attention log-sum-exp, losses, optimizer
//    state, master weights) are always fp32 and passed as float*.
//  - "accumulate" means +=, everything else overwrites. Parameter gradients always
//    accumulate (gradient accumulation over micro-steps); input gradients overwrite
//    except where stated.
//  - Token ids are int32 in backend memory.
//  - Every op is deterministic: the same inputs give bitwise the same outputs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "llmc/tensor.h"

class Ops {
public:
    virtual ~Ops() = default;
    virtual std::string name() const = 0;  // "cpu" or "cuda"
    // What the logs and the MFU table call the device (the GPU's name on CUDA).
    virtual std::string device_name() const { return name(); }
    // Most device memory this process has had in use so far, in bytes (0 where not tracked).
    virtual size_t peak_memory_bytes() const { return 0; }

    // ---- memory ----
    virtual void* alloc(size_t bytes) = 0;  // zero-initialised
    virtual void release(void* p) = 0;
    virtual void zero(Tensor t) = 0;
    virtual void copy(Tensor dst, Tensor src) = 0;  // same dtype and size, backend memory
    // host <-> backend, converting between fp32 on the host and the tensor's dtype
    virtual void to_host_f32(float* dst, Tensor src) = 0;
    virtual void from_host_f32(Tensor dst, const float* src) = 0;
    virtual void to_host_bytes(void* dst, const void* src, size_t bytes) = 0;
    virtual void from_host_bytes(void* dst, const void* src, size_t bytes) = 0;
    virtual void synchronize() = 0;

    // ---- embedding ----
    // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
    virtual void encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T,
                                 int C) = 0;
    // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:] (accumulate, deterministic order)
    virtual void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T,
                                  int C) = 0;

    // ---- layernorm (eps = 1e-5) ----
    // out = (inp - mean) * rstd * w + b; mean/rstd [N] fp32
    virtual void layernorm_forward(Tensor out, float* mean, float* rstd, Tensor inp, Tensor w, Tensor b, int N,
                                   int C) = 0;
    // residual = a + b; out = layernorm(residual)
    virtual void fused_residual_layernorm_forward(Tensor residual, Tensor out, float* mean, float* rstd, Tensor a,
                                                  Tensor b, Tensor w, Tensor bias, int N, int C) = 0;
    // dinp += dLN/dinp; dw += ..., db += ... (all accumulate)
    virtual void layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w,
                                    const float* mean, const float* rstd, int N, int C) = 0;

    // out = a + b (elementwise, n elements)
    virtual void residual_forward(Tensor out, Tensor a, Tensor b) = 0;

    // ---- matmul ----
    // out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias[OC] (bias may be empty).
    // With gelu: pre_gelu gets the pre-activation and out = gelu_tanh(pre_gelu).
    virtual void matmul_forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC,
                                int OC, bool gelu) = 0;
    // Backward of matmul_forward. If pre_gelu is non-empty, dout is first multiplied in
    // place by gelu'(pre_gelu) (dout is then the gradient of the pre-activation).
    // dinp = dout @ w (overwrite; skipped when dinp is empty);
    // dw += dout^T @ inp; dbias += column sums of dout (skipped when dbias is empty).
    virtual void matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                                 Tensor pre_gelu, int N, int IC, int OC) = 0;

    // ---- attention ----
    // qkv [B,T,3,NH,HS] -> out [B,T,NH,HS], causal, softmax scale 1/sqrt(HS);
    // lse [B,NH,T] fp32 = log-sum-exp of the scaled scores of each query row.
    virtual void attention_forward(Tensor out, float* lse, Tensor qkv, int B, int T, int NH, int HS) = 0;
    // dqkv (overwrite) from dout, recomputing probabilities from qkv and lse.
    virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, const float* lse, int B,
                                    int T, int NH, int HS) = 0;

    // ---- classifier ----
    // logits [N, Vp] with the real vocabulary in columns [0, V). For every row:
    // losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]  (fp32).
    // If dloss != 0 the logits are overwritten by the gradient of dloss * sum_i losses[i]:
    // (softmax - onehot) * dloss in [0, V), zero in the padded columns [V, Vp).
    virtual void cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                               float dloss) = 0;

    // ---- optimizer ----
    // Sum of squares of a gradient region, in double, with a fixed reduction order.
    virtual double sum_squares(Tensor g) = 0;
    // AdamW on n elements. g is multiplied by grad_scale first (clipping). t = step (1-based)
    // for bias correction. params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p), with p
    // taken from master when given (fp32 master weights; params is then the rounded copy,
    // stochastic rounding seeded by seed when params is bf16).
    virtual void adamw(Tensor params, float* master, Tensor grads, float* m, float* v, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int t, uint32_t seed) = 0;
};

std::unique_ptr<Ops> make_cpu_ops();
// Defined in the CUDA backend; throws UserError when no CUDA device is usable.
std::unique_ptr<Ops> make_cuda_ops(int device_index);
bool cuda_device_available();
