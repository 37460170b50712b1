// The MFU formula and the GPU peak table.
#include <catch2/catch.hpp>

#include "llmc/mfu.h"

TEST_CASE("flops per token follows 6N + 12LCT with the tied embedding once and no padding") {
    // GPT-2 124M: 124,439,808 parameters (wte 50257x768 counted once)
    ModelShape s{12, 12, 768, 50257, 50304, 1024};
    const double n = 124439808.0;
    CHECK(flops_per_token(s, 1024) == Approx(6 * n + 12.0 * 12 * 768 * 1024).epsilon(1e-12));
}

TEST_CASE("GPU peak table picks the most specific entry") {
    CHECK(gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == Approx(989.4e12));
    CHECK(gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == Approx(756e12));
    CHECK(gpu_peak_flops("NVIDIA H200", "fp8") == Approx(1978.9e12));
    CHECK(gpu_peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == Approx(312e12));
    CHECK(gpu_peak_flops("NVIDIA A100 80GB PCIe", "fp32") == Approx(19.5e12));
    CHECK(gpu_peak_flops("NVIDIA GeForce GTX 1080", "bf16") == 0.0);
}
