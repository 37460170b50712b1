// AdamW (one fused elementwise pass) and the deterministic sum of squares of a gradient.
#pragma once
#include <type_traits>
#include "llmc/cuda/common.cuh"

// step, inv_sqrt_bc2: adamw_scales (llmc/backend/ops.h, the host's). p comes from master when master != nullptr;
// master is then updated and params gets the rounded copy (stochastic rounding for bf16, nearest for fp16,
// the random bits from hash(seed, base + index): base places the call's elements in a larger whole).
template <class T>
__device__ __forceinline__ void adamw_element(T* params, float* master, const T* grads, float* m, float* v, long long i,
                                              float lr, float beta1, float beta2, float step, float inv_sqrt_bc2,
                                              float eps, float wd, float grad_scale, uint32_t seed, uint32_t base) {
    const float g = to_f32(grads[i]) * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = master ? master[i] : to_f32(params[i]);
    p = p - (lr * wd) * p - step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    if (master) master[i] = p;
    if constexpr (std::is_same<T, bf16>::value)
        params[i] = stochastic_round_bf16(p, hash_u32(seed, base + (uint32_t)i));
    else  // fp32; fp16 (always with master weights) rounds to nearest, as the CPU's emulation does
        params[i] = from_f32<T>(p);
}

template <class T>
__global__ void adamw_kernel(T* params, float* master, const T* grads, float* m, float* v, long long n, float lr,
                             float beta1, float beta2, float step, float inv_sqrt_bc2, float eps, float wd, float grad_scale,
                             uint32_t seed, uint32_t base) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_element(params, master, grads, m, v, i, lr, beta1, beta2, step, inv_sqrt_bc2, eps, wd, grad_scale, seed, base);
}

// Multi-tensor AdamW: one launch over every piece, a block per chunk of kAdamWChunk elements of
// one piece (the chunk table: piece index, first element). Each element is updated exactly as
// adamw_kernel updates it; ctl[1] == 0 (Ops::step_control: a skipped step) changes nothing. The
// step's lr, step size and 1 / sqrt(bias correction 2) come from device memory (hyper[0..2]), so
// that a CUDA graph of the step (llmc/cuda/step_graph.cuh) takes each step's values.
constexpr long long kAdamWChunk = 4096;
struct AdamWDesc {
    void* params;
    float* master;
    const void* grads;
    float *m, *v;
    long long n;
    float wd;
    uint32_t seed, base;
};
// (no padding: adamw_multi keys the table's upload on its bytes, and a padding's bytes are
// whatever the stack held; a key that changed after a checkpoint re-uploaded the table inside a
// CUDA graph's replay, which stops the run)
struct AdamWChunk {
    int piece;
    int zero;  // always 0
    long long begin;
};
static_assert(std::has_unique_object_representations<AdamWChunk>::value, "AdamWChunk's bytes are its fields'");
template <class T>
__global__ void adamw_multi_kernel(const AdamWDesc* d, const AdamWChunk* chunks, const float* ctl,
                                   const float* hyper, float beta1, float beta2, float eps) {
    if (ctl[1] == 0.0f) return;
    const float lr = hyper[0], step = hyper[1], inv_sqrt_bc2 = hyper[2];
    const AdamWChunk c = chunks[blockIdx.x];
    const AdamWDesc p = d[c.piece];
    const long long end = c.begin + kAdamWChunk < p.n ? c.begin + kAdamWChunk : p.n;
    for (long long i = c.begin + threadIdx.x; i < end; i += blockDim.x)
        adamw_element((T*)p.params, p.master, (const T*)p.grads, p.m, p.v, i, lr, beta1, beta2, step, inv_sqrt_bc2, eps, p.wd,
                      ctl[0], p.seed, p.base);
}

// ctl from the summed squares (Ops::step_control), in double as the host computes it.
__global__ void step_control_kernel(float* ctl, const double* ss, double clip, double loss_scale) {
    const double norm = sqrt(ss[0]) / loss_scale;
    float f = 1.0f;
    if (clip > 0.0) {
        const double q = clip / (norm + 1e-6);
        f = (float)(q < 1.0 ? q : 1.0);
    }
    ctl[0] = (float)((double)f / loss_scale);
    ctl[1] = isfinite(ss[0]) && isfinite(ss[1]) ? 1.0f : 0.0f;
}

// Fixed grid (a function of n only), each thread sums x^2 in double over a grid-stride
// loop, block tree reduction in a fixed order -> partial[blockIdx.x]; the host adds the
// partials in order.
constexpr int kSumSqThreads = 256;
inline int sum_squares_blocks(long long n) {
    long long b = (n + kSumSqThreads - 1) / kSumSqThreads;
    return (int)(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

// One block's share of a sum of squares: g[i] for i = block * blockDim + thread, stepping by stride,
// summed per thread, per warp and then over the warps in order into *out (the same grid gives the
// same sum). s: the kernel's kSumSqThreads / 32 doubles of shared memory.
template <class T>
__device__ void sum_squares_block(double* out, const T* g, long long n, long long block, long long stride, double* s) {
    double acc = 0.0;
    for (long long i = block * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double x = (double)to_f32(g[i]);
        acc += x * x;
    }
    acc = warp_sum_d(acc);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s[w];
        *out = t;
    }
}

template <class T>
__global__ void sum_squares_kernel(double* partial, const T* g, long long n) {
    __shared__ double s[kSumSqThreads / 32];
    sum_squares_block(partial + blockIdx.x, g, n, blockIdx.x, (long long)gridDim.x * blockDim.x, s);
}

// Multi-tensor sum of squares: block b of the launch works on the region whose blocks hold it
// (first_block ascending: a binary search) as block (b - first_block) of sum_squares_kernel's
// grid for that region (sum_squares_blocks(n) blocks).
struct SumSqRegion {
    const void* g;
    long long n;
    int first_block, blocks;
};
template <class T>
__global__ void sum_squares_multi_kernel(double* partial, const SumSqRegion* regions, int nregions) {
    __shared__ double s[kSumSqThreads / 32];
    int lo = 0, hi = nregions - 1;  // the last region with first_block <= blockIdx.x
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (regions[mid].first_block <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const SumSqRegion r = regions[lo];
    sum_squares_block(partial + blockIdx.x, (const T*)r.g, r.n, blockIdx.x - r.first_block,
                      (long long)r.blocks * blockDim.x, s);
}
// One block: thread j adds region j's partials in order (as the host adds sum_squares' partials),
// then thread 0 adds the regions in order: what the host's per-region loop gives.
__global__ void sum_squares_finish_kernel(double* out, double* per_region, const double* partial,
                                          const SumSqRegion* regions, int nregions) {
    for (int j = threadIdx.x; j < nregions; j += blockDim.x) {
        double s = 0.0;
        for (int b = 0; b < regions[j].blocks; b++) s += partial[regions[j].first_block + b];
        per_region[j] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int j = 0; j < nregions; j++) t += per_region[j];
        *out = t;
    }
}
