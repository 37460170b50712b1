// Classifier. Fused: per row, the max and sum-exp over the real vocabulary, the loss, and
// (if dloss != 0) the logits overwritten in place by dloss * (softmax - onehot), zero in
// the padded columns. No probability tensor is written.
// Vocabulary-parallel (tensor parallelism): the same per-row statistics over one vocabulary
// slice (partial), then, once the slices' statistics are combined, the loss and the slice's
// gradient (finish).
// Speed: memory-bound (GPT-2's 50304 columns: a row is read for the statistics, read again,
// mostly from L2, for the gradient, and written once; with KernelWays::ce_row_in_smem the first
// read keeps the row in shared memory for the second, where the row fits). Rows move in 16-byte packs
// (common.cuh's pack_width); each pass takes one exp2 per element (the running sum is rescaled
// once per pack, when the pack raises the running max); the block's reduction has a fixed
// order, so the results are deterministic.
#pragma once
#include "llmc/cuda/common.cuh"

// One block per row in all three kernels: partial's statistics of one whole slice are then
// bitwise the fused kernel's.
constexpr int kCeThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;

// (m, s) represents s * exp(m); combine two such partial sums (commutative, bitwise: the two
// lanes of a butterfly step get the same result)
__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    const float nm = fmaxf(m, m2);
    s = s * expf(m - nm) + s2 * expf(m2 - nm);
    m = nm;
}

// Adds K values to a running (m, s), s = the sum of exp(x - m) over the values so far: one exp2
// per value, and one more to rescale s when the values raise m. While m is -inf every value seen
// is -inf or NaN and adds exp(x - 0): 0 for -inf, NaN for NaN (a NaN logit gives a NaN loss).
template <int K>
__device__ __forceinline__ void add_sumexp(float& m, float& s, const float (&x)[K]) {
    float vm = x[0];
    LLMC_UNROLL
    for (int k = 1; k < K; k++) vm = fmaxf(vm, x[k]);
    if (vm > m) {
        s *= exp2f((m - vm) * kLog2e);
        m = vm;
    }
    const float ml = (m == -INFINITY ? 0.0f : m) * kLog2e;
    LLMC_UNROLL
    for (int k = 0; k < K; k++) s += exp2f(fmaf(x[k], kLog2e, -ml));
}

template <class T, int K>
__device__ __forceinline__ void pack_to_f32(const Pack<T, K>& p, float (&f)[K]) {
    LLMC_UNROLL
    for (int k = 0; k < K; k++) f[k] = to_f32(p.v[k]);
}

// lse_combine over the 32 lanes (xor butterfly: every lane ends with the same (m, s))
__device__ __forceinline__ void warp_lse_combine(float& m, float& s) {
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(m, s, m2, s2);
    }
}

// Packs per thread and step in the row loops: loads in flight before the first is used.
constexpr int kCeUnroll = 4;

// Block-wide (max, sum of exp(x - max)) over x[0, n) (x 16-byte aligned when K > 1): thread t
// takes the packs t, t + blockDim, ... (kCeUnroll loads at a time), the elements past the last
// whole pack one each; then a warp butterfly, and a butterfly over the warps' results. The order
// is fixed for a given blockDim and K. Every thread gets (M, S); (-inf, 0) when n == 0. Every
// thread of the block must call it (it synchronises). blockDim.x a multiple of 32 (<= 1024).
// keep (shared memory, 16-byte aligned; nullptr: none): each value read is also stored there at
// its column, for a second pass after the barrier (the same loads in the same order: the same M, S).
template <class T, int K>
__device__ void block_max_sumexp(const T* x, int n, float& M, float& S, T* keep = nullptr) {
    __shared__ float s_m[32], s_s[32];
    const int bd = blockDim.x, nvec = n / K;
    float m = -INFINITY, s = 0.0f;
    int i = threadIdx.x;
    for (; i + (kCeUnroll - 1) * bd < nvec; i += kCeUnroll * bd) {
        Pack<T, K> p[kCeUnroll];
        LLMC_UNROLL
        for (int u = 0; u < kCeUnroll; u++) p[u] = load_pack<K>(x + (i + u * bd) * K);
        LLMC_UNROLL
        for (int u = 0; u < kCeUnroll; u++) {
            if (keep) store_pack(keep + (i + u * bd) * K, p[u]);
            float f[K];
            pack_to_f32(p[u], f);
            add_sumexp(m, s, f);
        }
    }
    for (; i < nvec; i += bd) {
        const Pack<T, K> p = load_pack<K>(x + i * K);
        if (keep) store_pack(keep + i * K, p);
        float f[K];
        pack_to_f32(p, f);
        add_sumexp(m, s, f);
    }
    for (int c = nvec * K + threadIdx.x; c < n; c += bd) {
        const T v = x[c];
        if (keep) keep[c] = v;
        const float f[1] = {to_f32(v)};
        add_sumexp(m, s, f);
    }
    warp_lse_combine(m, s);
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        s_m[threadIdx.x >> 5] = m;
        s_s[threadIdx.x >> 5] = s;
    }
    __syncthreads();
    const bool has = lane < (bd >> 5);
    m = has ? s_m[lane] : -INFINITY;
    s = has ? s_s[lane] : 0.0f;
    warp_lse_combine(m, s);
    M = m;
    S = s;
}

// dloss * (exp(x - lse) - [c == target]) for the column c of a real value, 0 for padding
__device__ __forceinline__ float ce_grad(float x, int c, int nreal, int target, float lse_log2e, float dloss) {
    return c < nreal ? (exp2f(fmaf(x, kLog2e, -lse_log2e)) - (c == target ? 1.0f : 0.0f)) * dloss : 0.0f;
}

// The row x[0, n) := its gradient (ce_grad: the real columns are [0, nreal)), its values read from
// src (x itself, or the row kept in shared memory: n columns, of which only the real ones are
// used). Packs as in block_max_sumexp (all loads of a step before its stores).
template <class T, int K>
__device__ void write_ce_grad(T* x, const T* src, int n, int nreal, int target, float lse, float dloss) {
    const int bd = blockDim.x, nvec = n / K;
    const float ll = lse * kLog2e;
    auto grad = [&](Pack<T, K>& p, int c0) {
        LLMC_UNROLL
        for (int k = 0; k < K; k++) p.v[k] = from_f32<T>(ce_grad(to_f32(p.v[k]), c0 + k, nreal, target, ll, dloss));
    };
    int i = threadIdx.x;
    for (; i + (kCeUnroll - 1) * bd < nvec; i += kCeUnroll * bd) {
        Pack<T, K> p[kCeUnroll];
        LLMC_UNROLL
        for (int u = 0; u < kCeUnroll; u++) p[u] = load_pack<K>(src + (i + u * bd) * K);
        LLMC_UNROLL
        for (int u = 0; u < kCeUnroll; u++) {
            grad(p[u], (i + u * bd) * K);
            store_pack(x + (i + u * bd) * K, p[u]);
        }
    }
    for (; i < nvec; i += bd) {
        Pack<T, K> p = load_pack<K>(src + i * K);
        grad(p, i * K);
        store_pack(x + i * K, p);
    }
    for (int c = nvec * K + threadIdx.x; c < n; c += bd)
        x[c] = from_f32<T>(ce_grad(to_f32(src[c]), c, nreal, target, ll, dloss));
}

// One block per row (kCeThreads). A target outside [0, V) gives a NaN loss (and no onehot).
// ROW: the row kept in dynamic shared memory (ce_row_smem_bytes) between the statistics and the
// gradient, read from memory once; the same values, bit for bit.
template <class T, int K, bool ROW>
__global__ void __launch_bounds__(kCeThreads) cross_entropy_kernel(T* logits, float* losses, const int32_t* targets,
                                                                   int V, int Vp, float dloss) {
    T* x = logits + (long long)blockIdx.x * Vp;
    T* row = nullptr;
    if constexpr (ROW) {
        LLMC_EXTERN_SMEM(char, ce_smem);
        row = reinterpret_cast<T*>(ce_smem);
    }
    const int target = targets[blockIdx.x];
    // read before any thread overwrites it: the writes follow block_max_sumexp's barrier
    float target_logit = 0.0f;
    if (threadIdx.x == 0) target_logit = (target >= 0 && target < V) ? to_f32(x[target]) : NAN;
    float M, S;
    block_max_sumexp<T, K>(x, V, M, S, row);  // (its barrier also orders the row's stores before the reads)
    const float lse = M + logf(S);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - target_logit;
    if (dloss != 0.0f) write_ce_grad<T, K>(x, ROW ? row : x, Vp, V, target, lse, dloss);
}
// The shared memory a row of Vp columns takes (16-byte packs)
template <class T> inline size_t ce_row_smem_bytes(int Vp) { return ((size_t)Vp * sizeof(T) + 15) / 16 * 16; }

// Number of real (global index < V) columns of the slice [vocab_begin, vocab_begin + Vl).
__host__ __device__ inline int ce_slice_real_cols(int Vl, int vocab_begin, int V) {
    const long long r = (long long)V - vocab_begin;
    return r <= 0 ? 0 : (r < Vl ? (int)r : Vl);
}

// Vocabulary-parallel, step 1. logits [N, Vl] = the columns [vocab_begin, vocab_begin + Vl),
// of which the first nreal are real. One block per row (kCeThreads):
// stats[3i..3i+2] = (max, sum of exp(x - max), the target's logit if it is in this slice
// else 0); (-inf, 0, 0) when nreal == 0. The same reduction as cross_entropy_kernel, so one
// slice with the same K gives bitwise the fused kernel's statistics.
template <class T, int K>
__global__ void __launch_bounds__(kCeThreads) cross_entropy_partial_kernel(float* stats, const T* logits,
                                                                           const int32_t* targets, int Vl, int nreal,
                                                                           int vocab_begin) {
    const T* x = logits + (long long)blockIdx.x * Vl;
    float M, S;
    block_max_sumexp<T, K>(x, nreal, M, S);
    if (threadIdx.x == 0) {
        const long long tl = (long long)targets[blockIdx.x] - vocab_begin;
        float* st = stats + 3LL * blockIdx.x;
        st[0] = M;
        st[1] = S;
        st[2] = (tl >= 0 && tl < nreal) ? to_f32(x[tl]) : 0.0f;
    }
}

// Vocabulary-parallel, step 2. stats[3i..3i+2] = the combined (M, S, target logit) of row i
// over the whole vocabulary. losses[i] = (M + log S) - target logit; with dloss != 0 the
// slice's logits become dloss * (exp(x - M - log S) - onehot) in its nreal real columns and
// 0 in the rest (write_ce_grad, as the fused kernel). One block per row (kCeThreads).
template <class T, int K>
__global__ void __launch_bounds__(kCeThreads) cross_entropy_finish_kernel(T* logits, float* losses,
                                                                          const float* stats, const int32_t* targets,
                                                                          int Vl, int nreal, int vocab_begin,
                                                                          float dloss) {
    const float* st = stats + 3LL * blockIdx.x;
    const float lse = st[0] + logf(st[1]);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - st[2];
    if (dloss == 0.0f) return;
    const long long tl = (long long)targets[blockIdx.x] - vocab_begin;
    T* x = logits + (long long)blockIdx.x * Vl;
    write_ce_grad<T, K>(x, x, Vl, nreal, (tl >= 0 && tl < Vl) ? (int)tl : -1, lse, dloss);
}

// Launchers (N > 0 rows). K: 16-byte packs when the rows allow them (pack_width). row_in_smem
// (KernelWays::ce_row_in_smem, with a gradient to write): the row kept in shared memory where the
// device's per-block limit holds it (GPT-2's 50304 bf16 columns: 98 KiB, two blocks an SM on an
// H100/H200's 228 KiB, one on an A100's 164), else read twice as without.
template <class T>
void launch_cross_entropy(cudaStream_t st, T* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                          float dloss, bool row_in_smem = false) {
    with_pack_width<T>(pack_width<T>(Vp, {logits}), [&](auto k) {
        constexpr int K = decltype(k)::value;
        auto row_kernel = cross_entropy_kernel<T, K, true>;
        const size_t bytes = ce_row_smem_bytes<T>(Vp);
        int limit = 0;
        if (row_in_smem && dloss != 0.0f && opt_in_smem((const void*)row_kernel, bytes, &limit)) {
            LLMC_LAUNCH(row_kernel, N, kCeThreads, bytes, st, logits, losses, targets, V, Vp, dloss);
        } else {
            auto cross_entropy = cross_entropy_kernel<T, K, false>;
            LLMC_LAUNCH(cross_entropy, N, kCeThreads, 0, st, logits, losses, targets, V, Vp, dloss);
        }
    });
}
template <class T>
void launch_cross_entropy_partial(cudaStream_t st, float* stats, const T* logits, const int32_t* targets, int N,
                                  int Vl, int nreal, int vocab_begin) {
    with_pack_width<T>(pack_width<T>(Vl, {logits}), [&](auto k) {
        auto cross_entropy_partial = cross_entropy_partial_kernel<T, decltype(k)::value>;
        LLMC_LAUNCH(cross_entropy_partial, N, kCeThreads, 0, st, stats, logits, targets, Vl, nreal, vocab_begin);
    });
}
template <class T>
void launch_cross_entropy_finish(cudaStream_t st, T* logits, float* losses, const float* stats,
                                 const int32_t* targets, int N, int Vl, int nreal, int vocab_begin, float dloss) {
    with_pack_width<T>(pack_width<T>(Vl, {logits}), [&](auto k) {
        auto cross_entropy_finish = cross_entropy_finish_kernel<T, decltype(k)::value>;
        LLMC_LAUNCH(cross_entropy_finish, N, kCeThreads, 0, st, logits, losses, stats, targets, Vl, nreal,
                    vocab_begin, dloss);
    });
}

// Ops::cross_entropy_stats: one thread per row.
__global__ void cross_entropy_stats_kernel(int phase, float* stats, float* mx, float* rest, long long rows) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    if (phase == 0) {
        mx[i] = stats[3 * i];
    } else if (phase == 1) {
        const float m = stats[3 * i];
        rest[2 * i] = m == -INFINITY ? 0.0f : stats[3 * i + 1] * expf(m - mx[i]);
        rest[2 * i + 1] = stats[3 * i + 2];
    } else {
        stats[3 * i] = mx[i];
        stats[3 * i + 1] = rest[2 * i];
        stats[3 * i + 2] = rest[2 * i + 1];
    }
}
