// Causal attention forward: qkv [B,T,3,NH,HS] -> out [B,T,NH,HS], lse [B,NH,T].
// ./attention_forward <version> [B T NH HS]
//   1: naive, one thread per query row, fp32 (baseline)
//   2: llmc/cuda/attention.cuh flash forward, fp32 FMA tiles
//   3: llmc/cuda/attention.cuh general forward, bf16 wmma tiles (the trainer's bf16 forward until
//      issue 30; now its fallback for head sizes the tensor-core path does not cover)
//   4: llmc/cuda/flash_attention.cuh, FlashAttention-2 design, 16 query rows a warp
//   5: the same kernel with 32 query rows a warp (MT = 2; the trainer's bf16 forward for head
//      sizes up to 64 since this version, 16 rows above); from 2026-11-27 also at head sizes 80
//      to 128, where Q's fragments are reloaded from shared memory at each k-step of S
//   6: version 5 with 128-key tiles (head size 64)
//   7: llmc/cuda/flash_forward_wgmma.cuh, Hopper's warpgroup MMA (head sizes 64 and 128, sm_90a)
//   8: version 7 with the softmax of each key tile overlapping the previous tile's PV product
//   9, 10: versions 7 and 8 with V read by the tensor cores as it lies (MN-major), not transposed
//
// Lab notebook (causal, bf16, FLOPs counted as FlashAttention counts them: 4 B NH HS T^2 / 2):
//   v3  H200, GPT-2 124M step under Nsight Compute (issue 30, main 15afec7): the forward kernel
//       51.9 ms of the two steps; with the two backward kernels about 8 TFLOP/s. Why slow: every
//       wmma fragment reloaded from shared memory per 16x16 tile; S, P and the O accumulator
//       round-trip through shared memory per key tile (with a __syncthreads between each phase);
//       scalar 2-byte global loads with runtime / HS and % HS; no overlap of loads and math.
//   v4  not yet measured (no GPU in the session that wrote it; the command is below). What
//       changes: each warp owns 16 query rows and keeps Q, S, P and O in registers (mma.sync
//       m16n8k16, the S accumulators rounded straight into P's A registers), operands come by
//       ldmatrix (one instruction per four 8x8 fragments, conflict-free with the 16-byte row
//       pad), K/V tiles stream by cp.async into a double buffer while the previous tile is
//       computed, two __syncthreads per key tile instead of six, the softmax in exp2 with the
//       scale folded into one FMA, masking only on the tiles that cross the diagonal, the
//       heaviest query tiles scheduled first. Target (issue 30): >= 300 TFLOP/s at HS 64/128.
//       Measured: H200, main 62ee587 (gpu_check --attention, dev/bench/RESULTS.md), causal bf16
//       B=8 T=1024: 138.2 TFLOP/s at NH=12 HS=64, 147.5 at NH=32 HS=64, 171.1 at NH=16 HS=128;
//       PyTorch's SDPA (flash) in the same call 195.7, 267.0, 309.5.
//   v5  not yet measured (no GPU in the session that wrote it). What changes: each warp owns two
//       m-tiles (32 query rows, 128 a block of 4 warps), so each K fragment (ldmatrix) feeds four
//       mma instead of two and each V fragment likewise: half the shared-memory operand traffic
//       per FLOP, and half the blocks (each loading the K/V tiles once for twice the rows).
//       FlashAttention-2 gives a warp 32 rows at head size 64 (kBlockM 128, 4 warps). Registers:
//       Q 32, O 64, S 64 per lane at HS 64 (check -Xptxas -v for spills). Prediction: the forward
//       from 138-148 toward 200+ TFLOP/s at HS 64; HS 128 unchanged (still 16 rows).
//   v5 above head size 64 (2026-11-27), not yet measured: at HS 128 one m-tile is 173 TFLOP/s on
//       the H200 against SDPA's 324, and each K and V fragment feeds two mma. Two m-tiles halve
//       the V loads per mma (0.5 -> 0.25) and cut S's (Q reloaded: 0.5 -> 0.375), at a price:
//       O alone is 128 registers a lane, so ptxas sm_90 spills 52 bytes at 32-key tiles (116 at
//       64; HS 96: none at 32, 44 at 64; HS 80 at 64: 242 registers, none). FlashAttention-2
//       runs HS 128 this way (kBlockM 128, 4 warps, Q from shared memory). If it beats v4 at HS
//       128, the trainer's choice (flash::forward_hs) follows.
//   v4, v5 measured (H200, main b24a415, fourth window): v5 156.8 TFLOP/s at NH=12 HS=64 (v4
//       138.6), 169.7 at NH=32 HS=64, 192.0 at NH=16 HS=128 (v4 171-173 in the third window);
//       SDPA in the same call 183.2, 267.5, 335.1. v5 is the trainer's forward at head sizes up
//       to 64; at 128 the trainer keeps v4 until one call times both.
//   v6  not yet measured (written 2026-11-27 without a GPU): v5 with 128-key tiles at head size
//       64 (FlashAttention-2's 128 x 128 tiles there), Q's fragments reloaded
//       from shared memory at each k-step (S alone is 128 registers a lane). Why it might be
//       faster: the fourth window's rates say v5's cost per head is twice SDPA's once the grid
//       is full (NH 12 -> 32 at B=8: v5 +120 us for 20 heads, SDPA +58 us), so what v5 loses is
//       per key tile, not the grid's tail. Per key tile a warp pays fixed latency (the cp.async
//       wait and two block barriers, the row maxima's shuffles, the O rescale): 128 keys pay it
//       once for twice the mma. The price: Q's 8 extra ldmatrix a tile (the K and V ones stay
//       32 each) and 90 KiB of shared memory a block (two blocks an SM on sm_80/sm_90; sm_86/89
//       refuse it: v6 then reports that it does not cover the shape). If it beats v5 at HS 64,
//       the trainer's choice (flash::forward_hs) follows.
//   All flash versions (2026-11-28, not yet measured): the exponentials by ex2.approx.ftz
//       (ptx::exp2_ftz, what FlashAttention compiles exp2f to under --use_fast_math) instead of
//       exp2f's ex2.approx with its three instructions for subnormal results. ptxas sm_90: v5 at
//       head size 64 2792 -> 2584 instructions (254 -> 247 registers), v4 at 128 2280 -> 2176; the
//       backward's dQ kernels 5-10% fewer. A softmax probability below 2^-126 becomes 0. Spills
//       went with the instructions: v5 above head size 64 at 32-key tiles none at 96 and 128 (were
//       0 and 52 bytes), at 64-key tiles none and 36 (were 44 and 116). And O is rescaled only
//       when some row of the warp's 8 found a larger maximum (a warp vote; alpha is exactly 1
//       otherwise): 2 DT multiplies a lane a tile saved where no maximum moved (the emulator's
//       digests: bitwise the same results).
//   v7  not yet measured (written 2026-11-28 without a GPU): the products on wgmma (sm_90a), each
//       one instruction a warpgroup (m64n64k16) where v5 issues eight mma.sync a warp and the
//       ldmatrix that feed them: K and V^T are read by the tensor cores straight from 128-byte-
//       swizzled shared memory (V transposed on its way in, through registers). Static counts
//       (ptxas sm_90a): at head size 64 1792 instructions, 126 registers (two blocks of 256
//       threads an SM: 16 warps, against v5's 8), at 128 2072 and 204 (one block: 8 warps, v4's
//       4); no spill. Each warpgroup waits for its own wgmma at once; the
//       other warpgroups of the SM overlap it. Checked on the emulator (test_gpu attention_wgmma,
//       ptx.wgmma_*); the descriptor's form (K-major, 128-byte swizzle, SBO 1024) and the fragment
//       layouts are CUTLASS's and the PTX ISA's, to be confirmed by test_gpu ptx on a GPU.
//   v8  not yet measured (written 2026-11-28 without a GPU): v7 with FlashAttention-3's intra-
//       warpgroup pipelining. Iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} as two
//       groups, waits for S_j alone (wait_group 1), and runs tile j's softmax while the tensor
//       cores compute the PV product; then waits for O and rescales it. In v7 the tensor cores of a
//       warpgroup idle through its softmax unless the SM's other warpgroups fill them. The price is
//       registers: P_{j-1}'s A fragments stay untouched until O's wait while S_j is live, so 162
//       registers at head size 64 (one block of 8 warps an SM where v7 runs two: at 128 registers
//       ptxas spills 20 bytes) and 230 at 128 (v7: 204; one block either way); no spill. FA3
//       reports 570 -> 620-660 TFLOP/s from this at head size 128 (its ablation, H100). Note for
//       every wgmma kernel: ptxas serializes all of a kernel's wgmma (info C7520, "wgmma.mma_async
//       instructions are serialized") when a wgmma.fence and its wgmma sit in different branches;
//       a first draft of v8 did, and v7 with it: each path now fences, issues, commits and waits
//       in one branch, and test_dev_cuda fails on the message.
//   v9, v10 not yet measured (written 2026-11-28 without a GPU): v7 and v8 with V's tile copied by
//       cp.async as K's is (the same 128-byte-swizzled rows: key n, 64 head columns a tile) and
//       read by the PV product MN-major (imm-trans-b 1, ptx.cuh's TB), as FlashAttention-3 reads
//       its bf16 V. v7/v8 bring each thread's share of V into registers during the tile before
//       and store it transposed (16 4-byte shared stores a thread at head size 64, 32 at 128), and
//       keep those 8 (16) registers live across the tile. ptxas sm_90a, head size 64 / 128: v9
//       112 / 175 registers (v7 124 / 204), v10 161 / 216 (v8 162 / 230); v10 at 64 bounded to
//       128 for two blocks of 8 warps an SM (v8 spills 20 bytes there), no spill. Depends on
//       test_gpu's ptx.wgmma_mn_major passing on a GPU (the descriptor's LBO/SBO roles for MN-major).
//   To measure (B T NH HS after the version; d_model 2048 as FlashAttention's benchmarks):
//     make -C dev/cuda attention_forward && for v in 3 4 5 6 7 8 9 10; do ./dev/cuda/attention_forward $v 8 1024 32 64;
//     ./dev/cuda/attention_forward $v 8 1024 16 128; done
#include "dev/cuda/common.h"
#include "llmc/cuda/attention.cuh"


__global__ void attention_forward_naive(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * NH * T) return;
    int t = idx % T, h = (idx / T) % NH, b = idx / (T * NH);
    const float scale = rsqrtf((float)HS);
    const float* q = qkv + ((size_t)(b * T + t) * 3 * NH + h) * HS;
    float mx = -INFINITY, sum = 0;
    for (int j = 0; j <= t; j++) {
        const float* k = qkv + ((size_t)(b * T + j) * 3 * NH + NH + h) * HS;
        float d = 0;
        for (int i = 0; i < HS; i++) d += q[i] * k[i];
        d *= scale;
        float nm = fmaxf(mx, d);
        sum = sum * expf(mx - nm) + expf(d - nm);
        mx = nm;
    }
    float* o = out + ((size_t)(b * T + t) * NH + h) * HS;
    for (int i = 0; i < HS; i++) o[i] = 0;
    for (int j = 0; j <= t; j++) {
        const float* k = qkv + ((size_t)(b * T + j) * 3 * NH + NH + h) * HS;
        const float* v = qkv + ((size_t)(b * T + j) * 3 * NH + 2 * NH + h) * HS;
        float d = 0;
        for (int i = 0; i < HS; i++) d += q[i] * k[i];
        float p = expf(d * scale - mx) / sum;
        for (int i = 0; i < HS; i++) o[i] += p * v[i];
    }
    lse[idx] = mx + logf(sum);
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 4);
    if (version < 1 || version > 10) {
        std::printf("attention_forward: version %d is not one of 1-10 (see the top of attention_forward.cu)\n",
                    version);
        return 1;
    }
    const std::vector<int> d = bench_case("attention", argc, argv, 4);  // B T NH NKV HS; NKV = NH here
    int B = d[0], T = d[1], NH = d[2], HS = d[d.size() - 1];
    std::printf("attention_forward v%d B=%d T=%d NH=%d HS=%d\n", version, B, T, NH, HS);
    const size_t nqkv = (size_t)B * T * 3 * NH * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
    auto qkv = rand_vec(nqkv, 2.0f);
    if (version >= 3) round_bf16(qkv);
    std::vector<float> out(no), lse(nl);
    const std::string key =
        strfmt("attention_forward B%d T%d NH%d HS%d qkv 2 seed 42%s", B, T, NH, HS, version >= 3 ? " bf16" : "");
    cached_reference(key, {&out, &lse},
                     [&] { cpu::attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS); });
    std::function<void()> run;
    bool ok = true;
    if (version == 1 || version == 2) {
        float *dqkv = to_dev<float>(qkv), *dout = dev_poisoned<float>(no), *dlse = dev_poisoned<float>(nl);
        if (version == 1)
            run = [=] { attention_forward_naive<<<ceil_div(B * NH * T, 128), 128>>>(dout, dlse, dqkv, B, T, NH, HS); };
        else
            run = [=] { attn::attention_forward<float>(dout, dlse, dqkv, B, T, NH, NH, HS, 0, KernelWays()); };
        run();
        ok &= validate("out", to_host(dout, no), out, 1e-4);
        ok &= validate("lse", to_host(dlse, nl), lse, 1e-4);
    } else {
        bf16 *dqkv = to_dev<bf16>(qkv), *dout = dev_poisoned<bf16>(no);
        float* dlse = dev_poisoned<float>(nl);
        if (version == 3)
            run = [=] {
                attn::attention_block_forward_general<bf16>(dout, dlse, dqkv, dqkv, B, T, T, NH, NH, HS,
                                                            SeqPositions(), SeqPositions(), 0);
            };
        else if (version >= 7)
            run = [=] {
                if (!flash::try_forward_wgmma(dout, dlse, dqkv, dqkv, B, T, T, NH, NH, HS, SeqPositions(), SeqPositions(),
                                              0, version % 2 == 0, version >= 9))
                    std::printf("v%d needs head size 64 or 128 on an sm_90 device with sm_90a code (HS=%d)\n", version,
                                HS),
                        std::exit(1);
            };
        else
            run = [=] {
                const int rows = version == 4 ? 16 : 32, key_tile = version == 6 ? 128 : 0;
                if (!flash::forward(dout, dlse, dqkv, dqkv, B, T, T, NH, NH, HS, SeqPositions(), SeqPositions(), 0, rows,
                                    key_tile))
                    std::printf("v%d does not cover HS=%d (see flash::forward)\n", version, HS), std::exit(1);
            };
        run();
        ok &= validate("out", to_host(dout, no), out, 2e-2);
        ok &= validate("lse", to_host(dlse, nl), lse, 1e-3);
    }
    CUDA_CHECK(cudaGetLastError());
    float ms = bench_ms(run);
    double flops = 4.0 * B * NH * HS * (double)T * T / 2;  // causal: half of QK^T and PV
    std::printf("time %.4f ms, %.1f TFLOP/s (causal)\n", ms, flops / ms * 1e-9);
    return ok ? 0 : 1;
}
