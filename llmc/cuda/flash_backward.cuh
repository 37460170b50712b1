// Attention backward in the FlashAttention-2 design, bf16 or fp16 (E), for the head sizes of the flash
// forward (llmc/cuda/flash_attention.cuh: its notation, tiles and helpers). Recomputes P from
// the forward's lse; D = rowsum(dO * O) comes from attention.cuh's D kernel. Deterministic, no
// atomics: two kernels, each owning what it writes.
//  - dK, dV: one block per (key tile of 64 MT rows, key/value head, batch), each warp MT m-tiles
//    of 16 key rows (MT 2 at head size 32, and at 64 on request: each Q and dO fragment a warp
//    loads then feeds twice the mma, the forward's two m-tiles for the same reason), in the
//    transposed orientation: S^T = K Q^T and dP^T = V dO^T in registers (K, V fragments by
//    ldmatrix, Q, dO as B by ldmatrix), P^T = exp2(S^T scale log2e - lse log2e), dS^T =
//    P^T (dP^T - D), then dV += P^T dO and dK += dS^T Q with P^T, dS^T rounded straight from the
//    accumulators into A registers (dO, Q by ldmatrix.trans). The query tiles stream through a
//    cp.async double buffer in a fixed order: the heads of the group in order, each from the
//    first query tile that sees the key tile to the last (a tile's columns in passes of QH where
//    asked: KernelWays::bwd_pass, the choice at head size 64). Heaviest key tiles (the first, under the
//    causal mask) first.
//  - dQ: one block per (query tile of 64 MT rows, head, batch), each warp MT m-tiles of 16 query
//    rows (MT as dK/dV's), as the forward: S = Q K^T, dP = dO V^T, dS =
//    P (dP - D), dQ += dS K (K by ldmatrix.trans), key tiles in order.
// Block form as the forward (positions qp, kp); accumulate: += into dq_dst / dkv (else =).
#pragma once
#include <algorithm>
#include <climits>

#include "llmc/cuda/flash_attention.cuh"

namespace flash {

constexpr float kLog2e = 1.4426950408889634f;

// rows (and row length) of the dS^T scratch of one head: n rounded up to whole 64-row tiles
__host__ __device__ __forceinline__ int ds_rows(int n) { return (n + 63) / 64 * 64; }

// Step i of n through a cp.async double buffer (buffer i & 1) whose copies `issue(j, buf)` starts:
// starts step i + 1's into the other buffer, waits for step i's, then a block barrier (the
// caller's barrier at the end of step i keeps step i + 1 from overwriting a buffer being read).
template <class F>
__device__ __forceinline__ void stream_step(int i, int n, F&& issue) {
    if (i + 1 < n) {
        issue(i + 1, (i + 1) & 1);
        ptx::cp_async_commit();
        ptx::cp_async_wait<1>();
    } else {
        ptx::cp_async_wait<0>();
    }
    __syncthreads();
}

// K [BK][LD], V [BK][LD] (BK = kBR MT key rows), Q [2][BQ][LD], dO [2][BQ][LD] (E), lse [2][BQ],
// D [2][BQ] (16-byte aligned)
template <int HS, int BQ, int MT> struct DkdvSmem {
    static constexpr int LD = HS + 8, BK = kBR * MT;
    static constexpr size_t k = 0, v = k + (size_t)BK * LD * 2, q = v + (size_t)BK * LD * 2,
                            dO = q + (size_t)2 * BQ * LD * 2, lse = dO + (size_t)2 * BQ * LD * 2,
                            d = lse + (size_t)2 * BQ * 4, total = d + (size_t)2 * BQ * 4;
    template <class E> struct Tiles {  // the tiles' places in a block's shared memory
        E *k, *v, *q, *dO;
        float *lse, *d;
    };
    template <class E> __device__ __forceinline__ static Tiles<E> tiles(char* smem) {
        return {reinterpret_cast<E*>(smem + k),       reinterpret_cast<E*>(smem + v),
                reinterpret_cast<E*>(smem + q),       reinterpret_cast<E*>(smem + dO),
                reinterpret_cast<float*>(smem + lse), reinterpret_cast<float*>(smem + d)};
    }
};

// one E pair of rows r of a [*, HS] head (row stride `stride`): = or += v * scale
template <class E>
__device__ __forceinline__ void store_pair(E* p, float x, float y, bool accumulate) {
    if (accumulate) {
        const uint32_t old = *reinterpret_cast<const uint32_t*>(p);
        x += ptx::lo16<E>(old);
        y += ptx::hi16<E>(old);
    }
    *reinterpret_cast<uint32_t*>(p) = ptx::pack2<E>(x, y);
}

// The lse and D of query rows [q0, q0 + BQ) from lse + l0 and D + l0 into sL and sD, 4 rows a 16-byte
// cp.async (not committed; beside the tile's Q and dO: a plain load here would stall its warp for
// the global latency every tile); rows past Tq and unaligned chunks element by element (past Tq: 0).
// NTH: the block's threads.
template <int BQ, int NTH = kThreads>
__device__ __forceinline__ void load_lse_d(float* sL, float* sD, const float* lse, const float* D, long long l0, int q0,
                                           int Tq) {
    for (int idx = threadIdx.x; idx < 2 * (BQ / 4); idx += NTH) {
        const int r = (idx % (BQ / 4)) * 4;
        const float* src = (idx < BQ / 4 ? lse : D) + l0 + r;
        float* dst = (idx < BQ / 4 ? sL : sD) + r;
        if (q0 + r + 4 <= Tq && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
            ptx::cp_async_16(dst, src);
        } else {
            for (int e = 0; e < 4; e++) dst[e] = q0 + r + e < Tq ? src[e] : 0.0f;
        }
    }
}

// The copies (cp.async, not committed) of query tile [q0, q0 + BQ) of head h, batch b into buffer
// buf of a dK/dV kernel's shared memory (DkdvSmem): Q, dO, and their rows' lse and D.
template <int HS, int BQ, class E>
__device__ __forceinline__ void load_query_tile(E* sQ, E* sO, float* sL, float* sD, int buf, const E* qkv_q,
                                                const E* dout, const float* lse, const float* D, int b, int h, int q0,
                                                int Tq, int NH, long long stride, long long ostride) {
    constexpr int LD = HS + 8;
    load_tile<HS, BQ>(sQ + buf * BQ * LD, qkv_q + (long long)b * Tq * stride + (long long)h * HS, stride, q0, Tq);
    load_tile<HS, BQ>(sO + buf * BQ * LD, dout + (long long)b * Tq * ostride + (long long)h * HS, ostride, q0, Tq);
    load_lse_d<BQ>(sL + buf * BQ, sD + buf * BQ, lse, D, ((long long)b * NH + h) * Tq + q0, q0, Tq);
}

// This warp's dK (times scale) and dV of keys [kw0, kw0 + 16 MT), key/value head kvh, batch b, into
// dkv's k and v heads (= or +=).
template <int HS, int MT, class E>
__device__ __forceinline__ void store_dkdv(E* dkv, const float (&dk)[MT][HS / 8][4], const float (&dv)[MT][HS / 8][4],
                                           int b, int kvh, int kw0, int Tk, int NH, int NKV, float scale,
                                           bool accumulate) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const long long stride = (long long)(NH + 2 * NKV) * HS;
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int kj = kw0 + 16 * m + g + 8 * i;
            if (kj >= Tk) continue;
            E* dkr = dkv + ((long long)b * Tk + kj) * stride + (long long)(NH + kvh) * HS;
            E* dvr = dkv + ((long long)b * Tk + kj) * stride + (long long)(NH + NKV + kvh) * HS;
            LLMC_UNROLL
            for (int d = 0; d < HS / 8; d++) {
                store_pair(dkr + d * 8 + 2 * t, dk[m][d][2 * i] * scale, dk[m][d][2 * i + 1] * scale, accumulate);
                store_pair(dvr + d * 8 + 2 * t, dv[m][d][2 * i], dv[m][d][2 * i + 1], accumulate);
            }
        }
}

// Where a dK/dV kernel also keeps the dS^T it computes: nowhere, in memory for
// flash_backward_dq_ds_kernel (v7), or in shared memory for the dQ product of the fused kernel
// (llmc/cuda/flash_backward_fused.cuh, v8).
enum class DsTo { none, global, shared };

// dS^T's columns [c0, c1) of this warp's 16 MT key rows to 0, in the pattern the lane writes them
// (ds: at the lane's row g of the warp's first m-tile; row stride ld).
template <class E, int MT>
__device__ __forceinline__ void zero_ds_cols(E* ds, int ld, int c0, int c1) {
    const int t = threadIdx.x % 4;
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++)
            for (int c = c0 + 2 * t; c < c1; c += 8) *reinterpret_cast<uint32_t*>(ds + (16 * m + 8 * i) * ld + c) = 0;
}

// One query tile's share of this warp's dK and dV, the body of the dK/dV kernels: queries [q0,
// q0 + BQ) (Q tQ, dO tO, lse tL, D tD in shared memory) against the warp's keys [kw0, kw0 + 16 MT)
// (K sK, V sV in shared memory, the block's first key at row 0; kpos: the positions of the lane's
// rows, kfirst and klast: of the warp's first and last key), QH query columns at a time. DST: dS^T
// also to ds (at the lane's row g of m-tile 0 and query column q0; row stride ds_ld).
template <class E, int HS, int BQ, int MT, int QH, DsTo DST>
__device__ __forceinline__ void dkdv_query_tile(float (&dk)[MT][HS / 8][4], float (&dv)[MT][HS / 8][4],
                                                const E* sK, const E* sV, const E* tQ, const E* tO, const float* tL,
                                                const float* tD, int q0, int Tq, int Tk, int kw0, int kfirst,
                                                int klast, const int (&kpos)[MT][2], SeqPositions qp, float scale,
                                                E* ds, int ds_ld) {
    constexpr int LD = HS + 8, NT = QH / 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    (void)g;  // (DST global only)
    // A rows (K, V: m-tile m's 16 keys at + 16 m); B rows, non-transposed (Q, dO as K in the
    // forward) and transposed (dO, Q as V in the forward)
    const int arow = 16 * MT * warp + (lane & 7) + ((lane >> 3) & 1) * 8, acol = (lane >> 4) * 8;
    const int brow = (lane >> 4) * 8 + (lane & 7), bcol = ((lane >> 3) & 1) * 8;
    const int trow = (lane & 7) + ((lane >> 3) & 1) * 8, tcol = (lane >> 4) * 8;
    for (int pc = 0; pc < BQ; pc += QH) {  // the tile's columns [pc, pc + QH)
        if (q0 + pc >= Tq) {  // (the dS^T in shared memory: 0 past the last query)
            if constexpr (DST == DsTo::shared) zero_ds_cols<E, MT>(ds, ds_ld, pc, BQ);
            break;
        }
        if (qp.at(min(Tq, q0 + pc + QH) - 1) < kfirst) {  // none of them sees a key of the warp
            if constexpr (DST == DsTo::shared) zero_ds_cols<E, MT>(ds, ds_ld, pc, pc + QH);
            continue;
        }
        float s[MT][NT][4], dp[MT][NT][4];
        LLMC_UNROLL
        for (int m = 0; m < MT; m++)
            LLMC_UNROLL
            for (int j = 0; j < NT; j++)
                LLMC_UNROLL
                for (int e = 0; e < 4; e++) s[m][j][e] = dp[m][j][e] = 0.0f;
        LLMC_UNROLL
        for (int kc = 0; kc < HS / 16; kc++) {
            uint32_t ka[MT][4], va[MT][4];
            LLMC_UNROLL
            for (int m = 0; m < MT; m++) {
                ptx::ldmatrix_x4(ka[m], sK + (arow + 16 * m) * LD + acol + kc * 16);
                ptx::ldmatrix_x4(va[m], sV + (arow + 16 * m) * LD + acol + kc * 16);
            }
            LLMC_UNROLL
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                ptx::ldmatrix_x4(r, tQ + (pc + np * 16 + brow) * LD + bcol + kc * 16);
                LLMC_UNROLL
                for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(s[m][2 * np], s[m][2 * np + 1], ka[m], r);
                ptx::ldmatrix_x4(r, tO + (pc + np * 16 + brow) * LD + bcol + kc * 16);
                LLMC_UNROLL
                for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(dp[m][2 * np], dp[m][2 * np + 1], va[m], r);
            }
        }
        // P^T and dS^T (element of m-tile m: key row 16 m + g + 8 (e >> 1), query column
        // pc + j * 8 + 2t + (e & 1))
        const bool full = q0 + pc + QH <= Tq && klast <= qp.at(q0 + pc) && kw0 + 16 * MT <= Tk;
        LLMC_UNROLL
        for (int j = 0; j < NT; j++) {
            const float2 l2 = *reinterpret_cast<const float2*>(tL + pc + j * 8 + 2 * t);  // columns 2t, 2t + 1
            const float2 d2 = *reinterpret_cast<const float2*>(tD + pc + j * 8 + 2 * t);
            LLMC_UNROLL
            for (int m = 0; m < MT; m++)
                LLMC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int qi = q0 + pc + j * 8 + 2 * t + (e & 1);
                    const bool vis = full || (qi < Tq && kpos[m][e >> 1] <= qp.at(qi));
                    const float lc = (e & 1) ? l2.y : l2.x, dc = (e & 1) ? d2.y : d2.x;
                    const float p = vis ? ptx::exp2_ftz(fmaf(s[m][j][e], scale * kLog2e, -(lc * kLog2e))) : 0.0f;
                    s[m][j][e] = p;
                    dp[m][j][e] = p * (dp[m][j][e] - dc);
                }
        }
        // dV += P^T dO, dK += dS^T Q
        LLMC_UNROLL
        for (int kc = 0; kc < QH / 16; kc++) {
            uint32_t ap[MT][4], ad[MT][4];
            LLMC_UNROLL
            for (int m = 0; m < MT; m++) {
                ptx::acc_to_a<E>(ap[m], s[m][2 * kc], s[m][2 * kc + 1]);
                ptx::acc_to_a<E>(ad[m], dp[m][2 * kc], dp[m][2 * kc + 1]);
            }
            if constexpr (DST != DsTo::none) {  // A's registers: rows g, g + 8 by columns 2t, 2t + 8 (as pairs)
                LLMC_UNROLL
                for (int m = 0; m < MT; m++)
                    LLMC_UNROLL
                    for (int r = 0; r < 4; r++) {  // (in memory the keys before Tk; in shared memory all: 0 past it)
                        if (DST == DsTo::global && kw0 + 16 * m + g + 8 * (r & 1) >= Tk) continue;
                        const int o = (16 * m + 8 * (r & 1)) * ds_ld + pc + kc * 16 + 8 * (r >> 1) + 2 * t;
                        *reinterpret_cast<uint32_t*>(ds + o) = ad[m][r];
                    }
            }
            LLMC_UNROLL
            for (int d2 = 0; d2 < HS / 16; d2++) {
                uint32_t r[4];
                ptx::ldmatrix_x4_trans(r, tO + (pc + kc * 16 + trow) * LD + tcol + d2 * 16);
                LLMC_UNROLL
                for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(dv[m][2 * d2], dv[m][2 * d2 + 1], ap[m], r);
                ptx::ldmatrix_x4_trans(r, tQ + (pc + kc * 16 + trow) * LD + tcol + d2 * 16);
                LLMC_UNROLL
                for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(dk[m][2 * d2], dk[m][2 * d2 + 1], ad[m], r);
            }
        }
    }  // the column passes
}

// grid (B * NKV, ceil(Tk / (kBR MT))), kThreads threads, DkdvSmem<HS, BQ, MT>::total bytes. QH (a
// multiple of 16 dividing BQ): the query columns of a tile taken at once, in order (BQ: the whole
// tile; less: fewer live S^T and dP^T accumulators, the same sums in the same order)
// (Up to head size 64, 32 columns at once with one m-tile: three blocks an SM, 168 registers at
// most: at 170 ptxas's allocation, rounded up to 176, left room for two.) DS: also writes dS^T,
// rounded to E as dK's product takes it, into ds [B NH][ds_rows(Tk)][ds_rows(Tq)] (key-major) for
// flash_backward_dq_ds_kernel: every element some query sees of every tile it visits.
template <class E, int HS, int BQ, int MT, int QH = BQ, bool DS = false>
__global__ void __launch_bounds__(kThreads, HS <= 64 && MT == 1 && QH == 32 ? 3 : 0)
    flash_backward_dkdv_kernel(E* dkv, E* ds, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                               const float* D, int Tq, int Tk, int NH, int NKV, float scale, SeqPositions qp,
                               SeqPositions kp, bool accumulate) {
    using L = DkdvSmem<HS, BQ, MT>;
    constexpr int LD = L::LD, BK = L::BK, DT = HS / 8;
    static_assert(QH % 16 == 0 && BQ % QH == 0, "dK/dV: QH must be a multiple of 16 dividing BQ");
    LLMC_EXTERN_SMEM(char, smem);
    const auto sm = L::template tiles<E>(smem);

    const int kvh = blockIdx.x % NKV, b = blockIdx.x / NKV, group = NH / NKV;
    const int k0 = blockIdx.y * BK;  // the first key tiles see the most queries: first
    const long long stride = (long long)(NH + 2 * NKV) * HS, ostride = (long long)NH * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;

    // the (head, query tile) sequence: heads of the group in order, query tiles from the first
    // that holds a row seeing key k0
    const int first_q = first_query(qp, Tq, kp.at(k0));
    const int qt0 = first_q / BQ, nqt = first_q < Tq ? (Tq + BQ - 1) / BQ - qt0 : 0, n = group * nqt;
    auto issue = [&](int i, int buf) {
        load_query_tile<HS, BQ>(sm.q, sm.dO, sm.lse, sm.d, buf, qkv_q, dout, lse, D, b, kvh * group + i / nqt,
                                (qt0 + i % nqt) * BQ, Tq, NH, stride, ostride);
    };
    load_tile<HS, BK>(sm.k, Kg, stride, k0, Tk);
    load_tile<HS, BK>(sm.v, Vg, stride, k0, Tk);
    if (n > 0) issue(0, 0);
    ptx::cp_async_commit();

    // this warp's key rows [kw0, kw0 + 16 MT); m-tile m's lane rows: kw0 + 16 m + g, + 8
    const int kw0 = k0 + 16 * MT * warp;
    const bool active = kw0 < Tk;
    int kpos[MT][2];
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = kw0 + 16 * m + g + 8 * i;
            kpos[m][i] = r < Tk ? kp.at(r) : INT_MAX;
        }
    const int kfirst = active ? kp.at(kw0) : INT_MAX, klast = active ? kp.at(min(Tk, kw0 + 16 * MT) - 1) : INT_MAX;
    float dk[MT][DT][4], dv[MT][DT][4];
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int d = 0; d < DT; d++)
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) dk[m][d][e] = dv[m][d][e] = 0.0f;

    for (int i = 0; i < n; i++) {
        const int buf = i & 1, q0 = (qt0 + i % nqt) * BQ;
        // DS: the offset in ds of this tile's head at the warp's key row kw0 + g (m-tile 0's lane row)
        // and query q0 (int: try_backward caps the scratch at 2^30 elements)
        const int dso = DS ? ((b * NH + kvh * group + i / nqt) * ds_rows(Tk) + kw0 + g) * ds_rows(Tq) + q0 : 0;
        stream_step(i, n, issue);
        if (active && qp.at(min(Tq, q0 + BQ) - 1) >= kfirst) {  // some query of the tile sees a key of the warp
            dkdv_query_tile<E, HS, BQ, MT, QH, DS ? DsTo::global : DsTo::none>(
                dk, dv, sm.k, sm.v, sm.q + buf * BQ * LD, sm.dO + buf * BQ * LD, sm.lse + buf * BQ, sm.d + buf * BQ,
                q0, Tq, Tk, kw0, kfirst, klast, kpos, qp, scale, DS ? ds + dso : nullptr, ds_rows(Tq));
        }
        __syncthreads();  // the next iteration's prefetch overwrites this buffer
    }

    store_dkdv<HS, MT>(dkv, dk, dv, b, kvh, kw0, Tk, NH, NKV, scale, accumulate);
}

// Q [BR][LD], dO [BR][LD] (BR = kBR MT query rows), K [2][BC][LD], V [2][BC][LD]
template <int HS, int BC, int MT> struct DqSmem {
    static constexpr int LD = HS + 8, BR = kBR * MT;
    static constexpr size_t q = 0, dO = q + (size_t)BR * LD * 2, k = dO + (size_t)BR * LD * 2,
                            v = k + (size_t)2 * BC * LD * 2, total = v + (size_t)2 * BC * LD * 2;
};

// grid (B * NH, ceil(Tq / (kBR MT))), kThreads threads, DqSmem<HS, BC, MT>::total bytes
template <class E, int HS, int BC, int MT>
__global__ void __launch_bounds__(kThreads, HS <= 64 && BC == 64 && MT == 1 ? 3 : 0)
    flash_backward_dq_kernel(E* dq_dst, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                             const float* D, int Tq, int Tk, int NH, int NKV, float scale, SeqPositions qp,
                             SeqPositions kp, bool accumulate) {
    using L = DqSmem<HS, BC, MT>;
    constexpr int LD = L::LD, BR = L::BR, NT = BC / 8, DT = HS / 8;
    LLMC_EXTERN_SMEM(char, smem);
    E* sQ = reinterpret_cast<E*>(smem + L::q);
    E* sO = reinterpret_cast<E*>(smem + L::dO);
    E* sK = reinterpret_cast<E*>(smem + L::k);
    E* sV = reinterpret_cast<E*>(smem + L::v);

    const int h = blockIdx.x % NH, b = blockIdx.x / NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;  // heaviest (last) query tiles first
    const int kvh = h / (NH / NKV);
    const long long stride = (long long)(NH + 2 * NKV) * HS, ostride = (long long)NH * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    const int kv_end = visible(kp, Tk, qp.at(min(Tq, q0 + BR) - 1));
    const int ntiles = (kv_end + BC - 1) / BC;
    const int w0 = q0 + 16 * MT * warp;  // this warp's query rows [w0, w0 + 16 MT); m-tile m's: w0 + 16 m + g, + 8
    int seen[MT][2];
    float l2[MT][2], Dr[MT][2];
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = w0 + 16 * m + g + 8 * i;
            const long long li = ((long long)b * NH + h) * Tq + r;
            seen[m][i] = r < Tq ? visible(kp, kv_end, qp.at(r)) : kv_end;
            l2[m][i] = r < Tq ? lse[li] * kLog2e : 0.0f;
            Dr[m][i] = r < Tq ? D[li] : 0.0f;
        }
    const bool active = w0 < Tq;
    const int w_end = active ? visible(kp, kv_end, qp.at(min(Tq, w0 + 16 * MT) - 1)) : 0;
    const int w_full = active ? visible(kp, kv_end, qp.at(w0)) : 0;

    load_tile<HS, BR>(sQ, qkv_q + (long long)b * Tq * stride + (long long)h * HS, stride, q0, Tq);
    load_tile<HS, BR>(sO, dout + (long long)b * Tq * ostride + (long long)h * HS, ostride, q0, Tq);
    if (ntiles > 0) {
        load_tile<HS, BC>(sK, Kg, stride, 0, kv_end);
        load_tile<HS, BC>(sV, Vg, stride, 0, kv_end);
    }
    ptx::cp_async_commit();

    uint32_t qf[MT][HS / 16][4], of[MT][HS / 16][4];
    float dq[MT][DT][4];
    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int d = 0; d < DT; d++)
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) dq[m][d][e] = 0.0f;
    const int brow = (lane >> 4) * 8 + (lane & 7), bcol = ((lane >> 3) & 1) * 8;
    const int trow = (lane & 7) + ((lane >> 3) & 1) * 8, tcol = (lane >> 4) * 8;

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1, k0 = j * BC;
        kv_tile_ready<HS, BC>(sK, sV, Kg, Vg, stride, j, ntiles, kv_end);
        if (j == 0 && active) {
            const int off = (16 * MT * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
            LLMC_UNROLL
            for (int m = 0; m < MT; m++)
                LLMC_UNROLL
                for (int kc = 0; kc < HS / 16; kc++) {
                    ptx::ldmatrix_x4(qf[m][kc], sQ + off + 16 * m * LD + kc * 16);
                    ptx::ldmatrix_x4(of[m][kc], sO + off + 16 * m * LD + kc * 16);
                }
        }
        if (k0 < w_end) {
            const E* tK = sK + buf * BC * LD;
            const E* tV = sV + buf * BC * LD;
            float s[MT][NT][4], dp[MT][NT][4];
            LLMC_UNROLL
            for (int m = 0; m < MT; m++)
                LLMC_UNROLL
                for (int n = 0; n < NT; n++)
                    LLMC_UNROLL
                    for (int e = 0; e < 4; e++) s[m][n][e] = dp[m][n][e] = 0.0f;
            LLMC_UNROLL
            for (int kc = 0; kc < HS / 16; kc++)
                LLMC_UNROLL
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4(r, tK + (np * 16 + brow) * LD + bcol + kc * 16);
                    LLMC_UNROLL
                    for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(s[m][2 * np], s[m][2 * np + 1], qf[m][kc], r);
                    ptx::ldmatrix_x4(r, tV + (np * 16 + brow) * LD + bcol + kc * 16);
                    LLMC_UNROLL
                    for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(dp[m][2 * np], dp[m][2 * np + 1], of[m][kc], r);
                }
            const bool crossing = k0 + BC > w_full;
            LLMC_UNROLL
            for (int m = 0; m < MT; m++)
                LLMC_UNROLL
                for (int n = 0; n < NT; n++)
                    LLMC_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int i = e >> 1;
                        const bool vis = !crossing || k0 + n * 8 + 2 * t + (e & 1) < seen[m][i];
                        const float p = vis ? ptx::exp2_ftz(fmaf(s[m][n][e], scale * kLog2e, -l2[m][i])) : 0.0f;
                        dp[m][n][e] = p * (dp[m][n][e] - Dr[m][i]);
                    }
            LLMC_UNROLL
            for (int kc = 0; kc < BC / 16; kc++) {  // dQ += dS K
                uint32_t a[MT][4];
                LLMC_UNROLL
                for (int m = 0; m < MT; m++) {
                    ptx::acc_to_a<E>(a[m], dp[m][2 * kc], dp[m][2 * kc + 1]);
                }
                LLMC_UNROLL
                for (int d2 = 0; d2 < HS / 16; d2++) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4_trans(r, tK + (kc * 16 + trow) * LD + tcol + d2 * 16);
                    LLMC_UNROLL
                    for (int m = 0; m < MT; m++) ptx::mma_16816_x2<E>(dq[m][2 * d2], dq[m][2 * d2 + 1], a[m], r);
                }
            }
        }
        __syncthreads();
    }

    LLMC_UNROLL
    for (int m = 0; m < MT; m++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = w0 + 16 * m + g + 8 * i;
            if (r >= Tq) continue;
            E* row = dq_dst + ((long long)b * Tq + r) * stride + (long long)h * HS;
            LLMC_UNROLL
            for (int d = 0; d < DT; d++)
                store_pair(row + d * 8 + 2 * t, dq[m][d][2 * i] * scale, dq[m][d][2 * i + 1] * scale, accumulate);
        }
}

// dS^T [64 keys][64 queries] (E) and K [64][LD], both double-buffered
template <int HS> struct DqDsSmem {
    static constexpr int LD = HS + 8, LDS = 64 + 8;
    static constexpr size_t s = 0, k = s + (size_t)2 * 64 * LDS * 2, total = k + (size_t)2 * 64 * LD * 2;
};

// dQ = dS K from the dS^T that flash_backward_dkdv_kernel<..., DS = true> wrote: one product a key
// tile where the dQ kernel above recomputes S and dP for it (three). grid (B * NH, ceil(Tq / 64)),
// kThreads threads, DqDsSmem<HS>::total bytes; each warp 16 query rows, its dS rows by
// ldmatrix.trans from the key-major tile. The scratch holds nothing where no query sees the key
// (tiles the dK/dV kernel skipped, or a warp's skipped columns): each warp zeroes those of its
// rows in the tiles that cross its diagonal before reading them.
template <class E, int HS>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_ds_kernel(E* dq_dst, const E* ds, const E* qkv_kv, int Tq, int Tk, int NH, int NKV,
                                float scale, SeqPositions qp, SeqPositions kp, bool accumulate) {
    using L = DqDsSmem<HS>;
    constexpr int LD = L::LD, LDS = L::LDS, DT = HS / 8;
    LLMC_EXTERN_SMEM(char, smem);
    E* sS = reinterpret_cast<E*>(smem + L::s);
    E* sK = reinterpret_cast<E*>(smem + L::k);

    const int h = blockIdx.x % NH, b = blockIdx.x / NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * 64;  // heaviest (last) query tiles first
    const int kvh = h / (NH / NKV);
    const long long stride = (long long)(NH + 2 * NKV) * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Sg = ds + ((long long)b * NH + h) * ds_rows(Tk) * ds_rows(Tq) + q0;  // row k: + k ds_rows(Tq)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    const int kv_end = visible(kp, Tk, qp.at(min(Tq, q0 + 64) - 1));
    const int ntiles = (kv_end + 63) / 64;
    const int w0 = q0 + 16 * warp;  // this warp's query rows [w0, w0 + 16)
    const bool active = w0 < Tq;
    int seen[2];  // the keys rows g and g + 8 see
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = w0 + g + 8 * i;
        seen[i] = r < Tq ? visible(kp, kv_end, qp.at(r)) : kv_end;
    }
    const int w_end = active ? visible(kp, kv_end, qp.at(min(Tq, w0 + 16) - 1)) : 0;
    const int w_full = active ? visible(kp, kv_end, qp.at(w0)) : 0;

    auto issue = [&](int j, int buf) {
        load_tile<64, 64>(sS + buf * 64 * LDS, Sg, ds_rows(Tq), j * 64, kv_end);
        load_tile<HS, 64>(sK + buf * 64 * LD, Kg, stride, j * 64, kv_end);
    };
    if (ntiles > 0) issue(0, 0);
    ptx::cp_async_commit();

    float dq[DT][4];
    LLMC_UNROLL
    for (int d = 0; d < DT; d++)
        LLMC_UNROLL
        for (int e = 0; e < 4; e++) dq[d][e] = 0.0f;
    // A (dS, 16 queries x 16 keys) from the key-major tile by ldmatrix.trans: matrix i = lane / 8
    // holds keys 8 (i / 2) + lane % 8, queries 8 (i % 2) onwards; B (K) as the dQ kernel's
    const int srow = (lane & 7) + (lane >> 4) * 8, scol = 16 * warp + ((lane >> 3) & 1) * 8;
    const int trow = (lane & 7) + ((lane >> 3) & 1) * 8, tcol = (lane >> 4) * 8;

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1, k0 = j * 64;
        stream_step(j, ntiles, issue);
        if (k0 < w_end) {
            E* tS = sS + buf * 64 * LDS;
            const E* tK = sK + buf * 64 * LD;
            if (k0 + 64 > w_full) {  // crossing this warp's diagonal: its rows' unseen keys to 0
                LLMC_UNROLL
                for (int i = 0; i < 2; i++)
                    for (int c = 16 * t; c < 16 * t + 16; c++)
                        if (k0 + c >= seen[i]) reinterpret_cast<uint16_t*>(tS)[c * LDS + 16 * warp + g + 8 * i] = 0;
                __syncwarp();
            }
            LLMC_UNROLL
            for (int kc = 0; kc < 4; kc++) {  // dQ += dS K, 16 keys at a time
                uint32_t a[4];
                ptx::ldmatrix_x4_trans(a, tS + (kc * 16 + srow) * LDS + scol);
                LLMC_UNROLL
                for (int d2 = 0; d2 < HS / 16; d2++) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4_trans(r, tK + (kc * 16 + trow) * LD + tcol + d2 * 16);
                    ptx::mma_16816_x2<E>(dq[2 * d2], dq[2 * d2 + 1], a, r);
                }
            }
        }
        __syncthreads();  // the next step's prefetch overwrites this buffer
    }

    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = w0 + g + 8 * i;
        if (r >= Tq) continue;
        E* row = dq_dst + ((long long)b * Tq + r) * stride + (long long)h * HS;
        LLMC_UNROLL
        for (int d = 0; d < DT; d++)
            store_pair(row + d * 8 + 2 * t, dq[d][2 * i] * scale, dq[d][2 * i + 1] * scale, accumulate);
    }
}

}  // namespace flash

#include "llmc/cuda/flash_backward_wgmma.cuh"

namespace flash {

// The dQ kernel over BT-key tiles and the dK/dV kernel over BT-query tiles, both with MT m-tiles a
// warp (the dK/dV kernel QH query columns at once); DS: dQ by flash_backward_dq_ds_kernel from the
// dS^T in ds_scratch (dev/cuda's attention_backward v7: B NH ds_rows(Tk) ds_rows(Tq) E, at most
// max_bytes, else false); wgmma_dq: dQ by flash_backward_dq_wgmma_kernel (v9: head sizes 64 and
// 128 where wgmma_available, else false), its K read MN-major with wgmma_mn.
template <int HS, int BT, int MT, int QH = BT, bool DS = false, class E>
bool try_backward(E* dq_dst, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                  const float* D, int B, int Tq, int Tk, int NH, int NKV, SeqPositions qp, SeqPositions kp,
                  bool accumulate, cudaStream_t st, GrowBuffer* ds_scratch, size_t max_bytes, bool wgmma_dq = false,
                  bool wgmma_mn = false) {
    static_assert(!DS || (BT == 64 && MT == 1), "dS^T through memory: 64-row tiles, one m-tile");
    constexpr bool kWgHs = HS == 64 || HS == 128;
    if (wgmma_dq && (DS || !kWgHs || !wgmma_available())) return false;
    auto fkv = flash_backward_dkdv_kernel<E, HS, BT, MT, QH, DS>;
    // the dQ kernel (the dS one instantiated only where DS, the wgmma one at its head sizes)
    const void* fq = (const void*)flash_backward_dq_kernel<E, HS, BT, MT>;
    size_t sq = DqSmem<HS, BT, MT>::total;
    if constexpr (DS) {
        fq = (const void*)flash_backward_dq_ds_kernel<E, HS>, sq = DqDsSmem<HS>::total;
    } else if constexpr (kWgHs) {
        if (wgmma_dq)
            fq = wgmma_mn ? (const void*)flash_backward_dq_wgmma_kernel<E, HS, false, true>
                          : (const void*)flash_backward_dq_wgmma_kernel<E, HS, false, false>,
            sq = (wgmma_mn ? WgDqSmem<HS, false, true>::total : WgDqSmem<HS, false, false>::total) + kWgSlack;
    }
    const size_t skv = DkdvSmem<HS, BT, MT>::total;
    const size_t ds_elems = DS ? (size_t)B * NH * ds_rows(Tk) * ds_rows(Tq) : 0;
    if constexpr (DS) {  // within the cap, and int offsets
        if (ds_elems > std::min(max_bytes / sizeof(E), size_t(1) << 30)) return false;
    }
    int optin = 0;
    if (!opt_in_smem((const void*)fkv, skv, &optin) || !opt_in_smem(fq, sq, &optin)) return false;
    E* ds = DS ? static_cast<E*>(ds_scratch->get(ds_elems * sizeof(E), st)) : nullptr;
    const float scale = 1.0f / sqrtf((float)HS);
    constexpr int BK = kBR * MT;
    LLMC_LAUNCH(fkv, dim3(B * NKV, (Tk + BK - 1) / BK), kThreads, skv, st, dkv, ds, dout, qkv_q, qkv_kv, lse, D, Tq,
                Tk, NH, NKV, scale, qp, kp, accumulate);
    CUDA_CHECK_LAUNCH();
    if constexpr (DS) {
        auto fqs = flash_backward_dq_ds_kernel<E, HS>;
        LLMC_LAUNCH(fqs, dim3(B * NH, (Tq + 63) / 64), kThreads, sq, st, dq_dst, ds, qkv_kv, Tq, Tk, NH, NKV, scale,
                    qp, kp, accumulate);
    } else if (kWgHs && wgmma_dq) {
        if constexpr (kWgHs) {
            auto fqw = wgmma_mn ? flash_backward_dq_wgmma_kernel<E, HS, false, true>
                                : flash_backward_dq_wgmma_kernel<E, HS, false, false>;
            LLMC_LAUNCH(fqw, dim3(B * NH, (Tq + kWgRows - 1) / kWgRows), kWgThreads, sq, st, dq_dst, dout, qkv_q,
                        qkv_kv, lse, D, Tq, Tk, NH, NKV, scale, qp, kp, accumulate);
        }
    } else {
        auto fqr = flash_backward_dq_kernel<E, HS, BT, MT>;
        LLMC_LAUNCH(fqr, dim3(B * NH, (Tq + BK - 1) / BK), kThreads, sq, st, dq_dst, dout, qkv_q, qkv_kv, lse, D, Tq,
                    Tk, NH, NKV, scale, qp, kp, accumulate);
    }
    CUDA_CHECK_LAUNCH();
    return true;
}

}  // namespace flash
