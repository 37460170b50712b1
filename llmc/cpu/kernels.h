// The math of the CPU backend: every GPT-2 kernel as a template over the scalar type T.
// CpuOps instantiates these with T = float (the trainer's path); the tests instantiate the
// very same code with T = double for finite-difference gradient checks.
//
// Semantics are those documented in llmc/backend/ops.h. All statistics (LayerNorm mean/rstd,
// attention log-sum-exp, losses) are of type T here; CpuOps passes the fp32 buffers.
//
// Determinism: every output element is produced by exactly one thread, in a loop order
// that does not depend on the number of OpenMP threads. No OpenMP reductions or atomics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "llmc/cpu/gemm.h"
#include "llmc/backend/positions.h"
#include "llmc/backend/rope.h"

namespace cpu {

constexpr double kLayerNormEps = 1e-5;
constexpr int kChanBlock = 16;  // channel block for column-wise (over rows) accumulations

// Below this amount of work (elements or multiply-adds) an op runs on the calling thread:
// a parallel region costs microseconds, and much more on an oversubscribed machine.
// (Results never depend on this: see "Determinism" above.)
constexpr size_t kMinParallelWork = 16384;
inline bool parallel_worth(size_t work) { return work >= kMinParallelWork; }

// Column sums over rows (bias and norm-weight gradients): f(n, c0, c1) for every row n in order,
// within each block [c0, c1) of kChanBlock channels; blocks run in parallel. Each output column
// belongs to one block, so the result does not depend on the thread count.
template <class F>
inline void over_channel_blocks(long N, int C, F f) {
    const int nblk = (C + kChanBlock - 1) / kChanBlock;
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kChanBlock, c1 = std::min(C, c0 + kChanBlock);
        for (long n = 0; n < N; ++n) f(n, c0, c1);
    }
}

// ---------------------------------------------------------------------------------------
// Scalar helpers

// exp: float uses a vectorisable Cody-Waite + polynomial implementation (about 1 ulp);
// double uses the C library (the tests' reference precision).
inline float exp_approx(float x) {
    // Below -87.3 (where exp is denormal) the result is flushed to 0, above 88 it is +inf, and
    // NaN stays NaN. Comparisons with NaN are false, so the clamp maps NaN to -87.3 and the
    // conversion to int below stays defined; the selects at the end restore it (branch-free).
    const bool underflow = x < -87.3f, overflow = x > 88.0f, nan = x != x;
    const float xc = x > -87.3f ? (x < 88.0f ? x : 88.0f) : -87.3f;
    const float log2e = 1.44269504088896341f;
    const float fn = std::nearbyint(xc * log2e);
    // x - n*ln2 in two parts (Cody-Waite)
    const float ln2_hi = 0.693359375f;
    const float ln2_lo = -2.12194440e-4f;
    float r = std::fma(-fn, ln2_hi, xc);
    r = std::fma(-fn, ln2_lo, r);
    // exp(r) on |r| <= ln2/2: minimax polynomial (cephes expf coefficients)
    float p = 1.9875691500e-4f;
    p = std::fma(p, r, 1.3981999507e-3f);
    p = std::fma(p, r, 8.3334519073e-3f);
    p = std::fma(p, r, 4.1665795894e-2f);
    p = std::fma(p, r, 1.6666665459e-1f);
    p = std::fma(p, r, 5.0000001201e-1f);
    p = std::fma(p, r * r, r);
    p = p + 1.0f;
    // scale by 2^n via the exponent bits
    const int n = (int)fn;  // in [-126, 127]
    union {
        int32_t i;
        float f;
    } u;
    u.i = (n + 127) << 23;
    const float e = underflow ? 0.0f : p * u.f;
    return nan ? x : overflow ? INFINITY : e;
}

template <class T>
inline T exp_t(T x) {
    return std::exp(x);
}
template <>
inline float exp_t<float>(float x) {
    return exp_approx(x);
}

// tanh via exp (vectorisable for float): tanh(u) = sign(u) * (1 - e) / (1 + e), e = exp(-2|u|)
template <class T>
inline T tanh_t(T u) {
    return std::tanh(u);
}
template <>
inline float tanh_t<float>(float u) {
    const float au = std::fabs(u);
    const float e = exp_approx(-2.0f * au);
    float t = (1.0f - e) / (1.0f + e);
    // for small |u| the subtraction above cancels; use the odd Taylor series instead
    const float u2 = u * u;
    const float ts = au * (1.0f + u2 * (-1.0f / 3.0f + u2 * (2.0f / 15.0f + u2 * (-17.0f / 315.0f))));
    t = au < 0.0625f ? ts : t;
    return std::copysign(t, u);
}

template <class T>
constexpr T gelu_k() {
    return (T)0.7978845608028654;  // sqrt(2/pi)
}

template <class T>
inline T gelu(T x) {
    const T u = gelu_k<T>() * (x + (T)0.044715 * x * x * x);
    return (T)0.5 * x * ((T)1 + tanh_t(u));
}

template <class T>
inline T gelu_grad(T x) {
    const T x2 = x * x;
    const T u = gelu_k<T>() * (x + (T)0.044715 * x2 * x);
    const T th = tanh_t(u);
    const T sech2 = (T)1 - th * th;
    return (T)0.5 * ((T)1 + th) + (T)0.5 * x * sech2 * gelu_k<T>() * ((T)1 + (T)3 * (T)0.044715 * x2);
}

// Dot product with 8 independent partial sums (vectorisable, fixed order).
template <class T>
inline T dot(const T* __restrict a, const T* __restrict b, int n) {
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] = std::fma(a[i + j], b[i + j], acc[j]);
    T s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s = std::fma(a[i], b[i], s);
    return s;
}

// Sum with 8 independent partial sums (fixed order).
template <class T>
inline T sum(const T* __restrict a, int n) {
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j];
    T s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i];
    return s;
}

// Maximum with 8 independent partial maxima (vectorisable). n >= 1.
template <class T>
inline T max_val(const T* __restrict a, int n) {
    T acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = a[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) acc[j] = acc[j] > a[i + j] ? acc[j] : a[i + j];
    T m = acc[0];
    for (int j = 1; j < 8; ++j) m = m > acc[j] ? m : acc[j];
    for (; i < n; ++i) m = m > a[i] ? m : a[i];
    return m;
}

// ---------------------------------------------------------------------------------------
// Encoder

// wte holds the vocabulary rows [vocab_begin, vocab_begin + rows).
// out[b,t,:] = wte[tokens[b,t] - vocab_begin,:] (zeros for tokens outside the slice)
//              + wpe[t,:] (when wpe is not null)
template <class T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                     int vocab_begin, int rows) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)B * Tn * C))
    for (long bt = 0; bt < (long)B * Tn; ++bt) {
        const int t = (int)(bt % Tn);
        const long row = (long)tokens[bt] - vocab_begin;
        const bool in = row >= 0 && row < rows;
        T* o = out + bt * C;
        if (in && wpe) {
            const T* we = wte + row * C;
            const T* pe = wpe + (long)t * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
        } else if (in) {
            const T* we = wte + row * C;
            for (int c = 0; c < C; ++c) o[c] = we[c];
        } else if (wpe) {
            const T* pe = wpe + (long)t * C;
            for (int c = 0; c < C; ++c) o[c] = pe[c];
        } else {
            for (int c = 0; c < C; ++c) o[c] = T(0);
        }
    }
}

// dwte[tokens[b,t] - vocab_begin,:] += dout[b,t,:] in (b,t) order, for the tokens in
// [vocab_begin, vocab_begin + rows); dwpe[t,:] += sum_b dout[b,t,:] in b order (when dwpe
// is not null). Parallel over channel blocks, so each element has one owner and a fixed
// summation order.
template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C,
                      int vocab_begin, int rows) {
    const int nblk = (C + kChanBlock - 1) / kChanBlock;
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)B * Tn * C))
    for (int blk = 0; blk < nblk; ++blk) {
        const int c0 = blk * kChanBlock, c1 = std::min(C, c0 + kChanBlock);
        for (long bt = 0; bt < (long)B * Tn; ++bt) {
            const long row = (long)tokens[bt] - vocab_begin;
            if (row < 0 || row >= rows) continue;
            T* dw = dwte + row * C;
            const T* d = dout + bt * C;
            for (int c = c0; c < c1; ++c) dw[c] += d[c];
        }
        if (!dwpe) continue;
        for (int t = 0; t < Tn; ++t) {
            T* dp = dwpe + (long)t * C;
            for (int b = 0; b < B; ++b) {
                const T* d = dout + ((long)b * Tn + t) * C;
                for (int c = c0; c < c1; ++c) dp[c] += d[c];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// LayerNorm

template <class T>
inline void layernorm_row(T* __restrict o, T* mean, T* rstd, const T* __restrict x, const T* __restrict w,
                          const T* __restrict b, int C) {
    const T m = sum(x, C) / (T)C;
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= C; i += 8)
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const T d = x[i + j] - m;
            acc[j] = std::fma(d, d, acc[j]);
        }
    T v = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < C; ++i) {
        const T d = x[i] - m;
        v = std::fma(d, d, v);
    }
    v /= (T)C;
    const T s = (T)1 / std::sqrt(v + (T)kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
    *mean = m;
    *rstd = s;
}

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (long n = 0; n < N; ++n) layernorm_row(out + n * C, mean + n, rstd + n, inp + n * C, w, b, C);
}

// residual = a + b; out = layernorm(residual)
template <class T>
void fused_residual_layernorm_forward(T* residual, T* out, T* mean, T* rstd, const T* a, const T* b, const T* w,
                                      const T* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (long n = 0; n < N; ++n) {
        T* r = residual + n * C;
        const T* an = a + n * C;
        const T* bn = b + n * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) r[c] = an[c] + bn[c];
        layernorm_row(out + n * C, mean + n, rstd + n, r, w, bias, C);
    }
}

// dinp += dLN/dinp (rows in parallel); dw, db += ... (channel blocks in parallel, rows in order).
template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                        const T* rstd, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (long n = 0; n < N; ++n) {
        const T* d = dout + n * C;
        const T* x = inp + n * C;
        T* dx = dinp + n * C;
        const T m = mean[n], s = rstd[n];
        // dnorm = d * w; mean(dnorm) and mean(dnorm * norm)
        T a1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= C; i += 8)
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                const T dn = d[i + j] * w[i + j];
                const T nm = (x[i + j] - m) * s;
                a1[j] += dn;
                a2[j] = std::fma(dn, nm, a2[j]);
            }
        T s1 = ((a1[0] + a1[1]) + (a1[2] + a1[3])) + ((a1[4] + a1[5]) + (a1[6] + a1[7]));
        T s2 = ((a2[0] + a2[1]) + (a2[2] + a2[3])) + ((a2[4] + a2[5]) + (a2[6] + a2[7]));
        for (; i < C; ++i) {
            const T dn = d[i] * w[i];
            const T nm = (x[i] - m) * s;
            s1 += dn;
            s2 = std::fma(dn, nm, s2);
        }
        const T dnorm_mean = s1 / (T)C;
        const T dnorm_norm_mean = s2 / (T)C;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
            const T nm = (x[c] - m) * s;
            const T dn = d[c] * w[c];
            dx[c] += (dn - dnorm_mean - nm * dnorm_norm_mean) * s;
        }
    }
    over_channel_blocks(N, C, [&](long n, int c0, int c1) {
        const T* d = dout + n * C;
        const T* x = inp + n * C;
        const T m = mean[n], s = rstd[n];
        for (int c = c0; c < c1; ++c) {
            db[c] += d[c];
            dw[c] = std::fma((x[c] - m) * s, d[c], dw[c]);
        }
    });
}

// out = a + b
template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel_worth(n))
    for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------------------------------
// Matmul

// out = gelu(inp), n elements
template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel_worth(n))
    for (size_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
}

// out[N,OC] = inp[N,IC] @ w[OC,IC]^T + bias; with gelu, pre_gelu = that and out = gelu(pre_gelu).
template <class T>
void matmul_forward(T* out, T* pre_gelu, const T* inp, const T* w, const T* bias, int N, int IC, int OC,
                    bool use_gelu) {
    T* dst = use_gelu ? pre_gelu : out;
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * OC))
    for (long n = 0; n < N; ++n) {
        T* o = dst + n * OC;
        if (bias) {
#pragma omp simd
            for (int j = 0; j < OC; ++j) o[j] = bias[j];
        } else {
#pragma omp simd
            for (int j = 0; j < OC; ++j) o[j] = T(0);
        }
    }
    // A = inp (rows n, k = i), B(k = i, j = o) = w[o * IC + i]
    gemm_acc<T>(dst, OC, inp, IC, 1, w, 1, IC, N, OC, IC);
    if (use_gelu) gelu_forward(out, pre_gelu, (size_t)N * OC);
}

// dout *= gelu'(pre_gelu) when pre_gelu != nullptr; dinp = dout @ w (overwrite, if dinp);
// dw += dout^T @ inp; dbias += column sums of dout (if dbias).
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, T* dout, const T* inp, const T* w, const T* pre_gelu, int N,
                     int IC, int OC) {
    if (pre_gelu) {
        const size_t total = (size_t)N * OC;
#pragma omp parallel for simd schedule(static) if (parallel_worth((size_t)N * OC))
        for (size_t i = 0; i < total; ++i) dout[i] *= gelu_grad(pre_gelu[i]);
    }
    if (dinp) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * IC))
        for (long n = 0; n < N; ++n) {
            T* d = dinp + n * IC;
#pragma omp simd
            for (int i = 0; i < IC; ++i) d[i] = T(0);
        }
        // A = dout [N, OC], B(k = o, j = i) = w[o * IC + i]
        gemm_acc<T>(dinp, IC, dout, OC, 1, w, IC, 1, N, IC, OC);
    }
    // dw[OC, IC] += A(o, n) = dout[n * OC + o] times B(n, i) = inp[n * IC + i]
    gemm_acc<T>(dw, IC, dout, 1, OC, inp, IC, 1, OC, IC, N);
    if (dbias)
        over_channel_blocks(N, OC, [&](long n, int c0, int c1) {
            const T* d = dout + n * OC;
            for (int c = c0; c < c1; ++c) dbias[c] += d[c];
        });
}

// ---------------------------------------------------------------------------------------
// Attention (causal, scale 1/sqrt(HS)); qkv [B,T,NH+2*NKV,HS] (q heads, k heads, v heads),
// out [B,T,NH,HS], lse [B,NH,T]. Query head h reads key/value head h / (NH/NKV).
//
// The block form (context parallelism's ring): the queries of qkv_q [B,Tq,W] against the keys
// and values of qkv_kv [B,Tk,W] (only their q / k,v columns are read), query row i at global
// position qp.at(i) seeing key row j at kp.at(j) when kp.at(j) <= qp.at(i). A row that sees no
// key gets out 0 and lse -inf. The whole causal attention is the block of a sequence with
// itself at the default positions.

template <class T>
void attention_block_forward(T* out, T* lse, const T* qkv_q, const T* qkv_kv, int B, int Tq, int Tk, int NH, int NKV,
                             int HS, SeqPositions qp, SeqPositions kp) {
    const int C = NH * HS, W = (NH + 2 * NKV) * HS, G = NH / NKV;
    const T scale = (T)1 / std::sqrt((T)HS);
    const long items = (long)B * NH * Tq;
#pragma omp parallel if (parallel_worth((size_t)B * NH * Tq * Tk * HS / 2))
    {
        std::vector<T> sc(Tk), acc(HS);
        std::vector<int> vis(Tk);
#pragma omp for schedule(dynamic, 8)
        for (long it = 0; it < items; ++it) {
            const int t = (int)(it % Tq);
            const int h = (int)((it / Tq) % NH);
            const int b = (int)(it / ((long)Tq * NH));
            const int koff = C + (h / G) * HS, voff = C + (NKV + h / G) * HS;
            const T* q = qkv_q + ((long)b * Tq + t) * W + h * HS;
            const int pos = qp.at(t);
            int n = 0;  // the visible keys, in row order
            for (int j = 0; j < Tk; ++j)
                if (kp.at(j) <= pos) vis[n++] = j;
            T* o = out + ((long)b * Tq + t) * C + h * HS;
            T& l = lse[((long)b * NH + h) * Tq + t];
            if (n == 0) {
                std::fill(o, o + HS, T(0));
                l = -std::numeric_limits<T>::infinity();
                continue;
            }
            T* scp = sc.data();
            for (int m = 0; m < n; ++m) {
                const T* k = qkv_kv + ((long)b * Tk + vis[m]) * W + koff;
                scp[m] = dot(q, k, HS) * scale;
            }
            const T mx = max_val(scp, n);
            for (int m = 0; m < n; ++m) scp[m] = exp_t(scp[m] - mx);
            const T se = sum(scp, n);
            const T inv = (T)1 / se;
            std::fill(acc.begin(), acc.end(), T(0));
            for (int m = 0; m < n; ++m) {
                const T p = sc[m] * inv;
                const T* v = qkv_kv + ((long)b * Tk + vis[m]) * W + voff;
                T* ac = acc.data();
#pragma omp simd
                for (int d = 0; d < HS; ++d) ac[d] = std::fma(p, v[d], ac[d]);
            }
            for (int d = 0; d < HS; ++d) o[d] = acc[d];
            l = mx + std::log(se);
        }
    }
}

template <class T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int NH, int NKV, int HS) {
    attention_block_forward(out, lse, qkv, qkv, B, Tn, Tn, NH, NKV, HS, SeqPositions(), SeqPositions());
}

// Merges a block's (out, lse) into a running one over the same query rows: out [B,T,NH,HS],
// lse [B,NH,T]. L = log(e^lse + e^blk_lse); out = e^(lse-L) out + e^(blk_lse-L) blk_out. A block
// row with lse -inf (no visible key) leaves the row as it is; a running row with lse -inf
// takes the block's.
template <class T>
void attention_merge(T* out, T* lse, const T* blk_out, const T* blk_lse, int B, int Tn, int NH, int HS) {
    const long items = (long)B * NH * Tn;
    const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)items * HS))
    for (long it = 0; it < items; ++it) {  // it = (b * NH + h) * T + t: lse's order
        const int t = (int)(it % Tn);
        const int h = (int)((it / Tn) % NH);
        const int b = (int)(it / ((long)Tn * NH));
        const T lb = blk_lse[it], la = lse[it];
        if (lb == ninf) continue;
        T* o = out + ((long)b * Tn + t) * NH * HS + h * HS;
        const T* ob = blk_out + ((long)b * Tn + t) * NH * HS + h * HS;
        if (la == ninf) {
            for (int d = 0; d < HS; ++d) o[d] = ob[d];
            lse[it] = lb;
            continue;
        }
        const T mx = std::max(la, lb);
        const T L = mx + std::log(exp_t(la - mx) + exp_t(lb - mx));
        const T wa = exp_t(la - L), wb = exp_t(lb - L);
        for (int d = 0; d < HS; ++d) o[d] = wa * o[d] + wb * ob[d];
        lse[it] = L;
    }
}

// Backward of a block given the whole attention's out and lse (of the query rows over every
// block): p_ij = exp(s_ij - lse_i); dp_ij = dout_i . v_j; D_i = dout_i . out_i;
// ds_ij = p_ij (dp_ij - D_i); dq_i += scale sum_j ds_ij k_j (the q columns of dq_dst [B,Tq,W]);
// dk_j += scale sum_i ds_ij q_i, dv_j += sum_i p_ij dout_i (the k, v columns of dkv_dst
// [B,Tk,W]). Accumulates; dq_dst and dkv_dst may be one buffer. One (b, key/value head) per work
// item: its query heads in order, each over i in order, so the sums run in a fixed order.
template <class T>
void attention_block_backward(T* dq_dst, T* dkv_dst, const T* dout, const T* qkv_q, const T* qkv_kv, const T* out,
                              const T* lse, int B, int Tq, int Tk, int NH, int NKV, int HS, SeqPositions qp,
                              SeqPositions kp) {
    const int C = NH * HS, W = (NH + 2 * NKV) * HS, G = NH / NKV;
    const T scale = (T)1 / std::sqrt((T)HS);
    const long items = (long)B * NKV;
#pragma omp parallel if (parallel_worth((size_t)B * NH * Tq * Tk * HS / 2))
    {
        std::vector<T> ds(Tk), pr(Tk), dq(HS);
        std::vector<int> vis(Tk);
#pragma omp for schedule(static)
        for (long it = 0; it < items; ++it) {
            const int g = (int)(it % NKV);
            const int b = (int)(it / NKV);
            const int koff = C + g * HS, voff = C + (NKV + g) * HS;
            for (int h = g * G; h < (g + 1) * G; ++h)
                for (int i = 0; i < Tq; ++i) {
                    const long qrow = (long)b * Tq + i;
                    const int pos = qp.at(i);
                    int n = 0;
                    for (int j = 0; j < Tk; ++j)
                        if (kp.at(j) <= pos) vis[n++] = j;
                    if (n == 0) continue;
                    const T* q = qkv_q + qrow * W + h * HS;
                    const T* go = dout + qrow * C + h * HS;
                    const T* o = out + qrow * C + h * HS;
                    const T Di = dot(go, o, HS);
                    const T l = lse[((long)b * NH + h) * Tq + i];
                    T* prp = pr.data();
                    T* dsp = ds.data();
                    for (int m = 0; m < n; ++m) {
                        const long krow = (long)b * Tk + vis[m];
                        prp[m] = dot(q, qkv_kv + krow * W + koff, HS) * scale - l;
                        dsp[m] = dot(go, qkv_kv + krow * W + voff, HS) - Di;
                    }
                    for (int m = 0; m < n; ++m) {
                        const T p = exp_t(prp[m]);
                        prp[m] = p;
                        dsp[m] = p * dsp[m] * scale;
                    }
                    std::fill(dq.begin(), dq.end(), T(0));
                    T* dqp = dq.data();
                    for (int m = 0; m < n; ++m) {
                        const long krow = (long)b * Tk + vis[m];
                        const T* k = qkv_kv + krow * W + koff;
                        T* dk = dkv_dst + krow * W + koff;
                        T* dv = dkv_dst + krow * W + voff;
                        const T dsj = ds[m], pj = pr[m];
#pragma omp simd
                        for (int d = 0; d < HS; ++d) {
                            dqp[d] = std::fma(dsj, k[d], dqp[d]);
                            dk[d] = std::fma(dsj, q[d], dk[d]);
                            dv[d] = std::fma(pj, go[d], dv[d]);
                        }
                    }
                    T* dqo = dq_dst + qrow * W + h * HS;
                    for (int d = 0; d < HS; ++d) dqo[d] += dq[d];
                }
        }
    }
}

// dqkv (overwrite): the block backward of a sequence with itself.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn, int NH,
                        int NKV, int HS) {
    std::fill(dqkv, dqkv + (size_t)B * Tn * (NH + 2 * NKV) * HS, T(0));
    attention_block_backward(dqkv, dqkv, dout, qkv, qkv, out, lse, B, Tn, Tn, NH, NKV, HS, SeqPositions(),
                             SeqPositions());
}

// inv_freq[i] = 1/theta^(2i/HS): in float the backends' shared fp32 rounding (llmc/backend/rope.h), in
// double exact (the tests' reference precision).
template <class T>
inline T rope_inv_freq_t(int i, int HS, T theta) {
    return T(1) / std::pow(theta, T(2 * i) / T(HS));
}
template <>
inline float rope_inv_freq_t<float>(int i, int HS, float theta) {
    return rope_inv_freq(i, HS, theta);
}

// Rotary embeddings on the NH + NKV query and key heads of qkv [B,T,NH+2*NKV,HS], in place, row
// t of each sequence at position pos.at(t). inverse: rotate by -angle (the backward of the forward rotation).
template <class T>
void rope(T* qkv, int B, int Tn, int NH, int NKV, int HS, T theta, bool inverse, SeqPositions pos = SeqPositions()) {
    const int half = HS / 2, W = (NH + 2 * NKV) * HS, heads = NH + NKV;
    std::vector<T> cs((size_t)Tn * half), sn((size_t)Tn * half);
    for (int i = 0; i < half; ++i) {
        const T inv_freq = rope_inv_freq_t<T>(i, HS, theta);
        for (int t = 0; t < Tn; ++t) {
            const T a = T(pos.at(t)) * inv_freq;
            cs[(size_t)t * half + i] = std::cos(a);
            sn[(size_t)t * half + i] = inverse ? -std::sin(a) : std::sin(a);
        }
    }
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)B * Tn * W))
    for (long bt = 0; bt < (long)B * Tn; ++bt) {
        const int t = (int)(bt % Tn);
        const T* c = cs.data() + (size_t)t * half;
        const T* s = sn.data() + (size_t)t * half;
        for (int h = 0; h < heads; ++h) {
            T* x = qkv + bt * W + h * HS;
#pragma omp simd
            for (int i = 0; i < half; ++i) {
                const T x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// RMSNorm and SwiGLU (Llama)

// rstd[n] = 1/sqrt(mean(inp[n]^2) + eps); out = inp * rstd * w
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, T eps) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (long n = 0; n < N; ++n) {
        const T* x = inp + n * C;
        T* o = out + n * C;
        const T s = T(1) / std::sqrt(dot(x, x, C) / T(C) + eps);
        rstd[n] = s;
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
    }
}

// dinp += rstd * (w*dout - inp * rstd^2 * mean(w*dout*inp)); dw += sum_n dout * inp * rstd
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * C))
    for (long n = 0; n < N; ++n) {
        const T* d = dout + n * C;
        const T* x = inp + n * C;
        T* dx = dinp + n * C;
        const T s = rstd[n];
        T acc = 0;
        for (int c = 0; c < C; ++c) acc = std::fma(d[c] * w[c], x[c], acc);
        const T k = acc / T(C) * s * s;
#pragma omp simd
        for (int c = 0; c < C; ++c) dx[c] += (d[c] * w[c] - x[c] * k) * s;
    }
    over_channel_blocks(N, C, [&](long n, int c0, int c1) {
        const T* d = dout + n * C;
        const T* x = inp + n * C;
        for (int c = c0; c < c1; ++c) dw[c] = std::fma(x[c] * rstd[n], d[c], dw[c]);
    });
}

// sigmoid without overflow: exp only of non-positive arguments
template <class T>
inline T sigmoid(T x) {
    if (x >= T(0)) return T(1) / (T(1) + exp_t(-x));
    const T e = exp_t(x);
    return e / (T(1) + e);
}

// inp [N, 2F] = [gate | up] per row; out [N, F] = silu(gate) * up
template <class T>
void swiglu_forward(T* out, const T* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * F))
    for (long n = 0; n < N; ++n) {
        const T* g = inp + n * 2 * F;
        const T* u = g + F;
        T* o = out + n * F;
        for (int f = 0; f < F; ++f) o[f] = g[f] * sigmoid(g[f]) * u[f];
    }
}

// dinp [N, 2F] = [dout * up * silu'(gate) | dout * silu(gate)] (overwrite)
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * F))
    for (long n = 0; n < N; ++n) {
        const T* g = inp + n * 2 * F;
        const T* u = g + F;
        const T* d = dout + n * F;
        T* dg = dinp + n * 2 * F;
        T* du = dg + F;
        for (int f = 0; f < F; ++f) {
            const T sg = sigmoid(g[f]);
            du[f] = d[f] * g[f] * sg;
            dg[f] = d[f] * u[f] * sg * (T(1) + g[f] * (T(1) - sg));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Classifier: cross-entropy over the real vocabulary [0, V) of padded logits [N, Vp]

template <class T>
void cross_entropy(T* logits, T* losses, const int32_t* targets, int N, int V, int Vp, T dloss) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * V))
    for (long n = 0; n < N; ++n) {
        T* l = logits + n * Vp;
        const T mx = max_val(l, V);
        const T lt = l[targets[n]];
        T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int j = 0;
        if (dloss != T(0)) {
            // store exp(l - max) in place, then normalise
            for (; j + 8 <= V; j += 8)
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) {
                    const T e = exp_t(l[j + u] - mx);
                    l[j + u] = e;
                    acc[u] += e;
                }
        } else {
            for (; j + 8 <= V; j += 8)
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) acc[u] += exp_t(l[j + u] - mx);
        }
        T se = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; j < V; ++j) {
            const T e = exp_t(l[j] - mx);
            if (dloss != T(0)) l[j] = e;
            se += e;
        }
        const T lse = mx + std::log(se);
        losses[n] = lse - lt;
        if (dloss != T(0)) {
            const T f = dloss / se;
#pragma omp simd
            for (int u = 0; u < V; ++u) l[u] *= f;
            l[targets[n]] -= dloss;
            for (int u = V; u < Vp; ++u) l[u] = T(0);
        }
    }
}

// sum_j exp(l[j] - mx) over j < n, in the summation order of cross_entropy above (8 lanes,
// then the tail): one vocabulary slice gives bitwise the fused op's statistics.
template <class T>
inline T sum_exp_shifted(const T* l, int n, T mx) {
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) acc[u] += exp_t(l[j + u] - mx);
    T se = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; ++j) se += exp_t(l[j] - mx);
    return se;
}

// Vocabulary-parallel cross-entropy (llmc/backend/ops.h): logits [N, Vl] hold the global columns
// [vocab_begin, vocab_begin + Vl); the real ones are the first
// clamp(V - vocab_begin, 0, Vl). Targets are global ids in [0, V).
inline int vocab_slice_real_cols(int Vl, int vocab_begin, int V) {
    return (int)std::min<long>(Vl, std::max<long>(0, (long)V - vocab_begin));
}

// stats[3n..3n+2] = (max, sum of exp(l - max), target logit or 0) over the slice's real columns
template <class T>
void cross_entropy_partial(T* stats, const T* logits, const int32_t* targets, int N, int Vl, int vocab_begin,
                           int V) {
    const int nreal = vocab_slice_real_cols(Vl, vocab_begin, V);
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * nreal))
    for (long n = 0; n < N; ++n) {
        T* st = stats + 3 * n;
        const long tl = (long)targets[n] - vocab_begin;  // the target's local column
        if (nreal == 0) {
            st[0] = -std::numeric_limits<T>::infinity();
            st[1] = T(0);
            st[2] = T(0);
            continue;
        }
        const T* l = logits + n * Vl;
        const T mx = max_val(l, nreal);
        st[0] = mx;
        st[1] = sum_exp_shifted(l, nreal, mx);
        st[2] = (tl >= 0 && tl < nreal) ? l[tl] : T(0);
    }
}

// stats hold the combined (M, S, target logit) of each row over the whole vocabulary:
// losses[n] = (M + log S) - target logit; with dloss != 0 the slice's logits become
// dloss * (exp(l - M) / S - onehot) in the real columns and 0 in the padding.
template <class T>
void cross_entropy_finish(T* logits, T* losses, const T* stats, const int32_t* targets, int N, int Vl,
                          int vocab_begin, int V, T dloss) {
    const int nreal = vocab_slice_real_cols(Vl, vocab_begin, V);
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * (dloss != T(0) ? Vl : 1)))
    for (long n = 0; n < N; ++n) {
        const T* st = stats + 3 * n;
        const T mx = st[0], se = st[1], lt = st[2];
        const T lse = mx + std::log(se);
        losses[n] = lse - lt;
        if (dloss == T(0)) continue;
        T* l = logits + n * Vl;
        const T f = dloss / se;
        for (int u = 0; u < nreal; ++u) l[u] = exp_t(l[u] - mx);
#pragma omp simd
        for (int u = 0; u < nreal; ++u) l[u] *= f;
        const long tl = (long)targets[n] - vocab_begin;
        if (tl >= 0 && tl < nreal) l[tl] -= dloss;
        for (int u = nreal; u < Vl; ++u) l[u] = T(0);
    }
}

// ---------------------------------------------------------------------------------------
// Optimizer

constexpr long kSumSquaresBlock = 8192;

// Sum of squares in double: fixed blocks -> per-block partials (fixed lane order) -> sequential sum.
template <class T>
double sum_squares(const T* g, size_t n) {
    const long nblk = (long)((n + kSumSquaresBlock - 1) / kSumSquaresBlock);
    std::vector<double> part(nblk);
#pragma omp parallel for schedule(static) if (parallel_worth(n))
    for (long blk = 0; blk < nblk; ++blk) {
        const size_t i0 = (size_t)blk * kSumSquaresBlock;
        const size_t i1 = std::min(n, i0 + (size_t)kSumSquaresBlock);
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t i = i0;
        for (; i + 8 <= i1; i += 8)
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                const double x = (double)g[i + j];
                acc[j] = std::fma(x, x, acc[j]);
            }
        double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < i1; ++i) s = std::fma((double)g[i], (double)g[i], s);
        part[blk] = s;
    }
    double total = 0;
    for (long blk = 0; blk < nblk; ++blk) total += part[blk];
    return total;
}

// AdamW (see ops.h; step and inv_sqrt_bc2 from adamw_scales). master may be null; when given, the
// update is applied to master and params receives a copy. (Two loops, so that neither carries the
// master test: the loop is bound by its square root and division.)
template <class T>
void adamw(T* params, T* master, const T* grads, T* m, T* v, size_t n, T lr, T step, T inv_sqrt_bc2, T beta1,
           T beta2, T eps, T wd, T grad_scale) {
    const T decay = lr * wd;
    auto update = [&](size_t i, T p) {
        const T g = grads[i] * grad_scale;
        const T mi = beta1 * m[i] + ((T)1 - beta1) * g;
        const T vi = beta2 * v[i] + ((T)1 - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        return p - decay * p - step * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    };
    if (master) {
#pragma omp parallel for simd schedule(static) if (parallel_worth(n))
        for (size_t i = 0; i < n; ++i) params[i] = master[i] = update(i, master[i]);
    } else {
#pragma omp parallel for simd schedule(static) if (parallel_worth(n))
        for (size_t i = 0; i < n; ++i) params[i] = update(i, params[i]);
    }
}

}  // namespace cpu
