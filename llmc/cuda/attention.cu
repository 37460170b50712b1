// The attention kernels' own translation unit: CudaOps's attention entry points (llmc/cuda/attention_ops.h)
// for fp32, bf16 and fp16, with every flash and general kernel they launch.
#include "llmc/cuda/attention.cuh"

namespace attn {

LLMC_ATTENTION_ENTRY_POINTS(, float)
LLMC_ATTENTION_ENTRY_POINTS(, bf16)
LLMC_ATTENTION_ENTRY_POINTS(, f16)

}  // namespace attn
