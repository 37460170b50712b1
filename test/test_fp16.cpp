// Proof of the fp16 conversions (llmc/precision/fp16.h), tag [fp16]. The expected bits come from
// the IEEE 754 binary16 definition (sign, 5-bit exponent of bias 15, 10-bit fraction; value
// (-1)^s 2^(e-15) (1 + f/1024), subnormals 2^-14 f/1024), written out here, not from the code:
//  1. known values: 1, 0.1, 65504 (largest), 65519 / 65520 (the last rounding down, the first to
//     inf), 2^-14 (smallest normal), 2^-24 (smallest subnormal), 2^-25 (the tie below it, to 0);
//  2. ties to even among normals and subnormals;
//  3. every half: decoding equals the definition, and encoding the decoded value gives the bits back;
//  4. every pair of neighbouring finite halves: their midpoint rounds to the one with the even
//     fraction, the floats just beside the midpoint to the nearer one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include "llmc/precision/fp16.h"

namespace {

// The definition's value of half bits h (finite only).
double half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    const double mag = e == 0 ? std::ldexp(double(f), -24) : std::ldexp(1.0 + f / 1024.0, e - 15);
    return s ? -mag : mag;
}

}  // namespace

TEST_CASE("fp16: known values from the IEEE 754 definition", "[fp16]") {
    CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
    CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
    CHECK(f32_to_f16_bits(0.1f) == 0x2e66);  // 0.0999755859375 = 2^-4 * (1 + 614/1024)
    CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
    CHECK(f32_to_f16_bits(65519.0f) == 0x7bff);    // below the midpoint 65520: down to 65504
    CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);    // the midpoint: to even, the (infinite) 2^16
    CHECK(f32_to_f16_bits(-65520.0f) == 0xfc00);
    CHECK(f32_to_f16_bits(1e10f) == 0x7c00);
    CHECK(f32_to_f16_bits(INFINITY) == 0x7c00);
    CHECK(f32_to_f16_bits(-INFINITY) == 0xfc00);
    CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
    CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
    CHECK(f32_to_f16_bits(std::ldexp(1023.0f, -24)) == 0x03ff);  // largest subnormal
    CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even 0
    CHECK(f32_to_f16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
    CHECK(f32_to_f16_bits(-std::ldexp(1.0f, -26)) == 0x8000);
    CHECK(f32_to_f16_bits(0.0f) == 0x0000);
    CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
    const uint16_t nan = f32_to_f16_bits(NAN);
    CHECK((nan & 0x7c00) == 0x7c00);
    CHECK((nan & 0x03ff) != 0);
    CHECK(std::isnan(f16_bits_to_f32(0x7e00)));
    CHECK(f16_bits_to_f32(0x7c00) == INFINITY);
    CHECK(f16_bits_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(f16_bits_to_f32(0x7bff) == 65504.0f);
    CHECK(round_f16(65520.0f) == INFINITY);
    CHECK(round_f16(65519.0f) == 65504.0f);
}

TEST_CASE("fp16: ties round to even", "[fp16]") {
    // 1 + 2^-11 lies halfway between 1 (fraction 0, even) and 1 + 2^-10 (fraction 1, odd)
    CHECK(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
    // 1 + 3 * 2^-11: halfway between fractions 1 (odd) and 2 (even)
    CHECK(f32_to_f16_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)) == 0x3c02);
    // at 2048 the step is 2: 2049 -> 2048 (fraction 0), 2051 -> 2052 (fraction 2)
    CHECK(f32_to_f16_bits(2049.0f) == 0x6800);
    CHECK(f32_to_f16_bits(2051.0f) == 0x6802);
    // subnormals: 3 * 2^-25 is halfway between 1 and 2 times 2^-24 -> 2; 5 * 2^-25 -> 2
    CHECK(f32_to_f16_bits(3.0f * std::ldexp(1.0f, -25)) == 0x0002);
    CHECK(f32_to_f16_bits(5.0f * std::ldexp(1.0f, -25)) == 0x0002);
    // the top subnormal and the smallest normal: 1023.5 * 2^-24 ties to 1024 (the normal 2^-14)
    CHECK(f32_to_f16_bits(1023.5f * std::ldexp(1.0f, -24)) == 0x0400);
}

TEST_CASE("fp16: every half decodes to its defined value and encodes back", "[fp16]") {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const uint16_t b = uint16_t(h);
        if (((b >> 10) & 31) == 31) continue;  // inf and NaN: above
        const float f = f16_bits_to_f32(b);
        bad += double(f) != half_value(b);
        bad += f32_to_f16_bits(f) != b;
    }
    CHECK(bad == 0);
}

TEST_CASE("fp16: midpoints between neighbours round to the even one, their neighbours to the nearer", "[fp16]") {
    int bad = 0, checked = 0;
    for (uint16_t lo = 0; lo < 0x7bff; lo++) {  // positive finite pairs (lo, lo + 1)
        const uint16_t hi = uint16_t(lo + 1);
        const double mid = (half_value(lo) + half_value(hi)) / 2;  // exact in a float (one bit more)
        const float m = float(mid);
        if (double(m) != mid) {
            bad++;
            continue;
        }
        const uint16_t even = (lo & 1) ? hi : lo;
        bad += f32_to_f16_bits(m) != even;
        bad += f32_to_f16_bits(std::nextafter(m, 0.0f)) != lo;
        bad += f32_to_f16_bits(std::nextafter(m, 1e9f)) != hi;
        bad += f32_to_f16_bits(-m) != (0x8000 | even);
        checked++;
    }
    // past the largest half: the midpoint to 2^16 and above goes to inf, below it to 65504
    const float top = 65520.0f;
    bad += f32_to_f16_bits(std::nextafter(top, 0.0f)) != 0x7bff;
    bad += f32_to_f16_bits(std::nextafter(top, 1e9f)) != 0x7c00;
    CHECK(checked == 0x7bff);
    CHECK(bad == 0);
}
