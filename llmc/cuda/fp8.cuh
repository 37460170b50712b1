// FP8 linear layers on CUDA (Ops::matmul_forward_fp8 / matmul_backward_fp8, llmc/backend/ops.h; CudaOps
// reaches them through llmc/cuda/fp8_ops.h, and llmc/cuda/fp8.cu compiles this file):
//  - scale_kernel: the cast's scale s and 1/s in device memory (from the host's delayed scale,
//    or from the tensor's amax for the current recipe: no host round trip);
//  - amax_kernel: the current recipe's amax pass (one atomic per block: block_max_atomic);
//  - cast_vec_kernel (16-byte loads, 8-byte stores; where the shape and the pointers allow) or
//    cast_kernel (element by element): fp32/bf16 -> e4m3/e5m2 (cvt with satfinite: round to
//    nearest even, saturate), fused with the amax of the unscaled tensor, writing the plain and/or
//    the transposed copy;
//  - Fp8Gemm: cuBLASLt fp8 GEMM, fp32 accumulation, A/B scale pointers = 1/s, fast
//    accumulation on the forward only; every call first checked against the documented rules
//    (fp8_rules.h), the algorithm chosen by LtAlgoCache (matmul.cuh).
// The fp8 tensor cores (compute capability >= 8.9) take only the "TN" form: in cuBLASLt's
// column-major terms A is transposed and B is not, both with the reduction dimension k
// contiguous. Every GEMM below is arranged so (the backward GEMMs read transposed casts).
// A GEMM that cuBLASLt will not write into its destination directly (a refused in-place
// accumulation, an unaligned destination, a refused bias epilogue) runs instead into an
// aligned fp32 scratch with beta = 0, and add_gemm_result_kernel adds it (and the bias): the
// same fp32 sum rounded once into the destination. The choice is made once per problem.
//
// Amaxes are max-accumulated with atomicMax on the float bits of |x| (fp8_abs_bits order:
// non-negative floats order as unsigned integers, NaN > inf > finite): exact in any order, one
// atomic per block (one per warp was the likely cost behind fp8 at 0.81x of bf16 at the 1.5B
// shape on an H200, 2026-11-27; dev/cuda/fp8_cast times the two).
#pragma once
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "llmc/core/common.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/fp8_rules.h"
#include "llmc/cuda/matmul.cuh"
#include "llmc/precision/fp8.h"
#include "llmc/core/tensor.h"

namespace fp8 {

__device__ __forceinline__ __nv_fp8_storage_t cvt(float x, Fp8Format f) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// *dst = max(*dst, the largest m of the block's threads): a warp max, the warps' maxima through
// shared memory, one atomic per block (same-address atomics serialize in L2: one per warp of a
// 52M-element cast was 1.6M of them). Every thread of the block calls it (it has a barrier).
__device__ __forceinline__ void block_max_atomic(unsigned* dst, unsigned m) {
    __shared__ unsigned warp_m[32];
    const int tid = threadIdx.x + threadIdx.y * blockDim.x;
    const int warps = (blockDim.x * blockDim.y + 31) / 32;
    m = warp_max_u32(m);
    if ((tid & 31) == 0) warp_m[tid >> 5] = m;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < warps; w++) m = max(m, warp_m[w]);
        atomicMax(dst, m);
    }
}

// The value a cast takes from element x: x, or gelu_tanh(x) in fp32 (Fp8Cast::gelu)
__device__ __forceinline__ float operand(float x, bool gelu) { return gelu ? gelu_tanh(x) : x; }
// The value an output-gradient cast takes from element x with `pre` (the GELU's backward fused in
// the cast): x * gelu'(p) rounded to T, as launch_gelu_bias_grad stores it; x without.
template <class T> __device__ __forceinline__ float grad_operand(T x, const T* pre, T p) {
    return pre ? to_f32(from_f32<T>(to_f32(x) * gelu_tanh_grad(to_f32(p)))) : to_f32(x);
}
// *amax_bits = max(*amax_bits, max over x of fp8_abs_bits) (of operand(x, gelu), or with `pre` of
// grad_operand). Grid-stride in packs of K elements (K divides n: pack_width); one atomic per block.
template <class T, int K>
__global__ void amax_kernel(unsigned* amax_bits, const T* x, const T* pre, long long n, bool gelu) {
    unsigned m = 0;
    const long long packs = n / K, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += stride) {
        const Pack<T, K> p = load_pack<K>(x + i * K);
        Pack<T, K> g = p;
        if (pre) g = load_pack<K>(pre + i * K);
        for (int e = 0; e < K; e++) m = max(m, fp8_abs_bits(operand(grad_operand(p.v[e], pre, g.v[e]), gelu)));
    }
    block_max_atomic(amax_bits, m);
}

// Where a cast's scales sit in its slot of CudaFp8's small device buffer (floats): s at 0, 1/s
// at kInvScale, each slot kScaleSlot floats apart. 1/s is a cuBLASLt scale pointer and so
// 16-byte aligned (fp8_rules.h rule 11; at 4 bytes an H200 refused every fp8 GEMM).
constexpr int kInvScale = 4, kScaleSlot = 64, kScaleSlots = 3;
static_assert(kInvScale * sizeof(float) % 16 == 0 && kScaleSlot * sizeof(float) % 256 == 0, "scale alignment");

// One thread: sc[0] = s, sc[kInvScale] = 1/s, with s = the given scale (*scale_at, or the host's
// value when scale_at is nullptr) or, with amax_bits (current recipe), fp8_scale_from_amax(
// *amax_bits, ..., the given scale) (the same function as the CPU's, so the same bits). `record`
// (the op's amax output, may be nullptr) max-accumulates *amax_bits. inv_copy (may be nullptr):
// 1/s there too.
__global__ void scale_kernel(float* sc, const unsigned* amax_bits, const float* scale_at, float host_scale,
                             Fp8Format f, int margin, unsigned* record, float* inv_copy) {
    const float given = scale_at ? *scale_at : host_scale;
    float s = given;
    if (amax_bits) {
        s = fp8_scale_from_amax(__uint_as_float(*amax_bits), f, margin, given);
        if (record) atomicMax(record, *amax_bits);
    }
    sc[0] = s;
    sc[kInvScale] = 1.0f / s;
    if (inv_copy) *inv_copy = 1.0f / s;  // (an Fp8Stash's: the backward's scale pointer)
}

// The scaling state's step (Ops::fp8_widen_amaxes, fp8_update_scales): one block, a tensor a
// thread (grid-stride), fp8_device_step as on the CPU; the overflow count summed in shared memory
// (integers: exact in any order).
__global__ void widen_amaxes_kernel(Fp8Device d) {
    for (int i = threadIdx.x; i < d.n; i += blockDim.x) d.wide[i] = (double)fp8_abs_bits(d.amax[i]);
}
__global__ void update_scales_kernel(Fp8Device d, bool from_wide, float* step_overflows) {
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < d.n; i += blockDim.x)
        if (!fp8_device_step(d, i, from_wide)) atomicAdd(&bad, 1);
    __syncthreads();
    if (threadIdx.x == 0) *step_overflows = (float)bad;
}

// x [rows, cols] row-major -> codes of operand(x, gelu) * sc[0]: out [rows, cols] and/or outT
// [cols, rows] (either may be nullptr); amax_bits (may be nullptr) max-accumulates |operand(x)|. Block (32, 8) walks
// 32 x 32 tiles grid-stride (a bounded grid: one amax atomic per block, kCastBlocks at most); the
// transposed copy goes through shared memory so that both the reads and the writes are
// row-contiguous. Under the CUDA emulator the grid is 3 blocks, so that the test shapes walk
// several tiles a block (the loop and its second barrier are what a one-tile grid never runs).
#ifdef LLMC_CUEMU
constexpr int kCastBlocks = 3;
#else
constexpr int kCastBlocks = 1024;
#endif
template <class T>
__global__ void cast_kernel(__nv_fp8_storage_t* out, __nv_fp8_storage_t* outT, unsigned* amax_bits, const T* x,
                            const float* sc, int rows, int cols, Fp8Format f, bool gelu) {
    __shared__ __nv_fp8_storage_t tile[32][33];
    const int tiles_c = (cols + 31) / 32;
    const long long tiles = (long long)tiles_c * ((rows + 31) / 32);
    const float s = sc[0];
    unsigned m = 0;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
        const int c0 = (int)(t % tiles_c) * 32, r0 = (int)(t / tiles_c) * 32;
        for (int i = threadIdx.y; i < 32; i += 8) {
            const int r = r0 + i, c = c0 + threadIdx.x;
            if (r < rows && c < cols) {
                const float v = operand(to_f32(x[(long long)r * cols + c]), gelu);
                m = max(m, fp8_abs_bits(v));
                const __nv_fp8_storage_t q = cvt(v * s, f);
                if (out) out[(long long)r * cols + c] = q;
                if (outT) tile[i][threadIdx.x] = q;
            }
        }
        if (outT) {  // uniform over the block: the barriers are safe
            __syncthreads();
            for (int i = threadIdx.y; i < 32; i += 8) {
                const int c = c0 + i, r = r0 + threadIdx.x;
                if (c < cols && r < rows) outT[(long long)c * rows + r] = tile[threadIdx.x][i];
            }
            __syncthreads();  // the next tile overwrites this one
        }
    }
    if (amax_bits) block_max_atomic(amax_bits, m);
}

// cast_kernel's work in 16-byte loads and 8-byte stores (the same codes and amax: each element is
// converted as there), for rows and cols multiples of 8, x (and pre) 16-byte aligned and out/outT
// 8-byte aligned (cast_vec_fits). kVecThreads threads walk 64 x 64 tiles grid-stride; a thread
// converts chunks of 8 consecutive elements of a row (a bf16 pack, two fp32 packs) into 8 codes
// stored at once, a warp 4 rows of 8 chunks (x's 128-byte lines whole). The transposed copy: the
// tile's codes in shared memory (rows kVecLd bytes apart), then a thread gathers 8 codes down a
// column (8 rows: one 8-byte store in outT's row), a warp 4 of outT's rows of 64 bytes each.
// The output-gradient cast of a linear with a bias or a GELU before it also takes:
//  - `pre` (may be nullptr): the GELU's backward, each element x * gelu'(pre) rounded to T
//    (grad_operand: launch_gelu_bias_grad's values, not stored: the casts are their only reader);
//  - `colsum` (may be nullptr): the bias gradient's first pass, colsum[tile row][c] = the sum of
//    the tile's 64 rows of column c (of the values cast, before the scale), in a fixed order: a
//    thread's rows in order, the 4 lanes of a warp that share its chunk by two shuffles, the 8
//    warps in order; column_sum_add_kernel adds the tile rows. One read of the gradient instead
//    of three (GELU backward and bias gradient, then the cast).
constexpr int kVecTile = 64, kVecThreads = 256, kVecLd = kVecTile + 4;
template <class T>
__global__ void __launch_bounds__(kVecThreads)
    cast_vec_kernel(__nv_fp8_storage_t* out, __nv_fp8_storage_t* outT, unsigned* amax_bits, const T* x, const T* pre,
                    float* colsum, const float* sc, int rows, int cols, Fp8Format f, bool gelu) {
    constexpr int kChunks = kVecTile / 8, kItems = kVecTile * kChunks;  // chunks a tile row, chunks a tile
    constexpr int kWarpsV = kVecThreads / 32;
    static_assert(32 % kChunks == 0 && kItems % kVecThreads == 0, "a thread's chunks share their columns");
    using Codes = Pack<__nv_fp8_storage_t, 8>;
    __shared__ __nv_fp8_storage_t tile[kVecTile][kVecLd];
    __shared__ float wsum[kWarpsV][kVecTile];  // colsum: each warp's column sums of the tile
    const int tiles_c = (cols + kVecTile - 1) / kVecTile;
    const long long tiles = (long long)tiles_c * ((rows + kVecTile - 1) / kVecTile);
    const float s = sc[0];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned m = 0;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform over the block
        const int c0 = (int)(t % tiles_c) * kVecTile, r0 = (int)(t / tiles_c) * kVecTile;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // colsum: this thread's chunk, its rows
        for (int i = threadIdx.x; i < kItems; i += kVecThreads) {
            const int r = i / kChunks, c = (i % kChunks) * 8;  // tile row, first tile column
            if (r0 + r >= rows || c0 + c >= cols) continue;
            const long long at = (long long)(r0 + r) * cols + c0 + c;
            float v[8];
            if constexpr (sizeof(T) == 2) {
                const Pack<T, 8> p = load_pack<8>(x + at);
                Pack<T, 8> g = p;
                if (pre) g = load_pack<8>(pre + at);
                for (int e = 0; e < 8; e++) v[e] = grad_operand(p.v[e], pre, g.v[e]);
            } else {
                for (int h = 0; h < 8; h += 4) {
                    const Pack<T, 4> p = load_pack<4>(x + at + h);
                    Pack<T, 4> g = p;
                    if (pre) g = load_pack<4>(pre + at + h);
                    for (int e = 0; e < 4; e++) v[h + e] = grad_operand(p.v[e], pre, g.v[e]);
                }
            }
            Codes q;
            for (int e = 0; e < 8; e++) {
                v[e] = operand(v[e], gelu);
                acc[e] += v[e];
                m = max(m, fp8_abs_bits(v[e]));
                q.v[e] = cvt(v[e] * s, f);
            }
            if (outT)  // (only the transposed copy reads the tile)
                for (int e = 0; e < 8; e++) tile[r][c + e] = q.v[e];
            if (out) store_pack<8>(out + at, q);
        }
        if (colsum)  // lanes l, l ^ 8, l ^ 16, l ^ 24 hold chunk l % 8: their sum into lane l < 8
            for (int e = 0; e < 8; e++) {
                acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 8);
                acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
                if (lane < kChunks) wsum[warp][lane * 8 + e] = acc[e];
            }
        if (outT || colsum) {  // uniform over the block: the barriers are safe
            __syncthreads();
            if (outT)
                for (int i = threadIdx.x; i < kItems; i += kVecThreads) {
                    const int c = i / kChunks, r = (i % kChunks) * 8;  // tile column (outT's row), first tile row
                    if (c0 + c >= cols || r0 + r >= rows) continue;
                    Codes q;
                    for (int e = 0; e < 8; e++) q.v[e] = tile[r + e][c];
                    store_pack<8>(outT + (long long)(c0 + c) * rows + r0 + r, q);
                }
            if (colsum && threadIdx.x < kVecTile && c0 + (int)threadIdx.x < cols) {
                float sum = 0.0f;
                for (int w = 0; w < kWarpsV; w++) sum += wsum[w][threadIdx.x];
                colsum[(t / tiles_c) * cols + c0 + threadIdx.x] = sum;
            }
            __syncthreads();  // the next tile's codes and sums overwrite these
        }
    }
    if (amax_bits) block_max_atomic(amax_bits, m);
}

// Whether cast_vec_kernel takes x [rows, cols] (with pre, may be nullptr) into out / outT (either
// may be nullptr).
inline bool cast_vec_fits(const void* x, const void* out, const void* outT, int rows, int cols,
                          const void* pre = nullptr) {
    return rows % 8 == 0 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(pre) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0 &&
           reinterpret_cast<uintptr_t>(outT) % 8 == 0;
}
// cast_vec_kernel's colsum: floats of a cast of x [rows, cols], and its tile rows
inline int colsum_rows(int rows) { return ceil_div(rows, kVecTile); }
inline size_t colsum_floats(int rows, int cols) { return (size_t)colsum_rows(rows) * cols; }

// The cast of x [rows, cols] (cast_kernel's contract) by cast_vec_kernel where it fits, else
// cast_kernel: at most kCastBlocks blocks either way. `pre` and `colsum` (cast_vec_kernel's) only
// where it fits (the caller asks cast_vec_fits first).
template <class T>
void launch_cast(__nv_fp8_storage_t* out, __nv_fp8_storage_t* outT, unsigned* amax_bits, const T* x, const float* sc,
                 int rows, int cols, Fp8Format f, cudaStream_t st, bool gelu = false, const T* pre = nullptr,
                 float* colsum = nullptr) {
    if (cast_vec_fits(x, out, outT, rows, cols, pre)) {
        const long long tiles = (long long)ceil_div(cols, kVecTile) * ceil_div(rows, kVecTile);
        LLMC_LAUNCH(cast_vec_kernel<T>, (int)std::min<long long>(tiles, kCastBlocks), kVecThreads, 0, st, out, outT,
                    amax_bits, x, pre, colsum, sc, rows, cols, f, gelu);
    } else {
        LLMC_ASSERT(!pre && !colsum, "fp8 cast: the GELU backward and the column sums need the vector cast");
        const long long tiles = (long long)ceil_div(cols, 32) * ceil_div(rows, 32);
        LLMC_LAUNCH(cast_kernel<T>, (int)std::min<long long>(tiles, kCastBlocks), dim3(32, 8), 0, st, out, outT,
                    amax_bits, x, sc, rows, cols, f, gelu);
    }
}

// out[i] = (accumulate ? out[i] : 0) + src[i] (+ bias[i % OC]): the end of an fp8 GEMM that
// cuBLASLt would not write into `out` directly (see CudaFp8::gemm). Elementwise: deterministic.
template <class T>
__global__ void add_gemm_result_kernel(T* out, const float* src, const T* bias, long long n, int OC,
                                       bool accumulate) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = src[i];
    if (bias) v += to_f32(bias[i % OC]);
    out[i] = from_f32<T>(accumulate ? to_f32(out[i]) + v : v);
}

// One fp8 GEMM as CudaFp8 asks for it, always cuBLASLt's "TN" form: column-major
// D[m, n] = a_scale * b_scale * A^T B (+ D when accumulate) (+ bias[m]), A stored k x m
// (lda = k) and B stored k x n (ldb = k), both fp8 with the reduction dimension contiguous;
// D (ldd = m) bf16 or fp32, in place as C when accumulating; bias bf16 (bf16 D only).
struct Fp8GemmArgs {
    void* D;
    bool d_bf16;
    const void* bias;
    const void* A;
    Fp8Format fa;
    const float* a_scale;
    const void* B;
    Fp8Format fb;
    const float* b_scale;
    int m, n, k;
    bool accumulate;
    bool fast_accum;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM: the forward only (gradients accumulate fully)
};

// The GEMM as the documented-rules table (fp8_rules.h) sees it.
inline LtFp8Call fp8_call_of(const Fp8GemmArgs& g, int sm) {
    LtFp8Call c;
    c.sm = sm;
    c.a = g.fa == Fp8Format::E4M3 ? LtType::E4M3 : LtType::E5M2;
    c.b = g.fb == Fp8Format::E4M3 ? LtType::E4M3 : LtType::E5M2;
    c.c = c.d = g.d_bf16 ? LtType::BF16 : LtType::F32;
    c.has_bias = g.bias != nullptr;
    c.bias = LtType::BF16;
    c.trans_a = true;
    c.trans_b = false;
    c.m = g.m, c.n = g.n, c.k = g.k;
    c.lda = c.ldb = g.k;
    c.ldc = c.ldd = g.m;
    c.ptr_a = (uintptr_t)g.A, c.ptr_b = (uintptr_t)g.B, c.ptr_c = c.ptr_d = (uintptr_t)g.D;
    c.ptr_a_scale = (uintptr_t)g.a_scale, c.ptr_b_scale = (uintptr_t)g.b_scale;
    return c;
}

inline std::string fp8_gemm_text(const Fp8GemmArgs& g) {
    return strfmt("m=%d n=%d k=%d, A %s stored k x m (transposed, lda=%d), B %s stored k x n (lda=%d), "
                  "C = D %s (ldd=%d)%s%s%s",
                  g.m, g.n, g.k, g.fa == Fp8Format::E4M3 ? "E4M3" : "E5M2", g.k,
                  g.fb == Fp8Format::E4M3 ? "E4M3" : "E5M2", g.k, g.d_bf16 ? "bf16" : "fp32", g.m,
                  g.accumulate ? ", beta=1 (accumulate)" : "", g.bias ? ", bf16 bias epilogue" : "",
                  g.fast_accum ? ", fast accumulation" : "");
}

// cuBLASLt for the fp8 GEMMs: one handle, one workspace, the algorithm choice of LtAlgoCache.
class Fp8Gemm {
public:
    static constexpr size_t kWorkspaceBytes = 32u << 20;

    void destroy() {
        if (workspace_) device_free(workspace_);
        if (handle_) lt().cublasLtDestroy(handle_);
        workspace_ = nullptr;
        handle_ = nullptr;
    }

    // Runs the GEMM when the documented rules allow it and cuBLASLt accepts one of its candidate
    // algorithms; false otherwise (nothing ran; *why says which).
    bool matmul(const Fp8GemmArgs& g, int sm, cudaStream_t stream, std::string* why) {
        if (!fp8_gemm_supported(fp8_call_of(g, sm), why)) return false;
        if (!handle_) {  // created on first use: runs without fp8 pay nothing
            CUBLAS_CHECK(lt().cublasLtCreate(&handle_));
            CUDA_CHECK(device_malloc(&workspace_, kWorkspaceBytes));
        }
        const cudaDataType_t ta = lt_type(g.fa), tb = lt_type(g.fb), td = g.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        LtKey key{};
        key.type_a = ta, key.type_b = tb, key.type_d = td;
        key.m = g.m, key.n = g.n, key.k = g.k, key.lda = key.ldb = g.k, key.ldd = g.m;
        key.trans_a = 1, key.beta_nonzero = g.accumulate, key.fast_accum = g.fast_accum;
        key.epilogue = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        key.align_a = lt_align_of(g.A), key.align_b = lt_align_of(g.B), key.align_d = lt_align_of(g.D);
        if (g.bias) key.type_bias = CUDA_R_16BF, key.align_bias = lt_align_of(g.bias);

        cublasLtMatmulDesc_t op;
        CUBLAS_CHECK(lt().cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v, size_t n) {  // (as LtMatmul's)
            CUBLAS_CHECK(lt().cublasLtMatmulDescSetAttribute(op, a, v, n));
        };
        const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        set(CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT));
        set(CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN));
        set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale));
        set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale));
        const int8_t fast = g.fast_accum ? 1 : 0;
        set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
        if (g.bias) {
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = CUDA_R_16BF;
            set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
            set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
            set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
        }
        cublasLtMatrixLayout_t la, lb, ld;
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&la, ta, g.k, g.m, g.k));
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&lb, tb, g.k, g.n, g.k));
        CUBLAS_CHECK(lt().cublasLtMatrixLayoutCreate(&ld, td, g.m, g.n, g.m));
        const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
        const bool ok = algos_.run(key, handle_, op, &alpha, g.A, la, g.B, lb, &beta, g.D, ld, g.D, ld, workspace_,
                                   kWorkspaceBytes, stream);
        lt().cublasLtMatrixLayoutDestroy(la);
        lt().cublasLtMatrixLayoutDestroy(lb);
        lt().cublasLtMatrixLayoutDestroy(ld);
        lt().cublasLtMatmulDescDestroy(op);
        if (!ok && why)
            *why = strfmt("cuBLASLt accepted none of its %d candidate algorithms (%s)", algos_.tried(),
                          algos_.refusals().c_str());
        return ok;
    }

private:
    static cudaDataType_t lt_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    LtAlgoCache algos_;
};

// The fp8 ops of CudaOps: the casts into grow-only scratch, the GEMMs, and GELU/bias around
// them (the kernels of matmul.cuh). All on the backend's stream.
class CudaFp8 {
public:
    CudaFp8() = default;
    CudaFp8(const CudaFp8&) = delete;
    CudaFp8& operator=(const CudaFp8&) = delete;
    ~CudaFp8() {  // after the owner's stream is gone: cudaFree waits for the device
        for (GrowBuffer& b : buf_) b.release();
        if (small_) device_free(small_);
        gemm_.destroy();
    }

    // Compute capability >= 8.9 (the first with fp8 tensor cores). Asked once per device.
    bool supported(int device, std::string* why) {
        if (device != queried_device_) {
            cudaDeviceProp prop;
            CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
            sm_ = prop.major * 10 + prop.minor;
            supported_ = sm_ >= 89;
            why_ = supported_ ? "" : strfmt("fp8 matmuls need a GPU of compute capability 8.9 or newer (Ada, Hopper); "
                                            "%s is %d.%d", prop.name, prop.major, prop.minor);
            queried_device_ = device;
        }
        if (why) *why = why_;
        return supported_;
    }

    // stash (may be empty): the input's transposed cast and its 1/s for the backward (Fp8Stash)
    void forward(Tensor out, Tensor pre_gelu, Tensor inp, Tensor w, Tensor bias, int N, int IC, int OC, bool gelu,
                 const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash, int device, cudaStream_t stream) {
        check(device, N, IC, OC, {&out, &pre_gelu, &inp, &w, &bias}, "matmul_forward_fp8");
        LLMC_ASSERT(!gelu || pre_gelu.ptr, "matmul_forward_fp8: gelu needs pre_gelu");
        if (!N || !OC) return;
        const bool bf = out.dtype == DType::BF16;
        auto* qi = (__nv_fp8_storage_t*)buf(0, (size_t)N * IC, stream);
        auto* qw = (__nv_fp8_storage_t*)buf(1, (size_t)OC * IC, stream);
        check_stash(stash, ci);
        const CastScales si = cast(ci, inp, N, IC, qi, (__nv_fp8_storage_t*)stash.qT, 0, stream, nullptr, nullptr,
                                   stash.qT && !given(ci) ? stash.inv : nullptr);
        const CastScales sw = cast(cw, w, OC, IC, qw, nullptr, 1, stream);
        void* dst = gelu ? pre_gelu.ptr : out.ptr;
        // column-major dst^T[OC, N] = w (IC x OC, transposed) x inp^T (IC x N): TN with k = IC
        const bool epi = bf && bias.ptr && ((uintptr_t)bias.ptr % 16 == 0);
        Fp8GemmArgs g{dst, bf, epi ? bias.ptr : nullptr, qw, cw.format, sw.inv, qi, ci.format, si.inv, OC, N, IC,
                      false, true};
        gemm(g, out.dtype, epi ? nullptr : bias.ptr, "matmul_forward_fp8", stream);
        if (gelu) {
            const long long n = (long long)N * OC;
            with_type(out.dtype, [&](auto tag) {
                using T = decltype(tag);
                LLMC_LAUNCH(gelu_forward_kernel<T>, elementwise_blocks(n, sizeof(T)), 256, 0, stream, (T*)out.ptr,
                            (const T*)pre_gelu.ptr, n);
                CUDA_CHECK_LAUNCH();
            });
        }
    }

    // stash (may be empty): what the forward of inp left (inp's transposed cast and 1/s): inp is not
    // cast again
    void backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w, Tensor pre_gelu, int N,
                  int IC, int OC, const Fp8Cast& cd, const Fp8Cast& ci, const Fp8Cast& cw, const Fp8Stash& stash,
                  int device, cudaStream_t stream) {
        check(device, N, IC, OC, {&dinp, &dw, &dbias, &dout, &inp, &w, &pre_gelu}, "matmul_backward_fp8");
        if (!N || !OC) return;
        const bool bf = dout.dtype == DType::BF16;
        check_stash(stash, ci);
        auto* qiT = stash.qT ? (__nv_fp8_storage_t*)stash.qT : (__nv_fp8_storage_t*)buf(0, (size_t)N * IC, stream);
        auto* qwT = (__nv_fp8_storage_t*)buf(1, (size_t)OC * IC, stream);
        auto* qd = dinp.ptr ? (__nv_fp8_storage_t*)buf(2, (size_t)N * OC, stream) : nullptr;
        auto* qdT = (__nv_fp8_storage_t*)buf(3, (size_t)N * OC, stream);
        // dout * gelu'(pre_gelu) and the bias gradient: in dout's cast where the vector cast takes it
        // (dout is then left as it was), else first in place by launch_gelu_bias_grad
        const bool fused = cast_vec_fits(dout.ptr, qd, qdT, N, OC, pre_gelu.ptr);
        float* colsum = fused && dbias.ptr ? (float*)buf(5, colsum_floats(N, OC) * sizeof(float), stream) : nullptr;
        if (!fused)
            with_type(dout.dtype, [&](auto tag) {
                using T = decltype(tag);
                float* part =
                    dbias.ptr ? (float*)buf(5, bias_grad_partial_floats(N, OC) * sizeof(float), stream) : nullptr;
                launch_gelu_bias_grad((T*)dbias.ptr, (T*)dout.ptr, (const T*)pre_gelu.ptr, N, OC, part, stream);
            });
        const CastScales sd = cast(cd, dout, N, OC, qd, qdT, 2, stream, fused ? pre_gelu.ptr : nullptr, colsum);
        if (colsum)
            with_type(dout.dtype, [&](auto tag) {
                using T = decltype(tag);
                launch_column_sum_add(stream, (T*)dbias.ptr, (T*)nullptr, colsum, colsum_rows(N), OC, 1);
                CUDA_CHECK_LAUNCH();
            });
        const CastScales si = stash.qT ? CastScales{nullptr, given(ci) ? ci.inv_at : stash.inv}
                                       : cast(ci, inp, N, IC, nullptr, qiT, 0, stream);
        if (dinp.ptr) {
            const CastScales sw = cast(cw, w, OC, IC, nullptr, qwT, 1, stream);
            // column-major dinp^T[IC, N] = w^T stored [IC][OC] (k = OC) x dout^T (OC x N)
            gemm(Fp8GemmArgs{dinp.ptr, bf, nullptr, qwT, cw.format, sw.inv, qd, cd.format, sd.inv,
                             IC, N, OC, false, false},
                 dout.dtype, nullptr, "matmul_backward_fp8 (dinp)", stream);
        }
        // column-major dw (IC x OC) += inp^T stored [IC][N] (k = N) x dout stored [OC][N]
        gemm(Fp8GemmArgs{dw.ptr, bf, nullptr, qiT, ci.format, si.inv, qdT, cd.format, sd.inv, IC,
                         OC, N, true, false},
             dout.dtype, nullptr, "matmul_backward_fp8 (dw)", stream);
    }

private:
    template <class F>
    static void with_type(DType dt, F&& f) {
        if (dt == DType::BF16)
            f(bf16{});
        else
            f(float{});
    }

    // Shapes and dtypes the fp8 GEMM takes; UserError otherwise (the trainer checks at start-up).
    void check(int device, int N, int IC, int OC, std::initializer_list<const Tensor*> ts, const char* op) {
        std::string why;
        if (!supported(device, &why)) throw UserError(std::string("precision fp8: ") + why);
        if (N % 16 || IC % 16 || OC % 16)
            throw UserError(strfmt("precision fp8 on CUDA: %s needs dimensions that are multiples of 16 "
                                   "(rows N = micro_batch * seq_len = %d, in = %d, out = %d)",
                                   op, N, IC, OC));
        DType d = DType::F32;
        bool first = true;
        for (const Tensor* t : ts) {
            if (!t->ptr) continue;
            LLMC_ASSERT(t->dtype == DType::F32 || t->dtype == DType::BF16, "fp8 ops: tensors must be fp32 or bf16");
            LLMC_ASSERT(first || t->dtype == d, "fp8 ops: tensors of one op must share the dtype");
            d = t->dtype;
            first = false;
        }
    }
    // Runs g, then adds `extra_bias` (may be nullptr: a bias g's epilogue does not add). When
    // cuBLASLt will not run g as asked: the same GEMM into the fp32 scratch (slot 4) with beta 0
    // and no epilogue, then add_gemm_result_kernel (accumulation and bias). Neither runs:
    // UserError naming the GEMM (exit code 2 in the trainer).
    void gemm(const Fp8GemmArgs& g, DType dt, const void* extra_bias, const char* what, cudaStream_t stream) {
        const long long n = (long long)g.m * g.n;
        const int blocks = (int)((n + 255) / 256);
        std::string why;
        if (gemm_.matmul(g, sm_, stream, &why)) {
            if (extra_bias)
                with_type(dt, [&](auto tag) {
                    using T = decltype(tag);
                    LLMC_LAUNCH(add_bias_kernel<T>, blocks, 256, 0, stream, (T*)g.D, (const T*)extra_bias, g.n, g.m);
                    CUDA_CHECK_LAUNCH();
                });
            return;
        }
        Fp8GemmArgs s = g;
        s.D = buf(4, (size_t)n * sizeof(float), stream);
        s.d_bf16 = false;
        s.bias = nullptr;
        s.accumulate = false;
        std::string why_scratch;
        if (!gemm_.matmul(s, sm_, stream, &why_scratch))
            throw UserError(strfmt("precision fp8: cuBLASLt runs no fp8 GEMM for %s (%s): %s; into an fp32 scratch "
                                   "instead: %s",
                                   what, fp8_gemm_text(g).c_str(), why.c_str(), why_scratch.c_str()));
        const void* bias = extra_bias ? extra_bias : g.bias;
        with_type(dt, [&](auto tag) {
            using T = decltype(tag);
            LLMC_LAUNCH(add_gemm_result_kernel<T>, blocks, 256, 0, stream, (T*)g.D, (const float*)s.D, (const T*)bias,
                        n, g.m, g.accumulate);
            CUDA_CHECK_LAUNCH();
        });
    }

    // Casts x [rows, cols] into out and/or outT with cast c; `slot` (0..2) owns the scale pair
    // and amax scratch. Returns the device pointers to s and 1/s: a delayed cast given both
    // (Fp8Cast::scale_at, inv_at: the trainer's scaling state) uses them as they are, with no
    // scale kernel; otherwise scale_kernel writes them into the slot. `pre` and `colsum`: as
    // cast_vec_kernel's (only where cast_vec_fits; the current recipe's amax is then of the
    // GELU-backward values).
    struct CastScales {
        const float* s;
        const float* inv;
    };
    // A delayed cast with its scale and 1/s in backend memory (Fp8Cast::scale_at, inv_at): no scale kernel.
    static bool given(const Fp8Cast& c) { return !c.current && c.scale_at && c.inv_at; }
    static void check_stash(const Fp8Stash& st, const Fp8Cast& c) {
        LLMC_ASSERT(!st.qT || given(c) || (st.inv && (uintptr_t)st.inv % 16 == 0),
                    "fp8 stash: inv must be a 16-byte aligned float (a cuBLASLt scale pointer)");
    }
    CastScales cast(const Fp8Cast& c, Tensor x, int rows, int cols, __nv_fp8_storage_t* out,
                    __nv_fp8_storage_t* outT, int slot, cudaStream_t stream, const void* pre = nullptr,
                    float* colsum = nullptr, float* inv_copy = nullptr) {
        LLMC_ASSERT(x.n >= (size_t)rows * cols && x.ptr, "fp8 cast: tensor too small");
        LLMC_ASSERT(slot >= 0 && slot < kScaleSlots, "fp8 cast: scale slot out of range");
        const size_t small_words = size_t(kScaleSlots + 1) * kScaleSlot;  // the slots, then the amax words
        if (!small_) CUDA_CHECK(device_malloc(&small_, small_words * sizeof(float)));
        float* sc = static_cast<float*>(small_) + slot * kScaleSlot;
        unsigned* amax = static_cast<unsigned*>(small_) + kScaleSlots * kScaleSlot + slot;
        unsigned* record = reinterpret_cast<unsigned*>(c.amax);
        LLMC_ASSERT(c.scale_at || (c.scale > 0.0f && fp8_is_finite(c.scale)),
                    strfmt("fp8: scale must be finite and positive, got %g", c.scale));
        const long long n = (long long)rows * cols;
        const bool from_state = given(c);
        LLMC_ASSERT(!from_state || !inv_copy, "fp8 cast: a given 1/s needs no copy");
        LLMC_ASSERT(!from_state || (uintptr_t)c.inv_at % 16 == 0,
                    "fp8 cast: inv_at must be 16-byte aligned (a cuBLASLt scale pointer)");
        with_type(x.dtype, [&](auto tag) {
            using T = decltype(tag);
            const T* xp = (const T*)x.ptr;
            const T* pp = (const T*)pre;
            if (!from_state) {  // s and 1/s into the slot (the current recipe: from the tensor's amax)
                if (c.current) {
                    if (queue_work()) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), stream));
                    with_pack_width<T>(pack_width<T>(n, {xp, pp}), [&](auto k) {
                        const int blocks = (int)std::min<long long>(kCastBlocks, (n / k + 255) / 256);
                        auto kernel = amax_kernel<T, decltype(k)::value>;  // one name for the launch macro
                        LLMC_LAUNCH(kernel, std::max(1, blocks), 256, 0, stream, amax, xp, pp, n, c.gelu);
                    });
                    CUDA_CHECK_LAUNCH();
                }
                LLMC_LAUNCH(scale_kernel, 1, 1, 0, stream, sc, c.current ? amax : nullptr, c.scale_at, c.scale,
                            c.format, c.margin, record, inv_copy);
                CUDA_CHECK_LAUNCH();
            }
            launch_cast<T>(out, outT, c.current ? nullptr : record, xp, from_state ? c.scale_at : sc, rows, cols,
                           c.format, stream, c.gelu, pp, colsum);
            CUDA_CHECK_LAUNCH();
        });
        return from_state ? CastScales{c.scale_at, c.inv_at} : CastScales{sc, sc + kInvScale};
    }

    // grow-only scratch, one per slot: 0 inp casts, 1 weight casts, 2/3 dout casts, 4 the fp32
    // result of a GEMM that cuBLASLt would not write in place (grown only on that path), 5 the
    // bias gradient's partial sums (launch_bias_grad)
    void* buf(int slot, size_t bytes, cudaStream_t stream) { return buf_[slot].get(bytes, stream); }

    Fp8Gemm gemm_;
    GrowBuffer buf_[6];
    void* small_ = nullptr;
    int queried_device_ = -1;
    int sm_ = 0;
    bool supported_ = false;
    std::string why_;
};

}  // namespace fp8
