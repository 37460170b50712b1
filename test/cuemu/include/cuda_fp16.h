// cuemu stand-in for <cuda_fp16.h>: __half as its 16 bits, conversions rounding to nearest even as
// the device's __float2half_rn does (llmc/precision/fp16.h: past 65504 +-inf, subnormals, NaN
// stays NaN).
#pragma once
#include <cstdint>

#include "llmc/precision/fp16.h"
#include "test/cuemu/cuemu.h"

struct __half {
    uint16_t __x;
    __half() = default;
    explicit __half(float f) : __x(f32_to_f16_bits(f)) {}
    operator float() const { return f16_bits_to_f32(__x); }
};
inline float __half2float(__half h) { return f16_bits_to_f32(h.__x); }
inline __half __float2half_rn(float f) {
    __half h;
    h.__x = f32_to_f16_bits(f);
    return h;
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.__x = u;
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
