// CpuOps: token + position embedding.
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"

namespace {
void check_tokens(const int32_t* tokens, size_t n, Tensor wte, int C) {
    const size_t rows = wte.n / (size_t)C;
    for (size_t i = 0; i < n; ++i)
        LLMC_ASSERT(tokens[i] >= 0 && (size_t)tokens[i] < rows, strfmt("encoder: token id %d out of range", tokens[i]));
}
}  // namespace

void CpuOps::encoder_forward(Tensor out, const int32_t* tokens, Tensor wte, Tensor wpe, int B, int T, int C) {
    const size_t BT = (size_t)B * T;
    check_tokens(tokens, BT, wte, C);
    cpu::encoder_forward(cpu_f32(out, BT * C, "encoder out"), tokens, cpu_f32(wte, 0, "wte"),
                         cpu_f32(wpe, (size_t)T * C, "wpe"), B, T, C);
}

void CpuOps::encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int B, int T, int C) {
    const size_t BT = (size_t)B * T;
    check_tokens(tokens, BT, dwte, C);
    cpu::encoder_backward(cpu_f32(dwte, 0, "dwte"), cpu_f32(dwpe, (size_t)T * C, "dwpe"),
                          cpu_f32(dout, BT * C, "encoder dout"), tokens, B, T, C);
}
