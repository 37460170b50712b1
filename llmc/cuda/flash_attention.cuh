// Causal attention forward in the FlashAttention-2 design, bf16 or fp16 (E), for the head sizes the
// tensor-core path is built for (kFlashHeadSizes); llmc/cuda/attention.cuh dispatches to it and
// keeps its own kernels for fp32, other head sizes and the backward.
//
// One block of 4 warps per (query tile of 64 MT rows, head, batch); each warp owns 16 MT query
// rows (MT = 2 m-tiles for head sizes up to 64, else 1) and keeps everything of them in registers:
//  - Q's fragments, loaded once by ldmatrix;
//  - S = Q K^T for a key tile (16 x BC fp32 accumulators) by mma.sync m16n8k16 (E in, fp32
//    out), K's fragments by ldmatrix from shared memory;
//  - the online softmax in base 2 with the scale folded in (s * scale * log2(e)), row maxima
//    over the 4 lanes that share a row by two shuffles, the row sums kept per lane and summed
//    once at the end (every lane of a row rescales by the same factor);
//  - P rounded to E straight from the S accumulators into the A registers of O += P V (the
//    accumulator layout of two adjacent n-tiles is the A layout: llmc/cuda/ptx.cuh), V by
//    ldmatrix.trans;
//  - O (16 x HS fp32) in registers, divided by the row sum at the end; lse = m ln 2 + ln(l).
// K/V tiles (64 keys, or 32 where shared memory is short; 128 on request at head size 64,
// forward_hs) stream through a double buffer filled by cp.async while the previous tile is
// computed. Tiles past the last key a warp's rows see are skipped; only tiles that cross a
// row's last visible key are masked element by element. The query tiles of the whole grid run
// heaviest first (the tile index is blockIdx.y, counted from the end; blockIdx.x = head, batch).
//
// Same contract as attention.cuh's forward, the block form included: query row i (position
// qp.at(i)) sees key row j iff kp.at(j) <= qp.at(i); a row that sees no key gets out 0, lse -inf.
#pragma once
#include <cstdint>

#include "llmc/backend/positions.h"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/ptx.cuh"

namespace flash {

// kBR: the rows of a backward tile (flash_backward.cuh); the forward's are Smem<...>::BR
constexpr int kWarps = 4, kThreads = 32 * kWarps, kBR = 16 * kWarps;

// shared memory: Q [BR][LD], K [2][BC][LD], V [2][BC][LD] (E), BR = 16 * kWarps * MT query
// rows; LD = HS + 8 pads each row by 16 bytes, so that the 8 rows one ldmatrix phase reads start
// in different bank groups.
template <int HS, int BC, int MT = 1> struct Smem {
    static constexpr int LD = HS + 8, BR = 16 * kWarps * MT;
    static constexpr size_t q = 0, k = q + (size_t)BR * LD * 2, v = k + (size_t)2 * BC * LD * 2,
                            total = v + (size_t)2 * BC * LD * 2;
};

// The number of key rows j in [0, n) with kp.at(j) <= pos (a prefix: positions increase).
__device__ __forceinline__ int visible(SeqPositions kp, int n, int pos) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (kp.at(mid) <= pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
// The first query row i in [0, n) with qp.at(i) >= pos (n if none): the rows that see a key at
// pos begin there.
__device__ __forceinline__ int first_query(SeqPositions qp, int n, int pos) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (qp.at(mid) < pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// rows [t0, t0 + R) of one head (row stride `stride` elements) -> smem [R][LD] by cp.async, 16
// bytes a copy; rows at or past n are zero-filled (a NaN there would reach O through 0 * NaN).
template <int HS, int R, int NTH = kThreads, class E>
__device__ __forceinline__ void load_tile(E* dst, const E* src, long long stride, int t0, int n) {
    constexpr int LD = HS + 8, CH = HS / 8;  // 16-byte chunks per row
    for (int idx = threadIdx.x; idx < R * CH; idx += NTH) {
        const int r = idx / CH, c = idx % CH;
        E* d = dst + r * LD + c * 8;
        if (t0 + r < n) {
            ptx::cp_async_16(d, src + (long long)(t0 + r) * stride + c * 8);
        } else {
            uint64_t* z = reinterpret_cast<uint64_t*>(d);
            z[0] = 0;
            z[1] = 0;
        }
    }
}

// Step j of ntiles through the K/V double buffer (buffer j & 1): starts the copy of tile j + 1
// into the other buffer, waits for tile j's copy (the last step for every copy), then a block
// barrier. The caller's barrier at the end of step j keeps step j + 1 from overwriting a buffer
// still being read.
template <int HS, int BC, class E>
__device__ __forceinline__ void kv_tile_ready(E* sK, E* sV, const E* Kg, const E* Vg, long long stride,
                                              int j, int ntiles, int kv_end) {
    constexpr int LD = HS + 8;
    if (j + 1 < ntiles) {
        const int next = (j + 1) & 1;
        load_tile<HS, BC>(sK + next * BC * LD, Kg, stride, (j + 1) * BC, kv_end);
        load_tile<HS, BC>(sV + next * BC * LD, Vg, stride, (j + 1) * BC, kv_end);
        ptx::cp_async_commit();
        ptx::cp_async_wait<1>();
    } else {
        ptx::cp_async_wait<0>();
    }
    __syncthreads();
}

// grid (B * NH, ceil(Tq / BR)), kThreads threads, Smem<HS, BC, MT>::total bytes of shared memory.
// Each warp owns MT m-tiles of 16 query rows (rows [w0, w0 + 16 MT)): every K and V fragment a
// warp loads by ldmatrix feeds MT times two mma (FlashAttention-2 gives a warp 32 rows at head
// size 64 for this reason: the operand loads from shared memory, not the tensor cores, bound
// a 16-row warp).
template <class E, int HS, int BC, int MT>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int Tq, int Tk, int NH,
                         int NKV, float scale_log2, SeqPositions qp, SeqPositions kp) {
    static_assert(HS % 16 == 0 && BC % 16 == 0, "head size and key tile multiples of 16");
    using L = Smem<HS, BC, MT>;
    constexpr int LD = L::LD, BR = L::BR, WR = 16 * MT, NT = BC / 8, DT = HS / 8;  // S n-tiles, O n-tiles
    LLMC_EXTERN_SMEM(char, smem);
    E* sQ = reinterpret_cast<E*>(smem + L::q);
    E* sK = reinterpret_cast<E*>(smem + L::k);
    E* sV = reinterpret_cast<E*>(smem + L::v);

    const int h = blockIdx.x % NH, b = blockIdx.x / NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BR;  // heaviest (last) query tiles first
    const int kvh = h / (NH / NKV);
    const long long stride = (long long)(NH + 2 * NKV) * HS;
    const E* Qg = qkv_q + (long long)b * Tq * stride + (long long)h * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    // keys [0, kv_end) are seen by some row of the block (its last row sees the most)
    const int kv_end = visible(kp, Tk, qp.at(min(Tq, q0 + BR) - 1));
    const int ntiles = (kv_end + BC - 1) / BC;
    // this warp's rows [w0, w0 + WR); this lane's in m-tile mt: w0 + 16 mt + g and + 8; keys
    // [0, seen[mt][i]) visible (rows past Tq are computed on zero Q as if they saw everything,
    // and never written)
    const int w0 = q0 + WR * warp;
    // (two m-tiles above head size 64 find them again in each crossing tile instead of keeping them:
    // at head size 128 ptxas sm_90 spilled 52 bytes with them kept, none without)
    constexpr bool kLazySeen = MT == 2 && HS > 64;
    auto seen_of = [&](int mt, int i) {
        const int r = w0 + 16 * mt + g + 8 * i;
        return r < Tq ? visible(kp, kv_end, qp.at(r)) : kv_end;
    };
    int seen[MT][2];
    LLMC_UNROLL
    for (int mt = 0; mt < MT; mt++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) seen[mt][i] = kLazySeen ? 0 : seen_of(mt, i);
    const bool active = w0 < Tq;
    const int w_end = active ? visible(kp, kv_end, qp.at(min(Tq, w0 + WR) - 1)) : 0;  // tiles past it: skipped
    const int w_full = active ? visible(kp, kv_end, qp.at(w0)) : 0;  // keys before it: no mask

    load_tile<HS, BR>(sQ, Qg, stride, q0, Tq);
    if (ntiles > 0) {
        load_tile<HS, BC>(sK, Kg, stride, 0, kv_end);
        load_tile<HS, BC>(sV, Vg, stride, 0, kv_end);
    }
    ptx::cp_async_commit();

    // Q's fragments: in registers for the whole key loop (one m-tile, or head sizes up to 64 with
    // key tiles up to 64), else (two m-tiles above 64: O alone is 128 registers at head size 128;
    // 128-key tiles: S alone is 128) reloaded by ldmatrix from shared memory at each k-step of S,
    // as FlashAttention-2 does
    constexpr bool QR = MT == 1 || (HS <= 64 && BC <= 64);
    uint32_t qf[QR ? MT : 1][QR ? HS / 16 : 1][4];
    const E* qrow = sQ + (WR * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;  // m-tile 0's
    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    LLMC_UNROLL
    for (int mt = 0; mt < MT; mt++) {
        LLMC_UNROLL
        for (int i = 0; i < DT; i++)
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) o[mt][i][e] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1, k0 = j * BC;
        kv_tile_ready<HS, BC>(sK, sV, Kg, Vg, stride, j, ntiles, kv_end);
        if constexpr (QR) {
            if (j == 0 && active)
                LLMC_UNROLL
                for (int mt = 0; mt < MT; mt++)
                    LLMC_UNROLL
                    for (int kc = 0; kc < HS / 16; kc++) ptx::ldmatrix_x4(qf[mt][kc], qrow + 16 * mt * LD + kc * 16);
        }
        if (k0 < w_end) {
            const E* tK = sK + buf * BC * LD;
            const E* tV = sV + buf * BC * LD;
            float s[MT][NT][4];
            LLMC_UNROLL
            for (int mt = 0; mt < MT; mt++)
                LLMC_UNROLL
                for (int n = 0; n < NT; n++)
                    LLMC_UNROLL
                    for (int e = 0; e < 4; e++) s[mt][n][e] = 0.0f;
            // S = Q K^T: lane supplies key row np*16 + (lane>>4)*8 + lane%8, columns kc*16 + ((lane>>3)&1)*8
            const E* krow = tK + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
            LLMC_UNROLL
            for (int kc = 0; kc < HS / 16; kc++) {
                uint32_t qs[QR ? 1 : MT][4];  // this k-step's Q fragments (Q from shared memory)
                if constexpr (!QR)
                    LLMC_UNROLL
                    for (int mt = 0; mt < MT; mt++) ptx::ldmatrix_x4(qs[mt], qrow + 16 * mt * LD + kc * 16);
                LLMC_UNROLL
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4(r, krow + np * 16 * LD + kc * 16);
                    LLMC_UNROLL
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t(&a)[4] = QR ? qf[QR ? mt : 0][QR ? kc : 0] : qs[QR ? 0 : mt];
                        ptx::mma_16816_x2<E>(s[mt][2 * np], s[mt][2 * np + 1], a, r);
                    }
                }
            }
            if (k0 + BC > w_full) {  // the tile crosses some row's last visible key
                LLMC_UNROLL
                for (int mt = 0; mt < MT; mt++)
                    LLMC_UNROLL
                    for (int i = 0; i < 2; i++) {
                        const int sn = kLazySeen ? seen_of(mt, i) : seen[mt][i];
                        LLMC_UNROLL
                        for (int n = 0; n < NT; n++)
                            LLMC_UNROLL
                            for (int e = 2 * i; e < 2 * i + 2; e++)
                                if (k0 + n * 8 + 2 * t + (e & 1) >= sn) s[mt][n][e] = -INFINITY;
                    }
            }
            // online softmax, rows g (e = 0, 1) and g + 8 (e = 2, 3) of each m-tile
            LLMC_UNROLL
            for (int mt = 0; mt < MT; mt++)
                LLMC_UNROLL
                for (int i = 0; i < 2; i++) {
                    float mx = -INFINITY;
                    LLMC_UNROLL
                    for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[mt][n][2 * i], s[mt][n][2 * i + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m[mt][i], mx * scale_log2);
                    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
                    const float alpha = ptx::exp2_ftz(m[mt][i] - m_use);
                    float sum = 0.0f;
                    LLMC_UNROLL
                    for (int n = 0; n < NT; n++)
                        LLMC_UNROLL
                        for (int e = 2 * i; e < 2 * i + 2; e++) {
                            s[mt][n][e] = ptx::exp2_ftz(fmaf(s[mt][n][e], scale_log2, -m_use));
                            sum += s[mt][n][e];
                        }
                    l[mt][i] = l[mt][i] * alpha + sum;
                    m[mt][i] = m_new;
                    // O's rows rescaled only where some row of the warp's 8 found a larger maximum
                    // (elsewhere alpha is exactly 1: the products would change nothing); a warp-uniform
                    // vote for 2 DT multiplies a lane
                    if (__any_sync(0xffffffffu, alpha != 1.0f))
                        LLMC_UNROLL
                        for (int d = 0; d < DT; d++) {
                            o[mt][d][2 * i] *= alpha;
                            o[mt][d][2 * i + 1] *= alpha;
                        }
                }
            // O += P V: P's A registers from the S accumulators of n-tiles 2kc, 2kc+1; lane
            // supplies V row kc*16 + lane%8 + ((lane>>3)&1)*8, columns dp*16 + (lane>>4)*8
            const E* vrow = tV + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
            LLMC_UNROLL
            for (int kc = 0; kc < BC / 16; kc++) {
                uint32_t a[MT][4];
                LLMC_UNROLL
                for (int mt = 0; mt < MT; mt++) {
                    ptx::acc_to_a<E>(a[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
                }
                LLMC_UNROLL
                for (int dp = 0; dp < HS / 16; dp++) {
                    uint32_t r[4];
                    ptx::ldmatrix_x4_trans(r, vrow + kc * 16 * LD + dp * 16);
                    LLMC_UNROLL
                    for (int mt = 0; mt < MT; mt++) ptx::mma_16816_x2<E>(o[mt][2 * dp], o[mt][2 * dp + 1], a[mt], r);
                }
            }
        }
        __syncthreads();  // the next iteration's prefetch overwrites this buffer
    }

    if (!active) return;
    LLMC_UNROLL
    for (int mt = 0; mt < MT; mt++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            const int r = w0 + 16 * mt + g + 8 * i;
            if (r >= Tq) continue;
            const float inv = li > 0.0f ? 1.0f / li : 0.0f;
            E* orow = out + (((long long)b * Tq + r) * NH + h) * HS;
            LLMC_UNROLL
            for (int d = 0; d < DT; d++) {
                const uint32_t v = ptx::pack2<E>(o[mt][d][2 * i] * inv, o[mt][d][2 * i + 1] * inv);
                *reinterpret_cast<uint32_t*>(orow + d * 8 + 2 * t) = v;
            }
            if (t == 0)
                lse[((long long)b * NH + h) * Tq + r] =
                    li > 0.0f ? m[mt][i] * 0.6931471805599453f + logf(li) : -INFINITY;
        }
}

template <int HS, int BC, int MT = 1, class E>
bool try_forward(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int B, int Tq, int Tk, int NH,
                 int NKV, SeqPositions qp, SeqPositions kp, cudaStream_t st) {
    auto fn = flash_forward_kernel<E, HS, BC, MT>;
    using L = Smem<HS, BC, MT>;
    int optin = 0;
    if (!opt_in_smem((const void*)fn, L::total, &optin)) return false;
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)HS);
    LLMC_LAUNCH(fn, dim3(B * NH, (Tq + L::BR - 1) / L::BR), kThreads, L::total, st, out, lse, qkv_q, qkv_kv, Tq, Tk,
                NH, NKV, scale_log2, qp, kp);
    CUDA_CHECK_LAUNCH();
    return true;
}

}  // namespace flash

#include "llmc/cuda/flash_forward_wgmma.cuh"

namespace flash {

// The flash forward for one head size: two m-tiles a warp up to head size 64 (unless
// rows_per_warp is 16), else one (unless rows_per_warp is 32: two, Q from shared memory, head
// sizes 80 to 128); a key tile of 64 rows, else 32 (shared memory). key_tile 128 (head size 64,
// two m-tiles): FlashAttention-2's 128 x 128 tiles, Q from shared memory, or false.
template <int HS, class E>
bool forward_hs(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int B, int Tq, int Tk, int NH, int NKV,
                SeqPositions qp, SeqPositions kp, cudaStream_t st, int rows_per_warp, int key_tile) {
#define LLMC_FLASH_TRY(BC, MT) try_forward<HS, BC, MT>(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, qp, kp, st)
    if (key_tile == 128) {
        if constexpr (HS == 64) return rows_per_warp != 16 && LLMC_FLASH_TRY(128, 2);
        return false;
    }
    if constexpr (HS <= 80) {  // (ptxas sm_90: HS 80 BC 64 243 registers, no spill)
        if ((HS <= 64 ? rows_per_warp != 16 : rows_per_warp == 32) && (LLMC_FLASH_TRY(64, 2) || LLMC_FLASH_TRY(32, 2)))
            return true;
        if (rows_per_warp == 32) return false;
    } else if constexpr (HS <= 128) {  // 32-key tiles: no spill at HS 96 and 128 (64-key tiles: none, 36 bytes)
        if (rows_per_warp == 32) return LLMC_FLASH_TRY(32, 2);
    }
    if constexpr (HS == 256) return LLMC_FLASH_TRY(32, 1);
    else return LLMC_FLASH_TRY(64, 1) || LLMC_FLASH_TRY(32, 1);
#undef LLMC_FLASH_TRY
}

// The flash forward when it covers HS and the device's shared memory holds its tiles; false:
// the caller takes attention.cuh's general kernel. Head sizes up to 64 give each warp two
// m-tiles (32 query rows, 128 a block: at head size 64, 254 registers and no spill on sm_90);
// larger ones one. `rows_per_warp` 16 or 32 forces the choice (dev/cuda's versions 4 and 5
// compare them; 32 above head size 64 reloads Q from shared memory, not yet measured); 0
// chooses (KernelWays::fwd_rows_per_warp for the trainer's calls: test_gpu's attention_mt2 sets it).
// `key_tile` 128 asks for 128-key tiles (forward_hs; dev/cuda's version 6; 0: the choice,
// KernelWays::fwd_key_tile for the trainer's calls: kernels.attention_forward=keys128).
// `wgmma` 1 or 2: the warpgroup-MMA kernel (flash_forward_wgmma.cuh; 2 pipelined) where it applies
// (head sizes 64, 128 on an sm_90 device with sm_90a code; KernelWays::fwd_wgmma,
// kernels.attention_forward=wgmma or wgmma_pipelined), else the others; `wgmma_mn` its V read
// MN-major (KernelWays::wgmma_mn).
template <class E>
bool forward(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int B, int Tq, int Tk, int NH,
                    int NKV, int HS, SeqPositions qp, SeqPositions kp, cudaStream_t st, int rows_per_warp = 0,
                    int key_tile = 0, int wgmma = 0, bool wgmma_mn = false) {
    if (wgmma && try_forward_wgmma(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, HS, qp, kp, st, wgmma == 2, wgmma_mn))
        return true;
#define LLMC_FLASH_HS(D) \
    case D: return forward_hs<D>(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, qp, kp, st, rows_per_warp, key_tile);
    switch (HS) {
        LLMC_FLASH_HS(32)
        LLMC_FLASH_HS(64)
        LLMC_FLASH_HS(80)
        LLMC_FLASH_HS(96)
        LLMC_FLASH_HS(128)
        LLMC_FLASH_HS(256)
        default: return false;
    }
#undef LLMC_FLASH_HS
}

}  // namespace flash
