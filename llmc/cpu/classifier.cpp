// CpuOps: softmax cross-entropy over the real vocabulary of padded logits.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

void CpuOps::cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                           float dloss) {
    LLMC_ASSERT(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp");
    for (int i = 0; i < N; ++i)
        LLMC_ASSERT(targets[i] >= 0 && targets[i] < V, strfmt("cross_entropy: target %d out of range", targets[i]));
    cpu::cross_entropy(cpu_f32(logits, (size_t)N * Vp, "logits"), losses, targets, N, V, Vp, dloss);
}
