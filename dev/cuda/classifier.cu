// Fused cross-entropy: losses, and logits overwritten by dloss * (softmax - onehot).
// ./classifier <version> [N V Vp]
//   1: naive, one thread per row, three passes (baseline), fp32
//   2: llmc/cuda/classifier.cuh, one block per row, online max/sum, fp32
//   3: same as 2 in bf16
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

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 2);
    const std::vector<int> d = bench_case("cross_entropy", argc, argv, 3);
    int N = d[0], V = d[1], Vp = d[2];
    std::printf("classifier v%d N=%d V=%d Vp=%d\n", version, N, V, Vp);
    auto logits = rand_vec((size_t)N * Vp, 4.0f, 1);
    if (version == 3) round_bf16(logits);
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
    std::function<void()> run;
    if (version == 3) {
        bf16* gx = to_dev<bf16>(logits);
        run = [=] { cross_entropy_kernel<bf16><<<N, 512>>>(gx, gl, gt, V, Vp, dloss); };
        run();
        ok &= validate("dlogits", to_host(gx, (size_t)N * Vp), ref, 2e-2);
    } else {
        float* gx = to_dev<float>(logits);
        if (version == 1)
            run = [=] { ce_naive<<<ceil_div(N, 128), 128>>>(gx, gl, gt, N, V, Vp, dloss); };
        else
            run = [=] { cross_entropy_kernel<float><<<N, 512>>>(gx, gl, gt, V, Vp, dloss); };
        run();
        ok &= validate("dlogits", to_host(gx, (size_t)N * Vp), ref, 1e-4);
    }
    ok &= validate("losses", to_host(gl, N), losses, 1e-4);
    // timing reruns on overwritten logits (values stay finite); bandwidth-bound
    float ms = bench_ms(run);
    size_t bytes = (size_t)N * Vp * (version == 3 ? 2 : 4) * 3;  // read twice, write once
    std::printf("time %.4f ms, %.1f GB/s\n", ms, bytes / ms * 1e-6);
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
