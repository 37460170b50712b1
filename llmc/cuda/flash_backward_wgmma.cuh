// The flash backward's dQ kernel on Hopper's warpgroup MMA (sm_90a; dev/cuda/attention_backward
// v9, kernels.attention_backward=wgmma_dq; pipelined v11), head sizes 64 and 128, bf16 or fp16: what
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
//     swizzled tile of K^T (transposed through registers, as the forward's V^T); MN
//     (kernels.attention_wgmma_layout=mn_major): K's own tile read MN-major, no K^T.
// ptxas sm_90a: see dev/cuda/attention_backward.cu's notes (v9).
#pragma once

namespace flash {

// The dQ kernel's shared memory (its PIPE and MN; the kernel and its launchers take the layout from
// here), from a 1024-byte boundary: K [nk][HS / 64][64 keys][128 bytes] (nk = 3 where PIPE and MN,
// else 2), V [2][HS / 64][64 keys][128 bytes], K^T [2][HS][128 bytes] (not MN), Q and dO [128][HS +
// 8] (qs, pipelined above head size 64: [2 warpgroups][HS / 64][64 rows][128 bytes] each, swizzled)
template <int HS, bool PIPE, bool MN> struct WgDqSmem {
    static constexpr int nk = PIPE && MN ? 3 : 2;
    static constexpr bool qs = PIPE && HS > 64;
    static constexpr size_t kt = (size_t)HS / 64 * 8192, ktt = (size_t)HS * 128;  // a buffer's bytes
    static constexpr size_t rows = qs ? 2 * kt : (size_t)kWgRows * (HS + 8) * 2;  // Q's (dO's) bytes
    static constexpr size_t k = 0, v = nk * kt, kT = v + 2 * kt, q = kT + (MN ? 0 : 2 * ktt), dO = q + rows,
                            total = dO + rows;
};

// grid (B * NH, ceil(Tq / 128)), 256 threads, WgDqSmem<HS, PIPE, MN>::total + kWgSlack bytes.
// PIPE (head size 64; dev/cuda/attention_backward v11, kernels.attention_backward=wgmma_pipelined):
// the forward's v8 pipelining here: iteration j issues S_j and dP_j as one group and dQ += dS_{j-1}
// K_{j-1} as a second, waits for the first (wait_group 1), computes dS_j while the tensor cores run
// the dQ product, then waits for it; K_j^T is stored at the end of iteration j, one iteration later.
// PIPE and MN: K_{j - 1}'s tile is tile j - 1's dQ product's operand while K_{j + 1}'s copy lands: K
// has three buffers (tile j in buffer j % 3). PIPE at head size 128 (QS): S and dP read Q and dO from
// swizzled shared memory (wgmma's SS form, as FlashAttention-3's backward), since their fragments
// would not fit in registers beside the pipeline's; at 64 they stay in registers.
template <class E, int HS, bool PIPE, bool MN>
__global__ void __launch_bounds__(kWgThreads)
    flash_backward_dq_wgmma_kernel(E* dq_dst, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                                   const float* D, int Tq, int Tk, int NH, int NKV, float scale, SeqPositions qp,
                                   SeqPositions kp, bool accumulate) {
    static_assert(HS == 64 || HS == 128, "the wgmma shapes of ptx.cuh");
    using L = WgDqSmem<HS, PIPE, MN>;
    constexpr int NK = L::nk;        // K's buffers
    constexpr bool QR = HS <= 64;    // Q's and dO's fragments kept in registers
    constexpr bool QS = L::qs;       // ... else from swizzled shared memory where pipelined
    constexpr int BC = kWgBC, LD = HS + 8, NT = BC / 8, DT = HS / 8, KC = HS / 16, LAG = PIPE ? 1 : 0;
    char* smem = smem_1024();
    char* sK = smem + L::k;
    char* sV = smem + L::v;
    char* sKT = smem + L::kT;  // (not MN)
    E* sQ = reinterpret_cast<E*>(smem + L::q);  // (QS: swizzled tiles, not E rows)
    E* sO = reinterpret_cast<E*>(smem + L::dO);

    const WgRows<HS, E> R(qkv_kv, Tq, Tk, NH, NKV, qp, kp);
    const int h = R.h, b = R.b, q0 = R.q0, kv_end = R.kv_end, ntiles = R.ntiles, wg_end = R.wg_end, w0 = R.w0;
    const long long stride = R.stride, ostride = (long long)NH * HS;
    const E *Kg = R.Kg, *Vg = R.Vg;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const char* wq = smem + L::q + (warp / 4) * L::kt;   // QS: this warpgroup's 64 rows of Q
    const char* wo = smem + L::dO + (warp / 4) * L::kt;  // ... and of dO
    float l2[2], Dr[2];  // the lane's rows' lse (base 2) and D
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = w0 + g + 8 * i;
        const long long li = ((long long)b * NH + h) * Tq + r;
        l2[i] = r < Tq ? lse[li] * kLog2e : 0.0f;
        Dr[i] = r < Tq ? D[li] : 0.0f;
    }

    const E* Qg = qkv_q + (long long)b * Tq * stride + (long long)h * HS;
    const E* Og = dout + (long long)b * Tq * ostride + (long long)h * HS;
    if constexpr (QS) {
        LLMC_UNROLL
        for (int w = 0; w < 2; w++) {
            wg_load_k<HS>(smem + L::q + w * L::kt, Qg, stride, q0 + 64 * w, Tq);
            wg_load_k<HS>(smem + L::dO + w * L::kt, Og, ostride, q0 + 64 * w, Tq);
        }
    } else {
        load_tile<HS, kWgRows, kWgThreads>(sQ, Qg, stride, q0, Tq);
        load_tile<HS, kWgRows, kWgThreads>(sO, Og, ostride, q0, Tq);
    }
    uint4 knext[HS / 64][2];
    if (ntiles > 0) {
        wg_load_k<HS>(sK, Kg, stride, 0, kv_end);
        wg_load_k<HS>(sV, Vg, stride, 0, kv_end);
        if (!PIPE && !MN) {
            wg_fetch_v<HS>(knext, Kg, stride, 0, kv_end);
            wg_store_vt<HS>(sKT, knext);
        }
    }
    ptx::cp_async_commit();

    const int frag = (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;  // ldmatrix's row
    // Q's and dO's fragments (of unused above head size 64, both with QS), dS's (the tile whose dQ
    // product is next)
    uint32_t qf[QS ? 1 : KC][4], of[QR ? KC : 1][4], da[4][4];
    float dq[DT][4];
    LLMC_UNROLL
    for (int d = 0; d < DT; d++)
        LLMC_UNROLL
        for (int e = 0; e < 4; e++) dq[d][e] = 0.0f;
    // dS = P (dP - D) of key tile k0 into dp, from S's accumulators s
    auto ds_of = [&](const float (&s)[NT][4], float (&dp)[NT][4], int k0) {
        const bool crossing = k0 + BC > R.w_full;
        LLMC_UNROLL
        for (int n = 0; n < NT; n++)
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const bool vis = !crossing || k0 + n * 8 + 2 * t + (e & 1) < R.seen[i];
                const float p = vis ? ptx::exp2_ftz(fmaf(s[n][e], scale * kLog2e, -l2[i])) : 0.0f;
                dp[n][e] = p * (dp[n][e] - Dr[i]);
            }
    };

    // S = Q K^T and dP = dO V^T with K, V in tK, tV, issued (not committed): Q's and dO's fragments
    // from registers, or (QS) Q and dO from shared memory
    auto issue_s_dp = [&](float (&s)[NT][4], float (&dp)[NT][4], const char* tK, const char* tV) {
        if constexpr (QS) {
            LLMC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                ptx::wgmma_m64n64k16_ss<E>(s, wg_kdesc(wq, kc), wg_kdesc(tK, kc), kc > 0);
            LLMC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                ptx::wgmma_m64n64k16_ss<E>(dp, wg_kdesc(wo, kc), wg_kdesc(tV, kc), kc > 0);
        } else {
            wg_issue_k<E>(s, qf, tK);
            wg_issue_k<E>(dp, of, tV);
        }
    };
    // ... or above head size 64 unpipelined, one at a time: d = X B^T, X's fragments (Q's or dO's rows
    // x) into qf, B from tile, as a group of its own (fenced, issued, committed and waited for here)
    auto reloaded_product = [&](float (&d)[NT][4], const E* x, const char* tile) {
        if constexpr (!QS && !QR) {
            LLMC_UNROLL
            for (int kc = 0; kc < KC; kc++) ptx::ldmatrix_x4(qf[kc], x + frag + kc * 16);
            ptx::wgmma_fence();
            wg_issue_k<E>(d, qf, tile);
            ptx::wgmma_commit();
            ptx::wgmma_wait0(d);
        }
    };
    // the dQ product's K of tile jq (MN: K's own tile, else K^T's)
    auto kq = [&](int jq) -> const char* { return MN ? sK + jq % NK * L::kt : sKT + (jq & 1) * L::ktt; };
    // iteration j: S, dP and dS of tile j (j < ntiles), dQ += dS K of tile j - LAG (j >= LAG); K^T of
    // tile j + 1 - LAG fetched into registers during it and stored at its end (K^T buffer
    // (j + 1 - LAG) & 1, whose last reader, tile j - 1 - LAG's dQ product, every warpgroup waited for
    // in iteration j - 1)
    for (int j = 0; j < ntiles + LAG; j++) {
        const int buf = j & 1, k0 = j * BC, jk = j + 1 - LAG;
        if (j + 1 < ntiles) {  // the next tile's K, V by cp.async
            wg_load_k<HS>(sK + (j + 1) % NK * L::kt, Kg, stride, k0 + BC, kv_end);
            wg_load_k<HS>(sV + (buf ^ 1) * L::kt, Vg, stride, k0 + BC, kv_end);
            ptx::cp_async_commit();
        }
        if (!MN && jk < ntiles) wg_fetch_v<HS>(knext, Kg, stride, jk * BC, kv_end);
        if (j + 1 < ntiles)
            ptx::cp_async_wait<1>();
        else
            ptx::cp_async_wait<0>();
        ptx::fence_proxy_async();  // this thread's copies and K^T stores, to the tensor cores' reads
        __syncthreads();
        if constexpr (QR) {
            if (j == 0)
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++) {
                    ptx::ldmatrix_x4(qf[kc], sQ + frag + kc * 16);
                    ptx::ldmatrix_x4(of[kc], sO + frag + kc * 16);
                }
        }
        const char* tK = sK + j % NK * L::kt;
        const char* tV = sV + buf * L::kt;
        const bool do_s = j < ntiles && k0 < wg_end;            // uniform over the warpgroup
        const bool do_dq = PIPE && j >= 1 && k0 - BC < wg_end;  // tile j - 1's dQ product (pipelined)
        // (each path fences, issues, commits and waits in one branch: see ptx.cuh's C7520 note)
        float s[NT][4], dp[NT][4];
        if (do_s && do_dq) {  // pipelined: S_j and dP_j, then tile j - 1's dQ product under tile j's dS
            ptx::wgmma_fence();
            issue_s_dp(s, dp, tK, tV);
            ptx::wgmma_commit();
            wg_issue_acc<E, HS, MN>(dq, da, kq(j - 1));
            ptx::wgmma_commit();
            ptx::wgmma_wait<1>(s);
            ptx::wgmma_wait<1>(dp);
            ds_of(s, dp, k0);
            ptx::wgmma_wait<0>(dq);
            ptx::wgmma_keep_a(da);
        } else if (do_s && (QR || QS)) {
            ptx::wgmma_fence();
            issue_s_dp(s, dp, tK, tV);
            ptx::wgmma_commit();
            ptx::wgmma_wait0(s);
            ptx::wgmma_wait0(dp);
            ds_of(s, dp, k0);
        } else if (do_s) {  // one operand's fragments at a time (qf holds Q's, then dO's)
            reloaded_product(s, sQ, tK);
            reloaded_product(dp, sO, tV);
            ds_of(s, dp, k0);
        } else if (do_dq) {  // the last tile's dQ product
            wg_acc_product<E, HS, MN>(dq, da, kq(j - 1));
        }
        if (do_s) {
            wg_acc_a<E>(da, dp);
            if (!PIPE) wg_acc_product<E, HS, MN>(dq, da, kq(j));  // dQ += dS K now
        }
        if (!MN && jk < ntiles) wg_store_vt<HS>(sKT + (jk & 1) * L::ktt, knext);
        __syncthreads();  // the next iteration's copies overwrite this tile's K and V buffers
    }

    if (!R.active) return;
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


// The dK/dV kernel on wgmma (v10, head size 64; SS: v12, head sizes 64 and 128): one block of two
// warpgroups per (128 keys, key/value head, batch), warpgroup wg keys [64 wg, 64 wg + 64) of the
// block's, warp q of it 16, over the (head, query tile of 64) sequence of the mma.sync kernel (the
// group's heads in order, each from the first query tile that sees the block's first key); per
// query tile:
//   S^T = K Q^T and dP^T = V dO^T: HS / 16 wgmma m64n64k16 each, K's and V's A fragments in
//     registers (ldmatrix once), Q and dO from 128-byte-swizzled tiles (cp.async); SS: K and V
//     from shared memory too (wgmma_m64n64k16_ss: their rows in swizzled tiles, a warpgroup's 64
//     keys each), not from 32 registers of fragments a thread (64 at head size 128, where the
//     accumulators dK and dV alone are 128);
//   P^T and dS^T = P^T (dP^T - D) on the accumulators (lse and D of the tile's 64 queries from
//     shared memory);
//   dV += P^T dO and dK += dS^T Q: four wgmma m64nHSk16 each, P^T's and dS^T's A fragments from
//     the accumulators, dO and Q from swizzled tiles of dO^T and Q^T, transposed from the Q and dO
//     tiles once they have landed (at the end of the step before; registers hold a row only from
//     its load to its store).
// PIPE (v11, SS at head size 64): step i - 1's dV and dK products under step i's P^T and dS^T, as
// the dQ kernel's PIPE (P^T's and dS^T's fragments kept until their wait: ptxas 254 registers).
// MN (kernels.attention_wgmma_layout=mn_major): dV and dK read dO's and Q's own tiles MN-major: no
// Q^T, dO^T, and no transposing step; with PIPE, step i - 1's products read its Q and dO while step
// i + 1's land: three buffers of each (step i in buffer i % 3).
// Shared memory from a 1024-byte boundary: Q, dO [nq][HS / 64 x 8 KiB] each (swizzled; nq = 3 where
// PIPE and MN, else 2), Q^T, dO^T [2][HS / 64 x 8 KiB] (not MN), K and V [128][HS + 8] (ldmatrix's
// padded rows; SS: [2 warpgroups][HS / 64][8 KiB] swizzled), lse and D [2][64]: 102 KiB at head size
// 64 (SS 97), 194 KiB at 128; MN 70 (SS 66, PIPE 82), 130. (The kernel and its launcher take the
// layout, by the kernel's SS, PIPE and MN, from here.)
template <int HS, bool SS, bool PIPE, bool MN> struct WgDkdvSmem {
    static constexpr int nq = PIPE && MN ? 3 : 2;
    static constexpr size_t qb = (size_t)HS / 64 * 8192, kv = SS ? 2 * qb : (size_t)kWgRows * (HS + 8) * 2;
    static constexpr size_t q = 0, dO = nq * qb, qT = 2 * nq * qb, dOT = qT + 2 * qb, k = MN ? qT : dOT + 2 * qb,
                            v = k + kv, lse = v + kv, d = lse + 2 * 64 * 4, total = d + 2 * 64 * 4;
};

// grid (B * NKV, ceil(Tk / 128)), 256 threads, WgDkdvSmem<HS, SS, PIPE, MN>::total + kWgSlack bytes
template <class E, int HS, bool SS, bool PIPE, bool MN>
__global__ void __launch_bounds__(kWgThreads)
    flash_backward_dkdv_wgmma_kernel(E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                                     const float* D, int Tq, int Tk, int NH, int NKV, float scale, SeqPositions qp,
                                     SeqPositions kp, bool accumulate) {
    static_assert(HS == 64 || (SS && HS == 128), "head size 64; 128 with K and V from shared memory");
    static_assert(!PIPE || (SS && HS == 64), "pipelined: head size 64, K and V from shared memory");
    using L = WgDkdvSmem<HS, SS, PIPE, MN>;
    constexpr int NQ = L::nq;  // Q's and dO's buffers
    constexpr int BQ = 64, LD = HS + 8, NT = BQ / 8, DT = HS / 8, KC = HS / 16, LAG = PIPE ? 1 : 0;
    constexpr size_t QB = L::qb;
    char* smem = smem_1024();
    char* sQ = smem + L::q;
    char* sO = smem + L::dO;
    char* sQT = smem + L::qT;  // (not MN)
    char* sOT = smem + L::dOT;
    E* sK = reinterpret_cast<E*>(smem + L::k);  // (SS: swizzled tiles, not E rows)
    E* sV = reinterpret_cast<E*>(smem + L::v);
    float* sL = reinterpret_cast<float*>(smem + L::lse);
    float* sD = reinterpret_cast<float*>(smem + L::d);

    const int kvh = blockIdx.x % NKV, b = blockIdx.x / NKV, group = NH / NKV;
    const int k0 = blockIdx.y * kWgRows;  // the first key tiles see the most queries: first
    const long long stride = (long long)(NH + 2 * NKV) * HS, ostride = (long long)NH * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    // the (head, query tile) sequence: heads of the group in order, query tiles from the first
    // that holds a row seeing key k0
    const int first_q = first_query(qp, Tq, kp.at(k0));
    const int qt0 = first_q / BQ, nqt = first_q < Tq ? (Tq + BQ - 1) / BQ - qt0 : 0, n = group * nqt;
    auto q_of = [&](int i) { return qkv_q + (long long)b * Tq * stride + (long long)(kvh * group + i / nqt) * HS; };
    auto o_of = [&](int i) { return dout + (long long)b * Tq * ostride + (long long)(kvh * group + i / nqt) * HS; };
    // step i's copies: Q and dO (cp.async, swizzled) into buffer i % NQ, lse and D (load_lse_d) into i & 1
    auto issue = [&](int i) {
        const int q0 = (qt0 + i % nqt) * BQ, qb = i % NQ, lb = i & 1;
        wg_load_k<HS>(sQ + qb * QB, q_of(i), stride, q0, Tq);
        wg_load_k<HS>(sO + qb * QB, o_of(i), ostride, q0, Tq);
        load_lse_d<BQ, kWgThreads>(sL + lb * BQ, sD + lb * BQ, lse, D,
                                   ((long long)b * NH + kvh * group + i / nqt) * Tq + q0, q0, Tq);
    };
    // Q^T and dO^T of step i (buffers i & 1) from its Q and dO tiles (landed and seen by every thread:
    // the registers live only from the load to the store)
    auto transpose = [&](int i) {
        if constexpr (MN) return;
        const int buf = i & 1;
        uint4 x[HS / 64][2];
        wg_fetch_vt_smem<HS>(x, sQ + buf * QB);
        wg_store_vt<HS>(sQT + buf * QB, x);
        wg_fetch_vt_smem<HS>(x, sO + buf * QB);
        wg_store_vt<HS>(sOT + buf * QB, x);
    };
    const E* Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
    const E* Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
    if constexpr (SS) {  // each warpgroup's 64 keys in its own tiles
        LLMC_UNROLL
        for (int w = 0; w < 2; w++) {
            wg_load_k<HS>(smem + L::k + w * QB, Kg, stride, k0 + 64 * w, Tk);
            wg_load_k<HS>(smem + L::v + w * QB, Vg, stride, k0 + 64 * w, Tk);
        }
    } else {
        load_tile<HS, kWgRows, kWgThreads>(sK, Kg, stride, k0, Tk);
        load_tile<HS, kWgRows, kWgThreads>(sV, Vg, stride, k0, Tk);
    }
    if (n > 0) issue(0);
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (n > 0) transpose(0);

    // the warpgroup's keys [wk0, wk0 + 64), this warp's [kw0, kw0 + 16), the lane's kw0 + g and + 8
    const int wk0 = k0 + 64 * (warp / 4), kw0 = k0 + 16 * warp;
    const int wkfirst = wk0 < Tk ? kp.at(wk0) : INT_MAX;
    int kpos[2];
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        const int r = kw0 + g + 8 * i;
        kpos[i] = r < Tk ? kp.at(r) : INT_MAX;
    }
    const int klast = kw0 < Tk ? kp.at(min(Tk, kw0 + 16) - 1) : INT_MAX;
    const int arow = (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
    uint32_t kf[SS ? 1 : KC][4], vf[SS ? 1 : KC][4];  // K's and V's fragments (not SS)
    float dk[1][DT][4], dv[1][DT][4];
    LLMC_UNROLL
    for (int d = 0; d < DT; d++)
        LLMC_UNROLL
        for (int e = 0; e < 4; e++) dk[0][d][e] = dv[0][d][e] = 0.0f;

    // P^T and dS^T of the step at q0 (lse and D in buffer buf) on S^T's and dP^T's accumulators
    // (element: key row kw0 + g + 8 (e >> 1), query q0 + 8 j + 2t + (e & 1))
    auto p_ds = [&](float (&s)[NT][4], float (&dp)[NT][4], int buf, int q0) {
        const bool full = q0 + BQ <= Tq && klast <= qp.at(q0) && kw0 + 16 <= Tk;
        LLMC_UNROLL
        for (int j = 0; j < NT; j++) {
            const float2 l2 = *reinterpret_cast<const float2*>(sL + buf * BQ + j * 8 + 2 * t);
            const float2 d2 = *reinterpret_cast<const float2*>(sD + buf * BQ + j * 8 + 2 * t);
            LLMC_UNROLL
            for (int e = 0; e < 4; e++) {
                const int qi = q0 + j * 8 + 2 * t + (e & 1);
                const bool vis = full || (qi < Tq && kpos[e >> 1] <= qp.at(qi));
                const float lc = (e & 1) ? l2.y : l2.x, dc = (e & 1) ? d2.y : d2.x;
                const float p = vis ? ptx::exp2_ftz(fmaf(s[j][e], scale * kLog2e, -(lc * kLog2e))) : 0.0f;
                s[j][e] = p;
                dp[j][e] = p * (dp[j][e] - dc);
            }
        }
    };
    // S^T = K Q^T and dP^T = V dO^T of step i, issued (not committed)
    auto issue_s_dp = [&](float (&s)[NT][4], float (&dp)[NT][4], int i) {
        const int buf = i % NQ;
        if constexpr (SS) {
            const char* wk = smem + L::k + (warp / 4) * QB;
            const char* wv = smem + L::v + (warp / 4) * QB;
            LLMC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                ptx::wgmma_m64n64k16_ss<E>(s, wg_kdesc(wk, kc), wg_kdesc(sQ + buf * QB, kc), kc > 0);
            LLMC_UNROLL
            for (int kc = 0; kc < KC; kc++)
                ptx::wgmma_m64n64k16_ss<E>(dp, wg_kdesc(wv, kc), wg_kdesc(sO + buf * QB, kc), kc > 0);
        } else {
            wg_issue_k<E>(s, kf, sQ + buf * QB);
            wg_issue_k<E>(dp, vf, sO + buf * QB);
        }
    };
    uint32_t ap[4][4], ad[4][4];  // P^T's and dS^T's fragments (the step whose dV, dK products are next)
    // dV += P^T dO and dK += dS^T Q of step i with its dO^T, Q^T (MN: dO, Q), issued (not committed) ...
    auto issue_dv_dk = [&](int i) {
        const size_t off = (MN ? i % NQ : i & 1) * QB;
        wg_issue_acc<E, HS, MN>(dv[0], ap, (MN ? sO : sOT) + off);
        wg_issue_acc<E, HS, MN>(dk[0], ad, (MN ? sQ : sQT) + off);
    };
    // ... and their wait (the A registers kept until it)
    auto wait_dv_dk = [&] {
        ptx::wgmma_wait<0>(dv[0]);
        ptx::wgmma_wait<0>(dk[0]);
        ptx::wgmma_keep_a(ap);
        ptx::wgmma_keep_a(ad);
    };

    // iteration i: S^T, dP^T, P^T and dS^T of step i (i < n); dV += P^T dO and dK += dS^T Q of step
    // i - LAG (their Q^T, dO^T in buffer (i - LAG) & 1: the end of iteration i - 1 writes the other;
    // MN: their Q, dO in buffer (i - LAG) % NQ, which step i + 1's copies do not fill)
    bool prev = false;  // step i - 1 was this warpgroup's (its products pending under PIPE)
    for (int i = 0; i < (n > 0 ? n + LAG : 0); i++) {
        const int buf = i & 1, q0 = (qt0 + (i < n ? i : 0) % nqt) * BQ;
        if (i + 1 < n) {  // the next step's copies, under this one's products (landed: its end)
            issue(i + 1);
            ptx::cp_async_commit();
        }
        ptx::fence_proxy_async();  // this thread's copies and transposed stores, to the tensor cores
        __syncthreads();
        if constexpr (!SS) {
            if (i == 0)
                LLMC_UNROLL
                for (int kc = 0; kc < KC; kc++) {
                    ptx::ldmatrix_x4(kf[kc], sK + arow + kc * 16);
                    ptx::ldmatrix_x4(vf[kc], sV + arow + kc * 16);
                }
        }
        // the warpgroup's four warps together: some query of the tile sees its first key
        const bool act = i < n && wk0 < Tk && qp.at(min(Tq, q0 + BQ) - 1) >= wkfirst;
        const bool acc = PIPE && prev;  // step i - 1's products (pipelined)
        // (each path fences, issues, commits and waits in one branch: see ptx.cuh's C7520 note)
        float s[NT][4], dp[NT][4];
        if (act && acc) {  // pipelined: step i's S^T and dP^T, then step i - 1's products under its dS^T
            ptx::wgmma_fence();
            issue_s_dp(s, dp, i);
            ptx::wgmma_commit();
            issue_dv_dk(i - 1);
            ptx::wgmma_commit();
            ptx::wgmma_wait<1>(s);
            ptx::wgmma_wait<1>(dp);
            p_ds(s, dp, buf, q0);
            wait_dv_dk();
        } else if (act) {
            ptx::wgmma_fence();
            issue_s_dp(s, dp, i);
            ptx::wgmma_commit();
            ptx::wgmma_wait0(s);
            ptx::wgmma_wait0(dp);
            p_ds(s, dp, buf, q0);
        } else if (acc) {  // step i - 1's products alone
            ptx::wgmma_fence();
            issue_dv_dk(i - 1);
            ptx::wgmma_commit();
            wait_dv_dk();
        }
        if (act) {
            wg_acc_a<E>(ap, s);
            wg_acc_a<E>(ad, dp);
            if (!PIPE) {  // dV += P^T dO, dK += dS^T Q now: one group
                ptx::wgmma_fence();
                issue_dv_dk(i);
                ptx::wgmma_commit();
                wait_dv_dk();
            }
        }
        prev = act;
        // the next step's copies landed for every thread (and the Q, dO buffers the next iteration's
        // copies fill free: this step's, MN with PIPE step i - 1's); then its Q^T and dO^T into the
        // other buffers (their last readers, step i - 1's products, were waited for by every
        // warpgroup before this barrier)
        ptx::cp_async_wait<0>();
        __syncthreads();
        if (i + 1 < n) transpose(i + 1);
    }

    store_dkdv<HS, 1>(dkv, dk, dv, b, kvh, kw0, Tk, NH, NKV, scale, accumulate);
}

// The two kernels of one choice: the dQ kernel's PIPE and MN, the dK/dV kernel's SS (always at head
// size 128) and PIPE (at 64), launched where the device's shared memory holds both
template <int HS, bool SS, bool PIPE, bool MN, class E>
bool launch_backward_wgmma(E* dq_dst, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                           const float* D, int B, int Tq, int Tk, int NH, int NKV, SeqPositions qp, SeqPositions kp,
                           bool accumulate, cudaStream_t st) {
    constexpr bool kv_ss = SS || PIPE || HS == 128, kv_pipe = PIPE && HS == 64;
    auto fkv = flash_backward_dkdv_wgmma_kernel<E, HS, kv_ss, kv_pipe, MN>;
    auto fq = flash_backward_dq_wgmma_kernel<E, HS, PIPE, MN>;
    const size_t skv = WgDkdvSmem<HS, kv_ss, kv_pipe, MN>::total + kWgSlack;
    const size_t sq = WgDqSmem<HS, PIPE, MN>::total + kWgSlack;
    int optin = 0;
    if (!opt_in_smem((const void*)fkv, skv, &optin) || !opt_in_smem((const void*)fq, sq, &optin)) return false;
    const float scale = 1.0f / sqrtf((float)HS);
    LLMC_LAUNCH(fkv, dim3(B * NKV, (Tk + kWgRows - 1) / kWgRows), kWgThreads, skv, st, dkv, dout, qkv_q, qkv_kv, lse,
                D, Tq, Tk, NH, NKV, scale, qp, kp, accumulate);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(fq, dim3(B * NH, (Tq + kWgRows - 1) / kWgRows), kWgThreads, sq, st, dq_dst, dout, qkv_q, qkv_kv, lse, D,
                Tq, Tk, NH, NKV, scale, qp, kp, accumulate);
    CUDA_CHECK_LAUNCH();
    return true;
}
// dK, dV and dQ on wgmma: the dK/dV kernel with K and V from registers (v10, head size 64) or from
// shared memory (`ss`: v12, and always at head size 128), both kernels pipelined at head size 64
// (`pipelined`: v11, the dK/dV kernel's K and V from shared memory; at 128 the dQ kernel alone, its
// Q and dO from shared memory); `mn`: Q, dO and K read MN-major as they lie (v13 as v10/v12, v14 as
// v12, v15 as v11);
// where wgmma_available and the device's shared memory holds the tiles (dK/dV: 102 KiB at 64, 97
// with ss, 194 at 128; with mn 70, 66 (82 pipelined) and 130; dQ: 85 and 165 KiB (161 pipelined),
// with mn 69 (77 pipelined) and 133 (145 pipelined)); false: nothing launched
template <class E>
bool try_backward_wgmma(E* dq_dst, E* dkv, const E* dout, const E* qkv_q, const E* qkv_kv, const float* lse,
                        const float* D, int B, int Tq, int Tk, int NH, int NKV, int HS, SeqPositions qp,
                        SeqPositions kp, bool accumulate, cudaStream_t st, bool pipelined = false, bool ss = false,
                        bool mn = false) {
    if ((HS != 64 && HS != 128) || !wgmma_available()) return false;
#define LLMC_WG_BWD(D_, S, P, M)                                                                                 \
    launch_backward_wgmma<D_, S, P, M>(dq_dst, dkv, dout, qkv_q, qkv_kv, lse, D, B, Tq, Tk, NH, NKV, qp, kp, \
                                       accumulate, st)
#define LLMC_WG_BWD_MN(D_, S, P) (mn ? LLMC_WG_BWD(D_, S, P, true) : LLMC_WG_BWD(D_, S, P, false))
#define LLMC_WG_BWD_HS(D_)                                                                       \
    (pipelined ? LLMC_WG_BWD_MN(D_, true, true)                                                  \
               : ss || D_ == 128 ? LLMC_WG_BWD_MN(D_, true, false) : LLMC_WG_BWD_MN(D_, false, false))
    return HS == 64 ? LLMC_WG_BWD_HS(64) : LLMC_WG_BWD_HS(128);
#undef LLMC_WG_BWD_HS
#undef LLMC_WG_BWD_MN
#undef LLMC_WG_BWD
}

}  // namespace flash
