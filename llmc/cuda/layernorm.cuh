// LayerNorm forward (plain and fused with the residual add) and a deterministic backward.
// Statistics (mean, rstd) are fp32; all arithmetic is fp32.
#pragma once
#include "llmc/cuda/common.cuh"

// One warp per row. Two passes over the row (mean, then centred variance) for accuracy.
// If `a` and `b` are given (fused variant), the input row is a + b, rounded to T and
// written to `residual` first; the statistics use the rounded values (what is stored).
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, T* residual, const T* inp, const T* a,
                                         const T* b, const T* w, const T* bias, int N, int C) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const long long off = (long long)row * C;
    const T* x = inp + off;
    if (a != nullptr) {
        for (int c = lane; c < C; c += 32) residual[off + c] = from_f32<T>(to_f32(a[off + c]) + to_f32(b[off + c]));
        __syncwarp();  // this warp's own writes, re-read below (same threads, but be explicit)
        x = residual + off;
    }
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += to_f32(x[c]);
    const float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = to_f32(x[c]) - m;
        v += d * d;
    }
    const float var = warp_sum(v) / (float)C;
    const float r = 1.0f / sqrtf(var + 1e-5f);
    for (int c = lane; c < C; c += 32) {
        float n = (to_f32(x[c]) - m) * r;
        out[off + c] = from_f32<T>(n * to_f32(w[c]) + to_f32(bias[c]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// Backward, pass 1. Block g handles rows [g*rpb, min(N, (g+1)*rpb)) in order; the whole
// block works on one row at a time (thread j owns channels j, j+blockDim, ...). dinp is
// accumulated (+=). Per-block partial sums of dw (= dout*norm) and db (= dout) go to
// partial[g*2C .. g*2C+2C) (dw then db). dynamic smem: 2*C floats + 32.
template <class T>
__global__ void layernorm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* w,
                                          const float* mean, const float* rstd, int N, int C, int rows_per_block) {
    LLMC_EXTERN_SMEM(float, ln_smem);
    float* s_dw = ln_smem;
    float* s_db = ln_smem + C;
    float* scratch = ln_smem + 2 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        s_dw[c] = 0.0f;
        s_db[c] = 0.0f;
    }
    const int r0 = blockIdx.x * rows_per_block;
    const int r1 = min(N, r0 + rows_per_block);
    for (int row = r0; row < r1; row++) {
        const long long off = (long long)row * C;
        const float m = mean[row], rs = rstd[row];
        float sum_dn = 0.0f, sum_dn_n = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float n = (to_f32(inp[off + c]) - m) * rs;
            float dn = to_f32(w[c]) * to_f32(dout[off + c]);
            sum_dn += dn;
            sum_dn_n += dn * n;
        }
        const float mean_dn = block_sum(sum_dn, scratch) / (float)C;
        const float mean_dn_n = block_sum(sum_dn_n, scratch) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float n = (to_f32(inp[off + c]) - m) * rs;
            float d = to_f32(dout[off + c]);
            float dn = to_f32(w[c]) * d;
            float g = rs * (dn - mean_dn - n * mean_dn_n);
            dinp[off + c] = from_f32<T>(to_f32(dinp[off + c]) + g);
            s_dw[c] += d * n;
            s_db[c] += d;
        }
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        partial[(long long)blockIdx.x * 2 * C + c] = s_dw[c];
        partial[(long long)blockIdx.x * 2 * C + C + c] = s_db[c];
    }
}

// Backward, pass 2: dw[c] += sum_g partial[g].dw[c], db likewise, g in increasing order.
template <class T>
__global__ void layernorm_backward_reduce_kernel(T* dw, T* db, const float* partial, int G, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int g = 0; g < G; g++) {
        sw += partial[(long long)g * 2 * C + c];
        sb += partial[(long long)g * 2 * C + C + c];
    }
    dw[c] = from_f32<T>(to_f32(dw[c]) + sw);
    db[c] = from_f32<T>(to_f32(db[c]) + sb);
}

template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}
