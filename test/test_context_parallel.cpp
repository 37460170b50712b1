// Proof of context parallelism's ops (llmc/cpu/kernels.h: attention_block_forward,
// attention_merge, attention_block_backward; rope at given positions) and of the ring they make
// (llmc/parallel/context_parallel.h): cp blocks of the load-balanced split, simulated in one process in
// the ring's order, give the whole sequence's causal attention; their backward is checked
// against central finite differences (double) and against the whole attention's (float, CpuOps).
// The shapes are the op-case table's "attention_ring" rows (test/op_cases.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <type_traits>
#include <vector>

#include "llmc/parallel/context_parallel.h"
#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/kernels.h"
#include "test/cpu_test_util.h"
#include "test/op_cases.h"

namespace {

using namespace cpu_test;

struct Shape {
    int B, T, NH, NKV, HS, cp;
    int t() const { return T / cp; }
    size_t W() const { return size_t(NH + 2 * NKV) * HS; }
    size_t C() const { return size_t(NH) * HS; }
};

// Rank r's rows of each sequence (w elements a row) <-> the whole sequences.
template <class X>
std::vector<X> take(const std::vector<X>& whole, const Shape& s, int r, size_t w) {
    std::vector<X> out(size_t(s.B) * s.t() * w);
    const SeqPositions p = cp_positions(s.t(), s.cp, r);
    for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < s.t(); ++i)
            for (size_t e = 0; e < w; ++e)
                out[(size_t(b) * s.t() + i) * w + e] = whole[(size_t(b) * s.T + p.at(i)) * w + e];
    return out;
}
template <class X>
void put(std::vector<X>& whole, const std::vector<X>& local, const Shape& s, int r, size_t w) {
    const SeqPositions p = cp_positions(s.t(), s.cp, r);
    for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < s.t(); ++i)
            for (size_t e = 0; e < w; ++e)
                whole[(size_t(b) * s.T + p.at(i)) * w + e] = local[(size_t(b) * s.t() + i) * w + e];
}
// lse [B, NH, T] <-> rank r's [B, NH, t]
template <class X>
std::vector<X> lse_of_whole(const std::vector<std::vector<X>>& lse, const Shape& s) {
    std::vector<X> out(size_t(s.B) * s.NH * s.T);
    for (int r = 0; r < s.cp; ++r) {
        const SeqPositions p = cp_positions(s.t(), s.cp, r);
        for (int bh = 0; bh < s.B * s.NH; ++bh)
            for (int i = 0; i < s.t(); ++i) out[size_t(bh) * s.T + p.at(i)] = lse[size_t(r)][size_t(bh) * s.t() + i];
    }
    return out;
}

// The ring of ContextParallel, every rank in one process, over the double kernels (X = double)
// or CpuOps (X = float): rank r attends to the blocks of origin r, r-1, ... in that order.
template <class X>
struct Ring {
    Shape s;
    Ops* ops;  // float only
    std::vector<std::vector<X>> qkv, out, lse;

    void block_forward(X* o, X* l, int r, int origin) {
        const int t = s.t();
        const SeqPositions qp = cp_positions(t, s.cp, r), kp = cp_positions(t, s.cp, origin);
        if constexpr (std::is_same<X, double>::value) {
            cpu::attention_block_forward(o, l, qkv[size_t(r)].data(), qkv[size_t(origin)].data(), s.B, t, t, s.NH,
                                         s.NKV, s.HS, qp, kp);
        } else {
            ops->attention_block_forward(Tensor(o, size_t(s.B) * t * s.C(), DType::F32), l, T32(qkv[size_t(r)]),
                                         T32(qkv[size_t(origin)]), s.B, t, t, s.NH, s.NKV, s.HS, qp, kp);
        }
    }
    void merge(int r, std::vector<X>& bo, std::vector<X>& bl) {
        if constexpr (std::is_same<X, double>::value)
            cpu::attention_merge(out[size_t(r)].data(), lse[size_t(r)].data(), bo.data(), bl.data(), s.B, s.t(), s.NH,
                                 s.HS);
        else
            ops->attention_merge(T32(out[size_t(r)]), lse[size_t(r)].data(), T32(bo), bl.data(), s.B, s.t(), s.NH, s.HS);
    }
    void forward() {
        const int t = s.t();
        out.assign(size_t(s.cp), std::vector<X>(size_t(s.B) * t * s.C()));
        lse.assign(size_t(s.cp), std::vector<X>(size_t(s.B) * s.NH * t));
        std::vector<X> bo(out[0].size()), bl(lse[0].size());
        for (int r = 0; r < s.cp; ++r) {
            block_forward(out[size_t(r)].data(), lse[size_t(r)].data(), r, r);
            for (int st = 1; st < s.cp; ++st) {
                block_forward(bo.data(), bl.data(), r, (r + s.cp - st) % s.cp);
                merge(r, bo, bl);
            }
        }
    }
    // dqkv of every rank from dout of every rank. dK/dV of a block accumulate in the ring's
    // order: origin o's block visits ranks o, o+1, ..., o+cp-1.
    std::vector<std::vector<X>> backward(const std::vector<std::vector<X>>& dout) {
        const int t = s.t();
        std::vector<std::vector<X>> dq(size_t(s.cp), std::vector<X>(qkv[0].size(), X(0))), dkv = dq;
        for (int st = 0; st < s.cp; ++st)
            for (int r = 0; r < s.cp; ++r) {
                const int o = (r + s.cp - st) % s.cp;
                const SeqPositions qp = cp_positions(t, s.cp, r), kp = cp_positions(t, s.cp, o);
                if constexpr (std::is_same<X, double>::value)
                    cpu::attention_block_backward(dq[size_t(r)].data(), dkv[size_t(o)].data(), dout[size_t(r)].data(),
                                                  qkv[size_t(r)].data(), qkv[size_t(o)].data(), out[size_t(r)].data(),
                                                  lse[size_t(r)].data(), s.B, t, t, s.NH, s.NKV, s.HS, qp, kp);
                else
                    ops->attention_block_backward(T32(dq[size_t(r)]), T32(dkv[size_t(o)]),
                                                  T32(const_cast<std::vector<X>&>(dout[size_t(r)])),
                                                  T32(qkv[size_t(r)]), T32(qkv[size_t(o)]), T32(out[size_t(r)]),
                                                  lse[size_t(r)].data(), s.B, t, t, s.NH, s.NKV, s.HS, qp, kp);
            }
        for (int r = 0; r < s.cp; ++r)
            for (size_t i = 0; i < dq[size_t(r)].size(); ++i) dq[size_t(r)][i] += dkv[size_t(r)][i];
        return dq;
    }
};

double rel_err(const Vec& f, const Vec& d) { return cpu_test::rel_err(f.data(), d.data(), d.size()); }

Shape shape_of(const op_cases::Case& c) {
    return Shape{c.dims[0], c.dims[1], c.dims[2], c.dims[3], c.dims[4], c.dims[5]};
}

}  // namespace

TEST_CASE("cp: the load-balanced split", "[cpu][cp]") {
    // T = 8 over cp 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    const int want0[4] = {0, 1, 6, 7}, want1[4] = {2, 3, 4, 5};
    for (int i = 0; i < 4; ++i) {
        CHECK(cp_global_row(i, 4, 2, 0) == want0[i]);
        CHECK(cp_global_row(i, 4, 2, 1) == want1[i]);
    }
    // every position exactly once, for cp 1, 2, 4
    for (int cp : {1, 2, 4}) {
        const int T = 24, t = T / cp;
        std::vector<int> seen(T, 0);
        for (int r = 0; r < cp; ++r)
            for (int i = 0; i < t; ++i) seen[size_t(cp_global_row(i, t, cp, r))]++;
        for (int v : seen) CHECK(v == 1);
    }
    std::vector<int32_t> seq(16), local(8);
    for (int i = 0; i < 16; ++i) seq[size_t(i)] = 100 + i;  // two sequences of 8
    cp_take_rows(seq.data(), local.data(), 2, 8, 2, 1);
    CHECK(local == std::vector<int32_t>{102, 103, 104, 105, 110, 111, 112, 113});
}

TEST_CASE("cp fd: ring attention equals the whole causal attention; its backward", "[cpu][fd][cp]") {
    for (const op_cases::Case& c : op_cases::of("attention_ring", op_cases::Fd)) {
        const Shape s = shape_of(c);
        INFO("B T NH NKV HS cp " << s.B << " " << s.T << " " << s.NH << " " << s.NKV << " " << s.HS << " " << s.cp);
        Vec qkv = randn(size_t(s.B) * s.T * s.W(), 200 + s.cp), D = randn(size_t(s.B) * s.T * s.C(), 201);
        Vec out(D.size()), lse(size_t(s.B) * s.NH * s.T);
        cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
        Ring<double> ring{s, nullptr, {}, {}, {}};
        auto run = [&] {
            ring.qkv.clear();
            for (int r = 0; r < s.cp; ++r) ring.qkv.push_back(take(qkv, s, r, s.W()));
            ring.forward();
            Vec whole(D.size());
            for (int r = 0; r < s.cp; ++r) put(whole, ring.out[size_t(r)], s, r, s.C());
            return whole;
        };
        const Vec rout = run();
        CHECK(rel_err(rout, out) < 1e-13);
        CHECK(rel_err(lse_of_whole(ring.lse, s), lse) < 1e-13);
        std::vector<Vec> dout;
        for (int r = 0; r < s.cp; ++r) dout.push_back(take(D, s, r, s.C()));
        const std::vector<Vec> dq = ring.backward(dout);
        Vec dqkv(qkv.size());
        for (int r = 0; r < s.cp; ++r) put(dqkv, dq[size_t(r)], s, r, s.W());
        // against the whole attention's backward, and against finite differences of the ring
        Vec dwhole(qkv.size());
        cpu::attention_backward(dwhole.data(), D.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH, s.NKV,
                                s.HS);
        CHECK(rel_err(dqkv, dwhole) < 1e-13);
        const Vec num = numeric_grad(qkv, [&] { return dot_all(run(), D); });
        double scale = 0, err = 0;
        for (size_t i = 0; i < num.size(); ++i) {
            scale = std::max(scale, std::fabs(num[i]));
            err = std::max(err, std::fabs(num[i] - dqkv[i]));
        }
        INFO("fd rel err " << err / scale << ", max|grad| " << scale);
        CHECK(scale > 1e-3);
        CHECK(err / scale < 1e-7);
    }
}

TEST_CASE("cp float: the ring over CpuOps equals CpuOps's whole attention to 1e-6", "[cpu][float][cp]") {
    auto ops = make_cpu_ops();
    for (const op_cases::Case& c : op_cases::of("attention_ring", op_cases::Cpu)) {
        const Shape s = shape_of(c);
        INFO("B T NH NKV HS cp " << s.B << " " << s.T << " " << s.NH << " " << s.NKV << " " << s.HS << " " << s.cp);
        const FVec qkv = to_f(randn(size_t(s.B) * s.T * s.W(), 210)), D = to_f(randn(size_t(s.B) * s.T * s.C(), 211));
        FVec fq = qkv, fD = D, out(D.size()), lse(size_t(s.B) * s.NH * s.T), dqkv(qkv.size());
        ops->attention_forward(T32(out), lse.data(), T32(fq), s.B, s.T, s.NH, s.NKV, s.HS);
        ops->attention_backward(T32(dqkv), T32(fD), T32(fq), T32(out), lse.data(), s.B, s.T, s.NH, s.NKV, s.HS);
        Ring<float> ring{s, ops.get(), {}, {}, {}};
        for (int r = 0; r < s.cp; ++r) ring.qkv.push_back(take(qkv, s, r, s.W()));
        ring.forward();
        std::vector<FVec> dout;
        for (int r = 0; r < s.cp; ++r) dout.push_back(take(D, s, r, s.C()));
        const std::vector<FVec> dq = ring.backward(dout);
        FVec rout(out.size()), rdq(qkv.size());
        for (int r = 0; r < s.cp; ++r) {
            put(rout, ring.out[size_t(r)], s, r, s.C());
            put(rdq, dq[size_t(r)], s, r, s.W());
        }
        const FVec rlse = lse_of_whole(ring.lse, s);
        auto err = [](const FVec& a, const FVec& b) {
            const Vec d(b.begin(), b.end());
            return cpu_test::rel_err(a.data(), d.data(), d.size());
        };
        CHECK(err(rout, out) < 1e-6);
        CHECK(err(rlse, lse) < 1e-6);
        CHECK(err(rdq, dqkv) < 1e-6);
    }
}

TEST_CASE("cp: a block with no visible key, and rope at a rank's positions", "[cpu][cp]") {
    // rank 0's queries (positions 0, 1, 6, 7) against rank 1's keys (2, 3, 4, 5): rows 0 and 1
    // see none (out 0, lse -inf), rows 2 and 3 see all four
    const Shape s{1, 8, 2, 1, 4, 2};
    const Vec qkv = randn(size_t(s.B) * s.T * s.W(), 220);
    const Vec q = take(qkv, s, 0, s.W()), kv = take(qkv, s, 1, s.W());
    Vec out(size_t(s.t()) * s.C(), 5.0), lse(size_t(s.NH) * s.t(), 5.0);
    cpu::attention_block_forward(out.data(), lse.data(), q.data(), kv.data(), 1, 4, 4, s.NH, s.NKV, s.HS,
                                 cp_positions(4, 2, 0), cp_positions(4, 2, 1));
    for (int h = 0; h < s.NH; ++h)
        for (int i = 0; i < 4; ++i) CHECK(std::isinf(lse[size_t(h) * 4 + i]) == (i < 2));
    for (size_t e = 0; e < 2 * s.C(); ++e) CHECK(out[e] == 0.0);
    // merging such a block changes nothing
    Vec run = randn(out.size(), 221), rl = randn(lse.size(), 222);
    const Vec run0 = run, rl0 = rl;
    Vec bo(out.size(), 0.0), bl(lse.size(), -INFINITY);
    cpu::attention_merge(run.data(), rl.data(), bo.data(), bl.data(), 1, 4, s.NH, s.HS);
    CHECK(run == run0);
    CHECK(rl == rl0);
    // rope of rank 1's rows at its positions = its rows of the whole sequence's rope
    Vec whole = qkv;
    cpu::rope(whole.data(), 1, s.T, s.NH, s.NKV, s.HS, 10000.0, false);
    for (int r = 0; r < 2; ++r) {
        Vec local = take(qkv, s, r, s.W());
        cpu::rope(local.data(), 1, 4, s.NH, s.NKV, s.HS, 10000.0, false, cp_positions(4, 2, r));
        CHECK(local == take(whole, s, r, s.W()));
    }
}
