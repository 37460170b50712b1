// PowerSGD (llmc/train/powersgd.h) on one rank: the orthonormalisation and one round against values
// worked out by hand, error feedback's conservation over rounds, and which tensors the plan
// compresses. The DP group's sums, the trainer and the checkpoints run in test/e2e/test_powersgd.sh.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "llmc/comm/comm.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/model/param_table.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/powersgd.h"

namespace {
// A layout of one n x m matrix followed by a vector of v elements (and no padding).
ParamLayout one_matrix(size_t n, size_t m, size_t v) {
    ParamLayout L;
    ParamSpec a{}, b{};
    a.name = "w", a.offset = 0, a.numel = n * m, a.cols = m, a.col_begin = 0, a.col_end = m;
    b.name = "b", b.offset = n * m, b.numel = v, b.cols = 1, b.col_begin = 0, b.col_end = 1;
    L.specs = {a, b};
    L.num_params = L.padded_params = L.total_params = n * m + v;
    return L;
}
const auto alone = [](float*, size_t) {};  // the all-reduce of a group of one
}  // namespace

TEST_CASE("PowerSGD: Gram-Schmidt orthonormalises the columns left to right", "[powersgd]") {
    // columns a = (3, 4, 0), b = (1, 2, 2), c = 0: a / 5; b - (b.a^) a^ = (-0.32, 0.24, 2) over its
    // norm sqrt(4.16); c stays zero
    std::vector<float> p = {3, 1, 0, 4, 2, 0, 0, 2, 0};
    orthonormalize_columns(p.data(), 3, 3);
    const double nb = std::sqrt(4.16);
    const double want[9] = {0.6, -0.32 / nb, 0, 0.8, 0.24 / nb, 0, 0, 2 / nb, 0};
    for (int i = 0; i < 9; i++) CHECK(p[size_t(i)] == Approx(want[i]).margin(1e-7));
}

TEST_CASE("PowerSGD: the plan compresses matrices whose factors are smaller", "[powersgd]") {
    const ModelShape s{2, 4, 64, 512, 512, 64};  // the tiny CPU model: d_model 64, vocabulary 512
    const ParamLayout L = param_layout(s, ModelLayout(), DataParallel::pad_multiple(2));
    for (int r : {1, 4, 16}) {
        const PowerSgdPlan plan = powersgd_plan(L, r);
        INFO("rank " << r);
        size_t matrix_elems = 0;
        for (const auto& m : plan.matrices) {
            CHECK(size_t(r) * (m.rows + m.cols) < m.rows * m.cols);
            matrix_elems += m.rows * m.cols;
        }
        // wte, wpe and the four weight matrices of each layer; every vector is plain
        CHECK(plan.matrices.size() == 2 + 4 * 2);
        CHECK(plan.plain_elems + matrix_elems == L.padded_params);
        CHECK(plan.p_elems + plan.q_elems < matrix_elems);
        CHECK(plan.ratio() > 1.0);
    }
    // at rank 64 (the smaller side of every matrix) nothing is compressed: the plain all-reduce
    const PowerSgdPlan full = powersgd_plan(L, 64);
    CHECK(full.matrices.empty());
    CHECK(full.plain_elems == L.padded_params);
    CHECK(full.ratio() == 1.0);
}

TEST_CASE("PowerSGD: one round by hand, and error feedback keeps what it left out", "[powersgd]") {
    auto ops = make_cpu_ops();
    std::unique_ptr<Comm> self = make_self_comm(0);
    const ParamLayout L = one_matrix(3, 3, 2);
    PowerSgd psgd(L, 1, 7, *ops, *self, 4);
    REQUIRE(psgd.plan().matrices.size() == 1);
    REQUIRE(psgd.plan().q_elems == 3);
    // Q = (1, 1, 1), M = diag(1, 2, 3): P = (1, 2, 3), P^ = P / sqrt(14), Q = M^T P^ = (1, 4, 9) / sqrt(14),
    // G = P^ Q^T = (1, 2, 3)^T (1, 4, 9) / 14, E = M - G
    psgd.set_state(std::vector<float>(11, 0.0f), {1, 1, 1});
    std::vector<float> g = {1, 0, 0, 0, 2, 0, 0, 0, 3, 5, -6};
    const std::vector<float> m0 = g;
    REQUIRE(psgd.round(g.data(), alone, 1));
    const double a[3] = {1, 2, 3}, b[3] = {1, 4, 9};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            INFO(i << ", " << j);
            CHECK(g[size_t(3 * i + j)] == Approx(a[i] * b[j] / 14).margin(1e-6));
            CHECK(psgd.error()[size_t(3 * i + j)] == Approx(m0[size_t(3 * i + j)] - a[i] * b[j] / 14).margin(1e-6));
        }
    CHECK((g[9] == 5 && g[10] == -6));  // the vector: as it was (summed over a group of one)
    CHECK((psgd.error()[9] == 0 && psgd.error()[10] == 0));
    for (int j = 0; j < 3; j++) CHECK(psgd.q()[size_t(j)] == Approx(b[j] / std::sqrt(14.0)).margin(1e-6));

    // over rounds, the gradients sent plus the error left equal the gradients given (one rank:
    // E_t = M_t + E_{t-1} - G_t)
    std::vector<double> given(9, 0.0), sent(9, 0.0);
    for (int t = 0; t < 5; t++) {
        std::vector<float> x(11);
        for (size_t i = 0; i < 11; i++) x[i] = float(std::sin(double(i * 3 + size_t(t) * 7)));
        for (size_t i = 0; i < 9; i++) given[i] += x[i];
        REQUIRE(psgd.round(x.data(), alone, 1));
        for (size_t i = 0; i < 9; i++) sent[i] += x[i];
    }
    for (size_t i = 0; i < 9; i++)
        CHECK(sent[i] + psgd.error()[i] == Approx(given[i] + (m0[i] - a[i / 3] * b[i % 3] / 14)).margin(1e-5));

    // a round with a NaN leaves E and Q as they were
    const std::vector<float> e = psgd.error(), q = psgd.q();
    std::vector<float> bad(11, 1.0f);
    bad[4] = NAN;
    CHECK(!psgd.round(bad.data(), alone, 1));
    CHECK(psgd.error() == e);
    CHECK(psgd.q() == q);
}

TEST_CASE("PowerSGD: a zero gradient keeps Q's warm start", "[powersgd]") {
    auto ops = make_cpu_ops();
    std::unique_ptr<Comm> self = make_self_comm(0);
    PowerSgd psgd(one_matrix(4, 4, 0), 1, 7, *ops, *self, 16);
    const std::vector<float> q = psgd.q();  // N(0, 1) from the seed, not zero
    CHECK(q != std::vector<float>(4, 0.0f));
    std::vector<float> g(16, 0.0f);
    REQUIRE(psgd.round(g.data(), alone, 1));
    CHECK(psgd.q() == q);
    CHECK(g == std::vector<float>(16, 0.0f));
    PowerSgd again(one_matrix(4, 4, 0), 1, 7, *ops, *self, 16);  // the same seed: the same Q on every rank
    CHECK(again.q() == q);
}
