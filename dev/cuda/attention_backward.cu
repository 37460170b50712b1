// Causal attention backward: dqkv from dout, qkv, out, lse (D = rowsum(dO*O) precomputed).
// ./attention_backward <version> [B T NH HS]
//   1: llmc/cuda/attention.cuh, fp32 FMA tiles (dK/dV per key tile, dQ per query tile)
//   2: llmc/cuda/attention.cuh, bf16 wmma tiles
#include "dev/cuda/common.h"
#include "llmc/cuda/attention.cuh"

// reference: forward (out, lse) and backward in fp32/double on the CPU
static void attention_cpu(float* dqkv, float* out, float* lse, const float* qkv, const float* dout, int B, int T,
                          int NH, int HS) {
    const float scale = 1.0f / std::sqrt((float)HS);
    auto Q = [&](int b, int t, int h) { return qkv + ((size_t)(b * T + t) * 3 * NH + h) * HS; };
    auto K = [&](int b, int t, int h) { return Q(b, t, h) + (size_t)NH * HS; };
    auto V = [&](int b, int t, int h) { return Q(b, t, h) + 2 * (size_t)NH * HS; };
    std::fill(dqkv, dqkv + (size_t)B * T * 3 * NH * HS, 0.0f);
    std::vector<float> p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    float d = 0;
                    for (int i = 0; i < HS; i++) d += Q(b, t, h)[i] * K(b, j, h)[i];
                    p[j] = d * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += std::exp(p[j] - mx);
                for (int j = 0; j <= t; j++) p[j] = (float)(std::exp(p[j] - mx) / sum);
                lse[((size_t)b * NH + h) * T + t] = mx + (float)std::log(sum);
                float* o = out + ((size_t)(b * T + t) * NH + h) * HS;
                const float* dO = dout + ((size_t)(b * T + t) * NH + h) * HS;
                for (int i = 0; i < HS; i++) {
                    o[i] = 0;
                    for (int j = 0; j <= t; j++) o[i] += p[j] * V(b, j, h)[i];
                }
                float D = 0;
                for (int i = 0; i < HS; i++) D += dO[i] * o[i];
                float* dq = dqkv + ((size_t)(b * T + t) * 3 * NH + h) * HS;
                for (int j = 0; j <= t; j++) {
                    float d = 0;
                    for (int i = 0; i < HS; i++) d += dO[i] * V(b, j, h)[i];
                    float ds = p[j] * (d - D) * scale;
                    float* dk = dqkv + ((size_t)(b * T + j) * 3 * NH + NH + h) * HS;
                    float* dv = dk + (size_t)NH * HS;
                    for (int i = 0; i < HS; i++) {
                        dq[i] += ds * K(b, j, h)[i];
                        dk[i] += ds * Q(b, t, h)[i];
                        dv[i] += p[j] * dO[i];
                    }
                }
            }
}

template <class T>
static bool run_version(const std::vector<float>& qkv, const std::vector<float>& dout, std::vector<float> out,
                        const std::vector<float>& lse, const std::vector<float>& ref, int B, int Tn, int NH, int HS,
                        double tol) {
    const size_t nqkv = qkv.size();
    if (std::is_same<T, bf16>::value) round_bf16(out);
    T *dq = to_dev<T>(qkv), *ddo = to_dev<T>(dout), *dout_ = to_dev<T>(out), *dd = dev_poisoned<T>(nqkv);
    float* dl = to_dev<float>(lse);
    float* D = dev_poisoned<float>((size_t)B * NH * Tn);
    auto run = [=] { attn::attention_backward<T>(dd, ddo, dq, dout_, dl, D, B, Tn, NH, NH, HS, 0); };
    run();
    bool ok = validate("dqkv", to_host(dd, nqkv), ref, tol);
    float ms = bench_ms(run);
    double flops = 2.0 * 4.0 * B * NH * HS * (double)Tn * Tn / 2 * 1.25;  // ~2.5x forward (S recomputed twice)
    std::printf("time %.4f ms, ~%.1f TFLOP/s\n", ms, flops / ms * 1e-9);
    return ok;
}

int main(int argc, char** argv) {
    int version = kernel_arg(argc, argv, 2);
    int B = argc > 5 ? atoi(argv[2]) : 2, T = argc > 5 ? atoi(argv[3]) : 1024;
    int NH = argc > 5 ? atoi(argv[4]) : 12, HS = argc > 5 ? atoi(argv[5]) : 64;
    std::printf("attention_backward v%d B=%d T=%d NH=%d HS=%d\n", version, B, T, NH, HS);
    const size_t nqkv = (size_t)B * T * 3 * NH * HS, no = (size_t)B * T * NH * HS;
    auto qkv = rand_vec(nqkv, 2.0f, 1), dout = rand_vec(no, 1.0f, 2);
    if (version == 2) round_bf16(qkv), round_bf16(dout);
    std::vector<float> ref(nqkv), out(no), lse((size_t)B * NH * T);
    attention_cpu(ref.data(), out.data(), lse.data(), qkv.data(), dout.data(), B, T, NH, HS);
    bool ok = version == 1 ? run_version<float>(qkv, dout, out, lse, ref, B, T, NH, HS, 1e-4)
                           : run_version<bf16>(qkv, dout, out, lse, ref, B, T, NH, HS, 2e-2);
    CUDA_CHECK(cudaGetLastError());
    return ok ? 0 : 1;
}
