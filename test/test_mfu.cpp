// The MFU formula and the GPU peak table.
#include <catch2/catch.hpp>

#include "llmc/run/mfu.h"

TEST_CASE("flops per token follows 6N + 12LCT with the tied embedding once and no padding") {
    // GPT-2 124M: 124,439,808 parameters (wte 50257x768 counted once)
    ModelShape s{12, 12, 768, 50257, 50304, 1024};
    const double n = 124439808.0;
    CHECK(flops_per_token(s, 1024) == Approx(6 * n + 12.0 * 12 * 768 * 1024).epsilon(1e-12));
}

TEST_CASE("flops per token of a mixture of experts count top_k of the experts", "[moe]") {
    // GPT-2 124M with 8 experts of width 1024 in every 2nd layer (6 MoE layers), top-2
    ModelShape s{12, 12, 768, 50257, 50304, 1024};
    s.moe.num_experts = 8;
    s.moe.top_k = 2;
    s.moe.expert_ffn_dim = 1024;
    s.moe.every = 2;
    const double C = 768, F = 1024, dense_mlp = 8 * C * C + 4 * C + C, expert = 2 * F * C + F + C, router = 8 * C;
    const double active = 124439808.0 + 6 * (router + 2 * expert - dense_mlp);  // the MLPs of 6 layers replaced
    CHECK(flops_per_token(s, 1024) == Approx(6 * active + 12.0 * 12 * 768 * 1024).epsilon(1e-12));
}

TEST_CASE("GPU peak table picks the most specific entry") {
    CHECK(gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == Approx(989.4e12));
    CHECK(gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == Approx(756e12));
    // fp16 dense tensor-core peak = bf16's (H100 SXM datasheet: 989.4 TFLOP/s each)
    CHECK(gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp16") == Approx(989.4e12));
    CHECK(gpu_peak_flops("NVIDIA H200", "fp8") == Approx(1978.9e12));
    CHECK(gpu_peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == Approx(312e12));
    CHECK(gpu_peak_flops("NVIDIA A100 80GB PCIe", "fp32") == Approx(19.5e12));
    CHECK(gpu_peak_flops("NVIDIA GeForce GTX 1080", "bf16") == 0.0);
}
