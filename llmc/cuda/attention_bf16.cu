// The attention kernels' translation unit for bf16 (one per element type: attention_f32.cu,
// attention_bf16.cu, attention_f16.cu): CudaOps's attention entry points (llmc/cuda/attention_ops.h)
// with every flash and general kernel they launch. One type a unit: nvcc and the emulator's build
// compile the three side by side, and a planted bug (test/cuemu/planted_bugs.sh) rebuilds only the
// units of the types its cases run.
#include "llmc/cuda/attention.cuh"

namespace attn {

LLMC_ATTENTION_ENTRY_POINTS(, bf16)

}  // namespace attn
