// The rotary embedding's inverse frequencies, shared by the backends so that they rotate by
// bitwise the same angles. transformers (LlamaRotaryEmbedding, default rope type) computes
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
// in fp32: the exponent 2i/dim rounded to fp32, the power rounded to fp32, then the fp32
// reciprocal. Here each step is correctly rounded (the power is taken in double and rounded
// once), which is what an exact fp32 pow gives.
#pragma once
#include <cmath>

// inv_freq[i] for i in [0, HS/2)
inline float rope_inv_freq(int i, int HS, float theta) {
    const float e = float(2 * i) / float(HS);
    const float p = float(std::pow(double(theta), double(e)));
    return 1.0f / p;
}
