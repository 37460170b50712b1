// AdamW (one fused elementwise pass) and the deterministic sum of squares of a gradient.
#pragma once
#include "llmc/cuda/common.cuh"

// bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (host). p comes from master when master != nullptr;
// master is then updated and params gets the rounded copy (stochastic rounding for bf16,
// the random bits from hash(seed, base + index): base places the call's elements in a larger whole).
template <class T>
__global__ void adamw_kernel(T* params, float* master, const T* grads, float* m, float* v, long long n, float lr,
                             float beta1, float beta2, float bc1, float bc2, float eps, float wd, float grad_scale,
                             uint32_t seed, uint32_t base) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = to_f32(grads[i]) * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    float p = master ? master[i] : to_f32(params[i]);
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
    if (master) master[i] = p;
    if constexpr (std::is_same<T, float>::value)
        params[i] = p;
    else
        params[i] = stochastic_round_bf16(p, hash_u32(seed, base + (uint32_t)i));
}

// Fixed grid (a function of n only), each thread sums x^2 in double over a grid-stride
// loop, block tree reduction in a fixed order -> partial[blockIdx.x]; the host adds the
// partials in order.
constexpr int kSumSqThreads = 256;
inline int sum_squares_blocks(long long n) {
    long long b = (n + kSumSqThreads - 1) / kSumSqThreads;
    return (int)(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}
template <class T>
__global__ void sum_squares_kernel(double* partial, const T* g, long long n) {
    __shared__ double s[kSumSqThreads / 32];
    double acc = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double x = (double)to_f32(g[i]);
        acc += x * x;
    }
    acc = warp_sum_d(acc);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s[w];
        partial[blockIdx.x] = t;
    }
}
