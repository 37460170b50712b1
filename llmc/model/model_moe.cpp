// Model's MoE layers (model.moe): the forward and backward of an MoE layer, and expert
// parallelism's all-to-all of the permuted rows. The rest of Model is model.cpp's.
#include "llmc/model/model.h"
#include "llmc/model/model_acts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/comm/comm.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/model/moe.h"
#include "llmc/core/rng.h"
#include "llmc/parallel/tensor_parallel.h"

// An MoE layer (llmc/model/moe.h): route, permute the tokens into per-expert rows, run each expert's
// MLP on its rows, combine each token's slots weighted by the gates. The plan (rows per expert,
// drops) is made on the host from the router's choices: the expert loop needs the row counts.
// Tensor parallelism splits each expert like the dense MLP (fc column-parallel, the projection
// row-parallel, its bias added on TP rank 0): every rank routes the same gathered x with the
// replicated router alike, and out is this rank's partial sum, reduced by the caller.
// Context parallelism: the micro-batch's tokens are spread over the cp ranks, and capacity,
// drops and the load-balancing loss are the whole micro-batch's, as on one process: with a
// capacity the ranks all-gather their choices and each makes the whole plan, keeping its own
// pairs' decisions (moe_cp_plan); the loss's P and (dropless) routed counts are summed over cp.
// Every cp rank returns the whole aux term (the loss is averaged over the cp ranks, like each
// rank's mean cross-entropy); the statistics count each pair once (its rank) and each layer's
// aux once (cp rank 0).
float Model::moe_forward(int l, LayerActs& L, Tensor out, Tensor x, int b, int t, float dloss) {
    const MoeShape& m = shape.moe;
    const int C = shape.d_model, E = m.num_experts, K = m.top_k, N = b * t;
    const int cp = cp_->size(), Nall = N * cp;  // Nall: the micro-batch's tokens over the cp group
    const size_t NK = size_t(N) * K;
    Tensor logits = L.router_logits.slice(0, size_t(N) * E);
    ops.matmul_forward(logits, Tensor(), x, param(RouterW, l), Tensor(), N, C, E, false);
    ops.moe_router_forward(L.probs, L.expert, L.gate, logits, N, E, K);
    std::vector<int32_t> expert(NK);
    ops.to_host_bytes(expert.data(), L.expert, NK * sizeof(int32_t));
    const bool dropless = m.capacity_factor <= 0.0f;
    // a sampling window's padding (set_valid_tokens) takes no place
    const int valid = valid_tokens_ > 0 ? std::min(valid_tokens_, t * cp) : t * cp;
    LLMC_ASSERT(valid == t * cp || dloss == 0.0f, "MoE: padded sequences in a training forward");
    MoePlan plan;
    if (dropless || (cp == 1 && valid == t)) {  // decided here (dropless: nothing depends on other tokens)
        plan = moe_plan(expert.data(), N, E, K, moe_capacity(m, N));
    } else {  // every cp rank's choices (expert ids are exact in fp32), then the whole plan
        std::vector<float> sent(NK * size_t(cp));
        for (size_t i = 0; i < NK; i++) sent[size_t(cp_->rank()) * NK + i] = float(expert[i]);
        cp_->all_gather_host(sent.data(), NK);
        const std::vector<int32_t> all(sent.begin(), sent.end());
        plan = moe_cp_plan(all.data(), b, t, cp, cp_->rank(), E, K, moe_capacity(m, b * valid), valid);
    }
    ops.from_host_bytes(L.row_of, plan.row_of.data(), NK * sizeof(int32_t));
    if (layout.ep == 1) {
        L.count = plan.count;
        L.offset = plan.offset;
        ops.moe_permute(L.xperm, x, L.row_of, N, K, C);
        experts_forward(l, L, L.yperm, 0, L.count, L.offset);
    } else {  // every rank's rows per expert, then the rows to their experts' owners and back
        const int ep = layout.ep;
        std::vector<float> mine(plan.count.begin(), plan.count.end()), all(size_t(ep) * E);
        ep_stage_.run_host(mine.data(), mine.size(), all.data(), all.size(), [&](const float* in, float* out) {
            ep_->all_gather(in, out, std::vector<size_t>(size_t(ep), size_t(E)));
        });
        L.route = moe_ep_route(std::vector<int>(all.begin(), all.end()), ep, layout.ep_rank, E);
        L.count = L.route.count;
        L.offset = L.route.offset;
        Scratch& S = *scratch_;
        ops.moe_permute(S.erows, x, L.row_of, N, K, C);
        ep_dispatch(L.route, S.erows, L.xperm);
        experts_forward(l, L, S.erows, layout.experts_begin(E), L.count, L.offset);
        ep_return(L.route, S.erows, L.yperm);
    }
    ops.moe_combine(out, L.yperm, L.gate, L.row_of, N, K, C);
    L.daux.assign(size_t(E), 0.0f);
    if (dloss == 0.0f) return 0.0f;  // evaluation: no statistics, no gradient
    std::vector<float> probs(size_t(N) * E), daux;
    ops.to_host_bytes(probs.data(), L.probs, probs.size() * sizeof(float));
    std::vector<double> sums = moe_prob_sums(probs.data(), N, E);  // then (dropless) the routed counts
    if (cp > 1) {
        if (dropless) sums.insert(sums.end(), plan.routed.begin(), plan.routed.end());
        cp_->comm()->all_reduce(sums.data(), sums.size(), ReduceOp::Sum);  // host doubles on every Comm
        if (dropless)
            for (int e = 0; e < E; e++) plan.routed[size_t(e)] = int(sums[size_t(E + e)]);
    }
    const double aux = moe_aux_from_sums(sums.data(), plan.routed.data(), Nall, E, K, &daux);
    // the objective is dloss * (sum of token losses + N * coef * aux) for the micro-batch's N
    // tokens: N * coef * aux is its mean loss term weighted like its tokens (each rank's tokens'
    // share of it: d/dp[n, e] = dloss * coef * E f_e for every token)
    const double scale = double(m.aux_loss_coef) * double(dloss) * Nall;
    for (int e = 0; e < E; e++) L.daux[size_t(e)] = float(double(daux[size_t(e)]) * scale);
    if (recomputing_) return 0.0f;
    MoeStats& st = moe_stats_;
    if (cp_->rank() == 0) {
        st.aux_sum += aux;
        st.aux_terms++;
    }
    for (int e = 0; e < E; e++) {
        const double f = double(plan.routed[size_t(e)]) / (double(Nall) * K);
        st.load_min = std::min(st.load_min, f);
        st.load_max = std::max(st.load_max, f);
    }
    st.dropped += plan.dropped;  // this rank's pairs
    st.pairs += (long long)NK;
    return float(double(m.aux_loss_coef) * aux);
}

// dx (overwrite) from dy through the combine, the experts (their weight gradients accumulate
// row by row in token order), the router (the gates' and the load-balancing loss's gradients)
// and the permutation. With tensor parallelism dx is this rank's partial sum (the caller
// reduces it): the experts' column-parallel input gradients, plus the router's on TP rank 0;
// the gates' gradients (dot products with this rank's partial outputs) are summed over TP first,
// so every rank computes the same, whole router gradients.
void Model::moe_backward(int l, LayerActs& L, Tensor dx, Tensor dy, Tensor x, int N) {
    const MoeShape& m = shape.moe;
    const int C = shape.d_model, E = m.num_experts, K = m.top_k;
    Scratch& S = *scratch_;
    ops.moe_combine_backward(S.dperm, S.dgate, dy, L.yperm, L.gate, L.row_of, N, K, C);
    tp_->all_reduce(Tensor(S.dgate, size_t(N) * K, DType::F32));
    if (layout.ep == 1) {
        experts_backward(l, L, S.dperm, 0, L.count, L.offset);
    } else {  // the rows' output gradients to the experts' owners, their input gradients back
        ep_dispatch(L.route, S.dperm, S.erows);
        experts_backward(l, L, S.erows, layout.experts_begin(E), L.count, L.offset);
        ep_return(L.route, S.erows, S.dperm);
    }
    ops.from_host_bytes(S.daux, L.daux.data(), size_t(E) * sizeof(float));
    Tensor drouter = S.drouter.slice(0, size_t(N) * E);
    ops.moe_router_backward(drouter, S.dgate, S.daux, L.probs, L.expert, L.gate, N, E, K);
    const bool router_dx = tp_->rank() == 0;  // once in the TP group's sum
    if (!router_dx) ops.zero(dx);
    ops.matmul_backward(router_dx ? dx : Tensor(), grad(RouterW, l), Tensor(), drouter, x, param(RouterW, l), Tensor(),
                        N, C, E);
    ops.moe_permute_backward(dx, S.dperm, L.row_of, N, K, C);
}

void Model::experts_forward(int l, LayerActs& L, Tensor y, int e0, const std::vector<int>& count,
                            const std::vector<int>& offset) {
    const int C = shape.d_model, Fe = shape.moe.expert_ffn_dim / tp_size(), PRE = block_.swiglu ? 2 * Fe : Fe;
    const bool bias_here = block_.biases && tp_->rank() == 0;
    for (size_t i = 0; i < count.size(); i++) {
        const int e = e0 + int(i);
        const size_t n = size_t(count[i]), r0 = size_t(offset[i]);
        if (n == 0) continue;
        Tensor xin = L.xperm.slice(r0 * C, n * C), pre = L.fch_pre.slice(r0 * PRE, n * PRE);
        Tensor act = L.fch_gelu.slice(r0 * Fe, n * Fe), yr = y.slice(r0 * C, n * C);
        if (block_.swiglu) {
            ops.matmul_forward(pre, Tensor(), xin, param_span(GateW, UpW, l, e), Tensor(), int(n), C, 2 * Fe, false);
            ops.swiglu_forward(act, pre, int(n), Fe);
        } else {
            ops.matmul_forward(act, pre, xin, param(FcW, l, e), param(FcB, l, e), int(n), C, Fe, true);
        }
        ops.matmul_forward(yr, Tensor(), act, param(FcOutW, l, e), bias_here ? param(FcOutB, l, e) : Tensor(),
                           int(n), Fe, C, false);
    }
}

void Model::experts_backward(int l, LayerActs& L, Tensor dy, int e0, const std::vector<int>& count,
                             const std::vector<int>& offset) {
    const int C = shape.d_model, Fe = shape.moe.expert_ffn_dim / tp_size(), PRE = block_.swiglu ? 2 * Fe : Fe;
    Scratch& S = *scratch_;
    for (size_t i = 0; i < count.size(); i++) {
        const int e = e0 + int(i);
        const size_t n = size_t(count[i]), r0 = size_t(offset[i]);
        if (n == 0) continue;
        Tensor xin = L.xperm.slice(r0 * C, n * C), pre = L.fch_pre.slice(r0 * PRE, n * PRE);
        Tensor act = L.fch_gelu.slice(r0 * Fe, n * Fe), dperm = dy.slice(r0 * C, n * C);
        Tensor dact = S.dfch.slice(r0 * Fe, n * Fe);
        // (GELU: dact is the pre-activation's gradient, the GELU's backward in this GEMM, as the dense MLP's)
        ops.matmul_backward(dact, grad(FcOutW, l, e), block_.biases ? grad(FcOutB, l, e) : Tensor(), dperm, act,
                            param(FcOutW, l, e), Tensor(), int(n), Fe, C, block_.swiglu ? Tensor() : pre);
        if (block_.swiglu) {  // the rows' input gradients overwrite their output gradients, already used
            Tensor dpre = S.dpre.slice(r0 * PRE, n * PRE);
            ops.swiglu_backward(dpre, dact, pre, int(n), Fe);
            ops.matmul_backward(dperm, grad_span(GateW, UpW, l, e), Tensor(), dpre, xin, param_span(GateW, UpW, l, e),
                                Tensor(), int(n), C, 2 * Fe);
        } else {
            ops.matmul_backward(dperm, grad(FcW, l, e), grad(FcB, l, e), dact, xin, param(FcW, l, e), Tensor(), int(n),
                                C, Fe);
        }
    }
}

std::vector<size_t> Model::ep_words(const std::vector<size_t>& rows, DType dt) const {
    const size_t row_bytes = size_t(shape.d_model) * dtype_size(dt);
    LLMC_ASSERT(!ep_stage_.direct() || row_bytes % sizeof(float) == 0,
                "expert parallelism: a row of d_model elements must be whole 4-byte words (even d_model in bf16)");
    const size_t w = ep_stage_.words(Tensor(nullptr, size_t(shape.d_model), dt));  // a row's message words
    std::vector<size_t> out(rows);
    for (size_t& n : out) n *= w;
    return out;
}

// The rows travel as CommStage routes them: on a communicator that reads the backend's memory
// (NCCL; MPI over the CPU backend) the rows' own bytes from and into backend buffers, else fp32
// host copies. The rows of a block are contiguous on both sides, so each block is one copy.
void Model::ep_dispatch(const MoeEpRoute& route, Tensor local, Tensor experts) {
    const size_t C = size_t(shape.d_model);
    size_t sent = 0;
    for (size_t n : route.send) sent += n;
    CommStage::Message recv = ep_stage_.take_message(Tensor(nullptr, route.rows * C, local.dtype));
    const std::vector<size_t> sc = ep_words(route.send, local.dtype), rc = ep_words(route.recv, local.dtype);
    if (ep_stage_.direct()) {  // straight from the permuted rows
        ep_->all_to_all_v(static_cast<const float*>(local.ptr), sc, recv.data(), rc);
        const Tensor got(recv.dev.ptr, route.rows * C, local.dtype);
        for (const MoeEpRoute::Block& b : route.blocks) ops.copy(experts.slice(b.dst * C, b.n * C), got.slice(b.src * C, b.n * C));
    } else {
        CommStage::Message send = ep_stage_.take_message(Tensor(nullptr, sent * C, local.dtype));
        if (sent) ep_stage_.pack(send, local.slice(0, sent * C));
        ep_->all_to_all_v(send.data(), sc, recv.data(), rc);
        for (const MoeEpRoute::Block& b : route.blocks)
            ops.from_host_f32(experts.slice(b.dst * C, b.n * C), recv.host.data() + b.src * C);
        ep_stage_.release_message(std::move(send));
    }
    ep_stage_.release_message(std::move(recv));
}

void Model::ep_return(const MoeEpRoute& route, Tensor experts, Tensor local) {
    const size_t C = size_t(shape.d_model);
    size_t back = 0;
    for (size_t n : route.send) back += n;
    CommStage::Message send = ep_stage_.take_message(Tensor(nullptr, route.rows * C, local.dtype));
    const std::vector<size_t> sc = ep_words(route.recv, local.dtype), rc = ep_words(route.send, local.dtype);
    if (ep_stage_.direct()) {  // straight into the permuted rows
        const Tensor out(send.dev.ptr, route.rows * C, local.dtype);
        for (const MoeEpRoute::Block& b : route.blocks) ops.copy(out.slice(b.src * C, b.n * C), experts.slice(b.dst * C, b.n * C));
        ep_->all_to_all_v(send.data(), sc, static_cast<float*>(local.ptr), rc);
    } else {
        CommStage::Message recv = ep_stage_.take_message(Tensor(nullptr, back * C, local.dtype));
        for (const MoeEpRoute::Block& b : route.blocks)
            ops.to_host_f32(send.host.data() + b.src * C, experts.slice(b.dst * C, b.n * C));
        ep_->all_to_all_v(send.data(), sc, recv.data(), rc);
        if (back) ep_stage_.unpack(local.slice(0, back * C), recv);
        ep_stage_.release_message(std::move(recv));
    }
    ep_stage_.release_message(std::move(send));
}
