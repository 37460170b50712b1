// cuemu stand-in for <cuda_bf16.h>: __nv_bfloat16 as its 16 bits, conversions rounding to nearest
// even as the device does (llmc/precision/bf16.h's rounding, NaN stays NaN).
#pragma once
#include <cstdint>

#include "llmc/precision/bf16.h"
#include "test/cuemu/cuemu.h"

struct __nv_bfloat16 {
    uint16_t __x;
    __nv_bfloat16() = default;
    explicit __nv_bfloat16(float f) : __x(f32_to_bf16_bits(f)) {}
    operator float() const { return bf16_bits_to_f32(__x); }
};
inline float __bfloat162float(__nv_bfloat16 b) { return bf16_bits_to_f32(b.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    __nv_bfloat16 b;
    b.__x = f32_to_bf16_bits(f);
    return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 b;
    b.__x = u;
    return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
