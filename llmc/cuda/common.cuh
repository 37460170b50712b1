// Shared helpers of the CUDA backend: error checks, fp32/bf16 element access, block
// reductions, stochastic rounding. Everything here is header-only and used by the
// per-family kernel headers (encoder.cuh, layernorm.cuh, ...) and by dev/cuda/.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "llmc/precision/bf16.h"

// A failing CUDA/cuBLASLt call inside the backend is a bug (or a broken device): report
// file, line and the library's message, then abort (same policy as LLMC_ASSERT).
inline void cuda_check_impl(cudaError_t err, const char* expr, const char* file, int line) {
    if (err != cudaSuccess) {
        std::fprintf(stderr, "CUDA error at %s:%d: %s (%s): %s\n", file, line, cudaGetErrorName(err), expr,
                     cudaGetErrorString(err));
        std::fflush(stderr);
        std::abort();
    }
}
inline void cublas_check_impl(cublasStatus_t st, const char* expr, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cuBLASLt error at %s:%d: status %d (%s)\n", file, line, (int)st, expr);
        std::fflush(stderr);
        std::abort();
    }
}
#define CUDA_CHECK(x) cuda_check_impl((x), #x, __FILE__, __LINE__)
#define CUBLAS_CHECK(x) cublas_check_impl((x), #x, __FILE__, __LINE__)
// After a kernel launch: catches launch-configuration errors at once.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Every kernel launch: LLMC_LAUNCH(kernel, grid, block, dynamic smem bytes, stream, args...) is
// kernel<<<grid, block, smem, stream>>>(args...) under nvcc, and under the CPU emulator of CI
// (test/cuemu, LLMC_CUEMU) the emulator's launch. `kernel` is one macro argument: a template
// with several arguments goes through a local variable. A kernel's dynamic shared memory is
// LLMC_EXTERN_SMEM(type, name), an array of `type` 128-byte aligned, which the emulator provides
// per block.
#ifdef LLMC_CUEMU
#define LLMC_LAUNCH(kernel, grid, block, smem, stream, ...) \
    CUEMU_LAUNCH(kernel, grid, block, smem, stream, __VA_ARGS__)
#define LLMC_EXTERN_SMEM(type, name) type* const name = reinterpret_cast<type*>(::cuemu::dynamic_smem())
#else
#define LLMC_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define LLMC_EXTERN_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif

inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// Lets kernel fn launch with `bytes` of dynamic shared memory: past the default 48 KiB a kernel
// must opt in, up to the device's per-block limit (227 KiB on H100, 163 KiB on A100). Returns
// false, setting nothing, when `bytes` exceeds that limit (*limit: the limit); the caller says why.
inline bool opt_in_smem(const void* fn, size_t bytes, int* limit) {
    int dev = 0;
    *limit = 48 * 1024;
    if (bytes <= 48 * 1024) return true;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > (size_t)*limit) return false;
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return true;
}

// A grow-only device scratch buffer: get() reallocates only when asked for more than it holds,
// after the stream drains (the old buffer may still be in use by queued work).
struct GrowBuffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    void* get(size_t n, cudaStream_t stream) {
        if (bytes < n) {
            CUDA_CHECK(cudaStreamSynchronize(stream));
            if (ptr) CUDA_CHECK(cudaFree(ptr));
            ptr = nullptr;
            CUDA_CHECK(cudaMalloc(&ptr, n));
            bytes = n;
        }
        return ptr;
    }
    void release() {  // no error checks: called from destructors
        if (ptr) cudaFree(ptr);
        ptr = nullptr;
        bytes = 0;
    }
};

// The preference of a cuBLASLt heuristic query: at most `workspace` bytes, and the operands'
// alignments in bytes. Every split-K reduction scheme is allowed (in place in the output with
// counters that fix its order, or in the compute or output type in the workspace): all are
// deterministic, and a mask that excluded some could leave a shape with no algorithm at all.
inline cublasLtMatmulPreference_t lt_preference(size_t workspace, uint32_t align_a, uint32_t align_b,
                                                uint32_t align_d) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_MASK;
    auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n));
    };
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof(red));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
    return pref;
}

// ---- element access: everything is computed in fp32 ----
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// ---- host-side conversion (round to nearest even; NaN stays NaN) ----
inline uint16_t host_f32_to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}
inline float host_bf16_bits_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// ---- warp / block reductions (fixed order: deterministic) ----
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` is >= 32 floats of shared memory; the function syncs before reuse.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(r);
}

// ---- stochastic rounding fp32 -> bf16 from a counter-based hash of (seed, index) ----
// (hash_u32 and bf16_stochastic_bits: llmc/precision/bf16.h, shared with the host update of optimizer offload)
__device__ __forceinline__ bf16 stochastic_round_bf16(float x, uint32_t rnd) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf / NaN unchanged
    return __ushort_as_bfloat16((unsigned short)bf16_stochastic_bits(u, rnd));
}
