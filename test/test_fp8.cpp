// Proof of the FP8 pieces (llmc/precision/fp8.h, llmc/cpu/fp8.cpp), tag [fp8]:
//  1. fp8_decode / fp8_encode against test/data/fp8_tables.json, written by
//     dev/reference/make_fp8_tables.py from an exhaustive rational-arithmetic definition of the
//     formats (cross-checked there against NVIDIA's cuda_fp8.h host conversion);
//  2. the scaling state machine (history, margin, zeros, overflow) and its checkpoint bytes; the
//     backend's steps of it (Ops::fp8_update_scales over Fp8Device) equal the host's bit for bit;
//  3. CpuOps::matmul_forward_fp8 / matmul_backward_fp8 bit-for-bit against the fp32 ops run on
//     inputs quantized by a quantizer written here from the decoded table alone;
//  4. fp8_gemm_supported (llmc/cuda/fp8_rules.h: cuBLASLt's documented FP8 rules, which the CUDA
//     fp8 GEMMs and the emulator's cuBLASLt stand-in share) on calls the documentation allows
//     and refuses, one broken rule at a time.
#include <catch2/catch.hpp>
#include <omp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "llmc/core/config.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cuda/fp8_rules.h"
#include "llmc/precision/fp8.h"

namespace {

using json = nlohmann::json;

std::string data_path(const std::string& name) {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("LLMC_TEST_DATA")) dirs.push_back(env);
    dirs.push_back("test/data");
    std::string here = __FILE__;
    const size_t slash = here.find_last_of('/');
    if (slash != std::string::npos) dirs.push_back(here.substr(0, slash) + "/data");
    for (const auto& d : dirs) {
        std::ifstream f(d + "/" + name);
        if (f) return d + "/" + name;
    }
    FAIL("cannot find test data file " << name << " (run from the repository root or set LLMC_TEST_DATA)");
    return "";
}

const json& tables() {
    static const json t = [] {
        std::ifstream f(data_path("fp8_tables.json"));
        return json::parse(f);
    }();
    return t;
}

const char* key(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

float bits_to_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

// The value of a code in the table (NaN for "nan").
double table_value(const json& v) {
    if (v.is_string()) {
        const std::string s = v.get<std::string>();
        return s == "inf" ? INFINITY : s == "-inf" ? -INFINITY : NAN;
    }
    return v.get<double>();
}

// A quantizer that knows nothing of fp8_encode: the nearest representable value of the
// table (ties to the even code), saturating beyond the largest, for one format.
class TableQuantizer {
public:
    explicit TableQuantizer(Fp8Format f) {
        const json& dec = tables()[key(f)]["decode"];
        for (int c = 0; c < 0x80; ++c) {
            const double v = table_value(dec[c]);
            if (std::isfinite(v)) vals_.push_back({v, c});
        }
        std::sort(vals_.begin(), vals_.end());
    }
    // nearest representable value to x, with x's sign
    float nearest(float x) const {
        if (std::isnan(x)) return NAN;
        const double a = std::fabs((double)x);
        double r;
        if (a >= vals_.back().first) {
            r = vals_.back().first;
        } else {
            size_t hi = 1;
            while (vals_[hi].first < a) ++hi;  // vals_[hi - 1] < a <= vals_[hi]
            const auto& lo = vals_[hi - 1];
            const auto& up = vals_[hi];
            const double mid = (lo.first + up.first) / 2;  // exact in double
            if (a < mid)
                r = lo.first;
            else if (a > mid)
                r = up.first;
            else
                r = (lo.second % 2 == 0) ? lo.first : up.first;
        }
        return (float)(std::signbit(x) ? -r : r);
    }
    // the spec's q(x) = nearest(x * s) * (1/s), in fp32
    float q(float x, float s) const { return nearest(x * s) * (1.0f / s); }
    std::vector<float> q(const std::vector<float>& x, float s) const {
        std::vector<float> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = q(x[i], s);
        return out;
    }

private:
    std::vector<std::pair<double, int>> vals_;  // non-negative finite values and their codes
};

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

float amax_of(const std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Tensor T(std::vector<float>& v) { return Tensor(v.data(), v.size(), DType::F32); }

Fp8Cast make_cast(Fp8Format f, float scale, bool current, int margin, float* amax) {
    Fp8Cast c;
    c.format = f;
    c.scale = scale;
    c.current = current;
    c.margin = margin;
    c.amax = amax;
    return c;
}

}  // namespace

// ---------------------------------------------------------------- formats

TEST_CASE("fp8: every code decodes to the reference table", "[fp8]") {
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        const json& dec = tables()[key(f)]["decode"];
        REQUIRE(dec.size() == 256);
        int nan = 0;
        for (int c = 0; c < 256; ++c) {
            const double want = table_value(dec[c]);
            const float got = fp8_decode((uint8_t)c, f);
            INFO(key(f) << " code " << c);
            if (std::isnan(want)) {
                CHECK(std::isnan(got));
                ++nan;
            } else {
                CHECK((double)got == want);
                CHECK(std::signbit(got) == (c >= 0x80));  // -0 for 0x80 as well
            }
        }
        CHECK(nan == (f == Fp8Format::E4M3 ? 2 : 6));
        CHECK(fp8_max(f) == (float)tables()[key(f)]["max"].get<double>());
    }
}

TEST_CASE("fp8: encoding rounds to nearest even and saturates like the reference table", "[fp8]") {
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        const json& cases = tables()[key(f)]["encode"];
        REQUIRE(cases.size() > 1000);
        int bad = 0, ties = 0, saturated = 0;
        for (const json& e : cases) {
            const uint32_t bits = (uint32_t)std::stoul(e["bits"].get<std::string>(), nullptr, 16);
            const int want = e["code"].get<int>();
            const int got = fp8_encode(bits_to_float(bits), f);
            const std::string why = e["why"].get<std::string>();
            ties += why.find("tie to even") != std::string::npos;
            saturated += why.find("saturates") != std::string::npos;
            if (got != want && ++bad <= 10)
                FAIL_CHECK(key(f) << " x=" << e["x"].get<std::string>() << " (" << why << "): got 0x" << std::hex << got
                                  << " want 0x" << want);
        }
        CHECK(bad == 0);
        CHECK(ties > 200);  // the table really exercises ties and saturation
        CHECK(saturated >= 8);
    }
}

TEST_CASE("fp8: every finite code survives a round trip; specials map as specified", "[fp8]") {
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
        int finite = 0;
        for (int c = 0; c < 256; ++c) {
            const float v = fp8_decode((uint8_t)c, f);
            if (!std::isfinite(v)) continue;
            ++finite;
            CHECK(fp8_encode(v, f) == c);
        }
        CHECK(finite == (f == Fp8Format::E4M3 ? 254 : 248));
        const int max_code = f == Fp8Format::E4M3 ? 0x7E : 0x7B;
        CHECK(fp8_encode(INFINITY, f) == max_code);
        CHECK(fp8_encode(-INFINITY, f) == (0x80 | max_code));
        CHECK(fp8_encode(NAN, f) == 0x7F);
        CHECK(fp8_encode(-NAN, f) == 0x7F);
        CHECK(fp8_encode(-0.0f, f) == 0x80);
    }
    // E5M2's infinity codes decode to inf and encode back to max (satfinite)
    CHECK(fp8_decode(0x7C, Fp8Format::E5M2) == INFINITY);
    CHECK(fp8_encode(fp8_decode(0xFC, Fp8Format::E5M2), Fp8Format::E5M2) == 0xFB);
}

// ---------------------------------------------------------------- scaling

TEST_CASE("fp8: delayed scaling keeps an amax history and applies the margin", "[fp8]") {
    SECTION("history roll-over") {
        Fp8TensorScale s(Fp8Format::E4M3, Fp8Recipe::Delayed, 4, 0);
        CHECK(s.scale() == 1.0f);
        CHECK(s.update(10.0f));
        CHECK(s.scale() == 44.8f);  // 448 / 10
        for (int i = 0; i < 3; ++i) {
            s.update(2.0f);
            CHECK(s.scale() == 44.8f);  // 10 still in the last 4 steps
        }
        s.update(2.0f);  // the 10 leaves the ring
        CHECK(s.scale() == 224.0f);
        s.update(64.0f);
        CHECK(s.scale() == 7.0f);
        CHECK(s.overflow_events() == 0);
    }
    SECTION("margin and E5M2") {
        Fp8TensorScale m(Fp8Format::E4M3, Fp8Recipe::Delayed, 2, 2);
        m.update(10.0f);
        CHECK(m.scale() == 11.2f);  // 448 / 10 / 2^2
        Fp8TensorScale g(Fp8Format::E5M2, Fp8Recipe::Delayed, 2, 1);
        g.update(8.0f);
        CHECK(g.scale() == 3584.0f);  // 57344 / 8 / 2
    }
    SECTION("a tensor of zeros keeps the scale") {
        Fp8TensorScale s(Fp8Format::E4M3, Fp8Recipe::Delayed, 2, 0);
        s.update(0.0f);
        CHECK(s.scale() == 1.0f);  // empty history: the initial scale
        s.update(7.0f);
        CHECK(s.scale() == 64.0f);
        s.update(0.0f);
        CHECK(s.scale() == 64.0f);  // 7 still in the history
        s.update(0.0f);
        CHECK(s.scale() == 64.0f);  // history all zeros: kept
    }
    SECTION("non-finite amaxes are skipped and counted") {
        Fp8TensorScale s(Fp8Format::E4M3, Fp8Recipe::Delayed, 2, 0);
        s.update(14.0f);
        CHECK(s.scale() == 32.0f);
        CHECK_FALSE(s.update(INFINITY));
        CHECK_FALSE(s.update(NAN));
        CHECK(s.scale() == 32.0f);
        CHECK(s.overflow_events() == 2);
        s.update(1.0f);  // the ring did not move on the overflows: 14 is still in it
        CHECK(s.scale() == 32.0f);
        s.update(1.0f);
        CHECK(s.scale() == 448.0f);
    }
    SECTION("current recipe: the scale of the last step, as the ops' fallback") {
        Fp8TensorScale s(Fp8Format::E4M3, Fp8Recipe::Current, 16, 1);
        const Fp8Cast c0 = s.cast(nullptr);
        CHECK(c0.current);
        CHECK(c0.margin == 1);
        s.update(7.0f);
        CHECK(s.scale() == 32.0f);  // 448 / 7 / 2
        s.update(0.0f);
        CHECK(s.scale() == 32.0f);
        CHECK(s.history().empty());
    }
}

TEST_CASE("fp8: the model state indexes, updates and round-trips bit-exactly", "[fp8]") {
    Fp8Config cfg;  // hybrid, delayed, 16, 0
    cfg.amax_history = 3;
    cfg.margin = 1;
    const Fp8Options opt = fp8_options(cfg);
    Fp8State st(2, opt);
    REQUIRE(st.size() == 2 * 4 * 3);
    // formats: E4M3 for inputs and weights, E5M2 for output gradients (hybrid)
    std::vector<float> amax_dev(st.size(), 0.0f);
    const Fp8Cast g = st.cast(1, Fp8Linear::FcProj, Fp8Operand::GradOutput, amax_dev.data());
    CHECK(g.format == Fp8Format::E5M2);
    CHECK(g.amax == amax_dev.data() + Fp8State::index(1, Fp8Linear::FcProj, Fp8Operand::GradOutput));
    CHECK(Fp8State::index(1, Fp8Linear::FcProj, Fp8Operand::GradOutput) == 23);
    CHECK(st.cast(0, Fp8Linear::Qkv, Fp8Operand::Weight, nullptr).format == Fp8Format::E4M3);
    CHECK(st.cast(0, Fp8Linear::Fc, Fp8Operand::Input, nullptr).format == Fp8Format::E4M3);
    cfg.format = "e4m3";
    CHECK(Fp8State(1, fp8_options(cfg)).cast(0, Fp8Linear::Qkv, Fp8Operand::GradOutput, nullptr).format ==
          Fp8Format::E4M3);
    cfg.format = "hybrid";

    // a few steps with varied amaxes, one overflow
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> ud(0.01f, 100.0f);
    for (int step = 0; step < 5; ++step) {
        std::vector<float> a(st.size());
        for (auto& x : a) x = ud(rng);
        if (step == 2) a[7] = INFINITY;
        CHECK(st.update(a.data()) == (step == 2 ? 1 : 0));
    }
    CHECK(st.overflow_events() == 1);
    const std::vector<uint8_t> bytes = st.save();

    Fp8State back(2, opt);
    back.load(bytes, "ckpt");
    CHECK(back.save() == bytes);
    for (int i = 0; i < st.size(); ++i) {
        const int l = i / 12, lin = (i / 3) % 4, op = i % 3;
        const auto& a = st.scale(l, (Fp8Linear)lin, (Fp8Operand)op);
        const auto& b = back.scale(l, (Fp8Linear)lin, (Fp8Operand)op);
        CHECK(std::memcmp(&a.history()[0], &b.history()[0], 3 * sizeof(float)) == 0);
        CHECK(a.scale() == b.scale());
    }
    // both go on identically (same ring position)
    std::vector<float> a(st.size(), 0.5f);
    st.update(a.data());
    back.update(a.data());
    CHECK(back.save() == st.save());

    // other settings or broken bytes are user errors
    Fp8Config other = cfg;
    other.recipe = "current";
    CHECK_THROWS_AS(Fp8State(2, fp8_options(other)).load(bytes, "ckpt"), UserError);
    CHECK_THROWS_AS(Fp8State(3, opt).load(bytes, "ckpt"), UserError);
    std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 1);
    CHECK_THROWS_AS(Fp8State(2, opt).load(cut, "ckpt"), UserError);
    std::vector<uint8_t> longer = bytes;
    longer.push_back(0);
    CHECK_THROWS_AS(Fp8State(2, opt).load(longer, "ckpt"), UserError);
    other = cfg;
    other.format = "e5m2";
    CHECK_THROWS_AS(fp8_options(other), UserError);
}

// The trainer's scaling state lives on the backend (Fp8Device; Ops::fp8_update_scales): the
// backend's steps must be the host state's steps bit for bit (both recipes, overflows, the
// reduction's widened form), its image must import into the checkpointed host state exactly, and
// checkpoints written before the history was kept oldest first (a ring with any next slot) must
// load as the same state.
TEST_CASE("fp8: the backend's scaling state steps as the host's and checkpoints alike", "[fp8]") {
    for (const char* recipe : {"delayed", "current"}) {
        CAPTURE(recipe);
        Fp8Config cfg;
        cfg.recipe = recipe;
        cfg.amax_history = 3;
        cfg.margin = 1;
        const Fp8Options opt = fp8_options(cfg);
        Fp8State host(2, opt), start(2, opt);
        const int n = host.size(), H = host.image_history();
        CHECK(H == (std::string(recipe) == "delayed" ? 3 : 0));
        // the device image, as Fp8Converter lays it out, over host memory (the CPU backend's)
        std::vector<float> scale(n), hist(size_t(n) * H), amax(n), word(1), inv(size_t(n) * kFp8InvStride, -1.0f);
        std::vector<uint32_t> overflows(n, 0);
        std::vector<double> wide(n);
        start.export_image(scale.data(), hist.data());
        CHECK(scale == std::vector<float>(n, 1.0f));
        Fp8Device d;
        d.n = n, d.history = H, d.margin = opt.margin, d.hybrid = opt.hybrid;
        d.amax = amax.data(), d.scale = scale.data(), d.hist = hist.data(), d.overflows = overflows.data();
        d.wide = wide.data(), d.inv = inv.data();
        CpuOps ops;
        std::mt19937 rng(11);
        std::uniform_real_distribution<float> ud(0.01f, 100.0f);
        for (int step = 0; step < 6; ++step) {
            CAPTURE(step);
            for (auto& x : amax) x = ud(rng);
            if (step == 1) amax[4] = 0.0f;  // a tensor of zeros keeps its scale
            if (step == 2) amax[7] = INFINITY;
            if (step == 3) amax[8] = NAN;
            if (step == 4) amax[19] = NAN;
            const int bad = host.update(amax.data());
            const bool widened = step % 2 == 1;  // as under several ranks: through the doubles of the bits
            if (widened) ops.fp8_widen_amaxes(d);
            if (step == 3) CHECK(wide[8] > double(0x7F800000u));  // NaN stays above inf and every finite amax
            ops.fp8_update_scales(d, widened, word.data());
            CHECK(word[0] == float(bad));
            bool inv_ok = true;  // 1/scale beside every scale, for the delayed casts' GEMMs
            for (int i = 0; i < n; ++i) inv_ok = inv_ok && inv[size_t(i) * kFp8InvStride] == 1.0f / scale[i];
            CHECK(inv_ok);
            // every cast of the model reads the backend's scale where it is given one
            const Fp8Cast c = host.cast(1, Fp8Linear::Fc, Fp8Operand::Weight, nullptr, scale.data(), inv.data());
            CHECK(c.scale_at == scale.data() + Fp8State::index(1, Fp8Linear::Fc, Fp8Operand::Weight));
            // (the current recipe computes its own scale: no inverse to take)
            CHECK(c.inv_at == (c.current ? nullptr : inv.data() + kFp8InvStride * Fp8State::index(1, Fp8Linear::Fc,
                                                                                                   Fp8Operand::Weight)));
            CHECK(*c.scale_at == host.scale(1, Fp8Linear::Fc, Fp8Operand::Weight).scale());
        }
        CHECK(host.overflow_events() == 3);
        CHECK(overflows[7] == 1);
        CHECK(overflows[8] == 1);
        CHECK(overflows[19] == 1);
        Fp8State imported = start;
        imported.import_image(scale.data(), hist.data(), overflows.data());
        CHECK(imported.save() == host.save());
        // and back: the host state's image is the backend's
        std::vector<float> scale2(n), hist2(hist.size());
        host.export_image(scale2.data(), hist2.data());
        CHECK(std::memcmp(scale2.data(), scale.data(), scale.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(hist2.data(), hist.data(), hist.size() * sizeof(float)) == 0);
    }

    // a checkpoint holding each history as a ring whose oldest entry sits at `next`
    Fp8Config cfg;
    cfg.amax_history = 4;
    const Fp8Options opt = fp8_options(cfg);
    Fp8State st(1, opt);
    std::vector<float> a(st.size());
    for (int step = 0; step < 6; ++step) {
        for (int i = 0; i < st.size(); ++i) a[i] = float(1 + step * 13 + i);
        st.update(a.data());
    }
    const std::vector<uint8_t> bytes = st.save();
    const size_t head = 26, per = 20 + 4 * 4;  // Fp8State::save's header; a tensor's u32 n, f32, u32 next, u64, ring
    REQUIRE(bytes.size() == head + per * size_t(st.size()));
    for (uint32_t next = 1; next < 4; ++next) {
        std::vector<uint8_t> ring = bytes;
        for (int i = 0; i < st.size(); ++i) {
            uint8_t* t = ring.data() + head + per * size_t(i);
            uint32_t old_next;
            std::memcpy(&old_next, t + 8, 4);
            REQUIRE(old_next == 0);
            std::memcpy(t + 8, &next, 4);
            const std::vector<float>& h = st.scale(0, Fp8Linear(i / 3 % 4), Fp8Operand(i % 3)).history();
            for (uint32_t k = 0; k < 4; ++k) std::memcpy(t + 20 + 4 * ((next + k) % 4), &h[k], 4);
        }
        REQUIRE(ring != bytes);
        Fp8State back(1, opt);
        back.load(ring, "old.bin");
        CHECK(back.save() == bytes);
    }
    std::vector<uint8_t> bad = bytes;
    const float zero = 0.0f;
    std::memcpy(bad.data() + head + 4, &zero, 4);  // tensor 0's scale
    CHECK_THROWS_WITH(Fp8State(1, opt).load(bad, "x/state.bin"), Catch::Contains("x/state.bin") && Catch::Contains("corrupt"));
}

// ---------------------------------------------------------------- CPU ops

TEST_CASE("fp8: a tensor with one outlier sets the scale; small values flush toward zero", "[fp8]") {
    // out = q(inp) @ I: the op's cast of inp made visible (the identity is exact in E4M3 at scale 1)
    CpuOps ops;
    const int C = 16;
    std::vector<float> inp = {1000.0f, 0.5f, -0.25f, 0.01f, 0.003f, 0.002f, -0.001f, 1e-4f,
                              3.0f,    -7.5f, 100.0f, 0.0f,  -0.0021f, 0.0022f, 20.0f, -1000.0f};
    std::vector<float> eye((size_t)C * C, 0.0f), out(C);
    for (int i = 0; i < C; ++i) eye[(size_t)i * C + i] = 1.0f;
    float amax_i = 0, amax_w = 0;
    const Fp8Cast ci = make_cast(Fp8Format::E4M3, 1.0f, true, 0, &amax_i);
    const Fp8Cast cw = make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax_w);
    ops.matmul_forward_fp8(T(out), Tensor(), T(inp), T(eye), Tensor(), 1, C, C, false, ci, cw);
    CHECK(amax_i == 1000.0f);
    CHECK(amax_w == 1.0f);
    const float s = 0.448f;  // 448 / 1000
    const TableQuantizer tq(Fp8Format::E4M3);
    for (int i = 0; i < C; ++i) {
        INFO("element " << i << " = " << inp[i]);
        CHECK(out[i] == tq.q(inp[i], s));
        // below half the smallest subnormal (2^-10 / s = 0.00218) a value becomes zero
        if (std::fabs(inp[i]) < 0.00218f) CHECK(out[i] == 0.0f);
        if (std::fabs(inp[i]) > 0.00219f) CHECK(out[i] != 0.0f);
    }
    CHECK(std::fabs(out[0] - 1000.0f) < 1e-3f);  // the outlier itself is exact up to 1/s rounding
    CHECK(out[15] == -out[0]);
}

namespace {

struct Case {
    int N, IC, OC;
    bool bias, gelu, with_dinp;
};

// The fp8 ops against the fp32 ops on independently quantized inputs, bit for bit.
void check_fp8_matmul(const Case& k, bool current, bool hybrid, int margin) {
    CpuOps ops;
    const int N = k.N, IC = k.IC, OC = k.OC;
    const size_t NI = (size_t)N * IC, NW = (size_t)OC * IC, NO = (size_t)N * OC;
    std::vector<float> inp = randn(NI, 1, 1.0f), w = randn(NW, 2, 1.0f / std::sqrt((float)IC));
    std::vector<float> bias = randn(OC, 3, 0.5f), pre = randn(NO, 4, 1.5f), dout0 = randn(NO, 5, 1e-3f);
    std::vector<float> dw0 = randn(NW, 6, 1.0f), db0 = randn(OC, 7, 1.0f);
    inp[3] = 9.0f;  // saturates at the delayed scale below (9 * 60 > 448)
    const Fp8Format gf = hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3;
    // delayed: fixed scales; current: fallbacks that must not be used
    const float si = current ? 5.0f : 60.0f, sw = current ? 5.0f : 900.0f, sd = current ? 5.0f : 2e6f;
    const TableQuantizer q4(Fp8Format::E4M3), qg(gf);
    auto expect_scale = [&](const std::vector<float>& x, Fp8Format f, float s) {
        return current ? std::ldexp(fp8_max(f) / amax_of(x), -margin) : s;
    };

    // ---- forward
    float am[3] = {0, 0, 0};
    const Fp8Cast ci = make_cast(Fp8Format::E4M3, si, current, margin, &am[0]);
    const Fp8Cast cw = make_cast(Fp8Format::E4M3, sw, current, margin, &am[1]);
    Tensor bt = k.bias ? T(bias) : Tensor();
    std::vector<float> out(NO, NAN), pre_out(NO, NAN), ref(NO, NAN), pre_ref(NO, NAN);
    ops.matmul_forward_fp8(T(out), k.gelu ? T(pre_out) : Tensor(), T(inp), T(w), bt, N, IC, OC, k.gelu, ci, cw);
    std::vector<float> qi = q4.q(inp, expect_scale(inp, Fp8Format::E4M3, si));
    std::vector<float> qw = q4.q(w, expect_scale(w, Fp8Format::E4M3, sw));
    ops.matmul_forward(T(ref), k.gelu ? T(pre_ref) : Tensor(), T(qi), T(qw), bt, N, IC, OC, k.gelu);
    CHECK(same_bits(out, ref));
    if (k.gelu) CHECK(same_bits(pre_out, pre_ref));
    CHECK(am[0] == amax_of(inp));
    CHECK(am[1] == amax_of(w));
    // the fp8 cast really happened (a quantized operand changes the result)
    std::vector<float> plain(NO);
    ops.matmul_forward(T(plain), k.gelu ? T(pre_ref) : Tensor(), T(inp), T(w), bt, N, IC, OC, k.gelu);
    CHECK_FALSE(same_bits(out, plain));

    // ---- backward
    std::vector<float> dout = dout0, dw = dw0, db = db0, dinp(NI, NAN);
    const Fp8Cast cd = make_cast(gf, sd, current, margin, &am[2]);
    Tensor pt = k.gelu ? T(pre) : Tensor(), dbt = k.bias ? T(db) : Tensor(), dit = k.with_dinp ? T(dinp) : Tensor();
    ops.matmul_backward_fp8(dit, T(dw), dbt, T(dout), T(inp), T(w), pt, N, IC, OC, cd, ci, cw);
    // reference: the fp32 op gives the GELU'd dout and dbias; then the fp32 op on quantized copies
    std::vector<float> rdout = dout0, rdb = db0, tmp_dinp(NI), tmp_dw(NW, 0.0f);
    ops.matmul_backward(T(tmp_dinp), T(tmp_dw), k.bias ? T(rdb) : Tensor(), T(rdout), T(inp), T(w), pt, N, IC, OC);
    CHECK(same_bits(dout, rdout));
    if (k.bias) CHECK(same_bits(db, rdb));
    CHECK(am[2] == amax_of(rdout));  // the amax of the GELU'd, unquantized dout
    std::vector<float> qd = qg.q(rdout, expect_scale(rdout, gf, sd));
    std::vector<float> rdw = dw0, rdinp(NI, NAN);
    ops.matmul_backward(k.with_dinp ? T(rdinp) : Tensor(), T(rdw), Tensor(), T(qd), T(qi), T(qw), Tensor(), N, IC,
                        OC);
    CHECK(same_bits(dw, rdw));
    if (k.with_dinp) {
        CHECK(same_bits(dinp, rdinp));
        // the output gradient went through the format asked for, not the other one
        const TableQuantizer qother(hybrid ? Fp8Format::E4M3 : Fp8Format::E5M2);
        const Fp8Format of = hybrid ? Fp8Format::E4M3 : Fp8Format::E5M2;
        std::vector<float> qd_other = qother.q(rdout, expect_scale(rdout, of, sd));
        std::vector<float> odinp(NI);
        std::vector<float> odw = dw0;
        ops.matmul_backward(T(odinp), T(odw), Tensor(), T(qd_other), T(qi), T(qw), Tensor(), N, IC, OC);
        CHECK_FALSE(same_bits(dinp, odinp));
    }
}

}  // namespace

TEST_CASE("fp8: CPU matmuls equal fp32 matmuls of independently quantized operands", "[fp8]") {
    const Case cases[] = {
        {37, 40, 56, true, false, true},
        {16, 64, 48, true, true, true},
        {9, 24, 40, false, true, false},
        {130, 96, 200, true, false, true},
    };
    for (bool current : {false, true})
        for (bool hybrid : {true, false})
            for (const Case& k : cases) {
                const int margin = current ? 1 : 0;
                INFO("N=" << k.N << " IC=" << k.IC << " OC=" << k.OC << " bias=" << k.bias << " gelu=" << k.gelu
                          << " dinp=" << k.with_dinp << " current=" << current << " hybrid=" << hybrid);
                check_fp8_matmul(k, current, hybrid, margin);
            }
}

TEST_CASE("fp8: amaxes max-accumulate across calls and flag non-finite tensors", "[fp8]") {
    CpuOps ops;
    const int N = 4, C = 8;
    std::vector<float> a = randn(N * C, 11, 1.0f), w = randn(C * C, 12, 0.3f), out(N * C);
    float amax = 0, amax_w = 0;
    const Fp8Cast cw = make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax_w);
    ops.matmul_forward_fp8(T(out), Tensor(), T(a), T(w), Tensor(), N, C, C, false,
                           make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax), cw);
    const float first = amax_of(a);
    CHECK(amax == first);
    for (auto& x : a) x *= 0.5f;  // a smaller second micro-step keeps the max
    ops.matmul_forward_fp8(T(out), Tensor(), T(a), T(w), Tensor(), N, C, C, false,
                           make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax), cw);
    CHECK(amax == first);
    a[5] = -INFINITY;
    ops.matmul_forward_fp8(T(out), Tensor(), T(a), T(w), Tensor(), N, C, C, false,
                           make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax), cw);
    CHECK(amax == INFINITY);
    a[6] = NAN;  // NaN ranks above inf
    ops.matmul_forward_fp8(T(out), Tensor(), T(a), T(w), Tensor(), N, C, C, false,
                           make_cast(Fp8Format::E4M3, 1.0f, false, 0, &amax), cw);
    CHECK(std::isnan(amax));
    Fp8TensorScale s(Fp8Format::E4M3, Fp8Recipe::Delayed, 4, 0);
    CHECK_FALSE(s.update(amax));
    CHECK(s.overflow_events() == 1);
}

TEST_CASE("fp8: CPU fp8 matmuls do not depend on the number of threads", "[fp8]") {
    CpuOps ops;
    const int N = 200, IC = 128, OC = 160;  // large enough for the parallel paths
    std::vector<float> inp = randn((size_t)N * IC, 21, 1.0f), w = randn((size_t)OC * IC, 22, 0.1f);
    std::vector<float> dout0 = randn((size_t)N * OC, 23, 1.0f);
    std::vector<float> res[2];
    const int saved = omp_get_max_threads();
    for (int r = 0; r < 2; ++r) {
        omp_set_num_threads(r == 0 ? 1 : 4);
        float am[3] = {0, 0, 0};
        const Fp8Cast ci = make_cast(Fp8Format::E4M3, 1.0f, true, 0, &am[0]);
        const Fp8Cast cw = make_cast(Fp8Format::E4M3, 1.0f, true, 0, &am[1]);
        const Fp8Cast cd = make_cast(Fp8Format::E5M2, 1.0f, true, 0, &am[2]);
        std::vector<float> out((size_t)N * OC), dinp((size_t)N * IC), dw((size_t)OC * IC, 0.0f), dout = dout0;
        ops.matmul_forward_fp8(T(out), Tensor(), T(inp), T(w), Tensor(), N, IC, OC, false, ci, cw);
        ops.matmul_backward_fp8(T(dinp), T(dw), Tensor(), T(dout), T(inp), T(w), Tensor(), N, IC, OC, cd, ci, cw);
        res[r] = out;
        res[r].insert(res[r].end(), dinp.begin(), dinp.end());
        res[r].insert(res[r].end(), dw.begin(), dw.end());
        res[r].insert(res[r].end(), am, am + 3);
    }
    omp_set_num_threads(saved);
    CHECK(same_bits(res[0], res[1]));
}

TEST_CASE("fp8: the cuBLASLt rule table allows the documented combinations and refuses the rest", "[fp8]") {
    // the H200 report's weight-gradient call: TN, E4M3 x E4M3, fp32 C = D in place, k=64 m=48 n=32
    LtFp8Call ok;
    ok.sm = 90;
    ok.a = ok.b = LtType::E4M3;
    ok.c = ok.d = LtType::F32;
    ok.m = 48, ok.n = 32, ok.k = 64;
    ok.lda = ok.ldb = 64, ok.ldc = ok.ldd = 48;
    ok.ptr_a = 0x10000, ok.ptr_b = 0x20000, ok.ptr_c = ok.ptr_d = 0x30000;
    std::string why;
    REQUIRE(fp8_gemm_supported(ok, &why));
    auto refused = [&](LtFp8Call c, const char* part) {
        std::string w;
        const bool allowed = fp8_gemm_supported(c, &w);
        INFO(part << ": " << w);
        CHECK(!allowed);
        CHECK(w.find(part) != std::string::npos);
    };
    LtFp8Call c = ok;
    c.sm = 80;
    refused(c, "8.9");
    c = ok, c.trans_a = false;  // NN, NT, TT: not on Hopper
    refused(c, "TN");
    c = ok, c.trans_b = true;
    refused(c, "TN");
    c = ok, c.sm = 100, c.trans_a = false, c.lda = 48;  // Blackwell takes other layouts
    CHECK(fp8_gemm_supported(c, nullptr));
    c = ok, c.compute_32f = false;
    refused(c, "compute type");
    c = ok, c.a = c.b = LtType::E5M2;
    refused(c, "both be E5M2");
    c = ok, c.a = LtType::BF16;
    refused(c, "E4M3 or E5M2");
    c = ok, c.d = LtType::BF16, c.ptr_d = 0x40000;  // 32F C takes only a 32F D
    refused(c, "combination");
    c = ok, c.c = LtType::BF16, c.d = LtType::E5M2, c.ptr_d = 0x40000;  // E5M2 D needs an E5M2 input
    refused(c, "combination");
    c.b = LtType::E5M2;
    CHECK(fp8_gemm_supported(c, nullptr));
    c = ok, c.c = c.d = LtType::BF16, c.has_bias = true, c.bias = LtType::F32;
    refused(c, "bias");
    c.bias = LtType::BF16;
    CHECK(fp8_gemm_supported(c, nullptr));
    c = ok, c.ptr_d = c.ptr_c = 0x30004;
    refused(c, "16-byte aligned");
    c = ok, c.ptr_a_scale = 0x50000, c.ptr_b_scale = 0x50010;  // scales 16-byte aligned: allowed
    CHECK(fp8_gemm_supported(c, nullptr));
    c.ptr_b_scale = 0x50004;  // the layout that an H200 refused (rule 11, assumed)
    refused(c, "scale pointers");
    c = ok, c.ldd = c.ldc = 50;  // 200 bytes
    refused(c, "16 bytes");
    c = ok, c.k = c.lda = c.ldb = 40;
    refused(c, "multiples of 16");
    c = ok, c.ldd = 32, c.ldc = 32;
    refused(c, "smaller");
    c = ok, c.ldc = 64;  // in place with C's layout other than D's
    refused(c, "in place");
    c = ok, c.amax_d = true;
    refused(c, "AMAX");
    c = ok, c.c = LtType::BF16, c.d = LtType::E4M3, c.ptr_d = 0x40000, c.amax_d = true;
    CHECK(fp8_gemm_supported(c, nullptr));
}
