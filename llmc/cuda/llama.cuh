// The Llama family's elementwise and normalisation ops: RMSNorm's forward (its deterministic
// backward is LayerNorm's, layernorm.cuh), rotary embedding (in place on qkv, forward and the
// transposed rotation for the backward) and SwiGLU. All arithmetic is fp32; tensors are stored in T (fp32 or bf16) and
// rounded once per stored value.
#pragma once
#include "llmc/cuda/common.cuh"
#include "llmc/backend/positions.h"

// ---------------- RMSNorm ----------------
// One warp per row: rstd = 1/sqrt(mean(x^2) + eps); out = x * rstd * w.
template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* w, int N, int C, float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const long long off = (long long)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float x = to_f32(inp[off + c]);
        s += x * x;
    }
    const float r = 1.0f / sqrtf(warp_sum(s) / (float)C + eps);
    for (int c = lane; c < C; c += 32) out[off + c] = from_f32<T>(to_f32(inp[off + c]) * r * to_f32(w[c]));
    if (lane == 0) rstd[row] = r;
}

// The backward is LayerNorm's with mean 0 and no bias: launch_norm_backward (layernorm.cuh).

// ---------------- rotary embedding ----------------
constexpr int kRopeMaxHalf = 128;  // HS <= 256
// inv_freq[i], i < HS/2, computed on the host (llmc/backend/rope.h) and passed by value
struct RopeFreqs {
    float inv_freq[kRopeMaxHalf];
};

// In place on qkv [B, T, NQKV, HS]: the first NROT head slots of every token (the query and key
// heads) are rotated by pos.at(t) * inv_freq[i] on the pairs (i, i + HS/2). sign = +1 rotates (forward),
// -1 applies the transposed rotation (backward). One thread per pair.
template <class T>
__global__ void rope_kernel(T* qkv, int T_, int NQKV, int NROT, int HS, RopeFreqs f, SeqPositions pos, float sign,
                            long long pairs) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pairs) return;
    const int half = HS / 2;
    const int i = (int)(idx % half);
    const long long rest = idx / half;
    const int head = (int)(rest % NROT);
    const long long bt = rest / NROT;
    const int t = pos.at((int)(bt % T_));
    const float angle = __fmul_rn((float)t, f.inv_freq[i]);  // one fp32 rounding, as transformers
    const float c = cosf(angle), s = sign * sinf(angle);
    T* x = qkv + (bt * NQKV + head) * HS;
    const float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x1 * c - x2 * s);
    x[i + half] = from_f32<T>(x2 * c + x1 * s);
}

// ---------------- SwiGLU ----------------
// inp [N, 2F] = [gate | up]; out[n, f] = silu(gate) * up, silu(g) = g / (1 + exp(-g))
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int F, long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long row = idx / F;
    const int f = (int)(idx % F);
    const float g = to_f32(inp[row * 2 * F + f]), u = to_f32(inp[row * 2 * F + F + f]);
    out[idx] = from_f32<T>(g / (1.0f + expf(-g)) * u);
}

// dinp [N, 2F] (overwrite): dgate = dout * up * silu'(gate), dup = dout * silu(gate), with
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
template <class T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int F, long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long row = idx / F;
    const int f = (int)(idx % F);
    const float g = to_f32(inp[row * 2 * F + f]), u = to_f32(inp[row * 2 * F + F + f]);
    const float d = to_f32(dout[idx]);
    const float e = 1.0f + expf(-g), sig = 1.0f / e;
    dinp[row * 2 * F + f] = from_f32<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dinp[row * 2 * F + F + f] = from_f32<T>(d * (g / e));
}
