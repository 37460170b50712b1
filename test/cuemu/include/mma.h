// cuemu stand-in for <mma.h>: nvcuda::wmma with 16x16x16 fragments. Every fragment holds its
// whole tile (the emulator need not follow the opaque per-lane layout); a lane owns the
// accumulator elements i with i % 32 == its lane (mma_sync computes and store_matrix_sync writes
// only those), so code that reads an accumulator's x[] directly is not emulated. Each operation is
// a warp collective over all 32 lanes (a lane missing or diverged aborts), and loads and stores check
// the documented rules: a 256-bit aligned pointer and ldm a multiple of 16 bytes. mma_sync
// accumulates in fp32, in k order: the tensor cores' own rounding is not modelled.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "test/cuemu/include/cuda_bf16.h"
#include "test/cuemu/include/cuda_fp16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    static constexpr int num_elements = rows * cols;
    T x[rows * cols];  // row-major tile
};

namespace detail {
inline void enter(const char* what, const void* p, unsigned ldm, size_t elem) {
    ::cuemu::warp_collective(::cuemu::Coll::Wmma, 0xffffffffu, 0, 0, 32, what, 0);
    if (p && ((uintptr_t)p % 32 != 0 || (ldm * elem) % 16 != 0)) {
        std::fprintf(stderr, "cuemu: wmma::%s: pointer %p must be 256-bit aligned and ldm=%u a multiple of 16 bytes\n",
                     what, p, ldm);
        std::abort();
    }
}
inline int lane() { return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32; }
inline float f(float v) { return v; }
inline float f(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float f(__half v) { return __half2float(v); }
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L>
void fill_fragment(fragment<Use, M, N, K, T, L>& a, T v) {
    detail::enter("fill_fragment", nullptr, 0, 1);
    for (auto& e : a.x) e = v;
}
// matrix_a / matrix_b: the layout is the fragment's type
template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& a, const T* p, unsigned ldm) {
    detail::enter("load_matrix_sync", p, ldm, sizeof(T));
    using F = fragment<Use, M, N, K, T, L>;
    const bool col = std::is_same<L, col_major>::value;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++) a.x[r * F::cols + c] = col ? p[c * ldm + r] : p[r * ldm + c];
}
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& a, const T* p, unsigned ldm, layout_t l) {
    detail::enter("load_matrix_sync", p, ldm, sizeof(T));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) a.x[r * N + c] = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}
// each lane writes its share of the tile (element i goes to lane i % 32)
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& a, unsigned ldm, layout_t l) {
    detail::enter("store_matrix_sync", p, ldm, sizeof(T));
    for (int i = detail::lane(); i < M * N; i += 32) {
        const int r = i / N, c = i % N;
        (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = a.x[i];
    }
}
template <int M, int N, int K, class TA, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    detail::enter("mma_sync", nullptr, 0, 1);
    // each lane computes only the accumulator elements it owns (i % 32 == lane), which are the
    // ones it stores: the warp does the product once, not 32 times
    const int lane = detail::lane();
    for (int e = lane; e < M * N; e += 32) {
        const int i = e / N, j = e % N;
        float s = c.x[e];
        for (int k = 0; k < K; k++) s = fmaf(detail::f(a.x[i * K + k]), detail::f(b.x[k * N + j]), s);
        d.x[e] = s;
    }
}
}  // namespace wmma
}  // namespace nvcuda
