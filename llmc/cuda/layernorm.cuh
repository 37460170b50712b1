// LayerNorm forward (plain and fused with the residual add), a deterministic backward (which
// RMSNorm's backward shares), and the residual add. Statistics (mean, rstd) are fp32; all arithmetic is fp32. dinp, dw and db
// accumulate (+=); out, residual, mean and rstd are overwritten.
// Speed: all memory-bound. One warp per row (warp shuffles only, no block barrier per row); rows
// move in 16-byte packs of K elements (common.cuh's pack_width: K = 1 when a pointer or C does
// not allow them). One pack per lane and loop step: occupancy keeps the loads in flight (two
// packs per step took the bf16 backward from 56 to 151 registers, ptxas sm_90).
#pragma once
#include <string>

#include "llmc/cuda/common.cuh"

constexpr int kLnFwdWarps = 8;  // forward: rows (warps) per block

// One warp per row; C % K == 0. Two passes over the row (mean, then centred variance) for
// accuracy, and a third for the output; the second and third read the row again (L1/L2).
// If `a` and `b` are given (fused variant), the input row is a + b, rounded to T and written
// to `residual` first (inp unused); the statistics use the rounded values (what is stored).
// RMS: RMSNorm (the Llama family's): no mean pass (mean 0, not written), no bias:
// out = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps).
template <class T, int K, bool RMS>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, T* residual, const T* inp, const T* a,
                                         const T* b, const T* w, const T* bias, int N, int C, float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const long long off = (long long)row * C;
    const int nvec = C / K;
    const T* x = (a != nullptr ? residual : inp) + off;
    float s = 0.0f;
    if (a != nullptr) {
        for (int i = lane; i < nvec; i += 32) {
            const Pack<T, K> pa = load_pack<K>(a + off + i * K), pb = load_pack<K>(b + off + i * K);
            Pack<T, K> r;
            LLMC_UNROLL
            for (int k = 0; k < K; k++) {
                r.v[k] = from_f32<T>(to_f32(pa.v[k]) + to_f32(pb.v[k]));
                s += to_f32(r.v[k]);
            }
            store_pack(residual + off + i * K, r);  // this lane reads it back below
        }
    } else if (!RMS) {
        for (int i = lane; i < nvec; i += 32) {
            const Pack<T, K> p = load_pack<K>(x + i * K);
            LLMC_UNROLL
            for (int k = 0; k < K; k++) s += to_f32(p.v[k]);
        }
    }
    const float m = RMS ? 0.0f : warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < nvec; i += 32) {
        const Pack<T, K> p = load_pack<K>(x + i * K);
        LLMC_UNROLL
        for (int k = 0; k < K; k++) {
            const float d = to_f32(p.v[k]) - m;
            v += d * d;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / (float)C + eps);
    for (int i = lane; i < nvec; i += 32) {
        const Pack<T, K> px = load_pack<K>(x + i * K), pw = load_pack<K>(w + i * K);
        Pack<T, K> o;
        if constexpr (RMS) {
            LLMC_UNROLL
            for (int k = 0; k < K; k++) o.v[k] = from_f32<T>(to_f32(px.v[k]) * r * to_f32(pw.v[k]));
        } else {
            const Pack<T, K> pb = load_pack<K>(bias + i * K);
            LLMC_UNROLL
            for (int k = 0; k < K; k++)
                o.v[k] = from_f32<T>((to_f32(px.v[k]) - m) * r * to_f32(pw.v[k]) + to_f32(pb.v[k]));
        }
        store_pack(out + off + i * K, o);
    }
    if (lane == 0) {
        if (!RMS) mean[row] = m;
        rstd[row] = r;
    }
}

// ---- backward (LayerNorm, and RMSNorm as its special case) ----
// Pass 1 (norm_backward_kernel): one warp per row. Block g handles rows
// [g*rpb, min(N, (g+1)*rpb)), its warp w the rows r0 + w, r0 + w + W, ... in order. With
// n = (x - mean) * rstd and dn = w * dout:  dinp += rstd * (dn - mean(dn) - n * mean(dn * n)).
// RMSNorm (RMS = true) is the same with mean = 0 and no mean(dn) term, and no bias.
// Each warp adds its rows' dw (= dout * n) and, for LayerNorm, db (= dout) into its own
// accumulators in shared memory (W warps x Q x S floats, Q = 2 for LayerNorm, 1 for RMSNorm,
// S = ln_acc_stride); lane l's elements sit at indices = l mod 32, so a warp's 32 lanes hit 32
// banks and no lane touches another's (ln_acc_index). At the end the block adds its warps'
// accumulators in warp order into partial[g][0, Q C) (dw then db).
// Pass 2 (common.cuh's column_sum_add_kernel) adds the blocks' partials in a fixed order into dw
// (and db). Every order is fixed by N, C and K: deterministic.
constexpr int kLnBwdBlocks = 1024;                  // pass 1's blocks (fewer when N is smaller)
constexpr size_t kLnBwdSmemBudget = 32 * 1024;       // accumulators per block, W chosen to fit (W >= 1)

// Accumulator floats per warp and quantity: the lanes' packs i = lane + 32 j, j < ceil(C/K/32).
__host__ __device__ inline int ln_acc_stride(int C, int K) { return (C / K + 31) / 32 * 32 * K; }
// Accumulator index of element k of pack i (i = lane + 32 j): (j K + k) 32 + lane.
__host__ __device__ inline int ln_acc_index(int i, int k, int K) { return ((i >> 5) * K + k) * 32 + (i & 31); }

// P > 0 (16-bit T, a row of at most 32 P packs): each lane keeps its P packs of w in registers for all its
// rows, and loads a row's dout, inp and dinp packs at once into registers before any arithmetic
// (3 P loads in flight a lane instead of one pass's 2-3, and no second read of dout and inp). The
// same arithmetic in the same order as P = 0 (every row length): the same bits.
template <class T, int K, bool RMS, int P = 0>
__global__ void norm_backward_kernel(T* dinp, float* partial, const T* dout, const T* inp, const T* w,
                                     const float* mean, const float* rstd, int N, int C, int rows_per_block) {
    constexpr int Q = RMS ? 1 : 2;
    LLMC_EXTERN_SMEM(float, ln_smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int nvec = C / K, S = ln_acc_stride(C, K);
    float* acc_dw = ln_smem + (size_t)warp * Q * S;
    float* acc_db = acc_dw + S;  // LayerNorm only
    for (int j = lane; j < Q * S; j += 32) acc_dw[j] = 0.0f;  // this lane's own entries
    const int r0 = blockIdx.x * rows_per_block;
    const int r1 = min(N, r0 + rows_per_block);
    // one pack's share of the sums and of the accumulators (pack i of a row), then its dinp
    auto pack_sums = [&](int i, const Pack<T, K>& pd, const Pack<T, K>& px, const Pack<T, K>& pw, float m, float rs,
                         float& sum_dn, float& sum_dn_n) {
        LLMC_UNROLL
        for (int k = 0; k < K; k++) {
            const float d = to_f32(pd.v[k]), n = (to_f32(px.v[k]) - m) * rs, dn = to_f32(pw.v[k]) * d;
            sum_dn += dn;
            sum_dn_n += dn * n;
            const int a = ln_acc_index(i, k, K);
            acc_dw[a] += d * n;
            if constexpr (!RMS) acc_db[a] += d;
        }
    };
    auto pack_dinp = [&](Pack<T, K>& pg, const Pack<T, K>& pd, const Pack<T, K>& px, const Pack<T, K>& pw, float m,
                         float rs, float mean_dn, float mean_dn_n) {
        LLMC_UNROLL
        for (int k = 0; k < K; k++) {
            const float n = (to_f32(px.v[k]) - m) * rs, dn = to_f32(pw.v[k]) * to_f32(pd.v[k]);
            pg.v[k] = from_f32<T>(to_f32(pg.v[k]) + rs * (dn - mean_dn - n * mean_dn_n));
        }
    };
    if constexpr (P > 0) {
        Pack<T, K> pw[P];
        LLMC_UNROLL
        for (int j = 0; j < P; j++)
            if (lane + 32 * j < nvec) pw[j] = load_pack<K>(w + (lane + 32 * j) * K);
        for (int row = r0 + warp; row < r1; row += W) {
            const long long off = (long long)row * C;
            Pack<T, K> pd[P], px[P], pg[P];
            LLMC_UNROLL
            for (int j = 0; j < P; j++) {
                const int i = lane + 32 * j;
                if (i < nvec) {
                    pd[j] = load_pack<K>(dout + off + i * K);
                    px[j] = load_pack<K>(inp + off + i * K);
                    pg[j] = load_pack<K>(dinp + off + i * K);
                }
            }
            const float m = RMS ? 0.0f : mean[row], rs = rstd[row];
            float sum_dn = 0.0f, sum_dn_n = 0.0f;
            LLMC_UNROLL
            for (int j = 0; j < P; j++)
                if (lane + 32 * j < nvec) pack_sums(lane + 32 * j, pd[j], px[j], pw[j], m, rs, sum_dn, sum_dn_n);
            const float mean_dn = RMS ? 0.0f : warp_sum(sum_dn) / (float)C;
            const float mean_dn_n = warp_sum(sum_dn_n) / (float)C;
            LLMC_UNROLL
            for (int j = 0; j < P; j++) {
                const int i = lane + 32 * j;
                if (i < nvec) {
                    if constexpr (sizeof(Pack<T, K>) % 4 == 0) {  // n and dn again from the packs (ptxas:
                        opaque(pd[j]), opaque(px[j]), opaque(pw[j]);  // kept as floats, P 8 spilled)
                    }
                    pack_dinp(pg[j], pd[j], px[j], pw[j], m, rs, mean_dn, mean_dn_n);
                    store_pack(dinp + off + i * K, pg[j]);
                }
            }
        }
    } else {
        for (int row = r0 + warp; row < r1; row += W) {
            const long long off = (long long)row * C;
            const float m = RMS ? 0.0f : mean[row], rs = rstd[row];
            float sum_dn = 0.0f, sum_dn_n = 0.0f;
            for (int i = lane; i < nvec; i += 32)
                pack_sums(i, load_pack<K>(dout + off + i * K), load_pack<K>(inp + off + i * K),
                          load_pack<K>(w + i * K), m, rs, sum_dn, sum_dn_n);
            const float mean_dn = RMS ? 0.0f : warp_sum(sum_dn) / (float)C;
            const float mean_dn_n = warp_sum(sum_dn_n) / (float)C;
            for (int i = lane; i < nvec; i += 32) {
                Pack<T, K> pg = load_pack<K>(dinp + off + i * K);
                pack_dinp(pg, load_pack<K>(dout + off + i * K), load_pack<K>(inp + off + i * K),
                          load_pack<K>(w + i * K), m, rs, mean_dn, mean_dn_n);
                store_pack(dinp + off + i * K, pg);
            }
        }
    }
    __syncthreads();  // every warp's accumulators are complete
    float* out = partial + (long long)blockIdx.x * Q * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int a = ln_acc_index(c / K, c % K, K);
        float sw = 0.0f, sb = 0.0f;
        for (int v = 0; v < W; v++) {
            sw += ln_smem[(size_t)v * Q * S + a];
            if constexpr (!RMS) sb += ln_smem[(size_t)v * Q * S + S + a];
        }
        out[c] = sw;
        if constexpr (!RMS) out[C + c] = sb;
    }
}

// out = a + b over n elements: one pack of K per thread, the last few elements one by one.
template <class T, int K>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, long long n) {
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * K;
    if (i + K <= n) {
        const Pack<T, K> pa = load_pack<K>(a + i), pb = load_pack<K>(b + i);
        Pack<T, K> o;
        LLMC_UNROLL
        for (int k = 0; k < K; k++) o.v[k] = from_f32<T>(to_f32(pa.v[k]) + to_f32(pb.v[k]));
        store_pack(out + i, o);
    } else {
        for (long long j = i; j < n; j++) out[j] = from_f32<T>(to_f32(a[j]) + to_f32(b[j]));
    }
}

// ---- launchers (N, n > 0) ----
// Forward; residual, a and b null for the plain variant.
template <class T>
void launch_layernorm_forward(cudaStream_t st, T* out, float* mean, float* rstd, T* residual, const T* inp,
                              const T* a, const T* b, const T* w, const T* bias, int N, int C) {
    with_pack_width<T>(pack_width<T>(C, {out, residual, inp, a, b, w, bias}), [&](auto k) {
        auto layernorm_forward = layernorm_forward_kernel<T, decltype(k)::value, false>;
        LLMC_LAUNCH(layernorm_forward, ceil_div(N, kLnFwdWarps), kLnFwdWarps * 32, 0, st, out, mean, rstd, residual,
                    inp, a, b, w, bias, N, C, 1e-5f);
    });
}
// RMSNorm's forward: the same kernel without the mean and the bias.
template <class T>
void launch_rmsnorm_forward(cudaStream_t st, T* out, float* rstd, const T* inp, const T* w, int N, int C, float eps) {
    with_pack_width<T>(pack_width<T>(C, {out, inp, w}), [&](auto k) {
        auto rmsnorm_forward = layernorm_forward_kernel<T, decltype(k)::value, true>;
        LLMC_LAUNCH(rmsnorm_forward, ceil_div(N, kLnFwdWarps), kLnFwdWarps * 32, 0, st, out, nullptr, rstd, nullptr, inp,
                    nullptr, nullptr, w, nullptr, N, C, eps);
    });
}

// The backward's grid, warps per block and partial sums depend on N, C and the pack width only:
// the same reduction order on any GPU. `partial` holds layernorm_backward_partial_floats(N, C)
// (LayerNorm; RMSNorm needs half of it).
inline int layernorm_backward_rows_per_block(int N) { return ceil_div(N, kLnBwdBlocks); }
inline int layernorm_backward_blocks(int N) { return ceil_div(N, layernorm_backward_rows_per_block(N)); }
inline size_t layernorm_backward_partial_floats(int N, int C) {
    return (size_t)layernorm_backward_blocks(N) * 2 * C;
}
// Warps per block of pass 1: the largest of 8, 4, 2 whose accumulators (Q quantities) fit
// kLnBwdSmemBudget, else 1.
inline int layernorm_backward_warps(int C, int K, int Q) {
    const size_t per_warp = (size_t)Q * ln_acc_stride(C, K) * sizeof(float);
    int W = 8;
    while (W > 1 && W * per_warp > kLnBwdSmemBudget) W /= 2;
    return W;
}

// norm_backward_kernel<T, K, rms, P> (P 4, 8 only for 16-bit T in packs, K > 1)
template <class T, int K>
auto norm_backward_of(bool rms, int P) {
    if constexpr (K > 1 && sizeof(T) == 2) {
        if (P == 4) return rms ? norm_backward_kernel<T, K, true, 4> : norm_backward_kernel<T, K, false, 4>;
        if (P == 8) return rms ? norm_backward_kernel<T, K, true, 8> : norm_backward_kernel<T, K, false, 8>;
    }
    return rms ? norm_backward_kernel<T, K, true> : norm_backward_kernel<T, K, false>;
}
// Both passes; mean and db are null for RMSNorm. Throws UserError when C's accumulators (one
// warp's: Q x ~C floats) pass the device's shared-memory limit per block (d_model ~29k on H100).
// keep_rows: pass 1 keeps rows in registers where they fit (norm_backward_kernel's P; false: every
// row streamed twice, dev/cuda/layernorm's version 5, KernelWays::ln_bwd_registers).
template <class T>
void launch_norm_backward(cudaStream_t st, T* dinp, T* dw, T* db, float* partial, const T* dout, const T* inp,
                          const T* w, const float* mean, const float* rstd, int N, int C, bool keep_rows = true) {
    const bool rms = mean == nullptr;
    const int Q = rms ? 1 : 2;
    const int rows_per_block = layernorm_backward_rows_per_block(N), G = layernorm_backward_blocks(N);
    with_pack_width<T>(pack_width<T>(C, {dinp, dout, inp, w}), [&](auto k) {
        constexpr int K = decltype(k)::value;
        const int W = layernorm_backward_warps(C, K, Q);
        const size_t smem = (size_t)W * Q * ln_acc_stride(C, K) * sizeof(float);
        // a row of at most 128 or 256 16-byte packs: kept in registers (P 4 or 8), else streamed twice
        // (fp32, and element by element, K = 1: always streamed, no register kernels built for them)
        const int P = K > 1 && sizeof(T) == 2 && keep_rows ? (C / K <= 32 * 4 ? 4 : C / K <= 32 * 8 ? 8 : 0) : 0;
        auto kernel = norm_backward_of<T, K>(rms, P);
        int limit = 0;
        if (!opt_in_smem((const void*)kernel, smem, &limit))
            throw UserError("model.d_model: " + std::to_string(C) + " is too wide for the CUDA " +
                            (rms ? "rmsnorm" : "layernorm") + " backward kernel (" + std::to_string(smem) +
                            " bytes of shared memory per block; this GPU allows " + std::to_string(limit) + ")");
        LLMC_LAUNCH(kernel, G, W * 32, smem, st, dinp, partial, dout, inp, w, mean, rstd, N, C, rows_per_block);
    });
    CUDA_CHECK_LAUNCH();
    launch_column_sum_add(st, dw, db, partial, G, C, Q);
}

template <class T>
void launch_residual_forward(cudaStream_t st, T* out, const T* a, const T* b, long long n) {
    // one row: the kernel takes the elements past the last whole pack one by one
    with_pack_width<T>(pack_width<T>(0, {out, a, b}), [&](auto k) {
        constexpr int K = decltype(k)::value;
        auto residual_forward = residual_forward_kernel<T, K>;
        LLMC_LAUNCH(residual_forward, ceil_div(ceil_div(n, K), 256), 256, 0, st, out, a, b, n);
    });
}
