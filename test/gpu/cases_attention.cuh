// test_gpu's attention cases (filters attention, attention_gqa, attention_mt2, attention_bwd32,
// attention_fused, attention_wgmma, attention_wgmma_mn, attention_ring): CudaOps's attention
// against the CPU backend, whole and row by row; the fused backward's split rule. Part of test_gpu.cu.
#pragma once
#include <algorithm>

#include "llmc/cuda/flash_backward_fused.cuh"
#include "test/gpu/harness.h"

namespace gpu_test {

// qkv [BT, NH + 2*NKV, HS] -> [BT, 3, NH, HS] with every key/value head repeated for the query
// heads of its group: multi-head attention on it is grouped-query attention on qkv.
std::vector<float> expand_kv(const std::vector<float>& qkv, size_t BT, int NH, int NKV, int HS) {
    const int G = NH / NKV, NQ = NH + 2 * NKV;
    std::vector<float> e(BT * 3 * NH * HS);
    for (size_t bt = 0; bt < BT; bt++)
        for (int s = 0; s < 3; s++)
            for (int hd = 0; hd < NH; hd++) {
                const int src = s == 0 ? hd : NH + (s - 1) * NKV + hd / G;
                std::copy_n(&qkv[(bt * NQ + src) * HS], HS, &e[((bt * 3 + s) * NH + hd) * HS]);
            }
    return e;
}
// the gradient through expand_kv: the repeated heads' gradients summed over each group (in double)
std::vector<float> reduce_kv(const std::vector<float>& de, size_t BT, int NH, int NKV, int HS) {
    const int G = NH / NKV, NQ = NH + 2 * NKV;
    std::vector<double> acc(BT * NQ * HS, 0.0);
    for (size_t bt = 0; bt < BT; bt++)
        for (int s = 0; s < 3; s++)
            for (int hd = 0; hd < NH; hd++) {
                const int dst = s == 0 ? hd : NH + (s - 1) * NKV + hd / G;
                for (int d = 0; d < HS; d++) acc[(bt * NQ + dst) * HS + d] += de[((bt * 3 + s) * NH + hd) * HS + d];
            }
    return std::vector<float>(acc.begin(), acc.end());
}

// Attention with NKV key/value heads (NKV == NH: multi-head). The reference is the CPU's
// multi-head attention on the expanded qkv (expand_kv), its dqkv reduced over the groups;
// with NKV < NH the CPU's grouped-query attention is compared as well (last: it may be missing).
void test_attention(H& h, int B, int T, int NH, int NKV, int HS) {
    const std::string sh = strfmt("[%s B=%d T=%d NH=%d NKV=%d HS=%d]", dtype_name(h.dt), B, T, NH, NKV, HS);
    const int NQ = NH + 2 * NKV;
    const size_t BT = (size_t)B * T, nqkv = BT * NQ * HS, no = BT * NH * HS, nl = (size_t)B * NH * T;
    Pair qkv = h.make(nqkv), out = h.make(no), lse = h.make(nl, true);
    const std::vector<float> vqkv = h.rnd(nqkv, 1.0f);
    h.up(qkv, vqkv);
    std::vector<uint8_t> r[2];
    for (int rep = 0; rep < 2; rep++) {
        h.poison(out), h.poison(lse);
        h.gpu.attention_forward(out.g, lse.g.f32(), qkv.g, B, T, NH, NKV, HS);
        r[rep] = h.raw({out, lse});
    }
    h.det("attention_forward", sh, r[0], r[1]);
    const std::vector<float> gout = h.get_gpu(out), glse = h.get_gpu(lse);
    std::vector<float> eqkv = expand_kv(vqkv, BT, NH, NKV, HS), rout(no), rlse(nl);
    const Tensor teqkv(eqkv.data(), eqkv.size(), DType::F32);
    h.cpu.attention_forward(Tensor(rout.data(), no, DType::F32), rlse.data(), teqkv, B, T, NH, NH, HS);
    H::compare_vec("attention_forward.out", sh, gout, rout, h.tol(false));
    H::compare_rows("attention_forward.out", sh, gout, rout, HS, h.tol(false));
    H::compare_vec("attention_forward.lse", sh, glse, rlse, h.tol(true));

    // backward: both sides get the reference forward's out (rounded to bf16 in bf16) and lse
    std::vector<float> vout = rout;
    for (auto& x : vout) x = h.q(x);
    h.up(out, vout);
    h.up(lse, rlse);
    Pair dout = h.make(no), dqkv = h.make(nqkv);
    const std::vector<float> vdout = h.rnd(no, 1.0f);
    h.up(dout, vdout);
    for (int rep = 0; rep < 2; rep++) {
        h.poison(dqkv);
        h.gpu.attention_backward(dqkv.g, dout.g, qkv.g, out.g, lse.g.f32(), B, T, NH, NKV, HS);
        r[rep] = h.raw({dqkv});
    }
    h.det("attention_backward", sh, r[0], r[1]);
    const std::vector<float> gdqkv = h.get_gpu(dqkv);
    std::vector<float> edqkv(eqkv.size()), edout = vdout;
    h.cpu.attention_backward(Tensor(edqkv.data(), edqkv.size(), DType::F32), Tensor(edout.data(), no, DType::F32),
                             teqkv, Tensor(vout.data(), no, DType::F32), rlse.data(), B, T, NH, NH, HS);
    const std::vector<float> ref = reduce_kv(edqkv, BT, NH, NKV, HS);
    // whole dqkv, then per slot (q, k, v) to help localise a bug
    H::compare_vec("attention_backward.dqkv", sh, gdqkv, ref, h.tol(false));
    H::compare_rows("attention_backward.dqkv", sh, gdqkv, ref, HS, h.tol(false));
    const char* names[3] = {"dq", "dk", "dv"};
    const int first[4] = {0, NH, NH + NKV, NQ};
    for (int s = 0; s < 3; s++) {
        std::vector<float> gs, cs;
        for (size_t bt = 0; bt < BT; bt++)
            for (size_t i = (size_t)first[s] * HS; i < (size_t)first[s + 1] * HS; i++) {
                gs.push_back(gdqkv[bt * NQ * HS + i]);
                cs.push_back(ref[bt * NQ * HS + i]);
            }
        H::compare_vec(std::string("attention_backward.") + names[s], sh, gs, cs, h.tol(false));
    }

    if (NKV == NH) return;
    // the CPU backend's grouped-query attention on the same inputs
    h.cpu.attention_forward(out.c, lse.c.f32(), qkv.c, B, T, NH, NKV, HS);
    H::compare_vec("attention_forward_cpu_gqa.out", sh, gout, h.get_cpu(out), h.tol(false));
    H::compare_vec("attention_forward_cpu_gqa.lse", sh, glse, h.get_cpu(lse), h.tol(true));
    h.up(out, vout);
    h.up(lse, rlse);
    h.cpu.attention_backward(dqkv.c, dout.c, qkv.c, out.c, lse.c.f32(), B, T, NH, NKV, HS);
    H::compare_vec("attention_backward_cpu_gqa.dqkv", sh, gdqkv, h.get_cpu(dqkv), h.tol(false));
}

// Context parallelism's ring ops (attention_block_forward, attention_merge,
// attention_block_backward) on the blocks of the load-balanced split of B sequences of T tokens
// over cp ranks: every (rank, block) pair in the ring's order, each op on the same inputs on both
// backends (the CPU's results of the previous op, rounded to bf16 in bf16). Rows that see no key
// of a block must have lse -inf on both (and out 0).
// The fused backward's splits of a head's key tiles (flash::split_tile, host code): for every count
// of splits S and tiles, each tile in exactly one split, each split's tiles increasing (the order
// its dQ reductions take), and the splits' query-tile work (a causal tile's: tiles - its index)
// less than 2S apart (every S-th tile instead would drift apart each round: 20 at 39 tiles, 2
// splits); fused_splits within [1, tiles]. The op cases reach a few of these (at most 5 tiles, one
// split or one tile a split).
void test_fused_splits() {
    std::string why;
    for (int tiles = 1; tiles <= 40 && why.empty(); tiles++)
        for (int S = 1; S <= tiles && why.empty(); S++) {
            std::vector<int> seen(tiles, 0);
            long long lo = 1LL << 40, hi = 0;
            for (int s = 0; s < S; s++) {
                long long work = 0;
                for (int m = 0, prev = -1;; m++) {
                    const int kt = flash::split_tile(s, S, m);
                    if (kt >= tiles) break;
                    if (kt <= prev) why = strfmt("split %d of %d: tile %d after %d", s, S, kt, prev);
                    seen[kt]++, prev = kt, work += tiles - kt;
                }
                lo = std::min(lo, work), hi = std::max(hi, work);
            }
            for (int t = 0; t < tiles && why.empty(); t++)
                if (seen[t] != 1) why = strfmt("%d tiles, %d splits: tile %d in %d splits", tiles, S, t, seen[t]);
            if (why.empty() && hi - lo >= 2 * S)
                why = strfmt("%d tiles, %d splits: work %lld to %lld", tiles, S, lo, hi);
            const int f = flash::fused_splits(S * 7, tiles, 396);
            if (why.empty() && (f < 1 || f > tiles)) why = strfmt("fused_splits(%d, %d, 396) = %d", S * 7, tiles, f);
        }
    report(why.empty(), "attention_fused.splits", "[1-40 key tiles, every split count]",
           why.empty() ? "every tile once, in order; work within a round" : why);
}

void test_attention_ring(H& h, int B, int T, int NH, int NKV, int HS, int cp) {
    const std::string sh =
        strfmt("[%s B=%d T=%d NH=%d NKV=%d HS=%d cp=%d]", dtype_name(h.dt), B, T, NH, NKV, HS, cp);
    const int NQ = NH + 2 * NKV, t = T / cp;
    const size_t W = (size_t)NQ * HS, nq = (size_t)B * t * W, no = (size_t)B * t * NH * HS, nl = (size_t)B * NH * t;
    const std::vector<float> whole = h.rnd((size_t)B * T * W, 1.0f);
    std::vector<std::vector<float>> blk(cp, std::vector<float>(nq));
    for (int r = 0; r < cp; r++) {
        const SeqPositions p = cp_positions(t, cp, r);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < t; i++)
                std::copy_n(whole.begin() + ((size_t)b * T + p.at(i)) * W, W, blk[r].begin() + ((size_t)b * t + i) * W);
    }
    auto round = [&](std::vector<float> v) {
        for (auto& x : v) x = h.q(x);
        return v;
    };
    // lse with -inf rows: the same rows on both sides, compared without them
    auto compare_lse = [&](const std::string& name, std::vector<float> g, std::vector<float> c) {
        size_t mismatch = 0;
        for (size_t i = 0; i < g.size(); i++)
            if (std::isinf(g[i]) || std::isinf(c[i])) {
                mismatch += !(g[i] == -INFINITY && c[i] == -INFINITY);
                g[i] = c[i] = 0.0f;
            }
        report(mismatch == 0, name + ".no_key_rows", sh, strfmt("mismatched=%zu", mismatch));
        H::compare_vec(name, sh, g, c, h.tol(true));
    };
    Pair q = h.make(nq), kv = h.make(nq), out = h.make(no), lse = h.make(nl, true), bo = h.make(no),
         bl = h.make(nl, true), dout = h.make(no), dq = h.make(nq), dkv = h.make(nq);
    std::vector<uint8_t> r2[2];
    for (int r = 0; r < cp; r++) {
        const SeqPositions qp = cp_positions(t, cp, r);
        h.up(q, blk[r]);
        std::vector<float> run_out, run_lse;  // the CPU's running result
        for (int s = 0; s < cp; s++) {
            const int o = (r + cp - s) % cp;
            const SeqPositions kp = cp_positions(t, cp, o);
            h.up(kv, blk[o]);
            h.cpu.attention_block_forward(bo.c, bl.c.f32(), q.c, kv.c, B, t, t, NH, NKV, HS, qp, kp);
            for (int rep = 0; rep < 2; rep++) {
                h.poison(bo), h.poison(bl);
                h.gpu.attention_block_forward(bo.g, bl.g.f32(), q.g, kv.g, B, t, t, NH, NKV, HS, qp, kp);
                r2[rep] = h.raw({bo, bl});
            }
            h.det("attention_block_forward", sh, r2[0], r2[1]);
            h.compare("attention_block_forward.out", sh, bo);
            compare_lse("attention_block_forward.lse", h.get_gpu(bl), h.get_cpu(bl));
            if (s == 0) {
                run_out = h.get_cpu(bo), run_lse = h.get_cpu(bl);
                continue;
            }
            // merge: the CPU's running result and block on both sides
            const std::vector<float> vbo = round(h.get_cpu(bo)), vbl = h.get_cpu(bl), vout = round(run_out);
            h.up(bo, vbo), h.up(bl, vbl), h.up(out, vout), h.up(lse, run_lse);
            h.cpu.attention_merge(out.c, lse.c.f32(), bo.c, bl.c.f32(), B, t, NH, HS);
            for (int rep = 0; rep < 2; rep++) {
                h.up_gpu(out, vout), h.up_gpu(lse, run_lse);
                h.gpu.attention_merge(out.g, lse.g.f32(), bo.g, bl.g.f32(), B, t, NH, HS);
                r2[rep] = h.raw({out, lse});
            }
            h.det("attention_merge", sh, r2[0], r2[1]);
            h.compare("attention_merge.out", sh, out);
            compare_lse("attention_merge.lse", h.get_gpu(lse), h.get_cpu(lse));
            run_out = h.get_cpu(out), run_lse = h.get_cpu(lse);
        }
        // backward of each block, from the whole (merged) out and lse, accumulating onto random values
        h.up(out, round(run_out)), h.up(lse, run_lse);
        h.up(dout, h.rnd(no, 1.0f));
        for (int o = 0; o < cp; o++) {
            const SeqPositions kp = cp_positions(t, cp, o);
            h.up(kv, blk[o]);
            const std::vector<float> dq0 = h.rnd(nq, 1.0f), dkv0 = h.rnd(nq, 1.0f);
            h.up(dq, dq0), h.up(dkv, dkv0);
            h.cpu.attention_block_backward(dq.c, dkv.c, dout.c, q.c, kv.c, out.c, lse.c.f32(), B, t, t, NH, NKV, HS, qp,
                                           kp);
            for (int rep = 0; rep < 2; rep++) {
                h.up_gpu(dq, dq0), h.up_gpu(dkv, dkv0);
                h.gpu.attention_block_backward(dq.g, dkv.g, dout.g, q.g, kv.g, out.g, lse.g.f32(), B, t, t, NH, NKV, HS,
                                               qp, kp);
                r2[rep] = h.raw({dq, dkv});
            }
            h.det("attention_block_backward", sh, r2[0], r2[1]);
            h.compare("attention_block_backward.dq", sh, dq);
            h.compare("attention_block_backward.dkv", sh, dkv);
        }
    }
}

}  // namespace gpu_test
