// Classifier. Fused: per row, online max / sum-exp over the real vocabulary, the loss, and
// (if dloss != 0) the logits overwritten in place by dloss * (softmax - onehot), zero in
// the padded columns. No probability tensor is written.
// Vocabulary-parallel (tensor parallelism): the same per-row statistics over one vocabulary
// slice (partial), then, once the slices' statistics are combined, the loss and the slice's
// gradient (finish).
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

// Block-wide (max, sum of exp(x - max)) over x[0, n): each thread strides the row, then
// warp shuffles, then thread 0 combines the warps in order (a fixed order for a given
// blockDim). The result (M, S) is valid in thread 0 only; (-inf, 0) when n == 0. Every
// thread of the block must call it (it synchronises). blockDim.x a multiple of 32 (<= 1024).
template <class T>
__device__ void block_max_sumexp(const T* x, int n, float& M, float& S) {
    __shared__ float s_m[32], s_s[32];
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) lse_combine(m, s, to_f32(x[c]), 1.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        s_m[warp] = m;
        s_s[warp] = s;
    }
    __syncthreads();
    M = -INFINITY;
    S = 0.0f;
    if (threadIdx.x == 0)
        for (int w = 0; w < nw; w++) lse_combine(M, S, s_m[w], s_s[w]);
}

// one block per row; blockDim.x a multiple of 32 (<= 1024)
template <class T>
__global__ void cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int V, int Vp, float dloss) {
    __shared__ float s_lse, s_target_logit;
    T* x = logits + (long long)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    float M, S;
    block_max_sumexp(x, V, M, S);
    if (threadIdx.x == 0) {
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

// Number of real (global index < V) columns of the slice [vocab_begin, vocab_begin + Vl).
__host__ __device__ inline int ce_slice_real_cols(int Vl, int vocab_begin, int V) {
    const long long r = (long long)V - vocab_begin;
    return r <= 0 ? 0 : (r < Vl ? (int)r : Vl);
}

// Vocabulary-parallel, step 1. logits [N, Vl] = the columns [vocab_begin, vocab_begin + Vl),
// of which the first nreal are real. One block per row (blockDim.x a multiple of 32):
// stats[3i..3i+2] = (max, sum of exp(x - max), the target's logit if it is in this slice
// else 0); (-inf, 0, 0) when nreal == 0. The same reduction as cross_entropy_kernel, so one
// slice with the same blockDim gives bitwise the fused kernel's statistics.
template <class T>
__global__ void cross_entropy_partial_kernel(float* stats, const T* logits, const int32_t* targets, int Vl, int nreal,
                                             int vocab_begin) {
    const T* x = logits + (long long)blockIdx.x * Vl;
    float M, S;
    block_max_sumexp(x, nreal, M, S);
    if (threadIdx.x == 0) {
        const long long tl = (long long)targets[blockIdx.x] - vocab_begin;
        float* st = stats + 3LL * blockIdx.x;
        st[0] = M;
        st[1] = S;
        st[2] = (tl >= 0 && tl < nreal) ? to_f32(x[tl]) : 0.0f;
    }
}

// Vocabulary-parallel, step 2. stats[3i..3i+2] = the combined (M, S, target logit) of row i
// over the whole vocabulary. losses[i] = (M + log S) - target logit; with dloss != 0 the
// slice's logits become dloss * (exp(x - M - log S) - onehot) in its nreal real columns and
// 0 in the rest. One block per row.
template <class T>
__global__ void cross_entropy_finish_kernel(T* logits, float* losses, const float* stats, const int32_t* targets,
                                            int Vl, int nreal, int vocab_begin, float dloss) {
    const float* st = stats + 3LL * blockIdx.x;
    const float lse = st[0] + logf(st[1]);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - st[2];
    if (dloss == 0.0f) return;
    T* x = logits + (long long)blockIdx.x * Vl;
    const long long tl = (long long)targets[blockIdx.x] - vocab_begin;
    for (int c = threadIdx.x; c < Vl; c += blockDim.x) {
        float g = 0.0f;
        if (c < nreal) g = (expf(to_f32(x[c]) - lse) - (c == tl ? 1.0f : 0.0f)) * dloss;
        x[c] = from_f32<T>(g);
    }
}

// Ops::cross_entropy_stats: one thread per row.
__global__ void cross_entropy_stats_kernel(int phase, float* stats, float* mx, float* rest, long long rows) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    if (phase == 0) {
        mx[i] = stats[3 * i];
    } else if (phase == 1) {
        const float m = stats[3 * i];
        rest[2 * i] = m == -INFINITY ? 0.0f : stats[3 * i + 1] * expf(m - mx[i]);
        rest[2 * i + 1] = stats[3 * i + 2];
    } else {
        stats[3 * i] = mx[i];
        stats[3 * i + 1] = rest[2 * i];
        stats[3 * i + 2] = rest[2 * i + 1];
    }
}
