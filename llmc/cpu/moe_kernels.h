// The math of the mixture-of-experts ops (llmc/backend/ops.h, "mixture of experts"), templated over the
// scalar type like llmc/cpu/kernels.h: CpuOps instantiates them with float, the tests with
// double. Routing decisions (which row a (token, slot) pair takes) come from llmc/model/moe.h.
//
// Determinism: each output row is written by one thread; a token's slots are summed in slot
// order; no reductions across threads.
#pragma once
#include <cstddef>
#include <cstdint>

#include "llmc/cpu/kernels.h"

namespace cpu {

// probs [N, E] = softmax(logits); expert/gate [N, K]: the K largest probabilities in descending
// order (ties: the lower index), gate = p / (sum of the K chosen p).
template <class T>
void moe_router_forward(T* probs, int32_t* expert, T* gate, const T* logits, int N, int E, int K) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * E * K))
    for (long n = 0; n < N; ++n) {
        const T* l = logits + n * E;
        T* p = probs + n * E;
        const T mx = max_val(l, E);
        T s = 0;
        for (int e = 0; e < E; ++e) s += (p[e] = exp_t(l[e] - mx));
        const T inv = T(1) / s;
        for (int e = 0; e < E; ++e) p[e] *= inv;
        int32_t* ex = expert + n * K;
        T* g = gate + n * K;
        T chosen = 0;
        for (int j = 0; j < K; ++j) {
            int best = -1;
            for (int e = 0; e < E; ++e) {
                bool taken = false;
                for (int m = 0; m < j; ++m) taken |= ex[m] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ex[j] = best;
            chosen += p[best];
        }
        for (int j = 0; j < K; ++j) g[j] = p[ex[j]] / chosen;
    }
}

// dlogits [N, E] (overwrite) from dgate [N, K] and daux [E] (nullable: d loss / d p[n, e], the
// same for every token), through the renormalisation and the softmax.
template <class T>
void moe_router_backward(T* dlogits, const T* dgate, const T* daux, const T* probs, const int32_t* expert,
                         const T* gate, int N, int E, int K) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * E * K))
    for (long n = 0; n < N; ++n) {
        const T* p = probs + n * E;
        const int32_t* ex = expert + n * K;
        const T* g = gate + n * K;
        const T* dg = dgate + n * K;
        T* d = dlogits + n * E;  // first d loss / d p, then through the softmax
        for (int e = 0; e < E; ++e) d[e] = daux ? daux[e] : T(0);
        // g_j = p_j / S, S = sum_m p_m: d p_j += (dg_j - sum_m dg_m g_m) / S
        T S = 0, dot_gg = 0;
        for (int j = 0; j < K; ++j) {
            S += p[ex[j]];
            dot_gg += dg[j] * g[j];
        }
        for (int j = 0; j < K; ++j) d[ex[j]] += (dg[j] - dot_gg) / S;
        T dot_pd = 0;
        for (int e = 0; e < E; ++e) dot_pd += p[e] * d[e];
        for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - dot_pd);
    }
}

// out[row_of[n*K + j], :] = inp[n, :] for every kept pair (row_of >= 0).
template <class T>
void moe_permute(T* out, const T* inp, const int32_t* row_of, int N, int K, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * K * C))
    for (long i = 0; i < (long)N * K; ++i) {
        const int32_t r = row_of[i];
        if (r < 0) continue;
        const T* src = inp + (i / K) * C;
        T* dst = out + (size_t)r * C;
        for (int c = 0; c < C; ++c) dst[c] = src[c];
    }
}

// dinp[n, :] += sum over kept slots j (slot order) of dout[row_of[n*K + j], :].
template <class T>
void moe_permute_backward(T* dinp, const T* dout, const int32_t* row_of, int N, int K, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * K * C))
    for (long n = 0; n < N; ++n) {
        T* d = dinp + n * C;
        for (int j = 0; j < K; ++j) {
            const int32_t r = row_of[n * K + j];
            if (r < 0) continue;
            const T* s = dout + (size_t)r * C;
            for (int c = 0; c < C; ++c) d[c] += s[c];
        }
    }
}

// out[n, :] = sum over kept slots j (slot order) of gate[n, j] * y[row_of[n*K + j], :] (overwrite;
// a token with no kept slot gets zeros).
template <class T>
void moe_combine(T* out, const T* y, const T* gate, const int32_t* row_of, int N, int K, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * K * C))
    for (long n = 0; n < N; ++n) {
        T* o = out + n * C;
        for (int c = 0; c < C; ++c) o[c] = T(0);
        for (int j = 0; j < K; ++j) {
            const int32_t r = row_of[n * K + j];
            if (r < 0) continue;
            const T g = gate[n * K + j];
            const T* s = y + (size_t)r * C;
            for (int c = 0; c < C; ++c) o[c] += g * s[c];
        }
    }
}

// dy[row_of[n*K + j], :] = gate[n, j] * dout[n, :] (overwrite; every row of dy belongs to one kept
// pair); dgate[n, j] = dot(dout[n, :], y[row_of[n*K + j], :]), 0 for a dropped pair (overwrite).
template <class T>
void moe_combine_backward(T* dy, T* dgate, const T* dout, const T* y, const T* gate, const int32_t* row_of, int N,
                          int K, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth((size_t)N * K * C))
    for (long n = 0; n < N; ++n) {
        const T* d = dout + n * C;
        for (int j = 0; j < K; ++j) {
            const int32_t r = row_of[n * K + j];
            if (r < 0) {
                dgate[n * K + j] = T(0);
                continue;
            }
            const T g = gate[n * K + j];
            T* o = dy + (size_t)r * C;
            for (int c = 0; c < C; ++c) o[c] = g * d[c];
            dgate[n * K + j] = dot(d, y + (size_t)r * C, C);
        }
    }
}

}  // namespace cpu
