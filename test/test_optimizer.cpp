// LR schedules (warmup, constant, cosine, linear, wsd) and the clipping factor, against
// closed forms written out here; the host's bf16 stochastic rounding (optimizer offload).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "llmc/precision/bf16.h"
#include "llmc/model/optimizer.h"

namespace {
TrainConfig sched(const char* name, int steps, int warmup, double final_frac) {
    TrainConfig t;
    t.lr_schedule = name;
    t.steps = steps;
    t.warmup_steps = warmup;
    t.lr = 1.0;
    t.final_lr_frac = final_frac;
    return t;
}
}  // namespace

TEST_CASE("linear warmup reaches the peak at the end of warmup") {
    TrainConfig t = sched("cosine", 100, 10, 0.1);
    CHECK(lr_at(t, 0) == Approx(0.1));
    CHECK(lr_at(t, 4) == Approx(0.5));
    CHECK(lr_at(t, 9) == Approx(1.0));
}

TEST_CASE("constant, cosine, linear and wsd schedules") {
    TrainConfig c = sched("constant", 100, 5, 0.0);
    CHECK(lr_at(c, 50) == 1.0);
    CHECK(lr_at(c, 99) == 1.0);

    TrainConfig cos = sched("cosine", 110, 10, 0.1);
    CHECK(lr_at(cos, 10) == Approx(1.0));
    CHECK(lr_at(cos, 60) == Approx(0.1 + 0.5 * (1 + std::cos(M_PI * 0.5)) * 0.9));  // halfway: 0.55
    CHECK(lr_at(cos, 60) == Approx(0.55));
    CHECK(lr_at(cos, 109) > 0.1);
    CHECK(lr_at(cos, 109) == Approx(0.1 + 0.5 * (1 + std::cos(M_PI * 0.99)) * 0.9));  // last step: just above the floor

    TrainConfig lin = sched("linear", 110, 10, 0.0);
    CHECK(lr_at(lin, 35) == Approx(0.75));
    CHECK(lr_at(lin, 60) == Approx(0.5));

    TrainConfig w = sched("wsd", 100, 10, 0.0);
    w.decay_frac = 0.2;  // decay over the last 20 steps
    CHECK(lr_at(w, 50) == 1.0);
    CHECK(lr_at(w, 79) == 1.0);
    CHECK(lr_at(w, 80) == Approx(1.0 - 1.0 / 20));
    CHECK(lr_at(w, 89) == Approx(0.5));
    CHECK(lr_at(w, 99) == Approx(0.0).margin(1e-12));
}

TEST_CASE("clip factor follows torch's clip_grad_norm_") {
    CHECK(clip_scale(0.5, 1.0) == 1.0f);
    CHECK(clip_scale(4.0, 1.0) == Approx(1.0 / (4.0 + 1e-6)));
    CHECK(clip_scale(100.0, 0.0) == 1.0f);  // clipping off
}

// The bf16 stochastic rounding the host update of optimizer offload shares with the CUDA kernel:
// over all 2^16 values of the random bits, x rounds up (away from zero, to the next bf16) for
// exactly as many as x's dropped low 16 bits, else it truncates; exact bf16 values, infinities and
// NaN are kept.
TEST_CASE("bf16 stochastic rounding on the host rounds up with the dropped fraction's probability") {
    for (float x : {1.0f + 1.0f / 1024, -3.14159f, 1e-30f, -65504.5f, 0.3f}) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const uint16_t down = uint16_t(u >> 16), up = uint16_t(down + 1);
        uint32_t ups = 0, others = 0;
        for (uint32_t r = 0; r < 65536; r++) {
            const uint16_t b = f32_to_bf16_stochastic(x, r | 0xabcd0000u);  // the high bits do not matter
            ups += b == up;
            others += b != up && b != down;
        }
        INFO("x = " << x);
        CHECK(others == 0);
        CHECK(ups == (u & 0xffffu));
    }
    CHECK(f32_to_bf16_stochastic(1.5f, 0xffffu) == 0x3fc0);  // exact in bf16: kept
    CHECK(f32_to_bf16_stochastic(INFINITY, 0xffffu) == 0x7f80);
    CHECK(f32_to_bf16_stochastic(-INFINITY, 0xffffu) == 0xff80);
    CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_stochastic(NAN, 0xffffu))));
    CHECK(hash_u32(1, 2) != hash_u32(1, 3));
    CHECK(hash_u32(1, 2) != hash_u32(2, 2));
}
