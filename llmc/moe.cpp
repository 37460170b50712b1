#include "llmc/moe.h"

#include <algorithm>
#include <cmath>

#include "llmc/common.h"

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

MoePlan moe_plan(const int32_t* expert, int N, int E, int k, int capacity) {
    MoePlan p;
    p.row_of.assign(size_t(N) * k, -1);
    p.count.assign(size_t(E), 0);
    p.offset.assign(size_t(E), 0);
    p.routed.assign(size_t(E), 0);
    std::vector<int> place(size_t(N) * k, -1);  // the pair's place within its expert
    for (size_t i = 0; i < size_t(N) * k; i++) {  // token order, then slot order
        const int e = expert[i];
        LLMC_ASSERT(e >= 0 && e < E, "moe_plan: expert index out of range");
        p.routed[size_t(e)]++;
        if (p.count[size_t(e)] < capacity) place[i] = p.count[size_t(e)]++;
        else p.dropped++;
    }
    for (int e = 1; e < E; e++) p.offset[size_t(e)] = p.offset[size_t(e - 1)] + p.count[size_t(e - 1)];
    p.rows = p.offset[size_t(E - 1)] + p.count[size_t(E - 1)];
    for (size_t i = 0; i < size_t(N) * k; i++)
        if (place[i] >= 0) p.row_of[i] = p.offset[size_t(expert[i])] + place[i];
    return p;
}

double moe_aux_loss(const float* probs, const MoePlan& plan, int N, int E, int k, std::vector<float>* daux) {
    std::vector<double> P(size_t(E), 0.0);
    for (int n = 0; n < N; n++)  // token order, in double
        for (int e = 0; e < E; e++) P[size_t(e)] += probs[size_t(n) * E + e];
    double aux = 0.0;
    if (daux) daux->assign(size_t(E), 0.0f);
    for (int e = 0; e < E; e++) {
        const double f = double(plan.routed[size_t(e)]) / (double(N) * k);
        aux += f * (P[size_t(e)] / N);
        if (daux) (*daux)[size_t(e)] = float(double(E) * f / N);
    }
    return double(E) * aux;
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

size_t moe_ep_max_rows(const MoeShape& m, int N, int ep) {
    const size_t NK = size_t(N) * m.top_k;
    if (ep <= 1) return NK;
    return size_t(ep) * std::min(NK, size_t(m.num_experts / ep) * size_t(moe_capacity(m, N)));
}
