// Fused classifier: per row, online max / sum-exp over the real vocabulary, the loss, and
// (if dloss != 0) the logits overwritten in place by dloss * (softmax - onehot), zero in
// the padded columns. No probability tensor is written.
#pragma once
#include "llmc/cuda/common.cuh"

// (m, s) represents s * exp(m); combine two such partial sums
__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    const float nm = fmaxf(m, m2);
    s = s * expf(m - nm) + s2 * expf(m2 - nm);
    m = nm;
}

// one block per row; blockDim.x a multiple of 32 (<= 1024)
template <class T>
__global__ void cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int V, int Vp, float dloss) {
    __shared__ float s_m[32], s_s[32];
    __shared__ float s_lse, s_target_logit;
    T* x = logits + (long long)blockIdx.x * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < V; c += blockDim.x) lse_combine(m, s, to_f32(x[c]), 1.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        s_m[warp] = m;
        s_s[warp] = s;
    }
    const int target = targets[blockIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, S = 0.0f;
        for (int w = 0; w < nw; w++) lse_combine(M, S, s_m[w], s_s[w]);
        s_lse = M + logf(S);
        s_target_logit = (target >= 0 && target < V) ? to_f32(x[target]) : NAN;
        losses[blockIdx.x] = s_lse - s_target_logit;
    }
    __syncthreads();  // the target logit is read before anything is overwritten
    if (dloss == 0.0f) return;
    const float lse = s_lse;
    for (int c = threadIdx.x; c < Vp; c += blockDim.x) {
        float g = 0.0f;
        if (c < V) g = (expf(to_f32(x[c]) - lse) - (c == target ? 1.0f : 0.0f)) * dloss;
        x[c] = from_f32<T>(g);
    }
}
