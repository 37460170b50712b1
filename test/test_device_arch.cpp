// Which GPUs a build's device code runs on (llmc/cuda/device_arch.h): CUDA's compatibility rule for
// machine code, as the backend applies it before the first launch.
#include <catch2/catch.hpp>

#include "llmc/cuda/device_arch.h"

TEST_CASE("device arch: sm_XY runs on major X from minor Y, sm_XYa on X.Y alone", "[cuda]") {
    // the default build, GPU_ARCH="80 90a": A100 8.0, A10/RTX 30 8.6, L4/L40S 8.9, H100/H200 9.0
    for (int minor : {0, 6, 7, 9}) CHECK(arch_runs_on("80 90a", 8, minor));
    CHECK(arch_runs_on("80 90a", 9, 0));
    CHECK(arch_runs_on("80,90a", 9, 0));  // (the Makefile's macro joins the words with commas)
    CHECK_FALSE(arch_runs_on("80 90a", 10, 0));  // B200: no sm_10x code, no PTX to compile
    CHECK_FALSE(arch_runs_on("80 90a", 12, 0));
    CHECK_FALSE(arch_runs_on("80 90a", 7, 5));
    // the GPU kit, GPU_ARCH=90a: Hopper alone
    CHECK(arch_runs_on("90a", 9, 0));
    CHECK_FALSE(arch_runs_on("90a", 8, 0));
    CHECK_FALSE(arch_runs_on("90a", 9, 1));  // arch-specific: no later minor
    CHECK(arch_runs_on("90", 9, 1));         // plain sm_90: later minors too
    CHECK_FALSE(arch_runs_on("86", 8, 0));   // not an earlier minor
    CHECK(arch_runs_on("100f", 10, 3));      // family code: the family's later minors
    CHECK_FALSE(arch_runs_on("100f", 12, 0));
    CHECK_FALSE(arch_runs_on("", 9, 0));
    CHECK_FALSE(arch_runs_on("native", 9, 0));
}

TEST_CASE("device arch: the refusal names the device, the build and the make line", "[cuda]") {
    CHECK(arch_mismatch("80 90a", "NVIDIA H200", 9, 0).empty());
    const std::string b200 = arch_mismatch("80,90a", "NVIDIA B200", 10, 0);
    CHECK_THAT(b200, Catch::Contains("NVIDIA B200 (compute capability 10.0)") &&
                         Catch::Contains("GPU_ARCH=\"80 90a\"") && Catch::Contains("make GPU_ARCH=\"80 90a 100\""));
    CHECK_THAT(arch_mismatch("80", "NVIDIA H100", 9, 0), Catch::Contains("make GPU_ARCH=\"80 90a\""));
}
