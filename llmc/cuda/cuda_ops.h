// The CUDA backend as the rest of the program sees it (plain C++: no CUDA headers).
// Defined in llmc/cuda/cuda_ops.cu; binaries built without the CUDA backend (make CUDA=0, the CPU
// unit tests, the data tools) get llmc/cuda/no_cuda.cpp's weak definitions: no device.
// cuda_kernel_ways is plain C++ (llmc/cuda/kernel_ways.cpp), the same in every binary.
#pragma once
#include <memory>

#include "llmc/backend/ops.h"
#include "llmc/cuda/kernel_ways.h"

// Throws UserError when no CUDA device is usable.
std::unique_ptr<Ops> make_cuda_ops(int device_index);
bool cuda_device_available();
// The kernels' ways the config section "kernels" (KernelsConfig) names; unknown names: UserError
// naming the key.
KernelWays cuda_kernel_ways(const std::string& attention_forward, const std::string& attention_backward,
                            const std::string& layernorm_backward, const std::string& attention_wgmma_layout = "auto");
// The ways of a CUDA backend's kernels from now on (before the first step; between test cases);
// nothing for another backend.
void set_cuda_kernel_ways(Ops& ops, const KernelWays& ways);
int cuda_device_count();  // 0 when the query fails
