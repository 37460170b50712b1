// Fused causal flash attention, forward and backward, never materialising T x T. In bf16 and fp16 the
// forward at head sizes 32, 64, 80, 96, 128, 256 runs llmc/cuda/flash_attention.cuh and the
// backward at 32 to 128 llmc/cuda/flash_backward.cuh and flash_backward_fused.cuh (registers,
// mma.sync, ldmatrix, cp.async; the choice among the backward's ways at the end of the latter);
// everything else (fp32, other head sizes, tiles the device's shared memory cannot hold) runs
// the general kernels below.
//
// qkv [B, T, NH + 2*NKV, HS] (per token: NH query heads, NKV key heads, NKV value heads;
// query head h reads key/value head h / (NH/NKV), grouped-query attention; NKV == NH is
// [B, T, 3, NH, HS]) -> out [B, T, NH, HS]; lse [B, NH, T] (fp32, log-sum-exp of the
// scaled scores of each query row). One thread block (4 warps) per (query or key tile,
// head, batch). All tiles live in shared memory; the tile products are done by
// block_mm(), which is nvcuda::wmma (bf16/fp16 in, fp32 accumulate, tensor cores) for bf16/fp16
// and plain fp32 FMA for fp32 (so fp32 mode matches the CPU to ~1e-6). Softmax
// statistics, accumulators and the probabilities' normaliser are fp32.
//
// Backward (deterministic, no atomics): D_i = rowsum(dO_i * O_i) first; then one kernel
// computes dK, dV per key tile of a key/value head, looping over the query heads of its
// group and, for each, over the query tiles, in order; another computes dQ per query tile
// looping over the key tiles in order.
//
// The block form (context parallelism's ring, llmc/backend/ops.h's attention_block_*): the queries of
// qkv_q [B, Tq, ...] against the keys/values of qkv_kv [B, Tk, ...], query row i at position
// qp.at(i) seeing key row j at kp.at(j) <= qp.at(i). Positions increase with the row (a
// SeqPositions' second run starts after its first ends), so the keys a query row sees are a
// prefix of the block and the query rows that see a key row a suffix: the tile loops stop and
// start at binary-searched rows, as the causal loops do at the diagonal. A row that sees no key
// gets out 0 and lse -inf. The whole attention is the block of a sequence with itself at
// positions 0..T-1 (the same loops, bitwise). The block backward accumulates (+=) into dQ and
// dK/dV; the whole one overwrites.
//
// Any head size (padded to a multiple of 16 in shared memory; too large for the device's shared
// memory: a UserError); any T >= 1.
#pragma once
#include <mma.h>

#include <type_traits>

#include "llmc/cuda/attention_ops.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/flash_backward_fused.cuh"
#include "llmc/backend/positions.h"
#include "llmc/core/common.h"

namespace attn {

// the position searches: flash::visible (keys a position sees) and flash::first_query
using flash::first_query;
using flash::visible;

constexpr int kThreads = 128;  // 4 warps per block

// padding (elements) of the shared-memory row pitch: 16 bytes, keeps wmma's alignment
// rules (ldm multiple of 16 bytes; 16-row / 16-column fragment origins 32-byte aligned)
template <class T> __host__ __device__ constexpr int pad() { return 16 / (int)sizeof(T); }

__host__ __device__ inline size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

// C[M x N] (fp32, row-major, ldc) = (acc ? C : 0) + op(A)[M x K] * op(B)[K x N]
// A(m, k) = AT ? A[k*lda + m] : A[m*lda + k];  B(k, n) = BT ? B[n*ldb + k] : B[k*ldb + n].
// M, N, K multiples of 16. Called by the whole block; no synchronisation inside.
template <class T, bool AT, bool BT>
__device__ __forceinline__ void block_mm(float* C, int ldc, const T* A, int lda, const T* B, int ldb, int M, int N,
                                         int K, bool acc) {
    if constexpr (std::is_same<T, float>::value) {
        for (int idx = threadIdx.x; idx < M * N; idx += blockDim.x) {
            const int i = idx / N, j = idx % N;
            float s = acc ? C[i * ldc + j] : 0.0f;
            for (int k = 0; k < K; k++) {
                const float a = AT ? A[k * lda + i] : A[i * lda + k];
                const float b = BT ? B[j * ldb + k] : B[k * ldb + j];
                s = fmaf(a, b, s);
            }
            C[i * ldc + j] = s;
        }
    } else {
        using namespace nvcuda;
        typedef typename std::conditional<AT, wmma::col_major, wmma::row_major>::type LA;
        typedef typename std::conditional<BT, wmma::col_major, wmma::row_major>::type LB;
        const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
        const int tn = N / 16, ntiles = (M / 16) * tn;
        for (int t = warp; t < ntiles; t += nwarps) {
            const int m0 = (t / tn) * 16, n0 = (t % tn) * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            if (acc)
                wmma::load_matrix_sync(c, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
            else
                wmma::fill_fragment(c, 0.0f);
            for (int k0 = 0; k0 < K; k0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
                wmma::load_matrix_sync(a, AT ? A + k0 * lda + m0 : A + m0 * lda + k0, lda);
                wmma::load_matrix_sync(b, BT ? B + n0 * ldb + k0 : B + k0 * ldb + n0, ldb);
                wmma::mma_sync(c, a, b, c);
            }
            wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
        }
    }
}

// rows [t0, t0 + R) of head slot `head` of qkv (NQKV = NH + 2*NKV slots per token: query
// head h is slot h, key head j slot NH + j, value head j slot NH + NKV + j) -> smem [R x HS]
// (pitch ld), zero rows beyond T
template <class T>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* qkv, int b, int head, int t0, int R, int T_,
                                          int NQKV, int HS, int HSP) {
    const long long stride = (long long)NQKV * HS;
    const T* base = qkv + (long long)b * T_ * stride + (long long)head * HS;
    for (int idx = threadIdx.x; idx < R * HSP; idx += blockDim.x) {
        const int r = idx / HSP, d = idx % HSP, t = t0 + r;
        dst[r * ld + d] = t < T_ && d < HS ? base[(long long)t * stride + d] : from_f32<T>(0.0f);
    }
}
// rows of a [B, T, NH, HS] tensor (out / dout) -> smem
template <class T>
__device__ __forceinline__ void load_rows_bthd(T* dst, int ld, const T* src, int b, int h, int t0, int R, int T_,
                                               int NH, int HS, int HSP) {
    for (int idx = threadIdx.x; idx < R * HSP; idx += blockDim.x) {
        const int r = idx / HSP, d = idx % HSP, t = t0 + r;
        dst[r * ld + d] = t < T_ && d < HS ? src[(((long long)b * T_ + t) * NH + h) * HS + d] : from_f32<T>(0.0f);
    }
}

// ---------------- forward ----------------
struct FwdLayout {
    size_t q, k, v, s, p, o, m, l, a, total;
};
template <class T, int BR, int BC>
__host__ __device__ inline FwdLayout fwd_layout(int HS) {
    const int ldt = HS + pad<T>(), lds = BC + 4, ldp = BC + pad<T>(), ldo = HS + 4;
    FwdLayout L;
    size_t off = 0;
    L.q = off; off = align128(off + (size_t)BR * ldt * sizeof(T));
    L.k = off; off = align128(off + (size_t)BC * ldt * sizeof(T));
    L.v = off; off = align128(off + (size_t)BC * ldt * sizeof(T));
    L.s = off; off = align128(off + (size_t)BR * lds * sizeof(float));
    L.p = off; off = align128(off + (size_t)BR * ldp * sizeof(T));
    L.o = off; off = align128(off + (size_t)BR * ldo * sizeof(float));
    L.m = off; off = align128(off + BR * sizeof(float));
    L.l = off; off = align128(off + BR * sizeof(float));
    L.a = off; off = align128(off + BR * sizeof(float));
    L.total = off;
    return L;
}

template <class T, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv_q, const T* qkv_kv, int T_, int Tk, int NH, int NKV,
                             int HS, int HSP, float scale, SeqPositions qp, SeqPositions kp) {
    LLMC_EXTERN_SMEM(char, smem);
    const FwdLayout L = fwd_layout<T, BR, BC>(HSP);
    T* sQ = (T*)(smem + L.q);
    T* sK = (T*)(smem + L.k);
    T* sV = (T*)(smem + L.v);
    float* sS = (float*)(smem + L.s);
    T* sP = (T*)(smem + L.p);
    float* sO = (float*)(smem + L.o);
    float* sM = (float*)(smem + L.m);
    float* sL = (float*)(smem + L.l);
    float* sA = (float*)(smem + L.a);
    const int ldt = HSP + pad<T>(), lds = BC + 4, ldp = BC + pad<T>(), ldo = HSP + 4;

    const int qt = gridDim.x - 1 - blockIdx.x;  // heaviest (last) query tiles first
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), NQKV = NH + 2 * NKV;
    const int q0 = qt * BR;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;

    load_rows(sQ, ldt, qkv_q, b, h, q0, BR, T_, NQKV, HS, HSP);
    for (int idx = threadIdx.x; idx < BR * HSP; idx += blockDim.x) sO[(idx / HSP) * ldo + idx % HSP] = 0.0f;
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
        sM[r] = -INFINITY;
        sL[r] = 0.0f;
    }
    __syncthreads();  // sM, sL and sO as set above, also when no key is visible (the loop does not run)
    // keys [0, kv_end) can be seen by this tile (its last row sees the most)
    const int kv_end = visible(kp, Tk, qp.at(min(T_, q0 + BR) - 1));
    for (int k0 = 0; k0 < kv_end; k0 += BC) {
        load_rows(sK, ldt, qkv_kv, b, NH + kvh, k0, BC, Tk, NQKV, HS, HSP);
        load_rows(sV, ldt, qkv_kv, b, NH + NKV + kvh, k0, BC, Tk, NQKV, HS, HSP);
        __syncthreads();
        block_mm<T, false, true>(sS, lds, sQ, ldt, sK, ldt, BR, BC, HSP, false);  // S = Q K^T
        __syncthreads();
        for (int r = warp; r < BR; r += nwarps) {
            const int qi = q0 + r;
            const int seen = qi < T_ ? visible(kp, kv_end, qp.at(qi)) : 0;  // keys [0, seen) visible
            float mx = -INFINITY;
            for (int c = lane; c < BC; c += 32) {
                const int kj = k0 + c;
                if (kj < seen) mx = fmaxf(mx, sS[r * lds + c] * scale);
            }
            mx = warp_max(mx);
            const float m_old = sM[r];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int c = lane; c < BC; c += 32) {
                const int kj = k0 + c;
                float p = 0.0f;
                if (kj < seen) p = expf(sS[r * lds + c] * scale - m_new);
                sP[r * ldp + c] = from_f32<T>(p);
                sum += p;
            }
            sum = warp_sum(sum);
            // every lane has read sM[r] and sL[r] above: a shuffle orders no memory access, so
            // lane 0's write waits at the warp barrier (compute-sanitizer racecheck, H200: 1024
            // read-then-write hazards here without it)
            __syncwarp();
            if (lane == 0) {
                const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                sL[r] = sL[r] * alpha + sum;
                sM[r] = m_new;
                sA[r] = alpha;
            }
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < BR * HSP; idx += blockDim.x) sO[(idx / HSP) * ldo + idx % HSP] *= sA[idx / HSP];
        __syncthreads();
        block_mm<T, false, false>(sO, ldo, sP, ldp, sV, ldt, BR, HSP, BC, true);  // O += P V
        __syncthreads();
    }
    // a row that saw no key (sL 0: only in the block form): out 0, lse -inf
    for (int idx = threadIdx.x; idx < BR * HS; idx += blockDim.x) {
        const int r = idx / HS, d = idx % HS, t = q0 + r;
        if (t < T_)
            out[(((long long)b * T_ + t) * NH + h) * HS + d] = from_f32<T>(sL[r] > 0.0f ? sO[r * ldo + d] / sL[r] : 0.0f);
    }
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
        const int t = q0 + r;
        if (t < T_) lse[((long long)b * NH + h) * T_ + t] = sL[r] > 0.0f ? sM[r] + logf(sL[r]) : -INFINITY;
    }
}

// Merge of a block's (blk_out, blk_lse) into the running (out, lse) by log-sum-exp; one warp
// per (b, t, h) row. Rows whose blk_lse is -inf are left as they are.
template <class T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* blk_out, const float* blk_lse, int B, int T_,
                                       int NH, int HS) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);  // (b, t, h)
    const int lane = threadIdx.x & 31;
    if (row >= (long long)B * T_ * NH) return;
    const int h = (int)(row % NH);
    const long long bt = row / NH;
    const int t = (int)(bt % T_), b = (int)(bt / T_);
    const long long li = ((long long)b * NH + h) * T_ + t;
    const float la = lse[li], lb = blk_lse[li];
    if (lb == -INFINITY) return;
    T* o = out + row * HS;
    const T* ob = blk_out + row * HS;
    float wa = 0.0f, wb = 1.0f, L = lb;
    if (la != -INFINITY) {
        const float mx = fmaxf(la, lb);
        L = mx + logf(expf(la - mx) + expf(lb - mx));
        wa = expf(la - L);
        wb = expf(lb - L);
    }
    for (int d = lane; d < HS; d += 32)  // a running row without keys so far takes the block's as it is
        o[d] = la == -INFINITY ? ob[d] : from_f32<T>(wa * to_f32(o[d]) + wb * to_f32(ob[d]));
    __syncwarp();  // every lane has read la before lane 0 overwrites it
    if (lane == 0) lse[li] = L;
}

// ---------------- backward ----------------
// D[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d]: G lanes per (b, t, h) row (G a power of
// two dividing the row's HS / K packs, at most 32), each summing its packs of K elements (16-byte
// loads where pack_width allows), then the G lanes' sums by xor shuffles. One warp per row read
// 4 bytes a lane at head size 64 (the H200: 1.05 ms of a 69.3 ms 124M B=32 step, ~1.1 TB/s).
template <class T, int K>
__global__ void attention_backward_d_kernel(float* D, const T* dout, const T* out, int B, int T_, int NH, int HS,
                                            int G) {
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G;
    const int j = threadIdx.x % G;
    const bool ok = row < (long long)B * T_ * NH;
    float s = 0.0f;
    if (ok)
        for (int d = j * K; d < HS; d += G * K) {
            const Pack<T, K> a = load_pack<K>(dout + row * HS + d), o = load_pack<K>(out + row * HS + d);
            LLMC_UNROLL
            for (int e = 0; e < K; e++) s += to_f32(a.v[e]) * to_f32(o.v[e]);
        }
    for (int off = G / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (ok && j == 0) {
        const int h = (int)(row % NH);
        const long long bt = row / NH;
        D[((long long)(bt / T_) * NH + h) * T_ + (int)(bt % T_)] = s;
    }
}
template <class T>
void launch_attention_backward_d(float* D, const T* dout, const T* out, int B, int T_, int NH, int HS,
                                 cudaStream_t st) {
    const long long rows = (long long)B * T_ * NH;
    with_pack_width<T>(pack_width<T>(HS, {dout, out}), [&](auto k) {
        constexpr int K = decltype(k)::value;
        const int packs = HS / K;
        int G = 1;
        while (G < 32 && packs % (2 * G) == 0) G *= 2;
        auto kernel = attention_backward_d_kernel<T, K>;  // one name for the launch macro
        LLMC_LAUNCH(kernel, ceil_div(rows * G, 256), 256, 0, st, D, dout, out, B, T_, NH, HS, G);
    });
    CUDA_CHECK_LAUNCH();
}

struct BwdLayout {
    size_t k, v, q, dout, s, dp, p, ds, acc1, acc2, lse, d, total;
};
// acc1/acc2: dK/dV (key-tile kernel, BC rows) or dQ (query-tile kernel, BR rows, acc2 unused)
template <class T, int BR, int BC>
__host__ __device__ inline BwdLayout bwd_layout(int HS) {
    const int ldt = HS + pad<T>(), lds = BC + 4, ldp = BC + pad<T>(), ldo = HS + 4;
    const int RA = BR > BC ? BR : BC;
    BwdLayout L;
    size_t off = 0;
    L.k = off; off = align128(off + (size_t)BC * ldt * sizeof(T));
    L.v = off; off = align128(off + (size_t)BC * ldt * sizeof(T));
    L.q = off; off = align128(off + (size_t)BR * ldt * sizeof(T));
    L.dout = off; off = align128(off + (size_t)BR * ldt * sizeof(T));
    L.s = off; off = align128(off + (size_t)BR * lds * sizeof(float));
    L.dp = off; off = align128(off + (size_t)BR * lds * sizeof(float));
    L.p = off; off = align128(off + (size_t)BR * ldp * sizeof(T));
    L.ds = off; off = align128(off + (size_t)BR * ldp * sizeof(T));
    L.acc1 = off; off = align128(off + (size_t)RA * ldo * sizeof(float));
    L.acc2 = off; off = align128(off + (size_t)RA * ldo * sizeof(float));
    L.lse = off; off = align128(off + BR * sizeof(float));
    L.d = off; off = align128(off + BR * sizeof(float));
    L.total = off;
    return L;
}

// For the query tile [q0, q0+BR) x key tile [k0, k0+BC) already in smem: S and dP via mma,
// then P = exp(scale*S - lse) (causal mask) and dS = P * (dP - D).
template <class T, int BR, int BC>
__device__ __forceinline__ void bwd_tile_probs(const BwdLayout& L, char* smem, int HSP, int q0, int k0, int T_,
                                               int Tk, float scale, SeqPositions qp, SeqPositions kp) {
    const int ldt = HSP + pad<T>(), lds = BC + 4, ldp = BC + pad<T>();
    T* sK = (T*)(smem + L.k);
    T* sV = (T*)(smem + L.v);
    T* sQ = (T*)(smem + L.q);
    T* sDO = (T*)(smem + L.dout);
    float* sS = (float*)(smem + L.s);
    float* sDP = (float*)(smem + L.dp);
    T* sP = (T*)(smem + L.p);
    T* sDS = (T*)(smem + L.ds);
    const float* sLse = (const float*)(smem + L.lse);
    const float* sD = (const float*)(smem + L.d);
    block_mm<T, false, true>(sS, lds, sQ, ldt, sK, ldt, BR, BC, HSP, false);    // S = Q K^T
    block_mm<T, false, true>(sDP, lds, sDO, ldt, sV, ldt, BR, BC, HSP, false);  // dP = dO V^T
    __syncthreads();
    for (int idx = threadIdx.x; idx < BR * BC; idx += blockDim.x) {
        const int r = idx / BC, c = idx % BC, qi = q0 + r, kj = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (qi < T_ && kj < Tk && kp.at(kj) <= qp.at(qi)) {
            p = expf(sS[r * lds + c] * scale - sLse[r]);
            ds = p * (sDP[r * lds + c] - sD[r]);
        }
        sP[r * ldp + c] = from_f32<T>(p);
        sDS[r * ldp + c] = from_f32<T>(ds);
    }
    __syncthreads();
}

template <class T, int BR>
__device__ __forceinline__ void load_lse_d(float* sLse, float* sD, const float* lse, const float* D, int b, int h,
                                           int q0, int T_, int NH) {
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
        const int t = q0 + r;
        const long long i = ((long long)b * NH + h) * T_ + t;
        sLse[r] = t < T_ ? lse[i] : 0.0f;
        sD[r] = t < T_ ? D[i] : 0.0f;
    }
}

// dK, dV for key tile blockIdx.x of key/value head blockIdx.y: sums over the query heads of
// its group in increasing order and, for each, over the query tiles q0 >= k0 in increasing order.
template <class T, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(T* dkv, const T* dout, const T* qkv_q, const T* qkv_kv, const float* lse,
                                   const float* D, int T_, int Tk, int NH, int NKV, int HS, int HSP, float scale,
                                   SeqPositions qp, SeqPositions kp, bool accumulate) {
    LLMC_EXTERN_SMEM(char, smem);
    const BwdLayout L = bwd_layout<T, BR, BC>(HSP);
    const int ldt = HSP + pad<T>(), ldp = BC + pad<T>(), ldo = HSP + 4;
    T* sK = (T*)(smem + L.k);
    T* sV = (T*)(smem + L.v);
    T* sQ = (T*)(smem + L.q);
    T* sDO = (T*)(smem + L.dout);
    T* sP = (T*)(smem + L.p);
    T* sDS = (T*)(smem + L.ds);
    float* sDK = (float*)(smem + L.acc1);
    float* sDV = (float*)(smem + L.acc2);
    const int kt = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int group = NH / NKV, NQKV = NH + 2 * NKV;
    const int k0 = kt * BC;

    load_rows(sK, ldt, qkv_kv, b, NH + kvh, k0, BC, Tk, NQKV, HS, HSP);
    load_rows(sV, ldt, qkv_kv, b, NH + NKV + kvh, k0, BC, Tk, NQKV, HS, HSP);
    for (int idx = threadIdx.x; idx < BC * HSP; idx += blockDim.x) {
        sDK[(idx / HSP) * ldo + idx % HSP] = 0.0f;
        sDV[(idx / HSP) * ldo + idx % HSP] = 0.0f;
    }
    __syncthreads();  // sDK and sDV zeroed, also for a key tile no query sees (the loops do not run)
    // the query rows that see key row k0 (and so any row of the tile) and all after them: the
    // first tile holding the first of them onwards
    const int first_q = first_query(qp, T_, kp.at(k0));
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        for (int q0 = (first_q / BR) * BR; q0 < T_; q0 += BR) {
            load_rows(sQ, ldt, qkv_q, b, h, q0, BR, T_, NQKV, HS, HSP);
            load_rows_bthd(sDO, ldt, dout, b, h, q0, BR, T_, NH, HS, HSP);
            load_lse_d<T, BR>((float*)(smem + L.lse), (float*)(smem + L.d), lse, D, b, h, q0, T_, NH);
            __syncthreads();
            bwd_tile_probs<T, BR, BC>(L, smem, HSP, q0, k0, T_, Tk, scale, qp, kp);
            block_mm<T, true, false>(sDV, ldo, sP, ldp, sDO, ldt, BC, HSP, BR, true);  // dV += P^T dO
            block_mm<T, true, false>(sDK, ldo, sDS, ldp, sQ, ldt, BC, HSP, BR, true);  // dK += dS^T Q
            __syncthreads();
        }
    }
    const long long stride = (long long)NQKV * HS;
    T* dk = dkv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    T* dv = dkv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    for (int idx = threadIdx.x; idx < BC * HS; idx += blockDim.x) {
        const int r = idx / HS, d = idx % HS, t = k0 + r;
        if (t < Tk) {
            const long long i = (long long)t * stride + d;
            const float gk = sDK[r * ldo + d] * scale, gv = sDV[r * ldo + d];
            dk[i] = from_f32<T>(accumulate ? to_f32(dk[i]) + gk : gk);
            dv[i] = from_f32<T>(accumulate ? to_f32(dv[i]) + gv : gv);
        }
    }
}

// dQ for query tile blockIdx.x of query head blockIdx.y; loops over key tiles k0 <= last
// query in increasing order.
template <class T, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(T* dq_dst, const T* dout, const T* qkv_q, const T* qkv_kv, const float* lse,
                                 const float* D, int T_, int Tk, int NH, int NKV, int HS, int HSP, float scale,
                                 SeqPositions qp, SeqPositions kp, bool accumulate) {
    LLMC_EXTERN_SMEM(char, smem);
    const BwdLayout L = bwd_layout<T, BR, BC>(HSP);
    const int ldt = HSP + pad<T>(), ldp = BC + pad<T>(), ldo = HSP + 4;
    T* sK = (T*)(smem + L.k);
    T* sQ = (T*)(smem + L.q);
    T* sDO = (T*)(smem + L.dout);
    T* sDS = (T*)(smem + L.ds);
    float* sDQ = (float*)(smem + L.acc1);
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (NH / NKV), NQKV = NH + 2 * NKV;
    const int q0 = qt * BR;

    load_rows(sQ, ldt, qkv_q, b, h, q0, BR, T_, NQKV, HS, HSP);
    load_rows_bthd(sDO, ldt, dout, b, h, q0, BR, T_, NH, HS, HSP);
    load_lse_d<T, BR>((float*)(smem + L.lse), (float*)(smem + L.d), lse, D, b, h, q0, T_, NH);
    for (int idx = threadIdx.x; idx < BR * HSP; idx += blockDim.x) sDQ[(idx / HSP) * ldo + idx % HSP] = 0.0f;
    __syncthreads();  // sDQ zeroed, also for a query tile that sees no key (the loop does not run)
    const int kv_end = visible(kp, Tk, qp.at(min(T_, q0 + BR) - 1));
    for (int k0 = 0; k0 < kv_end; k0 += BC) {
        load_rows(sK, ldt, qkv_kv, b, NH + kvh, k0, BC, Tk, NQKV, HS, HSP);
        load_rows((T*)(smem + L.v), ldt, qkv_kv, b, NH + NKV + kvh, k0, BC, Tk, NQKV, HS, HSP);
        __syncthreads();
        bwd_tile_probs<T, BR, BC>(L, smem, HSP, q0, k0, T_, Tk, scale, qp, kp);
        block_mm<T, false, false>(sDQ, ldo, sDS, ldp, sK, ldt, BR, HSP, BC, true);  // dQ += dS K
        __syncthreads();
    }
    const long long stride = (long long)NQKV * HS;
    T* dq = dq_dst + (long long)b * T_ * stride + (long long)h * HS;
    for (int idx = threadIdx.x; idx < BR * HS; idx += blockDim.x) {
        const int r = idx / HS, d = idx % HS, t = q0 + r;
        if (t < T_) {
            const long long i = (long long)t * stride + d;
            const float g = sDQ[r * ldo + d] * scale;
            dq[i] = from_f32<T>(accumulate ? to_f32(dq[i]) + g : g);
        }
    }
}

// ---------------- host launchers ----------------
// Any head size: the tiles hold HSP = HS rounded up to 16 columns, the padding zero (it adds
// nothing to Q K^T, and the padded columns of O, dK, dV, dQ are never written). The scale is
// 1/sqrt(HS). Tile sizes: the largest of the candidates whose shared memory the device allows
// (sm_80 / sm_90 ~227 KiB per block, sm_86 / sm_89 ~99 KiB): forward bf16/fp16 64x64, then 32x32,
// then 16x16 (fp32 from 32x32); backward 32x32, then 16x16 (fp32 then 8x8).
inline int padded_hs(int HS) { return (HS + 15) / 16 * 16; }

// Opts fn in to `bytes` of dynamic shared memory; false when the device allows less.
inline bool fits_smem(const void* fn, size_t bytes) {
    int optin = 0;
    return opt_in_smem(fn, bytes, &optin);
}
[[noreturn]] inline void too_wide(const char* what, int HS, size_t bytes) {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    char msg[256];  // (snprintf, not strfmt: dev/cuda links this header without libllmc)
    std::snprintf(msg, sizeof msg,
                  "model: head size %d is too large for the CUDA attention %s (%zu bytes of shared memory per "
                  "block at its smallest tile; this GPU allows %d)",
                  HS, what, bytes, optin);
    throw UserError(msg);
}

// The general forward (any dtype, any head size): attention_block_forward's fallback, and
// dev/cuda/attention_forward.cu's version 3.
template <class T>
void attention_block_forward_general(T* out, float* lse, const T* qkv_q, const T* qkv_kv, int B, int Tq, int Tk,
                                     int NH, int NKV, int HS, SeqPositions qp, SeqPositions kp, cudaStream_t st) {
    const int HSP = padded_hs(HS);
    const float scale = 1.0f / sqrtf((float)HS);
    auto launch = [&](auto fn, int BR, size_t smem) {
        LLMC_LAUNCH(fn, dim3(ceil_div(Tq, BR), NH, B), kThreads, smem, st, out, lse, qkv_q, qkv_kv, Tq, Tk, NH, NKV,
                    HS, HSP, scale, qp, kp);
        CUDA_CHECK_LAUNCH();
    };
    const size_t big = fwd_layout<T, 64, 64>(HSP).total, mid = fwd_layout<T, 32, 32>(HSP).total,
                 small = fwd_layout<T, 16, 16>(HSP).total;
    if (is_half_type<T> && fits_smem((const void*)attention_forward_kernel<T, 64, 64>, big))
        launch(attention_forward_kernel<T, 64, 64>, 64, big);
    else if (fits_smem((const void*)attention_forward_kernel<T, 32, 32>, mid))
        launch(attention_forward_kernel<T, 32, 32>, 32, mid);
    else if (fits_smem((const void*)attention_forward_kernel<T, 16, 16>, small))
        launch(attention_forward_kernel<T, 16, 16>, 16, small);
    else
        too_wide("forward", HS, small);
}

// the entry points (declared in attention_ops.h)
template <class T>
void attention_block_forward(T* out, float* lse, const T* qkv_q, const T* qkv_kv, int B, int Tq, int Tk, int NH,
                             int NKV, int HS, SeqPositions qp, SeqPositions kp, cudaStream_t st,
                             const KernelWays& ways) {
    if constexpr (is_half_type<T>) {  // the tensor-core path (bf16, fp16), where it covers HS
        if (flash::forward(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, HS, qp, kp, st, ways.fwd_rows_per_warp,
                           ways.fwd_key_tile, ways.fwd_wgmma, ways.wgmma_mn))
            return;
    }
    attention_block_forward_general(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, HS, qp, kp, st);
}

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int HS, cudaStream_t st,
                       const KernelWays& ways) {
    attention_block_forward(out, lse, qkv, qkv, B, T_, T_, NH, NKV, HS, SeqPositions(), SeqPositions(), st, ways);
}

template <class T>
void attention_merge(T* out, float* lse, const T* blk_out, const float* blk_lse, int B, int T_, int NH, int HS,
                     cudaStream_t st) {
    const long long rows = (long long)B * T_ * NH;
    LLMC_LAUNCH(attention_merge_kernel<T>, ceil_div(rows, 8), 256, 0, st, out, lse, blk_out, blk_lse, B, T_, NH, HS);
    CUDA_CHECK_LAUNCH();
}

template <class T>
void attention_block_backward(T* dq_dst, T* dkv, const T* dout, const T* qkv_q, const T* qkv_kv, const T* out,
                              const float* lse, float* D, int B, int Tq, int Tk, int NH, int NKV, int HS,
                              SeqPositions qp, SeqPositions kp, bool accumulate, cudaStream_t st,
                              const KernelWays& ways, GrowBuffer* ds_scratch) {
    launch_attention_backward_d(D, dout, out, B, Tq, NH, HS, st);
    if constexpr (is_half_type<T>) {  // the tensor-core path (bf16, fp16), where it covers HS
        if (ways.flash_backward && flash::backward(dq_dst, dkv, dout, qkv_q, qkv_kv, lse, D, B, Tq, Tk, NH, NKV, HS,
                                                   qp, kp, accumulate, st, ways, ds_scratch))
            return;
    }
    const int HSP = padded_hs(HS);
    const float scale = 1.0f / sqrtf((float)HS);
    auto launch = [&](auto fkv, auto fq, int BR, int BC, size_t smem) {
        LLMC_LAUNCH(fkv, dim3(ceil_div(Tk, BC), NKV, B), kThreads, smem, st, dkv, dout, qkv_q, qkv_kv, lse, D, Tq, Tk,
                    NH, NKV, HS, HSP, scale, qp, kp, accumulate);
        CUDA_CHECK_LAUNCH();
        LLMC_LAUNCH(fq, dim3(ceil_div(Tq, BR), NH, B), kThreads, smem, st, dq_dst, dout, qkv_q, qkv_kv, lse, D, Tq, Tk,
                    NH, NKV, HS, HSP, scale, qp, kp, accumulate);
        CUDA_CHECK_LAUNCH();
    };
    const size_t big = bwd_layout<T, 32, 32>(HSP).total, small = bwd_layout<T, 16, 16>(HSP).total;
    if (fits_smem((const void*)attention_backward_dkdv_kernel<T, 32, 32>, big) &&
        fits_smem((const void*)attention_backward_dq_kernel<T, 32, 32>, big))
        launch(attention_backward_dkdv_kernel<T, 32, 32>, attention_backward_dq_kernel<T, 32, 32>, 32, 32, big);
    else if (fits_smem((const void*)attention_backward_dkdv_kernel<T, 16, 16>, small) &&
             fits_smem((const void*)attention_backward_dq_kernel<T, 16, 16>, small))
        launch(attention_backward_dkdv_kernel<T, 16, 16>, attention_backward_dq_kernel<T, 16, 16>, 16, 16, small);
    else if constexpr (std::is_same<T, float>::value) {  // fp32 (plain FMA tiles) goes down to 8 rows
        const size_t tiny = bwd_layout<T, 8, 8>(HSP).total;
        if (fits_smem((const void*)attention_backward_dkdv_kernel<T, 8, 8>, tiny) &&
            fits_smem((const void*)attention_backward_dq_kernel<T, 8, 8>, tiny))
            launch(attention_backward_dkdv_kernel<T, 8, 8>, attention_backward_dq_kernel<T, 8, 8>, 8, 8, tiny);
        else
            too_wide("backward", HS, tiny);
    } else
        too_wide("backward", HS, small);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* D, int B,
                        int T_, int NH, int NKV, int HS, cudaStream_t st, const KernelWays& ways,
                        GrowBuffer* ds_scratch) {
    attention_block_backward(dqkv, dqkv, dout, qkv, qkv, out, lse, D, B, T_, T_, NH, NKV, HS, SeqPositions(),
                             SeqPositions(), false, st, ways, ds_scratch);
}

}  // namespace attn
