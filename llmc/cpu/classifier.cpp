// CpuOps: softmax cross-entropy over the real vocabulary of padded logits, fused or split
// over vocabulary slices (tensor parallelism).
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

#include <cmath>
#include <limits>

namespace {
void check_targets(const int32_t* targets, int N, int V, const char* what) {
    for (int i = 0; i < N; ++i)
        LLMC_ASSERT(targets[i] >= 0 && targets[i] < V, strfmt("%s: target %d out of range", what, targets[i]));
}
void check_slice(int N, int Vl, int vocab_begin, int V, const char* what) {
    LLMC_ASSERT(N >= 0 && Vl >= 0 && vocab_begin >= 0 && V > 0,
                strfmt("%s: need N >= 0, Vl >= 0, vocab_begin >= 0, V > 0", what));
}
}  // namespace

void CpuOps::cross_entropy(Tensor logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                           float dloss) {
    ++counters_.launches;
    LLMC_ASSERT(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp");
    check_targets(targets, N, V, "cross_entropy");
    cpu::cross_entropy(cpu_f32(logits, (size_t)N * Vp, "logits"), losses, targets, N, V, Vp, dloss);
}

void CpuOps::cross_entropy_partial(float* stats, Tensor logits, const int32_t* targets, int N, int Vl,
                                   int vocab_begin, int V) {
    ++counters_.launches;
    check_slice(N, Vl, vocab_begin, V, "cross_entropy_partial");
    check_targets(targets, N, V, "cross_entropy_partial");
    cpu::cross_entropy_partial(stats, cpu_f32(logits, (size_t)N * Vl, "logits"), targets, N, Vl, vocab_begin, V);
}

void CpuOps::cross_entropy_finish(Tensor logits, float* losses, const float* stats, const int32_t* targets, int N,
                                  int Vl, int vocab_begin, int V, float dloss) {
    ++counters_.launches;
    check_slice(N, Vl, vocab_begin, V, "cross_entropy_finish");
    check_targets(targets, N, V, "cross_entropy_finish");
    cpu::cross_entropy_finish(cpu_f32(logits, dloss != 0.0f ? (size_t)N * Vl : 0, "logits"), losses, stats, targets,
                              N, Vl, vocab_begin, V, dloss);
}

void CpuOps::cross_entropy_stats(int phase, float* stats, float* mx, float* rest, size_t rows) {
    ++counters_.launches;
    for (size_t i = 0; i < rows; i++) {
        if (phase == 0) {
            mx[i] = stats[3 * i];
        } else if (phase == 1) {
            const float m = stats[3 * i];
            // a slice with no real column reports (-inf, 0)
            rest[2 * i] = m == -std::numeric_limits<float>::infinity() ? 0.0f : stats[3 * i + 1] * std::exp(m - mx[i]);
            rest[2 * i + 1] = stats[3 * i + 2];
        } else {
            stats[3 * i] = mx[i];
            stats[3 * i + 1] = rest[2 * i];
            stats[3 * i + 2] = rest[2 * i + 1];
        }
    }
}
