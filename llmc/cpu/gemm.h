// Cache-blocked, register-tiled GEMM for the CPU backend, templated over the scalar type
// so that the tests can run the very same code in double precision.
//
//   C[M, N] += A[M, K] * B[K, N]
//
// with A(i, k) = a[i * a_rs + k * a_ks] and B(k, j) = b[k * b_ks + j * b_js] (arbitrary
// strides, so every matmul of the model maps onto it without explicit transposes).
//
// Determinism: each element of C is owned by exactly one work item (a fixed tile of the
// output) and accumulated in increasing k, starting from its value in C, one fused
// multiply-add per term. The sequence of floating-point operations per element is
// therefore independent of the blocking and of the number of OpenMP threads.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace cpu {

namespace gemm_detail {

// Register tile: MR rows x NR columns of C live in registers during the k loop.
// NR is one (AVX-512) or two (AVX2) vector registers of float per row.
constexpr int MR = 6;
#if defined(__AVX512F__)
constexpr int NR = 32;
#else
constexpr int NR = 16;
#endif
constexpr int KC = 256;  // k block: a packed B block (KC x NB) stays in L2
constexpr int MB = 96;   // rows of C per work item (multiple of MR)
constexpr int NB = 128;  // columns of C per work item (multiple of NR)
static_assert(MB % MR == 0 && NB % NR == 0, "blocking must be a multiple of the register tile");

// Full MR x NR tile: c (leading dimension ldc) += A-rows x packed panel bp (kc x NR).
template <class T>
inline void tile_full(int kc, const T* __restrict a, long a_rs, long a_ks, const T* __restrict bp, T* __restrict c,
                      long ldc) {
    T acc[MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) acc[r][j] = c[r * ldc + j];
    for (int k = 0; k < kc; ++k) {
        const T* b = bp + (long)k * NR;
        const T* ak = a + (long)k * a_ks;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const T av = ak[r * a_rs];
#pragma GCC unroll 32
            for (int j = 0; j < NR; ++j) acc[r][j] = std::fma(av, b[j], acc[r][j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// Edge tile (mr <= MR rows, nr <= NR columns valid); same per-element operation order.
template <class T>
inline void tile_edge(int kc, int mr, int nr, const T* a, long a_rs, long a_ks, const T* bp, T* c, long ldc) {
    T acc[MR][NR];
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < NR; ++j) acc[r][j] = (r < mr && j < nr) ? c[r * ldc + j] : T(0);
    for (int k = 0; k < kc; ++k) {
        const T* b = bp + (long)k * NR;
        const T* ak = a + (long)k * a_ks;
        for (int r = 0; r < mr; ++r) {
            const T av = ak[r * a_rs];
            for (int j = 0; j < NR; ++j) acc[r][j] = std::fma(av, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < nr; ++j) c[r * ldc + j] = acc[r][j];
}

// Pack B(k0 .. k0+kc, j0 .. j0+nb) into panels of NR columns: bp[p][k][NR], zero padded.
template <class T>
inline void pack_b(T* __restrict bp, const T* __restrict b, long b_ks, long b_js, int k0, int kc, int j0, int nb) {
    const int np = (nb + NR - 1) / NR;
    for (int p = 0; p < np; ++p) {
        T* dst = bp + (long)p * kc * NR;
        const int jb = j0 + p * NR;
        const int nr = std::min(NR, j0 + nb - jb);
        if (b_js == 1) {
            for (int k = 0; k < kc; ++k) {
                const T* src = b + (long)(k0 + k) * b_ks + jb;
                for (int j = 0; j < nr; ++j) dst[k * NR + j] = src[j];
                for (int j = nr; j < NR; ++j) dst[k * NR + j] = T(0);
            }
        } else {
            for (int j = 0; j < nr; ++j) {
                const T* src = b + (long)(jb + j) * b_js + (long)k0 * b_ks;
                for (int k = 0; k < kc; ++k) dst[k * NR + j] = src[(long)k * b_ks];
            }
            for (int j = nr; j < NR; ++j)
                for (int k = 0; k < kc; ++k) dst[k * NR + j] = T(0);
        }
    }
}

}  // namespace gemm_detail

// C[M, N] (leading dimension ldc) += A * B; see the file comment for the strides.
template <class T>
void gemm_acc(T* c, long ldc, const T* a, long a_rs, long a_ks, const T* b, long b_ks, long b_js, int M, int N,
              int K) {
    using namespace gemm_detail;
    if (M <= 0 || N <= 0 || K <= 0) return;
    const bool parallel = (size_t)M * N * K >= (size_t)(1 << 18);
    const int threads = parallel ? omp_get_max_threads() : 1;
    const int mblocks = (M + MB - 1) / MB;
    const int nblocks = (N + NB - 1) / NB;
    // A work item is a group of row blocks times one column block; the packed B block is
    // reused across the whole group, so groups are as tall as the parallelism allows.
    int group = mblocks;
    while (group > 1 && (long)((mblocks + group - 1) / group) * nblocks < 4L * threads) group = (group + 1) / 2;
    const int mgroups = (mblocks + group - 1) / group;
    const long items = (long)mgroups * nblocks;
#pragma omp parallel if (parallel)
    {
        std::vector<T> bp((size_t)KC * NB);
#pragma omp for schedule(static)
        for (long it = 0; it < items; ++it) {
            const int g0 = (int)(it / nblocks) * group * MB;
            const int g1 = std::min(M, g0 + group * MB);
            const int j0 = (int)(it % nblocks) * NB;
            const int nb = std::min(NB, N - j0);
            for (int k0 = 0; k0 < K; k0 += KC) {
                const int kc = std::min(KC, K - k0);
                pack_b(bp.data(), b, b_ks, b_js, k0, kc, j0, nb);
                for (int i0 = g0; i0 < g1; i0 += MB) {
                    const int mb = std::min(MB, g1 - i0);
                    for (int jp = 0; jp < nb; jp += NR) {
                        const T* panel = bp.data() + (long)(jp / NR) * kc * NR;
                        const int nr = std::min(NR, nb - jp);
                        for (int ip = 0; ip < mb; ip += MR) {
                            const int mr = std::min(MR, mb - ip);
                            const T* ap = a + (long)(i0 + ip) * a_rs + (long)k0 * a_ks;
                            T* cp = c + (long)(i0 + ip) * ldc + (j0 + jp);
                            if (mr == MR && nr == NR)
                                tile_full(kc, ap, a_rs, a_ks, panel, cp, ldc);
                            else
                                tile_edge(kc, mr, nr, ap, a_rs, a_ks, panel, cp, ldc);
                        }
                    }
                }
            }
        }
    }
}

}  // namespace cpu
