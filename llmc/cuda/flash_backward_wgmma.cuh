// The flash backward's dQ kernel on Hopper's warpgroup MMA (sm_90a; dev/cuda/attention_backward
// v9, kernels.attention_backward=wgmma_dq), head sizes 64 and 128, bf16 or fp16: what
// flash_backward_dq_kernel computes (S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K over the
// key tiles in order, the same masks and skips), each product one wgmma a warpgroup, beside the
// dK/dV kernel of the trainer's choice. Part of llmc/cuda/flash_backward.cuh (included there after
// store_pair; the forward's wgmma helpers come from flash_forward_wgmma.cuh).
//
// One block of two warpgroups (256 threads) per (128 query rows, head, batch), as the wgmma
// forward; per key tile of 64:
//   S = Q K^T and dP = dO V^T: HS / 16 wgmma m64n64k16 each, Q's and dO's A fragments by ldmatrix
//     (kept in registers at head size 64, reloaded each tile at 128, where S's product is waited
//     for before dP's: the registers would not hold both), K and V from 128-byte-swizzled tiles
//     (cp.async, as the forward's K);
//   dS = P (dP - D) on the accumulators, P = exp2(S scale log2e - lse log2e);
//   dQ += dS K: four wgmma m64nHSk16, dS's A fragments from the accumulators (acc_to_a), K from a
//     swizzled tile of K^T (transposed through registers, as the forward's V^T).
// ptxas sm_90a: see dev/cuda/attention_backward.cu's notes (v9).
#pragma once

namespace flash {

// shared memory from a 1024-byte boundary: K, V [2][HS / 64][64 keys][128 bytes], K^T [2][HS][128
// bytes], Q and dO [128][HS + 8]
template <int HS> struct WgDqSmem {
    static constexpr size_t kt = (size_t)HS / 64 * 8192, ktt = (size_t)HS * 128;  // a buffer's bytes
    static constexpr size_t k = 0, v = 2 * kt, kT = 4 * kt, q = kT + 2 * ktt, dO = q + (size_t)kWgRows * (HS + 8) * 2,
                            total = dO + (size_t)kWgRows * (HS + 8) * 2;
};

// grid (B * NH, ceil(Tq / 128)), 256 threads, WgDqSmem<HS>::total + kWgSlack bytes
template <class E, int HS>
__global__ void __launch_bounds__(kWgThreads)
    flash_backward_dq_wgmma_kernel(E* dq_dst, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                                   const float* D, int Tq, int Tk, int NH, int NKV, float scale, SeqPositions qp,
                                   SeqPositions kp, bool accumulate) {
    static_assert(HS == 64 || HS == 128, "the wgmma shapes of ptx.cuh");
    using L = WgDqSmem<HS>;
    constexpr int BC = kWgBC, LD = HS + 8, NT = BC / 8, DT = HS / 8, KC = HS / 16;
    constexpr bool QR = HS <= 64;  // Q's and dO's fragments kept in registers
    char* smem = smem_1024();
    char* sK = smem + L::k;
    char* sV = smem + L::v;
    char* sKT = smem + L::kT;
    E* sQ = reinterpret_cast<E*>(smem + L::q);
    E* sO = reinterpret_cast<E*>(smem + L::dO);

    const int h = blockIdx.x % NH, b = blockIdx.x / NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * kWgRows;  // heaviest (last) query tiles first
    const int kvh = h / (NH / NKV);
    const long long stride = (long long)(NH + 2 * NKV) * HS, ostride = (long long)NH * HS;
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    const int kv_end = visible(kp, Tk, qp.at(min(Tq, q0 + kWgRows) - 1));
    const int ntiles = (kv_end + BC - 1) / BC;
    // the warpgroup's rows [wg0, wg0 + 64) (tiles past what its last row sees: skipped by its four
    // warps together); this warp's [w0, w0 + 16), the lane's w0 + g and + 8
    const int wg0 = q0 + 64 * (warp / 4), w0 = q0 + 16 * warp;
    const int wg_end = wg0 < Tq ? visible(kp, kv_end, qp.at(min(Tq, wg0 + 64) - 1)) : 0;
    const bool active = w0 < Tq;
    const int w_full = active ? visible(kp, kv_end, qp.at(w0)) : 0;
    int seen[2];
    float l2[2], Dr[2];
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = w0 + g + 8 * i;
        const long long li = ((long long)b * NH + h) * Tq + r;
        seen[i] = r < Tq ? visible(kp, kv_end, qp.at(r)) : kv_end;
        l2[i] = r < Tq ? lse[li] * kLog2e : 0.0f;
        Dr[i] = r < Tq ? D[li] : 0.0f;
    }

    load_tile<HS, kWgRows, kWgThreads>(sQ, qkv_q + (long long)b * Tq * stride + (long long)h * HS, stride, q0, Tq);
    load_tile<HS, kWgRows, kWgThreads>(sO, dout + (long long)b * Tq * ostride + (long long)h * HS, ostride, q0, Tq);
    uint4 knext[HS / 64][2];
    if (ntiles > 0) {
        wg_load_k<HS>(sK, Kg, stride, 0, kv_end);
        wg_load_k<HS>(sV, Vg, stride, 0, kv_end);
        wg_fetch_v<HS>(knext, Kg, stride, 0, kv_end);
        wg_store_vt<HS>(sKT, knext);
    }
    ptx::cp_async_commit();

    const int frag = (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;  // ldmatrix's row
    uint32_t qf[KC][4], of[QR ? KC : 1][4];
    float dq[DT][4];
    LLMC_UNROLL
    for (int d = 0; d < DT; d++)
        LLMC_UNROLL
        for (int e = 0; e < 4; e++) dq[d][e] = 0.0f;

    for (int j = 0; j < ntiles; j++) {
        const int buf = j & 1, k0 = j * BC;
        if (j + 1 < ntiles) {  // the next tile: K, V by cp.async, K^T into registers until this one is done
            wg_load_k<HS>(sK + (buf ^ 1) * L::kt, Kg, stride, k0 + BC, kv_end);
            wg_load_k<HS>(sV + (buf ^ 1) * L::kt, Vg, stride, k0 + BC, kv_end);
            ptx::cp_async_commit();
            wg_fetch_v<HS>(knext, Kg, stride, k0 + BC, kv_end);
            ptx::cp_async_wait<1>();
        } else {
            ptx::cp_async_wait<0>();
        }
        ptx::fence_proxy_async();  // this thread's copies and K^T stores, to the tensor cores' reads
        __syncthreads();
        if (k0 < wg_end) {
            const char* tK = sK + buf * L::kt;
            const char* tV = sV + buf * L::kt;
            float s[NT][4], dp[NT][4];
            if constexpr (QR) {
                if (j == 0)
                    LLMC_UNROLL
                    for (int kc = 0; kc < KC; kc++) {
                        ptx::ldmatrix_x4(qf[kc], sQ + frag + kc * 16);
                        ptx::ldmatrix_x4(of[kc], sO + frag + kc * 16);
                    }
                ptx::wgmma_fence();
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++)
                    ptx::wgmma_m64k16<E, 64>(s, qf[kc], ptx::wgmma_desc_sw128(tK + kc / 4 * 8192, kc % 4 * 32), kc > 0);
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++)
                    ptx::wgmma_m64k16<E, 64>(dp, of[kc], ptx::wgmma_desc_sw128(tV + kc / 4 * 8192, kc % 4 * 32), kc > 0);
                ptx::wgmma_commit();
                ptx::wgmma_wait0(s);
                ptx::wgmma_wait0(dp);
            } else {  // one operand's fragments at a time (qf holds Q's, then dO's)
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++) ptx::ldmatrix_x4(qf[kc], sQ + frag + kc * 16);
                ptx::wgmma_fence();
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++)
                    ptx::wgmma_m64k16<E, 64>(s, qf[kc], ptx::wgmma_desc_sw128(tK + kc / 4 * 8192, kc % 4 * 32), kc > 0);
                ptx::wgmma_commit();
                ptx::wgmma_wait0(s);
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++) ptx::ldmatrix_x4(qf[kc], sO + frag + kc * 16);
                ptx::wgmma_fence();
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++)
                    ptx::wgmma_m64k16<E, 64>(dp, qf[kc], ptx::wgmma_desc_sw128(tV + kc / 4 * 8192, kc % 4 * 32), kc > 0);
                ptx::wgmma_commit();
                ptx::wgmma_wait0(dp);
            }
            const bool crossing = k0 + BC > w_full;
            LLMC_UNROLL
            for (int n = 0; n < NT; n++)
                LLMC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const bool vis = !crossing || k0 + n * 8 + 2 * t + (e & 1) < seen[i];
                    const float p = vis ? ptx::exp2_ftz(fmaf(s[n][e], scale * kLog2e, -l2[i])) : 0.0f;
                    dp[n][e] = p * (dp[n][e] - Dr[i]);
                }
            uint32_t da[BC / 16][4];  // dQ += dS K
            LLMC_UNROLL
            for (int kc = 0; kc < BC / 16; kc++) ptx::acc_to_a<E>(da[kc], dp[2 * kc], dp[2 * kc + 1]);
            ptx::wgmma_fence();
            LLMC_UNROLL
            for (int kc = 0; kc < BC / 16; kc++)
                ptx::wgmma_m64k16<E, HS>(dq, da[kc], ptx::wgmma_desc_sw128(sKT + buf * L::ktt, kc * 32), true);
            ptx::wgmma_commit();
            ptx::wgmma_wait0(dq);
        }
        // the next tile's K^T into the other buffer (its last reader, tile j - 1's dQ product, was
        // waited for by every warpgroup before this iteration's barrier)
        if (j + 1 < ntiles) wg_store_vt<HS>(sKT + (buf ^ 1) * L::ktt, knext);
        __syncthreads();  // the next iteration's copies overwrite this tile's K and V buffers
    }

    if (!active) return;
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
