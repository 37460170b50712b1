// Proof of the CPU backend's attention (multi-head and grouped-query) and Llama ops
// (llmc/cpu/kernels.h): rotary embeddings, RMSNorm, SwiGLU. As in test_cpu_ops.cpp: backward
// against central finite differences on the double instantiation, forward against formulas
// written here independently, and CpuOps (float) against double. The shapes are the op-case
// table's (test/op_cases.h): its Fd cases here in double, its Cpu cases in float.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"
#include "test/cpu_test_util.h"
#include "test/op_cases.h"

namespace {

using namespace cpu_test;

template <class F>
double rel_err(const std::vector<F>& f, const Vec& d) {
    return cpu_test::rel_err(f.data(), d.data(), d.size());
}
constexpr double kFloatTol = 1e-5;

}  // namespace

TEST_CASE("cpu fd: attention (multi-head and grouped-query)", "[cpu][fd][llama]") {
    for (const op_cases::Case& c : op_cases::of("attention", op_cases::Fd)) {
        const int B = c.dims[0], T = c.dims[1], NH = c.dims[2], NKV = c.dims[3], HS = c.dims[4];
        const int W = (NH + 2 * NKV) * HS, C = NH * HS, G = NH / NKV;
        INFO("B T NH NKV HS " << B << " " << T << " " << NH << " " << NKV << " " << HS);
        Vec qkv = randn((size_t)B * T * W, 50 + NKV), D = randn((size_t)B * T * C, 60);
        Vec out((size_t)B * T * C), lse((size_t)B * NH * T);
        auto loss = [&] {
            cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, HS);
            return dot_all(out, D);
        };
        loss();
        // forward against a direct softmax: query head h at h*HS, its key head g = h/G at
        // C + g*HS, its value head at C + NKV*HS + g*HS
        double worst = 0;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < NH; ++h)
                for (int t = 0; t < T; ++t) {
                    const int g = h / G;
                    std::vector<double> p(t + 1);
                    double se = 0;
                    for (int j = 0; j <= t; ++j) {
                        double s = 0;
                        for (int e = 0; e < HS; ++e)
                            s += qkv[((size_t)b * T + t) * W + h * HS + e] *
                                 qkv[((size_t)b * T + j) * W + C + g * HS + e];
                        p[j] = std::exp(s / std::sqrt((double)HS));
                        se += p[j];
                    }
                    for (int e = 0; e < HS; ++e) {
                        double o = 0;
                        for (int j = 0; j <= t; ++j)
                            o += p[j] / se * qkv[((size_t)b * T + j) * W + C + (NKV + g) * HS + e];
                        worst = std::max(worst, std::fabs(out[((size_t)b * T + t) * C + h * HS + e] - o));
                    }
                }
        CHECK(worst < 1e-12);
        Vec dqkv = randn(qkv.size(), 61);  // overwritten
        cpu::attention_backward(dqkv.data(), D.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, HS);
        check_fd("attention dqkv", qkv, dqkv, loss);
    }
}

TEST_CASE("cpu fd: rotary embeddings", "[cpu][fd][llama]") {
    for (const op_cases::Case& c : op_cases::of("rope", op_cases::Fd)) {
        const int B = c.dims[0], T = c.dims[1], NH = c.dims[2], NKV = c.dims[3], HS = c.dims[4];
        const int W = (NH + 2 * NKV) * HS, half = HS / 2;
        const double theta = c.x;
        const Vec x0 = randn((size_t)B * T * W, 70), D = randn(x0.size(), 71);
        Vec x = x0;
        cpu::rope(x.data(), B, T, NH, NKV, HS, theta, false);
        // direct: q and k heads rotated pairwise (i, i + HS/2) by t * theta^(-2i/HS); v untouched
        double worst = 0;
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t)
                for (int h = 0; h < NH + 2 * NKV; ++h)
                    for (int i = 0; i < half; ++i) {
                        const size_t o = ((size_t)b * T + t) * W + h * HS;
                        double y1 = x0[o + i], y2 = x0[o + i + half];
                        if (h < NH + NKV) {
                            const double a = t * std::pow(theta, -2.0 * i / HS);
                            y1 = x0[o + i] * std::cos(a) - x0[o + i + half] * std::sin(a);
                            y2 = x0[o + i + half] * std::cos(a) + x0[o + i] * std::sin(a);
                        }
                        worst = std::max({worst, std::fabs(x[o + i] - y1), std::fabs(x[o + i + half] - y2)});
                    }
        CHECK(worst < 1e-12);
        // backward: the gradient of sum(D * rope(x)) is rope_backward(D)
        Vec g = D;
        cpu::rope(g.data(), B, T, NH, NKV, HS, theta, true);
        Vec xv = x0, y(x0.size());
        auto loss = [&] {
            y = xv;
            cpu::rope(y.data(), B, T, NH, NKV, HS, theta, false);
            return dot_all(y, D);
        };
        check_fd("rope backward", xv, g, loss);
    }
}

TEST_CASE("cpu fd: rmsnorm", "[cpu][fd][llama]") {
    for (const op_cases::Case& cs : op_cases::of("rmsnorm", op_cases::Fd)) {
        const int N = cs.dims[0], C = cs.dims[1];
        const double eps = cs.x;
        Vec inp = randn((size_t)N * C, 80, 1.5), w = randn(C, 81), D = randn((size_t)N * C, 82);
        Vec out((size_t)N * C), rstd(N);
        auto loss = [&] {
            cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
            return dot_all(out, D);
        };
        loss();
        for (int n = 0; n < N; ++n) {
            double ms = 0;
            for (int c = 0; c < C; ++c) ms += inp[(size_t)n * C + c] * inp[(size_t)n * C + c];
            const double s = 1.0 / std::sqrt(ms / C + eps);
            CHECK(std::fabs(rstd[n] - s) < 1e-12 * s);
            for (int c = 0; c < C; ++c)
                CHECK(std::fabs(out[(size_t)n * C + c] - inp[(size_t)n * C + c] * s * w[c]) < 1e-12);
        }
        const Vec R0 = randn(inp.size(), 83), R1 = randn(C, 84);  // backward accumulates
        Vec dinp = R0, dw = R1;
        cpu::rmsnorm_backward(dinp.data(), dw.data(), D.data(), inp.data(), w.data(), rstd.data(), N, C);
        check_fd("rmsnorm dinp", inp, sub(dinp, R0), loss);
        check_fd("rmsnorm dw", w, sub(dw, R1), loss);
    }
}

TEST_CASE("cpu fd: swiglu", "[cpu][fd][llama]") {
    for (const op_cases::Case& c : op_cases::of("swiglu", op_cases::Fd)) {
        const int N = c.dims[0], F = c.dims[1];
        Vec inp = randn((size_t)N * 2 * F, 90, 3.0), D = randn((size_t)N * F, 91);  // wide: both sigmoid branches
        Vec out((size_t)N * F);
        auto loss = [&] {
            cpu::swiglu_forward(out.data(), inp.data(), N, F);
            return dot_all(out, D);
        };
        loss();
        for (int n = 0; n < N; ++n)
            for (int f = 0; f < F; ++f) {
                const double g = inp[(size_t)n * 2 * F + f], u = inp[(size_t)n * 2 * F + F + f];
                CHECK(std::fabs(out[(size_t)n * F + f] - g / (1 + std::exp(-g)) * u) < 1e-12);
            }
        Vec dinp = randn(inp.size(), 92);  // overwritten
        cpu::swiglu_backward(dinp.data(), D.data(), inp.data(), N, F);
        check_fd("swiglu dinp", inp, dinp, loss);
    }
}

TEST_CASE("cpu float: attention and Llama ops match double", "[cpu][float][llama]") {
    auto ops = make_cpu_ops();
    for (const op_cases::Case& c : op_cases::of("attention", op_cases::Cpu)) {
        const int B = c.dims[0], T = c.dims[1], NH = c.dims[2], NKV = c.dims[3], HS = c.dims[4];
        const int W = (NH + 2 * NKV) * HS, C = NH * HS, N = B * T;
        INFO("attention B T NH NKV HS " << B << " " << T << " " << NH << " " << NKV << " " << HS);
        Vec qkv = randn((size_t)N * W, 100), D = randn((size_t)N * C, 101);
        Vec out((size_t)N * C), lse((size_t)B * NH * T), dqkv(qkv.size());
        FVec fqkv = to_f(qkv), fD = to_f(D), fout(out.size()), flse(lse.size()), fdqkv(qkv.size(), 7.0f);
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NKV, HS);
        cpu::attention_backward(dqkv.data(), D.data(), qkv.data(), out.data(), lse.data(), B, T, NH, NKV, HS);
        ops->attention_forward(T32(fout), flse.data(), T32(fqkv), B, T, NH, NKV, HS);
        ops->attention_backward(T32(fdqkv), T32(fD), T32(fqkv), T32(fout), flse.data(), B, T, NH, NKV, HS);
        CHECK(rel_err(fout, out) < kFloatTol);
        CHECK(rel_err(flse, lse) < kFloatTol);
        CHECK(rel_err(fdqkv, dqkv) < kFloatTol);
    }
    for (const op_cases::Case& c : op_cases::of("rope", op_cases::Cpu)) {
        const int B = c.dims[0], T = c.dims[1], NH = c.dims[2], NKV = c.dims[3], HS = c.dims[4];
        const float theta = c.x;
        INFO("rope B T NH NKV HS " << B << " " << T << " " << NH << " " << NKV << " " << HS);
        Vec x = randn((size_t)B * T * (NH + 2 * NKV) * HS, 105), g = randn(x.size(), 106);
        FVec fx = to_f(x), fg = to_f(g);
        cpu::rope(x.data(), B, T, NH, NKV, HS, (double)theta, false);
        cpu::rope(g.data(), B, T, NH, NKV, HS, (double)theta, true);
        ops->rope_forward(T32(fx), B, T, NH, NKV, HS, theta, SeqPositions());
        ops->rope_backward(T32(fg), B, T, NH, NKV, HS, theta, SeqPositions());
        CHECK(rel_err(fx, x) < kFloatTol);
        CHECK(rel_err(fg, g) < kFloatTol);
    }
    for (const op_cases::Case& c : op_cases::of("rmsnorm", op_cases::Cpu)) {
        const int N = c.dims[0], C = c.dims[1];
        INFO("rmsnorm N C " << N << " " << C);
        Vec inp = randn((size_t)N * C, 110), w = randn(C, 111), D = randn((size_t)N * C, 112);
        Vec out(inp.size()), rstd(N), dinp(inp.size(), 0.0), dw(C, 0.0);
        cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, (double)c.x);
        cpu::rmsnorm_backward(dinp.data(), dw.data(), D.data(), inp.data(), w.data(), rstd.data(), N, C);
        FVec fi = to_f(inp), fw = to_f(w), fD = to_f(D), fo(out.size()), fr(N), fdi(inp.size(), 0.0f), fdw(C, 0.0f);
        ops->rmsnorm_forward(T32(fo), fr.data(), T32(fi), T32(fw), N, C, c.x);
        ops->rmsnorm_backward(T32(fdi), T32(fdw), T32(fD), T32(fi), T32(fw), fr.data(), N, C);
        CHECK(rel_err(fo, out) < kFloatTol);
        CHECK(rel_err(fr, rstd) < kFloatTol);
        CHECK(rel_err(fdi, dinp) < kFloatTol);
        CHECK(rel_err(fdw, dw) < kFloatTol);
    }
    for (const op_cases::Case& c : op_cases::of("swiglu", op_cases::Cpu)) {
        const int N = c.dims[0], F = c.dims[1];
        INFO("swiglu N F " << N << " " << F);
        Vec inp = randn((size_t)N * 2 * F, 120, 4.0), D = randn((size_t)N * F, 121);
        Vec out((size_t)N * F), dinp(inp.size());
        cpu::swiglu_forward(out.data(), inp.data(), N, F);
        cpu::swiglu_backward(dinp.data(), D.data(), inp.data(), N, F);
        FVec fi = to_f(inp), fD = to_f(D), fo(out.size()), fdi(inp.size());
        ops->swiglu_forward(T32(fo), T32(fi), N, F);
        ops->swiglu_backward(T32(fdi), T32(fD), T32(fi), N, F);
        CHECK(rel_err(fo, out) < kFloatTol);
        CHECK(rel_err(fdi, dinp) < kFloatTol);
    }
}
