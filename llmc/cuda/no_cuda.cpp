// What a binary without the CUDA backend (make CUDA=0, the CPU unit tests, the data tools) knows
// of CUDA: no device. train_gpt built with CUDA links llmc/cuda/cuda_ops.cu, whose ordinary
// (strong) definitions replace these weak ones; the same holds for make_nccl_comm (llmc/comm/comm.cpp).
#include "llmc/core/common.h"
#include "llmc/cuda/cuda_ops.h"

__attribute__((weak)) int cuda_device_count() { return 0; }
__attribute__((weak)) bool cuda_device_available() { return false; }
__attribute__((weak)) void set_cuda_kernel_ways(Ops&, const KernelWays&) {}
__attribute__((weak)) std::unique_ptr<Ops> make_cuda_ops(int) {
    throw UserError("device: \"cuda\" is not available in this binary (built with CUDA=0, without the CUDA backend)");
}
