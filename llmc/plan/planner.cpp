#include "llmc/plan/planner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <map>
#include <tuple>

#include "llmc/train/layout.h"
#include "llmc/run/mfu.h"
#include "llmc/model/model.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/pipeline_schedule.h"

using nlohmann::json;

int plan_world(const Config& cfg) {
    const ParallelConfig& pc = cfg.parallel;
    if (cfg.plan.world > 0) return cfg.plan.world;
    return pc.dp > 0 ? pc.dp * pc.cp * pc.tp * pc.pp : 1;
}

namespace {
PpSchedule schedule_of(const Config& cfg, const ProcessGrid& grid) {
    return make_pipeline_schedule(parse_pp_schedule(cfg.parallel.pp_schedule), grid.pp, cfg.train.grad_accum,
                                  cfg.parallel.pp_virtual);
}

std::vector<int> slots_of(const Config& cfg, const ProcessGrid& grid, int pp_rank) {
    return pipeline_slots(schedule_of(cfg, grid)[size_t(pp_rank)], cfg.parallel.pp_virtual);
}

// The categories in the memory table's order.
struct Category {
    const char* key;   // JSON
    const char* name;  // text
    size_t MemoryPlan::*bytes;
};
const Category kCategories[] = {
    {"params", "parameters", &MemoryPlan::params},
    {"grads", "gradients", &MemoryPlan::grads},
    {"optimizer", "optimizer", &MemoryPlan::optimizer},
    {"comm_buffers", "comm buffers", &MemoryPlan::comm_buffers},
    {"unit_params", "unit params", &MemoryPlan::unit_params},
    {"unit_grads", "unit grads", &MemoryPlan::unit_grads},
    {"activations", "activations", &MemoryPlan::activations},
    {"host", "host memory", &MemoryPlan::host},  // last: not in the total
};

bool same_bytes(const MemoryPlan& a, const MemoryPlan& b) {
    for (const Category& c : kCategories)
        if (a.*c.bytes != b.*c.bytes) return false;
    return true;
}

const char* stage_role(int pp_rank, int pp) {
    if (pp == 1) return "the only stage";
    return pp_rank == 0 ? "first stage" : pp_rank == pp - 1 ? "last stage" : "middle stage";
}
}  // namespace

namespace {
// What a rank's memory is built from, before the ZeRO stage and the recomputation pick from it.
struct RankParts {
    ModelLayout layout;
    size_t padded = 0;  // parameter elements, padded for the DP shards
    UnitSizes units;
    size_t ep_optimizer = 0;  // expert parallelism, ZeRO >= 1: the most optimizer elements of a rank (0 without)
};
RankParts rank_parts(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, int pp_rank, int tp_rank) {
    RankParts r;
    r.layout = model_layout(shape, cfg.parallel, tp_rank, pp_rank);
    const ParamLayout params = param_layout(shape, r.layout, DataParallel::pad_multiple(grid.shard_size()));
    r.padded = params.padded_params;
    r.units = unit_sizes(params.units);
    // every ep rank's layout has its experts at the same offsets: the ownership is the same
    // function of each (zero_optimizer_runs)
    if (grid.ep > 1) r.ep_optimizer = zero_optimizer_most(params, grid.edp(), grid.ep);
    return r;
}
// slots: the rank's in-flight micro-batches per chunk (slots_of). Activation offload (with full
// recompute only) moves the kept layer inputs to the host row. Under local SGD every rank keeps
// its whole replica and inner optimizer whatever the ZeRO stage (which shards only the outer
// state, in host memory: llmc/train/local_sgd.h).
MemoryPlan memory_of(const RankParts& r, const Config& cfg, const ModelShape& shape, const ProcessGrid& grid,
                     DType dtype, const std::vector<int>& slots, int zero, Recompute rc) {
    if (cfg.parallel.local_sgd.every > 0) zero = 0;
    const bool offload = cfg.train.offload_activations && rc == Recompute::Full;
    const int b = cfg.train.micro_batch, t = cfg.train.seq_len / grid.cp;
    const size_t activations =
        Model::activation_bytes_of(shape, dtype, b, t, r.layout, slots, rc, offload, cfg.precision == "fp8");
    // (the CPU's fp16 emulation keeps master weights beside its fp32 parameters, Ops::emulates_fp16)
    const bool master = AdamW::keeps_master(dtype) || cfg.precision == "fp16";
    MemoryPlan m = zero_memory_plan(r.padded, grid.shard_size(), zero, dtype_size(dtype), master,
                                    DataParallel::bucket_elems_for(cfg.parallel.bucket_mb, r.padded), activations,
                                    r.units, cfg.train.offload_optimizer, r.ep_optimizer);
    if (offload) m.host += Model::activation_host_bytes_of(shape, dtype, b, t, r.layout, slots);
    return m;
}
MemoryPlan rank_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype, int pp_rank,
                       int tp_rank, const std::vector<int>& slots) {
    return memory_of(rank_parts(cfg, shape, grid, pp_rank, tp_rank), cfg, shape, grid, dtype, slots, cfg.parallel.zero,
                     parse_recompute(cfg.train.recompute));
}
}  // namespace

MemoryPlan plan_rank_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype,
                            int pp_rank, int tp_rank) {
    return rank_memory(cfg, shape, grid, dtype, pp_rank, tp_rank, slots_of(cfg, grid, pp_rank));
}

std::vector<RankMemory> plan_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    const PpSchedule schedule = schedule_of(cfg, grid);  // once: it holds every rank's actions
    std::vector<RankMemory> out;
    for (int p = 0; p < grid.pp; p++) {
        const std::vector<int> slots = pipeline_slots(schedule[size_t(p)], cfg.parallel.pp_virtual);
        for (int t = 0; t < grid.tp; t++) out.push_back({p, t, rank_memory(cfg, shape, grid, dtype, p, t, slots)});
    }
    return out;
}

json memory_json(const std::vector<RankMemory>& ranks) {
    std::vector<std::vector<const RankMemory*>> kinds;
    for (const RankMemory& r : ranks) {
        auto it = kinds.begin();
        while (it != kinds.end() && !same_bytes((*it)[0]->mem, r.mem)) ++it;
        if (it == kinds.end()) kinds.push_back({&r});
        else it->push_back(&r);
    }
    json out = json::array();
    for (const auto& kind : kinds) {
        json k = {{"ranks", json::array()}};
        for (const RankMemory* r : kind) k["ranks"].push_back({r->pp_rank, r->tp_rank});
        for (const Category& c : kCategories) k[c.key] = kind[0]->mem.*c.bytes;
        k["total"] = kind[0]->mem.total();
        out.push_back(k);
    }
    return out;
}

json gather_memory_json(const MemoryPlan& mine, Comm& mp, int tp, int ep, Comm* edp) {
    const size_t n = sizeof(kCategories) / sizeof(kCategories[0]);
    std::vector<double> own(n);  // byte counts are exact in doubles below 2^53
    for (size_t c = 0; c < n; c++) own[c] = double(mine.*kCategories[c].bytes);
    if (edp && edp->size() > 1) edp->all_reduce(own.data(), n, ReduceOp::Max);
    std::vector<double> all(size_t(mp.size()) * n, 0.0);
    std::copy(own.begin(), own.end(), all.begin() + long(size_t(mp.rank()) * n));
    mp.all_reduce(all.data(), all.size(), ReduceOp::Sum);
    // member i: tp_rank i % tp, ep_rank i / tp % ep, pp_rank i / (tp ep); the ep ranks of a (pp, tp)
    // position are listed once, with the largest of each category
    std::vector<RankMemory> ranks(size_t(mp.size() / ep));  // pp-major, then tp
    for (size_t i = 0; i < size_t(mp.size()); i++) {
        RankMemory& r = ranks[size_t(int(i) / (tp * ep) * tp + int(i) % tp)];
        r.pp_rank = int(i) / (tp * ep);
        r.tp_rank = int(i) % tp;
        for (size_t c = 0; c < n; c++) {
            size_t& b = r.mem.*kCategories[c].bytes;
            b = std::max(b, size_t(all[i * n + c]));
        }
    }
    return memory_json(ranks);
}

double tokens_per_step(const Config& cfg, const ProcessGrid& grid) {
    return double(cfg.train.micro_batch) * cfg.train.seq_len * cfg.train.grad_accum * grid.dp;
}

namespace {
// Layers of each virtual pipeline stage, in order.
std::vector<int> stage_layers(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid) {
    std::vector<int> out;
    for (const auto& r : pp_layer_split(shape.n_layer, grid.pp, cfg.parallel.pp_virtual, cfg.parallel.pp_layers))
        out.push_back(r.second - r.first);
    return out;
}

json device_json(const DeviceSpec& d) {
    return {{"gpu", d.name},
            {"peak_tflops", d.peak_flops / 1e12},
            {"efficiency", d.efficiency},
            {"hbm_gb_s", d.hbm_bytes_s / 1e9},
            {"gpu_mem_gib", d.mem_bytes / double(1ull << 30)},
            {"gpus_per_node", d.gpus_per_node},
            {"nvlink_gb_s", d.nvlink_bytes_s / 1e9},
            {"nvlink_latency_us", d.nvlink_latency_s * 1e6},
            {"ib_gb_s", d.ib_bytes_s / 1e9},
            {"ib_latency_us", d.ib_latency_s * 1e6}};
}

std::string int_list_text(const std::vector<int>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += strfmt("%s%d", i ? ", " : "", v[i]);
    return s + "]";
}
}  // namespace

void check_plannable(const Config& cfg, const ModelShape& shape) {
    const ParallelConfig& pc = cfg.parallel;
    const TrainConfig& tc = cfg.train;
    const double params = num_params_double(shape);
    if (params > kPlanMaxParams)
        throw UserError(strfmt("model: %.3g parameters (model.n_layer = %d, model.d_model = %d), %.3g bytes of "
                               "weights in fp32 alone: past what a plan counts (at most %.3g parameters, so that every "
                               "byte count fits in 64 bits); no cluster holds such a model",
                               params, shape.n_layer, shape.d_model, 4.0 * params, kPlanMaxParams));
    // one micro-batch's activations, over-counted: every layer's residual-stream rows, a d_model
    // row 64 times over and the logits twice
    const double acts = double(tc.micro_batch) * tc.seq_len *
                        (64.0 * shape.d_model * (shape.n_layer + 1.0) + 2.0 * shape.padded_vocab) * 4.0;
    if (acts > kPlanMaxBytes)
        throw UserError(strfmt("train.micro_batch: %d sequences of train.seq_len = %d tokens through %d layers of "
                               "d_model %d: about %.3g bytes of activations, past what a plan counts (%.3g)",
                               tc.micro_batch, tc.seq_len, shape.n_layer, shape.d_model, acts, kPlanMaxBytes));
    const double sequences = double(tc.micro_batch) * tc.grad_accum * plan_world(cfg);  // at most, over dp
    if (sequences * tc.seq_len > kPlanMaxTokens)
        throw UserError(strfmt("train.grad_accum: %d micro-batches of train.micro_batch = %d sequences of %d tokens "
                               "on up to %d data-parallel ranks: %.3g tokens per step, past what a plan counts (%.3g)",
                               tc.grad_accum, tc.micro_batch, tc.seq_len, plan_world(cfg), sequences * tc.seq_len,
                               kPlanMaxTokens));
    const int stages = pc.pp * pc.pp_virtual;
    const long long per_rank = (shape.n_layer + pc.pp - 1) / pc.pp;  // at least on the fullest rank
    if (per_rank > kPlanMaxLayersPerRank)
        throw UserError(strfmt("model.n_layer: %d layers over parallel.pp = %d stages put %lld or more on a rank; the "
                               "plan lists a rank's tensors one by one and stops past %d layers on a rank (raise "
                               "parallel.pp)",
                               shape.n_layer, pc.pp, per_rank, kPlanMaxLayersPerRank));
    const double pairs = double(tc.grad_accum) * stages;
    if (pairs > kPlanMaxSchedule)
        throw UserError(strfmt("train.grad_accum: %d micro-batches x %d pipeline stages (parallel.pp x "
                               "parallel.pp_virtual) = %.3g; the plan simulates the pipeline schedule and stops past "
                               "%.0f",
                               tc.grad_accum, stages, pairs, kPlanMaxSchedule));
}

void resolve_pp_layers(Config& cfg, const ModelShape& shape) {
    if (cfg.parallel.pp_layers_auto) cfg.parallel.pp_layers = balance_pp_layers(cfg, shape);
}

json plan_json(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    const ParallelConfig& pc = cfg.parallel;
    const double tokens = tokens_per_step(cfg, grid);
    json plan = {{"world", grid.world},
            {"dp", grid.dp},
            {"cp", grid.cp},
            {"ep", grid.ep},
            {"tp", grid.tp},
            {"pp", grid.pp},
            {"zero", pc.zero},
            {"local_sgd_every", pc.local_sgd.every},
            {"grad_compression", pc.grad_compression},
            {"sequence_parallel", pc.sequence_parallel && grid.tp > 1},
            {"pp_schedule", pc.pp_schedule},
            {"pp_virtual", pc.pp_virtual},
            {"recompute", cfg.train.recompute},
            {"offload_activations", cfg.train.offload_activations},
            {"dtype", dtype_name(dtype)},
            {"tokens_per_step", tokens},
            {"model_flops_per_step", flops_per_token(shape, cfg.train.seq_len) * tokens},
            {"pp_layers", stage_layers(cfg, shape, grid)},
            {"pp_layers_auto", pc.pp_layers_auto},
            {"device", device_json(plan_device(cfg))},
            {"step_time", step_json(estimate_step(cfg, shape, grid, dtype))},
            {"memory", memory_json(plan_memory(cfg, shape, grid, dtype))}};
    if (pc.grad_compression == "powersgd") {  // the plain all-reduce's bytes over the bytes PowerSGD sends
        plan["powersgd_rank"] = pc.powersgd_rank;
        plan["compression"] = powersgd_ratio(shape, pc);
    }
    return plan;
}

std::string plan_text(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    const ParallelConfig& pc = cfg.parallel;
    const TrainConfig& tc = cfg.train;
    const json plan = plan_json(cfg, shape, grid, dtype);
    std::string s = strfmt("plan: %s, %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d; %s\n",
                           arch_name(shape.arch), shape.n_layer, shape.d_model, shape.n_head, shape.kv_heads(),
                           shape.ffn(), shape.vocab_size, dtype_name(dtype));
    if (shape.moe.enabled()) s += "  " + moe_describe(shape.moe, shape.n_layer) + "\n";
    const std::string local =
        pc.local_sgd.every > 0
            ? strfmt(" (of the outer state, in host memory); local SGD every %d steps (each rank's optimizer whole)",
                     pc.local_sgd.every)
            : plan.contains("compression")
                ? strfmt("; PowerSGD rank %d (the gradient all-reduce's bytes / %.2f)", pc.powersgd_rank,
                         plan["compression"].get<double>())
                : std::string();
    s += strfmt("  world %d = %s; ZeRO-%d%s%s; %s over %d micro-batches%s; recompute %s%s\n", grid.world,
                grid.describe().c_str(), pc.zero, local.c_str(),
                plan["sequence_parallel"].get<bool>() ? "; sequence parallel" : "",
                pc.pp_schedule.c_str(), tc.grad_accum,
                pc.pp_virtual > 1 ? strfmt(" (%d chunks per rank)", pc.pp_virtual).c_str() : "", tc.recompute.c_str(),
                tc.offload_activations ? ", activations offloaded to the host" : "");
    s += strfmt("  %.0f tokens per step; model FLOPs per step %.4g (%.4g per token)\n", plan["tokens_per_step"].get<double>(),
                plan["model_flops_per_step"].get<double>(), flops_per_token(shape, tc.seq_len));
    if (grid.pp > 1)
        s += strfmt("  layers per pipeline stage%s: %s%s\n", pc.pp_virtual > 1 ? " (virtual, in order)" : "",
                    int_list_text(plan["pp_layers"].get<std::vector<int>>()).c_str(),
                    pc.pp_layers_auto ? " (auto: balanced by the step-time model)" : "");
    const json& d = plan["device"];
    const json& st = plan["step_time"];
    s += strfmt("step time on %d x %s (%.4g TFLOP/s %s peak x %.2f efficiency; %d GPUs per node, NVLink %.4g GB/s, "
                "InfiniBand %.4g GB/s): %.4g s, %.4g tokens/s, MFU %.1f%%\n",
                grid.world, d["gpu"].get<std::string>().c_str(), d["peak_tflops"].get<double>(), cfg.precision.c_str(),
                d["efficiency"].get<double>(), d["gpus_per_node"].get<int>(), d["nvlink_gb_s"].get<double>(),
                d["ib_gb_s"].get<double>(), st["total_s"].get<double>(), st["tokens_per_s"].get<double>(),
                100.0 * st["mfu"].get<double>());
    s += strfmt("  compute %.4g s; exposed communication %.4g s (tp %.4g, pp %.4g, dp %.4g); pipeline bubble %.4g s; "
                "optimizer %.4g s\n",
                st["compute_s"].get<double>(), st["exposed_comm_s"].get<double>(), st["tp_comm_s"].get<double>(),
                st["pp_comm_s"].get<double>(), st["dp_comm_s"].get<double>(), st["bubble_s"].get<double>(),
                st["optimizer_s"].get<double>());
    const json& kinds = plan["memory"];
    for (size_t k = 0; k < kinds.size(); k++) {
        const json& kind = kinds[k];
        std::string where;
        for (const json& r : kind["ranks"]) {
            const int p = r[0], t = r[1];
            where += strfmt("%s(pp %d: %s, tp %d)", where.empty() ? "" : " ", p, stage_role(p, grid.pp), t);
        }
        const int p0 = kind["ranks"][0][0];
        std::string in_flight;
        for (int n : slots_of(cfg, grid, p0)) in_flight += strfmt("%s%d", in_flight.empty() ? "" : ", ", std::max(1, n));
        s += strfmt("rank kind %zu of %zu, each on %d DP%s rank%s: %s\n", k + 1, kinds.size(), grid.dp_cp(),
                    grid.cp > 1 ? " x CP" : "", grid.dp_cp() == 1 ? "" : "s", where.c_str());
        for (const Category& c : kCategories) {
            if (c.bytes == &MemoryPlan::host) continue;  // after the total
            const size_t b = kind[c.key];
            std::string note;
            if (std::string(c.key) == "activations")
                note = strfmt("  (micro-batches in flight per chunk: %s)", in_flight.c_str());
            s += strfmt("  %-13s %11s  %14zu B%s\n", c.name, human_bytes(double(b)).c_str(), b, note.c_str());
        }
        const size_t total = kind["total"];
        s += strfmt("  %-13s %11s  %14zu B\n", "total", human_bytes(double(total)).c_str(), total);
        const size_t host = kind["host"];
        std::string what = tc.offload_optimizer ? "the offloaded optimizer and its staging" : "";
        if (tc.offload_activations) what += std::string(what.empty() ? "" : ", ") + "the offloaded activations";
        s += strfmt("  %-13s %11s  %14zu B%s\n", "host memory", human_bytes(double(host)).c_str(), host,
                    what.empty() ? "" : ("  (not in the total: " + what + ")").c_str());
    }
    return s;
}

std::vector<ActivationTerm> activation_terms(const ModelShape& shape, DType dtype, int b, int s, int tp, bool sp,
                                             Recompute rc, bool fp8) {
    // ours: the buffers Model::carve_activations takes per layer, by the same sizes
    const double dt = dtype_size(dtype), t = tp, N = double(b) * s, C = shape.d_model, hd = shape.head_dim();
    const double nl = sp && tp > 1 ? N / t : N;  // rows of the residual stream and the norms
    const double F = shape.ffn(), pre = shape.arch == Arch::Llama ? 2 * F : F;
    const double stats = (shape.arch == Arch::Llama ? 1 : 2) * nl * 4.0;  // fp32 (mean,) rstd per norm
    const bool none = rc == Recompute::None, full = rc == Recompute::Full;
    // the paper's, 16-bit (2 bytes) and 1-byte masks; a·s² for a heads; /t with SP (its section 4.2.2)
    const double sbh = N * C, a = shape.n_head, ss = double(s) * s * b * a;
    const double tpar = t, tsp = sp ? t : 1.0;  // the paper's LayerNorm-region terms shrink only with SP
    const bool p_all = rc == Recompute::None, p_sel = rc == Recompute::Selective;
    std::vector<ActivationTerm> v = {
        {"attention LayerNorm input (the layer's input)", nl * C * dt, 2 * sbh / tsp},
        {"QKV input (LayerNorm output)", full ? 0 : nl * C * dt, full ? 0 : 2 * sbh / tsp},
        {"Q and K", full ? 0 : N * (shape.n_head + shape.kv_heads()) * hd / t * dt, full ? 0 : 4 * sbh / tpar},
        {"V", full ? 0 : N * shape.kv_heads() * hd / t * dt, full ? 0 : 2 * sbh / tpar},
        {"softmax output (a s^2)", 0, p_all ? 2 * ss / tpar : 0},
        {"softmax dropout mask (a s^2)", 0, p_all ? ss / tpar : 0},
        {"softmax dropout output (a s^2)", 0, p_all ? 2 * ss / tpar : 0},
        {"attention output (projection input)", none ? N * C / t * dt : 0, (p_all || p_sel) ? 2 * sbh / tpar : 0},
        {"attention dropout mask", 0, full ? 0 : sbh / tsp},
        {"MLP LayerNorm input", full ? 0 : nl * C * dt, full ? 0 : 2 * sbh / tsp},
        {"fc1 input (LayerNorm output)", full ? 0 : nl * C * dt, full ? 0 : 2 * sbh / tsp},
        {"activation input (fc1 output)", full ? 0 : N * pre / t * dt, full ? 0 : 8 * sbh / tpar},
        // (fp8 with a GELU: fc2's input casts apply the GELU to fc1's kept output; nothing more kept)
        {"fc2 input (activation output)", none && !(fp8 && shape.arch != Arch::Llama) ? N * F / t * dt : 0,
         full ? 0 : 8 * sbh / tpar},
        {"MLP dropout mask", 0, full ? 0 : sbh / tsp},
        {"norm statistics (fp32)", full ? 0 : 2 * stats, 0},
        {"attention log-sum-exp (fp32)", none ? N * shape.n_head / t * 4.0 : 0, 0},
        // fp8: the linears' inputs cast transposed for the backward (1 byte an element; Fp8Stash),
        // and their four 1/s (one 256-byte piece)
        {"fp8 transposed input casts", fp8 && !full ? N * (2 * C + C / t + F / t) + 256 : 0, 0},
    };
    return v;
}

// ---- --plan=search ----------------------------------------------------------------------------

std::string LayoutChoice::overrides() const {
    const ParallelConfig& pc = cfg.parallel;
    return strfmt("parallel.dp=%d%s%s parallel.tp=%d parallel.pp=%d parallel.pp_schedule=%s parallel.pp_virtual=%d "
                  "parallel.zero=%d parallel.sequence_parallel=%s train.recompute=%s train.micro_batch=%d "
                  "train.grad_accum=%d",
                  pc.dp, pc.cp > 1 ? strfmt(" parallel.cp=%d", pc.cp).c_str() : "",
                  cfg.model.moe.num_experts > 0 ? strfmt(" parallel.ep=%d", pc.ep).c_str() : "", pc.tp, pc.pp,
                  pc.pp_schedule.c_str(), pc.pp_virtual, pc.zero,
                  pc.sequence_parallel ? "true" : "false", cfg.train.recompute.c_str(), cfg.train.micro_batch,
                  cfg.train.grad_accum);
}

namespace {
std::vector<int> divisors(int n, int most) {
    std::vector<int> out;
    for (int d = 1; d <= n && d <= most; d++)
        if (n % d == 0) out.push_back(d);
    return out;
}

// The largest planned total over every (pp, tp) position of cfg's layout.
size_t largest_rank(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    size_t most = 0;
    for (const RankMemory& r : plan_memory(cfg, shape, grid, dtype)) most = std::max(most, r.mem.total());
    return most;
}

// What the candidates of a search share, built once: the ranks' parameter tables by (tp, pp,
// chunks, dp, ep, pp rank, layer split), and every rank's in-flight micro-batches by (schedule,
// pp, chunks, micro-batches).
struct SearchCache {
    std::map<std::pair<std::array<int, 6>, std::vector<int>>, RankParts> parts;
    std::map<std::tuple<std::string, int, int, int>, std::vector<std::vector<int>>> slots;
    const RankParts& rank(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, int p) {
        const std::array<int, 6> key = {grid.tp, grid.pp, cfg.parallel.pp_virtual, grid.dp, grid.ep, p};
        auto it = parts.find({key, cfg.parallel.pp_layers});
        if (it == parts.end()) it = parts.emplace(std::make_pair(key, cfg.parallel.pp_layers), rank_parts(cfg, shape, grid, p, 0)).first;
        return it->second;
    }
    const std::vector<std::vector<int>>& slots_of(const Config& cfg, const ProcessGrid& grid) {
        const auto key = std::make_tuple(cfg.parallel.pp_schedule, grid.pp, cfg.parallel.pp_virtual, cfg.train.grad_accum);
        auto it = slots.find(key);
        if (it == slots.end()) {
            std::vector<std::vector<int>> all;
            for (const auto& actions : schedule_of(cfg, grid)) all.push_back(pipeline_slots(actions, cfg.parallel.pp_virtual));
            it = slots.emplace(key, std::move(all)).first;
        }
        return it->second;
    }
};

// The largest planned total over the pipeline ranks at tp rank 0 (the tp ranks of a stage hold
// equal shares).
size_t largest_rank0(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype,
                     SearchCache& cache) {
    size_t most = 0;
    for (int p = 0; p < grid.pp; p++) {
        RankParts r = cache.rank(cfg, shape, grid, p);
        r.layout.sequence_parallel = cfg.parallel.sequence_parallel && grid.tp > 1;
        most = std::max(most, memory_of(r, cfg, shape, grid, dtype, cache.slots_of(cfg, grid)[size_t(p)],
                                        cfg.parallel.zero, parse_recompute(cfg.train.recompute))
                                  .total());
    }
    return most;
}

// Whether cfg's layout fits `budget` on every pipeline rank (tp rank 0: the tp ranks of a stage
// hold equal shares) at some ZeRO stage up to max_zero and some recomputation: neither knob
// orders memory alone (ZeRO-3's unit buffers can outweigh what it saves over ZeRO-2 on few DP
// ranks; a whole layer recomputed can outweigh selective's buffers on one-layer stages).
bool some_stage_fits(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype, int max_zero,
                     double budget, SearchCache& cache) {
    const Recompute modes[] = {Recompute::None, Recompute::Selective, Recompute::Full};
    std::array<std::array<size_t, 3>, 4> most{};  // [zero][recompute]: the largest rank
    for (int p = 0; p < grid.pp; p++) {
        RankParts parts = cache.rank(cfg, shape, grid, p);
        parts.layout.sequence_parallel = cfg.parallel.sequence_parallel && grid.tp > 1;
        const std::vector<int>& slots = cache.slots_of(cfg, grid)[size_t(p)];
        for (size_t m = 0; m < 3; m++)
            for (int z = 0; z <= max_zero; z++) {
                const size_t total = memory_of(parts, cfg, shape, grid, dtype, slots, z, modes[m]).total();
                most[size_t(z)][m] = std::max(most[size_t(z)][m], total);
            }
    }
    for (int z = 0; z <= max_zero; z++)
        for (size_t m = 0; m < 3; m++)
            if (double(most[size_t(z)][m]) <= budget) return true;
    return false;
}
}  // namespace

std::vector<LayoutChoice> search_layouts(const Config& base, const ModelShape& shape, DType dtype, size_t top,
                                         size_t* examined, SearchSkips* skips) {
    const int world = plan_world(base);
    const ProcessGrid given = make_process_grid(base.parallel, world, 0);
    const long long batch = (long long)base.train.micro_batch * base.train.grad_accum * given.dp;  // sequences
    const double budget = plan_device(base).mem_bytes;
    Config proto = base;
    proto.resolved = json();  // not needed by the plan; copied for every candidate otherwise
    std::vector<LayoutChoice> all;
    SearchSkips skipped;
    SearchCache cache;
    // the layer split of a stage layout depends on the mesh, the chunks, the micro-batch and the
    // recomputation only (stage_cost): balanced once for all the ZeRO stages and SP settings
    std::map<std::array<int, 6>, std::vector<int>> balanced;
    struct Group {  // candidates alike but for the ZeRO stage, the recomputation and SP
        size_t begin, end;
        Config least;  // the smallest micro-batch, with SP
    };
    std::vector<Group> groups;
    // the given context-parallel degree stays (it follows from the sequence length); tp, pp, dp,
    // with MoE the expert-parallel degree (a divisor of the experts and of dp x cp), and the rest
    // are searched
    const int cp = given.cp;
    // (local SGD: ZeRO 0 or 1 and no expert parallelism, llmc/train/local_sgd.h)
    const bool local = base.parallel.local_sgd.every > 0;
    // (PowerSGD: ZeRO-0 over dp alone, llmc/train/powersgd.h)
    const bool powersgd = base.parallel.grad_compression == "powersgd";
    const int max_zero = powersgd ? 0 : local ? 1 : 3;
    const std::vector<int> eps = shape.moe.enabled() && !local && !powersgd ? divisors(shape.moe.num_experts, shape.moe.num_experts)
                                                               : std::vector<int>{1};
    struct Mesh {
        int tp, pp, dp, ep;
    };
    std::vector<Mesh> meshes;
    for (int tp : divisors(world / cp, base.plan.gpus_per_node)) {
        if (shape.n_head % tp || shape.kv_heads() % tp || shape.ffn() % tp || (powersgd && tp > 1)) continue;
        if (shape.moe.enabled() && shape.moe.expert_ffn_dim % tp) continue;
        for (int pp : divisors(world / cp / tp, shape.n_layer)) {
            const int dp = world / cp / tp / pp;
            if (batch % dp || (powersgd && pp > 1)) continue;
            for (int ep : eps)
                if (dp * cp % ep == 0) meshes.push_back({tp, pp, dp, ep});  // expert parallelism splits dp x cp
        }
    }
    struct Sched {
        const char* name;
        int v;
    };
    for (const Mesh& mesh : meshes) {
        const int tp = mesh.tp, pp = mesh.pp, dp = mesh.dp;
        std::vector<Sched> scheds = {{"1f1b", 1}};
        if (pp > 1) scheds = {{"1f1b", 1}, {"gpipe", 1}, {"interleaved", 2}, {"interleaved", 4}};
        if (batch / dp > INT_MAX) {  // > 2^25 micro-batches of at most 64: past kSearchMaxSchedule
            skipped.schedule += scheds.size();
            continue;
        }
        const int per_rank = int(batch / dp);
        for (const Sched& sc : scheds) {
            if (shape.n_layer < pp * sc.v) continue;
            Group grp{all.size(), 0, base};  // (least: the first candidate replaces it)
            for (int mb : divisors(per_rank, 64)) {
                const int ga = per_rank / mb;
                if (sc.v > 1 && ga % pp) continue;
                const size_t variants = size_t(dp * cp > 1 ? 4 : 1) * 3 * (tp > 1 ? 2 : 1);  // at most
                if ((shape.n_layer + pp - 1) / pp > kPlanMaxLayersPerRank) {
                    skipped.layers += variants;
                    continue;
                }
                if (double(ga) * pp * sc.v > kSearchMaxSchedule) {
                    skipped.schedule += variants;
                    continue;
                }
                if (all.size() >= kSearchMaxLayouts) {
                    skipped.cap += variants;
                    continue;
                }
                for (int zero = 0; zero <= (dp * cp > 1 ? max_zero : 0); zero++)  // ZeRO shards over dp x cp
                    for (const char* rc : {"none", "selective", "full"})
                        for (int sp = 0; sp <= (tp > 1 ? 1 : 0); sp++) {
                            if (sp && base.train.seq_len / cp % tp) continue;
                            if (base.train.offload_activations && std::string(rc) != "full") continue;  // needs it
                            LayoutChoice c;
                            c.cfg = proto;
                            ParallelConfig& pc = c.cfg.parallel;
                            pc.dp = dp, pc.tp = tp, pc.pp = pp, pc.pp_schedule = sc.name, pc.pp_virtual = sc.v;
                            pc.ep = mesh.ep, pc.zero = zero, pc.sequence_parallel = sp;
                            pc.pp_layers.clear();
                            c.cfg.train.micro_batch = mb, c.cfg.train.grad_accum = ga, c.cfg.train.recompute = rc;
                            if (pc.pp_layers_auto) {
                                const std::array<int, 6> key = {tp, pp, sc.v, mesh.ep, mb, int(parse_recompute(rc))};
                                auto it = balanced.find(key);
                                if (it == balanced.end()) it = balanced.emplace(key, balance_pp_layers(c.cfg, shape)).first;
                                pc.pp_layers = it->second;
                            }
                            const ProcessGrid g = make_process_grid(pc, world, 0);
                            c.time = estimate_step(c.cfg, shape, g, dtype);
                            if (grp.begin == all.size() || (mb == grp.least.train.micro_batch && sp))
                                grp.least = c.cfg;
                            all.push_back(std::move(c));
                        }
            }
            grp.end = all.size();
            if (grp.end > grp.begin) groups.push_back(grp);
        }
    }
    if (examined) *examined = all.size();
    if (skips) *skips = skipped;
    // a group none of whose ZeRO stages and recomputations fits at its smallest micro-batch with SP
    // has no member that fits (smaller micro-batches and SP only take less)
    std::vector<char> possible(all.size(), 1);
    for (const Group& grp : groups) {
        const ProcessGrid g = make_process_grid(grp.least.parallel, world, 0);
        if (!some_stage_fits(grp.least, shape, g, dtype, g.dp_cp() > 1 ? max_zero : 0, budget, cache))
            std::fill(possible.begin() + long(grp.begin), possible.begin() + long(grp.end), 0);
    }
    std::vector<size_t> order;
    for (size_t i = 0; i < all.size(); i++)
        if (possible[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return all[a].time.tokens_per_s > all[b].time.tokens_per_s; });
    std::vector<LayoutChoice> out;
    for (size_t i : order) {
        LayoutChoice& c = all[i];
        const ProcessGrid g = make_process_grid(c.cfg.parallel, world, 0);
        if (double(largest_rank0(c.cfg, shape, g, dtype, cache)) > budget) continue;
        c.max_bytes = largest_rank(c.cfg, shape, g, dtype);  // every position: what is printed is exact
        if (double(c.max_bytes) > budget) continue;
        out.push_back(std::move(c));
        if (out.size() == top) break;
    }
    return out;
}

std::string search_text(const Config& cfg, const ModelShape& shape, DType dtype) {
    const auto t0 = std::chrono::steady_clock::now();
    size_t examined = 0;
    SearchSkips skipped;
    const std::vector<LayoutChoice> best = search_layouts(cfg, shape, dtype, 5, &examined, &skipped);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const DeviceSpec d = plan_device(cfg);
    const ProcessGrid given = make_process_grid(cfg.parallel, plan_world(cfg), 0);
    std::string s = strfmt("search: %d x %s (%s each), %s, %d layers, d_model %d; %lld sequences of %d tokens per "
                           "step; %zu layouts examined in %.2f s\n",
                           plan_world(cfg), d.name.c_str(), human_bytes(d.mem_bytes).c_str(), arch_name(shape.arch),
                           shape.n_layer, shape.d_model,
                           (long long)cfg.train.micro_batch * cfg.train.grad_accum * given.dp, cfg.train.seq_len,
                           examined, secs);
    std::string skip;
    if (skipped.layers)
        skip += strfmt("skipped %zu layouts with more than %d layers on a pipeline rank (more pipeline stages would "
                       "have them fewer)\n", skipped.layers, kPlanMaxLayersPerRank);
    if (skipped.schedule)
        skip += strfmt("skipped %zu layouts with more than %.0f (micro-batch, pipeline stage) pairs per step: "
                       "train.grad_accum x parallel.pp x parallel.pp_virtual past what the search simulates\n",
                       skipped.schedule, kSearchMaxSchedule);
    if (skipped.cap)
        skip += strfmt("skipped %zu layouts after the first %zu (the search examines no more; lower plan.world or "
                       "set train.micro_batch x train.grad_accum to narrow it)\n", skipped.cap, kSearchMaxLayouts);
    if (best.empty())
        return s + "no layout fits: every rank of every layout examined needs more than plan.gpu's memory\n" + skip;
    for (size_t i = 0; i < best.size(); i++) {
        const LayoutChoice& c = best[i];
        s += strfmt("%zu. %.4g tokens/s, MFU %.1f%%, step %.4g s (compute %.4g, exposed comm %.4g, bubble %.4g), "
                    "largest rank %s\n   %s\n",
                    i + 1, c.time.tokens_per_s, 100 * c.time.mfu, c.time.total, c.time.compute,
                    c.time.exposed_comm(), c.time.bubble, human_bytes(double(c.max_bytes)).c_str(),
                    c.overrides().c_str());
    }
    return s + skip;
}
