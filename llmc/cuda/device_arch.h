// Which GPUs a build's device code runs on (plain C++: the rule is tested on the CPU). The Makefile
// builds the CUDA backend for GPU_ARCH (default "80 90a") as machine code alone, nvcc's
// -gencode arch=compute_XY,code=sm_XY, with no PTX for the driver to compile for another GPU.
#pragma once
#include <string>

// Whether code for the architectures `built` (GPU_ARCH's words, spaces or commas between: "80 90a")
// runs on a device of compute capability major.minor. CUDA's rule for machine code: sm_XY runs on
// devices of major X and minor >= Y (sm_80 on an A100, A10, L4 or L40S: 8.0, 8.6, 8.9); an
// arch-specific sm_XYa (90a: wgmma) on X.Y alone; a family one, sm_XYf, on major X, minor >= Y.
bool arch_runs_on(const std::string& built, int major, int minor);

// The UserError's text for a device the build does not run on (empty when it does): the device, its
// compute capability, the build's architectures and the make line that builds for it.
std::string arch_mismatch(const std::string& built, const std::string& device_name, int major, int minor);
