// cuemu: the CUDA execution model for g++, so that the project's real CUDA source (llmc/cuda/)
// runs on the CPU in CI. Force-included (g++ -include test/cuemu/cuemu.h) with the stand-in
// headers of test/cuemu/include/ on the include path and LLMC_CUEMU defined.
//  - every CUDA thread is a fiber (Boost.Context); the fibers of one block run on one OS thread,
//    the blocks of a grid spread over OpenMP threads;
//  - strict semantics: a warp collective completes only when every lane of its mask arrives at
//    the same collective (same kind, mask and source line); it aborts when a lane of the mask has
//    exited, waits at __syncthreads, or is read from outside the mask; __syncthreads aborts when
//    threads of the block have exited or wait elsewhere; no progress at all is a deadlock. Every
//    abort prints the block's threads and where each waits;
//  - schedules: CUEMU_SCHEDULE=ORDER-GRAIN, ORDER forward | reverse | random[SEED], GRAIN lockstep
//    (every thread runs to its next synchronisation point, round by round) or warp (one warp runs
//    until it blocks before the next starts), so that a race shows up as different results; under
//    ORDER forward the asynchronous operations (ptx.cuh's cp.async and wgmma twins) write as early
//    and read as late as a device may (a copy lands at its issue, a wgmma reads its operands at the
//    wait that completes it), under the others the reverse (async_reads_early: a copy lands at its
//    wait, a wgmma reads at its issue), so that a buffer overwritten while a read of it may be
//    pending and a read before its data is ready both show as different results;
//  - memory: device allocations carry a guarded tail (a store past the end aborts at the end of
//    the launch; under ASan it is poisoned), pointer arguments and copies must lie in device (or
//    pinned host) allocations, dynamic shared memory is NaN-filled per block and guarded past the
//    launch size, with the 48 KiB default and the opt-in attribute as on a device.
// Streams and events are synchronous: every launch and copy completes before it returns.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "test/cuemu/cuemu_runtime.h"

// ---- keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// block-scope thread_local is static: one copy per OS thread, i.e. per block being run
#define __shared__ thread_local
#define __restrict__ __restrict
#define __constant__

namespace cuemu {

// the built-in variables of the fiber now running on this OS thread
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
char* dynamic_smem();
uint64_t block_serial();  // a number of the block now running, unique on this OS thread
bool async_reads_early();  // copies land at their wait, wgmma reads at its issue (ORDER reverse, random)
// The async proxy (wgmma's reads of shared memory by descriptor) sees what threads wrote there
// (st.shared, cp.async: the generic proxy) only after the writer's fence.proxy.async and a
// barrier. The emulator keeps that view of the block's dynamic shared memory: a copy taken when a
// __syncthreads is released that some thread reached after a fence_proxy_async (the fence, then
// the barrier: CUTLASS's order). async_view: the view (the launch's NaN fill before the first such
// barrier); async_view_stale: a wgmma read a byte where shared memory and the view differ (aborts).
void fence_proxy_async();
const char* async_view();
[[noreturn]] void async_view_stale(size_t offset, const char* what);

// ---- warp collectives (all go through one rendezvous) ----
enum class Coll { Shfl, ShflUp, ShflDown, ShflXor, Ballot, SyncWarp, Wmma };
// Arrives at a warp collective; returns this lane's result once every lane of mask has arrived.
uint64_t warp_collective(Coll kind, unsigned mask, uint64_t value, int arg, int width, const char* file, int line);
void syncthreads(const char* file, int line);

template <class T> uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type over 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
template <class T> T shfl_value(Coll k, unsigned mask, T v, int arg, int width, const char* f, int l) {
    return from_bits<T>(warp_collective(k, mask, to_bits(v), arg, width, f, l));
}

// ---- work, captured or run ----
// Whether a stream capture is recording (cudaStreamBeginCapture); enqueue runs f now, or records
// it into the capture's graph (kernel launches, asynchronous copies and memsets, cuBLASLt calls).
bool capturing();
void enqueue(std::function<void()> f);

// ---- launches ----
// Runs grid x block threads of body (called with the block's threads as fibers); aborts on any
// violation. fn identifies the kernel (its dynamic shared-memory opt-in).
cudaError_t run_grid(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem,
                     void (*body)(void*), void* ctx);
// a run_grid that a stream capture records (its node keeps ctx)
void enqueue_grid(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, void (*body)(void*),
                  std::shared_ptr<void> ctx);
// a pointer argument must be null or inside a device / pinned host allocation
void check_pointer_arg(const char* kernel, int index, const void* p);

template <class T> void check_arg(const char* k, int i, const T& v) {
    if constexpr (std::is_pointer<T>::value) check_pointer_arg(k, i, (const void*)v);
}

// The launch proper, one instantiation per kernel signature P (the call sites' argument types
// only convert into the parameters' tuple, in launch below: the emulator's compile time is mostly
// these instantiations)
template <class... P>
void launch_args(const char* name, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                 const std::tuple<std::decay_t<P>...>& args) {
    struct Ctx {
        void (*k)(P...);
        std::tuple<std::decay_t<P>...> args;
    } ctx{k, args};  // (copies only: tuples' moves would be as many instantiations again)
    std::apply([&](const auto&... v) {
        int i = 0;
        (check_arg(name, i++, v), ...);
    }, ctx.args);
    void (*body)(void*) = [](void* c) {
        Ctx* x = static_cast<Ctx*>(c);
        auto args = x->args;  // each thread its own copy of the parameters, as on a device
        std::apply(x->k, args);
    };
    if (!capturing()) {
        run_grid(name, (const void*)k, grid, block, smem, body, &ctx);
        return;
    }
    // the graph's node keeps the launch's arguments (a deleter without a type of its own: one
    // shared_ptr instantiation for every kernel)
    void (*del)(void*) = [](void* c) { delete static_cast<Ctx*>(c); };
    enqueue_grid(name, (const void*)k, grid, block, smem, body,
                 std::shared_ptr<void>(static_cast<void*>(new Ctx(ctx)), del));
}

template <class... P, class... A>
void launch(const char* name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, A&&... a) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    launch_args<P...>(name, k, grid, block, smem, std::tuple<std::decay_t<P>...>(std::forward<A>(a)...));
}

}  // namespace cuemu

// ---- built-in variables ----
#define threadIdx (::cuemu::thread_idx())
#define blockIdx (::cuemu::block_idx())
#define blockDim (::cuemu::block_dim())
#define gridDim (::cuemu::grid_dim())
constexpr int warpSize = 32;

// ---- synchronisation and warp intrinsics (the source line tells collectives apart) ----
#define __syncthreads() ::cuemu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::cuemu::Site{::cuemu::Coll::SyncWarp, __FILE__, __LINE__}.syncwarp(__VA_ARGS__)
#define __shfl_sync(...) ::cuemu::Site{::cuemu::Coll::Shfl, __FILE__, __LINE__}.shfl(__VA_ARGS__)
#define __shfl_up_sync(...) ::cuemu::Site{::cuemu::Coll::ShflUp, __FILE__, __LINE__}.shfl(__VA_ARGS__)
#define __shfl_down_sync(...) ::cuemu::Site{::cuemu::Coll::ShflDown, __FILE__, __LINE__}.shfl(__VA_ARGS__)
#define __shfl_xor_sync(...) ::cuemu::Site{::cuemu::Coll::ShflXor, __FILE__, __LINE__}.shfl(__VA_ARGS__)
#define __ballot_sync(...) ::cuemu::Site{::cuemu::Coll::Ballot, __FILE__, __LINE__}.ballot(__VA_ARGS__)
#define __any_sync(m, p) (__ballot_sync(m, p) != 0u)
#define __all_sync(m, p) (__ballot_sync(m, p) == (unsigned)(m))

namespace cuemu {
// one call site of a warp intrinsic
struct Site {
    Coll kind;
    const char* file;
    int line;
    void syncwarp(unsigned mask = 0xffffffffu) const { warp_collective(kind, mask, 0, 0, 32, file, line); }
    template <class T> T shfl(unsigned mask, T v, int arg, int width = 32) const {
        return shfl_value(kind, mask, v, arg, width, file, line);
    }
    unsigned ballot(unsigned mask, int pred) const {
        return (unsigned)warp_collective(kind, mask, pred ? 1 : 0, 0, 32, file, line);
    }
};
}  // namespace cuemu

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- atomics (blocks run on several OS threads: real atomics) ----
template <class T> inline T atomicAdd(T* p, T v) {
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    } else {
        T old, want;
        __atomic_load(p, &old, __ATOMIC_SEQ_CST);
        do want = old + v;
        while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
        return old;
    }
}
// sm_90's vector form: each element atomically (CUDA's guarantee), not the pair as one
inline float2 atomicAdd(float2* p, float2 v) { return float2{atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y)}; }
template <class T> inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <class T> inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <class T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

// ---- device math the kernels call unqualified ----
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline float __uint_as_float(unsigned u) { return cuemu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return (unsigned)cuemu::to_bits(f); }
inline float __int_as_float(int u) { return cuemu::from_bits<float>((unsigned)u); }
inline int __float_as_int(float f) { return (int)cuemu::to_bits(f); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// The launch macro of llmc/cuda/common.cuh expands to this under the emulator.
#define CUEMU_LAUNCH(kernel, grid, block, smem, stream, ...) \
    ::cuemu::launch(#kernel, kernel, grid, block, smem, stream, __VA_ARGS__)
