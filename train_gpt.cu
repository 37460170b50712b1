// train_gpt: GPT pretraining (GPT-2, Llama), one binary for one CPU core or a cluster of GPUs.
//
//   ./train_gpt configs/tiny_cpu.json [key=value ...] [--print-config] [--plan[=json]]
//   mpirun -np N ./train_gpt config.json
//
// Reads top to bottom as the algorithm: plan the run (every start-up check, one agreement), build
// it, initialise or resume, loop (evaluate, step, checkpoint), save.
// Every kernel call goes through Ops (llmc/backend/ops.h): the CPU reference backend or CUDA.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "llmc/cpu/cpu_ops.h"
#include "llmc/cpu/fp16_ops.h"
#include "llmc/cuda/cuda_ops.h"
#include "llmc/io/checkpoint.h"
#include "llmc/core/common.h"
#include "llmc/comm/comm.h"
#include "llmc/core/config.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/train/converter.h"
#include "llmc/train/data_parallel.h"
#include "llmc/train/evaluate.h"
#include "llmc/comm/device_sim.h"
#include "llmc/data/dataloader.h"
#include "llmc/core/exit_codes.h"
#include "llmc/io/hf_format.h"
#include "llmc/run/logger.h"
#include "llmc/run/mfu.h"
#include "llmc/model/model.h"
#include "llmc/io/model_file.h"
#include "llmc/backend/ops.h"
#include "llmc/run/preempt.h"
#include "llmc/io/async_save.h"
#include "llmc/train/layout.h"
#include "llmc/train/local_sgd.h"
#include "llmc/train/powersgd.h"
#include "llmc/model/optimizer.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/pipeline_schedule.h"
#include "llmc/plan/planner.h"
#include "llmc/parallel/process_grid.h"
#include "llmc/run/progress.h"
#include "llmc/parallel/tensor_parallel.h"
#include "llmc/core/rng.h"
#include "llmc/run/run_dir.h"
#include "llmc/run/runtime.h"
#include "llmc/data/tokenizer.h"

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

using Batches = std::vector<std::vector<int32_t>>;

// What a save keeps from one save to the next, host memory in memory order: DP rank 0's (tp, pp,
// ep) piece where it is gathered over DP (expert parallelism with ZeRO >= 1), and checkpoint.async's
// snapshot of what each rank holds (PieceServer::snapshot). Never assembled whole: checkpoint_save
// reads each array in file order a chunk at a time, from the ranks that hold it (a whole copy in
// file order doubled world rank 0's host memory for a save: here (CPU, 326M parameters, one
// process) 12.9 GB against 5.2 GB of training state; gathering every piece to world rank 0 held the
// whole state there). Copied into fresh pages, these copies made most of a save's time here (26-38 s
// of a 31-47 s save); into pages already written, 1.5 s (dev/bench/RESULTS.md): they stay
// allocated between saves.
struct SaveBuffers {
    OptimizerState local;
    std::vector<float> params;
    // local SGD's outer state and replicas, PowerSGD's error feedback (DP rank 0, memory
    // order, as gathered): not kept between saves
    LocalSgdState outer;
    std::vector<std::vector<float>> errors;
    std::vector<std::vector<float>> snapshot;  // checkpoint.async: what this rank holds, an array each
    std::shared_ptr<PieceServer> server;       // every rank of a save but a live one
    StateView view;  // world rank 0: what a save writes, read from the above
};

// Whether this rank's parameters and optimizer state are its whole (tp, pp, ep) piece, in memory
// order: not sharded over DP (ZeRO-0, or a DP group of one) nor split over ep (dense state under
// expert parallelism with ZeRO >= 1), nor ZeRO-3's parameters.
bool holds_whole_piece(const DataParallel& dp) {
    const auto& runs = dp.opt_runs();
    return dp.zero() < 3 && (dp.zero() == 0 || dp.dp() == 1) && dp.opt_begin() == 0 && runs.size() == 1 &&
           runs[0] == std::make_pair(size_t(0), dp.opt_end());
}

// A synchronous save where world rank 0 holds the whole state (live: one process, or data
// parallelism alone without ZeRO sharding, holds_whole_piece): b.view reads the model's and the
// optimizer's buffers where they lie (a device's memory: a piece at a time to the host), with no
// copy of the state (here, CPU, 326M parameters: the save's peak fell by the copy's 3.9 GB; at 1.5B
// on a GPU, by arithmetic, 25 GB of host memory); the other ranks wait. Not under checkpoint.async,
// whose write needs a snapshot while training goes on, nor under local SGD or PowerSGD, whose
// state is gathered over DP.
void live_state(const Model& model, const AdamW& opt, DataParallel& dp, const ParallelConfig& pc,
                const ProcessGrid& grid, SaveBuffers& b, bool weights_only) {
    b = SaveBuffers();  // (the memory of an earlier snapshot goes back)
    const size_t pad = DataParallel::pad_multiple(grid.shard_size());
    auto map = std::make_shared<const FileOrderMap>(file_order_map(model.shape, pc, pad));
    auto of = [&](FileOrderMap::MemberRead member) -> ReadFileOrder {
        return [map, member](size_t first, size_t n, float* out) { map->read({member}, first, n, out); };
    };
    auto state = [&](AdamW::Array a) {
        return of([&opt, a](size_t at, size_t n, float* out) { opt.read_state(a, at, n, out); });
    };
    StateView& v = b.view;
    if (!weights_only || !opt.has_master())
        v.main.params = of([&dp](size_t at, size_t n, float* out) { dp.read_params(at, n, out); });
    if (!weights_only) v.main.m = state(AdamW::Array::M), v.main.v = state(AdamW::Array::V);
    if (opt.has_master()) v.main.master = state(AdamW::Array::Master);
    v.num_params = num_params(model.shape);
}

// The whole model and optimizer state, as b.view on world rank 0 (empty elsewhere): read as world
// rank 0 writes from the ranks that hold each part, where it lies (b.server, a PieceServer over
// `over`, the save group or checkpoint.async's; world rank 0 calls its finish() after the write,
// every other rank its serve()), or with snapshot (checkpoint.async) from each rank's copy of its
// parts, taken here. Under local SGD also its outer state and the other DP ranks' replicas; under
// PowerSGD every DP rank's error feedback and Q, gathered over DP. Collective over every rank.
// weights_only (the final weights without a checkpoint): the weights alone, as b.view.main's master
// where the model keeps master weights, else its params.
void gather_state(const Model& model, const AdamW& opt, DataParallel& dp, LocalSgd* local_sgd, PowerSgd* powersgd,
                  const ParallelConfig& pc, Comm& mp, const ProcessGrid& grid, SaveBuffers& b, bool weights_only,
                  bool live, Comm* over, bool snapshot) {
    if (live) return live_state(model, opt, dp, pc, grid, b, weights_only);
    // served where they lie (ZeRO's shards by their DP ranks), but where ZeRO splits the optimizer
    // over ep too: gathered over DP first, and served from that copy
    const bool in_place = pc.ep == 1 || dp.zero() == 0;
    if (in_place) {
        b.local = {}, b.params = {};
    } else {
        dp.gather_optimizer_state(opt, b.local, weights_only);  // DP rank 0 gets its (tp, pp) piece whole
        if (weights_only && opt.has_master()) b.params.clear();
        else dp.gather_params(b.params);
    }
    if (weights_only) local_sgd = nullptr, powersgd = nullptr;
    LocalSgdState& outer = b.outer;  // DP rank 0: memory order
    outer = {};
    if (local_sgd) {
        ReplicaState mine;
        mine.params = dp.local_params();
        opt.get_state(mine.m, mine.v, mine.master);
        outer = local_sgd->gather(mine);
    }
    b.errors.clear();  // DP rank 0: every DP rank's, memory order
    std::vector<float> q;
    if (powersgd) powersgd->gather(&b.errors, &q);
    b.view = {};
    const size_t pad = DataParallel::pad_multiple(grid.shard_size());
    b.server = std::make_shared<PieceServer>(std::make_shared<const FileOrderMap>(file_order_map(model.shape, pc, pad)),
                                             mp, dp.comm(), *over);
    if (!b.server->serves()) return;
    // x, held whole by DP rank 0 (empty elsewhere; empty everywhere: not kept, as master where the
    // model is fp32), for world rank 0 to read in file order
    auto gathered = [&](const std::vector<float>& x) -> ReadFileOrder {
        const int k = b.server->add(&x);
        return grid.rank == 0 ? b.server->reader(k) : nullptr;
    };
    StateView& v = b.view;
    if (in_place) {  // (whole on DP rank 0, or ZeRO's shards: from base on this DP rank)
        auto served = [&](bool kept, bool sharded, FileOrderMap::MemberRead read) -> ReadFileOrder {
            const int k = b.server->add(kept ? std::move(read) : nullptr, sharded);
            return grid.rank == 0 ? b.server->reader(k) : nullptr;
        };
        const size_t base = dp.opt_begin();
        auto state = [&](AdamW::Array a) -> FileOrderMap::MemberRead {
            return [&opt, a, base](size_t at, size_t n, float* out) { opt.read_state(a, at - base, n, out); };
        };
        auto params = [&dp, base](size_t at, size_t n, float* out) {
            if (dp.zero() == 3) dp.read_param_shard(at - base, n, out);
            else dp.read_params(at, n, out);
        };
        const bool weights = !weights_only || !opt.has_master(), sharded = dp.zero() >= 1;
        v.main = {served(weights, dp.zero() == 3, params), served(!weights_only, sharded, state(AdamW::Array::M)),
                  served(!weights_only, sharded, state(AdamW::Array::V)),
                  served(opt.has_master(), sharded, state(AdamW::Array::Master))};
    } else {
        v.main = {gathered(b.params), gathered(b.local.m), gathered(b.local.v), gathered(b.local.master)};
    }
    if (local_sgd) {
        v.local_dp = outer.dp();
        v.anchor = gathered(outer.anchor);
        v.momentum = gathered(outer.momentum);
        for (const ReplicaState& r : outer.replicas)
            v.replicas.push_back({gathered(r.params), gathered(r.m), gathered(r.v), gathered(r.master)});
    }
    if (powersgd) {
        v.psgd_rank = powersgd->plan().rank;
        for (const std::vector<float>& e : b.errors) v.psgd_errors.push_back(gathered(e));
        v.psgd_q = std::move(q);
    }
    if (snapshot) b.server->snapshot(b.snapshot);
    if (grid.rank != 0) {
        v = {};
        return;
    }
    v.num_params = num_params(model.shape);
}

// Test hook: with LLMC_DUMP_GRADS=<file>, the first step's summed gradient of the whole model is
// written there (llm.c model format, fp32) before the optimizer uses it, so that layouts can be
// compared on gradients, before AdamW amplifies rounding differences. Collective.
// Under fp16's loss scaling the gradients are loss_scale times the true ones: the dump is unscaled.
void dump_gradients(const Model& model, DataParallel& dp, const ParallelConfig& pc, Comm& mp,
                    const ProcessGrid& grid, double loss_scale) {
    const char* path = std::getenv("LLMC_DUMP_GRADS");
    if (!path || !*path) return;
    // with ZeRO >= 1 each DP rank holds the sum for its shard only: gather them like optimizer state
    std::vector<float> local = dp.gather_gradients();
    if (grid.shard_rank() != 0) return;
    std::vector<float> whole = assemble_whole(model.shape, pc, DataParallel::pad_multiple(grid.shard_size()), local, mp);
    if (loss_scale != 1.0)
        for (float& g : whole) g = float(double(g) / loss_scale);
    if (grid.rank == 0) model_file_write(path, model.shape, whole.data(), 3);
}

// The backend and the communicator a config asks for. Throws UserError.
std::string resolve_device(const Config& cfg) {
    std::string device = cfg.device;
    if (device == "auto") device = cuda_device_available() ? "cuda" : "cpu";
    // (the emulation rounds every Tensor an upload writes: host-staged collectives, which the test
    // hook's device memory needs, would round fp32 statistics too)
    if (device == "cpu" && cfg.precision == "fp16" && sim_device())
        throw UserError("precision: \"fp16\" (the CPU's emulation) does not run under the test hook LLMC_SIM_DEVICE");
    if (device == "cuda" && cfg.parallel.grad_compression == "powersgd")
        throw UserError("parallel.grad_compression: \"powersgd\" runs on the CPU backend only (its factors are "
                        "computed in host memory, which would copy every step's gradients through the host on a "
                        "GPU); use \"none\" on device \"cuda\"");
    if (device == "cuda" && !cuda_device_available())
        throw UserError("device: \"cuda\" was asked for but no CUDA device is usable (use \"cpu\" or \"auto\")");
    // fp8 runs on the CPU as fp32 with the linears' FP8 casts emulated exactly (llmc/cpu/fp8.cpp), fp16
    // as fp32 storage rounded to fp16 wherever CUDA would store fp16 (llmc/cpu/fp16_ops.h)
    if (device == "cpu" && cfg.precision == "bf16")
        throw UserError(strfmt("precision: \"%s\" needs device \"cuda\"; the CPU backend trains in \"fp32\" "
                               "(or \"fp16\", \"fp8\", emulated)",
                               cfg.precision.c_str()));
    return device;
}
// The communicator of the data-parallel group (and the world's): "nccl" runs DP's collectives on
// device buffers (llmc/train/data_parallel.h stages bf16 gradients through fp32 device buffers); the
// tensor- and pipeline-parallel groups stay on MPI. "auto" is NCCL on CUDA where there are several
// ranks and every rank of a node has a GPU of its own (the gradients never cross the host), else MPI
// (several ranks share a GPU: every tensor staged through host memory; one process: groups of one,
// which communicate nothing); MPI on the CPU.
std::string resolve_comm(const ParallelConfig& pc, const std::string& device, const Runtime& rt) {
    // (test hook LLMC_SIM_DEVICE: "nccl" on the CPU is MPI acting as NCCL, llmc/comm/device_sim.h)
    if (pc.comm == "nccl" && device == "cpu" && sim_device()) return "nccl";
    if (pc.comm == "nccl" && device != "cuda")
        throw UserError(strfmt("parallel.comm: \"nccl\" needs device \"cuda\" (this run is on %s; use \"mpi\" or "
                               "\"auto\")", device.c_str()));
    if (pc.comm == "auto" && device == "cuda")
        return rt.world > 1 && rt.ranks_per_node <= cuda_device_count() ? "nccl" : "mpi";
    if (pc.comm != "nccl") return "mpi";
    const int gpus = cuda_device_count();
    if (rt.world > 1 && rt.ranks_per_node > gpus)
        throw UserError(strfmt("parallel.comm: \"nccl\" needs a GPU per rank, but a node runs %d ranks on %d GPU%s "
                               "(NCCL cannot put two ranks on one GPU); use \"mpi\" or \"auto\", or launch at most "
                               "%d rank%s per node",
                               rt.ranks_per_node, gpus, gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s"));
    return "nccl";
}


void print_memory_table(Logger& log, const MemoryPlan& m, const Model& model, bool master, DType dtype,
                        const ModelConverter& conv, bool fp16_emulated) {
    const size_t num_params = model.params.num_params;
    auto row = [&](const char* name, size_t bytes, const std::string& note) {
        log.print("  %-13s %11s  %12zu B%s\n", name, human_bytes(double(bytes)).c_str(), bytes, note.c_str());
    };
    log.print("memory per rank (ZeRO-%d over dp %s%d; %zu parameters padded to %zu):\n", m.zero,
              model.layout.cp > 1 ? "x cp " : "", m.dp, num_params, m.padded_params);
    row("parameters", m.params,
        strfmt("  (%s%s%s%s)", dtype_name(dtype), fp16_emulated ? " holding fp16 values" : "",
               m.zero >= 3 ? ", shard" : "", conv.params_note().c_str()));
    row("gradients", m.grads, m.zero >= 2 ? "  (shard)" : "");
    const std::string opt_note = strfmt("m, v%s fp32%s", master ? ", master" : "", m.zero >= 1 ? ", shard" : "");
    row("optimizer", m.optimizer, m.host ? "  (offloaded to the host)" : "  (" + opt_note + ")");
    row("comm buffers", m.comm_buffers, m.zero == 0 ? "  (1 bucket, fp32)" : "  (2 buckets, fp32)");
    if (m.zero >= 3)
        row("unit params", m.unit_params, "  (gathered: the embedding, the head, a layer and the prefetched next)");
    if (m.zero >= 2) row("unit grads", m.unit_grads, "  (the embedding's and head's for the step, one layer's)");
    std::string act = model.layout.sequence_parallel
                          ? strfmt("sequence parallel; %s without it",
                                   human_bytes(double(model.activation_bytes_without_sp())).c_str())
                          : std::string();
    if (model.layout.cp > 1)
        act += std::string(act.empty() ? "" : "; ") +
               strfmt("context parallel: %d tokens of each sequence, ring buffers; %s at cp 1", model.T,
                      human_bytes(double(model.activation_bytes_without_cp())).c_str());
    if (model.recompute != Recompute::None)
        act += std::string(act.empty() ? "" : "; ") +
               (model.recompute == Recompute::Full ? "full recompute" : "selective recompute");
    if (model.offload_activations)
        act += std::string(act.empty() ? "" : "; ") + "offloaded: the layer inputs in host memory, two staging buffers";
    row("activations", m.activations, act.empty() ? act : "  (" + act + ")");
    size_t total = m.total();
    for (const MemoryRow& r : conv.memory_rows()) {
        row(r.name.c_str(), r.bytes, r.note);
        total += r.bytes;
    }
    row("total", total, "");
    // host memory: the offloaded optimizer's and the offloaded activations' (m.host holds both)
    const size_t act_host = model.activation_host_bytes;
    std::string host_note = m.host > act_host ? strfmt("offloaded optimizer, %s, and %d staging pieces",
                                                       opt_note.c_str(), AdamW::kStageSlots)
                                              : std::string();
    if (act_host)
        host_note += std::string(host_note.empty() ? "" : "; ") +
                     strfmt("offloaded activations %s", human_bytes(double(act_host)).c_str());
    if (m.host) row("host memory", m.host, "  (not in the total: " + host_note + ")");
}

// ---- plan: every start-up check, on every rank alike, before any work ----
struct Plan {
    Config cfg;
    bool print_config = false;
    std::string plan_mode;  // --plan: "text", "json" or "search"; the grid is then plan.world's, rank 0's
    ProcessGrid grid;
    ModelShape shape;
    ModelLayout layout;
    PpScheduleKind schedule = PpScheduleKind::OneFOneB;
    std::string device, comm;
};

Plan plan_run(const Runtime& rt, int argc, char** argv) {
    Plan p;
    p.cfg = load_config(argc, argv, &p.print_config, &p.plan_mode);
    const ParallelConfig& pc = p.cfg.parallel;
    const bool planning = !p.plan_mode.empty();
    p.grid = planning ? make_process_grid(pc, plan_world(p.cfg), 0) : make_process_grid(pc, rt.world, rt.rank);
    p.schedule = parse_pp_schedule(pc.pp_schedule);
    p.shape = model_shape(p.cfg.model);
    if (planning) check_plannable(p.cfg, p.shape);  // sizes a plan counts without allocating
    resolve_pp_layers(p.cfg, p.shape);  // "auto": the same split on every rank
    validate_pipeline(p.cfg);
    if (!planning) check_fits_host_memory(p.shape);  // a plan is for machines other than this one
    p.layout = model_layout(p.shape, pc, p.grid.tp_rank, p.grid.pp_rank, p.grid.ep_rank());
    check_model_layout(p.shape, p.layout, p.cfg.train.seq_len);
    if (planning) return p;  // a plan needs no device and no communicator
    p.device = resolve_device(p.cfg);
    p.comm = resolve_comm(pc, p.device, rt);
    return p;
}

// ---- the run: built in dependency order from the plan ----
struct Run {
    Run(Runtime& rt_, const Plan& p)
        : rt(rt_), cfg(p.cfg), tc(cfg.train), pc(cfg.parallel), grid(p.grid), shape(p.shape), device(p.device),
          // ranks share the node's GPUs round-robin (several ranks per GPU under MPI in tests)
          cuda_device(device == "cuda" ? rt.local_rank % std::max(1, cuda_device_count()) : -1),
          groups(make_process_groups(grid, p.comm, pc.timeout_s, cuda_device)),
          ops(device != "cpu"                ? make_cuda_ops(cuda_device)
              : cfg.precision == "fp16" ? make_cpu_fp16_ops()
                                        : make_cpu_ops()),
          dtype(run_dtype(cfg.precision, device)),
          log(std::string(), rt.is_main(), false),
          schedule(make_pipeline_schedule(p.schedule, grid.pp, tc.grad_accum, pc.pp_virtual)),
          tp(*ops, groups.tp.get(), pc.sequence_parallel),
          cp(*ops, grid.cp > 1 ? groups.cp.get() : nullptr),
          params(param_layout(shape, p.layout, DataParallel::pad_multiple(grid.shard_size()))),
          // where the parameters live (whole buffers, or ZeRO's shards: under ZeRO-3 this rank
          // keeps only its shard of them), and the DP (x CP) group's gradient sync: before the model
          // (expert parallelism: the expert-dp group, the dense gradients summed over ep as well)
          // (local SGD: each rank updates its whole replica from its own gradients, ZeRO-0 without
          // communication; pc.zero shards the outer state, local_sgd below)
          dp(params, *ops, dtype, grid.ep > 1 ? *groups.edp : *groups.dp, local() ? 0 : pc.zero, pc.bucket_mb, false,
             groups.ep.get(), local()),
          // with context parallelism the activations hold this rank's seq_len / cp tokens of each sequence
          model(shape, *ops, dtype, tc.micro_batch, tc.seq_len / grid.cp, dp.param_store(), p.layout, &tp,
                pipeline_slots(schedule[size_t(grid.pp_rank)], pc.pp_virtual), parse_recompute(tc.recompute), &cp,
                groups.ep.get(), tc.offload_activations, cfg.precision == "fp8"),
          pipeline(model, *ops, groups.pp.get(), groups.embed.get(), schedule, tc.grad_accum, pc.pp_virtual),
          // this rank's ZeRO range; offloaded: streamed in pieces of a gradient bucket
          opt(params, *ops, dp.opt_begin(), dp.opt_end(), dp.opt_params(), dp.opt_grads(),
              OptimizerOffload{tc.offload_optimizer, dp.bucket_elems()}, dp.opt_runs()),
          // each DP rank reads its own windows (every CP, TP and PP rank of it the same ones)
          train_data(cfg.data.train, tc.micro_batch, tc.seq_len, grid.dp_rank, grid.dp, cfg.data.shuffle,
                     uint64_t(tc.seed), shape.vocab_size),
          ckpt_dir(cfg.checkpoint.dir.empty() ? cfg.out_dir + "/checkpoints" : cfg.checkpoint.dir),
          // MFU: the dense peak of this GPU and precision (0: the CPU, or a GPU not in the table)
          peak_flops(device == "cpu" ? 0.0 : gpu_peak_flops(ops->device_name(), cfg.precision)),
          progress(tc.steps, tokens_per_step(cfg, grid)) {
        if (tc.cuda_graphs && (device == "cpu" || grid.world > 1))
            throw UserError(device == "cpu" ? std::string("train.cuda_graphs: true needs device \"cuda\" (this run is "
                                                          "on the CPU; set it false)")
                                            : strfmt("train.cuda_graphs: true needs one process (this job has %d: the "
                                                     "collectives' host waits; set it false)", grid.world));
        if (device == "cuda")  // (the CPU backend has one way of each: the keys are ignored there)
            set_cuda_kernel_ways(*ops, cuda_kernel_ways(cfg.kernels.attention_forward, cfg.kernels.attention_backward,
                                                        cfg.kernels.layernorm_backward,
                                                        cfg.kernels.attention_wgmma_layout));
        for (Comm* c : {groups.world.get(), groups.dp.get(), groups.cp.get(), groups.tp.get(), groups.pp.get(),
                        groups.mp.get(), groups.embed.get(), groups.ep.get(), groups.edp.get(), groups.mp_dev.get()})
            if (c) {
                c->set_compute_stream(ops->compute_stream());  // device communicators wait for the ops' stream
                c->set_overlap(pc.overlap);
            }
        if (local())
            local_sgd.reset(new LocalSgd(pc.local_sgd, params.padded_params, *ops, *groups.dp, pc.zero, dp.bucket_elems()));
        if (pc.grad_compression == "powersgd") {  // in place of the bucket all-reduce (Q drawn from train.seed)
            powersgd.reset(new PowerSgd(params, pc.powersgd_rank, uint64_t(tc.seed), *ops, *groups.dp, dp.bucket_elems()));
            dp.set_compression(powersgd.get());
        }
        if (!cfg.data.val.empty())
            val_data.reset(new DataLoader(cfg.data.val, tc.micro_batch, tc.seq_len, grid.dp_rank, grid.dp, false, 0,
                                          shape.vocab_size));
        if (!cfg.tokenizer_dir.empty()) tok.reset(new Tokenizer(Tokenizer::load(cfg.tokenizer_dir)));
        // the step's one read back: the norm's two doubles, the update decision, the losses
        // (kept on the backend; not under MoE, whose routing reads back anyway)
        defer = !shape.moe.enabled();
        loss_rows = defer ? size_t(tc.grad_accum) * size_t(model.B) * size_t(model.T) : 0;
        readback = static_cast<double*>(ops->alloc(kReadbackHead + loss_rows * sizeof(float)));
    }
    ~Run() { ops->release(readback); }
    // readback: ss[2] (DataParallel::grad_norm_squares), ctl[2] floats (Ops::step_control), the
    // converter's word (ModelConverter::end_step), padding, then loss_rows floats
    static constexpr size_t kReadbackHead = 32, kConvWordAt = 24;
    float* ctl() const { return reinterpret_cast<float*>(readback + 2); }
    float* conv_word() const { return reinterpret_cast<float*>(reinterpret_cast<char*>(readback) + kConvWordAt); }
    bool local() const { return pc.local_sgd.every > 0; }
    float* losses() const { return reinterpret_cast<float*>(reinterpret_cast<char*>(readback) + kReadbackHead); }
    Runtime& rt;
    const Config cfg;
    const TrainConfig& tc;
    const ParallelConfig& pc;
    const ProcessGrid grid;
    const ModelShape shape;
    const std::string device;
    const int cuda_device;
    ProcessGroups groups;
    std::unique_ptr<Ops> ops;
    const DType dtype;
    Logger log;  // console only until out_dir exists
    const PpSchedule schedule;
    TensorParallel tp;
    ContextParallel cp;
    const ParamLayout params;  // this rank's parameters in memory order
    DataParallel dp;
    Model model;
    PipelineEngine pipeline;
    AdamW opt;
    std::unique_ptr<LocalSgd> local_sgd;  // parallel.local_sgd: the outer optimizer (null: plain data parallelism)
    std::unique_ptr<PowerSgd> powersgd;   // parallel.grad_compression = powersgd (null: the plain all-reduce)
    DataLoader train_data;
    std::unique_ptr<DataLoader> val_data;
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<ModelConverter> conv;
    std::unique_ptr<Logger> run_log;
    const std::string ckpt_dir;
    const double peak_flops;
    TrainState state;
    int bad_in_row = 0;  // steps skipped in a row for a non-finite loss or gradient norm (in all: state.skipped)
    bool grads_dumped = false;  // LLMC_DUMP_GRADS: the run's first step only
    Progress progress;
    bool defer = false;
    size_t loss_rows = 0;
    double* readback = nullptr;
    SaveBuffers save_buffers;  // kept from one save to the next; pending_save's while that runs
    // checkpoint.async: world rank 0's checkpoint being written in the background (last: a run that
    // ends on an exception waits for it before anything else goes)
    AsyncSave pending_save;
};

double tokens_per_step(const Run& r) { return tokens_per_step(r.cfg, r.grid); }
// What the data-parallel collectives have sent from this rank so far (DataParallel::bytes_sent's measure).
double dp_bytes_sent(const Run& r) {
    return r.dp.bytes_sent() + (r.local_sgd ? r.local_sgd->bytes_sent() : 0.0) +
           (r.powersgd ? r.powersgd->bytes_sent() : 0.0);
}

// PowerSGD's state from a checkpoint: each DP rank its own error feedback, and Q. A checkpoint of
// another rank or without it (a change checkpoint.allow_changes let through) starts afresh.
void resume_powersgd(Run& r, const StateView& saved, const std::string& from) {
    const int saved_dp = int(saved.psgd_errors.size());
    if (!r.powersgd) {
        if (saved_dp > 0)
            r.log.print("resume: the checkpoint's PowerSGD state (rank %d) is not used: this run all-reduces the "
                        "gradients uncompressed\n",
                        saved.psgd_rank);
        return;
    }
    if (saved_dp > 0 && saved_dp != r.grid.dp)
        throw UserError(strfmt("checkpoint.resume: %s holds the PowerSGD error feedback of %d DP ranks, this run has "
                               "parallel.dp = %d; a PowerSGD run resumes at the dp that saved it (each DP rank "
                               "continues its own)",
                               from.c_str(), saved_dp, r.grid.dp));
    if (saved_dp == 0 || saved.psgd_rank != r.powersgd->plan().rank || saved.psgd_q.size() != r.powersgd->q().size()) {
        r.log.print("PowerSGD starts at step %d with no error feedback and fresh factors Q (the checkpoint has %s)\n",
                    r.state.step, saved_dp == 0 ? "none" : strfmt("rank %d's", saved.psgd_rank).c_str());
        return;
    }
    r.powersgd->set_state(r.model.from_file_order(saved.psgd_errors[size_t(r.grid.dp_rank)]), saved.psgd_q);
}

// precision fp16: the dynamic loss scale's start (PyTorch's GradScaler's too)
constexpr double kInitialLossScale = 65536.0;

// The initial weights (random or a file), or a checkpoint to continue from, which any layout
// resumes: every rank reads only the pieces it holds (its part of the weights, its ZeRO shard of the
// optimizer state), world rank 0 having checked the whole files first (their checksums, the
// weights finite) in constant memory: no rank holds the whole state. No collective:
// train() agrees on its UserErrors, so that one every rank finds is said once, by rank 0, and rank
// 0's finding (a corrupt file) stops the others before any step.
void init_or_resume(Run& r) {
    const Config& cfg = r.cfg;
    std::string from;
    if (cfg.checkpoint.resume == "auto") from = checkpoint_latest(r.ckpt_dir);
    else if (cfg.checkpoint.resume != "never") from = cfg.checkpoint.resume;
    // a resumed run takes every weight from the checkpoint: model.init is not drawn or read
    if (from.empty()) {
        if (cfg.model.init == "random") {
            r.model.init_random(uint64_t(cfg.model.init_seed));
        } else {
            // llm.c's format or safetensors, read like a checkpoint's model.bin: world rank 0 checks
            // the whole file (every weight finite, named by its tensor as the file names it) without
            // holding it; every rank reads only the part of the model it holds
            const std::string& init = cfg.model.init;
            const bool hf = is_safetensors(init);
            if (r.rt.is_main() && hf) hf_check_weights(init, r.shape);
            if (r.rt.is_main() && !hf) model_file_scan(init, &r.shape);
            r.model.set_params_whole(hf ? hf_weights_pieces(init, r.shape) : model_file_pieces(init, &r.shape));
        }
        r.opt.sync_master_from_params();  // the optimizer was built before the weights were set
    }
    r.state.loader_dp = r.grid.dp;
    r.state.train_shards = shard_list(r.train_data.files());
    bool outer_loaded = false;
    if (!from.empty()) {
        if (r.rt.is_main()) checkpoint_load(from, r.shape, nullptr);
        const StateView saved = checkpoint_open(from, r.shape);
        r.state = saved.st;
        check_resume_within(r.state, r.tc.steps, from);
        const std::string changes =  // refused unless checkpoint.allow_changes when they break exactness
            check_resume_changes(resume_changes(r.state, cfg, r.grid.dp, shard_list(r.train_data.files())), cfg, from);
        // under local SGD each DP rank continues its own replica (DP rank 0's: the main state)
        const bool saved_local = saved.local_dp > 0;
        const int replica = r.local_sgd && saved_local ? r.grid.dp_rank : 0;
        if (r.local_sgd && saved_local && saved.local_dp != r.grid.dp)
            throw UserError(strfmt("checkpoint.resume: %s holds the local SGD replicas of %d DP ranks, this run has "
                                   "parallel.dp = %d; a local SGD run resumes at the dp that saved it (each DP rank "
                                   "continues its own replica)",
                                   from.c_str(), saved.local_dp, r.grid.dp));
        const ArraysView& mine = replica > 0 ? saved.replicas[size_t(replica - 1)] : saved.main;
        r.model.set_params_whole(mine.params);
        const AdamW::Runs& runs = r.opt.runs();  // this rank's shard: only it is read, an array at a time
        r.opt.set_state(AdamW::Array::M, r.model.from_file_order(mine.m, runs));
        r.opt.set_state(AdamW::Array::V, r.model.from_file_order(mine.v, runs));
        if (r.opt.has_master() && mine.master)
            r.opt.set_state(AdamW::Array::Master, r.model.from_file_order(mine.master, runs));
        else  // (an fp32 run's checkpoint keeps none; a no-op where this run keeps none)
            r.opt.sync_master_from_params();
        outer_loaded = r.local_sgd && saved_local;
        if (outer_loaded)
            r.local_sgd->set_state(r.model.from_file_order(saved.anchor), r.model.from_file_order(saved.momentum));
        else if (r.local_sgd)
            r.log.print("local SGD starts at step %d from the checkpoint's weights (the anchor; outer momentum 0)\n",
                        r.state.step);
        else if (saved_local)
            r.log.print("resume: the checkpoint's local SGD state (%d replicas) is not used: this run continues DP "
                        "rank 0's weights and moments with plain data parallelism\n",
                        saved.local_dp);
        resume_powersgd(r, saved, from);
        r.state.loader = convert_loader_position(r.state.loader, r.state.loader_dp, r.grid.dp, cfg.data.shuffle);
        r.train_data.set_position(r.state.loader);
        r.conv->load(saved.fp8, from, r.log);
        r.log.print("%sresumed from %s at step %d (saved at dp %d)\n", changes.c_str(), from.c_str(), r.state.step,
                    r.state.loader_dp);
        r.state.loader_dp = r.grid.dp;
        r.state.train_shards = shard_list(r.train_data.files());
    }
    // precision fp16's loss scale: a fixed one is the config's; the dynamic one continues from the
    // checkpoint (its scale and clean-step count), else starts at kInitialLossScale
    if (cfg.precision != "fp16") {
        r.state.loss_scale = 0.0, r.state.loss_scale_clean = 0;
    } else if (r.tc.loss_scale > 0.0) {
        r.state.loss_scale = r.tc.loss_scale, r.state.loss_scale_clean = 0;
    } else if (!(r.state.loss_scale > 0.0)) {
        r.state.loss_scale = kInitialLossScale, r.state.loss_scale_clean = 0;
    }
    if (r.local_sgd && !outer_loaded) r.local_sgd->start(r.opt);  // the anchor: this start's weights
    if (r.rt.is_main()) {
        prepare_run_dirs(cfg, r.ckpt_dir);  // lock out_dir, check that it is writable and free
        if (!from.empty() && cfg.checkpoint.resume != "auto")  // rolling back: the later branch goes aside
            for (const std::string& a : set_aside_later_checkpoints(r.ckpt_dir, r.state.step))
                r.log.print("set aside %s (a later checkpoint of the branch this run rolls back)\n", a.c_str());
    }
    const std::string log_path = cfg.log.jsonl.empty() ? cfg.out_dir + "/log.jsonl" : cfg.log.jsonl;
    if (r.rt.is_main() && !from.empty()) trim_run_log(log_path, r.state.step);  // the log reads as one run
    r.run_log.reset(new Logger(log_path, r.rt.is_main(), !from.empty()));
}

void print_banner(Run& r, const Plan& p) {
    const ModelShape& s = r.shape;
    const ProcessGrid& g = r.grid;
    Logger& log = r.log;
    log.print("train_gpt | device %s | precision %s | %s: %d layers, %d heads (%d kv), d_model %d, ffn %d, vocab %d "
              "(padded %d), max_seq_len %d\n",
              r.device.c_str(), r.conv->describe().c_str(), arch_name(s.arch), s.n_layer, s.n_head, s.kv_heads(),
              s.d_model, s.ffn(), s.vocab_size, s.padded_vocab, s.max_seq_len);
    if (s.moe.enabled()) log.print("%s\n", moe_describe(s.moe, s.n_layer).c_str());
    if (r.tc.cuda_graphs)
        log.print("cuda graphs: after a clean warm-up step, one step's device work is captured and every later "
                  "step launches it (log.jsonl: cuda_graph)\n");
    if (r.state.loss_scale > 0.0)
        log.print("fp16: parameters, gradients and activations in IEEE half%s, fp32 master weights and moments; %s\n",
                  r.ops->emulates_fp16() ? " (emulated exactly on the CPU: fp32 storage rounded to fp16)" : "",
                  r.tc.loss_scale > 0.0
                      ? strfmt("loss scale fixed at %g", r.tc.loss_scale).c_str()
                      : strfmt("dynamic loss scale %g (halves on an overflow, doubles after %d clean steps)",
                               r.state.loss_scale, r.tc.loss_scale_window).c_str());
    const std::string procs =
        strfmt("parallel: %d process%s = %s", g.world, g.world == 1 ? "" : "es", g.describe().c_str());
    if (r.powersgd) {
        const PowerSgdPlan& ps = r.powersgd->plan();
        log.print("%s; ZeRO-0; comm %s; PowerSGD rank %d: %zu matrices compressed, %zu elements sent as they are; "
                  "%zu floats per step instead of %zu (compression %.2fx); error feedback and factors %s in host "
                  "memory\n",
                  procs.c_str(), r.groups.dp->name().c_str(), ps.rank, ps.matrices.size(), ps.plain_elems, ps.sent(),
                  ps.total, ps.ratio(), human_bytes(double(r.powersgd->host_bytes())).c_str());
    } else if (r.local_sgd) {
        log.print("%s; local SGD: every %d steps the outer step (lr %g, Nesterov momentum %g), no gradient "
                  "all-reduce; outer state %s in host memory (ZeRO-%d: %s); comm %s\n",
                  procs.c_str(), r.local_sgd->every(), r.pc.local_sgd.outer_lr, r.pc.local_sgd.outer_momentum,
                  human_bytes(double(r.local_sgd->host_bytes())).c_str(), r.local_sgd->zero(),
                  r.local_sgd->zero() ? "this rank's shard" : "whole", r.groups.dp->name().c_str());
    } else {
        log.print("%s; ZeRO-%d; comm %s; %zu gradient bucket%s of <= %zu elements\n", procs.c_str(), r.dp.zero(),
                  r.groups.dp->name().c_str(), r.dp.buckets().size(), r.dp.buckets().size() == 1 ? "" : "s",
                  r.dp.bucket_elems());
    }
    if (g.tp > 1)
        log.print("tensor parallel: %d ranks, %d heads and %d vocabulary rows each%s\n", g.tp, s.n_head / g.tp,
                  s.vocab_shard(g.tp),
                  p.layout.sequence_parallel ? "; sequence parallel (1/tp of the tokens outside attention and MLP)" : "");
    if (g.ep > 1)
        log.print("expert parallel: %d ranks, %d of the %d experts of each MoE layer each (experts [%d, %d) here); "
                  "expert gradients and ZeRO shards over the %d expert-dp ranks%s\n",
                  g.ep, s.moe.num_experts / g.ep, s.moe.num_experts, p.layout.experts_begin(s.moe.num_experts),
                  p.layout.experts_end(s.moe.num_experts), g.edp(),
                  r.dp.zero() >= 1 ? strfmt(", the dense optimizer state over all %d dp ranks", g.dp).c_str() : "");
    if (g.cp > 1)
        log.print("context parallel: %d ranks, %d of each sequence's %d tokens each (chunks of %d, ring attention)\n",
                  g.cp, r.model.T, r.tc.seq_len, r.model.T / 2);
    if (g.pp > 1) {
        std::string stages;
        const auto split = pp_layer_split(s.n_layer, g.pp, r.pc.pp_virtual, r.pc.pp_layers);
        for (size_t i = 0; i < split.size(); i++) stages += strfmt("%s[%d, %d)", i ? " " : "", split[i].first, split[i].second);
        log.print("pipeline: layers per virtual stage %s\n", stages.c_str());
        log.print("pipeline: %s\n", describe_pipeline(p.schedule, g.pp, r.tc.grad_accum, r.pc.pp_virtual).c_str());
    }
    log.print("batch: %d x %d tokens x %d accumulation x %d DP ranks = %.0f tokens per step; %d steps\n",
              r.tc.micro_batch, r.tc.seq_len, r.tc.grad_accum, g.dp, tokens_per_step(r), r.tc.steps);
    log.print("train data: %zu shard(s), %llu micro-batches per epoch\n", r.train_data.num_shards(),
              (unsigned long long)r.train_data.windows_per_epoch());
    MemoryPlan mem = r.dp.memory_plan(r.opt.has_master(), r.model.activation_bytes, r.opt.offloaded());
    if (r.tc.offload_activations)  // (from the sizes, as the plan counts it; `got` below is what the model holds)
        mem.host += Model::activation_host_bytes_of(r.shape, r.dtype, r.tc.micro_batch, r.tc.seq_len / r.grid.cp,
                                                    r.model.layout,
                                                    pipeline_slots(r.schedule[size_t(r.grid.pp_rank)], r.pc.pp_virtual));
    print_memory_table(log, mem, r.model, r.opt.has_master(), r.dtype, *r.conv, r.ops->emulates_fp16());
    const MemoryPlan got = r.dp.allocated(r.opt.device_bytes(), r.opt.host_bytes() + r.model.activation_host_bytes,
                                          r.model.activation_bytes);
    LLMC_ASSERT(got.params == mem.params && got.grads == mem.grads && got.optimizer == mem.optimizer &&
                    got.comm_buffers == mem.comm_buffers && got.unit_params == mem.unit_params &&
                    got.unit_grads == mem.unit_grads && got.activations == mem.activations && got.host == mem.host,
                "allocations disagree with the memory table");
    // the first record of log.jsonl: what each rank position allocated (--plan=json's "memory")
    r.run_log->record({{"memory", gather_memory_json(got, *r.groups.mp, r.grid.tp, r.grid.ep, r.groups.edp.get())}});
    if (r.device != "cpu")
        log.print("device: %s, dense %s peak %.1f TFLOP/s%s\n", r.ops->device_name().c_str(), r.cfg.precision.c_str(),
                  r.peak_flops / 1e12, r.peak_flops > 0 ? "" : " (not in the table: no MFU)");
}

// The checkpoint written in the background (checkpoint.async), if it has finished (wait: once it
// has): its line, or its failure rethrown (UserError: exit 2; NonFiniteState). World rank 0, the
// only one that writes.
void collect_save(Run& r, bool wait) {
    if (!r.pending_save.pending() || (!wait && !r.pending_save.finished())) return;
    AsyncSave::Result done;
    try {
        done = r.pending_save.wait();
    } catch (const UserError& e) {  // the message names the checkpoint; say why training went on past it
        throw UserError(strfmt("%s (written in the background: training went on to step %d, which is not saved)",
                               e.what(), r.state.step));
    }
    r.log.print("checkpoint: %s (written in the background in %.1f s)\n", done.path.c_str(), done.seconds);
    r.progress.wrote_checkpoint(done.path);
}
// checkpoint.async: world rank 0 waits for the write in flight, every other rank for its server
// (which ends when the write does), then all for rank 0 on the untimed save group. Before every
// save (one write at a time, never two snapshots in memory) and before a stop.
void finish_save(Run& r) {
    if (!r.cfg.checkpoint.async) return;
    if (r.rt.is_main()) collect_save(r, true);
    else r.pending_save.wait();
    r.groups.save->barrier();
}

// Checkpoint (collective: world rank 0 writes the state, read from the ranks that hold it as it
// goes, while the others answer its requests and wait on the untimed save group; under
// checkpoint.async, all but the final and a stop signal's, every rank copies what it holds and
// training goes on while world rank 0 writes on a thread of its own and the others answer on
// theirs). The final one also writes the weights in
// the formats of out.format: out_dir/model_<steps>.bin (fp32, llm.c's format) and/or
// model_<steps>.safetensors with transformers' config.json: after the checkpoint, so that a
// failure there loses no training. Nothing non-finite is written.
void write_state(Run& r, SaveBuffers& b, bool final, bool background) {
    StateView& view = b.view;
    view.st = r.state;
    if (!final || r.cfg.checkpoint.every > 0) {  // (checkpoint_save checks the state as it writes)
        r.conv->save(view.fp8);
        if (background) {  // the rest by value: training goes on changing r (b: untouched until collected)
            r.pending_save.start([dir = r.ckpt_dir, v = &view, shape = r.shape,
                                  version = r.dtype == DType::BF16 ? 5 : 3, config = r.cfg.resolved,
                                  keep = r.cfg.checkpoint.keep, server = b.server] {
                comm_waits_uncounted_here();
                std::string path;
                try {
                    path = checkpoint_save(dir, *v, shape, version, config, keep);
                } catch (...) {
                    server->finish();  // the others' servers end; the failure is rethrown by wait()
                    throw;
                }
                server->finish();
                return path;
            });
            return;
        }
        const std::string p = checkpoint_save(r.ckpt_dir, view, r.shape, r.dtype == DType::BF16 ? 5 : 3,
                                              r.cfg.resolved, r.cfg.checkpoint.keep);
        r.log.print("checkpoint: %s\n", p.c_str());
        r.progress.wrote_checkpoint(p);
    } else {
        check_finite_state(view, r.state.step);  // (the weights alone: gathered weights_only)
    }
    if (!final) return;
    const ReadFileOrder& w = view.main.master ? view.main.master : view.main.params;
    const std::string stem = r.cfg.out_dir + strfmt("/model_%08d", r.tc.steps), fmt = r.cfg.out.format;
    if (fmt == "llmc" || fmt == "both") {
        model_file_write(stem + ".bin", r.shape, w, 3);
        r.progress.wrote_weights(stem + ".bin");
    }
    if (fmt == "hf" || fmt == "both") {
        hf_write_weights(stem + ".safetensors", r.shape, w);
        hf_write_config(r.cfg.out_dir + "/config.json", r.shape);
        r.progress.wrote_weights(stem + ".safetensors (transformers; " + r.cfg.out_dir + "/config.json)");
    }
}
// background: a checkpoint.async run's periodic checkpoint.
void save(Run& r, bool final, bool background = false) {
    finish_save(r);
    // out.format none without checkpoints: nothing to write, so nothing to gather (a benchmark of
    // the 1.5B shape spent a minute writing 6 GB of final weights)
    if (final && r.cfg.out.format == "none" && r.cfg.checkpoint.every <= 0) return;
    const bool weights_only = final && r.cfg.checkpoint.every <= 0;  // (write_state writes no checkpoint then)
    // world rank 0 holds the whole model (one process, or data parallelism alone) and the whole state
    const bool live =
        !background && r.groups.mp->size() == 1 && holds_whole_piece(r.dp) && !r.local_sgd && !r.powersgd;
    SaveBuffers& b = r.save_buffers;
    gather_state(r.model, r.opt, r.dp, r.local_sgd.get(), r.powersgd.get(), r.pc, *r.groups.mp, r.grid, b,
                 weights_only, live, background ? r.groups.async_save.get() : r.groups.save.get(), background);
    if (r.rt.is_main()) {
        write_state(r, b, final, background);  // (background: its thread calls the server's finish())
        if (b.server && !background) b.server->finish();
    } else if (background) {
        r.pending_save.start([server = b.server] {
            comm_waits_uncounted_here();
            server->serve();
            return std::string();
        });
    } else if (b.server) {  // (none in a live save: world rank 0 reads its own state)
        b.server->serve();
    }
    r.groups.save->barrier();  // saving does not count against parallel.timeout_s
}

// Validation loss and a sample, at their intervals and at the end. Returns the stop signal that
// cut them short (0: none), alike on every rank.
int evaluate_and_sample(Run& r, int step, std::vector<int32_t>& x, std::vector<int32_t>& y) {
    const Config& cfg = r.cfg;
    const bool last = step == r.tc.steps;
    int sig = 0;
    Comm& world = *r.groups.world;
    if (r.val_data && cfg.eval.every > 0 && (step % cfg.eval.every == 0 || last)) {
        const double vl =
            evaluate(r.pipeline, *r.val_data, r.cp, cfg.eval.batches, r.model.B, r.model.T, x, y, r.dp, world, &sig);
        if (sig) return sig;
        r.log.print("step %d | val loss %.6f\n", step, vl);
        r.run_log->record({{"step", step}, {"val_loss", vl}});
        r.progress.val_loss(step, vl);
    }
    // the model-parallel ranks of DP rank 0 sample together (under ZeRO-3 every DP rank, for the
    // gathers of the parameters; under expert parallelism too, for the MoE layers' all-to-all);
    // world rank 0 prints
    if (cfg.eval.sample_every <= 0 || step == 0 || (step % cfg.eval.sample_every != 0 && !last)) return 0;
    fault_point("sample", step);  // test hook: a signal as the sample begins (LLMC_FAULT=term:sample_<step>)
    if (r.grid.dp_rank != 0 && r.dp.zero() != 3 && r.grid.ep == 1) {
        sample_wait(cfg.eval.sample_tokens, world, &sig);
        return sig;
    }
    const int eot = r.tok ? r.tok->eot() : std::min(50256, r.shape.vocab_size - 1);
    const std::vector<int> ids = sample(r.pipeline, r.model, r.tp, r.cp, eot, cfg.eval.sample_tokens,
                                        uint64_t(r.tc.seed) * 1000003ull + step, world, &sig);
    if (sig) return sig;
    if (r.tok) {
        r.log.print("step %d | sample:\n%s\n---\n", step, r.tok->decode(ids).c_str());
    } else {
        std::string text;
        for (int id : ids) text += strfmt("%d ", id);
        r.log.print("step %d | sample (token ids; set \"tokenizer\" to decode): %s\n", step, text.c_str());
    }
    return 0;
}

// The MoE layers' statistics of this step over all ranks (llmc/model/moe.h): the load-balancing loss
// (the sum over the MoE layers, without aux_loss_coef, averaged over micro-batches and DP ranks;
// the logged loss includes aux_loss_coef times it), the least and most loaded expert's fraction
// of the routed (token, slot) pairs in any layer and micro-batch, the fraction dropped past capacity.
void log_moe(Run& r, nlohmann::json& rec, std::string& extra) {
    const Model::MoeStats st = r.model.take_moe_stats();
    double sums[4] = {st.aux_sum, double(st.aux_terms), double(st.dropped), double(st.pairs)};
    double maxes[2] = {-st.load_min, st.load_max};
    r.groups.world->all_reduce(sums, 4, ReduceOp::Sum);
    r.groups.world->all_reduce(maxes, 2, ReduceOp::Max);
    const int moe_layers = r.shape.n_layer / r.shape.moe.every;
    const double aux = sums[1] > 0 ? sums[0] / sums[1] * moe_layers : 0.0, dropped = sums[3] > 0 ? sums[2] / sums[3] : 0.0;
    rec["moe_aux"] = aux;
    rec["moe_load_min"] = -maxes[0];
    rec["moe_load_max"] = maxes[1];
    rec["moe_dropped"] = dropped;
    extra += strfmt(" | moe aux %.4f load %.3f-%.3f dropped %.1f%%", aux, -maxes[0], maxes[1], 100.0 * dropped);
}

// One optimizer step: grad_accum micro-batches through the pipeline, the gradient sync, clipping
// and AdamW (under local SGD: no gradient sync, and every parallel.local_sgd.every steps the outer
// step); logs the step.
void train_step(Run& r, int step, Batches& x, Batches& y) {
    const TrainConfig& tc = r.tc;
    const double t0 = now_ms(), comm0 = comm_wait_ms(), bytes0 = dp_bytes_sent(r);
    const OpsCounters c0 = r.ops->counters();
    const uint64_t waits0 = comm_waits();
    // the gradient is the mean over the step's tokens: all DP ranks' (summed by the gradient sync),
    // or under local SGD this rank's own (its AdamW alone uses it); under fp16 times the loss scale
    // S (the backward's seed: every gradient is S times the true one, step_control unscales)
    const double S = r.state.loss_scale > 0.0 ? r.state.loss_scale : 1.0;
    const float dloss = float(S / (r.local_sgd ? tokens_per_step(r) / r.grid.dp : tokens_per_step(r)));
    // the backward's seed. Test hook: LLMC_FAULT=nan:grad_<n> (LLMC_FAULT_RANK on a last pipeline
    // stage) makes step n's gradients NaN
    const float seed = fault_point("grad", step + 1) ? NAN : dloss;
    // train.cuda_graphs: the step's device work, to its read back, is one graph (Ops::graph_step_begin);
    // what the step's ops take by value from the host and may change: the seed and S
    uint64_t key = 0;
    std::memcpy(&key, &seed, sizeof(seed));
    key ^= uint64_t(std::hash<double>{}(S)) << 1;
    const std::string graph = tc.cuda_graphs ? r.ops->graph_step_begin(key) : std::string();
    r.model.zero_grads();
    r.conv->begin_step();
    for (int micro = 0; micro < tc.grad_accum; micro++)
        next_batch(r.train_data, r.cp, r.model.B, r.model.T, x[size_t(micro)], y[size_t(micro)]);
    r.model.defer_losses(r.defer ? r.losses() : nullptr, r.loss_rows);
    r.pipeline.set_defer_loss(r.defer);
    // gradient buckets go out during the last micro-step's backward, none before
    double loss = r.pipeline.train_step(x, y, r.model.B, r.model.T, seed, r.dp.grads_ready());
    const std::vector<size_t> rows = r.model.take_deferred_rows();
    r.model.defer_losses(nullptr, 0);
    r.pipeline.set_defer_loss(false);
    fault_point("train_step", step + 1);  // test hook: a rank dies mid-collective
    r.dp.finish_grad_sync();
    nlohmann::json rec = {{"step", step + 1}};
    if (!graph.empty()) rec["cuda_graph"] = graph;
    std::string extra;
    r.conv->end_step(*r.groups.world, r.conv_word());
    if (!r.grads_dumped) dump_gradients(r.model, r.dp, r.pc, *r.groups.mp, r.grid, S);
    r.grads_dumped = true;
    size_t nloss = 0;
    for (size_t n : rows) nloss += n;
    if (r.defer) {  // the losses' check: finite exactly when every loss is
        r.ops->sum_squares_multi(r.readback + 1, {Tensor(r.losses(), nloss, DType::F32)});
    } else {
        loss = r.dp.mean(loss);
        const double bad = std::isfinite(loss) ? 0.0 : double(NAN);
        r.ops->from_host_bytes(r.readback + 1, &bad, sizeof(bad));
    }
    if (r.shape.moe.enabled()) log_moe(r, rec, extra);
    // the gradient norm, clipping and the non-finite check on the backend: a non-finite loss or
    // gradient norm (alike on every rank: both are reduced over all) skips the update (Ops::adamw_multi
    // reads the decision), weights and optimizer moments stay as they were
    r.dp.grad_norm_squares(r.readback, r.groups.norm_group());
    r.ops->step_control(r.ctl(), r.readback, tc.grad_clip, S);
    const double lr = lr_at(tc, step);
    const AdamWHyper h{float(lr), float(tc.beta1), float(tc.beta2), float(tc.eps), float(tc.weight_decay)};
    r.dp.before_update();
    r.opt.step(h, step + 1, r.ctl(), uint32_t(tc.seed * 2654435761u + step));
    r.dp.after_update();
    const bool outer_step = r.local_sgd && r.local_sgd->due(step + 1, tc.steps);
    if (outer_step) r.local_sgd->sync(r.opt);
    // the step's one wait for the backend: norm, decision and losses (enqueue_ms: how long the host
    // took to queue the step's work before it; under train.cuda_graphs a replayed step's graph is
    // launched at this read back, so there it is the time the device waited for the host)
    std::vector<char> back(Run::kReadbackHead + nloss * sizeof(float));
    const double enqueue_ms = now_ms() - t0;
    r.ops->to_host_bytes(back.data(), r.readback, back.size());
    double ss[2];
    std::memcpy(ss, back.data(), sizeof(ss));
    const double grad_norm = std::sqrt(ss[0]) / S;
    if (r.defer) {
        const float* l = reinterpret_cast<const float*>(back.data() + Run::kReadbackHead);
        for (size_t n : rows) {
            loss += Model::deferred_loss(l, n);
            l += n;
        }
        loss = r.dp.mean(r.pipeline.finish_loss(loss));
    }
    // Ops::step_control's decision (alike on every rank but under local SGD: each replica's own)
    float conv_word;
    std::memcpy(&conv_word, back.data() + Run::kConvWordAt, sizeof(conv_word));
    r.conv->log_step(conv_word, rec, extra);
    const bool finite_here = std::isfinite(ss[0]) && std::isfinite(ss[1]);
    const double ms = now_ms() - t0, tok_s = tokens_per_step(r) / (ms / 1000.0);
    const double comm_ms = comm_wait_ms() - comm0;  // this rank's time inside communication waits
    // what crossed between host and backend in this step, and the communicators' waits (on NCCL
    // host polls too; not the backend's): the most of any rank (Ops::counters)
    const OpsCounters dc = r.ops->counters() - c0;
    // and the bytes the data-parallel collectives sent; a skipped update on any rank
    double most[9] = {double(dc.host_syncs), double(dc.h2d_bytes), double(dc.d2h_bytes), double(dc.launches),
                      double(comm_waits() - waits0), dp_bytes_sent(r) - bytes0, finite_here ? 0.0 : 1.0,
                      std::isfinite(ss[1]) ? 0.0 : 1.0, double(dc.allocs)};
    if (r.grid.world > 1) r.groups.world->all_reduce(most, 9, ReduceOp::Max);
    rec.update({{"host_syncs", uint64_t(most[0])}, {"h2d_bytes", uint64_t(most[1])}, {"d2h_bytes", uint64_t(most[2])},
                {"launches", uint64_t(most[3])}, {"comm_waits", uint64_t(most[4])},
                {"dp_bytes", uint64_t(std::llround(most[5]))}, {"allocs", uint64_t(most[8])}});
    if (r.powersgd) rec["compression"] = r.powersgd->plan().ratio();  // floats of the plain all-reduce / sent
    // the stop policy's count agrees on every rank (under local SGD a replica may skip alone)
    const bool finite = most[6] == 0.0;
    // fp16: a non-finite gradient of a finite loss is an overflow of the scaled gradient. The
    // dynamic scale halves on it (down to 1) and doubles after loss_scale_window clean steps; an
    // overflow that halved the scale is cured by it and does not count toward max_bad_steps
    const bool fp16 = r.state.loss_scale > 0.0, dynamic = fp16 && tc.loss_scale == 0.0;
    const bool overflow = fp16 && !finite && most[7] == 0.0;
    bool bad = !finite;
    if (fp16) {
        rec["loss_scale"] = S;
        extra += strfmt(" | loss scale %g", S);
        if (dynamic && overflow && S > 1.0) {
            r.state.loss_scale = S / 2, r.state.loss_scale_clean = 0;
            bad = false;
        } else if (dynamic && finite && ++r.state.loss_scale_clean >= tc.loss_scale_window) {
            r.state.loss_scale = S * 2, r.state.loss_scale_clean = 0;
        }
    }
    r.bad_in_row = finite ? 0 : r.bad_in_row + bad;
    r.state.skipped += !finite;
    if (outer_step) extra += " | outer step";
    r.progress.step_done(ms);
    rec.update({{"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm}, {"ms", ms}, {"enqueue_ms", enqueue_ms},
                {"comm_ms", comm_ms}, {"compute_ms", ms - comm_ms}, {"tok_per_s", tok_s},
                {"tokens", r.progress.tokens()}});
    // MFU on GPUs: model FLOPs (6N + 12LCT per token) over the dense peak of this GPU and precision;
    // tokens/s is the whole job's, each GPU does 1/world of the work
    if (r.peak_flops > 0) {
        const double mfu = flops_per_token(r.shape, tc.seq_len) * tok_s / r.grid.world / r.peak_flops;
        rec["mfu"] = mfu;
        extra = strfmt(" | MFU %.1f%%", 100.0 * mfu) + extra;
    }
    if (!finite) {
        rec["skipped"] = overflow ? "overflow" : "nonfinite";
        rec["skipped_steps"] = r.state.skipped;
        if (overflow && !bad)
            extra += strfmt(" | skipped (overflow): no update; loss scale %g -> %g; %d skipped so far", S,
                            r.state.loss_scale, r.state.skipped);
        else
            extra += strfmt(" | skipped (%s): no update; %d skipped so far, %d in a row",
                            overflow ? (dynamic ? "overflow at loss scale 1" : "overflow at the fixed loss scale")
                                     : "non-finite",
                            r.state.skipped, r.bad_in_row);
    }
    r.log.print("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s%s\n", step + 1, tc.steps,
                loss, lr, grad_norm, ms, tok_s, r.progress.step_suffix().c_str(), extra.c_str());
    r.run_log->record(rec);
    r.state.step = step + 1;
    r.state.loader = r.train_data.position();
}

// Every rank alike, on a stop signal that all agreed on: a checkpoint of the state after the last
// whole step (unless one was just written), and exit "resume me".
int stop_for_signal(Run& r, int sig, const std::string& where, bool need_save) {
    if (need_save) save(r, false);
    finish_save(r);  // this step's checkpoint.async one, if that one was due
    r.log.print("%s: stopped %s, checkpoint saved; exit code %d (resume with checkpoint.resume=auto)\n",
                signal_name(sig).c_str(), where.c_str(), int(kExitPreempted));
    r.rt.barrier();  // no rank leaves (and makes its launcher end the job) before the save is done
    return kExitPreempted;
}

// After a step: a checkpoint when one is due, and the run's stop policy. Returns the exit code
// to stop with (too many non-finite steps in a row; a stop signal, after a checkpoint), else 0.
int checkpoint_or_stop(Run& r) {
    const int step = r.state.step, steps = r.tc.steps, max_bad = r.tc.max_bad_steps;
    if (r.bad_in_row >= max_bad) {
        r.log.print("error: %d consecutive steps (%d to %d) had a non-finite loss or gradient norm "
                    "(train.max_bad_steps = %d): stopping; the checkpoints are as they were; exit code %d\n",
                    r.bad_in_row, step + 1 - r.bad_in_row, step, max_bad, int(kExitBadSteps));
        finish_save(r);
        return kExitBadSteps;
    }
    if (r.rt.is_main()) collect_save(r, false);  // checkpoint.async: one that has finished since
    const bool due = r.cfg.checkpoint.every > 0 && step % r.cfg.checkpoint.every == 0 && step < steps;
    if (due) save(r, false, r.cfg.checkpoint.async);
    // a stop signal on any rank (llmc/run/preempt.h) stops every rank here: save, exit "resume me"
    const int sig = step < steps ? preempt_agreed(*r.groups.world) : 0;
    if (!sig) return 0;
    return stop_for_signal(r, sig, strfmt("after step %d", step), !due);
}

int train(Runtime& rt, int argc, char** argv) {
    Plan plan;
    std::string error;
    try {
        plan = plan_run(rt, argc, argv);
        comm_delay_s();  // the test hook LLMC_COMM_DELAY_MS, checked before any communicator exists
    } catch (const UserError& e) {
        error = e.what();
    }
    if (rt.any_failed(error)) return 2;  // every rank agrees before any work
    if (plan.print_config) {
        if (rt.is_main()) std::printf("%s\n", plan.cfg.resolved.dump(2).c_str());
        return 0;
    }
    if (!plan.plan_mode.empty()) {  // the plan of a GPU run unless device is "cpu"
        // a plan has nothing to save: a stop signal ends it at once, by the signal's default action
        preempt_uninstall();
        fault_point("plan", 0);  // test hook: LLMC_FAULT=hang:plan hangs here until a signal ends it
        const DType dt = run_dtype(plan.cfg.precision, plan.cfg.device == "cpu" ? "cpu" : "cuda");
        if (rt.is_main() && plan.plan_mode == "json") std::printf("%s\n", plan_json(plan.cfg, plan.shape, plan.grid, dt).dump().c_str());
        if (rt.is_main() && plan.plan_mode == "text") std::fputs(plan_text(plan.cfg, plan.shape, plan.grid, dt).c_str(), stdout);
        if (rt.is_main() && plan.plan_mode == "search") std::fputs(search_text(plan.cfg, plan.shape, dt).c_str(), stdout);
        return 0;
    }
    Run r(rt, plan);
    try {  // the converter checks the backend and the shapes on every rank, and they agree
        r.conv = make_model_converter(r.cfg, *r.ops, r.grid.tp, r.device, r.dtype);
    } catch (const UserError& e) {
        error = e.what();
    }
    if (rt.any_failed(error)) return 2;
    try {
        init_or_resume(r);
    } catch (const UserError& e) {
        error = e.what();
    }
    if (rt.any_failed(error)) return 2;
    r.conv->apply(r.model);
    print_banner(r, plan);

    const TrainConfig& tc = r.tc;
    Batches x(size_t(tc.grad_accum), std::vector<int32_t>(size_t(tc.micro_batch) * tc.seq_len)), y = x;
    r.progress.start(r.state.step, now_ms());
    for (int step = r.state.step;; step++) {
        // a signal during the evaluation or the sample stops there, with the checkpoint of this step
        if (const int sig = evaluate_and_sample(r, step, x[0], y[0]))
            return stop_for_signal(r, sig, strfmt("in the evaluation at step %d", step), true);
        if (step == tc.steps) break;
        train_step(r, step, x, y);
        if (const int code = checkpoint_or_stop(r)) return code;
    }
    if (r.ops->peak_memory_bytes() > 0)
        r.log.print("peak device memory: %s\n", human_bytes(double(r.ops->peak_memory_bytes())).c_str());
    r.dp.check_replicas();
    save(r, true);
    // every rank's peak host memory, world rank 0's first: what the saves and the start-up took
    std::vector<double> host(size_t(r.grid.world), 0.0);
    host[size_t(r.grid.rank)] = host_peak_bytes();
    r.groups.world->all_reduce(host.data(), host.size(), ReduceOp::Sum);
    const size_t top = size_t(std::max_element(host.begin(), host.end()) - host.begin());
    r.log.print("peak host memory: %s%s\n", human_bytes(host[0]).c_str(),
                r.grid.world == 1 ? ""
                : top == 0        ? strfmt(" on world rank 0, the most of %d ranks", r.grid.world).c_str()
                                  : strfmt(" on world rank 0; the most, %s, on rank %zu", human_bytes(host[top]).c_str(), top).c_str());
    r.run_log->record({{"host_peak_bytes", host}});
    r.log.print("%s", r.progress.summary(now_ms(), r.ckpt_dir).c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Runtime rt(&argc, &argv);
    preempt_install();
    try {
        const int rc = train(rt, argc, argv);
        // LLMC_DONE_FILE (set by scripts/slurm/train.sbatch): world rank 0 creates it when the run
        // ended well, so that a launcher that returns 0 without having run the ranks is caught
        const char* done = std::getenv("LLMC_DONE_FILE");
        if (rc == 0 && done && *done && rt.is_main()) {
            if (std::FILE* f = std::fopen(done, "w")) std::fclose(f);
        }
        return rc;
    } catch (const UserError& e) {
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
        rt.abort_job(2);
    } catch (const NonFiniteState& e) {
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
        rt.abort_job(kExitBadSteps);
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%serror: out of host memory: the model, its optimizer state and buffers do not fit in "
                     "this machine's memory (lower model.n_layer, model.d_model or train.micro_batch)\n",
                     rank_prefix().c_str());
        rt.abort_job(2);
    }
}
