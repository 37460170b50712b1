#include "llmc/model/moe.h"

#include <algorithm>
#include <cmath>

#include "llmc/core/common.h"
#include "llmc/parallel/context_parallel.h"

std::string moe_describe(const MoeShape& m, int n_layer) {
    std::string layers = m.every == 1 ? "every layer" : n_layer / m.every > 1 ? "layers" : "layer";
    for (int l = m.every - 1, k = 0; m.every > 1 && l < n_layer; l += m.every, k++)
        layers += k == 3 ? ", ..." : k > 3 ? "" : strfmt("%s %d", k ? "," : "", l);
    if (m.every > 1) layers += strfmt(" (%d of %d)", n_layer / m.every, n_layer);
    const std::string cap = m.capacity_factor > 0 ? strfmt("capacity factor %g", double(m.capacity_factor)) : "dropless";
    return strfmt("mixture of experts: %d experts, top-%d, width %d, in %s; aux_loss_coef %g; %s", m.num_experts,
                  m.top_k, m.expert_ffn_dim, layers.c_str(), double(m.aux_loss_coef), cap.c_str());
}

int moe_capacity(const MoeShape& m, int N) {
    const long long all = (long long)N * m.top_k;
    if (m.capacity_factor <= 0.0f) return int(all);
    // in double: capacity_factor * N * k / E exactly as written, then the ceiling
    const double c = std::ceil(double(m.capacity_factor) * double(N) * double(m.top_k) / double(m.num_experts));
    return int(std::min<double>(c, double(all)));
}

namespace {
// The rows of a plan whose count and place (each pair's place within its expert, -1 = dropped)
// are set: experts' rows in expert order.
void finish_rows(MoePlan& p, const int32_t* expert, const std::vector<int>& place, int E) {
    for (int e = 1; e < E; e++) p.offset[size_t(e)] = p.offset[size_t(e - 1)] + p.count[size_t(e - 1)];
    p.rows = p.offset[size_t(E - 1)] + p.count[size_t(E - 1)];
    for (size_t i = 0; i < place.size(); i++)
        if (place[i] >= 0) p.row_of[i] = p.offset[size_t(expert[i])] + place[i];
}
MoePlan empty_plan(size_t pairs, int E) {
    MoePlan p;
    p.row_of.assign(pairs, -1);
    p.count.assign(size_t(E), 0);
    p.offset.assign(size_t(E), 0);
    p.routed.assign(size_t(E), 0);
    return p;
}
}  // namespace

MoePlan moe_plan(const int32_t* expert, int N, int E, int k, int capacity) {
    MoePlan p = empty_plan(size_t(N) * k, E);
    std::vector<int> place(size_t(N) * k, -1);  // the pair's place within its expert
    for (size_t i = 0; i < size_t(N) * k; i++) {  // token order, then slot order
        const int e = expert[i];
        LLMC_ASSERT(e >= 0 && e < E, "moe_plan: expert index out of range");
        p.routed[size_t(e)]++;
        if (p.count[size_t(e)] < capacity) place[i] = p.count[size_t(e)]++;
        else p.dropped++;
    }
    finish_rows(p, expert, place, E);
    return p;
}

MoePlan moe_cp_plan(const int32_t* all, int B, int t, int cp, int r, int E, int k, int capacity, int valid) {
    LLMC_ASSERT(cp >= 1 && r >= 0 && r < cp && B >= 1 && t >= 1 && valid >= 1 && valid <= t * cp,
                "moe_cp_plan: bad arguments");
    const size_t nk = size_t(B) * t * k;  // one rank's pairs
    std::vector<SeqPositions> pos;
    for (int s = 0; s < cp; s++) pos.push_back(cp_positions(t, cp, s));
    // the pair (b, i, j) of rank s in the whole micro-batch's token order over its valid positions
    auto whole_pair = [&](int s, int b, int i, int j) {
        return (size_t(b) * valid + size_t(pos[size_t(s)].at(i))) * k + size_t(j);
    };
    std::vector<int32_t> counted(size_t(B) * valid * k);
    for (int s = 0; s < cp; s++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < t; i++) {
                if (pos[size_t(s)].at(i) >= valid) continue;  // padding
                for (int j = 0; j < k; j++)
                    counted[whole_pair(s, b, i, j)] = all[size_t(s) * nk + (size_t(b) * t + i) * k + j];
            }
    const MoePlan whole = moe_plan(counted.data(), B * valid, E, k, capacity);
    // rank r's pairs in its local order, kept where the whole plan keeps them (padding: no row)
    const int32_t* mine = all + size_t(r) * nk;
    MoePlan p = empty_plan(nk, E);
    p.routed = whole.routed;
    std::vector<int> place(nk, -1);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < t; i++) {
            if (pos[size_t(r)].at(i) >= valid) continue;
            for (int j = 0; j < k; j++) {
                const size_t li = (size_t(b) * t + i) * k + j;
                if (whole.row_of[whole_pair(r, b, i, j)] >= 0) place[li] = p.count[size_t(mine[li])]++;
                else p.dropped++;
            }
        }
    finish_rows(p, mine, place, E);
    return p;
}

std::vector<double> moe_prob_sums(const float* probs, int N, int E) {
    std::vector<double> P(size_t(E), 0.0);
    for (int n = 0; n < N; n++)  // token order, in double
        for (int e = 0; e < E; e++) P[size_t(e)] += probs[size_t(n) * E + e];
    return P;
}

double moe_aux_from_sums(const double* P, const int* routed, int N, int E, int k, std::vector<float>* daux) {
    double aux = 0.0;
    if (daux) daux->assign(size_t(E), 0.0f);
    for (int e = 0; e < E; e++) {
        const double f = double(routed[e]) / (double(N) * k);
        aux += f * (P[e] / N);
        if (daux) (*daux)[size_t(e)] = float(double(E) * f / N);
    }
    return double(E) * aux;
}

double moe_aux_loss(const float* probs, const MoePlan& plan, int N, int E, int k, std::vector<float>* daux) {
    return moe_aux_from_sums(moe_prob_sums(probs, N, E).data(), plan.routed.data(), N, E, k, daux);
}

MoeEpRoute moe_ep_route(const std::vector<int>& counts, int ep, int rank, int E) {
    LLMC_ASSERT(ep >= 1 && E % ep == 0 && rank >= 0 && rank < ep && counts.size() == size_t(ep) * E,
                "moe_ep_route: bad arguments");
    const int El = E / ep, e0 = rank * El;
    auto at = [&](int s, int e) { return size_t(counts[size_t(s) * E + size_t(e)]); };
    MoeEpRoute r;
    r.send.assign(size_t(ep), 0);
    r.recv.assign(size_t(ep), 0);
    r.count.assign(size_t(El), 0);
    r.offset.assign(size_t(El), 0);
    for (int j = 0; j < ep; j++)
        for (int el = 0; el < El; el++) {
            r.send[size_t(j)] += at(rank, j * El + el);
            r.recv[size_t(j)] += at(j, e0 + el);
            r.count[size_t(el)] += int(at(j, e0 + el));
        }
    for (int el = 1; el < El; el++) r.offset[size_t(el)] = r.offset[size_t(el - 1)] + r.count[size_t(el - 1)];
    size_t src = 0;
    std::vector<size_t> fill(r.offset.begin(), r.offset.end());  // next free row of each expert
    for (int s = 0; s < ep; s++)
        for (int el = 0; el < El; el++) {
            const size_t n = at(s, e0 + el);
            if (n) r.blocks.push_back({src, fill[size_t(el)], n});
            src += n;
            fill[size_t(el)] += n;
        }
    r.rows = src;
    return r;
}

size_t moe_ep_max_rows(const MoeShape& m, int N, int ep, int cp) {
    const size_t NK = size_t(N) * m.top_k;
    if (ep <= 1) return NK;
    return size_t(ep) * std::min(NK, size_t(m.num_experts / ep) * size_t(moe_capacity(m, N * cp)));
}
