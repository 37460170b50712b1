// The mixture-of-experts ops (llmc/backend/ops.h, "mixture of experts"; the routing plan is made on the
// host, llmc/model/moe.h): router softmax / top-k / renormalisation and its backward, the permutation
// of token rows into per-expert rows and its backward, the gate-weighted combine and its
// backward. All arithmetic is fp32; tensors are stored in T (fp32 or bf16), probabilities and
// gates are fp32. Deterministic: each output element is written by one thread, which sums a
// token's slots in slot order and a row's channels in order.
//
// A first version: one thread per token row for the router (E and K are small), one thread per
// element for the permutation and the combine, one thread per (token, slot) pair for the gates'
// dot products. The expert MLPs are the ordinary matmul ops, one per expert on its rows.
#pragma once
#include "llmc/cuda/common.cuh"

// probs [N, E] = softmax(logits); expert/gate [N, K]: the K largest probabilities in descending
// order (ties: the lower index), gate = p / sum of the chosen.
template <class T>
__global__ void moe_router_forward_kernel(float* probs, int32_t* expert, float* gate, const T* logits, int N, int E,
                                          int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const T* l = logits + (long long)n * E;
    float* p = probs + (long long)n * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, to_f32(l[e]));
    float s = 0.0f;
    for (int e = 0; e < E; e++) s += (p[e] = expf(to_f32(l[e]) - mx));
    const float inv = 1.0f / s;
    for (int e = 0; e < E; e++) p[e] *= inv;
    int32_t* ex = expert + (long long)n * K;
    float chosen = 0.0f;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int m = 0; m < j; m++) taken |= ex[m] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ex[j] = best;
        chosen += p[best];
    }
    for (int j = 0; j < K; j++) gate[(long long)n * K + j] = p[ex[j]] / chosen;
}

// dlogits [N, E] (overwrite) from dgate [N, K] and daux [E] (nullable); as cpu::moe_router_backward.
template <class T>
__global__ void moe_router_backward_kernel(T* dlogits, const float* dgate, const float* daux, const float* probs,
                                           const int32_t* expert, const float* gate, int N, int E, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* p = probs + (long long)n * E;
    const int32_t* ex = expert + (long long)n * K;
    const float* g = gate + (long long)n * K;
    const float* dg = dgate + (long long)n * K;
    float S = 0.0f, dot_gg = 0.0f;
    for (int j = 0; j < K; j++) {
        S += p[ex[j]];
        dot_gg += dg[j] * g[j];
    }
    // d loss / d p[e]: the aux term plus, for a chosen e, (dg_j - sum_m dg_m g_m) / S
    auto dp = [&](int e) {
        float d = daux ? daux[e] : 0.0f;
        for (int j = 0; j < K; j++)
            if (ex[j] == e) d += (dg[j] - dot_gg) / S;
        return d;
    };
    float dot_pd = 0.0f;
    for (int e = 0; e < E; e++) dot_pd += p[e] * dp(e);
    for (int e = 0; e < E; e++) dlogits[(long long)n * E + e] = from_f32<T>(p[e] * (dp(e) - dot_pd));
}

// out[row_of[i], c] = inp[i / K, c] for kept pairs i; one thread per (pair, channel).
template <class T>
__global__ void moe_permute_kernel(T* out, const T* inp, const int32_t* row_of, int K, int C, long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long i = idx / C;
    const int c = int(idx % C);
    const int32_t r = row_of[i];
    if (r >= 0) out[(long long)r * C + c] = inp[(i / K) * C + c];
}

// dinp[n, c] += sum over kept slots (slot order) of dout[row_of[n*K + j], c]; one thread per element.
template <class T>
__global__ void moe_permute_backward_kernel(T* dinp, const T* dout, const int32_t* row_of, int K, int C, long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long t = idx / C;
    const int c = int(idx % C);
    float s = to_f32(dinp[idx]);
    for (int j = 0; j < K; j++) {
        const int32_t r = row_of[t * K + j];
        if (r >= 0) s += to_f32(dout[(long long)r * C + c]);
    }
    dinp[idx] = from_f32<T>(s);
}

// out[n, c] = sum over kept slots (slot order) of gate[n, j] * y[row_of[n*K + j], c] (overwrite).
template <class T>
__global__ void moe_combine_kernel(T* out, const T* y, const float* gate, const int32_t* row_of, int K, int C,
                                   long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long t = idx / C;
    const int c = int(idx % C);
    float s = 0.0f;
    for (int j = 0; j < K; j++) {
        const int32_t r = row_of[t * K + j];
        if (r >= 0) s += gate[t * K + j] * to_f32(y[(long long)r * C + c]);
    }
    out[idx] = from_f32<T>(s);
}

// dy[row_of[i], c] = gate[i] * dout[i / K, c] for kept pairs; one thread per (pair, channel).
template <class T>
__global__ void moe_combine_backward_dy_kernel(T* dy, const T* dout, const float* gate, const int32_t* row_of, int K,
                                               int C, long long n) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long i = idx / C;
    const int c = int(idx % C);
    const int32_t r = row_of[i];
    if (r >= 0) dy[(long long)r * C + c] = from_f32<T>(gate[i] * to_f32(dout[(i / K) * C + c]));
}

// dgate[i] = dot(dout[i / K, :], y[row_of[i], :]) in channel order, 0 for a dropped pair; one thread per pair.
template <class T>
__global__ void moe_combine_backward_dgate_kernel(float* dgate, const T* dout, const T* y, const int32_t* row_of,
                                                  int K, int C, long long pairs) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    const int32_t r = row_of[i];
    float s = 0.0f;
    if (r >= 0)
        for (int c = 0; c < C; c++) s += to_f32(dout[(i / K) * C + c]) * to_f32(y[(long long)r * C + c]);
    dgate[i] = s;
}
