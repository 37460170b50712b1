#include "llmc/plan/step_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>

#include "llmc/core/common.h"
#include "llmc/train/layout.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/powersgd.h"
#include "llmc/run/mfu.h"
#include "llmc/model/model.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/pipeline_schedule.h"

using nlohmann::json;

namespace {
struct DeviceRow {
    const char* name;         // plan.gpu
    const char* reported;     // the name the GPU reports (its peaks come from llmc/run/mfu.cpp's table)
    double hbm_gb_s;          // HBM bandwidth, GB/s (datasheet)
    double mem_mib;           // memory as nvidia-smi reports it, MiB
    double nvlink_gb_s;       // NVLink per GPU, one direction, GB/s
    double ib_gb_s;           // InfiniBand per GPU (one NIC per GPU in a DGX/HGX node), GB/s
    double nvlink_latency_us, ib_latency_us;  // per ring step, NCCL's order of magnitude
};
// Datasheets: A100 SXM4 40/80 GB (NVLink 3: 600 GB/s both ways; DGX A100: 8 x HDR 200 Gb/s), H100
// SXM5 (NVLink 4: 900 GB/s both ways; DGX H100: 8 x NDR 400 Gb/s), H200 SXM (H100's links).
const DeviceRow kDevices[] = {
    {"h100", "NVIDIA H100 80GB HBM3", 3350, 81559, 450, 50, 1, 5},
    {"h200", "NVIDIA H200", 4800, 143771, 450, 50, 1, 5},
    {"a100-80", "NVIDIA A100-SXM4-80GB", 2039, 81920, 300, 25, 1, 5},
    {"a100-40", "NVIDIA A100-SXM4-40GB", 1555, 40960, 300, 25, 1, 5},
};

// A group of n ranks whose members are `stride` world ranks apart: inside one node when its
// whole span fits one (ranks fill nodes in order).
bool intra_node(int stride, int n, int gpus_per_node) { return double(stride) * n <= gpus_per_node; }

struct Link {
    double bytes_s, latency_s;
};
// A ring over nodes crosses each node's boundary once per channel; NCCL runs a channel per NIC,
// so a group with k members in each node moves min(NVLink, k x InfiniBand) per member.
Link link_of(const DeviceSpec& d, int stride, int n) {
    if (intra_node(stride, n, d.gpus_per_node)) return {d.nvlink_bytes_s, d.nvlink_latency_s};
    const int per_node = std::max(1, d.gpus_per_node / stride);
    return {std::min(d.nvlink_bytes_s, per_node * d.ib_bytes_s), d.ib_latency_s};
}

// The parameters outside the layers (embeddings, head, final norm) and, per layer on average
// (MoE layers are every model.moe.every-th), all of them, those a token runs through (top_k of an
// MoE layer's experts: flops_per_token's count) and the experts'; without the vocabulary padding.
struct LayerParams {
    double rest = 0, all = 0, active = 0, experts = 0;
    double held(int ep) const { return all - experts + experts / ep; }  // a rank's share: E/ep experts
};
LayerParams layer_params(const ModelShape& s) {
    ModelShape one = s, two = s;
    one.moe.num_experts = two.moe.num_experts = 0;  // dense: the layers alike, the rest unchanged
    one.n_layer = 1, two.n_layer = 2;
    LayerParams p;
    p.rest = 2.0 * double(num_params_unpadded(one)) - double(num_params_unpadded(two));
    p.experts = double(num_expert_params(s)) / s.n_layer;
    p.all = (double(num_params_unpadded(s)) - p.rest) / s.n_layer;
    p.active = s.moe.enabled() ? p.all - p.experts * double(s.moe.num_experts - s.moe.top_k) / s.moe.num_experts : p.all;
    return p;
}
}  // namespace

std::vector<std::string> plan_gpu_names() {
    std::vector<std::string> out;
    for (const DeviceRow& r : kDevices) out.push_back(r.name);
    return out;
}

DeviceSpec plan_device(const Config& cfg) {
    const PlanConfig& p = cfg.plan;
    const DeviceRow* row = nullptr;
    for (const DeviceRow& r : kDevices)
        if (p.gpu == r.name) row = &r;
    LLMC_ASSERT(row, "plan.gpu is validated against plan_gpu_names()");
    DeviceSpec d;
    d.name = row->name;
    const double peak = gpu_peak_flops(row->reported, cfg.precision);
    if (p.peak_tflops == 0 && peak == 0)
        throw UserError(strfmt("plan.gpu: \"%s\" has no %s peak in the device table (set plan.peak_tflops)",
                               row->name, cfg.precision.c_str()));
    d.peak_flops = p.peak_tflops > 0 ? p.peak_tflops * 1e12 : peak;
    d.efficiency = p.efficiency;
    d.hbm_bytes_s = (p.hbm_gb_s > 0 ? p.hbm_gb_s : row->hbm_gb_s) * 1e9;
    d.mem_bytes = p.gpu_mem_gib > 0 ? p.gpu_mem_gib * double(1ull << 30) : row->mem_mib * double(1 << 20);
    d.nvlink_bytes_s = (p.nvlink_gb_s > 0 ? p.nvlink_gb_s : row->nvlink_gb_s) * 1e9;
    d.ib_bytes_s = (p.ib_gb_s > 0 ? p.ib_gb_s : row->ib_gb_s) * 1e9;
    d.nvlink_latency_s = (p.nvlink_latency_us > 0 ? p.nvlink_latency_us : row->nvlink_latency_us) * 1e-6;
    d.ib_latency_s = (p.ib_latency_us > 0 ? p.ib_latency_us : row->ib_latency_us) * 1e-6;
    d.gpus_per_node = p.gpus_per_node;
    return d;
}

double ring_all_reduce_s(double bytes, int n, double bytes_s, double latency_s) {
    if (n <= 1) return 0.0;
    return 2.0 * (n - 1) / n * bytes / bytes_s + 2.0 * (n - 1) * latency_s;
}
double ring_gather_s(double bytes, int n, double bytes_s, double latency_s) {
    if (n <= 1) return 0.0;
    return double(n - 1) / n * bytes / bytes_s + double(n - 1) * latency_s;
}

StageCost stage_cost(const Config& cfg, const ModelShape& s, const DeviceSpec& d, int tp, int cp, int ep) {
    const double dt = dtype_size(run_dtype(cfg.precision, cfg.device == "cpu" ? "cpu" : "cuda"));
    // one micro-batch's tokens on this rank: a cp rank holds seq_len / cp of each sequence (and
    // attends them to all seq_len keys: 12 C T per token below still holds)
    const double tokens = double(cfg.train.micro_batch) * cfg.train.seq_len / cp;
    const double C = s.d_model, T = cfg.train.seq_len, flops_s = d.peak_flops * d.efficiency;
    const LayerParams lp = layer_params(s);
    const double p_layer = lp.active;
    // per token: forward 2 P + 4 C T (scores and their use), backward twice that
    double layer_flops = 6.0 * p_layer + 12.0 * C * T;
    int tp_collectives = 4;  // two all-reduces (or all-gather + reduce-scatter pairs) forward, two backward
    const Recompute rc = parse_recompute(cfg.train.recompute);
    if (rc == Recompute::Full) layer_flops += 2.0 * p_layer + 4.0 * C * T, tp_collectives += 2;
    if (rc == Recompute::Selective) {  // the attention core; a dense GELU MLP's first linear (Model::layer_backward)
        int dense = 0;
        for (int l = 0; l < s.n_layer; l++) dense += !s.moe.is_moe_layer(l);
        const double gelu_fc = s.arch == Arch::Llama ? 0.0 : 2.0 * C * s.ffn() * dense / std::max(1, s.n_layer);
        layer_flops += 4.0 * C * T + gelu_fc;
    }
    const Link tpl = link_of(d, 1, tp);
    const double act = tokens * C * dt;  // one activation of the whole micro-batch
    // context parallelism's ring (llmc/parallel/context_parallel.h), not overlapped: per layer cp - 1 passes
    // of a K/V block forward (again with full recompute), and backward cp - 1 passes of the block
    // with its dK/dV and one more of the dK/dV; a block carries whole QKV rows of this TP rank
    const Link cpl = link_of(d, tp, cp);
    const double block = tokens * (s.n_head + 2.0 * s.kv_heads()) * (C / s.n_head) / tp * dt;
    const double passes = cp > 1 ? (cp - 1) * (rc == Recompute::Full ? 4.0 : 3.0) + 1.0 : 0.0;
    const double ring = passes * (block / cpl.bytes_s + cpl.latency_s);
    // expert parallelism's all-to-all (llmc/model/moe.h), not overlapped: per MoE layer the k rows of
    // every token (whole d_model rows on each TP rank) go to their experts' owners and back,
    // dispatch and combine forward (again with full recompute), their gradients backward; (ep -
    // 1)/ep of the rows leave the rank, a message to each other member. ep consecutive dp x cp
    // ranks: tp apart. Averaged over the layers like the parameters.
    const Link epl = link_of(d, tp, ep);
    const double rows = tokens * s.moe.top_k * C * dt * (ep - 1) / ep;
    const double moe_layers = s.moe.enabled() ? double(s.n_layer / s.moe.every) / s.n_layer : 0.0;
    const double a2a = ep > 1 ? moe_layers * (rc == Recompute::Full ? 6.0 : 4.0) *
                                    (rows / epl.bytes_s + (ep - 1) * epl.latency_s)
                              : 0.0;
    StageCost c;
    c.layer = {tokens * layer_flops / tp / flops_s,
               tp_collectives * ring_all_reduce_s(act, tp, tpl.bytes_s, tpl.latency_s) + ring + a2a};
    // the embedding: gather rows forward, scatter-add the gradient backward (HBM-bound), and the
    // vocabulary-parallel lookup's all-reduce
    c.embedding = {4.0 * act / d.hbm_bytes_s, ring_all_reduce_s(act, tp, tpl.bytes_s, tpl.latency_s)};
    // the head: its GEMM forward and backward, the loss pass over the logits (HBM-bound: written,
    // read by the softmax, its gradient written and read), the vocabulary-parallel loss's
    // all-reduces (3 floats per token) and the input's gradient all-reduce
    const double vocab_local = s.vocab_shard(tp);
    c.head = {tokens * 6.0 * vocab_local * C / flops_s + 4.0 * tokens * vocab_local * dt / d.hbm_bytes_s,
              ring_all_reduce_s(act, tp, tpl.bytes_s, tpl.latency_s) +
                  3 * ring_all_reduce_s(tokens * 4.0, tp, tpl.bytes_s, tpl.latency_s)};
    return c;
}

std::vector<int> balance_pp_layers(const Config& cfg, const ModelShape& shape) {
    const ParallelConfig& pc = cfg.parallel;
    const int stages = pc.pp * pc.pp_virtual;
    if (shape.n_layer < stages)
        throw UserError(strfmt("parallel.pp_layers: \"auto\" needs at least one layer per stage: model.n_layer = %d is "
                               "fewer than parallel.pp x parallel.pp_virtual = %d",
                               shape.n_layer, stages));
    if (stages == 1) return {shape.n_layer};
    const StageCost c = stage_cost(cfg, shape, plan_device(cfg), pc.tp, pc.cp, pc.ep);
    std::vector<int> n(size_t(stages), 1);
    auto cost = [&](int st, int layers) { return c.stage(st, stages, layers).total(); };
    // water-filling: each further layer goes to the stage it leaves cheapest (the earliest on a tie),
    // which minimises the most expensive stage for layers of equal cost. A heap of (cost of one more
    // layer, stage) makes the same choices in O(n_layer log stages) (--plan=search balances many
    // layouts of models with thousands of layers)
    using Next = std::pair<double, int>;
    std::priority_queue<Next, std::vector<Next>, std::greater<Next>> next;
    for (int st = 0; st < stages; st++) next.push({cost(st, 2), st});
    for (int left = shape.n_layer - stages; left > 0; left--) {
        const int best = next.top().second;
        next.pop();
        n[size_t(best)]++;
        next.push({cost(best, n[size_t(best)] + 1), best});
    }
    return n;
}

double powersgd_ratio(const ModelShape& s, const ParallelConfig& pc) {
    const ParamLayout params = param_layout(s, model_layout(s, pc, 0, 0), DataParallel::pad_multiple(1));
    return powersgd_plan(params, pc.powersgd_rank).ratio();
}

StepTime estimate_step(const Config& cfg, const ModelShape& s, const ProcessGrid& g, DType dtype) {
    const ParallelConfig& pc = cfg.parallel;
    const DeviceSpec d = plan_device(cfg);
    const StageCost c = stage_cost(cfg, s, d, g.tp, g.cp, g.ep);
    const double dt = dtype_size(dtype), m = cfg.train.grad_accum;
    const double tokens = double(cfg.train.micro_batch) * cfg.train.seq_len;  // of each DP rank's sequences
    const bool sp = pc.sequence_parallel && g.tp > 1;
    const int v = pc.pp_virtual, stages = g.pp * v;
    // gradients are reduced (and ZeRO shards) over the dp x cp group: cp is the faster axis
    const Link ppl = link_of(d, g.tp * g.cp * g.dp, g.pp), dpl = link_of(d, g.tp, g.dp * g.cp);
    const double local = tokens / g.cp;  // the tokens a stage's output holds on one cp rank
    const double msg = (sp ? local / g.tp : local) * s.d_model * dt;
    const double send = msg / ppl.bytes_s + ppl.latency_s;

    StepTime t;
    const auto ranges = pp_layer_split(s.n_layer, g.pp, v, pc.pp_layers);
    std::vector<Cost> rank(size_t(g.pp));
    std::vector<double> p2p(size_t(g.pp));
    int slow = 0;
    for (int p = 0; p < g.pp; p++) {
        for (int ch = 0; ch < v; ch++) {
            const int vs = pp_virtual_stage(p, ch, g.pp);
            const Cost sc = c.stage(vs, stages, ranges[size_t(vs)].second - ranges[size_t(vs)].first);
            rank[size_t(p)].compute += sc.compute, rank[size_t(p)].tp_comm += sc.tp_comm;
            p2p[size_t(p)] += (vs < stages - 1 ? send : 0) + (vs > 0 ? send : 0);  // forward and backward sends
        }
        if (cfg.plan.tp_overlap)  // the collectives run beside the GEMMs: only what outlasts them shows
            rank[size_t(p)].tp_comm = std::max(0.0, rank[size_t(p)].tp_comm - rank[size_t(p)].compute);
        t.rank_seconds.push_back(rank[size_t(p)].total() + p2p[size_t(p)]);
        if (t.rank_seconds.back() > t.rank_seconds[size_t(slow)]) slow = p;
    }
    double sum = 0;
    for (double x : t.rank_seconds) sum += x;
    t.compute = m * rank[size_t(slow)].compute;
    t.tp_comm = m * rank[size_t(slow)].tp_comm;
    t.pp_comm = m * p2p[size_t(slow)];
    t.bubble = (sum - t.rank_seconds[size_t(slow)]) / v;  // (p - 1) x t / v when balanced

    // data parallelism over the rank with the most parameters (the embedding and the head counted
    // on whichever rank holds them: an estimate, the memory plan has the exact count)
    // (under expert parallelism a rank holds E/ep of each MoE layer's experts)
    const LayerParams lp = layer_params(s);
    const double p_layer = lp.held(g.ep), p_rest = lp.rest;
    double most = 0;
    int most_layers = 0;
    for (int p = 0; p < g.pp; p++) {
        int layers = 0;
        for (int ch = 0; ch < v; ch++) {
            const auto& r = ranges[size_t(pp_virtual_stage(p, ch, g.pp))];
            layers += r.second - r.first;
        }
        const double extra = g.pp == 1 ? p_rest : (p == 0 || p == g.pp - 1) ? p_rest / 2 : 0.0;
        most = std::max(most, (layers * p_layer + extra) / g.tp);
        most_layers = std::max(most_layers, layers);
    }
    const double grads = most * dt;
    const double bwd = 2.0 / 3.0 * rank[size_t(slow)].compute;  // one micro-batch's backward
    const double fwd = bwd / 2;
    const int n = g.dp * g.cp;
    const bool local_sgd = pc.local_sgd.every > 0;
    double dp_exposed = 0;
    if (n > 1) {
        // every bucket (ZeRO 0-1) or unit (ZeRO 2-3) is a collective of its own: a ring latency each
        const double buckets = std::max(1.0, std::ceil(most * 4.0 / (pc.bucket_mb * (1 << 20))));
        const double units = most_layers + 2;
        const double lat = (n - 1) * dpl.latency_s;
        const double ar = ring_all_reduce_s(grads, n, dpl.bytes_s, 0) + 2 * lat * buckets;
        const double rs = ring_gather_s(grads, n, dpl.bytes_s, 0), ag = rs;  // the whole rank's
        const auto hidden = [](double comm, double window) { return std::max(0.0, comm - window); };
        if (pc.zero == 0) dp_exposed = hidden(ar, bwd);
        if (pc.zero == 1) dp_exposed = hidden(rs + lat * buckets, bwd) + hidden(ag + lat * buckets, fwd);
        if (pc.zero == 2) dp_exposed = m * hidden(rs + lat * units, bwd) + hidden(ag + lat * units, fwd);
        if (pc.zero == 3) dp_exposed = m * hidden(2 * ag + rs + 3 * lat * units, fwd + bwd);
        // local SGD: no gradient collective in a step; every H steps, after the update (nothing to
        // hide behind), the replicas' fp32 weights are summed: an all-reduce (ZeRO-0) or a
        // reduce-scatter and an all-gather (ZeRO-1), in pieces of a bucket
        if (local_sgd) {
            const double w = ring_all_reduce_s(most * 4.0, n, dpl.bytes_s, 0);
            dp_exposed = (w + 2 * lat * buckets) / pc.local_sgd.every;
        }
        // PowerSGD: after the backward (nothing to hide behind), two fp32 all-reduces, the plain
        // elements with every P, then every Q: the plain all-reduce's bytes over the compression ratio
        if (pc.grad_compression == "powersgd") {
            const double ratio = powersgd_ratio(s, pc);
            dp_exposed = ring_all_reduce_s(most * 4.0 / ratio, n, dpl.bytes_s, 0) + 2 * 2 * lat;
        }
    }
    t.dp_comm = dp_exposed;
    // the update: optimizer state (moments, master or fp32 parameters) read and written, the
    // gradient read, a bf16 parameter written
    const bool master = AdamW::keeps_master(dtype);
    const double shard = pc.zero >= 1 && !local_sgd ? most / n : most;  // local SGD: the whole replica's
    t.optimizer = shard * (2.0 * 12.0 + dt + (master ? dt : 0.0)) / d.hbm_bytes_s;

    t.total = t.compute + t.tp_comm + t.pp_comm + t.bubble + t.dp_comm + t.optimizer;
    const double step_tokens = tokens * m * g.dp;
    t.tokens_per_s = step_tokens / t.total;
    t.mfu = flops_per_token(s, cfg.train.seq_len) * step_tokens / (t.total * g.world * d.peak_flops);
    return t;
}

json step_json(const StepTime& t) {
    return {{"total_s", t.total},        {"compute_s", t.compute},   {"tp_comm_s", t.tp_comm},
            {"pp_comm_s", t.pp_comm},    {"dp_comm_s", t.dp_comm},   {"bubble_s", t.bubble},
            {"optimizer_s", t.optimizer}, {"exposed_comm_s", t.exposed_comm()},
            {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu}, {"rank_micro_batch_s", t.rank_seconds}};
}
