// Fused cross-entropy: losses, and logits overwritten by dloss * (softmax - onehot).
// ./classifier <version> [N V Vp]      (make -C dev/cuda classifier)
//   1: naive, one thread per row, three passes (baseline), fp32
//   2: one block of 512 per row, online max/sum through lse_combine (two expf per element), then
//      one more expf per element for the gradient; element loads (2 bytes in bf16). llmc until
//      issue 29. fp32
//   3: same as 2 in bf16. H200 (ncu, GPT-2 124M B=32 T=1024, N=32768 V=50257 Vp=50304, 2026-11):
//      7.5 ms per step, where reading and writing the logits once at 4.8 TB/s is ~1.4 ms
//   4: llmc/cuda/classifier.cuh (issue 29): 16-byte packs (8 bf16 / 4 floats per access; rows a
//      pack cannot tile go element by element), 4 packs in flight per thread; statistics with one
//      exp2 per element (a per-thread running max and sum, the sum rescaled once per pack when the
//      pack raises the max) and a butterfly over lanes then warps (fixed order); the gradient
//      pass one exp2 per element, its row read back mostly from L2. fp32
//   5: same as 4 in bf16. NOT YET MEASURED ON A GPU. To measure (v3 beside it, same card):
//        ./dev/cuda/classifier 3 32768 50257 50304 && ./dev/cuda/classifier 5 32768 50257 50304
//      and under ncu: ncu -k regex:cross_entropy ./dev/cuda/classifier 5 32768 50257 50304
//      Measured in the fourth window only inside the step (ncu, 124M B=32, H200, b24a415): 2.25 ms a
//      step, 2.9 TB/s counting the row read and written once.
//   6: v5 with the row kept in shared memory between the passes (KernelWays::ce_row_in_smem; 98 KiB
//      of bf16 a GPT-2 row, two blocks an SM on Hopper, one on an A100): read from memory once. The same loads in the same
//      order, so the same bits as v5 (checked here: a v5 run beside it on the same logits, and
//      timed after v6 in the same process).
//      NOT YET MEASURED ON A GPU. Prediction: near the bound of reading and writing once (~1.5 ms
//      at N=32768 on an H200) if v5's second read was mostly DRAM; no gain if it was L2. If
//      faster, it becomes the backend's default (KernelWays::ce_row_in_smem = true).
#include "dev/cuda/common.h"
#include "llmc/cuda/classifier.cuh"

__global__ void ce_naive(float* logits, float* losses, const int* tgt, int N, int V, int Vp, float dloss) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float* x = logits + (size_t)n * Vp;
    float mx = -INFINITY, s = 0;
    for (int c = 0; c < V; c++) mx = fmaxf(mx, x[c]);
    for (int c = 0; c < V; c++) s += expf(x[c] - mx);
    float lse = mx + logf(s);
    losses[n] = lse - x[tgt[n]];
    int t = tgt[n];
    for (int c = 0; c < Vp; c++) x[c] = c < V ? (expf(x[c] - lse) - (c == t)) * dloss : 0.0f;
}

// version 2/3: one block per row, (max, sum) combined per element with lse_combine
template <class T>
__global__ void ce_v2(T* logits, float* losses, const int32_t* targets, int V, int Vp, float dloss) {
    __shared__ float s_m[32], s_s[32], s_lse, s_target_logit;
    T* x = logits + (long long)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    float m = -INFINITY, s = 0.0f;
    for (int c = threadIdx.x; c < V; c += blockDim.x) lse_combine(m, s, to_f32(x[c]), 1.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(m, s, m2, s2);
    }
    if ((threadIdx.x & 31) == 0) s_m[threadIdx.x >> 5] = m, s_s[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, S = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) lse_combine(M, S, s_m[w], s_s[w]);
        s_lse = M + logf(S);
        s_target_logit = (target >= 0 && target < V) ? to_f32(x[target]) : NAN;
        losses[blockIdx.x] = s_lse - s_target_logit;
    }
    __syncthreads();
    if (dloss == 0.0f) return;
    const float lse = s_lse;
    for (int c = threadIdx.x; c < Vp; c += blockDim.x) {
        float g = 0.0f;
        if (c < V) g = (expf(to_f32(x[c]) - lse) - (c == target ? 1.0f : 0.0f)) * dloss;
        x[c] = from_f32<T>(g);
    }
}

template <class T>
static std::function<void()> llmc_or_v2(int version, T* gx, float* gl, const int* gt, int N, int V, int Vp,
                                        float dloss) {
    if (version >= 4) return [=] { launch_cross_entropy<T>(0, gx, gl, gt, N, V, Vp, dloss, version == 6); };
    return [=] { ce_v2<T><<<N, 512>>>(gx, gl, gt, V, Vp, dloss); };
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 5);
    const std::vector<int> d = bench_case("cross_entropy", argc, argv, 3);
    int N = d[0], V = d[1], Vp = d[2];
    if (version < 1 || version > 6) {
        std::printf("classifier: version %d is not one of 1-6 (see the top of classifier.cu)\n", version);
        return 1;
    }
    const bool bf = version == 3 || version >= 5;
    std::printf("classifier v%d N=%d V=%d Vp=%d\n", version, N, V, Vp);
    auto logits = rand_vec((size_t)N * Vp, 4.0f, 1);
    if (bf) round_bf16(logits);
    std::vector<int> tgt(N);
    for (int n = 0; n < N; n++) tgt[n] = (int)((n * 2654435761u) % (unsigned)V);
    const float dloss = 1.0f / N;
    std::vector<float> ref = logits, losses(N);
    cpu::cross_entropy<float>(ref.data(), losses.data(), tgt.data(), N, V, Vp, dloss);
    int* gt = nullptr;
    CUDA_CHECK(cudaMalloc(&gt, N * 4));
    CUDA_CHECK(cudaMemcpy(gt, tgt.data(), N * 4, cudaMemcpyHostToDevice));
    float* gl = dev_poisoned<float>(N);
    bool ok = true;
    std::function<void()> run, run5;  // (v6: v5 on a copy of the logits, checked and timed beside it)
    if (bf) {
        bf16* gx = to_dev<bf16>(logits);
        run = llmc_or_v2<bf16>(version, gx, gl, gt, N, V, Vp, dloss);
        run();
        ok &= validate("dlogits", to_host(gx, (size_t)N * Vp), ref, 2e-2);
        if (version == 6) {  // bit for bit v5's, on the same logits
            bf16* gx5 = to_dev<bf16>(logits);
            float* gl5 = dev_poisoned<float>(N);
            run5 = llmc_or_v2<bf16>(5, gx5, gl5, gt, N, V, Vp, dloss);
            run5();
            const bool same = to_host(gx, (size_t)N * Vp) == to_host(gx5, (size_t)N * Vp) &&
                              to_host(gl, N) == to_host(gl5, N);
            std::printf("v6 bitwise v5: %s\n", same ? "yes" : "NO");
            ok &= same;
        }
    } else {
        float* gx = to_dev<float>(logits);
        if (version == 1)
            run = [=] { ce_naive<<<ceil_div(N, 128), 128>>>(gx, gl, gt, N, V, Vp, dloss); };
        else
            run = llmc_or_v2<float>(version, gx, gl, gt, N, V, Vp, dloss);
        run();
        ok &= validate("dlogits", to_host(gx, (size_t)N * Vp), ref, 1e-4);
    }
    ok &= validate("losses", to_host(gl, N), losses, 1e-4);
    // timing reruns on overwritten logits (values stay finite); bandwidth-bound
    float ms = bench_ms(run);
    const size_t once = (size_t)N * Vp * (bf ? 2 : 4);
    std::printf("time %.4f ms, %.1f GB/s counting read twice + written once, %.1f GB/s counting read + written once\n",
                ms, 3 * once / ms * 1e-6, 2 * once / ms * 1e-6);
    if (run5) {
        const float ms5 = bench_ms(run5);
        std::printf("v5 beside it: time %.4f ms (v6 / v5 %.3f)\n", ms5, ms / ms5);
    }
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
