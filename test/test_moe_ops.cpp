// Proof of the mixture-of-experts pieces: the host routing plan and load-balancing loss
// (llmc/model/moe.h) against hand-worked examples, the CPU ops (llmc/cpu/moe_kernels.h) forward
// against formulas written here, backward against central finite differences in double, and
// CpuOps (float) against double. Shapes: the op-case table's "moe" rows (test/op_cases.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/moe_kernels.h"
#include "llmc/model/moe.h"
#include "test/cpu_test_util.h"
#include "test/op_cases.h"

namespace {

using namespace cpu_test;

// The router's choices computed here independently: sort the experts by (prob descending, index ascending).
std::vector<int32_t> topk_reference(const Vec& probs, int N, int E, int K) {
    std::vector<int32_t> out;
    for (int n = 0; n < N; ++n) {
        std::vector<int> idx(E);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return probs[n * E + a] > probs[n * E + b]; });
        for (int j = 0; j < K; ++j) out.push_back(idx[j]);
    }
    return out;
}

}  // namespace

TEST_CASE("moe plan: capacity, token-order drops, rows per expert", "[moe]") {
    MoeShape m;
    m.num_experts = 3;
    m.top_k = 2;
    CHECK(moe_capacity(m, 5) == 10);  // dropless: every pair
    m.capacity_factor = 1.0f;
    CHECK(moe_capacity(m, 5) == 4);  // ceil(1.0 * 5 * 2 / 3)
    m.capacity_factor = 0.5f;
    CHECK(moe_capacity(m, 5) == 2);  // ceil(1.67)
    m.capacity_factor = 100.0f;
    CHECK(moe_capacity(m, 5) == 10);  // never more than the pairs
    // 4 tokens, top-2; capacity 2: expert 0 is chosen by tokens 0, 1, 2 (slot 0) and 3 (slot 1)
    const std::vector<int32_t> ex = {0, 1, 0, 2, 0, 1, 2, 0};
    const MoePlan p = moe_plan(ex.data(), 4, 3, 2, 2);
    CHECK(p.routed == std::vector<int>({4, 2, 2}));
    CHECK(p.count == std::vector<int>({2, 2, 2}));
    CHECK(p.offset == std::vector<int>({0, 2, 4}));
    CHECK(p.rows == 6);
    CHECK(p.dropped == 2);
    // expert 0: rows 0, 1 for tokens 0, 1; token 2's and token 3's pairs dropped
    CHECK(p.row_of == std::vector<int32_t>({0, 2, 1, 4, -1, 3, 5, -1}));
    const MoePlan all = moe_plan(ex.data(), 4, 3, 2, 8);
    CHECK(all.dropped == 0);
    CHECK(all.row_of == std::vector<int32_t>({0, 4, 1, 6, 2, 5, 7, 3}));
}

TEST_CASE("moe expert-parallel route: sends, receives, expert-major blocks", "[moe]") {
    // ep 2, E 4 (rank 0: experts 0, 1; rank 1: experts 2, 3); rows per expert of each rank's plan
    const std::vector<int> counts = {3, 0, 2, 1,   // rank 0
                                     1, 4, 0, 5};  // rank 1
    const MoeEpRoute r1 = moe_ep_route(counts, 2, 1, 4);
    CHECK(r1.send == std::vector<size_t>({5, 5}));  // rank 1's rows of experts 0, 1 to rank 0; of 2, 3 to itself
    CHECK(r1.recv == std::vector<size_t>({3, 5}));  // experts 2, 3 from rank 0 (2 + 1) and from itself (0 + 5)
    CHECK(r1.count == std::vector<int>({2, 6}));
    CHECK(r1.offset == std::vector<int>({0, 2}));
    CHECK(r1.rows == 8);
    // received source-major [src 0: e2 (2), e3 (1)] [src 1: e2 (0), e3 (5)] -> expert-major [e2: 2] [e3: 1 + 5]
    REQUIRE(r1.blocks.size() == 3);
    CHECK((r1.blocks[0].src == 0 && r1.blocks[0].dst == 0 && r1.blocks[0].n == 2));
    CHECK((r1.blocks[1].src == 2 && r1.blocks[1].dst == 2 && r1.blocks[1].n == 1));
    CHECK((r1.blocks[2].src == 3 && r1.blocks[2].dst == 3 && r1.blocks[2].n == 5));
    const MoeEpRoute r0 = moe_ep_route(counts, 2, 0, 4);
    CHECK(r0.send == std::vector<size_t>({3, 3}));
    CHECK(r0.recv == std::vector<size_t>({3, 5}));
    CHECK(r0.count == std::vector<int>({4, 4}));
    // ep 1: everything stays, one block per nonempty expert
    const MoeEpRoute self = moe_ep_route({3, 0, 2}, 1, 0, 3);
    CHECK((self.rows == 5 && self.blocks.size() == 2 && self.blocks[1].src == 3 && self.blocks[1].dst == 3));
    // the receive bound: at most ep x min(N k, E/ep x capacity)
    MoeShape m;
    m.num_experts = 4;
    m.top_k = 2;
    CHECK(moe_ep_max_rows(m, 8, 2) == 32);  // dropless: every source's 16 pairs
    m.capacity_factor = 1.0f;
    CHECK(moe_ep_max_rows(m, 8, 2) == 16);  // capacity 4: 2 experts x 4 rows from each of 2 sources
    CHECK(moe_ep_max_rows(m, 8, 1) == 16);
    // under context parallelism the capacity is the micro-batch's (N cp tokens): capacity_factor
    // 0.5 gives 2 rows per expert for 8 tokens but 4 for the 16 of two cp ranks
    m.capacity_factor = 0.5f;
    CHECK(moe_ep_max_rows(m, 8, 2) == 8);
    CHECK(moe_ep_max_rows(m, 8, 2, 2) == 16);
}

TEST_CASE("moe aux loss: Switch's E * sum f_e P_e, its gradient in p", "[moe]") {
    // 2 tokens, 2 experts, top-1: token 0 -> expert 0, token 1 -> expert 0
    const std::vector<float> probs = {0.75f, 0.25f, 0.625f, 0.375f};
    const std::vector<int32_t> ex = {0, 0};
    const MoePlan p = moe_plan(ex.data(), 2, 2, 1, 2);
    std::vector<float> daux;
    const double aux = moe_aux_loss(probs.data(), p, 2, 2, 1, &daux);
    // f = (1, 0), P = (0.6875, 0.3125): aux = 2 * 0.6875
    CHECK(aux == Approx(1.375).epsilon(1e-12));
    CHECK(daux[0] == Approx(2.0 * 1.0 / 2));
    CHECK(daux[1] == 0.0f);
    // uniform routing and probabilities: 1
    const std::vector<float> u = {0.5f, 0.5f, 0.5f, 0.5f};
    const std::vector<int32_t> ex2 = {0, 1};
    CHECK(moe_aux_loss(u.data(), moe_plan(ex2.data(), 2, 2, 1, 2), 2, 2, 1, nullptr) == Approx(1.0));
}

TEST_CASE("moe under context parallelism: each rank keeps the whole micro-batch's decisions", "[moe][cp]") {
    // Hand-worked: 1 sequence of 4 tokens, cp 2 (rank 0 holds positions 0, 3; rank 1 positions 1, 2),
    // top-1 over 2 experts, capacity 2. By position the choices are 0, 0, 0, 1: position 2 is the
    // third pair of expert 0, dropped, though rank 1 alone routes only two pairs to it.
    {
        const std::vector<int32_t> all = {0, 1,   // rank 0: positions 0, 3
                                          0, 0};  // rank 1: positions 1, 2
        const MoePlan r0 = moe_cp_plan(all.data(), 1, 2, 2, 0, 2, 1, 2, 4);
        const MoePlan r1 = moe_cp_plan(all.data(), 1, 2, 2, 1, 2, 1, 2, 4);
        CHECK(r0.row_of == std::vector<int32_t>({0, 1}));
        CHECK((r0.dropped == 0 && r0.rows == 2 && r0.count == std::vector<int>({1, 1})));
        CHECK(r1.row_of == std::vector<int32_t>({0, -1}));
        CHECK((r1.dropped == 1 && r1.rows == 1 && r1.count == std::vector<int>({1, 0})));
        CHECK((r0.routed == std::vector<int>({3, 1}) && r1.routed == r0.routed));  // the whole micro-batch's
        // 3 valid tokens (position 3 padding), capacity 1: position 3 gets no row and counts nowhere;
        // positions 1 and 2 (rank 1) are expert 0's second and third pairs, dropped
        const MoePlan p0 = moe_cp_plan(all.data(), 1, 2, 2, 0, 2, 1, 1, 3);
        const MoePlan p1 = moe_cp_plan(all.data(), 1, 2, 2, 1, 2, 1, 1, 3);
        CHECK(p0.row_of == std::vector<int32_t>({0, -1}));
        CHECK((p0.dropped == 0 && p0.rows == 1 && p0.routed == std::vector<int>({3, 0})));
        CHECK(p1.row_of == std::vector<int32_t>({-1, -1}));
        CHECK((p1.dropped == 2 && p1.rows == 0));
    }
    // Random choices over B sequences; the expected plan is computed here from the definitions:
    // the split (rank r holds chunks r and 2cp-1-r of each sequence), pairs claiming places in
    // global token order, each rank's kept pairs in rows by expert and local order.
    const int B = 2, T = 16, E = 4, K = 2;
    uint64_t state = 12345;
    auto next = [&]() { return int((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33); };
    std::vector<int32_t> global(size_t(B) * T * K);  // by (sequence, position, slot)
    for (int n = 0; n < B * T; n++) {
        const int a = next() % E, b = (a + 1 + next() % (E - 1)) % E;  // two distinct experts
        global[size_t(n) * K] = a;
        global[size_t(n) * K + 1] = b;
    }
    for (int cp : {1, 2, 4})
        for (int valid : {T, T - 5}) {  // T - 5: each sequence's last 5 positions are padding
            for (int cap : {3, 6, 64}) {
                std::vector<int> claimed(E, 0), routed(E, 0);
                std::vector<bool> kept(global.size()), pad(global.size());
                for (size_t i = 0; i < global.size(); i++) {
                    pad[i] = int(i / K % T) >= valid;
                    if (pad[i]) continue;
                    const int e = global[i];
                    routed[size_t(e)]++;
                    kept[i] = claimed[size_t(e)] < cap;
                    claimed[size_t(e)] += kept[i];
                }
                const int t = T / cp, chunk = T / (2 * cp);
                std::vector<std::vector<size_t>> pairs(static_cast<size_t>(cp));  // each rank's pairs (global index), local order
                std::vector<int32_t> all;
                for (int r = 0; r < cp; r++)
                    for (int b = 0; b < B; b++)
                        for (int i = 0; i < t; i++) {
                            const int pos = i < chunk ? r * chunk + i : (2 * cp - 1 - r) * chunk + (i - chunk);
                            for (int j = 0; j < K; j++) {
                                pairs[size_t(r)].push_back((size_t(b) * T + size_t(pos)) * K + size_t(j));
                                all.push_back(global[pairs[size_t(r)].back()]);
                            }
                        }
                int dropped_sum = 0;
                for (int r = 0; r < cp; r++) {
                    INFO("cp " << cp << " rank " << r << " capacity " << cap << " valid " << valid);
                    const MoePlan p = moe_cp_plan(all.data(), B, t, cp, r, E, K, cap, valid);
                    const std::vector<size_t>& mine = pairs[size_t(r)];
                    std::vector<int> count(E, 0);
                    int dropped = 0;
                    for (size_t g : mine) {
                        count[size_t(global[g])] += kept[g];
                        dropped += !kept[g] && !pad[g];
                    }
                    std::vector<int32_t> row_of(mine.size(), -1);
                    int row = 0;
                    for (int e = 0; e < E; e++)
                        for (size_t li = 0; li < mine.size(); li++)
                            if (kept[mine[li]] && global[mine[li]] == e) row_of[li] = row++;
                    CHECK(p.row_of == row_of);
                    CHECK(p.count == count);
                    CHECK(p.rows == row);
                    CHECK(p.dropped == dropped);
                    CHECK(p.routed == routed);
                    dropped_sum += p.dropped;
                }
                int dropped_all = 0;
                for (size_t i = 0; i < kept.size(); i++) dropped_all += !kept[i] && !pad[i];
                CHECK(dropped_sum == dropped_all);
                if (cap == 3) CHECK(dropped_all > 0);  // the capacity path is exercised
                if (cap == 64) CHECK(dropped_all == 0);
            }
        }
}

TEST_CASE("moe aux loss from sums over ranks: the whole micro-batch's", "[moe][cp]") {
    // the aux example above split over two ranks of one token each: P and routed summed
    const std::vector<float> probs = {0.75f, 0.25f, 0.625f, 0.375f};
    std::vector<double> P = moe_prob_sums(probs.data(), 1, 2);
    const std::vector<double> P1 = moe_prob_sums(probs.data() + 2, 1, 2);
    for (int e = 0; e < 2; e++) P[size_t(e)] += P1[size_t(e)];
    const std::vector<int> routed = {2, 0};
    std::vector<float> daux;
    CHECK(moe_aux_from_sums(P.data(), routed.data(), 2, 2, 1, &daux) == Approx(1.375).epsilon(1e-12));
    CHECK(daux[0] == Approx(1.0));  // E f_0 / N with the whole N = 2
    CHECK(daux[1] == 0.0f);
}

TEST_CASE("cpu moe router: softmax, top-k with ties to the lower index, renormalised gates", "[moe]") {
    // ties: experts 1 and 3 equal and largest, then 0 and 2 equal
    const int E = 4, K = 3;
    const Vec logits = {0.5, 1.0, 0.5, 1.0};
    Vec probs(E), gate(K);
    std::vector<int32_t> ex(K);
    cpu::moe_router_forward(probs.data(), ex.data(), gate.data(), logits.data(), 1, E, K);
    CHECK(ex == std::vector<int32_t>({1, 3, 0}));
    const double s = 2 * std::exp(1.0) + std::exp(0.5);
    CHECK(gate[0] == Approx(std::exp(1.0) / s).epsilon(1e-14));
    CHECK(gate[2] == Approx(std::exp(0.5) / s).epsilon(1e-14));
}

TEST_CASE("cpu fd: moe router, permutation and combine", "[moe][fd]") {
    for (const op_cases::Case& c : op_cases::of("moe", op_cases::Fd)) {
        const int N = c.dims[0], E = c.dims[1], K = c.dims[2], C = c.dims[3], cap = c.dims[4] ? c.dims[4] : N * K;
        INFO("N E K C capacity " << N << " " << E << " " << K << " " << C << " " << cap);
        Vec logits = randn((size_t)N * E, 70 + N, 2.0);
        Vec probs((size_t)N * E), gate((size_t)N * K);
        std::vector<int32_t> ex((size_t)N * K);
        cpu::moe_router_forward(probs.data(), ex.data(), gate.data(), logits.data(), N, E, K);
        // forward against softmax and the sorted choice written here
        double worst = 0;
        for (int n = 0; n < N; ++n) {
            double mx = -1e300, se = 0;
            for (int e = 0; e < E; ++e) mx = std::max(mx, logits[n * E + e]);
            for (int e = 0; e < E; ++e) se += std::exp(logits[n * E + e] - mx);
            for (int e = 0; e < E; ++e)
                worst = std::max(worst, std::fabs(probs[n * E + e] - std::exp(logits[n * E + e] - mx) / se));
        }
        CHECK(worst < 1e-15);
        CHECK(ex == topk_reference(probs, N, E, K));
        const MoePlan plan = moe_plan(ex.data(), N, E, K, cap);
        if (c.dims[4]) CHECK(plan.dropped > 0);
        const int R = plan.rows;

        // router: loss = sum gate * G + sum_n sum_e probs[n,e] * A[e]
        const Vec G = randn((size_t)N * K, 71), A = randn(E, 72);
        auto router_loss = [&] {
            std::vector<int32_t> ex2((size_t)N * K);
            cpu::moe_router_forward(probs.data(), ex2.data(), gate.data(), logits.data(), N, E, K);
            REQUIRE(ex2 == ex);  // the perturbation must not change the choice
            double l = dot_all(gate, G);
            for (int n = 0; n < N; ++n)
                for (int e = 0; e < E; ++e) l += probs[n * E + e] * A[e];
            return l;
        };
        router_loss();
        Vec dlogits((size_t)N * E);
        cpu::moe_router_backward(dlogits.data(), G.data(), A.data(), probs.data(), ex.data(), gate.data(), N, E, K);
        check_fd("moe router dlogits", logits, dlogits, router_loss);

        // permute: loss = sum out * D (out: R rows)
        Vec x = randn((size_t)N * C, 73), D = randn((size_t)R * C, 74), out((size_t)R * C);
        auto perm_loss = [&] {
            cpu::moe_permute(out.data(), x.data(), plan.row_of.data(), N, K, C);
            return dot_all(out, D);
        };
        perm_loss();
        for (int n = 0; n < N; ++n)  // every row is its token's input
            for (int j = 0; j < K; ++j)
                if (plan.row_of[n * K + j] >= 0)
                    CHECK(out[(size_t)plan.row_of[n * K + j] * C] == x[(size_t)n * C]);
        Vec dx((size_t)N * C, 0.0);
        cpu::moe_permute_backward(dx.data(), D.data(), plan.row_of.data(), N, K, C);
        check_fd("moe permute dinp", x, dx, perm_loss);

        // combine: loss = sum out * D2 (out: N rows)
        Vec y = randn((size_t)R * C, 75), D2 = randn((size_t)N * C, 76), o((size_t)N * C);
        Vec g = randn((size_t)N * K, 77);
        auto comb_loss = [&] {
            cpu::moe_combine(o.data(), y.data(), g.data(), plan.row_of.data(), N, K, C);
            return dot_all(o, D2);
        };
        comb_loss();
        Vec dy((size_t)R * C), dg((size_t)N * K);
        cpu::moe_combine_backward(dy.data(), dg.data(), D2.data(), y.data(), g.data(), plan.row_of.data(), N, K, C);
        check_fd("moe combine dy", y, dy, comb_loss);
        check_fd("moe combine dgate", g, dg, comb_loss);
    }
}

TEST_CASE("cpu moe ops: float CpuOps equal the double templates", "[moe]") {
    CpuOps ops;
    for (const op_cases::Case& c : op_cases::of("moe", op_cases::Cpu)) {
        const int N = c.dims[0], E = c.dims[1], K = c.dims[2], C = c.dims[3], cap = c.dims[4] ? c.dims[4] : N * K;
        INFO("N E K C capacity " << N << " " << E << " " << K << " " << C << " " << cap);
        const Vec logits = randn((size_t)N * E, 80);
        Vec probs((size_t)N * E), gate((size_t)N * K);
        std::vector<int32_t> ex((size_t)N * K), exf((size_t)N * K);
        cpu::moe_router_forward(probs.data(), ex.data(), gate.data(), logits.data(), N, E, K);
        FVec lf = to_f(logits), pf((size_t)N * E), gf((size_t)N * K);
        ops.moe_router_forward(pf.data(), exf.data(), gf.data(), T32(lf), N, E, K);
        REQUIRE(exf == ex);
        CHECK(rel_err(pf.data(), probs.data(), probs.size()) < 1e-5);
        CHECK(rel_err(gf.data(), gate.data(), gate.size()) < 1e-5);
        const Vec G = randn((size_t)N * K, 81), A = randn(E, 82);
        Vec dl((size_t)N * E);
        cpu::moe_router_backward(dl.data(), G.data(), A.data(), probs.data(), ex.data(), gate.data(), N, E, K);
        FVec Gf = to_f(G), Af = to_f(A), dlf((size_t)N * E);
        ops.moe_router_backward(T32(dlf), Gf.data(), Af.data(), pf.data(), exf.data(), gf.data(), N, E, K);
        CHECK(rel_err(dlf.data(), dl.data(), dl.size()) < 1e-5);

        const MoePlan plan = moe_plan(ex.data(), N, E, K, cap);
        const int R = plan.rows;
        const Vec x = randn((size_t)N * C, 83);
        Vec xp((size_t)R * C), o((size_t)N * C), dy((size_t)R * C), dg((size_t)N * K), dx((size_t)N * C, 0.0);
        FVec xf = to_f(x), xpf((size_t)R * C), of((size_t)N * C), dyf((size_t)R * C), dgf((size_t)N * K),
            dxf((size_t)N * C, 0.0f);
        cpu::moe_permute(xp.data(), x.data(), plan.row_of.data(), N, K, C);
        ops.moe_permute(T32(xpf), T32(xf), plan.row_of.data(), N, K, C);
        CHECK(rel_err(xpf.data(), xp.data(), xp.size()) < 1e-7);  // a copy: only the input's rounding
        cpu::moe_combine(o.data(), xp.data(), gate.data(), plan.row_of.data(), N, K, C);
        ops.moe_combine(T32(of), T32(xpf), gf.data(), plan.row_of.data(), N, K, C);
        CHECK(rel_err(of.data(), o.data(), o.size()) < 1e-5);
        cpu::moe_combine_backward(dy.data(), dg.data(), x.data(), xp.data(), gate.data(), plan.row_of.data(), N, K, C);
        ops.moe_combine_backward(T32(dyf), dgf.data(), T32(xf), T32(xpf), gf.data(), plan.row_of.data(), N, K, C);
        CHECK(rel_err(dyf.data(), dy.data(), dy.size()) < 1e-5);
        CHECK(rel_err(dgf.data(), dg.data(), dg.size()) < 1e-5);
        cpu::moe_permute_backward(dx.data(), dy.data(), plan.row_of.data(), N, K, C);
        ops.moe_permute_backward(T32(dxf), T32(dyf), plan.row_of.data(), N, K, C);
        CHECK(rel_err(dxf.data(), dx.data(), dx.size()) < 1e-5);
    }
}
