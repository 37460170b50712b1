// The Llama family's elementwise ops: rotary embedding (in place on qkv, forward and the
// transposed rotation for the backward) and SwiGLU (RMSNorm is layernorm.cuh's). All arithmetic
// is fp32; tensors are stored in T (fp32, bf16 or fp16) and rounded once per stored value.
#pragma once
#include "llmc/cuda/common.cuh"
#include "llmc/backend/positions.h"

// ---------------- RMSNorm ----------------
// Forward and backward are LayerNorm's kernels with mean 0 and no bias (layernorm.cuh:
// launch_rmsnorm_forward, launch_norm_backward).

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
// Each thread K consecutive elements of a row (common.cuh's packs: K = pack_max<T> where F and
// the pointers allow, else 1); n = N F elements, F % K == 0.
// inp [N, 2F] = [gate | up]; out[n, f] = silu(gate) * up, silu(g) = g / (1 + exp(-g))
template <class T, int K>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int F, long long n) {
    const long long idx = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (idx >= n) return;
    const long long row = idx / F;
    const int f = (int)(idx % F);
    const Pack<T, K> pg = load_pack<K>(inp + row * 2 * F + f), pu = load_pack<K>(inp + row * 2 * F + F + f);
    Pack<T, K> o;
    LLMC_UNROLL
    for (int k = 0; k < K; k++) {
        const float g = to_f32(pg.v[k]), u = to_f32(pu.v[k]);
        o.v[k] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
    store_pack(out + idx, o);
}

// dinp [N, 2F] (overwrite): dgate = dout * up * silu'(gate), dup = dout * silu(gate), with
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
template <class T, int K>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int F, long long n) {
    const long long idx = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (idx >= n) return;
    const long long row = idx / F;
    const int f = (int)(idx % F);
    const Pack<T, K> pg = load_pack<K>(inp + row * 2 * F + f), pu = load_pack<K>(inp + row * 2 * F + F + f);
    const Pack<T, K> pd = load_pack<K>(dout + idx);
    Pack<T, K> dg, du;
    LLMC_UNROLL
    for (int k = 0; k < K; k++) {
        const float g = to_f32(pg.v[k]), u = to_f32(pu.v[k]), d = to_f32(pd.v[k]);
        const float e = 1.0f + expf(-g), sig = 1.0f / e;
        dg.v[k] = from_f32<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
        du.v[k] = from_f32<T>(d * (g / e));
    }
    store_pack(dinp + row * 2 * F + f, dg);
    store_pack(dinp + row * 2 * F + F + f, du);
}
