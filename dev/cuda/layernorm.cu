// LayerNorm forward / backward (fp32 statistics).
// ./layernorm <version> [N C]
//   1: naive forward, one thread per row (baseline), fp32
//   2: llmc forward (warp per row) + deterministic backward (block partials), fp32
//   3: same as 2 in bf16
#include "dev/cuda/common.h"
#include "llmc/cuda/layernorm.cuh"

__global__ void ln_naive(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* r = x + (size_t)n * C;
    float m = 0, v = 0;
    for (int c = 0; c < C; c++) m += r[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (r[c] - m) * (r[c] - m);
    float rs = rsqrtf(v / C + 1e-5f);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (r[c] - m) * rs * w[c] + b[c];
    mean[n] = m, rstd[n] = rs;
}

template <class T>
static bool run_llmc(int N, int C, const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                     const std::vector<float>& dout, double tol) {
    std::vector<float> out((size_t)N * C), mean(N), rstd(N);
    cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    auto dx0 = rand_vec((size_t)N * C, 1.0f, 5), dw0 = rand_vec(C, 1.0f, 6), db0 = rand_vec(C, 1.0f, 7);
    if (std::is_same<T, bf16>::value) round_bf16(dx0), round_bf16(dw0), round_bf16(db0);
    auto dx = dx0, dw = dw0, db = db0;
    cpu::layernorm_backward<float>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    T *gx = to_dev<T>(x), *gw = to_dev<T>(w), *gb = to_dev<T>(b), *go = dev_poisoned<T>((size_t)N * C);
    float *gm = dev_poisoned<float>(N), *gr = dev_poisoned<float>(N);
    auto fwd = [=] {
        layernorm_forward_kernel<T><<<ceil_div(N, 8), 256>>>(go, gm, gr, nullptr, gx, nullptr, nullptr, gw, gb, N, C);
    };
    fwd();
    bool ok = validate("out", to_host(go, (size_t)N * C), out, tol);
    ok &= validate("mean", to_host(gm, N), mean, 1e-4);
    ok &= validate("rstd", to_host(gr, N), rstd, 1e-4);
    std::printf("forward time %.4f ms\n", bench_ms(fwd));
    // backward: give the GPU the CPU's statistics
    CUDA_CHECK(cudaMemcpy(gm, mean.data(), N * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(gr, rstd.data(), N * 4, cudaMemcpyHostToDevice));
    T *gdo = to_dev<T>(dout), *gdx = to_dev<T>(dx0), *gdw = to_dev<T>(dw0), *gdb = to_dev<T>(db0);
    const int rpb = ceil_div(N, 512), G = ceil_div(N, rpb);
    float* partial = dev_poisoned<float>((size_t)G * 2 * C);
    auto bwd = [=] {
        layernorm_backward_kernel<T><<<G, 256, (2 * C + 32) * 4>>>(gdx, partial, gdo, gx, gw, gm, gr, N, C, rpb);
        layernorm_backward_reduce_kernel<T><<<ceil_div(C, 256), 256>>>(gdw, gdb, partial, G, C);
    };
    bwd();
    ok &= validate("dinp", to_host(gdx, (size_t)N * C), dx, tol);
    ok &= validate("dw", to_host(gdw, C), dw, tol);
    ok &= validate("db", to_host(gdb, C), db, tol);
    std::printf("backward time %.4f ms (accumulating repeatedly)\n", bench_ms(bwd));
    return ok;
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 2);
    const std::vector<int> d = bench_case("layernorm", argc, argv, 2);
    int N = d[0], C = d[1];
    std::printf("layernorm v%d N=%d C=%d\n", version, N, C);
    auto x = rand_vec((size_t)N * C, 2.0f, 1), w = rand_vec(C, 1.0f, 2), b = rand_vec(C, 1.0f, 3),
         dout = rand_vec((size_t)N * C, 1.0f, 4);
    bool ok = true;
    if (version == 1) {
        std::vector<float> out((size_t)N * C), mean(N), rstd(N);
        cpu::layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
        float *gx = to_dev<float>(x), *gw = to_dev<float>(w), *gb = to_dev<float>(b);
        float *go = dev_poisoned<float>((size_t)N * C), *gm = dev_poisoned<float>(N), *gr = dev_poisoned<float>(N);
        auto fwd = [=] { ln_naive<<<ceil_div(N, 128), 128>>>(go, gm, gr, gx, gw, gb, N, C); };
        fwd();
        ok &= validate("out", to_host(go, (size_t)N * C), out, 1e-4);
        std::printf("forward time %.4f ms\n", bench_ms(fwd));
    } else if (version == 2) {
        ok = run_llmc<float>(N, C, x, w, b, dout, 1e-4);
    } else {
        round_bf16(x), round_bf16(w), round_bf16(b), round_bf16(dout);
        ok = run_llmc<bf16>(N, C, x, w, b, dout, 2e-2);
    }
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
