// The flash forward on Hopper's warpgroup MMA (sm_90a; dev/cuda/attention_forward v7 and v8,
// kernels.attention_forward=wgmma and wgmma_pipelined), head sizes 64 and 128, bf16 or fp16: what flash_forward_kernel
// computes (FlashAttention-2's online softmax, P from registers, the same masks and skips), with each
// product one wgmma for a warpgroup of four warps instead of eight mma.sync a warp, and K and V
// read by the tensor cores from shared memory instead of ldmatrix into registers. Part of
// llmc/cuda/flash_attention.cuh (included there, after what it uses: visible, load_tile).
//
// One block of two warpgroups (8 warps, 256 threads) per (128 query rows, head, batch); warpgroup
// wg owns rows [64 wg, 64 wg + 64) of the block's, warp q of it 16 of them, as ptx.cuh's wgmma
// layout gives them. Per key tile of 64:
//   S = Q K^T: HS / 16 wgmma m64n64k16 (k-steps of 16 head columns), Q's A fragments in
//     registers (ldmatrix once), K from 128-byte-swizzled tiles: row n = key n, 128 bytes (64)
//     of head columns, a tile for each 64 of them;
//   the online softmax on S's registers (rows g and g + 8 of each warp's 16, 16 keys a lane);
//   O += P V: four wgmma m64nHSk16 (k-steps of 16 keys), P's A fragments from S's registers
//     (acc_to_a), V from a swizzled tile of V^T: row n = head column n, 128 bytes of keys.
// K streams by cp.async into the swizzled places; V^T cannot (a copy does not transpose): each
// thread loads two keys' 16 bytes of one head chunk (warp w: head columns 8w..8w+7, and 64 on at
// head size 128; lane: keys 2 lane, 2 lane + 1) into registers during the tile before, and stores
// 8 words of two keys after it (a warp's 32 stores fall in 32 banks: the swizzle spreads the chunk).
// MN (v9, v10; kernels.attention_wgmma_layout=mn_major): V's tile copied by cp.async as K's is and
// read by the PV product MN-major, as it lies (FlashAttention-3's bf16 V): no registers, no
// transposing stores.
// v7 waits for each group at once (no overlap of a warpgroup's own softmax and MMA: the other
// warpgroups of the SM supply that, as with mma.sync); v8 (PIPE) overlaps tile j's softmax with tile
// j - 1's PV product, FlashAttention-3's intra-warpgroup pipelining. Its producer warps and TMA are
// the next steps, once a GPU has timed these.
// ptxas sm_90a, registers at head size 64 / 128: v7 124 / 204, v8 162 / 230, v9 112 / 175, v10 128
// (bounded for two blocks an SM; 161 unbounded) / 216; no spill. Two blocks of 256 threads an SM
// where 128 or fewer: v7, v9, v10 at 64.
#pragma once

namespace flash {

constexpr int kWgThreads = 256, kWgRows = 128, kWgBC = 64;

// shared memory, from a 1024-byte-aligned base: K [2][HS / 64][64 keys][128 bytes], V^T [2][HS][128
// bytes] (every tile a multiple of 1024 bytes from the base, as the swizzle's atoms must be), Q
// [128][HS + 8] (ldmatrix's padded rows)
template <int HS> struct WgSmem {
    static constexpr size_t kt = (size_t)HS / 64 * 8192, vtt = (size_t)HS * 128;  // a buffer's bytes
    static constexpr size_t k = 0, vt = 2 * kt, q = vt + 2 * vtt, total = q + (size_t)kWgRows * (HS + 8) * 2;
};

// The dynamic shared memory from its first 1024-byte boundary (a launch asks for kWgSlack bytes
// more; the emulator's is 1024-byte aligned)
#if defined(LLMC_CUEMU)
constexpr size_t kWgSlack = 0;
__device__ __forceinline__ char* smem_1024() { return ::cuemu::dynamic_smem(); }
#else
constexpr size_t kWgSlack = 1024;
__device__ __forceinline__ char* smem_1024() {
    extern __shared__ __align__(1024) char wg_smem[];
    return wg_smem + ((1024 - (ptx::smem_addr(wg_smem) & 1023)) & 1023);
}
#endif

// The byte offset of 16-byte chunk c (0-7) of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ int sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// The descriptor of k-step kc (head columns 16 kc ..) of K (or Q, dO, V) in wg_load_k's tiles
__device__ __forceinline__ uint64_t wg_kdesc(const char* tiles, int kc) {
    return ptx::wgmma_desc_sw128(tiles + kc / 4 * 8192, kc % 4 * 32);
}

// The products whose B is a wg_load_k tile (S = Q K^T, dP = dO V^T, and the dK/dV kernel's S^T and
// dP^T): KC k-steps of wgmma m64n64k16 into d (the first overwriting it), A's fragments a, issued
// and not committed
template <class E, int KC>
__device__ __forceinline__ void wg_issue_k(float (&d)[8][4], const uint32_t (&a)[KC][4], const char* tiles) {
    LLMC_UNROLL
    for (int kc = 0; kc < KC; kc++) ptx::wgmma_m64k16<E, 64>(d, a[kc], wg_kdesc(tiles, kc), kc > 0);
}

// K rows [t0, t0 + 64) into the swizzled tiles (head columns 64 s .. 64 s + 63 in tile s) by
// cp.async; rows at or past n zero
template <int HS, class E>
__device__ __forceinline__ void wg_load_k(char* dst, const E* src, long long stride, int t0, int n) {
    constexpr int CH = HS / 8;
    for (int idx = threadIdx.x; idx < kWgBC * CH; idx += kWgThreads) {
        const int r = idx / CH, c = idx % CH;
        char* d = dst + (c / 8) * 8192 + sw128(r, c % 8);
        if (t0 + r < n) {
            ptx::cp_async_16(d, src + (long long)(t0 + r) * stride + c * 8);
        } else {
            uint64_t* z = reinterpret_cast<uint64_t*>(d);
            z[0] = 0;
            z[1] = 0;
        }
    }
}

// This thread's share of V rows [t0, t0 + 64): keys t0 + 2 lane and + 1, head columns 8 c ..
// 8 c + 7 for c = warp + 8 h, h < HS / 64 (zero past n)
template <int HS, class E>
__device__ __forceinline__ void wg_fetch_v(uint4 (&v)[HS / 64][2], const E* src, long long stride, int t0, int n) {
    const int key = t0 + 2 * (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    LLMC_UNROLL
    for (int h = 0; h < HS / 64; h++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++)
            v[h][i] = key + i < n
                          ? *reinterpret_cast<const uint4*>(src + (long long)(key + i) * stride + (warp + 8 * h) * 8)
                          : make_uint4(0, 0, 0, 0);
}
// ... and stored transposed: V^T row 8 c + i, keys 2 lane and 2 lane + 1 in one word
template <int HS> __device__ __forceinline__ void wg_store_vt(char* dst, const uint4 (&v)[HS / 64][2]) {
    const int p = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    LLMC_UNROLL
    for (int h = 0; h < HS / 64; h++) {
        const uint32_t w0[4] = {v[h][0].x, v[h][0].y, v[h][0].z, v[h][0].w};
        const uint32_t w1[4] = {v[h][1].x, v[h][1].y, v[h][1].z, v[h][1].w};
        LLMC_UNROLL
        for (int i = 0; i < 8; i++) {
            const int row = 8 * (warp + 8 * h) + i;
            const uint32_t a = w0[i / 2], b = w1[i / 2];
            const uint32_t word = i % 2 == 0 ? (a & 0xffffu) | (b << 16) : (a >> 16) | (b & 0xffff0000u);
            *reinterpret_cast<uint32_t*>(dst + sw128(row, p / 4) + (p % 4) * 4) = word;
        }
    }
}

// ... or from shared memory: the same rows of wg_load_k's swizzled tiles (head columns 64 h .. in
// tile h) once they have landed (the dK/dV kernel's Q^T and dO^T)
template <int HS> __device__ __forceinline__ void wg_fetch_vt_smem(uint4 (&v)[HS / 64][2], const char* tiles) {
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    LLMC_UNROLL
    for (int h = 0; h < HS / 64; h++)
        LLMC_UNROLL
        for (int i = 0; i < 2; i++)
            v[h][i] = *reinterpret_cast<const uint4*>(tiles + h * 8192 + sw128(2 * lane + i, warp));
}

// Where a query-row block of the wgmma kernels (the forward's, the dQ kernel's) stands: head h of
// batch b, its key/value head kvh and pointers Kg, Vg (row stride `stride`), rows [q0, q0 + 128)
// (the heaviest, last, first), keys [0, kv_end) seen by some row in ntiles tiles; the warpgroup's
// rows [wg0, wg0 + 64), tiles from wg_end on skipped by its four warps together (a wgmma is the
// warpgroup's); this warp's rows [w0, w0 + 16) (active: some before Tq), keys before w_full seen by
// all of them; the lane's rows w0 + g and + 8, keys [0, seen[i]) visible to row i.
template <int HS, class E> struct WgRows {
    int h, b, kvh, q0, kv_end, ntiles, wg0, wg_end, w0, w_full, seen[2];
    bool active;
    long long stride;
    const E *Kg, *Vg;
    __device__ __forceinline__ WgRows(const E* qkv_kv, int Tq, int Tk, int NH, int NKV, SeqPositions qp,
                                      SeqPositions kp) {
        h = blockIdx.x % NH, b = blockIdx.x / NH, kvh = h / (NH / NKV);
        q0 = (gridDim.y - 1 - blockIdx.y) * kWgRows;
        stride = (long long)(NH + 2 * NKV) * HS;
        Kg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + kvh) * HS;
        Vg = qkv_kv + (long long)b * Tk * stride + (long long)(NH + NKV + kvh) * HS;
        kv_end = visible(kp, Tk, qp.at(min(Tq, q0 + kWgRows) - 1));
        ntiles = (kv_end + kWgBC - 1) / kWgBC;
        const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
        wg0 = q0 + 64 * (warp / 4), w0 = q0 + 16 * warp;
        wg_end = wg0 < Tq ? visible(kp, kv_end, qp.at(min(Tq, wg0 + 64) - 1)) : 0;
        active = w0 < Tq;
        w_full = active ? visible(kp, kv_end, qp.at(w0)) : 0;
        LLMC_UNROLL
        for (int i = 0; i < 2; i++) {
            const int r = w0 + g + 8 * i;
            seen[i] = r < Tq ? visible(kp, kv_end, qp.at(r)) : kv_end;
        }
    }
};

// The products whose A is another product's accumulators (O += P V here, dQ += dS K, dV += P^T dO
// and dK += dS^T Q in flash_backward_wgmma.cuh), over 64 rows of X: wg_acc_a rounds the
// accumulators p (64 columns) into the four k-steps' A fragments (n-tiles 2 kc and 2 kc + 1);
template <class E> __device__ __forceinline__ void wg_acc_a(uint32_t (&a)[4][4], const float (&p)[8][4]) {
    LLMC_UNROLL
    for (int kc = 0; kc < 4; kc++) ptx::acc_to_a<E>(a[kc], p[2 * kc], p[2 * kc + 1]);
}
// wg_issue_acc issues the four wgmma m64nNk16 (not committed), X^T from the swizzled tile xt (N rows);
// MN (kernels.attention_wgmma_layout=mn_major): X itself, as wg_load_k lays its 64 rows down (N
// columns in N / 64 tiles 8 KiB apart), read MN-major (ptx.cuh's TB: k-step kc 16 rows, 2 KiB in)
template <class E, int N, bool MN = false>
__device__ __forceinline__ void wg_issue_acc(float (&d)[N / 8][4], const uint32_t (&a)[4][4], const char* xt) {
    LLMC_UNROLL
    for (int kc = 0; kc < 4; kc++)
        ptx::wgmma_m64k16<E, N, MN>(
            d, a[kc], MN ? ptx::wgmma_desc_sw128_mn(xt, kc * 2048, 8192) : ptx::wgmma_desc_sw128(xt, kc * 32), true);
}
// ... and wg_acc_product runs them as a group of their own: fenced, issued, committed and waited
// for in one place (see ptx.cuh's C7520 note)
template <class E, int N, bool MN = false>
__device__ __forceinline__ void wg_acc_product(float (&d)[N / 8][4], const uint32_t (&a)[4][4], const char* xt) {
    ptx::wgmma_fence();
    wg_issue_acc<E, N, MN>(d, a, xt);
    ptx::wgmma_commit();
    ptx::wgmma_wait0(d);
    ptx::wgmma_keep_a(a);
}

// The online softmax of one key tile k0 on this thread's S accumulators s (rows g and g + 8 of its
// warp's 16; masked where the tile crosses some row's last visible key): s becomes P = exp2(s scale
// - m), the row maxima m and sums l move on, alpha[i] the factor O's row i takes (O itself is the
// caller's: under the pipelined kernel's PV product still in flight)
template <int HS, class E, int NT>
__device__ __forceinline__ void wg_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           const WgRows<HS, E>& R, int k0, float scale_log2) {
    const int t = threadIdx.x % 4;
    if (k0 + kWgBC > R.w_full) {  // the tile crosses some row's last visible key
        LLMC_UNROLL
        for (int i = 0; i < 2; i++)
            LLMC_UNROLL
            for (int n = 0; n < NT; n++)
                LLMC_UNROLL
                for (int e = 2 * i; e < 2 * i + 2; e++)
                    if (k0 + n * 8 + 2 * t + (e & 1) >= R.seen[i]) s[n][e] = -INFINITY;
    }
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        float mx = -INFINITY;
        LLMC_UNROLL
        for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
        alpha[i] = ptx::exp2_ftz(m[i] - m_use);
        float sum = 0.0f;
        LLMC_UNROLL
        for (int n = 0; n < NT; n++)
            LLMC_UNROLL
            for (int e = 2 * i; e < 2 * i + 2; e++) {
                s[n][e] = ptx::exp2_ftz(fmaf(s[n][e], scale_log2, -m_use));
                sum += s[n][e];
            }
        l[i] = l[i] * alpha[i] + sum;
        m[i] = m_new;
    }
}

// grid (B * NH, ceil(Tq / 128)), 256 threads, WgSmem<HS>::total + kWgSlack bytes of shared memory.
// PIPE (dev/cuda/attention_forward v8, kernels.attention_forward=wgmma_pipelined; v7 without):
// FlashAttention-3's intra-warpgroup pipelining. Iteration j issues S_j = Q K_j^T and then O += P_{j-1}
// V_{j-1} as two groups, waits for the first (wait_group 1), runs tile j's softmax while the tensor
// cores still compute the second, and only then waits for O and rescales it. So V_j is needed one
// iteration later than K_j: it is stored (transposed) at the end of iteration j, and one more
// iteration issues the last tile's PV. P_{j-1}'s A registers stay untouched until O's wait (the
// softmax writes S_j's), as wgmma's reading of registers asks.
template <class E, int HS, bool PIPE, bool MN>
__global__ void __launch_bounds__(kWgThreads, HS == 64 && MN ? 2 : 1)  // (v10: 128 registers, no spill)
    flash_forward_wgmma_kernel(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int Tq, int Tk, int NH,
                               int NKV, float scale_log2, SeqPositions qp, SeqPositions kp) {
    static_assert(HS == 64 || HS == 128, "the wgmma shapes of ptx.cuh");
    using L = WgSmem<HS>;
    constexpr int BC = kWgBC, LD = HS + 8, NT = BC / 8, DT = HS / 8, LAG = PIPE ? 1 : 0;
    char* smem = smem_1024();
    char* sK = smem + L::k;
    char* sVt = smem + L::vt;  // (MN: V's rows as they lie)
    E* sQ = reinterpret_cast<E*>(smem + L::q);

    const WgRows<HS, E> R(qkv_kv, Tq, Tk, NH, NKV, qp, kp);
    const int h = R.h, b = R.b, q0 = R.q0, kv_end = R.kv_end, ntiles = R.ntiles, wg_end = R.wg_end, w0 = R.w0;
    const long long stride = R.stride;
    const E *Kg = R.Kg, *Vg = R.Vg, *Qg = qkv_q + (long long)b * Tq * stride + (long long)h * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    load_tile<HS, kWgRows, kWgThreads>(sQ, Qg, stride, q0, Tq);
    uint4 vnext[MN ? 1 : HS / 64][2];  // (MN: unused)
    // V of tile jv into buffer jv & 1: by cp.async (MN), else into registers (the store follows)
    auto fetch_v = [&](int jv) {
        if constexpr (MN) wg_load_k<HS>(sVt + (jv & 1) * L::vtt, Vg, stride, jv * BC, kv_end);
        else wg_fetch_v<HS>(vnext, Vg, stride, jv * BC, kv_end);
    };
    if (ntiles > 0) {
        wg_load_k<HS>(sK, Kg, stride, 0, kv_end);
        if (!PIPE) {
            fetch_v(0);
            if constexpr (!MN) wg_store_vt<HS>(sVt, vnext);
        }
    }
    ptx::cp_async_commit();

    uint32_t qf[HS / 16][4], pa[4][4];  // Q's fragments; P's (the tile whose O += P V is next)
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    LLMC_UNROLL
    for (int d = 0; d < DT; d++)
        LLMC_UNROLL
        for (int e = 0; e < 4; e++) o[d][e] = 0.0f;

    // iteration j: S of tile j (j < ntiles), O += P V of tile j - LAG (j >= LAG); V of tile j + 1 - LAG
    // fetched during it into V buffer (j + 1 - LAG) & 1, whose last reader, tile j - 1 - LAG's PV, every
    // warpgroup waited for in iteration j - 1 (into registers and stored at its end; MN: copied, one
    // group with K's, landed by the next iteration's wait)
    for (int j = 0; j < ntiles + LAG; j++) {
        const int buf = j & 1, k0 = j * BC, jv = j + 1 - LAG;
        if (j + 1 < ntiles)  // the next tile's K by cp.async
            wg_load_k<HS>(sK + (buf ^ 1) * L::kt, Kg, stride, k0 + BC, kv_end);
        if (jv < ntiles) fetch_v(jv);
        ptx::cp_async_commit();  // (perhaps empty)
        ptx::cp_async_wait<1>();  // every group but this iteration's
        ptx::fence_proxy_async();  // this thread's copies and V^T stores, to the tensor cores' reads
        __syncthreads();
        if (j == 0) {
            const E* qrow = sQ + (16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
            LLMC_UNROLL
            for (int kc = 0; kc < HS / 16; kc++) ptx::ldmatrix_x4(qf[kc], qrow + kc * 16);
        }
        const bool do_s = j < ntiles && k0 < wg_end;          // uniform over the warpgroup
        const bool do_pv = PIPE && j >= 1 && k0 - BC < wg_end;  // tile j - 1's PV (pipelined)
        // (each path fences, issues, commits and waits in one branch: see ptx.cuh's C7520 note)
        float s[NT][4], alpha[2];
        if (do_s && do_pv) {  // pipelined: S_j, then tile j - 1's PV under tile j's softmax
            ptx::wgmma_fence();
            wg_issue_k<E>(s, qf, sK + buf * L::kt);
            ptx::wgmma_commit();
            wg_issue_acc<E, HS, MN>(o, pa, sVt + (buf ^ 1) * L::vtt);
            ptx::wgmma_commit();
            ptx::wgmma_wait<1>(s);
            wg_softmax(s, m, l, alpha, R, k0, scale_log2);
            ptx::wgmma_wait<0>(o);
            ptx::wgmma_keep_a(pa);
        } else if (do_s) {
            ptx::wgmma_fence();
            wg_issue_k<E>(s, qf, sK + buf * L::kt);
            ptx::wgmma_commit();
            ptx::wgmma_wait0(s);
            wg_softmax(s, m, l, alpha, R, k0, scale_log2);
        } else if (do_pv) {  // the last tile's PV
            wg_acc_product<E, HS, MN>(o, pa, sVt + (buf ^ 1) * L::vtt);
        }
        if (do_s) {
            LLMC_UNROLL
            for (int d = 0; d < DT; d++)
                LLMC_UNROLL
                for (int i = 0; i < 2; i++) {
                    o[d][2 * i] *= alpha[i];
                    o[d][2 * i + 1] *= alpha[i];
                }
            wg_acc_a<E>(pa, s);
            if (!PIPE) wg_acc_product<E, HS, MN>(o, pa, sVt + buf * L::vtt);  // O += P V now
        }
        if constexpr (!MN)
            if (jv < ntiles) wg_store_vt<HS>(sVt + (jv & 1) * L::vtt, vnext);
        __syncthreads();  // the next iteration's copies overwrite this tile's K buffer
    }

    if (!R.active) return;
    LLMC_UNROLL
    for (int i = 0; i < 2; i++) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const int r = w0 + g + 8 * i;
        if (r >= Tq) continue;
        const float inv = li > 0.0f ? 1.0f / li : 0.0f;
        E* orow = out + (((long long)b * Tq + r) * NH + h) * HS;
        LLMC_UNROLL
        for (int d = 0; d < DT; d++)
            *reinterpret_cast<uint32_t*>(orow + d * 8 + 2 * t) =
                ptx::pack2<E>(o[d][2 * i] * inv, o[d][2 * i + 1] * inv);
        if (t == 0)
            lse[((long long)b * NH + h) * Tq + r] = li > 0.0f ? m[i] * 0.6931471805599453f + logf(li) : -INFINITY;
    }
}

// Whether this build and device run the wgmma forward: an sm_90 device and a build with sm_90a
// code (GPU_ARCH naming 90a defines LLMC_SM90A); the emulator always.
inline bool wgmma_available() {
#if defined(LLMC_CUEMU)
    return true;
#elif defined(LLMC_SM90A)
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

template <int HS, bool PIPE, bool MN, class E>
bool try_forward_wgmma_hs(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int B, int Tq, int Tk, int NH,
                          int NKV, SeqPositions qp, SeqPositions kp, cudaStream_t st) {
    auto fn = flash_forward_wgmma_kernel<E, HS, PIPE, MN>;
    const size_t bytes = WgSmem<HS>::total + kWgSlack;
    int optin = 0;
    if (!opt_in_smem((const void*)fn, bytes, &optin)) return false;
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)HS);
    LLMC_LAUNCH(fn, dim3(B * NH, (Tq + kWgRows - 1) / kWgRows), kWgThreads, bytes, st, out, lse, qkv_q, qkv_kv, Tq,
                Tk, NH, NKV, scale_log2, qp, kp);
    CUDA_CHECK_LAUNCH();
    return true;
}
// The wgmma forward where it applies (head sizes 64 and 128, wgmma_available, the device's shared
// memory: 52 KiB a block at 64, 99 KiB at 128); `pipelined` the kernel's PIPE (v8, else v7), `mn`
// its MN (V read as it lies: v9, v10); false: the caller takes another
template <class E>
bool try_forward_wgmma(E* out, float* lse, const E* qkv_q, const E* qkv_kv, int B, int Tq, int Tk, int NH, int NKV,
                       int HS, SeqPositions qp, SeqPositions kp, cudaStream_t st, bool pipelined = false,
                       bool mn = false) {
    if ((HS != 64 && HS != 128) || !wgmma_available()) return false;
#define LLMC_WG_FWD(D, P, M) try_forward_wgmma_hs<D, P, M>(out, lse, qkv_q, qkv_kv, B, Tq, Tk, NH, NKV, qp, kp, st)
#define LLMC_WG_FWD_HS(P, M) (HS == 64 ? LLMC_WG_FWD(64, P, M) : LLMC_WG_FWD(128, P, M))
    if (mn) return pipelined ? LLMC_WG_FWD_HS(true, true) : LLMC_WG_FWD_HS(false, true);
    return pipelined ? LLMC_WG_FWD_HS(true, false) : LLMC_WG_FWD_HS(false, false);
#undef LLMC_WG_FWD_HS
#undef LLMC_WG_FWD
}

}  // namespace flash
