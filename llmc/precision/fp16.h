// IEEE 754 binary16 (fp16, "half") on the host: the conversions of precision "fp16", which the
// CPU backend emulates by rounding fp32 values to the nearest half (llmc/cpu/fp16_ops.h), and the
// reading of F16 safetensors. Layout: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits;
// largest finite 65504, smallest normal 2^-14, smallest subnormal 2^-24.
#pragma once
#include <cstdint>
#include <cstring>

// The float of half bits h (exact: every half is a float).
inline float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {  // +-0 and the subnormals: man * 2^-24 (exact in a float)
        const float v = float(man) * 0x1p-24f;
        return sign ? -v : v;
    }
    // inf and NaN (payload kept), or a normal: the exponent rebiased 15 -> 127
    const uint32_t u = sign | (exp == 0x1fu ? 0x7f800000u : (exp + 112u) << 23) | (man << 13);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The half nearest to f, ties to even; past the largest half (from 65520 up) +-inf; below the
// smallest normal the subnormals (steps of 2^-24); NaN stays a quiet NaN.
inline uint16_t f32_to_f16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
    if (a >= 0x47800000u) return uint16_t(sign | 0x7c00u);  // >= 2^16 (and inf): inf
    if (a >= 0x38800000u) {  // >= 2^-14: a normal half (or, rounding up past 65504, inf = 0x7c00)
        uint32_t h = a - (112u << 23);                // rebias the exponent 127 -> 15
        h += 0x0fffu + ((h >> 13) & 1u);              // round the 13 dropped bits, ties to even
        return uint16_t(sign | (h >> 13));
    }
    if (a <= 0x33000000u) return sign;  // <= 2^-25 (half the smallest subnormal; the tie goes to even 0)
    // subnormal: round(|f| / 2^-24); |f| = mant * 2^(e - 150) with e the biased exponent (102..112)
    const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;  // 14..24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) m++;  // 1024 is the smallest normal's bits: right
    return uint16_t(sign | m);
}

// f rounded to the nearest half, as a float.
inline float round_f16(float f) { return f16_bits_to_f32(f32_to_f16_bits(f)); }
