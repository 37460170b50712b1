// The planner (train_gpt --plan): what every kind of rank of a layout will allocate, from the
// config alone, with nothing allocated and no process started. It calls the very functions the
// run sizes its buffers with (param_layout, Model::activation_bytes_of, DataParallel::bucket_elems_for,
// zero_memory_plan), so the plan is
// the run's allocation, byte for byte; a run logs what it allocated as the first record of
// log.jsonl ({"memory": memory_json(...)}) and test/e2e/test_plan.sh compares the two.
//
// Host memory: the plan's "host" category is the offloaded optimizer (train.offload_optimizer) and
// its staging, and the offloaded activations (train.offload_activations), outside the total (the
// backend's memory).
// Not in the plan: the FP8 converter's scales and amax histories (its memory rows), other host
// buffers (pipeline messages, staging of MPI over CUDA), the backend's own workspaces (cuBLAS), and
// the allocator's rounding and fragmentation.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/train/data_parallel.h"
#include "llmc/model/model.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/plan/step_model.h"

// plan.world, "auto" resolved: dp x tp x pp when parallel.dp is a number, else 1.
int plan_world(const Config& cfg);
// Tokens of one optimizer step over the job: micro_batch x seq_len x grad_accum x dp (the cp
// ranks of a DP rank share its sequences).
double tokens_per_step(const Config& cfg, const ProcessGrid& grid);

// One rank position of a layout (DP ranks of a position allocate alike; under expert
// parallelism with ZeRO their optimizers differ: the largest) and its memory.
struct RankMemory {
    int pp_rank = 0, tp_rank = 0;
    MemoryPlan mem;
};

// What the rank at (pp_rank, tp_rank) allocates under cfg, over grid.dp x grid.cp ranks (ZeRO's
// group; each holding seq_len / cp tokens of every sequence), in dtype. Under expert parallelism
// with ZeRO >= 1, the optimizer of the rank of the position that owns the most elements.
MemoryPlan plan_rank_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype,
                            int pp_rank, int tp_rank);

// Every (pp_rank, tp_rank) of the grid, pipeline stage-major.
std::vector<RankMemory> plan_memory(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype);

// The kinds of rank: positions with equal bytes in every category grouped, in order of first
// appearance: [{"ranks": [[pp_rank, tp_rank], ...], "params": bytes, ..., "total": bytes}, ...].
nlohmann::json memory_json(const std::vector<RankMemory>& ranks);
// memory_json of what the members of a model-parallel group (mp, tp x pp (x ep) ranks, llmc/train/layout.h)
// allocated, each passing its own; collective over mp (and edp), every member gets the result.
// Under expert parallelism each (pp, tp) position shows the largest of each category over its ep
// ranks and, with edp (the expert-dp group), over those too: ZeRO's optimizer elements differ
// between them (zero_optimizer_runs), as plan_memory's do.
nlohmann::json gather_memory_json(const MemoryPlan& mine, Comm& mp, int tp, int ep = 1, Comm* edp = nullptr);

// What a plan can count, so that it allocates nothing in proportion to the model and answers in
// moments: byte counts in 64 bits (parameters and one micro-batch's activations), a rank's tensor
// table (layers per pipeline rank), the pipeline schedule it simulates (micro-batches x stages).
constexpr double kPlanMaxParams = double(1ull << 56);
constexpr double kPlanMaxBytes = double(1ull << 60);
constexpr double kPlanMaxTokens = double(1ull << 53);  // per step, exact in a double
constexpr int kPlanMaxLayersPerRank = 65536;
constexpr double kPlanMaxSchedule = 1 << 20;
// Throws UserError naming the key and the sizes when cfg's plan is past those bounds.
void check_plannable(const Config& cfg, const ModelShape& shape);

// parallel.pp_layers "auto": replaced by balance_pp_layers' split (llmc/plan/step_model.h); else unchanged.
// Every rank resolves it alike before the layout is built.
void resolve_pp_layers(Config& cfg, const ModelShape& shape);

// Megatron's per-layer activation memory (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models", section 4: 16-bit activations, dropout masks of a
// byte, s·b·h·(34 + 5·a·s/h) per layer, all divided by t with tensor and sequence parallelism)
// term by term next to what a layer of ours keeps (Model::activation_bytes_of): bytes per layer
// for one micro-batch of b sequences of s tokens in dtype, over tp ranks. A paper term we do not
// hold has ours = 0 (flash-style attention keeps no a·s² scores; no dropout), a term only ours has
// paper = 0 (the norms' fp32 statistics, the attention's log-sum-exp). The paper's terms follow
// its recompute mode too: selective drops the three a·s² terms, full keeps only the layer's input.
struct ActivationTerm {
    std::string name;
    double ours = 0, paper = 0;
};
std::vector<ActivationTerm> activation_terms(const ModelShape& shape, DType dtype, int b, int s, int tp, bool sp,
                                             Recompute rc, bool fp8 = false);

// --plan=search: layouts of plan.world GPUs (dp, tp, pp, schedule, chunks per rank, ZeRO stage,
// recompute, micro-batch, sequence parallelism) at cfg's global batch (micro_batch x grad_accum x
// dp sequences) whose every rank's planned memory fits plan.gpu, fastest first (ties in the order
// of enumeration). Deterministic.
struct LayoutChoice {
    Config cfg;          // cfg with the layout's keys set
    StepTime time;
    size_t max_bytes = 0;  // the largest rank's planned total
    std::string overrides() const;  // "parallel.dp=... train.micro_batch=..."
};
// The search is bounded (it answers in seconds for any config): it skips, and counts, layouts
// with more than kPlanMaxLayersPerRank layers on a rank or kSearchMaxSchedule (micro-batch,
// stage) pairs to simulate, and examines at most kSearchMaxLayouts.
constexpr double kSearchMaxSchedule = 1 << 16;
constexpr size_t kSearchMaxLayouts = 50000;
struct SearchSkips {
    size_t layers = 0, schedule = 0, cap = 0;
};
std::vector<LayoutChoice> search_layouts(const Config& cfg, const ModelShape& shape, DType dtype, size_t top,
                                         size_t* examined = nullptr, SearchSkips* skipped = nullptr);
std::string search_text(const Config& cfg, const ModelShape& shape, DType dtype);

// The whole plan (kinds of rank, model FLOPs per step, step time), as text or as one JSON object.
std::string plan_text(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype);
nlohmann::json plan_json(const Config& cfg, const ModelShape& shape, const ProcessGrid& grid, DType dtype);
