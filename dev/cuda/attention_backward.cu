// Causal attention backward: dqkv from dout, qkv, out, lse (D = rowsum(dO*O) precomputed).
// ./attention_backward <version> [B T NH HS]
//   1: llmc/cuda/attention.cuh, fp32 FMA tiles (dK/dV per key tile, dQ per query tile)
//   2: llmc/cuda/attention.cuh, bf16 wmma tiles (the trainer's bf16 backward until issue 30; now
//      its fallback for head sizes the tensor-core path does not cover)
//   3: llmc/cuda/flash_backward.cuh, FlashAttention-2 design, 16 rows a warp (the trainer's bf16
//      backward until 2026-11-27; still its choice above head size 64)
//   4: the same with 32 rows a warp (two m-tiles): dK/dV over 32-query tiles, dQ over 32-key
//      tiles, the trainer's choice up to head size 64 from 2026-11-27 until the fourth GPU window
//      timed v6 (still its choice at 32; 3 and 4 are the same kernels above 64)
//   5: 16 rows a warp over 32-row tiles (the way a device short of shared memory takes, e.g.
//      sm_86 at head size 128): half of v3's S and dP accumulators a warp (at head size 128 the
//      dK/dV kernel holds 128 accumulator registers for dK and dV alone), twice the tile steps
//   6: v3's 64-row tiles, 16 rows a warp, the dK/dV kernel taking each query tile in two passes of
//      32 columns (head sizes 64 and 128; v5's live S^T and dP^T accumulators with v3's barriers):
//      the trainer's choice at head size 64 since the fourth GPU window
//   7: the trainer's ways (v6 at head size 64, v3 at 128) with dQ from the dS^T that the dK/dV
//      kernel writes to memory (B NH T T bf16 of scratch) instead of recomputing S and dP
//   8: one kernel (llmc/cuda/flash_backward_fused.cuh, head sizes 64 and 128): v6's dK/dV kernel
//      that also adds dQ += dS K into fp32 accumulators, deterministically
//   9: the trainer's dK/dV kernel with the dQ kernel on Hopper's wgmma
//      (llmc/cuda/flash_backward_wgmma.cuh; head sizes 64 and 128, sm_90a)
//  10: both kernels on wgmma (head size 64)
//  11: both kernels pipelined: each tile's dS under the previous tile's products (head size 64; the
//      dK/dV kernel's K and V from shared memory, as v12); at 128 v12's dK/dV kernel and the dQ
//      kernel pipelined, its Q and dO read by the tensor cores from shared memory
//  12: both kernels on wgmma, the dK/dV kernel's K and V from shared memory (head sizes 64 and 128;
//      v10 at 128 is this)
//  13-15: v10, v12 and v11 with K (dQ), Q and dO (dK/dV) read by the tensor cores as they lie
//      (MN-major), not transposed (13 at head size 128 is 14)
//
// Lab notebook (causal, bf16; FLOPs as FlashAttention counts them: 2.5 x the forward's 4 B NH HS T^2 / 2):
//   v2  H200, GPT-2 124M step under Nsight Compute (issue 30, main 15afec7): dQ 48.1 ms and dK/dV
//       39.7 ms of two steps (with the forward about 8 TFLOP/s). Why slow: 32x32 tiles, every wmma
//       fragment and S, dP, P, dS round-tripped through shared memory, the dK/dV grid's lightest
//       key tiles dispatched first.
//   v3  not yet measured (no GPU in the session that wrote it). What changes: per warp 16 key
//       rows (dK/dV) or 16 query rows (dQ), S/dP/P/dS and the accumulators in registers (mma.sync,
//       P and dS rounded from the accumulators straight into A registers), ldmatrix operands,
//       cp.async double-buffered streams of Q/dO (dK/dV) or K/V (dQ), masking only on tiles that
//       cross the diagonal, heaviest tiles first in both grids; still deterministic (each block
//       owns what it writes; dQ recomputes S and dP rather than adding atomically).
//       Measured, H200, 2026-11-27 (main 791cfe5), B 8 T 1024: HS 64 NH 12 0.4113 ms ~78.3 TFLOP/s,
//       HS 128 NH 16 0.7674 ms ~111.9, against PyTorch's SDPA (flash) 0.2326 ms 138.5 and 0.3728 ms
//       230.4 in the same call. In the GPT-2 124M B=32 step (ncu): dK/dV 12.62 ms, dQ 6.08 ms: the
//       dK/dV kernel does four products a tile (S^T, dP^T, dV, dK) at ~98 TFLOP/s, the dQ kernel
//       three (S, dP, dQ) at ~153, at the same occupancy (233 and 174 registers: two blocks of 4
//       warps an SM). One difference: each dK/dV tile step loaded the tile's lse and D with plain
//       loads after issuing the cp.async of Q and dO, and two of the four warps waited for them.
//   v3' (after 2026-11-27) lse and D travel by cp.async with Q and dO; their pairs are read as
//       float2. Not yet measured.
//   v4  not yet measured. Why it should be faster: per 16 x 8 x 16 mma the dK/dV kernel loaded
//       0.56 ldmatrix.x4 (512 bytes a warp) from shared memory and the dQ kernel 0.5; with two
//       m-tiles a warp each loaded fragment feeds two mma (dK/dV 0.375: S^T, dP^T 32 loads for
//       64 mma, dV, dK 16 for 64; dQ 0.25: S, dP 16 for 64, dQ 8 for 32), and a warp has twice
//       the independent mma between its loads (the forward's two m-tiles gave +14% at head size
//       64 on the H200). ptxas sm_90 bf16 HS 64: dK/dV 255 registers, dQ 250, no spill.
//   v5  not yet measured (written 2026-11-27 to be timed beside v3/v4: fewer live registers
//       against more barriers and cp.async waits per key or query). ptxas sm_90 bf16, registers a
//       thread (dK/dV, dQ): HS 64 v3 235, 168; v4 255, 250; v5 168, 161: v5 alone fits three
//       blocks of 4 warps an SM (12 warps to hide the mma and ldmatrix latencies, against 8; its
//       shared memory 37 KiB a block); HS 128 v3 255 with 8 bytes spilled, 251; v5 247, 242, no spill.
//   v6  not yet measured (written 2026-11-27 with v5, for the same question). ptxas sm_90 bf16
//       dK/dV: HS 64 168 (4 bytes spilled: bounded to three blocks an SM, 170 without, which
//       ptxas's allocation rounds to 176, room for two); HS 128 247, no spill (v3's 255).
//   v3-v6 measured, H200, 2026-11-27 (main b24a415, dev/bench/RESULTS.md's fourth window), B 8
//       T 1024, ms (TFLOP/s): HS 64 NH 12: v3 0.3297 (97.7), v4 0.3479 (92.6), v5 0.3176 (101.4),
//       v6 0.2916 (110.4; again 0.2941 beside v4's 0.3495); HS 64 NH 32: v3 0.8406, v4 0.8597,
//       v5 0.8032, v6 0.7509 (114.4); HS 128 NH 16: v3 0.6825 (125.9), v4 0.6821, v5 0.7403,
//       v6 0.7035. PyTorch's SDPA in the same call: 0.2180 (147.8), 0.4499 (190.9), 0.3991
//       (215.2). So v4's two m-tiles (255 registers, two blocks an SM) lost to one m-tile at
//       head size 64, and v6's passes (168 registers, three blocks) won: the trainer takes v6 at
//       head size 64, v3 at 128. v6 is still 1.3-1.7x SDPA's time.
//   v7  not yet measured (written 2026-11-27 after the fourth window). Why it should be faster:
//       the dQ kernel does three products a key tile (S, dP again, then dQ) where FlashAttention-2
//       does one (its dK/dV kernel adds dS K into dQ with fp32 atomics: not deterministic); here
//       the dK/dV kernel stores the dS^T it already holds (rounded as dK's product takes it) and
//       the dQ kernel reads it back: one product and 2 B NH T^2/2 bytes written and read (100 MB
//       at B 8 NH 12 T 1024, ~0.035 ms each way at ~3 TB/s) against two products recomputed (about
//       2/3 of v6's dQ kernel, ~0.08 ms of its ~0.13 by the window's numbers). Prediction at HS 64
//       NH 12: 0.29 ms -> ~0.24. Cost: the scratch (805 MB at GPT-2 124M B 32; capped at 2 GiB).
//   v8  not yet measured (written 2026-11-28 without a GPU): one kernel, FlashAttention-2's shape
//       (llmc/cuda/flash_backward_fused.cuh). v6's dK/dV kernel leaves each tile's dS^T in shared
//       memory, and after a barrier each warp adds dS K for 16 query rows into fp32 dQ
//       accumulators (fp32 reductions into L2, each address always from the same thread, in the
//       block's fixed key tile order: deterministic without FA2's order-dependent atomics); a
//       small kernel sums the splits' accumulators and rounds. Per 64 x 64 tile a warp issues 80
//       ldmatrix and 128 mma (dK/dV) + 20 and 32 (dQ) where v6 issues 80 and 128 + 48 and 96 (its
//       dQ kernel recomputes S and dP): 29% fewer mma, 22% fewer ldmatrix, one launch less. The
//       price: a third barrier-bounded phase per tile, 4 KB of reductions a warp per tile, and
//       zeroing and summing the accumulators (splits x B NH T HS floats: 25 MB a split at B 8 NH 12
//       T 1024 HS 64). B NKV blocks alone underfill the device at small batches, so each block
//       takes a split of the head's key tiles (fused_splits: 4 splits at B 8 NH 12 on 132 SMs).
//       ptxas sm_90: 168 registers at head size 64 (three blocks an SM), 248 at 128, no spill.
//       Prediction at HS 64 NH 12: v6's 0.29 ms -> ~0.23 (the dQ kernel's ~0.11 ms replaced by
//       ~0.05 of extra work in the dK/dV kernel).
//   v9  not yet measured (written 2026-11-28 without a GPU): v6's dK/dV kernel (v3's at 128) and
//       the dQ kernel on wgmma, the wgmma forward's shape (attention_forward v7: two warpgroups a
//       block, 64 query rows each): S = Q K^T and dP = dO V^T as HS/16 wgmma m64n64k16 each with K
//       and V read from 128-byte-swizzled tiles, dQ += dS K as four wgmma m64nHSk16 from a swizzled
//       K^T (transposed through registers). Where v6's dQ kernel issues 32 ldmatrix and 96 mma.sync a
//       warp per 64 x 64 tile (at head size 64), this one issues 12 wgmma a warpgroup and no
//       ldmatrix after the first tile. ptxas sm_90a: 166 registers at head size 64 (one block of
//       256 threads an SM: 8 warps, against v6's dQ kernel's 12; at 128 registers ptxas spilled
//       128 bytes), 2384 instructions; at 128, Q's and dO's fragments reloaded each tile and the
//       two products one after the other, 216 registers, 2856 instructions; no spill.
//   v10 not yet measured (written 2026-11-28 without a GPU): v9 with the dK/dV kernel on wgmma too
//       (head size 64): two warpgroups a block of 128 keys, per query tile of 64 S^T = K Q^T and
//       dP^T = V dO^T (K's and V's A fragments kept in registers, Q and dO from swizzled tiles),
//       then dV += P^T dO and dK += dS^T Q from swizzled tiles of dO^T and Q^T (both transposed
//       through registers): 16 wgmma a warpgroup per tile where v6 issues 80 ldmatrix and 128
//       mma.sync a warp. ptxas sm_90a: 254 registers (one block of 256 threads an SM: 8 warps,
//       v6's has 12), 3152 instructions, no spill.
//   v11 not yet measured (written 2026-11-28 without a GPU): v10 with the forward's v8 pipelining in
//       the dQ kernel: iteration j issues S_j and dP_j as one group and dQ += dS_{j-1} K_{j-1} as a
//       second, waits for the first alone (wait_group 1), computes dS_j (exp2, the masks, P (dP -
//       D)) while the tensor cores run the dQ product, then waits for dQ. In v9/v10 the tensor cores
//       of a warpgroup idle through its dS unless the other warpgroup fills them (one block an SM).
//       dS_{j-1}'s A fragments stay live across the iteration: ptxas sm_90a 192 registers (v9's
//       kernel 166), still one block an SM; no spill. The dK/dV kernel (253 registers) has no room
//       for the same without reloading K's and V's fragments: since v12 (below) v11's dK/dV kernel
//       is v12's, pipelined the same way (step i - 1's dV and dK products under step i's P^T and
//       dS^T): 254 registers, no spill.
//   v12 not yet measured (written 2026-11-28 without a GPU): the dK/dV kernel's first products (S^T =
//       K Q^T, dP^T = V dO^T) with A from shared memory too (wgmma "SS": K's and V's rows in
//       128-byte-swizzled tiles, a warpgroup's 64 keys each, read by the tensor cores through a
//       descriptor) instead of 32 registers of fragments a thread (64 at head size 128, beside dK and
//       dV's 128 accumulators: v10 cannot run there). FlashAttention-3's backward reads them so.
//       Also since this version, in v10 too: Q^T and dO^T are transposed from the Q and dO tiles
//       once they have landed in shared memory (at the end of the step before, after one barrier),
//       not from registers loaded a step ahead. ptxas sm_90a: v10 229 registers (was 253), v12 231
//       at head size 64 and 254 at 128; no spill (with the register transposes, 68 bytes of spill at
//       128). Shared memory: 97 KiB at 64, 194 KiB at 128 (an sm_90 device's 227 holds it).
//   v11 at head size 128 (written 2026-11-28 without a GPU, not yet measured): the dQ kernel's S = Q
//       K^T and dP = dO V^T with Q and dO from swizzled shared memory (wgmma's SS form, as
//       FlashAttention-3's backward) instead of ldmatrix fragments (64 registers at 128, reloaded
//       each tile with S waited for before dP), so both products issue as one group and the dQ
//       product of the tile before runs under dS, as at 64. ptxas sm_90a: 206 registers (v9: 216;
//       v15 at 128: 186), no spill. Shared memory 161 KiB (v15: 145).
//   v13-v15 not yet measured (written 2026-11-28 without a GPU): v10, v12, v11 with the dV += P^T dO,
//       dK += dS^T Q and dQ += dS K products reading dO's, Q's and K's own tiles MN-major
//       (imm-trans-b 1) instead of transposed copies: the dK/dV kernel no longer transposes Q and
//       dO (its step's second barrier then only orders the buffers), the dQ kernel no longer
//       fetches K a tile ahead into 8 (16) registers and stores it transposed; shared memory 101 ->
//       69 KiB at 64 (SS 97 -> 65), 193 -> 129 at 128, the dQ kernel's 84 -> 68 and 164 -> 132.
//       FlashAttention-3 reads them so. v15 (v11's pipelining): step i - 1's products read its K
//       (dQ), Q and dO (dK/dV) while step i + 1's copies land, so those have three buffers (dK/dV
//       82 KiB, dQ 77). ptxas sm_90a: dQ 158 registers at 64, 197 at 128 (v9's 166,
//       216); dK/dV 232 (v13 at 64), 231 (v14 at 64), 253 (128); v15 dQ 180 (v11's 192), dK/dV
//       255 (254); no spill. Depends on test_gpu's ptx.wgmma_mn_major on a GPU.
//   To measure: make -C dev/cuda attention_backward && for v in 2 3 4 5 6; do
//     ./dev/cuda/attention_backward $v 8 1024 32 64; ./dev/cuda/attention_backward $v 8 1024 16 128; done
//   (for v in 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
#include "dev/cuda/common.h"
#include "llmc/cuda/attention.cuh"

static KernelWays g_ways;  // the version's (main)

template <class T>
static bool run_version(const std::vector<float>& qkv, const std::vector<float>& dout, std::vector<float> out,
                        const std::vector<float>& lse, const std::vector<float>& ref, int B, int Tn, int NH, int HS,
                        double tol) {
    const size_t nqkv = qkv.size();
    if (std::is_same<T, bf16>::value) round_bf16(out);
    T *dq = to_dev<T>(qkv), *ddo = to_dev<T>(dout), *dout_ = to_dev<T>(out), *dd = dev_poisoned<T>(nqkv);
    float* dl = to_dev<float>(lse);
    float* D = dev_poisoned<float>((size_t)B * NH * Tn);
    static GrowBuffer ds;  // v7's dS^T, v8's dQ accumulators
    auto run = [=] { attn::attention_backward<T>(dd, ddo, dq, dout_, dl, D, B, Tn, NH, NH, HS, 0, g_ways, &ds); };
    run();
    bool ok = validate("dqkv", to_host(dd, nqkv), ref, tol);
    float ms = bench_ms(run);
    double flops = 2.0 * 4.0 * B * NH * HS * (double)Tn * Tn / 2 * 1.25;  // ~2.5x forward (S recomputed twice)
    std::printf("time %.4f ms, ~%.1f TFLOP/s\n", ms, flops / ms * 1e-9);
    return ok;
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 3);
    if (version < 1 || version > 15) {
        std::printf("attention_backward: version %d is not one of 1-15 (see attention_backward.cu's top)\n", version);
        return 1;
    }
    g_ways.flash_backward = version >= 3;
    g_ways.bwd_rows_per_warp = version == 4 ? 32 : 16;
    g_ways.bwd_tile = version == 5 ? 32 : 0;
    g_ways.bwd_pass = version == 6 ? 32 : version >= 7 ? 0 : 64;
    g_ways.bwd_dq = version == 13 ? 4 : version == 14 ? 6 : version == 15 ? 5 : version >= 7 ? version - 6 : 0;
    g_ways.wgmma_mn = version >= 13;
    const std::vector<int> d = bench_case("attention", argc, argv, 4);  // B T NH NKV HS; NKV = NH here
    int B = d[0], T = d[1], NH = d[2], HS = d[d.size() - 1];
    std::printf("attention_backward v%d B=%d T=%d NH=%d HS=%d\n", version, B, T, NH, HS);
    if (version >= 9 && ((HS != 64 && HS != 128) || !flash::wgmma_available())) {
        std::printf("v%d needs head size 64 or 128 on an sm_90 device with sm_90a code (HS=%d)\n", version, HS);
        return 1;
    }
    const size_t nqkv = (size_t)B * T * 3 * NH * HS, no = (size_t)B * T * NH * HS;
    auto qkv = rand_vec(nqkv, 2.0f, 1), dout = rand_vec(no, 1.0f, 2);
    if (version >= 2) round_bf16(qkv), round_bf16(dout);
    std::vector<float> ref(nqkv), out(no), lse((size_t)B * NH * T);
    const std::string key = strfmt("attention_backward B%d T%d NH%d HS%d qkv 2 seed 1 dout 1 seed 2%s", B, T, NH, HS,
                                   version >= 2 ? " bf16" : "");
    cached_reference(key, {&ref, &out, &lse}, [&] {
        cpu::attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS);
        cpu::attention_backward<float>(ref.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NH, HS);
    });
    bool ok = version == 1 ? run_version<float>(qkv, dout, out, lse, ref, B, T, NH, HS, 1e-4)
                           : run_version<bf16>(qkv, dout, out, lse, ref, B, T, NH, HS, 2e-2);
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
