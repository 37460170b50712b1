#include "llmc/planner.h"

#include "llmc/layout.h"
#include "llmc/mfu.h"
#include "llmc/model.h"
#include "llmc/optimizer.h"
#include "llmc/pipeline.h"
#include "llmc/pipeline_schedule.h"

using nlohmann::json;

DType run_dtype(const std::string& precision, const std::string& device) {
    // fp8 keeps everything but the block linears in bf16 on CUDA and fp32 on the CPU
    return precision == "bf16" || (precision == "fp8" && device == "cuda") ? DType::BF16 : DType::F32;
}

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

MemoryPlan plan_rank_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype,
                            int pp_rank, int tp_rank) {
    const ParallelConfig& pc = cfg.parallel;
    const TrainConfig& tc = cfg.train;
    const ModelLayout layout = model_layout(shape, pc, tp_rank, pp_rank);
    const ParamLayout params = param_layout(shape, layout, DataParallel::pad_multiple(grid.dp_cp()));
    const size_t padded = params.padded_params;
    const UnitSizes units = unit_sizes(params.units);
    const size_t activations = Model::activation_bytes_of(shape, dtype, tc.micro_batch, tc.seq_len / grid.cp, layout,
                                                          slots_of(cfg, grid, pp_rank), parse_recompute(tc.recompute));
    return zero_memory_plan(padded, grid.dp_cp(), pc.zero, dtype_size(dtype), AdamW::keeps_master(dtype),
                            DataParallel::bucket_elems_for(pc.bucket_mb, padded), activations, units,
                            tc.offload_optimizer);
}

std::vector<RankMemory> plan_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    std::vector<RankMemory> out;
    for (int p = 0; p < grid.pp; p++)
        for (int t = 0; t < grid.tp; t++) out.push_back({p, t, plan_rank_memory(cfg, shape, grid, dtype, p, t)});
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

json gather_memory_json(const MemoryPlan& mine, Comm& mp, int tp) {
    const size_t n = sizeof(kCategories) / sizeof(kCategories[0]);
    std::vector<double> all(size_t(mp.size()) * n, 0.0);  // byte counts are exact in doubles below 2^53
    for (size_t c = 0; c < n; c++) all[size_t(mp.rank()) * n + c] = double(mine.*kCategories[c].bytes);
    mp.all_reduce(all.data(), all.size(), ReduceOp::Sum);
    std::vector<RankMemory> ranks(size_t(mp.size()));
    for (size_t i = 0; i < ranks.size(); i++) {  // member i: tp_rank i % tp, pp_rank i / tp
        ranks[i].pp_rank = int(i) / tp;
        ranks[i].tp_rank = int(i) % tp;
        for (size_t c = 0; c < n; c++) ranks[i].mem.*kCategories[c].bytes = size_t(all[i * n + c]);
    }
    return memory_json(ranks);
}

double tokens_per_step(const Config& cfg, const ProcessGrid& grid) {
    return double(cfg.train.micro_batch) * cfg.train.seq_len * cfg.train.grad_accum * grid.dp;
}

json plan_json(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    const ParallelConfig& pc = cfg.parallel;
    const double tokens = tokens_per_step(cfg, grid);
    return {{"world", grid.world},
            {"dp", grid.dp},
            {"cp", grid.cp},
            {"tp", grid.tp},
            {"pp", grid.pp},
            {"zero", pc.zero},
            {"sequence_parallel", pc.sequence_parallel && grid.tp > 1},
            {"pp_schedule", pc.pp_schedule},
            {"pp_virtual", pc.pp_virtual},
            {"recompute", cfg.train.recompute},
            {"dtype", dtype_name(dtype)},
            {"tokens_per_step", tokens},
            {"model_flops_per_step", flops_per_token(shape, cfg.train.seq_len) * tokens},
            {"memory", memory_json(plan_memory(cfg, shape, grid, dtype))}};
}

std::string plan_text(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype) {
    const ParallelConfig& pc = cfg.parallel;
    const TrainConfig& tc = cfg.train;
    const json plan = plan_json(cfg, shape, grid, dtype);
    std::string s = strfmt("plan: %s, %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d; %s\n",
                           arch_name(shape.arch), shape.n_layer, shape.d_model, shape.n_head, shape.kv_heads(),
                           shape.ffn(), shape.vocab_size, dtype_name(dtype));
    s += strfmt("  world %d = %s; ZeRO-%d%s; %s over %d micro-batches%s; recompute %s\n", grid.world,
                grid.describe().c_str(), pc.zero, plan["sequence_parallel"].get<bool>() ? "; sequence parallel" : "",
                pc.pp_schedule.c_str(), tc.grad_accum,
                pc.pp_virtual > 1 ? strfmt(" (%d chunks per rank)", pc.pp_virtual).c_str() : "", tc.recompute.c_str());
    s += strfmt("  %.0f tokens per step; model FLOPs per step %.4g (%.4g per token)\n", plan["tokens_per_step"].get<double>(),
                plan["model_flops_per_step"].get<double>(), flops_per_token(shape, tc.seq_len));
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
        s += strfmt("  %-13s %11s  %14zu B%s\n", "host memory", human_bytes(double(host)).c_str(), host,
                    tc.offload_optimizer ? "  (not in the total: the offloaded optimizer and its staging)" : "");
    }
    return s;
}
