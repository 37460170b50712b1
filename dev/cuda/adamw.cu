// AdamW, fused elementwise, and the deterministic sum of squares.
// ./adamw <version> [n]
//   1: llmc adamw, fp32 params (no master)
//   2: llmc adamw, bf16 params + fp32 master (stochastic rounding)
//   3: sum_squares (fp32), checked against a double CPU sum, and run-to-run bitwise
#include "dev/cuda/common.h"
#include "llmc/cuda/adamw.cuh"

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 2);
    size_t n = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)124 * 1000 * 1000;
    std::printf("adamw v%d n=%zu\n", version, n);
    auto p = rand_vec(n, 1.0f, 1), g = rand_vec(n, 0.1f, 2), m = rand_vec(n, 0.01f, 3), v = rand_vec(n, 0.01f, 4);
    for (auto& x : v) x = x * x;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    const int t = 3;
    const float bc1 = (float)(1 - std::pow(0.9, t)), bc2 = (float)(1 - std::pow(0.95, t));
    // the kernel's arguments (as adamw_scales, llmc/backend/ops.h, computes them); the reference below
    // keeps the textbook form
    const float step = (float)(lr / (1 - std::pow(0.9, t))), isb2 = (float)(1 / std::sqrt(1 - std::pow(0.95, t)));
    bool ok = true;
    if (version == 3) {
        double ref = 0;
        for (float x : g) ref += (double)x * x;
        float* gg = to_dev<float>(g);
        const int G = sum_squares_blocks((long long)n);
        double* part = nullptr;
        CUDA_CHECK(cudaMalloc(&part, G * sizeof(double)));
        auto total = [&] {
            sum_squares_kernel<float><<<G, kSumSqThreads>>>(part, gg, (long long)n);
            std::vector<double> h(G);
            CUDA_CHECK(cudaMemcpy(h.data(), part, G * sizeof(double), cudaMemcpyDeviceToHost));
            double s = 0;
            for (double x : h) s += x;
            return s;
        };
        double a = total(), b = total();
        ok = a == b && std::fabs(a - ref) <= 1e-9 * ref;
        std::printf("  sum_squares gpu=%.17g again=%.17g cpu=%.17g %s\n", a, b, ref, ok ? "OK" : "FAIL");
        std::printf("time %.4f ms\n", bench_ms([&] { total(); }));
        return ok ? 0 : 1;
    }
    // CPU reference
    std::vector<float> rp = p, rm = m, rv = v;
    if (version == 2) round_bf16(g);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        rm[i] = b1 * rm[i] + (1 - b1) * gi;
        rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
        rp[i] -= lr * ((rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + eps) + wd * rp[i]);
    }
    float *gm = to_dev<float>(m), *gv = to_dev<float>(v);
    std::function<void()> run;
    if (version == 1) {
        float *gp = to_dev<float>(p), *gg = to_dev<float>(g);
        run = [=] {
            adamw_kernel<float><<<ceil_div(n, 256), 256>>>(gp, nullptr, gg, gm, gv, n, lr, b1, b2, step, isb2, eps, wd,
                                                           gs, 42u, 0u);
        };
        run();
        ok &= validate("params", to_host(gp, n), rp, 1e-4);
    } else {
        float* master = to_dev<float>(p);
        bf16 *gp = to_dev<bf16>(p), *gg = to_dev<bf16>(g);
        run = [=] {
            adamw_kernel<bf16><<<ceil_div(n, 256), 256>>>(gp, master, gg, gm, gv, n, lr, b1, b2, step, isb2, eps, wd,
                                                          gs, 42u, 0u);
        };
        run();
        ok &= validate("master", to_host(master, n), rp, 1e-4);
        ok &= validate("params", to_host(gp, n), rp, 2e-2);
        // stochastic rounding is unbiased: the mean of (bf16 - master) is ~0
        auto hp = to_host(gp, n), hm = to_host(master, n);
        double bias = 0;
        for (size_t i = 0; i < n; i++) bias += hp[i] - hm[i];
        std::printf("  mean rounding error %.3e\n", bias / n);
    }
    ok &= validate("m", to_host(gm, n), rm, 1e-4);
    ok &= validate("v", to_host(gv, n), rv, 1e-4);
    float ms = bench_ms(run);
    size_t bytes = n * (version == 1 ? 4 * 6 : 2 * 3 + 4 * 6);
    std::printf("time %.4f ms, %.1f GB/s\n", ms, bytes / ms * 1e-6);
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
