// Proof of the CPU reference backend (llmc/cpu/).
//  1. Every op with a backward agrees with central finite differences, in double precision,
//     on the double instantiation of the very templates CpuOps uses (llmc/cpu/kernels.h).
//  2. CpuOps (float, the trainer's path) agrees with the double instantiation (and, for the
//     matmul, with a naive double triple loop) at shapes that exercise every blocking path.
//  3. AdamW against a hand-written scalar formula, sum_squares against a direct sum, and
//     bitwise determinism across runs and OpenMP thread counts.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"
#include "test/cpu_test_util.h"

namespace {

using namespace cpu_test;

std::vector<int32_t> rand_tokens(size_t n, int V, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> ud(0, V - 1);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = ud(rng);
    return t;
}

// Result of comparing an analytic gradient with a numeric one.
struct GradErr {
    double worst = 0;  // max over elements of |a - n| / max(|n|, floor)
    double scale = 0;  // max |n|
    size_t worst_i = 0;
};

// Element-wise relative error, with a floor of 1e-3 * max|n| so that elements that are
// (numerically) zero are judged on an absolute scale.
GradErr compare_grad(const Vec& analytic, const Vec& numeric) {
    GradErr e;
    for (double x : numeric) e.scale = std::max(e.scale, std::fabs(x));
    const double floor = std::max(1e-3 * e.scale, 1e-12);
    for (size_t i = 0; i < numeric.size(); ++i) {
        const double r = std::fabs(analytic[i] - numeric[i]) / std::max(std::fabs(numeric[i]), floor);
        if (r > e.worst) {
            e.worst = r;
            e.worst_i = i;
        }
    }
    return e;
}

constexpr double kGradTol = 1e-6;

// REQUIRE that the analytic gradient matches finite differences of loss() w.r.t. x.
void check_grad(const char* what, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
    REQUIRE(analytic.size() == x.size());
    const Vec num = numeric_grad(x, loss);
    const GradErr e = compare_grad(analytic, num);
    INFO(what << ": worst rel err " << e.worst << " at " << e.worst_i << " (analytic " << analytic[e.worst_i]
              << ", numeric " << num[e.worst_i] << "), max|grad| " << e.scale);
    CHECK(e.scale > 1e-3);  // the gradient is not trivially zero
    CHECK(e.worst < kGradTol);
}

template <class F>
double rel_err(const std::vector<F>& f, const Vec& d) {
    REQUIRE(f.size() == d.size());
    return cpu_test::rel_err(f.data(), d.data(), d.size());
}

// Runs fn with the given number of OpenMP threads, then restores the previous setting.
template <class Fn>
void with_threads(int n, Fn fn) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(n);
    fn();
    omp_set_num_threads(prev);
}

bool bitwise_equal(const FVec& a, const FVec& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- naive double references (independent of kernels.h) ----
void naive_matmul(Vec& out, const Vec& inp, const Vec& w, const Vec* bias, int N, int IC, int OC) {
    out.assign((size_t)N * OC, 0.0);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double s = bias ? (*bias)[o] : 0.0;
            for (int i = 0; i < IC; ++i) s += inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

}  // namespace

// =======================================================================================
// Finite-difference gradient checks (double)
// =======================================================================================

TEST_CASE("cpu fd: encoder backward", "[cpu][fd]") {
    const int B = 2, T = 5, C = 6, V = 7;
    auto tokens = rand_tokens(B * T, V, 1);
    tokens[3] = tokens[0];  // a repeated token must accumulate
    tokens[7] = tokens[0];
    Vec wte = randn((size_t)V * C, 2), wpe = randn((size_t)T * C, 3), G = randn((size_t)B * T * C, 4);
    Vec out((size_t)B * T * C);
    auto loss = [&] {
        cpu::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
        return dot_all(out, G);
    };
    // accumulate semantics: start from random gradients and check the increment
    const Vec R1 = randn(wte.size(), 5), R2 = randn(wpe.size(), 6);
    Vec dwte = R1, dwpe = R2;
    cpu::encoder_backward(dwte.data(), dwpe.data(), G.data(), tokens.data(), B, T, C, 0, V);
    check_grad("dwte", wte, sub(dwte, R1), loss);
    check_grad("dwpe", wpe, sub(dwpe, R2), loss);
}

TEST_CASE("cpu fd: layernorm backward", "[cpu][fd]") {
    const int N = 10, C = 13;  // C > 8 exercises the lane loop and the tail
    Vec inp = randn((size_t)N * C, 10, 2.0), w = randn(C, 11), b = randn(C, 12), G = randn((size_t)N * C, 13);
    for (size_t i = 0; i < inp.size(); ++i) inp[i] += 0.5 * (double)(i % 3);  // non-zero means
    Vec out((size_t)N * C), mean(N), rstd(N);
    auto loss = [&] {
        cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
        return dot_all(out, G);
    };
    loss();
    const Vec R0 = randn(inp.size(), 14), R1 = randn(C, 15), R2 = randn(C, 16);
    Vec dinp = R0, dw = R1, db = R2;
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), G.data(), inp.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    check_grad("ln dinp", inp, sub(dinp, R0), loss);
    check_grad("ln dw", w, sub(dw, R1), loss);
    check_grad("ln db", b, sub(db, R2), loss);

    // statistics are the true mean and 1/sqrt(var + 1e-5)
    loss();
    for (int n = 0; n < N; ++n) {
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += inp[(size_t)n * C + c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (inp[(size_t)n * C + c] - m) * (inp[(size_t)n * C + c] - m);
        v /= C;
        CHECK(std::fabs(mean[n] - m) < 1e-12);
        CHECK(std::fabs(rstd[n] - 1.0 / std::sqrt(v + 1e-5)) < 1e-10 * rstd[n]);
    }
}

TEST_CASE("cpu fd: fused residual + layernorm", "[cpu][fd]") {
    const int N = 10, C = 13;
    Vec a = randn((size_t)N * C, 20), bb = randn((size_t)N * C, 21), w = randn(C, 22), bias = randn(C, 23);
    Vec G1 = randn((size_t)N * C, 24), G2 = randn((size_t)N * C, 25);
    Vec res((size_t)N * C), out((size_t)N * C), mean(N), rstd(N);
    // loss uses both outputs: the residual stream and the normalised output
    auto loss = [&] {
        cpu::fused_residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), bb.data(),
                                              w.data(), bias.data(), N, C);
        return dot_all(out, G1) + dot_all(res, G2);
    };
    loss();
    Vec dres = G2, dw(C, 0.0), db(C, 0.0);  // the residual's own gradient, then LN accumulates
    cpu::layernorm_backward(dres.data(), dw.data(), db.data(), G1.data(), res.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    check_grad("fused d(a)", a, dres, loss);
    check_grad("fused d(b)", bb, dres, loss);
    check_grad("fused dw", w, dw, loss);
    check_grad("fused db", bias, db, loss);
}

namespace {
void matmul_fd(bool with_bias, bool gelu) {
    const int N = 10, IC = 13, OC = 37;  // full register tiles and edges in both directions
    Vec inp = randn((size_t)N * IC, 30), w = randn((size_t)OC * IC, 31, 0.3), bias = randn(OC, 32);
    Vec G = randn((size_t)N * OC, 33);
    Vec out((size_t)N * OC), pre((size_t)N * OC);
    auto loss = [&] {
        cpu::matmul_forward(out.data(), gelu ? pre.data() : nullptr, inp.data(), w.data(),
                            with_bias ? bias.data() : nullptr, N, IC, OC, gelu);
        return dot_all(out, G);
    };
    loss();
    const Vec R1 = randn(w.size(), 34), R2 = randn(OC, 35);
    Vec dinp = randn(inp.size(), 36);  // overwritten
    Vec dw = R1, dbias = R2, dout = G;
    cpu::matmul_backward(dinp.data(), dw.data(), with_bias ? dbias.data() : nullptr, dout.data(), inp.data(),
                         w.data(), gelu ? pre.data() : nullptr, N, IC, OC);
    // (before the finite differences, which leave pre_gelu at a perturbed point)
    // dinp empty: dw identical
    Vec dw2 = R1, dout2 = G;
    cpu::matmul_backward<double>(nullptr, dw2.data(), nullptr, dout2.data(), inp.data(), w.data(),
                                 gelu ? pre.data() : nullptr, N, IC, OC);
    CHECK(dw2 == dw);
    // with gelu, dout is replaced by the pre-activation gradient
    if (gelu)
        for (size_t i = 0; i < G.size(); ++i) REQUIRE(dout[i] == G[i] * cpu::gelu_grad(pre[i]));

    check_grad("matmul dinp", inp, dinp, loss);
    check_grad("matmul dw", w, sub(dw, R1), loss);
    if (with_bias) check_grad("matmul dbias", bias, sub(dbias, R2), loss);
    else CHECK(dbias == R2);
}
}  // namespace

TEST_CASE("cpu fd: matmul backward", "[cpu][fd]") {
    SECTION("no bias, no gelu") { matmul_fd(false, false); }
    SECTION("bias, no gelu") { matmul_fd(true, false); }
    SECTION("no bias, gelu") { matmul_fd(false, true); }
    SECTION("bias, gelu") { matmul_fd(true, true); }
}

// attention (multi-head and grouped-query): test/test_llama_ops.cpp, from the op-case table

// losses[n] against the direct formula logsumexp(logits[n, :V]) - logits[n, target], in double
template <class Targets>
void check_losses_direct(const Vec& losses, const Vec& logits, const Targets& targets, int N, int V, int Vp) {
    for (int n = 0; n < N; ++n) {
        double se = 0;
        for (int j = 0; j < V; ++j) se += std::exp(logits[(size_t)n * Vp + j]);
        CHECK(std::fabs(losses[n] - (std::log(se) - logits[(size_t)n * Vp + targets[n]])) < 1e-12);
    }
}

TEST_CASE("cpu fd: cross entropy", "[cpu][fd]") {
    const int N = 10, V = 13, Vp = 16;
    const double dloss = 0.37;
    Vec logits = randn((size_t)N * Vp, 50, 2.0);
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) logits[(size_t)n * Vp + j] = 100.0;  // padded columns must not count
    auto targets = rand_tokens(N, V, 51);
    Vec losses(N);
    auto loss = [&] {
        Vec l = logits;
        cpu::cross_entropy(l.data(), losses.data(), targets.data(), N, V, Vp, 0.0);
        REQUIRE(l == logits);  // dloss == 0 leaves the logits untouched
        double s = 0;
        for (double x : losses) s += x;
        return dloss * s;
    };
    loss();
    check_losses_direct(losses, logits, targets, N, V, Vp);
    Vec grad = logits, losses2(N);
    cpu::cross_entropy(grad.data(), losses2.data(), targets.data(), N, V, Vp, dloss);
    CHECK(losses2 == losses);
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) CHECK(grad[(size_t)n * Vp + j] == 0.0);
    check_grad("cross_entropy dlogits", logits, grad, loss);
}

namespace {
// ---- vocabulary parallelism (tensor parallelism) helpers ----
// A split of the padded vocabulary [0, Vp) into slices [cuts[k], cuts[k+1]).
using Cuts = std::vector<int>;

// Columns [c0, c1) of row-major [N, Vp] logits as a contiguous [N, c1 - c0] block.
template <class F>
std::vector<F> take_cols(const std::vector<F>& full, int N, int Vp, int c0, int c1) {
    std::vector<F> out((size_t)N * (c1 - c0));
    for (int n = 0; n < N; ++n)
        for (int j = c0; j < c1; ++j) out[(size_t)n * (c1 - c0) + (j - c0)] = full[(size_t)n * Vp + j];
    return out;
}
template <class F>
void put_cols(std::vector<F>& full, const std::vector<F>& part, int N, int Vp, int c0, int c1) {
    for (int n = 0; n < N; ++n)
        for (int j = c0; j < c1; ++j) full[(size_t)n * Vp + j] = part[(size_t)n * (c1 - c0) + (j - c0)];
}

// How the test combines the slices' (max, sum-exp, target) statistics, as the model does
// across the TP group. The wrong modes exist to show that the comparison can fail.
enum class Combine { Correct, NoRescale, FirstSliceMax, FirstSliceTarget };

// Combines per-slice stats [N, 3] in double: M = max_k m_k, S = sum_k s_k exp(m_k - M),
// target = sum_k t_k.
template <class F>
std::vector<F> combine_stats(const std::vector<std::vector<F>>& parts, int N, Combine mode = Combine::Correct) {
    std::vector<F> out((size_t)3 * N);
    for (int n = 0; n < N; ++n) {
        double M = -INFINITY;
        for (const auto& p : parts) M = std::max(M, (double)p[3 * n]);
        double S = 0, tgt = 0;
        for (size_t k = 0; k < parts.size(); ++k) {
            const auto& p = parts[k];
            if (p[3 * n + 1] != 0) S += mode == Combine::NoRescale ? (double)p[3 * n + 1]
                                                                   : (double)p[3 * n + 1] * std::exp((double)p[3 * n] - M);
            if (mode != Combine::FirstSliceTarget || k == 0) tgt += (double)p[3 * n + 2];
        }
        out[3 * n] = (F)(mode == Combine::FirstSliceMax ? (double)parts[0][3 * n] : M);
        out[3 * n + 1] = (F)S;
        out[3 * n + 2] = (F)tgt;
    }
    return out;
}

// Targets that fall in every slice with real columns of every split (its first and last
// real column), then random ones in [0, V).
std::vector<int32_t> targets_in_every_slice(const std::vector<Cuts>& splits, int N, int V, uint64_t seed) {
    std::vector<int32_t> t = rand_tokens(N, V, seed);
    int i = 0;
    for (const Cuts& cuts : splits)
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            const int lo = cuts[k], hi = std::min(cuts[k + 1], V);
            if (lo >= hi) continue;  // padding only
            REQUIRE(i + 2 <= N);
            t[i++] = lo;
            t[i++] = hi - 1;
        }
    return t;
}
}  // namespace

TEST_CASE("cpu fd: vocabulary-parallel cross entropy", "[cpu][fd][tp]") {
    // partial -> host combine -> finish, in double, against finite differences of the losses
    const int N = 6, V = 13, Vp = 16;
    const double dloss = 0.37;
    const Cuts cuts = {0, 5, 10, 13, 16};  // the last slice is padding only
    Vec logits = randn((size_t)N * Vp, 70, 2.0);
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) logits[(size_t)n * Vp + j] = 100.0;  // padding must not count
    auto targets = targets_in_every_slice({cuts}, N, V, 71);
    const int K = (int)cuts.size() - 1;
    auto stats_of = [&](const Vec& l) {
        std::vector<Vec> parts(K);
        for (int k = 0; k < K; ++k) {
            const int c0 = cuts[k], c1 = cuts[k + 1];
            const Vec part = take_cols(l, N, Vp, c0, c1);
            parts[k].assign((size_t)3 * N, 0.0);
            cpu::cross_entropy_partial(parts[k].data(), part.data(), targets.data(), N, c1 - c0, c0, V);
        }
        return combine_stats(parts, N);
    };
    Vec losses(N);
    auto loss = [&] {
        const Vec st = stats_of(logits);
        // dloss == 0: no logits needed
        cpu::cross_entropy_finish<double>(nullptr, losses.data(), st.data(), targets.data(), N, 0, 0, V, 0.0);
        double s = 0;
        for (double x : losses) s += x;
        return dloss * s;
    };
    loss();
    check_losses_direct(losses, logits, targets, N, V, Vp);
    const Vec st = stats_of(logits);
    Vec grad(logits.size(), -1.0);
    for (int k = 0; k < K; ++k) {
        const int c0 = cuts[k], c1 = cuts[k + 1];
        Vec part = take_cols(logits, N, Vp, c0, c1), l2(N);
        cpu::cross_entropy_finish(part.data(), l2.data(), st.data(), targets.data(), N, c1 - c0, c0, V, dloss);
        CHECK(l2 == losses);
        put_cols(grad, part, N, Vp, c0, c1);
    }
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) CHECK(grad[(size_t)n * Vp + j] == 0.0);
    check_grad("vocab-parallel cross_entropy dlogits", logits, grad, loss);
}

TEST_CASE("cpu fd: the checker catches wrong gradients", "[cpu][fd]") {
    // A correct layernorm gradient, then three kinds of bugs: a small error in one
    // element, a sign error, and a missing term (the mean of dnorm).
    const int N = 4, C = 11;
    Vec inp = randn((size_t)N * C, 60), w = randn(C, 61), b = randn(C, 62), G = randn((size_t)N * C, 63);
    Vec out((size_t)N * C), mean(N), rstd(N);
    auto loss = [&] {
        cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
        return dot_all(out, G);
    };
    loss();
    Vec dinp((size_t)N * C, 0.0), dw(C, 0.0), db(C, 0.0);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), G.data(), inp.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    const Vec num = numeric_grad(inp, loss);
    CHECK(compare_grad(dinp, num).worst < kGradTol);

    Vec bad = dinp;
    bad[7] *= 1.0 + 1e-4;
    CHECK(compare_grad(bad, num).worst > kGradTol);

    bad = dinp;
    for (auto& x : bad) x = -x;
    CHECK(compare_grad(bad, num).worst > kGradTol);

    bad = dinp;
    for (int n = 0; n < N; ++n) {
        double dnorm_mean = 0;
        for (int c = 0; c < C; ++c) dnorm_mean += G[(size_t)n * C + c] * w[c];
        dnorm_mean /= C;
        for (int c = 0; c < C; ++c) bad[(size_t)n * C + c] += dnorm_mean * rstd[n];  // drop the term
    }
    CHECK(compare_grad(bad, num).worst > kGradTol);
}

// =======================================================================================
// CpuOps (float) against the double instantiation
// =======================================================================================

constexpr double kFloatTol = 1e-5;

TEST_CASE("cpu float: encoder matches double", "[cpu][float]") {
    auto ops = make_cpu_ops();
    REQUIRE(ops->name() == "cpu");
    const int B = 3, T = 17, C = 40, V = 50;
    auto tokens = rand_tokens(B * T, V, 100);
    Vec wte = randn((size_t)V * C, 101), wpe = randn((size_t)T * C, 102), G = randn((size_t)B * T * C, 103);
    Vec out((size_t)B * T * C), dwte = randn(wte.size(), 104), dwpe = randn(wpe.size(), 105);
    FVec fwte = to_f(wte), fwpe = to_f(wpe), fG = to_f(G), fout(out.size()), fdwte = to_f(dwte), fdwpe = to_f(dwpe);
    cpu::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, 0, V);
    cpu::encoder_backward(dwte.data(), dwpe.data(), G.data(), tokens.data(), B, T, C, 0, V);
    ops->encoder_forward(T32(fout), tokens.data(), T32(fwte), T32(fwpe), B, T, C, 0);
    ops->encoder_backward(T32(fdwte), T32(fdwpe), T32(fG), tokens.data(), B, T, C, 0);
    CHECK(rel_err(fout, out) < kFloatTol);
    CHECK(rel_err(fdwte, dwte) < kFloatTol);
    CHECK(rel_err(fdwpe, dwpe) < kFloatTol);
}

TEST_CASE("cpu float: layernorm and residual match double", "[cpu][float]") {
    auto ops = make_cpu_ops();
    const int N = 51, C = 70;
    Vec a = randn((size_t)N * C, 110), bb = randn((size_t)N * C, 111), w = randn(C, 112), bias = randn(C, 113);
    Vec G = randn((size_t)N * C, 114);
    Vec res((size_t)N * C), out((size_t)N * C), mean(N), rstd(N), dinp = randn((size_t)N * C, 115),
        dw = randn(C, 116), db = randn(C, 117);
    FVec fa = to_f(a), fb = to_f(bb), fw = to_f(w), fbias = to_f(bias), fG = to_f(G), fres(res.size()),
         fout(out.size()), fmean(N), frstd(N), fdinp = to_f(dinp), fdw = to_f(dw), fdb = to_f(db);

    cpu::fused_residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(), a.data(), bb.data(),
                                          w.data(), bias.data(), N, C);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), G.data(), res.data(), w.data(), mean.data(),
                            rstd.data(), N, C);
    ops->fused_residual_layernorm_forward(T32(fres), T32(fout), fmean.data(), frstd.data(), T32(fa), T32(fb),
                                          T32(fw), T32(fbias), N, C);
    ops->layernorm_backward(T32(fdinp), T32(fdw), T32(fdb), T32(fG), T32(fres), T32(fw), fmean.data(), frstd.data(),
                            N, C);
    CHECK(rel_err(fres, res) < kFloatTol);
    CHECK(rel_err(fout, out) < kFloatTol);
    CHECK(rel_err(fmean, mean) < kFloatTol);
    CHECK(rel_err(frstd, rstd) < kFloatTol);
    CHECK(rel_err(fdinp, dinp) < kFloatTol);
    CHECK(rel_err(fdw, dw) < kFloatTol);
    CHECK(rel_err(fdb, db) < kFloatTol);

    // plain layernorm == the fused one applied to its residual
    FVec fout2(out.size()), fmean2(N), frstd2(N);
    ops->layernorm_forward(T32(fout2), fmean2.data(), frstd2.data(), T32(fres), T32(fw), T32(fbias), N, C);
    CHECK(bitwise_equal(fout2, fout));
    CHECK(bitwise_equal(fmean2, fmean));
    CHECK(bitwise_equal(frstd2, frstd));

    FVec fsum(a.size());
    ops->residual_forward(T32(fsum), T32(fa), T32(fb));
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(fsum[i] == fa[i] + fb[i]);
}

TEST_CASE("cpu float: matmul matches double and a naive reference", "[cpu][float]") {
    auto ops = make_cpu_ops();
    // two row blocks, two column blocks, two k blocks of the GEMM, plus ragged edges
    const int N = 101, IC = 300, OC = 150;
    Vec inp = randn((size_t)N * IC, 120), w = randn((size_t)OC * IC, 121, 0.05), bias = randn(OC, 122);
    Vec G = randn((size_t)N * OC, 123);
    for (int gelu = 0; gelu < 2; ++gelu) {
        INFO("gelu " << gelu);
        // naive double reference
        Vec pre_ref, out_ref;
        naive_matmul(pre_ref, inp, w, &bias, N, IC, OC);
        out_ref = pre_ref;
        Vec dpre = G;
        if (gelu)
            for (size_t i = 0; i < pre_ref.size(); ++i) {
                const double x = pre_ref[i];
                const double k = std::sqrt(2.0 / M_PI);
                const double u = k * (x + 0.044715 * x * x * x);
                out_ref[i] = 0.5 * x * (1.0 + std::tanh(u));
                const double th = std::tanh(u);
                dpre[i] = G[i] * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * k * (1 + 3 * 0.044715 * x * x));
            }
        Vec dinp_ref((size_t)N * IC, 0.0), dw_ref((size_t)OC * IC, 0.0), db_ref(OC, 0.0);
        for (int n = 0; n < N; ++n)
            for (int o = 0; o < OC; ++o) {
                const double d = dpre[(size_t)n * OC + o];
                db_ref[o] += d;
                for (int i = 0; i < IC; ++i) {
                    dinp_ref[(size_t)n * IC + i] += d * w[(size_t)o * IC + i];
                    dw_ref[(size_t)o * IC + i] += d * inp[(size_t)n * IC + i];
                }
            }
        // double instantiation of the templates
        Vec out((size_t)N * OC), pre((size_t)N * OC), dinp((size_t)N * IC), dw((size_t)OC * IC, 0.0), db(OC, 0.0);
        Vec dout = G;
        cpu::matmul_forward(out.data(), gelu ? pre.data() : nullptr, inp.data(), w.data(), bias.data(), N, IC, OC,
                            gelu != 0);
        cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                             gelu ? pre.data() : nullptr, N, IC, OC);
        CHECK(rel_err(out, out_ref) < 1e-12);
        CHECK(rel_err(dinp, dinp_ref) < 1e-12);
        CHECK(rel_err(dw, dw_ref) < 1e-12);
        CHECK(rel_err(db, db_ref) < 1e-12);
        // CpuOps float
        FVec finp = to_f(inp), fw = to_f(w), fbias = to_f(bias), fdout = to_f(G), fout(out.size()),
             fpre(out.size()), fdinp(dinp.size(), 123.0f), fdw(dw.size(), 0.0f), fdb(OC, 0.0f);
        Tensor pre_t = gelu ? T32(fpre) : Tensor();
        ops->matmul_forward(T32(fout), pre_t, T32(finp), T32(fw), T32(fbias), N, IC, OC, gelu != 0);
        ops->matmul_backward(T32(fdinp), T32(fdw), T32(fdb), T32(fdout), T32(finp), T32(fw), pre_t, N, IC, OC);
        CHECK(rel_err(fout, out_ref) < kFloatTol);
        if (gelu) CHECK(rel_err(fpre, pre_ref) < kFloatTol);
        CHECK(rel_err(fdinp, dinp_ref) < kFloatTol);
        CHECK(rel_err(fdw, dw_ref) < kFloatTol);
        CHECK(rel_err(fdb, db_ref) < kFloatTol);
        if (gelu) {
            // dinp through a GELU (dinp_gelu: its input, here pre's values in inp's shape) is, bit
            // for bit, what the GELU's own linear did with it before: the next backward's
            // pre_gelu multiplying its dout (dinp) in place
            FVec gin(fdinp.size()), fused(fdinp.size()), dw2(dw.size(), 0.0f), dw3(dw.size(), 0.0f), fdout2 = to_f(G);
            for (size_t i = 0; i < gin.size(); ++i) gin[i] = fpre[i % fpre.size()] * 0.75f;
            ops->matmul_backward(T32(fused), T32(dw2), Tensor(), T32(fdout2), T32(finp), T32(fw), Tensor(), N, IC, OC,
                                 T32(gin));
            FVec plain(fdinp.size()), fdout3 = to_f(G);
            ops->matmul_backward(T32(plain), T32(dw3), Tensor(), T32(fdout3), T32(finp), T32(fw), Tensor(), N, IC, OC);
            CHECK(plain != fused);  // the GELU's backward acted
            // the former way: a linear N -> IC whose pre-activation was gin takes dout = plain
            FVec x((size_t)N * N, 0.5f), wx((size_t)IC * N, 0.25f), dwx((size_t)IC * N, 0.0f);
            ops->matmul_backward(Tensor(), T32(dwx), Tensor(), T32(plain), T32(x), T32(wx), T32(gin), N, N, IC);
            CHECK(std::memcmp(plain.data(), fused.data(), fused.size() * sizeof(float)) == 0);
            CHECK(dw2 == dw3);
        }
    }
    // no bias: out = inp @ w^T
    FVec finp = to_f(inp), fw = to_f(w), fout((size_t)N * OC);
    Vec ref;
    naive_matmul(ref, inp, w, nullptr, N, IC, OC);
    ops->matmul_forward(T32(fout), Tensor(), T32(finp), T32(fw), Tensor(), N, IC, OC, false);
    CHECK(rel_err(fout, ref) < kFloatTol);

    // a wide, LM-head-like shape: many column blocks, so work items span several row blocks
    const int N2 = 200, IC2 = 40, OC2 = 1100;
    Vec inp2 = randn((size_t)N2 * IC2, 124), w2 = randn((size_t)OC2 * IC2, 125, 0.1);
    FVec finp2 = to_f(inp2), fw2 = to_f(w2), fout2((size_t)N2 * OC2);
    naive_matmul(ref, inp2, w2, nullptr, N2, IC2, OC2);
    ops->matmul_forward(T32(fout2), Tensor(), T32(finp2), T32(fw2), Tensor(), N2, IC2, OC2, false);
    CHECK(rel_err(fout2, ref) < kFloatTol);
}

TEST_CASE("cpu float: cross entropy matches double", "[cpu][float]") {
    auto ops = make_cpu_ops();
    const int N = 20, V = 300, Vp = 320;
    Vec logits = randn((size_t)N * Vp, 140, 3.0);
    auto targets = rand_tokens(N, V, 141);
    Vec losses(N), grad = logits;
    cpu::cross_entropy(grad.data(), losses.data(), targets.data(), N, V, Vp, 0.01);
    FVec fl = to_f(logits), flosses(N);
    ops->cross_entropy(T32(fl), flosses.data(), targets.data(), N, V, Vp, 0.0f);
    CHECK(rel_err(flosses, losses) < kFloatTol);
    CHECK(bitwise_equal(fl, to_f(logits)));  // untouched
    ops->cross_entropy(T32(fl), flosses.data(), targets.data(), N, V, Vp, 0.01f);
    CHECK(rel_err(flosses, losses) < kFloatTol);
    CHECK(rel_err(fl, grad) < kFloatTol);
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) REQUIRE(fl[(size_t)n * Vp + j] == 0.0f);
}

TEST_CASE("cpu float: exp and tanh approximations", "[cpu][float]") {
    double worst_exp = 0, worst_tanh = 0;
    for (int i = 0; i <= 200000; ++i) {
        const float x = -87.0f + 87.0f * (float)i / 200000.0f;
        const double e = std::exp((double)x);
        worst_exp = std::max(worst_exp, std::fabs(cpu::exp_approx(x) - e) / e);
        const float u = -10.0f + 20.0f * (float)i / 200000.0f;
        const double th = std::tanh((double)u);
        worst_tanh = std::max(worst_tanh, std::fabs(cpu::tanh_t(u) - th) / std::max(std::fabs(th), 1e-30));
    }
    INFO("exp rel err " << worst_exp << ", tanh rel err " << worst_tanh);
    CHECK(worst_exp < 3e-7);
    CHECK(worst_tanh < 5e-7);
    CHECK(cpu::exp_approx(-1000.0f) == 0.0f);
    CHECK(cpu::exp_approx(0.0f) == 1.0f);
    // defined for every input (UBSan: no out-of-range conversion or shift): NaN in, NaN out
    CHECK(std::isnan(cpu::exp_approx(NAN)));
    CHECK(std::isnan(cpu::exp_approx(-NAN)));
    CHECK(cpu::exp_approx(1e30f) == INFINITY);
    CHECK(cpu::exp_approx(INFINITY) == INFINITY);
    CHECK(cpu::exp_approx(-INFINITY) == 0.0f);
    CHECK(cpu::exp_approx(88.0f) == Approx(std::exp(88.0)).epsilon(1e-6));
    CHECK(cpu::tanh_t(0.0f) == 0.0f);
    CHECK(cpu::tanh_t(50.0f) == 1.0f);
    CHECK(cpu::tanh_t(-50.0f) == -1.0f);
}

// =======================================================================================
// Tensor parallelism: vocabulary-sliced embedding and cross-entropy (CpuOps, float)
// =======================================================================================

TEST_CASE("cpu tp: vocabulary-sliced encoder sums to the unsliced op", "[cpu][tp]") {
    auto ops = make_cpu_ops();
    const int B = 3, T = 17, C = 40, Vp = 64, N = B * T;
    auto tokens = rand_tokens(N, Vp, 700);
    tokens[0] = 0, tokens[1] = Vp - 1, tokens[2] = 31, tokens[3] = 32, tokens[4] = 19, tokens[5] = 20;  // slice edges
    tokens[6] = tokens[9] = tokens[40] = 33;  // repeats accumulate
    const FVec wte = to_f(randn((size_t)Vp * C, 701)), wpe = to_f(randn((size_t)T * C, 702)),
               G = to_f(randn((size_t)N * C, 703));
    const FVec dwte0 = to_f(randn(wte.size(), 704)), dwpe0 = to_f(randn(wpe.size(), 705));

    // the unsliced op, itself against the direct formula (one addition: exact)
    FVec wte_ = wte, wpe_ = wpe, G_ = G, out((size_t)N * C), dwte = dwte0, dwpe = dwpe0;
    ops->encoder_forward(T32(out), tokens.data(), T32(wte_), T32(wpe_), B, T, C, 0);
    ops->encoder_backward(T32(dwte), T32(dwpe), T32(G_), tokens.data(), B, T, C, 0);
    size_t bad = 0;
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c)
            bad += out[(size_t)n * C + c] != wte[(size_t)tokens[n] * C + c] + wpe[(size_t)(n % T) * C + c];
    CHECK(bad == 0);

    struct Split {
        Cuts cuts;
        int wpe_slice;  // the one slice that adds wpe
    };
    const std::vector<Split> splits = {{{0, 32, 64}, 0},
                                       {{0, 32, 64}, 1},
                                       {{0, 20, 45, 64}, 1},
                                       {{0, 20, 45, 64}, 2},
                                       {{0, 7, 7, 64}, 1}};  // an empty slice adding wpe
    for (const Split& sp : splits) {
        INFO("cuts " << sp.cuts.size() - 1 << " slices, second cut " << sp.cuts[1] << ", wpe on slice "
                     << sp.wpe_slice);
        const int K = (int)sp.cuts.size() - 1;
        FVec sum((size_t)N * C, 0.0f), dwte_cat = dwte0, dwpe_s = dwpe0;
        size_t wrong = 0;
        for (int k = 0; k < K; ++k) {
            const int c0 = sp.cuts[k], rows = sp.cuts[k + 1] - c0;
            const bool has_wpe = k == sp.wpe_slice;
            Tensor wte_k(wte_.data() + (size_t)c0 * C, (size_t)rows * C, DType::F32);
            FVec o((size_t)N * C, NAN);  // every element must be written
            ops->encoder_forward(T32(o), tokens.data(), wte_k, has_wpe ? T32(wpe_) : Tensor(), B, T, C, c0);
            for (int n = 0; n < N; ++n) {
                const bool in = tokens[n] >= c0 && tokens[n] < c0 + rows;
                for (int c = 0; c < C; ++c) {
                    const float e = in ? wte[(size_t)tokens[n] * C + c] : 0.0f;
                    const float expect = has_wpe ? (in ? e + wpe[(size_t)(n % T) * C + c] : wpe[(size_t)(n % T) * C + c]) : e;
                    wrong += !(o[(size_t)n * C + c] == expect);
                    sum[(size_t)n * C + c] += o[(size_t)n * C + c];
                }
            }
            Tensor dwte_k(dwte_cat.data() + (size_t)c0 * C, (size_t)rows * C, DType::F32);
            ops->encoder_backward(dwte_k, has_wpe ? T32(dwpe_s) : Tensor(), T32(G_), tokens.data(), B, T, C, c0);
        }
        CHECK(wrong == 0);
        // forward: the all-reduce (sum) of the slices is exactly the unsliced op (sums with zeros)
        CHECK(bitwise_equal(sum, out));
        // backward: the slices' dwte side by side, and the one dwpe, are exactly the unsliced op's
        CHECK(bitwise_equal(dwte_cat, dwte));
        CHECK(bitwise_equal(dwpe_s, dwpe));
    }
    // the double instantiation agrees with the float op on a slice
    Vec dw = randn((size_t)20 * C, 706), dwr = dw, o((size_t)N * C);
    const Vec Gd(G.begin(), G.end()), wted(wte.begin() + 20 * C, wte.begin() + 40 * C);
    cpu::encoder_forward(o.data(), tokens.data(), wted.data(), (const double*)nullptr, B, T, C, 20, 20);
    cpu::encoder_backward(dw.data(), (double*)nullptr, Gd.data(), tokens.data(), B, T, C, 20, 20);
    for (int n = 0; n < N; ++n) {
        const bool in = tokens[n] >= 20 && tokens[n] < 40;
        for (int c = 0; c < C; ++c) {
            REQUIRE(o[(size_t)n * C + c] == (in ? wted[(size_t)(tokens[n] - 20) * C + c] : 0.0));
            if (in) dwr[(size_t)(tokens[n] - 20) * C + c] += Gd[(size_t)n * C + c];
        }
    }
    CHECK(rel_err(dw, dwr) < 1e-15);
}

namespace {
// Vocabulary-parallel cross-entropy of `logits` [N, Vp] split at `cuts`: partial on every
// slice, the host combine, finish on every slice. Returns the losses (checked identical on
// every slice) and the slices' dlogits put back side by side (dloss != 0) in `grad`.
FVec vocab_parallel_ce(Ops& ops, const FVec& logits, const std::vector<int32_t>& targets, int N, int V, int Vp,
                       const Cuts& cuts, float dloss, FVec& grad, Combine mode = Combine::Correct,
                       std::vector<FVec>* parts_out = nullptr) {
    const int K = (int)cuts.size() - 1;
    REQUIRE(cuts.front() == 0);
    REQUIRE(cuts.back() == Vp);
    std::vector<FVec> parts(K);
    for (int k = 0; k < K; ++k) {
        const int c0 = cuts[k], c1 = cuts[k + 1];
        FVec part = take_cols(logits, N, Vp, c0, c1);
        const FVec part0 = part;
        parts[k].assign((size_t)3 * N, NAN);
        ops.cross_entropy_partial(parts[k].data(), T32(part), targets.data(), N, c1 - c0, c0, V);
        REQUIRE(bitwise_equal(part, part0));  // partial reads only
    }
    const FVec stats = combine_stats(parts, N, mode);
    FVec losses;
    grad.assign(logits.size(), NAN);
    for (int k = 0; k < K; ++k) {
        const int c0 = cuts[k], c1 = cuts[k + 1];
        FVec part = take_cols(logits, N, Vp, c0, c1), lk(N, NAN);
        const FVec part0 = part;
        ops.cross_entropy_finish(T32(part), lk.data(), stats.data(), targets.data(), N, c1 - c0, c0, V, dloss);
        if (dloss == 0.0f) REQUIRE(bitwise_equal(part, part0));
        put_cols(grad, part, N, Vp, c0, c1);
        if (k == 0) losses = lk;
        else REQUIRE(bitwise_equal(lk, losses));  // every rank gets the same losses
    }
    if (parts_out) *parts_out = parts;
    return losses;
}

Vec to_d(const FVec& v) { return Vec(v.begin(), v.end()); }
}  // namespace

TEST_CASE("cpu tp: vocabulary-parallel cross entropy equals the fused op", "[cpu][tp]") {
    auto ops = make_cpu_ops();
    const int N = 48, V = 300, Vp = 320;
    const float dloss = 0.01f;
    const std::vector<Cuts> splits = {{0, 320},                 // one slice: the fused op, bitwise
                                      {0, 160, 320},            // two
                                      {0, 107, 214, 320},       // three
                                      {0, 37, 250, 300, 320},   // uneven, the last one padding only
                                      {0, 13, 299, 320}};       // a slice with one real column
    const FVec logits = to_f(randn((size_t)N * Vp, 710, 3.0));
    FVec lg = logits;
    for (int n = 0; n < N; ++n)
        for (int j = V; j < Vp; ++j) lg[(size_t)n * Vp + j] = 100.0f;  // padding must not count
    const auto targets = targets_in_every_slice(splits, N, V, 711);

    // the fused op
    FVec fused_grad = lg, fused_losses(N), fused_losses0(N), untouched = lg;
    ops->cross_entropy(T32(untouched), fused_losses0.data(), targets.data(), N, V, Vp, 0.0f);
    ops->cross_entropy(T32(fused_grad), fused_losses.data(), targets.data(), N, V, Vp, dloss);

    for (const Cuts& cuts : splits) {
        const int K = (int)cuts.size() - 1;
        INFO(K << " slices, first cut " << cuts[1]);
        FVec grad, grad0;
        std::vector<FVec> parts;
        const FVec losses = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, dloss, grad, Combine::Correct, &parts);
        const FVec losses0 = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, 0.0f, grad0);
        CHECK(bitwise_equal(grad0, lg));  // dloss == 0: logits untouched
        CHECK(bitwise_equal(losses0, losses));

        // each slice's statistics against a direct double computation
        size_t wrong = 0;
        for (int k = 0; k < K; ++k) {
            const int c0 = cuts[k], c1 = std::min(cuts[k + 1], V);
            for (int n = 0; n < N; ++n) {
                const float* st = &parts[k][3 * (size_t)n];
                if (c0 >= c1) {  // padding only
                    wrong += !(st[0] == -INFINITY && st[1] == 0.0f && st[2] == 0.0f);
                    continue;
                }
                double m = -INFINITY, s = 0;
                for (int j = c0; j < c1; ++j) m = std::max(m, (double)lg[(size_t)n * Vp + j]);
                for (int j = c0; j < c1; ++j) s += std::exp((double)lg[(size_t)n * Vp + j] - m);
                const double t = targets[n] >= c0 && targets[n] < c1 ? lg[(size_t)n * Vp + targets[n]] : 0.0;
                wrong += !(st[0] == (float)m && std::fabs(st[1] - s) <= 1e-6 * s && st[2] == (float)t);
            }
        }
        CHECK(wrong == 0);

        if (K == 1) {  // one slice: bitwise the fused op
            CHECK(bitwise_equal(losses, fused_losses));
            CHECK(bitwise_equal(losses0, fused_losses0));
            CHECK(bitwise_equal(grad, fused_grad));
        }
        CHECK(rel_err(losses, to_d(fused_losses)) < 1e-6);
        CHECK(rel_err(losses0, to_d(fused_losses0)) < 1e-6);
        CHECK(rel_err(grad, to_d(fused_grad)) < 1e-6);
        size_t pad = 0;
        for (int n = 0; n < N; ++n)
            for (int j = V; j < Vp; ++j) pad += grad[(size_t)n * Vp + j] != 0.0f;
        CHECK(pad == 0);
    }
}

TEST_CASE("cpu tp: a wrongly combined cross entropy fails the comparison", "[cpu][tp]") {
    auto ops = make_cpu_ops();
    const int N = 24, V = 300, Vp = 320;
    const float dloss = 0.01f;
    const Cuts cuts = {0, 107, 214, 320};
    const FVec lg = to_f(randn((size_t)N * Vp, 720, 3.0));
    const auto targets = targets_in_every_slice({cuts}, N, V, 721);
    FVec fused_grad = lg, fused_losses(N);
    ops->cross_entropy(T32(fused_grad), fused_losses.data(), targets.data(), N, V, Vp, dloss);
    const Vec ref_losses = to_d(fused_losses), ref_grad = to_d(fused_grad);

    FVec grad;
    FVec losses = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, dloss, grad);
    CHECK(rel_err(losses, ref_losses) < 1e-6);  // the correct combination passes
    CHECK(rel_err(grad, ref_grad) < 1e-6);
    // sums of exponentials added without rescaling to the global max
    losses = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, dloss, grad, Combine::NoRescale);
    CHECK(rel_err(losses, ref_losses) > 1e-3);
    CHECK(rel_err(grad, ref_grad) > 1e-3);
    // the first slice's max taken as the global one (the sum still relative to the true max)
    losses = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, dloss, grad, Combine::FirstSliceMax);
    CHECK(rel_err(losses, ref_losses) > 1e-3);
    CHECK(rel_err(grad, ref_grad) > 1e-3);
    // the target logit of the first slice only
    losses = vocab_parallel_ce(*ops, lg, targets, N, V, Vp, cuts, dloss, grad, Combine::FirstSliceTarget);
    CHECK(rel_err(losses, ref_losses) > 1e-3);
}

// =======================================================================================
// Optimizer
// =======================================================================================

TEST_CASE("cpu adamw matches the scalar formula", "[cpu][adamw]") {
    auto ops = make_cpu_ops();
    const size_t n = 1003;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.7f;
    for (int use_master = 0; use_master < 2; ++use_master) {
        INFO("master " << use_master);
        FVec p = to_f(randn(n, 200)), master = to_f(randn(n, 201)), m(n, 0.0f), v(n, 0.0f);
        // reference state in double
        Vec rp(n), rm(n, 0.0), rv(n, 0.0);
        for (size_t i = 0; i < n; ++i) rp[i] = use_master ? master[i] : p[i];
        for (int t = 1; t <= 5; ++t) {
            FVec g = to_f(randn(n, 300 + t));
            ops->adamw(T32(p), use_master ? master.data() : nullptr, T32(g), m.data(), v.data(), lr, b1, b2, eps, wd,
                       scale, t, 1234u);
            for (size_t i = 0; i < n; ++i) {
                const double gi = (double)g[i] * scale;
                rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
                rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
                const double mhat = rm[i] / (1.0 - std::pow((double)b1, t));
                const double vhat = rv[i] / (1.0 - std::pow((double)b2, t));
                rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
            }
            CHECK(rel_err(m, rm) < 1e-6);
            CHECK(rel_err(v, rv) < 1e-6);
            double worst = 0;  // parameter error relative to the learning rate (the step size)
            for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(p[i] - rp[i]));
            CHECK(worst < 1e-3 * lr);
            if (use_master) CHECK(bitwise_equal(p, master));
        }
    }
}

TEST_CASE("cpu sum_squares matches a direct double sum", "[cpu][adamw]") {
    auto ops = make_cpu_ops();
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8192), size_t(100003)}) {
        FVec g = to_f(randn(n, 400 + n));
        double ref = 0;
        for (float x : g) ref += (double)x * (double)x;
        const double s = ops->sum_squares(T32(g));
        INFO("n " << n);
        CHECK(std::fabs(s - ref) <= 1e-12 * ref);
    }
}

// =======================================================================================
// Determinism: bitwise identical across runs and OpenMP thread counts
// =======================================================================================

TEST_CASE("cpu ops are deterministic across runs and thread counts", "[cpu][determinism]") {
    auto ops = make_cpu_ops();
    const int B = 2, T = 64, C = 96, NH = 4, HS = C / NH, V = 500, Vp = 512, N = B * T;
    const int OC = 4 * C;
    auto tokens = rand_tokens(N, V, 500);
    auto targets = rand_tokens(N, V, 501);
    const FVec wte = to_f(randn((size_t)Vp * C, 502, 0.1)), wpe = to_f(randn((size_t)T * C, 503, 0.1));
    const FVec x = to_f(randn((size_t)N * C, 504)), w = to_f(randn((size_t)OC * C, 505, 0.1)),
               bias = to_f(randn(OC, 506)), lnw = to_f(randn(C, 507)), lnb = to_f(randn(C, 508));
    const FVec qkv = to_f(randn((size_t)N * 3 * C, 509)), dqkvo = to_f(randn((size_t)N * C, 510));
    const FVec dout = to_f(randn((size_t)N * OC, 511)), dln = to_f(randn((size_t)N * C, 512));
    const FVec logits0 = to_f(randn((size_t)N * Vp, 513, 2.0));
    const FVec big = to_f(randn(300001, 514));

    // Runs every op once and returns all outputs concatenated.
    auto run_all = [&]() {
        std::vector<FVec> outs;
        FVec enc((size_t)N * C), dwte((size_t)Vp * C), dwpe((size_t)T * C);
        FVec wte_ = wte, wpe_ = wpe, dln_ = dln;
        ops->encoder_forward(T32(enc), tokens.data(), T32(wte_), T32(wpe_), B, T, C, 0);
        ops->encoder_backward(T32(dwte), T32(dwpe), T32(dln_), tokens.data(), B, T, C, 0);
        outs.insert(outs.end(), {enc, dwte, dwpe});

        FVec x_ = x, lnw_ = lnw, lnb_ = lnb, ln((size_t)N * C), mean(N), rstd(N), dx((size_t)N * C), dw(C), db(C);
        ops->layernorm_forward(T32(ln), mean.data(), rstd.data(), T32(x_), T32(lnw_), T32(lnb_), N, C);
        ops->layernorm_backward(T32(dx), T32(dw), T32(db), T32(dln_), T32(x_), T32(lnw_), mean.data(), rstd.data(),
                                N, C);
        outs.insert(outs.end(), {ln, mean, rstd, dx, dw, db});

        FVec w_ = w, bias_ = bias, mo((size_t)N * OC), pre((size_t)N * OC), dmi((size_t)N * C),
             dmw((size_t)OC * C), dmb(OC), dout_ = dout;
        ops->matmul_forward(T32(mo), T32(pre), T32(x_), T32(w_), T32(bias_), N, C, OC, true);
        ops->matmul_backward(T32(dmi), T32(dmw), T32(dmb), T32(dout_), T32(x_), T32(w_), T32(pre), N, C, OC);
        outs.insert(outs.end(), {mo, pre, dmi, dmw, dmb, dout_});
        // LM-head-like shape: the GEMM's grouping of row blocks depends on the thread count
        FVec wv = wte, lgh((size_t)N * Vp), dlnf((size_t)N * C), dwv((size_t)Vp * C), lgd = logits0;
        ops->matmul_forward(T32(lgh), Tensor(), T32(x_), T32(wv), Tensor(), N, C, Vp, false);
        ops->matmul_backward(T32(dlnf), T32(dwv), Tensor(), T32(lgd), T32(x_), T32(wv), Tensor(), N, C, Vp);
        outs.insert(outs.end(), {lgh, dlnf, dwv});

        FVec qkv_ = qkv, ao((size_t)N * C), lse((size_t)B * NH * T), dq((size_t)N * 3 * C), dao = dqkvo;
        ops->attention_forward(T32(ao), lse.data(), T32(qkv_), B, T, NH, NH, HS);
        ops->attention_backward(T32(dq), T32(dao), T32(qkv_), T32(ao), lse.data(), B, T, NH, NH, HS);
        outs.insert(outs.end(), {ao, lse, dq});

        FVec lg = logits0, losses(N);
        ops->cross_entropy(T32(lg), losses.data(), targets.data(), N, V, Vp, 1.0f / N);
        outs.insert(outs.end(), {lg, losses});

        // tensor parallelism: a wte slice without wpe; the cross-entropy over two vocabulary slices
        FVec enc2((size_t)N * C), dwte2((size_t)(Vp - 200) * C);
        Tensor wte_hi(wte_.data() + (size_t)200 * C, (size_t)(Vp - 200) * C, DType::F32);
        ops->encoder_forward(T32(enc2), tokens.data(), wte_hi, Tensor(), B, T, C, 200);
        ops->encoder_backward(T32(dwte2), Tensor(), T32(dln_), tokens.data(), B, T, C, 200);
        outs.insert(outs.end(), {enc2, dwte2});
        FVec vgrad;
        const FVec vlosses = vocab_parallel_ce(*ops, logits0, targets, N, V, Vp, {0, 200, Vp}, 1.0f / N, vgrad);
        outs.insert(outs.end(), {vgrad, vlosses});

        FVec big_ = big;
        const double ss = ops->sum_squares(T32(big_));
        FVec ssv(2);
        std::memcpy(ssv.data(), &ss, sizeof(double));
        outs.push_back(ssv);

        FVec p = dmw, m((size_t)OC * C), v((size_t)OC * C);
        ops->adamw(T32(p), nullptr, T32(dmw), m.data(), v.data(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3, 0u);
        outs.insert(outs.end(), {p, m, v});
        return outs;
    };

    std::vector<FVec> ref;
    with_threads(1, [&] { ref = run_all(); });
    for (int threads : {1, 2, 3}) {
        std::vector<FVec> got;
        with_threads(threads, [&] { got = run_all(); });
        REQUIRE(got.size() == ref.size());
        for (size_t i = 0; i < ref.size(); ++i) {
            INFO("threads " << threads << ", output " << i);
            CHECK(bitwise_equal(got[i], ref[i]));
        }
    }
}

// =======================================================================================
// Memory
// =======================================================================================

TEST_CASE("cpu memory ops", "[cpu][memory]") {
    auto ops = make_cpu_ops();
    const size_t n = 1000;
    float* p = static_cast<float*>(ops->alloc(n * sizeof(float)));
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    bool zeroed = true;
    for (size_t i = 0; i < n; ++i) zeroed = zeroed && p[i] == 0.0f;
    CHECK(zeroed);
    Tensor t(p, n, DType::F32);
    FVec h = to_f(randn(n, 600)), back(n);
    ops->from_host_f32(t, h.data());
    ops->to_host_f32(back.data(), t);
    CHECK(bitwise_equal(back, h));
    float* q = static_cast<float*>(ops->alloc(n * sizeof(float)));
    Tensor u(q, n, DType::F32);
    ops->copy(u, t);
    ops->to_host_bytes(back.data(), q, n * sizeof(float));
    CHECK(bitwise_equal(back, h));
    ops->zero(t.slice(10, 20));
    ops->to_host_f32(back.data(), t);
    for (size_t i = 0; i < n; ++i) REQUIRE(back[i] == ((i >= 10 && i < 30) ? 0.0f : h[i]));
    ops->from_host_bytes(q, h.data(), 4 * sizeof(float));
    CHECK(q[3] == h[3]);
    ops->synchronize();
    ops->release(p);
    ops->release(q);

    // bf16 views convert on the way in and out (round to nearest even)
    std::vector<uint16_t> bf(4);
    Tensor tb(bf.data(), 4, DType::BF16);
    const float src[4] = {1.0f, -2.5f, 1.00390625f /* 1 + 2^-8: tie, rounds to even */, 3.0e38f};
    ops->from_host_f32(tb, src);
    float out[4];
    ops->to_host_f32(out, tb);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -2.5f);
    CHECK(out[2] == 1.0f);
    CHECK(std::fabs(out[3] - 3.0e38f) < 0.01f * 3.0e38f);
}
