// Unit tests of the emulator itself: `cuemu_selftest CASE` runs one small kernel and checks its
// result against a value computed here on the host. The good cases exit 0; the broken ones must
// fail (test/cuemu/run.sh expects each to exit non-zero with its message):
//   reduce            block reduction through shared memory and shuffles (good)
//   ballot            __ballot_sync, __shfl_sync/__shfl_up_sync/__shfl_down_sync, atomics (good)
//   dynamic_smem      dynamic shared memory with the opt-in attribute past 48 KiB (good)
//   missing_barrier   the reduction without the barrier after the scratch writes (wrong sum)
//   divergent_shuffle a full-mask shuffle inside `if (lane < 16)` (abort: lane has exited)
//   barrier_in_branch __syncthreads inside `if (threadIdx.x < 96)` (abort: threads have exited)
//   smem_short        dynamic shared memory one row short of what the kernel writes (abort)
//   off_by_one        a store one past the end of a device allocation (abort)
//   no_optin          70 KiB of dynamic shared memory without the opt-in (launch error)
//   bad_pointer       a host pointer passed to a kernel (abort)
//   lt_rules          the cuBLASLt stand-in: a transposed GEMM with leading dimensions, bias and
//                     scale pointers against a host loop; refused: fp8 not TN, E5M2 x E5M2, fp8
//                     with a misaligned pointer, fp8 with an fp32 C and bf16 D, bf16 x fp32 (good)
//   copy_unwaited     a cp.async read with no wait_group before it (right where copies land at
//                     their issue, ORDER forward; NaN where at their wait, the other orders)
//   wgmma_tile        a wgmma of B that other threads wrote, fenced and published (good)
//   wgmma_early       a wgmma issued above the barrier behind which other threads write its B
//                     (right where it reads at its wait, ORDER forward; wrong where at its issue)
//   proxy_unfenced    B written and published with no fence.proxy.async (abort: the async
//                     proxy's view differs)
//   lt_epilogues      the stand-in's GELU_AUX_BIAS (aux = bias-added value, D = its tanh GELU) and
//                     BGRADB (op(B)'s column sums) against host loops; refused: an aux leading
//                     dimension not a multiple of 8 or below the rows, no aux pointer, BGRADB
//                     without a bias pointer, an aux less aligned than at the heuristic (good)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "llmc/cuda/ptx.cuh"
#include "llmc/precision/bf16.h"
#include "llmc/precision/fp8.h"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::printf("FAIL %s: %s\n", #x, cudaGetErrorName(e_));                         \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)
#define LAUNCH(k, g, b, s, ...) CUEMU_LAUNCH(k, g, b, s, nullptr, __VA_ARGS__)

namespace {

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// out[block] = sum of in[block * blockDim.x ...]; barrier = false drops the barrier that makes
// the warps' partial sums visible before they are read
__global__ void reduce_kernel(float* out, const float* in, bool barrier) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    float v = warp_sum(in[blockIdx.x * blockDim.x + threadIdx.x]);
    if (lane == 0) scratch[warp] = v;
    if (barrier) __syncthreads();
    v = warp_sum(lane < nw ? scratch[lane] : 0.0f);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
    __syncthreads();  // scratch is reused by the next block on this thread's copy
    scratch[threadIdx.x % 32] = -1e30f;
}

__global__ void intrinsics_kernel(unsigned* ballots, int* shf, int* counter) {
    const int lane = threadIdx.x % 32;
    const unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
    const int from0 = __shfl_sync(0xffffffffu, lane * 10, 0);
    const int up = __shfl_up_sync(0xffffffffu, lane, 1);
    const int down = __shfl_down_sync(0xffffffffu, lane, 2);
    const int half = lane < 16 ? __shfl_sync(0x0000ffffu, lane, 15) : __shfl_sync(0xffff0000u, lane, 16);
    if (lane == 0) ballots[threadIdx.x / 32] = b;
    shf[threadIdx.x * 4 + 0] = from0;
    shf[threadIdx.x * 4 + 1] = up;
    shf[threadIdx.x * 4 + 2] = down;
    shf[threadIdx.x * 4 + 3] = half;
    atomicAdd(counter, 1);
    atomicMax(counter + 1, (int)threadIdx.x);
}

// rows x 32 floats of dynamic shared memory: row r = r, read back transposed by another warp
__global__ void smem_kernel(float* out, int rows) {
    float* s = reinterpret_cast<float*>(::cuemu::dynamic_smem());
    for (int r = threadIdx.x / 32; r < rows; r += blockDim.x / 32) s[r * 32 + threadIdx.x % 32] = (float)r;
    __syncthreads();
    float acc = 0.0f;
    for (int r = 0; r < rows; r++) acc += s[r * 32 + (threadIdx.x + 1) % 32];
    out[threadIdx.x] = acc;
}

__global__ void divergent_shuffle_kernel(float* out) {
    float v = 1.0f;
    if (threadIdx.x % 32 < 16) v = warp_sum(v);
    out[threadIdx.x] = v;
}
__global__ void barrier_in_branch_kernel(float* out) {
    if (threadIdx.x < 96) {
        out[threadIdx.x] = 1.0f;
        __syncthreads();
    }
}
__global__ void store_kernel(float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;  // the bug: <= instead of <
}

// 16 floats a thread copied by cp.async into dynamic shared memory and read back with no
// wait_group (the bug) after the commit
__global__ void copy_unwaited_kernel(float* out, const float* in) {
    float* s = reinterpret_cast<float*>(::cuemu::dynamic_smem());
    ptx::cp_async_16(s + 4 * threadIdx.x, in + 4 * threadIdx.x);
    ptx::cp_async_commit();
    __syncthreads();
    out[threadIdx.x] = s[4 * threadIdx.x];
}
// D = A B (m64n64k16 x 4, A all ones) by warpgroup 1 of B's 64 x 64 tile (K-major, 128-byte
// swizzled), which warpgroup 0 writes, fences (fence.proxy.async) and publishes with a barrier.
// early (the bug of wgmma_early): warpgroup 1 issues before that barrier and waits after it;
// fence = false (the bug of proxy_unfenced): the writers do not fence. out[n] = D[0][n] = the sum
// over k of B[n][k]
__global__ void wgmma_tile_kernel(float* out, const __nv_bfloat16* b, bool early, bool fence) {
    char* tile = ::cuemu::dynamic_smem();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp < 4) {
        for (int i = threadIdx.x; i < 64 * 8; i += 128) {  // row n = i / 8, 16-byte chunk c = i % 8
            const int n = i / 8, c = i % 8;
            std::memcpy(tile + n * 128 + ((c ^ (n % 8)) << 4), b + n * 64 + c * 8, 16);
        }
        if (fence) ptx::fence_proxy_async();
    }
    float d[8][4];
    uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 1.0 pairs
    auto issue = [&] {
        ptx::wgmma_fence();
        for (int kc = 0; kc < 4; kc++)
            ptx::wgmma_m64k16<__nv_bfloat16, 64>(d, a, ptx::wgmma_desc_sw128(tile, kc * 32), kc > 0);
        ptx::wgmma_commit();
    };
    if (warp >= 4 && early) issue();
    __syncthreads();
    if (warp >= 4) {
        if (!early) issue();
        ptx::wgmma_wait0(d);
        if (warp == 4 && lane < 4)  // row 0: d[i][0..1] at columns 8 i + 2 lane, + 1
            for (int i = 0; i < 8; i++) out[8 * i + 2 * lane] = d[i][0], out[8 * i + 2 * lane + 1] = d[i][1];
    }
}

int fail(const std::string& why) {
    std::printf("FAIL %s\n", why.c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string c = argc > 1 ? argv[1] : "";
    if (c == "reduce" || c == "missing_barrier") {
        const int blocks = 7, threads = 256;
        std::vector<float> h(blocks * threads), got(blocks);
        for (size_t i = 0; i < h.size(); i++) h[i] = (float)(i % 13) - 6.0f;  // exact sums
        float *in, *out;
        CHECK(cudaMalloc(&in, h.size() * 4));
        CHECK(cudaMalloc(&out, blocks * 4));
        CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        LAUNCH(reduce_kernel, blocks, threads, 0, out, (const float*)in, c == "reduce");
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(got.data(), out, blocks * 4, cudaMemcpyDeviceToHost));
        for (int b = 0; b < blocks; b++) {
            float want = 0;
            for (int t = 0; t < threads; t++) want += h[b * threads + t];
            if (got[b] != want) return fail("block " + std::to_string(b) + ": sum " + std::to_string(got[b]) +
                                            ", want " + std::to_string(want));
        }
        std::printf("PASS %s\n", c.c_str());
        return 0;
    }
    if (c == "ballot") {
        unsigned* ballots;
        int *shf, *counter;
        CHECK(cudaMalloc(&ballots, 2 * 4));
        CHECK(cudaMalloc(&shf, 64 * 4 * 4));
        CHECK(cudaMalloc(&counter, 2 * 4));
        CHECK(cudaMemset(counter, 0, 8));
        LAUNCH(intrinsics_kernel, 3, 64, 0, ballots, shf, counter);
        CHECK(cudaGetLastError());
        unsigned b[2];
        int s[64 * 4], cnt[2];
        CHECK(cudaMemcpy(b, ballots, 8, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(s, shf, sizeof(s), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(cnt, counter, 8, cudaMemcpyDeviceToHost));
        unsigned want_b = 0;
        for (int l = 0; l < 32; l++) want_b |= (l % 3 == 0 ? 1u : 0u) << l;
        if (b[0] != want_b || b[1] != want_b) return fail("ballot");
        for (int t = 0; t < 64; t++) {
            const int l = t % 32;
            if (s[t * 4] != 0 || s[t * 4 + 1] != (l >= 1 ? l - 1 : l) || s[t * 4 + 2] != (l + 2 < 32 ? l + 2 : l) ||
                s[t * 4 + 3] != (l < 16 ? 15 : 16))
                return fail("shuffle results of thread " + std::to_string(t));
        }
        if (cnt[0] != 3 * 64 || cnt[1] != 63) return fail("atomics");
        std::printf("PASS ballot\n");
        return 0;
    }
    if (c == "dynamic_smem" || c == "smem_short" || c == "no_optin") {
        const int rows = c == "no_optin" ? 560 : 400;  // 400 rows: 51,200 bytes (past 48 KiB)
        const size_t bytes = (size_t)(c == "smem_short" ? rows - 1 : rows) * 32 * 4;
        if (c != "no_optin") CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        float* out;
        CHECK(cudaMalloc(&out, 128 * 4));
        LAUNCH(smem_kernel, 2, 128, bytes, out, rows);
        CHECK(cudaGetLastError());
        float got[128];
        CHECK(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost));
        const float want = (float)rows * (rows - 1) / 2;
        for (float g : got)
            if (g != want) return fail("dynamic shared memory sum " + std::to_string(g));
        std::printf("PASS %s\n", c.c_str());
        return 0;
    }
    if (c == "divergent_shuffle" || c == "barrier_in_branch") {
        float* out;
        CHECK(cudaMalloc(&out, 256 * 4));
        if (c == "divergent_shuffle") LAUNCH(divergent_shuffle_kernel, 1, 64, 0, out);
        else LAUNCH(barrier_in_branch_kernel, 1, 256, 0, out);
        CHECK(cudaGetLastError());
        std::printf("PASS %s (no error caught)\n", c.c_str());
        return 0;
    }
    if (c == "capture") {  // stream capture: work recorded, not run; the graph runs it, reading its inputs then
        const int blocks = 2, threads = 64, n = blocks * threads;
        float *in, *out, *host;
        CHECK(cudaMalloc(&in, n * 4));
        CHECK(cudaMalloc(&out, blocks * 4));
        CHECK(cudaMallocHost(&host, n * 4));
        CHECK(cudaMemset(out, 0, blocks * 4));
        cudaStream_t st;
        CHECK(cudaStreamCreate(&st));
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < n; i++) host[i] = 1.0f;
        CHECK(cudaMemcpyAsync(in, host, n * 4, cudaMemcpyHostToDevice, st));
        LAUNCH(reduce_kernel, blocks, threads, 0, out, (const float*)in, true);
        float got[2] = {-1, -1};
        std::vector<float> pageable(n);
        // what a capture may not hold: a synchronization, a copy from pageable memory, an allocation
        if (cudaStreamSynchronize(st) != cudaErrorStreamCaptureUnsupported) return fail("a sync was captured");
        if (cudaMemcpyAsync(in, pageable.data(), n * 4, cudaMemcpyHostToDevice, st) != cudaErrorStreamCaptureUnsupported)
            return fail("a copy from pageable memory was captured");
        cudaGraph_t g;
        if (cudaStreamEndCapture(st, &g) != cudaErrorStreamCaptureInvalidated || g) return fail("not invalidated");
        (void)cudaGetLastError();
        // again, cleanly: nothing ran at capture; each launch of the graph reads the pinned input as it is then
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemcpyAsync(in, host, n * 4, cudaMemcpyHostToDevice, st));
        LAUNCH(reduce_kernel, blocks, threads, 0, out, (const float*)in, true);
        CHECK(cudaStreamEndCapture(st, &g));
        CHECK(cudaMemcpy(got, out, 8, cudaMemcpyDeviceToHost));
        if (got[0] != 0.0f || got[1] != 0.0f) return fail("captured work ran at capture");
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        for (int round = 1; round <= 2; round++) {
            for (int i = 0; i < n; i++) host[i] = (float)round;
            CHECK(cudaGraphLaunch(e, st));
            CHECK(cudaMemcpy(got, out, 8, cudaMemcpyDeviceToHost));
            if (got[0] != threads * (float)round || got[1] != threads * (float)round)
                return fail("graph launch " + std::to_string(round) + ": sums " + std::to_string(got[0]));
        }
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
        std::printf("PASS capture\n");
        return 0;
    }
    if (c == "off_by_one") {
        float* out;
        CHECK(cudaMalloc(&out, 1000 * 4));
        LAUNCH(store_kernel, 8, 128, 0, out, 1000);
        CHECK(cudaGetLastError());
        std::printf("PASS off_by_one (no error caught)\n");
        return 0;
    }
    if (c == "bad_pointer") {
        std::vector<float> host(1000);
        LAUNCH(store_kernel, 8, 128, 0, host.data(), 999);
        std::printf("PASS bad_pointer (no error caught)\n");
        return 0;
    }
    if (c == "lt_rules") {
        // column-major D[m, n] = sa * sb * A^T B + bias, A stored k x m (lda = 64), B k x n (ldb = k)
        const int m = 32, n = 16, k = 48, lda = 64;
        std::vector<uint8_t> ha((size_t)lda * m), hb((size_t)k * n);
        for (size_t i = 0; i < ha.size(); i++) ha[i] = fp8_encode((float)((int)(i % 7) - 3) * 0.5f, Fp8Format::E4M3);
        for (size_t i = 0; i < hb.size(); i++) hb[i] = fp8_encode((float)((int)(i % 5) - 2) * 0.25f, Fp8Format::E4M3);
        std::vector<uint16_t> hbias(m);
        for (int i = 0; i < m; i++) hbias[i] = f32_to_bf16_bits(0.125f * i);
        const float scales[5] = {2.0f, 0, 0, 0, 0.75f};  // A's scale at 0, B's 16 bytes on (fp8_rules.h rule 11)
        uint8_t *A, *Bm;
        uint16_t *D, *bias;
        float* sc;
        CHECK(cudaMalloc(&A, ha.size() + 16));
        CHECK(cudaMalloc(&Bm, hb.size()));
        CHECK(cudaMalloc(&D, (size_t)m * n * 2));
        CHECK(cudaMalloc(&bias, m * 2));
        CHECK(cudaMalloc(&sc, sizeof(scales)));
        CHECK(cudaMemcpy(A, ha.data(), ha.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(Bm, hb.data(), hb.size(), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(bias, hbias.data(), m * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(sc, scales, sizeof(scales), cudaMemcpyHostToDevice));
        cublasLtHandle_t h;
        cublasLtCreate(&h);
        // status of one GEMM; ta/tb: transposes, types of A, B, C/D; sb: B's scale (float index in sc)
        auto run = [&](bool ta, bool tb, cudaDataType_t tA, cudaDataType_t tB, cudaDataType_t tC, cudaDataType_t tD,
                       const void* a_ptr, int ld_a, int sb_at = 4) {
            cublasLtMatmulDesc_t op;
            cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof(oa));
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof(ob));
            const float *sa = sc, *sb = sc + sb_at;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
            const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            const cudaDataType_t bt = CUDA_R_16BF;
            const void* bp = bias;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
            cublasLtMatrixLayout_t la, lb, lc, ld;
            cublasLtMatrixLayoutCreate(&la, tA, ta ? k : m, ta ? m : k, ld_a);
            cublasLtMatrixLayoutCreate(&lb, tB, tb ? n : k, tb ? k : n, tb ? n : k);
            cublasLtMatrixLayoutCreate(&lc, tC, m, n, m);
            cublasLtMatrixLayoutCreate(&ld, tD, m, n, m);
            const float alpha = 1.0f, beta = 0.0f;
            cublasStatus_t st =
                cublasLtMatmul(h, op, &alpha, a_ptr, la, Bm, lb, &beta, D, lc, D, ld, nullptr, nullptr, 0, nullptr);
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc),
                cublasLtMatrixLayoutDestroy(ld), cublasLtMatmulDescDestroy(op);
            return st;
        };
        const auto E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2, BF = CUDA_R_16BF, F32 = CUDA_R_32F;
        if (run(true, false, E4, E4, BF, BF, A, lda) != CUBLAS_STATUS_SUCCESS) return fail("fp8 TN refused");
        std::vector<uint16_t> got((size_t)m * n);
        CHECK(cudaMemcpy(got.data(), D, got.size() * 2, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int p = 0; p < k; p++)
                    s += (double)fp8_decode(ha[p + i * (lda)], Fp8Format::E4M3) *
                         fp8_decode(hb[p + j * k], Fp8Format::E4M3);
                const float want = bf16_bits_to_f32(f32_to_bf16_bits((float)(s * 1.5) + 0.125f * i));
                if (bf16_bits_to_f32(got[i + j * m]) != want)
                    return fail("fp8 GEMM element " + std::to_string(i) + "," + std::to_string(j));
            }
        struct Refused {
            const char* what;
            cublasStatus_t st;
        } refused[] = {
            {"fp8 NN", run(false, false, E4, E4, BF, BF, A, m)},
            {"fp8 E5M2 x E5M2", run(true, false, E5, E5, BF, BF, A, lda)},
            {"fp8 A misaligned", run(true, false, E4, E4, BF, BF, A + 1, lda)},
            {"fp8 B scale 4-byte aligned", run(true, false, E4, E4, BF, BF, A, lda, 1)},
            {"fp8 C fp32, D bf16", run(true, false, E4, E4, F32, BF, A, lda)},
            {"bf16 x fp32", run(true, false, BF, F32, BF, BF, A, lda)},
        };
        for (const Refused& r : refused)
            if (r.st == CUBLAS_STATUS_SUCCESS) return fail(std::string("cuBLASLt stand-in accepted ") + r.what);
        cublasLtDestroy(h);
        std::printf("PASS lt_rules\n");
        return 0;
    }
    if (c == "lt_epilogues") {
        // fp32, column-major: D[m, n] = A[m, k] B[k, n] (NN), then the epilogue
        const int m = 16, n = 12, k = 20, ldaux = 24;
        std::vector<float> ha((size_t)m * k), hb((size_t)k * n), hbias(m);
        for (size_t i = 0; i < ha.size(); i++) ha[i] = 0.25f * (float)((int)(i % 9) - 4);
        for (size_t i = 0; i < hb.size(); i++) hb[i] = 0.125f * (float)((int)(i % 7) - 3);
        for (int i = 0; i < m; i++) hbias[i] = 0.5f - 0.0625f * i;
        float *A, *Bm, *D, *bias, *aux, *bgrad;
        CHECK(cudaMalloc(&A, ha.size() * 4));
        CHECK(cudaMalloc(&Bm, hb.size() * 4));
        CHECK(cudaMalloc(&D, (size_t)m * n * 4));
        CHECK(cudaMalloc(&bias, m * 4));
        CHECK(cudaMalloc(&aux, (size_t)ldaux * n * 4 + 16));
        CHECK(cudaMalloc(&bgrad, n * 4));
        CHECK(cudaMemcpy(A, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(Bm, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(bias, hbias.data(), m * 4, cudaMemcpyHostToDevice));
        cublasLtHandle_t h;
        cublasLtCreate(&h);
        // status of one GEMM with epilogue e (bias pointer bp, aux pointer ap with leading dimension
        // al); heuristic: choose the algorithm for aux pointer heur_ap first (nullptr: none)
        auto run = [&](cublasLtEpilogue_t e, const void* bp, void* ap, int64_t al, void* heur_ap) {
            cublasLtMatmulDesc_t op;
            cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
            if (bp) cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
            if (ap || heur_ap) {
                void* first = heur_ap ? heur_ap : ap;
                cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &first, sizeof(first));
            }
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &al, sizeof(al));
            cublasLtMatrixLayout_t la, lb, ld;
            cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
            cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
            cublasLtMatmulHeuristicResult_t res{};
            int nres = 0;
            cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, nullptr, 1, &res, &nres);
            if (st == CUBLAS_STATUS_SUCCESS) {
                if (heur_ap)
                    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap));
                const float alpha = 1.0f, beta = 0.0f;
                st = cublasLtMatmul(h, op, &alpha, A, la, Bm, lb, &beta, D, ld, D, ld, &res.algo, nullptr, 0, nullptr);
            }
            cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld),
                cublasLtMatmulDescDestroy(op);
            return st;
        };
        auto dot = [&](int i, int j) {
            double s = 0;
            for (int p = 0; p < k; p++) s += (double)ha[i + p * m] * hb[p + j * k];
            return (float)s;
        };
        auto at = [](int i, int j) { return std::to_string(i) + "," + std::to_string(j); };
        if (run(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, ldaux, nullptr) != CUBLAS_STATUS_SUCCESS)
            return fail("GELU_AUX_BIAS refused");
        std::vector<float> gd((size_t)m * n), gaux((size_t)ldaux * n);
        CHECK(cudaMemcpy(gd.data(), D, gd.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(gaux.data(), aux, gaux.size() * 4, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const float v = dot(i, j) + hbias[i];
                const float g = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
                if (gaux[i + j * ldaux] != v) return fail("GELU_AUX_BIAS aux element " + at(i, j));
                if (std::fabs(gd[i + j * m] - g) > 1e-6f * (1.0f + std::fabs(g)))
                    return fail("GELU_AUX_BIAS D element " + at(i, j));
            }
        if (run(CUBLASLT_EPILOGUE_BGRADB, bgrad, nullptr, 0, nullptr) != CUBLAS_STATUS_SUCCESS)
            return fail("BGRADB refused");
        std::vector<float> gb(n);
        CHECK(cudaMemcpy(gd.data(), D, gd.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(gb.data(), bgrad, n * 4, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += hb[p + j * k];
            if (gb[j] != (float)s) return fail("BGRADB element " + std::to_string(j));
            for (int i = 0; i < m; i++)
                if (gd[i + j * m] != dot(i, j)) return fail("BGRADB changed D at " + at(i, j));
        }
        struct Refused {
            const char* what;
            cublasStatus_t st;
        } refused[] = {
            {"aux ld 20 (not a multiple of 8)", run(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, 20, nullptr)},
            {"aux ld 8 (below the 16 rows)", run(CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, aux, 8, nullptr)},
            {"GELU_AUX without an aux pointer", run(CUBLASLT_EPILOGUE_GELU_AUX, nullptr, nullptr, ldaux, nullptr)},
            {"BGRADB without a bias pointer", run(CUBLASLT_EPILOGUE_BGRADB, nullptr, nullptr, 0, nullptr)},
            {"aux 4-byte aligned, chosen for 16", run(CUBLASLT_EPILOGUE_GELU_AUX, nullptr, aux + 1, ldaux, aux)},
        };
        for (const Refused& r : refused)
            if (r.st == CUBLAS_STATUS_SUCCESS) return fail(std::string("cuBLASLt stand-in accepted ") + r.what);
        cublasLtDestroy(h);
        std::printf("PASS lt_epilogues\n");
        return 0;
    }
    if (c == "copy_unwaited") {
        std::vector<float> h(32 * 4), got(32);
        for (size_t i = 0; i < h.size(); i++) h[i] = (float)i;
        float *in, *out;
        CHECK(cudaMalloc(&in, h.size() * 4));
        CHECK(cudaMalloc(&out, 32 * 4));
        CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        LAUNCH(copy_unwaited_kernel, 1, 32, 32 * 16, out, (const float*)in);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(got.data(), out, 32 * 4, cudaMemcpyDeviceToHost));
        for (int t = 0; t < 32; t++)
            if (got[t] != h[4 * t]) return fail("copy read before its wait: thread " + std::to_string(t) + " read " +
                                                std::to_string(got[t]) + ", copied " + std::to_string(h[4 * t]));
        std::printf("PASS %s (the copies landed at their issue)\n", c.c_str());
        return 0;
    }
    if (c == "wgmma_early" || c == "wgmma_tile" || c == "proxy_unfenced") {
        std::vector<uint16_t> hb(64 * 64);
        for (int n = 0; n < 64; n++)
            for (int k = 0; k < 64; k++) hb[n * 64 + k] = f32_to_bf16_bits((float)((n + k) % 5) - 2.0f);
        __nv_bfloat16* b;
        float* out;
        std::vector<float> got(64);
        CHECK(cudaMalloc(&b, hb.size() * 2));
        CHECK(cudaMalloc(&out, 64 * 4));
        CHECK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        LAUNCH(wgmma_tile_kernel, 1, 256, 8192, out, (const __nv_bfloat16*)b, c == "wgmma_early", c != "proxy_unfenced");
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(got.data(), out, 64 * 4, cudaMemcpyDeviceToHost));
        for (int n = 0; n < 64; n++) {
            float want = 0;
            for (int k = 0; k < 64; k++) want += (float)((n + k) % 5) - 2.0f;
            if (got[n] != want) return fail("wgmma read B before it was written: D[0][" + std::to_string(n) +
                                            "] = " + std::to_string(got[n]) + ", want " + std::to_string(want));
        }
        std::printf("PASS %s%s\n", c.c_str(), c == "wgmma_tile" ? "" : " (the wgmma read at its wait)");
        return 0;
    }
    std::fprintf(stderr, "usage: cuemu_selftest reduce|ballot|dynamic_smem|missing_barrier|divergent_shuffle|"
                         "barrier_in_branch|smem_short|off_by_one|no_optin|bad_pointer|lt_rules|lt_epilogues|"
                         "copy_unwaited|wgmma_early|wgmma_tile|proxy_unfenced\n");
    return 2;
}
