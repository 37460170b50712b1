// Shared helpers of the CUDA backend: error checks, fp32/bf16 element access, block
// reductions, stochastic rounding. Everything here is header-only and used by the
// per-family kernel headers (encoder.cuh, layernorm.cuh, ...) and by dev/cuda/.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#if !defined(LLMC_CUEMU)
#include <dlfcn.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "llmc/core/common.h"
#include "llmc/precision/bf16.h"
#include "llmc/precision/fp16.h"

// A failing CUDA/cuBLASLt call inside the backend is a bug (or a broken device): report
// file, line and the library's message, then abort (same policy as LLMC_ASSERT, checks_throw()
// included).
// While a training step is captured into a CUDA graph (llmc/cuda/step_graph.cuh), a failure says so.
inline bool g_graph_capturing = false;
inline void cuda_check_impl(cudaError_t err, const char* expr, const char* file, int line) {
    if (err != cudaSuccess) {
        std::fprintf(stderr, "CUDA error at %s:%d: %s (%s): %s\n", file, line, cudaGetErrorName(err), expr,
                     cudaGetErrorString(err));
        if (g_graph_capturing)
            std::fprintf(stderr, "(while capturing a training step as a CUDA graph: train.cuda_graphs false runs "
                                 "without)\n");
        std::fflush(stderr);
        check_failed(std::string("CUDA error ") + cudaGetErrorName(err) + " at " + file + ":" + std::to_string(line) + ": " + expr);
    }
}
inline void cublas_check_impl(cublasStatus_t st, const char* expr, const char* file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cuBLASLt error at %s:%d: status %d (%s)\n", file, line, (int)st, expr);
        std::fflush(stderr);
        check_failed(std::string("cuBLASLt status ") + std::to_string((int)st) + " at " + file + ":" + std::to_string(line) + ": " + expr);
    }
}
#define CUDA_CHECK(x) cuda_check_impl((x), #x, __FILE__, __LINE__)
#define CUBLAS_CHECK(x) cublas_check_impl((x), #x, __FILE__, __LINE__)

// cuBLASLt's functions, loaded from libcublasLt.so.<major> by the first call (dlopen) instead of
// linked: the library's static initialisation costs ~0.4 s of CPU in every process that loads it
// (0.5 s for `train_gpt --help` linked, 0.03 s without), and most processes of the CUDA build run
// no GEMM on a GPU: every rank of a CPU run, --plan, --help (87 processes in
// test/e2e/test_model_parallel.sh). Called as lt().cublasLtMatmul(...). Under the emulator (LLMC_CUEMU),
// its own functions (test/cuemu/cublaslt.cpp). A library that cannot be loaded is the user's
// installation: UserError naming it (exit code 2 in the trainer).
#define LLMC_LT_FUNCTIONS(X)                                                                                    \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic)                   \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                 \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
struct LtApi {
#define LLMC_LT_MEMBER(f) decltype(&::f) f = nullptr;
    LLMC_LT_FUNCTIONS(LLMC_LT_MEMBER)
#undef LLMC_LT_MEMBER
};
#define LLMC_LT_STR2(x) #x
#define LLMC_LT_STR(x) LLMC_LT_STR2(x)
inline const LtApi& lt() {
    static const LtApi api = [] {
        LtApi a;
#if defined(LLMC_CUEMU)
#define LLMC_LT_BIND(f) a.f = &::f;
#else
        const char* lib = "libcublasLt.so." LLMC_LT_STR(CUBLAS_VER_MAJOR);
        void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) throw UserError(strfmt("device=cuda: cannot load cuBLASLt: %s", dlerror()));
#define LLMC_LT_BIND(f)                                                        \
    if (!(a.f = reinterpret_cast<decltype(a.f)>(dlsym(h, #f))))                \
        throw UserError(strfmt("device=cuda: %s has no %s (older than the CUDA headers train_gpt was built with?)", \
                               lib, #f));
#endif
        LLMC_LT_FUNCTIONS(LLMC_LT_BIND)
#undef LLMC_LT_BIND
        return a;
    }();
    return api;
}

// After a kernel launch: catches launch-configuration errors at once.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
// Kernels and cuBLASLt calls queued by this process (Ops::counters' launches): LLMC_LAUNCH counts
// each kernel launch, LtAlgoCache each cuBLASLt call it runs.
inline uint64_t cuda_launch_count = 0;
inline void count_launch() { ++cuda_launch_count; }
// Device allocations and frees so far: a CUDA graph holds pointers, so one made before an
// allocation may hold stale ones (llmc/cuda/step_graph.cuh). The backend allocates and frees
// device memory only through device_malloc and device_free, which count.
inline uint64_t cuda_alloc_count = 0;
inline cudaError_t device_malloc(void** p, size_t bytes) {
    ++cuda_alloc_count;
    return cudaMalloc(p, bytes);
}
template <class T> cudaError_t device_malloc(T** p, size_t bytes) { return device_malloc((void**)p, bytes); }
inline cudaError_t device_free(void* p) {
    ++cuda_alloc_count;
    return cudaFree(p);
}
// While a training step replays its CUDA graph (llmc/cuda/step_graph.cuh), the host code runs as
// usual but queues no work: the graph holds it. Every kernel launch, cuBLASLt call, memset, device
// copy and sort asks queue_work() first (LLMC_LAUNCH does).
inline bool g_graph_replay = false;
inline bool queue_work() { return !g_graph_replay; }

// Every kernel launch: LLMC_LAUNCH(kernel, grid, block, dynamic smem bytes, stream, args...) is
// kernel<<<grid, block, smem, stream>>>(args...) under nvcc, and under the CPU emulator of CI
// (test/cuemu, LLMC_CUEMU) the emulator's launch. `kernel` is one macro argument: a template
// with several arguments goes through a local variable. A kernel's dynamic shared memory is
// LLMC_EXTERN_SMEM(type, name), an array of `type` 128-byte aligned, which the emulator provides
// per block. Each launch is counted, also where a replaying graph holds it (queue_work: one
// expression, a statement).
#ifdef LLMC_CUEMU
#define LLMC_LAUNCH(kernel, grid, block, smem, stream, ...) \
    count_launch(), queue_work() ? CUEMU_LAUNCH(kernel, grid, block, smem, stream, __VA_ARGS__) : void()
#define LLMC_EXTERN_SMEM(type, name) type* const name = reinterpret_cast<type*>(::cuemu::dynamic_smem())
#else
#define LLMC_LAUNCH(kernel, grid, block, smem, stream, ...) \
    count_launch(), queue_work() ? kernel<<<grid, block, smem, stream>>>(__VA_ARGS__) : void()
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
            LLMC_ASSERT(queue_work(), "a scratch buffer grew while a CUDA graph replayed");
            CUDA_CHECK(cudaStreamSynchronize(stream));
            if (ptr) CUDA_CHECK(device_free(ptr));
            ptr = nullptr;
            CUDA_CHECK(device_malloc(&ptr, n));
            bytes = n;
        }
        return ptr;
    }
    void release() {  // no error checks: called from destructors
        if (ptr) device_free(ptr);
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
    CUBLAS_CHECK(lt().cublasLtMatmulPreferenceCreate(&pref));
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_MASK;
    auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* v, size_t n) {
        CUBLAS_CHECK(lt().cublasLtMatmulPreferenceSetAttribute(pref, attr, v, n));
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
// The element types of the kernels: float, bf16 and f16 (IEEE half, precision "fp16"); from_f32
// rounds to nearest even (f16: past 65504 +-inf, as llmc/precision/fp16.h on the host).
typedef __nv_bfloat16 bf16;
typedef __half f16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
// the 16-bit element types (bf16, f16): the tensor-core kernels' operands
template <class T> constexpr bool is_half_type = std::is_same<T, bf16>::value || std::is_same<T, f16>::value;

// `#pragma unroll` for nvcc (register arrays indexed by the loop variable stay registers); nothing
// for the emulator's g++, which does not know the pragma
#ifdef LLMC_CUEMU
#define LLMC_UNROLL
#else
#define LLMC_UNROLL _Pragma("unroll")
#endif

// ---- 16-byte packs: the memory-bound kernels' loads and stores ----
// Pack<T, K> is K consecutive elements moved in one access: K = pack_max<T> (16 bytes: 8 bf16 or
// 4 floats) is one 128-bit load or store and needs a 16-byte aligned address; K = 1 is one element.
// A row kernel takes K as a template argument; its launcher asks pack_width for K and runs
// with_pack_width, so that rows a pack cannot tile (a pointer off 16 bytes, a row length not a
// multiple of pack_max) take the same kernel element by element: correct, slower.
template <class T> constexpr int pack_max = 16 / (int)sizeof(T);
template <class T, int K>
struct alignas(sizeof(T) * K) Pack {
    static_assert(sizeof(T) * K <= 16, "a pack is at most 16 bytes");
    T v[K];
};
// (the emulator holds a pack to the device's rule: a misaligned vector access is an error there)
template <int K, class T> __device__ __forceinline__ void check_pack_alignment(const T* p) {
#ifdef LLMC_CUEMU
    if (reinterpret_cast<uintptr_t>(p) % alignof(Pack<T, K>) != 0) {
        std::fprintf(stderr, "cuemu: a %zu-byte pack at %p is not %zu-byte aligned\n", sizeof(Pack<T, K>),
                     (const void*)p, alignof(Pack<T, K>));
        std::abort();
    }
#endif
}
template <int K, class T> __device__ __forceinline__ Pack<T, K> load_pack(const T* p) {
    check_pack_alignment<K>(p);
    return *reinterpret_cast<const Pack<T, K>*>(p);
}
template <int K, class T> __device__ __forceinline__ void store_pack(T* p, const Pack<T, K>& x) {
    check_pack_alignment<K>(p);
    *reinterpret_cast<Pack<T, K>*>(p) = x;
}
// A compiler barrier on a pack held in registers (an empty asm that claims to change its words):
// what was computed from the pack before it is computed again after, not kept alive in between
// (a kernel that holds many packs across a reduction keeps them, not their float conversions).
// No code; nothing under the emulator.
template <class T, int K> __device__ __forceinline__ void opaque(Pack<T, K>& p) {
#ifndef LLMC_CUEMU
    static_assert(sizeof(p) % 4 == 0, "opaque: packs of whole 32-bit words");
    uint32_t* u = reinterpret_cast<uint32_t*>(&p);
    LLMC_UNROLL
    for (int i = 0; i < (int)(sizeof(p) / 4); i++) asm volatile("" : "+r"(u[i]));
#endif
}
// pack_max<T> when every non-null pointer is 16-byte aligned and rows of `row` elements keep
// that alignment, else 1
template <class T> inline int pack_width(long long row, std::initializer_list<const void*> ptrs) {
    if (row % pack_max<T> != 0) return 1;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
    return pack_max<T>;
}
// f(std::integral_constant<int, K>{}) with K = k (pack_max<T> or 1, from pack_width)
template <class T, class F> void with_pack_width(int k, F&& f) {
    if (k == pack_max<T>)
        f(std::integral_constant<int, pack_max<T>>{});
    else
        f(std::integral_constant<int, 1>{});
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
// ---- column sums of per-block partial results (the second pass of the deterministic reductions:
// LayerNorm/RMSNorm weight gradients, the bias gradient) ----
// dst[c] += sum_g partial[g * Q C + c] over g < G, for the Q C columns c of each partial row: columns
// [0, C) go to dst0, [C, 2C) to dst1 (Q = 2). A block of 32 x kColSumRows threads takes 32 columns;
// thread (x, y) adds the rows g = y, y + kColSumRows, ... in order, then thread (x, 0) adds those
// kColSumRows sums in y order: the order depends on G alone.
constexpr int kColSumRows = 16;
template <class T>
__global__ void column_sum_add_kernel(T* dst0, T* dst1, const float* partial, int G, int C, int Q) {
    __shared__ float s_sum[kColSumRows][32];
    const int cols = Q * C;
    const int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < cols)
        for (int g = threadIdx.y; g < G; g += kColSumRows) s += partial[(long long)g * cols + col];
    s_sum[threadIdx.y][threadIdx.x] = s;
    __syncthreads();  // every row's sum of this column is in s_sum
    if (threadIdx.y != 0 || col >= cols) return;
    float t = 0.0f;
    for (int y = 0; y < kColSumRows; y++) t += s_sum[y][threadIdx.x];
    T* dst = col < C ? dst0 + col : dst1 + (col - C);
    *dst = from_f32<T>(to_f32(*dst) + t);
}
template <class T>
void launch_column_sum_add(cudaStream_t st, T* dst0, T* dst1, const float* partial, int G, int C, int Q) {
    LLMC_LAUNCH(column_sum_add_kernel<T>, ceil_div(Q * C, 32), dim3(32, kColSumRows), 0, st, dst0, dst1, partial, G,
                C, Q);
}

// ---- stochastic rounding fp32 -> bf16 from a counter-based hash of (seed, index) ----
// (hash_u32 and bf16_stochastic_bits: llmc/precision/bf16.h, shared with the host update of optimizer offload)
__device__ __forceinline__ bf16 stochastic_round_bf16(float x, uint32_t rnd) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf / NaN unchanged
    return __ushort_as_bfloat16((unsigned short)bf16_stochastic_bits(u, rnd));
}
