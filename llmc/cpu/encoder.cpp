// CpuOps: token + position embedding over a (possibly vocabulary-sliced) wte.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

namespace {
// Token ids must be non-negative; ids outside wte's slice [vocab_begin, vocab_begin + rows)
// are legal (another tensor-parallel rank holds them). (The upper bound, the padded
// vocabulary, is not known to the op; the data loader checks ids against the vocabulary.)
int check_slice(const int32_t* tokens, size_t n, Tensor wte, int C, int vocab_begin, const char* what) {
    LLMC_ASSERT(C > 0, strfmt("%s: need C > 0", what));
    LLMC_ASSERT(vocab_begin >= 0, strfmt("%s: negative vocab_begin %d", what, vocab_begin));
    LLMC_ASSERT(wte.n % (size_t)C == 0, strfmt("%s: wte size is not a multiple of C", what));
    const size_t rows = wte.n / (size_t)C;
    LLMC_ASSERT(rows <= (size_t)INT32_MAX, strfmt("%s: too many wte rows", what));
    for (size_t i = 0; i < n; ++i)
        LLMC_ASSERT(tokens[i] >= 0, strfmt("%s: token id %d out of range", what, tokens[i]));
    return (int)rows;
}
}  // namespace

void CpuOps::encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                             int vocab_begin) {
    ++counters_.launches;
    const size_t BT = (size_t)B * T;
    const int rows = check_slice(tokens, BT, wte, C, vocab_begin, "encoder_forward");
    const float* pe = wpe.n ? cpu_f32(wpe, (size_t)T * C, "wpe") : nullptr;
    cpu::encoder_forward(cpu_f32(out, BT * C, "encoder out"), tokens, cpu_f32(wte, 0, "wte"), pe, B, T, C,
                         vocab_begin, rows);
}

void CpuOps::encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C,
                              int vocab_begin) {
    ++counters_.launches;
    const size_t BT = (size_t)B * T;
    const int rows = check_slice(tokens, BT, dwte, C, vocab_begin, "encoder_backward");
    float* dpe = dwpe.n ? cpu_f32(dwpe, (size_t)T * C, "dwpe") : nullptr;
    cpu::encoder_backward(cpu_f32(dwte, 0, "dwte"), dpe, cpu_f32(dout, BT * C, "encoder dout"), tokens, B, T, C,
                          vocab_begin, rows);
}
