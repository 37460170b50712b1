// Attention backward in one kernel (dev/cuda/attention_backward v8): the dK/dV kernel of
// llmc/cuda/flash_backward.cuh that also adds dQ += dS K, as FlashAttention-2 does, with its atomics
// made deterministic.
//  - One block per (key/value head, batch, split): a split is a fixed set of the head's 64-key tiles
//    (split_tile), taken in order. For each key tile the block streams the query tiles that see it
//    as the dK/dV kernel does (dkdv_query_tile: dK, dV in registers), and each warp also leaves the
//    dS^T of its 16 keys in shared memory (rounded to E as dK's product takes it). After a barrier
//    each warp takes 16 query rows of the tile: dQ_part = dS K (dS by ldmatrix.trans from the
//    key-major dS^T, K by ldmatrix.trans), added in fp32 into the split's own dQ accumulator.
//  - Deterministic: each accumulator element has one writer, the same thread every time (its lane's
//    place in the mma layout), and a thread's reductions to one address take effect in program
//    order, which is the split's fixed key tile order. A second kernel sums the splits' accumulators
//    in split order, scales, and stores dQ (= or +=).
//  - What it saves against flash_backward_dq_kernel: S and dP computed once (that kernel computes
//    them again for every tile: three products where this does one); what it costs: the dS^T's trip
//    through shared memory and a barrier per tile, fp32 reductions into memory (L2), the
//    accumulators (splits x B NH Tq HS floats) and their zeroing and sum.
// The splits fill the device: B NKV blocks alone are too few at small batches (96 at GPT-2 124M B=8
// against 132 SMs of 3 blocks). The split is chosen for whole waves (fused_splits).
// Same contract as the two kernels (positions qp, kp; accumulate). The end of this file chooses
// among the flash backward's ways (flash::backward).
#pragma once
#include "llmc/cuda/flash_backward.cuh"
#include "llmc/cuda/kernel_ways.h"

namespace flash {

// shared memory: the dK/dV kernel's (64-row tiles, one m-tile) and dS^T [64 keys][64 + 8 queries]
template <int HS> struct FusedSmem {
    using Base = DkdvSmem<HS, kBR, 1>;
    static constexpr int LDS = kBR + 8;
    static constexpr size_t s = Base::total, total = s + (size_t)kBR * LDS * 2;
};

// The m-th key tile of split s of S: the tiles in rounds of 2S, split s taking the s-th of each
// round and the s-th from its end, so that each split gets about the same number of query tiles
// under a causal mask (a tile's count falls with its index). Increasing in m.
__host__ __device__ __forceinline__ int split_tile(int s, int S, int m) {
    return (m / 2) * 2 * S + (m % 2 ? 2 * S - 1 - s : s);
}

// p[0] += x, p[1] += y in global memory, each element atomically (p 8-byte aligned): one vector
// reduction on sm_90 (red.global.add.v2.f32), two elsewhere
__device__ __forceinline__ void add_pair(float* p, float x, float y) {
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || defined(LLMC_CUEMU)
    atomicAdd(reinterpret_cast<float2*>(p), float2{x, y});
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// grid (B * NKV, splits), kThreads threads, FusedSmem<HS>::total bytes. dq_acc: splits x [B NH][Tq][HS]
// floats, zero. QH: dkdv_query_tile's query columns at once.
template <class E, int HS, int QH>
__global__ void __launch_bounds__(kThreads, HS <= 64 ? 3 : 0)
    flash_backward_fused_kernel(float* dq_acc, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv,
                                const float* lse, const float* D, int Tq, int Tk, int NH, int NKV, float scale,
                                SeqPositions qp, SeqPositions kp, bool accumulate) {
    constexpr int BQ = kBR, BK = kBR, LD = HS + 8, LDS = FusedSmem<HS>::LDS, DT = HS / 8;
    constexpr int DQ = HS <= 64 ? HS : 32;  // dQ's columns at once (ptxas sm_90, two passes of 32 query
    // columns: 168 registers at head size 64, 248 at 128 with 32 columns at once, no spill; 64 at once spills)
    LLMC_EXTERN_SMEM(char, smem);
    const auto sm = FusedSmem<HS>::Base::template tiles<E>(smem);
    E* sS = reinterpret_cast<E*>(smem + FusedSmem<HS>::s);

    const int kvh = blockIdx.x % NKV, b = blockIdx.x / NKV, group = NH / NKV, nb = gridDim.x / NKV;
    const long long stride = (long long)(NH + 2 * NKV) * HS, ostride = (long long)NH * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* acc = dq_acc + (long long)blockIdx.y * nb * NH * Tq * HS;  // this split's
    E* dsw = sS + (16 * warp + g) * LDS;  // the lane's row of the warp's keys in dS^T
    // dQ's A (dS: 16 queries of the warp x 16 keys) by ldmatrix.trans from the key-major dS^T
    // (flash_backward_dq_ds_kernel's), B (K) by ldmatrix.trans
    const int srow = (lane & 7) + (lane >> 4) * 8, scol = 16 * warp + ((lane >> 3) & 1) * 8;
    const int trow = (lane & 7) + ((lane >> 3) & 1) * 8, tcol = (lane >> 4) * 8;

    const int nkt = (Tk + BK - 1) / BK;
    for (int mk = 0;; mk++) {
        const int kt = split_tile(blockIdx.y, gridDim.y, mk);
        if (kt >= nkt) break;
        const int k0 = kt * BK, kpos0 = kp.at(k0);
        // the (head, query tile) sequence as the dK/dV kernel's
        const int first_q = first_query(qp, Tq, kpos0);
        const int qt0 = first_q / BQ, nqt = first_q < Tq ? (Tq + BQ - 1) / BQ - qt0 : 0, n = group * nqt;
        auto issue = [&](int i, int buf) {
            load_query_tile<HS, BQ>(sm.q, sm.dO, sm.lse, sm.d, buf, qkv_q, dout, lse, D, b, kvh * group + i / nqt,
                                    (qt0 + i % nqt) * BQ, Tq, NH, stride, ostride);
        };
        __syncthreads();  // the previous key tile's dQ products have read K
        load_tile<HS, BK>(sm.k, Kg, stride, k0, Tk);
        load_tile<HS, BK>(sm.v, Vg, stride, k0, Tk);
        if (n > 0) issue(0, 0);
        ptx::cp_async_commit();

        const int kw0 = k0 + 16 * warp;  // this warp's keys [kw0, kw0 + 16)
        const bool active = kw0 < Tk;
        int kpos[1][2];
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) kpos[0][i] = kw0 + g + 8 * i < Tk ? kp.at(kw0 + g + 8 * i) : INT_MAX;
        const int kfirst = active ? kp.at(kw0) : INT_MAX, klast = active ? kp.at(min(Tk, kw0 + 16) - 1) : INT_MAX;
        float dk[1][DT][4], dv[1][DT][4];
        LLMC_UNROLL
        for (int d = 0; d < DT; d++)
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) dk[0][d][e] = dv[0][d][e] = 0.0f;

        // Per query tile two barriers, as the dK/dV kernel: stream_step's, and the one between the
        // dS^T's writes and the dQ product's reads (no third at the step's end): stream_step(i + 1)
        // starts the copies into the buffer that step i read, and a warp gets there only after step
        // i's second barrier, which every warp passed after its reads; step i + 1 writes dS^T after
        // stream_step(i + 1)'s barrier, which every warp reaches after step i's dQ product.
        for (int i = 0; i < n; i++) {
            const int buf = i & 1, h = kvh * group + i / nqt, q0 = (qt0 + i % nqt) * BQ;
            stream_step(i, n, issue);
            if (active && qp.at(min(Tq, q0 + BQ) - 1) >= kfirst)  // some query of the tile sees a key of the warp
                dkdv_query_tile<E, HS, BQ, 1, QH, DsTo::shared>(
                    dk, dv, sm.k, sm.v, sm.q + buf * BQ * LD, sm.dO + buf * BQ * LD, sm.lse + buf * BQ,
                    sm.d + buf * BQ, q0, Tq, Tk, kw0, kfirst, klast, kpos, qp, scale, dsw, LDS);
            else
                zero_ds_cols<E, 1>(dsw, LDS, 0, BQ);
            __syncthreads();  // the tile's dS^T, every warp's keys

            // dQ += dS K for this warp's query rows [r0, r0 + 16) (none where no row sees the tile)
            const int r0 = q0 + 16 * warp;
            if (r0 >= Tq || qp.at(min(Tq, r0 + 16) - 1) < kpos0) continue;
            float* arow = acc + ((long long)b * NH + h) * Tq * HS;
            LLMC_UNROLL
            for (int dh = 0; dh < HS; dh += DQ) {
                float dq[DQ / 8][4];
                LLMC_UNROLL
                for (int d = 0; d < DQ / 8; d++)
                    LLMC_UNROLL
                    for (int e = 0; e < 4; e++) dq[d][e] = 0.0f;
                LLMC_UNROLL
                for (int kc = 0; kc < BK / 16; kc++) {
                    uint32_t a[4];
                    ptx::ldmatrix_x4_trans(a, sS + (kc * 16 + srow) * LDS + scol);
                    LLMC_UNROLL
                    for (int d2 = 0; d2 < DQ / 16; d2++) {
                        uint32_t r[4];
                        ptx::ldmatrix_x4_trans(r, sm.k + (kc * 16 + trow) * LD + tcol + dh + d2 * 16);
                        ptx::mma_16816_x2<E>(dq[2 * d2], dq[2 * d2 + 1], a, r);
                    }
                }
                LLMC_UNROLL
                for (int i2 = 0; i2 < 2; i2++) {
                    const int r = r0 + g + 8 * i2;
                    if (r >= Tq) continue;
                    float* p = arow + (long long)r * HS + dh + 2 * t;
                    LLMC_UNROLL
                    for (int d = 0; d < DQ / 8; d++) add_pair(p + d * 8, dq[d][2 * i2], dq[d][2 * i2 + 1]);
                }
            }
        }
        store_dkdv<HS, 1>(dkv, dk, dv, b, kvh, kw0, Tk, NH, NKV, scale, accumulate);
    }
}

// dQ = scale x (the splits' fp32 accumulators summed in split order), = or += into dq_dst's q heads
// (row stride `stride`): 8 elements a thread, grid-stride, in dq_dst's order.
template <class E>
__global__ void fused_dq_sum_kernel(E* dq_dst, const float* acc, int B, int Tq, int NH, int HS, long long stride,
                                    int splits, float scale, bool accumulate) {
    const int c8 = HS / 8;
    const long long n8 = (long long)B * Tq * NH * c8, split_elems = (long long)B * NH * Tq * HS;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n8;
         idx += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(idx % c8) * 8, h = (int)(idx / c8 % NH);
        const long long bt = idx / c8 / NH;  // b Tq + r
        const int r = (int)(bt % Tq), b = (int)(bt / Tq);
        const float* src = acc + (((long long)b * NH + h) * Tq + r) * HS + d;
        float v[8];
        LLMC_UNROLL
        for (int e = 0; e < 8; e++) v[e] = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float4 lo = reinterpret_cast<const float4*>(src + s * split_elems)[0];
            const float4 hi = reinterpret_cast<const float4*>(src + s * split_elems)[1];
            v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
            v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
        }
        E* dst = dq_dst + bt * stride + (long long)h * HS + d;
        LLMC_UNROLL
        for (int e = 0; e < 8; e += 2) store_pair(dst + e, v[e] * scale, v[e + 1] * scale, accumulate);
    }
}

// The number of splits of each head's key tiles: the fewest that keep whole waves of the device's
// `slots` resident blocks (SMs x blocks an SM) busy, by a rough model: time ~ waves x (1 / splits)
// (the splits share a head's work about equally) + 0.03 a split (the accumulators' zeroing and sum).
inline int fused_splits(int heads, int key_tiles, int slots) {
    int best = 1;
    double best_t = 1e30;
    for (int s = 1; s <= key_tiles; s++) {
        const long long blocks = (long long)heads * s;
        const double t = (double)((blocks + slots - 1) / slots) / s + 0.03 * s;
        if (t < best_t - 1e-9) best_t = t, best = s;
    }
    return best;
}

// dK, dV and dQ by the fused kernel when it covers HS and the device's shared memory holds its tiles
// and the accumulators fit max_bytes of the caller's scratch; false: nothing launched. force_splits:
// that many splits (capped at the key tiles: test_gpu's cases take 1 and the choice); 0: fused_splits.
template <int HS, int QH, class E>
bool try_fused(E* dq_dst, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse, const float* D,
               int B, int Tq, int Tk, int NH, int NKV, SeqPositions qp, SeqPositions kp, bool accumulate,
               cudaStream_t st, GrowBuffer* scratch, size_t max_bytes, int force_splits) {
    auto fn = flash_backward_fused_kernel<E, HS, QH>;
    const size_t smem = FusedSmem<HS>::total;
    int optin = 0, dev = 0, sms = 0;
    if (!scratch || !opt_in_smem((const void*)fn, smem, &optin)) return false;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // blocks an SM: by shared memory (228 KiB an SM on sm_90, 164 on sm_80: the opt-in limit plus
    // 1 KiB reserved a block, rounded) and registers (ptxas sm_90: three at head size 64, by
    // __launch_bounds__; two above)
    const int by_smem = std::max(1, (optin + 1024) / (int)(smem + 1024));
    const int slots = sms * std::min(by_smem, HS <= 64 ? 3 : 2);
    const int key_tiles = (Tk + kBR - 1) / kBR;
    int splits = force_splits > 0 ? std::min(force_splits, key_tiles) : fused_splits(B * NKV, key_tiles, slots);
    const size_t split_bytes = (size_t)B * NH * Tq * HS * sizeof(float);
    while (splits > 1 && splits * split_bytes > max_bytes) splits--;
    if (split_bytes > max_bytes) return false;
    float* acc = static_cast<float*>(scratch->get(splits * split_bytes, st));
    if (queue_work()) CUDA_CHECK(cudaMemsetAsync(acc, 0, splits * split_bytes, st));
    const float scale = 1.0f / sqrtf((float)HS);
    LLMC_LAUNCH(fn, dim3(B * NKV, splits), kThreads, smem, st, acc, dkv, dout, qkv_q, qkv_kv, lse, D, Tq, Tk, NH, NKV,
                scale, qp, kp, accumulate);
    CUDA_CHECK_LAUNCH();
    const long long n8 = (long long)B * Tq * NH * HS / 8;
    LLMC_LAUNCH(fused_dq_sum_kernel<E>, (int)std::min<long long>((n8 + 255) / 256, 4L * sms), 256, 0, st, dq_dst, acc,
                B, Tq, NH, HS, (long long)(NH + 2 * NKV) * HS, splits, scale, accumulate);
    CUDA_CHECK_LAUNCH();
    return true;
}

// The ways (KernelWays; dev/cuda's attention_backward v3-v8; 0: the backend's choice, what the
// H200 measured fastest on 2026-11-27, dev/bench/RESULTS.md's fourth window): rows a warp in both
// kernels up to head size 64 (bwd_rows_per_warp 16, or 32 = two m-tiles; the choice: 16 at head
// size 64, 32 at 32); the tile (bwd_tile 32: the 32-row tiles that a device short of shared memory
// runs, sm_86/sm_89's 99 KiB at head size 128, so that test_gpu's attention_bwd32 covers that way on
// any device; 0: 64-row tiles where they fit); on 64-row tiles at 16 rows a warp, the dK/dV
// kernel's pass over each query tile (bwd_pass 32: two passes of 32 columns, v6, the choice at head
// size 64; 64: one pass, v3, the choice at 128); dQ (bwd_dq: 0 its own kernel, 1 from the dS^T in
// memory, v7, 2 the fused kernel, v8, at head sizes 64 and 128, 3 its own kernel on wgmma, v9, at
// head sizes 64 and 128 where wgmma_available, 4 the dK/dV kernel too, v10 at head size 64 (v12 at
// 128), 5 both kernels pipelined at 64, v11, 6 the dK/dV kernel with K and V from shared memory,
// v12).
// dK, dV and dQ by the flash kernels when they cover HS and the device's shared memory holds
// their tiles (64 rows, else 32); false (nothing launched): the caller takes attention.cuh's.
// Head size 32: each warp of both kernels owns 32 rows (two m-tiles over 32-row tiles); 64: 16
// rows over 64-row tiles, the dK/dV kernel in two passes of 32 query columns (H200: 16-17% faster
// than two m-tiles; by ptxas 168 registers a thread against 255, three blocks an SM against two,
// the likely cause, not profiled); above,
// 16 rows over 64-row tiles in one pass (32-row tiles where shared memory is short).
template <class E>
bool backward(E* dq_dst, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv,
                     const float* lse, const float* D, int B, int Tq, int Tk, int NH, int NKV, int HS,
                     SeqPositions qp, SeqPositions kp, bool accumulate, cudaStream_t st, const KernelWays& w,
                     GrowBuffer* ds_scratch) {
#define LLMC_FLASH_BWD(HSV, BT, MT, ...) \
    try_backward<HSV, BT, MT, ##__VA_ARGS__>(dq_dst, dkv, dout, qkv_q, qkv_kv, lse, D, B, Tq, Tk, NH, NKV, qp, kp, \
                                             accumulate, st, ds_scratch, w.scratch_max_bytes, wq, w.wgmma_mn)
#define LLMC_FLASH_FUSED(HSV)                                                                                   \
    try_fused<HSV, 32>(dq_dst, dkv, dout, qkv_q, qkv_kv, lse, D, B, Tq, Tk, NH, NKV, qp, kp, accumulate, st,   \
                       ds_scratch, w.scratch_max_bytes, w.fused_splits)
    const int rows = w.bwd_rows_per_warp ? w.bwd_rows_per_warp : HS == 64 ? 16 : 32;
    const int pass = w.bwd_pass ? w.bwd_pass : HS == 64 ? 32 : 64;
    const bool two = rows != 16, wide = w.bwd_tile != 32, halves = pass == 32;
    // dS^T through memory (bwd_dq 1): at head sizes 64 (two passes) and 128 (one), the trainer's ways
    const bool ds = w.bwd_dq == 1 && ds_scratch && !two && wide;
    // both kernels on wgmma (bwd_dq 4-6) at head sizes 64 and 128; dQ on wgmma alone (bwd_dq 3, and
    // where those are refused) beside the chosen dK/dV kernel; where wgmma_available (else as 0)
    if (w.bwd_dq >= 4 && try_backward_wgmma(dq_dst, dkv, dout, qkv_q, qkv_kv, lse, D, B, Tq, Tk, NH, NKV, HS, qp, kp,
                                            accumulate, st, w.bwd_dq == 5, w.bwd_dq == 6,
                                            w.wgmma_mn))
        return true;
    bool wq = w.bwd_dq >= 3 && (HS == 64 || HS == 128) && wgmma_available();
    // one kernel (bwd_dq 2) at head sizes 64 and 128, the dK/dV part in two passes of 32 query columns
    if (w.bwd_dq == 2 && wide && ((HS == 64 && LLMC_FLASH_FUSED(64)) || (HS == 128 && LLMC_FLASH_FUSED(128))))
        return true;
    auto run = [&]() -> bool {
        switch (HS) {
            case 32:
                return (two && LLMC_FLASH_BWD(32, 32, 2)) ||
                       (wide && LLMC_FLASH_BWD(32, 64, 1)) || LLMC_FLASH_BWD(32, 32, 1);
            case 64:
                return (two && LLMC_FLASH_BWD(64, 32, 2)) || (ds && halves && LLMC_FLASH_BWD(64, 64, 1, 32, true)) ||
                       (wide && halves && LLMC_FLASH_BWD(64, 64, 1, 32)) || (wide && LLMC_FLASH_BWD(64, 64, 1)) ||
                       LLMC_FLASH_BWD(64, 32, 1);
            case 80: return (wide && LLMC_FLASH_BWD(80, 64, 1)) || LLMC_FLASH_BWD(80, 32, 1);
            case 96: return (wide && LLMC_FLASH_BWD(96, 64, 1)) || LLMC_FLASH_BWD(96, 32, 1);
            case 128:
                return (wide && halves && LLMC_FLASH_BWD(128, 64, 1, 32)) ||
                       (ds && LLMC_FLASH_BWD(128, 64, 1, 64, true)) || (wide && LLMC_FLASH_BWD(128, 64, 1)) ||
                       LLMC_FLASH_BWD(128, 32, 1);
            default: return false;
        }
    };
    if (wq && run()) return true;
    wq = false;  // (the wgmma dQ kernel's shared memory refused: the dQ kernel of the others)
    return run();
#undef LLMC_FLASH_BWD
#undef LLMC_FLASH_FUSED
}

}  // namespace flash
