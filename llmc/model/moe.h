// Mixture of experts (model.moe): the routing decisions that run on the host, shared by every
// backend. The math on the tokens (router softmax/top-k, permutation, combine) is in Ops
// (llmc/backend/ops.h); this file decides where each routed (token, slot) goes and computes the
// load-balancing loss.
//
// Definitions (one MoE layer, one micro-batch of N tokens on one process, E experts, top-k):
//  - router: logits = x @ Wr^T (no bias), p[n,:] = softmax(logits[n,:]); the k experts of token
//    n are the k largest p[n,e] in descending order, ties broken by the lower index; slot j of
//    token n has gate g[n,j] = p[n,e_j] / sum_m p[n,e_m] (renormalised over the chosen k).
//  - capacity: capacity_factor 0 = dropless; else C = ceil(capacity_factor * N * k / E). The
//    (token, slot) pairs claim places in token order (n = 0..N-1, within a token slot order
//    j = 0..k-1); a pair whose expert already has C places is dropped: it contributes nothing
//    to the token's output (the token keeps its other slots; a token with every slot dropped
//    passes through the residual only). Gates are not renormalised after drops.
//  - rows: the kept pairs of expert e form rows [offset_e, offset_e + count_e) of the permuted
//    buffer, in token order; row_of[n*k + j] is the row of pair (n, j), -1 when dropped.
//  - load-balancing loss (Switch Transformer, with top-k): aux = E * sum_e f_e * P_e with
//    f_e = (pairs routed to e, before capacity drops) / (N * k), P_e = mean_n p[n,e]; 1 when the
//    load is uniform. For one layer this is transformers' Mixtral load_balancing_loss_func
//    divided by top_k. f is a constant of the routing (no gradient): d aux / d p[n,e] = E f_e / N.
//    The trained objective adds aux_loss_coef * aux for every MoE layer (a sum over layers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct MoeShape {
    int num_experts = 0;  // 0 = no MoE layers
    int top_k = 0;
    int expert_ffn_dim = 0;
    int every = 1;                // layers l with l % every == every - 1 are MoE (every 1: all, 2: 1, 3, 5, ...)
    float aux_loss_coef = 0.0f;
    float capacity_factor = 0.0f;  // 0 = dropless
    bool enabled() const { return num_experts > 0; }
    bool is_moe_layer(int l) const { return enabled() && l % every == every - 1; }
    // The same weights (the loss coefficient and the capacity are training settings, not the model's).
    bool operator==(const MoeShape& o) const {
        return num_experts == o.num_experts && top_k == o.top_k && expert_ffn_dim == o.expert_ffn_dim &&
               every == o.every;
    }
};

// One line for the logs: "mixture of experts: 4 experts, top-2, width 48, every 2nd layer (2 of 4), ..."
std::string moe_describe(const MoeShape& m, int n_layer);

// Places per expert for N tokens (N * k when dropless: nothing is dropped).
int moe_capacity(const MoeShape& m, int N);

struct MoePlan {
    std::vector<int32_t> row_of;  // [N * k]: the pair's row in the permuted buffer, -1 = dropped
    std::vector<int> count;       // [E] rows of each expert
    std::vector<int> offset;      // [E] first row of each expert
    std::vector<int> routed;      // [E] pairs routed to each expert before capacity
    int rows = 0;                 // kept pairs
    int dropped = 0;              // pairs past capacity
};
// expert [N * k]: the router's choices (host copy).
MoePlan moe_plan(const int32_t* expert, int N, int E, int k, int capacity);

// Context parallelism (parallel.cp, llmc/parallel/context_parallel.h): a micro-batch's B sequences of T
// tokens are spread over the cp ranks, rank s holding t = T / cp rows of each sequence (chunks s
// and 2cp-1-s). Capacity and drops are one process's: the plan over all N = B*T tokens in global
// token order (sequence, then position in it), capacity = moe_capacity(m, B*T). all: every cp
// rank's choices [cp][B*t*k], rank-major (the all-gather), each in that rank's local order.
// Returns rank r's plan: row_of, count, offset, rows and dropped for its own B*t tokens (the
// pairs the whole plan keeps, in rows by expert and local token order within an expert, as
// moe_plan orders them); routed for all N tokens (the load-balancing loss's f_e). cp 1: moe_plan.
// valid < T: positions >= valid of each sequence are padding (a sampling window padded to the
// split): their pairs take no place, count nowhere (neither routed nor dropped) and get no row,
// and the capacity is the caller's for B*valid tokens.
MoePlan moe_cp_plan(const int32_t* all, int B, int t, int cp, int r, int E, int k, int capacity, int valid);

// Expert parallelism (parallel.ep): the ep ranks of a group route their own tokens (the plan
// above, rank-local: capacity and drops do not depend on ep) and trade the kept rows. Rank j of
// the group holds experts [j E/ep, (j+1) E/ep), whose rows in a local plan are contiguous (plans
// order rows by expert), so dispatch sends each owner one block; the owner receives the blocks
// source by source (source-major) and runs each of its experts over its rows from source 0, 1,
// ... (expert-major); the combine sends every row back the same way reversed.
struct MoeEpRoute {
    std::vector<size_t> send, recv;  // rows to / from each rank of the group (dispatch)
    struct Block {
        size_t src, dst, n;  // n rows of (source, expert): at src in the source-major buffer, dst in the expert-major one
    };
    std::vector<Block> blocks;
    std::vector<int> count, offset;  // [E/ep] rows of each of this rank's experts (expert-major)
    size_t rows = 0;                 // rows received (the experts' rows)
};
// counts: [ep x E] every rank's MoePlan::count, rank-major; rank: this rank in the group.
MoeEpRoute moe_ep_route(const std::vector<int>& counts, int ep, int rank, int E);
// The most rows a rank's experts receive for N tokens per rank: each source sends at most all its
// kept pairs (N k) and at most capacity rows per expert, the capacity of the micro-batch's N cp
// tokens under context parallelism (moe_cp_plan).
size_t moe_ep_max_rows(const MoeShape& m, int N, int ep, int cp = 1);

// The load-balancing loss of one layer from the router's probabilities p [N, E] (host copy)
// and the plan; daux[e] = d aux / d p[n, e] (the same for every n).
double moe_aux_loss(const float* probs, const MoePlan& plan, int N, int E, int k, std::vector<float>* daux);
// Its two halves, for tokens spread over ranks (context parallelism): P[e] = sum_n p[n, e] over
// this rank's N tokens (in double, token order); the loss from P and routed summed over all N
// tokens of the micro-batch (P_e = P[e] / N, f_e = routed[e] / (N k)).
std::vector<double> moe_prob_sums(const float* probs, int N, int E);
double moe_aux_from_sums(const double* P, const int* routed, int N, int E, int k, std::vector<float>* daux);
