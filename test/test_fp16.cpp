// Proof of the fp16 conversions (llmc/precision/fp16.h), tag [fp16]. The expected bits come from
// the IEEE 754 binary16 definition (sign, 5-bit exponent of bias 15, 10-bit fraction; value
// (-1)^s 2^(e-15) (1 + f/1024), subnormals 2^-14 f/1024), written out here, not from the code:
//  1. known values: 1, 0.1, 65504 (largest), 65519 / 65520 (the last rounding down, the first to
//     inf), 2^-14 (smallest normal), 2^-24 (smallest subnormal), 2^-25 (the tie below it, to 0);
//  2. ties to even among normals and subnormals;
//  3. every half: decoding equals the definition, and encoding the decoded value gives the bits back;
//  4. every pair of neighbouring finite halves: their midpoint rounds to the one with the even
//     fraction, the floats just beside the midpoint to the nearer one;
//  5. CpuFp16Ops (the CPU's fp16 emulation) against CpuOps: each Tensor an op, a copy or an upload
//     writes is CpuOps' value rounded (overflowing to inf), the float* statistics (LayerNorm mean
//     and rstd, losses, AdamW's master and moments) are bitwise CpuOps', copy_f32 copies as is.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/cpu/fp16_ops.h"
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

// ---- CpuFp16Ops (llmc/cpu/fp16_ops.h): CpuOps' results, the Tensors rounded, the float* statistics not ----

namespace {

std::vector<float> halves(size_t n, uint32_t seed, float scale) {  // fp16-representable inputs
    std::vector<float> v(n);
    uint32_t s = seed;
    for (float& x : v) {
        s = s * 1664525u + 1013904223u;
        x = round_f16(scale * (float((s >> 8) & 0xffff) / 32768.0f - 1.0f));
    }
    return v;
}
Tensor t32(std::vector<float>& v) { return Tensor(v.data(), v.size(), DType::F32); }
// every element of got is round_f16 of want's; returns how many of want were not halves already
size_t check_rounded(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    size_t bad = 0, moved = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const float r = round_f16(want[i]);
        bad += !(got[i] == r || (std::isnan(got[i]) && std::isnan(r)));
        moved += r != want[i];
    }
    INFO(what);
    CHECK(bad == 0);
    return moved;
}

}  // namespace

TEST_CASE("CpuFp16Ops: every Tensor an op writes is CpuOps' result rounded to fp16, statistics stay fp32", "[fp16]") {
    CpuOps ref;
    CpuFp16Ops emu;
    CHECK(emu.emulates_fp16());
    CHECK_FALSE(ref.emulates_fp16());
    const int N = 24, C = 40, OC = 56, V = 50, Vp = 64;
    std::vector<float> inp = halves(size_t(N) * C, 1, 3.0f), w = halves(size_t(C), 2, 1.0f),
                       b = halves(size_t(C), 3, 0.5f);
    {  // layernorm: out rounded; mean, rstd (float*) bitwise CpuOps'
        std::vector<float> o1(inp.size()), o2(inp.size()), m1(N), m2(N), r1(N), r2(N);
        ref.layernorm_forward(t32(o1), m1.data(), r1.data(), t32(inp), t32(w), t32(b), N, C);
        emu.layernorm_forward(t32(o2), m2.data(), r2.data(), t32(inp), t32(w), t32(b), N, C);
        CHECK(check_rounded(o2, o1, "layernorm out") > 0);
        CHECK(m1 == m2);
        CHECK(r1 == r2);
    }
    std::vector<float> wm = halves(size_t(OC) * C, 4, 0.2f), bias = halves(size_t(OC), 5, 0.1f);
    {  // matmul with GELU: both the pre-activation and the output rounded
        std::vector<float> o1(size_t(N) * OC), o2 = o1, p1 = o1, p2 = o1;
        ref.matmul_forward(t32(o1), t32(p1), t32(inp), t32(wm), t32(bias), N, C, OC, true);
        emu.matmul_forward(t32(o2), t32(p2), t32(inp), t32(wm), t32(bias), N, C, OC, true);
        CHECK(check_rounded(p2, p1, "matmul pre_gelu") > 0);
        CHECK(check_rounded(o2, o1, "matmul out") > 0);
    }
    {  // cross entropy: losses fp32 as CpuOps'; the logits' gradient rounded, overflowing to inf past 65504
        std::vector<float> logits = halves(size_t(N) * Vp, 6, 4.0f);
        std::vector<int32_t> targets(N);
        for (int i = 0; i < N; i++) targets[size_t(i)] = (i * 7) % V;
        for (float dloss : {1.0f / N, 1e6f}) {
            std::vector<float> l1 = logits, l2 = logits, s1(N), s2(N);
            ref.cross_entropy(t32(l1), s1.data(), targets.data(), N, V, Vp, dloss);
            emu.cross_entropy(t32(l2), s2.data(), targets.data(), N, V, Vp, dloss);
            CHECK(s1 == s2);
            CHECK(check_rounded(l2, l1, "cross_entropy dlogits") > 0);
            size_t infs = 0;
            for (float x : l2) infs += std::isinf(x);
            CHECK((infs > 0) == (dloss > 1.0f));  // the gradient's -0.99 x 1e6 at the targets: -inf in fp16
        }
    }
    {  // copy and uploads round; copy_f32 (fp32 statistics) does not
        std::vector<float> src = {1.0f + 1.0f / 4096, 70000.0f, 1e-9f, 0.1f}, a(4), c(4), d(4);
        emu.copy(t32(a), t32(src));
        check_rounded(a, src, "copy");
        emu.from_host_f32(t32(c), src.data());
        check_rounded(c, src, "from_host_f32");
        CHECK(std::isinf(c[1]));
        emu.copy_f32(d.data(), src.data(), 4);
        CHECK(d == src);
    }
    {  // AdamW: the master updated as CpuOps does it, the parameters its rounding
        const size_t n = 1000;
        std::vector<float> p = halves(n, 7, 1.0f), g = halves(n, 8, 0.01f);
        std::vector<float> p1 = p, p2 = p, w1 = p, w2 = p, m1(n), m2(n), v1(n), v2(n);
        ref.adamw(t32(p1), w1.data(), t32(g), m1.data(), v1.data(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 0);
        emu.adamw(t32(p2), w2.data(), t32(g), m2.data(), v2.data(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 0);
        CHECK(w1 == w2);
        CHECK(m1 == m2);
        CHECK(v1 == v2);
        CHECK(check_rounded(p2, w1, "adamw params from the master") > 0);
    }
}
