// train_gpt: GPT-2 pretraining, one binary for one CPU core or a cluster of GPUs.
//
//   ./train_gpt configs/tiny_cpu.json [key=value ...] [--print-config]
//   mpirun -np N ./train_gpt config.json
//
// Reads top to bottom as the algorithm: config -> runtime -> model -> data -> loop.
// Every kernel call goes through Ops (llmc/ops.h): the CPU reference backend or CUDA.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/common.h"
#include "llmc/comm.h"
#include "llmc/config.h"
#include "llmc/data_parallel.h"
#include "llmc/exit_codes.h"
#include "llmc/dataloader.h"
#include "llmc/hf_format.h"
#include "llmc/logger.h"
#include "llmc/mfu.h"
#include "llmc/model.h"
#include "llmc/model_file.h"
#include "llmc/ops.h"
#include "llmc/preempt.h"
#include "llmc/layout.h"
#include "llmc/optimizer.h"
#include "llmc/pipeline.h"
#include "llmc/pipeline_schedule.h"
#include "llmc/process_grid.h"
#include "llmc/tensor_parallel.h"
#include "llmc/rng.h"
#include "llmc/runtime.h"
#include "llmc/tokenizer.h"

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
    return strfmt("%.1f %s", b, units[u]);
}

// Mean loss over `batches` micro-batches of the validation set, from its start, averaged over DP ranks.
double evaluate(PipelineEngine& pipeline, DataLoader& val, int batches, std::vector<int32_t>& x,
                std::vector<int32_t>& y, DataParallel& dp) {
    val.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        val.next(x.data(), y.data());
        sum += pipeline.forward_only(x.data(), y.data(), pipeline.model().B, pipeline.model().T);
    }
    return dp.mean(batches > 0 ? sum / batches : 0.0);
}

// Samples n tokens after <|endoftext|> at temperature 1, seeded: the same step gives the same text.
// Collective over the model-parallel group: the last stage's TP ranks gather the logits row and
// draw alike; the pipeline group hands the token back to the first stage.
std::vector<int> sample(PipelineEngine& pipeline, TensorParallel& tp, int eot, int n, uint64_t seed) {
    Model& model = pipeline.model();
    const int V = model.shape.vocab_size, Vl = model.shape.padded_vocab / tp.size();
    Rng rng(seed, 0x5A3D1E);
    std::vector<int32_t> ctx = {eot};
    std::vector<int> out;
    std::vector<float> slice(size_t(Vl), -INFINITY), logits(size_t(Vl) * tp.size());
    for (int i = 0; i < n; i++) {
        const int t = std::min<int>(int(ctx.size()), model.T);
        // sequence parallelism splits the tokens evenly: pad the window at its end (causal
        // attention keeps the padding out of position t - 1)
        const int tp_pad = model.layout.sequence_parallel ? (t + tp.size() - 1) / tp.size() * tp.size() : t;
        std::vector<int32_t> window(ctx.end() - t, ctx.end());
        window.resize(size_t(tp_pad), eot);
        pipeline.forward_only(window.data(), nullptr, 1, tp_pad);
        float next = 0.0f;
        if (pipeline.is_last_stage()) {
            int v0 = 0;
            std::fill(slice.begin(), slice.end(), -INFINITY);
            model.get_logits_slice(0, t - 1, slice.data(), &v0);
            if (tp.size() > 1) tp.comm()->all_gather(slice.data(), logits.data(), std::vector<size_t>(size_t(tp.size()), size_t(Vl)));
            else logits = slice;
            float mx = logits[0];
            for (int k = 0; k < V; k++) mx = std::max(mx, logits[size_t(k)]);
            double total = 0.0;
            for (int k = 0; k < V; k++) total += (logits[size_t(k)] = std::exp(logits[size_t(k)] - mx));
            double r = rng.uniform() * total, c = 0.0;
            int pick = V - 1;
            for (int k = 0; k < V; k++)
                if ((c += logits[size_t(k)]) > r) {
                    pick = k;
                    break;
                }
            next = float(pick);
        }
        next = float(pipeline.broadcast_from_last(next));
        ctx.push_back(int32_t(next));
        out.push_back(int(next));
    }
    return out;
}

// The whole model and optimizer state in llm.c order on world rank 0 (empty elsewhere): ZeRO
// shards gathered over DP, then the model-parallel pieces assembled. Collective over every rank.
WholeState gather_whole_state(const Model& model, const AdamW& opt, DataParallel& dp, const ParallelConfig& pc,
                              Comm& mp, const ProcessGrid& grid) {
    OptimizerState local = dp.gather_optimizer_state(opt);  // DP rank 0 gets its (tp, pp) piece whole
    std::vector<float> params = dp.gather_params();
    WholeState whole;
    if (grid.dp_rank != 0) return whole;
    const size_t pad = DataParallel::pad_multiple(grid.dp);
    whole.params = assemble_whole(model.shape, pc, pad, params, mp);
    whole.m = assemble_whole(model.shape, pc, pad, local.m, mp);
    whole.v = assemble_whole(model.shape, pc, pad, local.v, mp);
    if (!local.master.empty()) whole.master = assemble_whole(model.shape, pc, pad, local.master, mp);
    return whole;
}

// Test hook: with LLMC_DUMP_GRADS=<file>, the first step's summed gradient of the whole model is
// written there (llm.c model format, fp32) before the optimizer uses it, so that layouts can be
// compared on gradients, before AdamW amplifies rounding differences. Collective.
void dump_gradients(const Model& model, DataParallel& dp, const ParallelConfig& pc, Comm& mp,
                    const ProcessGrid& grid) {
    const char* path = std::getenv("LLMC_DUMP_GRADS");
    if (!path || !*path) return;
    // with ZeRO >= 1 each DP rank holds the sum for its shard only: gather them like optimizer state
    std::vector<float> local = dp.gather_gradients();
    if (grid.dp_rank != 0) return;
    std::vector<float> whole = assemble_whole(model.shape, pc, DataParallel::pad_multiple(grid.dp), local, mp);
    if (grid.rank == 0) model_file_write(path, model.shape, whole.data(), 3);
}

// The backend and the communicator a config asks for. Throws UserError.
std::string resolve_device(const Config& cfg) {
    std::string device = cfg.device;
    if (device == "auto") device = cuda_device_available() ? "cuda" : "cpu";
    if (device == "cuda" && !cuda_device_available())
        throw UserError("device: \"cuda\" was asked for but no CUDA device is usable (use \"cpu\" or \"auto\")");
    // fp8 runs on the CPU as fp32 with the linears' FP8 casts emulated exactly (llmc/cpu/fp8.cpp)
    if (device == "cpu" && cfg.precision != "fp32" && cfg.precision != "fp8")
        throw UserError(strfmt("precision: \"%s\" needs device \"cuda\"; the CPU backend trains in \"fp32\" "
                               "(or \"fp8\", emulated)",
                               cfg.precision.c_str()));
    return device;
}
// The communicator of the data-parallel group (and the world's): "nccl" runs DP's collectives on
// device buffers (llmc/data_parallel.h stages bf16 gradients through fp32 device buffers); the
// tensor- and pipeline-parallel groups stay on MPI. "auto" is MPI for now: the NCCL path has not
// yet run on a GPU (scripts/gpu_check.sh checks it), and MPI serves several ranks per GPU.
std::string resolve_comm(const ParallelConfig& pc, const std::string& device, const Runtime& rt) {
    if (pc.comm == "nccl" && device != "cuda")
        throw UserError(strfmt("parallel.comm: \"nccl\" needs device \"cuda\" (this run is on %s; use \"mpi\" or "
                               "\"auto\")", device.c_str()));
    if (pc.comm != "nccl") return "mpi";
    const int gpus = cuda_device_count();
    if (rt.world > 1 && rt.ranks_per_node > gpus)
        throw UserError(strfmt("parallel.comm: \"nccl\" needs a GPU per rank, but a node runs %d ranks on %d GPU%s "
                               "(NCCL cannot put two ranks on one GPU); use \"mpi\" or \"auto\", or launch at most "
                               "%d rank%s per node",
                               rt.ranks_per_node, gpus, gpus == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s"));
    return "nccl";
}

// ==== precision "fp8" (llmc/fp8.h): begin ====
// The run's FP8 scaling. Every rank holds the whole model's Fp8State and one backend array of
// amaxes that the block linears of its own layers and shards record into (Model::set_fp8). Once
// per optimizer step the arrays of all ranks are max-reduced over the WORLD: data-parallel
// replicas must cast with identical scales (else their weights drift apart), the TP shards of
// one tensor each see only part of it, and pipeline stages own different layers. Every rank
// then advances the same state, so rank 0's copy is the whole state that checkpoints store.
class Fp8Run {
public:
    // Throws UserError when the backend has no fp8 matmuls (why included: a GPU below compute
    // capability 8.9, say), or when a local linear dimension is not a multiple of what the
    // backend's fp8 GEMM takes, naming the config keys to change.
    Fp8Run(const Config& cfg, Ops& ops, int tp, const std::string& device)
        : ops_(ops), opt_(fp8_options(cfg.fp8)), state_(cfg.model.n_layer, opt_) {
        std::string why;
        if (!ops.fp8_supported(&why)) throw UserError("precision: fp8 cannot run on this device: " + why);
        const long k = ops.fp8_dim_multiple(), C = cfg.model.d_model, Cl = C / tp;
        auto need = [&](long v, const std::string& what, const char* keys) {
            if (v % k != 0)
                throw UserError(strfmt("precision: fp8 on %s needs every linear layer dimension to be a multiple of "
                                       "%ld, but %s = %ld is not (change %s)",
                                       device.c_str(), k, what.c_str(), v, keys));
        };
        need(long(cfg.train.micro_batch) * cfg.train.seq_len,
             strfmt("train.micro_batch x train.seq_len = %d x %d", cfg.train.micro_batch, cfg.train.seq_len),
             "train.micro_batch or train.seq_len");
        need(C, "model.d_model", "model.d_model");
        // the local widths of the TP shards: QKV and fc outputs, attention projection input
        // the local widths of the TP shards: the QKV and up projections' outputs, the attention and
        // down projections' inputs
        const ModelShape s = model_shape(cfg.model);
        const long qkv = long(s.n_head + 2 * s.kv_heads()) * s.head_dim() / tp, F = s.ffn() / tp;
        need(qkv, strfmt("(n_head + 2 n_kv_head) x head_dim / parallel.tp = %ld", qkv), "model.d_model or parallel.tp");
        need(Cl, strfmt("model.d_model / parallel.tp = %ld / %d", C, tp), "model.d_model or parallel.tp");
        need(F, strfmt("the MLP width / parallel.tp = %d / %d", s.ffn(), tp), "model.ffn_dim or parallel.tp");
        amax_ = static_cast<float*>(ops.alloc(bytes()));
    }
    ~Fp8Run() { ops_.release(amax_); }
    Fp8Run(const Fp8Run&) = delete;
    Fp8Run& operator=(const Fp8Run&) = delete;

    Fp8State& state() { return state_; }
    float* amax() { return amax_; }
    size_t bytes() const { return size_t(state_.size()) * sizeof(float); }

    // What runs in which precision: "fp8: linears fp8 (e4m3/e5m2, delayed, history 16, margin 0),
    // rest fp32 (fp8 emulated exactly on the CPU)".
    std::string describe(const std::string& device, DType rest) const {
        const bool delayed = opt_.recipe == Fp8Recipe::Delayed;
        return strfmt("fp8: linears fp8 (e4m3/%s, %s%s, margin %d), rest %s%s", opt_.hybrid ? "e5m2" : "e4m3",
                      delayed ? "delayed" : "current", delayed ? strfmt(", history %d", opt_.amax_history).c_str() : "",
                      opt_.margin, dtype_name(rest), device == "cpu" ? " (fp8 emulated exactly on the CPU)" : "");
    }

    // Start of an optimizer step: forget the amaxes of the last one (and of evaluation passes).
    void begin_step() { ops_.zero(Tensor(amax_, size_t(state_.size()), DType::F32)); }

    // After the step's last backward, on every rank in the same order (a world collective): the
    // amaxes of all ranks, max-reduced, advance the scales. Returns this update's overflow
    // events (non-finite amaxes; those scales are kept).
    int end_step(Comm& world) {
        const size_t n = size_t(state_.size());
        std::vector<float> a(n);
        ops_.to_host_bytes(a.data(), amax_, bytes());
        // The reduction runs on the float bit patterns, as integers held exactly in doubles
        // (every Comm reduces doubles in host memory, NCCL included). Non-negative floats order
        // as their bits do, with inf above every finite value and NaN above inf (fp8_abs_bits,
        // the order the ops record in), so the maximum is exact, independent of the reduction
        // order, and a NaN or inf amax on any rank stays non-finite. A float MAX would not
        // promise that: MPI_MAX compares with NaN false both ways and may drop it.
        std::vector<double> bits(n);
        for (size_t i = 0; i < n; i++) bits[i] = double(fp8_abs_bits(a[i]));
        world.all_reduce(bits.data(), n, ReduceOp::Max);
        for (size_t i = 0; i < n; i++) a[i] = fp8_bits_to_float(uint32_t(bits[i]));
        return state_.update(a.data());
    }

private:
    Ops& ops_;
    Fp8Options opt_;
    Fp8State state_;
    float* amax_ = nullptr;
};
// ==== precision "fp8": end ====

void print_memory_table(Logger& log, const MemoryPlan& m, const Model& model, bool master, DType dtype,
                        const Fp8Run* fp8 = nullptr) {
    const size_t num_params = model.num_params;
    auto row = [&](const char* name, size_t bytes, const std::string& note) {
        log.print("  %-13s %11s  %12zu B%s\n", name, human_bytes(double(bytes)).c_str(), bytes, note.c_str());
    };
    log.print("memory per rank (ZeRO-%d over dp %d; %zu parameters padded to %zu):\n", m.zero, m.dp, num_params,
              m.padded_params);
    row("parameters", m.params, strfmt("  (%s%s%s)", dtype_name(dtype), m.zero >= 3 ? ", shard" : "",
                                       fp8 ? "; block linears compute in fp8" : ""));
    row("gradients", m.grads, m.zero >= 2 ? "  (shard)" : "");
    row("optimizer", m.optimizer, strfmt("  (m, v%s fp32%s)", master ? ", master" : "", m.zero >= 1 ? ", shard" : ""));
    row("comm buffers", m.comm_buffers, m.zero == 0 ? "  (1 bucket, fp32)" : "  (2 buckets, fp32)");
    if (m.zero >= 3)
        row("unit params", m.unit_params, "  (gathered: the embedding, the head, a layer and the prefetched next)");
    if (m.zero >= 2) row("unit grads", m.unit_grads, "  (the embedding's and head's for the step, one layer's)");
    row("activations", m.activations,
        model.layout.sequence_parallel ? strfmt("  (sequence parallel; %s without it)",
                                                human_bytes(double(model.activation_bytes_without_sp())).c_str())
                                       : std::string());
    if (fp8)  // ==== fp8 ====
        row("fp8 amaxes", fp8->bytes(),
            strfmt("  (%d layers x 4 linears x 3 operands, fp32; scales and history on the host)",
                   model.shape.n_layer));
    row("total", m.total() + (fp8 ? fp8->bytes() : 0), "");
}

int train(Runtime& rt, int argc, char** argv) {
    // ---- config, backend and process grid: every rank decides alike, and they agree before any work ----
    bool print_config = false;
    Config cfg;
    ProcessGrid grid;
    ModelShape shape;
    ModelLayout layout;
    PpScheduleKind schedule_kind = PpScheduleKind::OneFOneB;
    std::string device, comm_kind, setup_error;
    try {
        cfg = load_config(argc, argv, &print_config);
        grid = make_process_grid(cfg.parallel, rt.world, rt.rank);
        const ParallelConfig& pc = cfg.parallel;
        schedule_kind = parse_pp_schedule(pc.pp_schedule);
        validate_pipeline(cfg);
        shape = model_shape(cfg.model);
        layout = model_layout(shape, pc, grid.tp_rank, grid.pp_rank);
        check_model_layout(shape, layout, cfg.train.seq_len);
        device = resolve_device(cfg);
        comm_kind = resolve_comm(cfg.parallel, device, rt);
    } catch (const UserError& e) {
        setup_error = e.what();
    }
    if (rt.any_failed(setup_error)) return 2;
    if (print_config) {
        if (rt.is_main()) std::printf("%s\n", cfg.resolved.dump(2).c_str());
        return 0;
    }
    // ---- communicators and backend ----
    // ranks share the node's GPUs round-robin (several ranks per GPU under MPI in tests)
    const int gpus = device == "cuda" ? std::max(1, cuda_device_count()) : 1;
    const int cuda_device = device == "cuda" ? rt.local_rank % gpus : -1;
    ProcessGroups groups = make_process_groups(grid, comm_kind, cfg.parallel.timeout_s, cuda_device);
    std::unique_ptr<Ops> ops = device == "cpu" ? make_cpu_ops() : make_cuda_ops(cuda_device);
    // fp8 keeps everything but the block linears in bf16 on CUDA and fp32 on the CPU
    const DType dtype =
        cfg.precision == "bf16" || (cfg.precision == "fp8" && device == "cuda") ? DType::BF16 : DType::F32;
    Logger log(std::string(), rt.is_main(), false);  // console only until out_dir exists
    // ==== fp8: the scaling state; every rank checks the backend and the shapes, and they agree ====
    std::unique_ptr<Fp8Run> fp8;
    if (cfg.precision == "fp8") {
        std::string fp8_error;
        try {
            fp8.reset(new Fp8Run(cfg, *ops, grid.tp, device));
        } catch (const UserError& e) {
            fp8_error = e.what();
        }
        if (rt.any_failed(fp8_error)) return 2;
    }

    // ---- model: this rank's chunks of layers and tensor-parallel slice ----
    const TrainConfig& tc = cfg.train;
    const ParallelConfig& pc = cfg.parallel;
    const int B = tc.micro_batch, T = tc.seq_len;
    const PpSchedule schedule = make_pipeline_schedule(schedule_kind, grid.pp, tc.grad_accum, pc.pp_virtual);
    const size_t pad = DataParallel::pad_multiple(grid.dp);
    TensorParallel tp(*ops, groups.tp.get(), pc.sequence_parallel);
    Model model(shape, *ops, dtype, B, T, pad, layout, &tp, pipeline_slots(schedule[size_t(grid.pp_rank)], pc.pp_virtual),
               DataParallel::storage(pc.zero));
    // data parallelism: the DP group's gradient sync and ZeRO's shards (set up before the parameters:
    // under ZeRO-3 this rank keeps only its shard of them)
    DataParallel dp(model, *groups.dp, pc.zero, pc.bucket_mb);
    if (cfg.model.init == "random") {
        model.init_random(uint64_t(cfg.model.init_seed));
    } else {
        std::vector<float> w = is_safetensors(cfg.model.init) ? hf_read_weights(cfg.model.init, shape)
                                                              : model_file_read(cfg.model.init, &shape);
        model.set_params_whole(w.data());
    }
    if (fp8) model.set_fp8(&fp8->state(), fp8->amax());  // ==== fp8 ====
    PipelineEngine pipeline(model, groups.pp.get(), groups.embed.get(), schedule, tc.grad_accum, pc.pp_virtual);
    // this rank's optimizer owns its ZeRO range
    AdamW opt(model, dp.opt_begin(), dp.opt_end(), dp.opt_params(), dp.opt_grads());

    // ---- data: each DP rank reads its own windows (every TP and PP rank of it the same ones) ----
    DataLoader train_data(cfg.data.train, B, T, grid.dp_rank, grid.dp, cfg.data.shuffle, uint64_t(tc.seed),
                          shape.vocab_size);
    std::unique_ptr<DataLoader> val_data;
    if (!cfg.data.val.empty())
        val_data.reset(new DataLoader(cfg.data.val, B, T, grid.dp_rank, grid.dp, false, 0, shape.vocab_size));
    std::unique_ptr<Tokenizer> tok;
    if (!cfg.tokenizer_dir.empty()) tok.reset(new Tokenizer(Tokenizer::load(cfg.tokenizer_dir)));

    // ---- resume ----
    const std::string ckpt_dir = cfg.checkpoint.dir.empty() ? cfg.out_dir + "/checkpoints" : cfg.checkpoint.dir;
    std::string resume_from;
    if (cfg.checkpoint.resume == "auto") resume_from = checkpoint_latest(ckpt_dir);
    else if (cfg.checkpoint.resume != "never") resume_from = cfg.checkpoint.resume;
    TrainState state;
    state.loader_dp = grid.dp;
    if (!resume_from.empty()) {
        // every rank reads the whole checkpoint and keeps its pieces: any layout resumes any other
        WholeState whole;
        state = checkpoint_load(resume_from, shape, &whole);
        model.set_params_whole(whole.params.data());
        OptimizerState local;
        local.m = model.from_file_order(whole.m.data());
        local.v = model.from_file_order(whole.v.data());
        if (!whole.master.empty()) local.master = model.from_file_order(whole.master.data());
        dp.load_optimizer_state(opt, local);
        state.loader = convert_loader_position(state.loader, state.loader_dp, grid.dp, cfg.data.shuffle);
        train_data.set_position(state.loader);
        // ==== fp8: the scaling state resumes with the weights (bit-exact). A checkpoint of another
        // precision continues with a fresh state (fp32/bf16 -> fp8) or without one (fp8 -> other),
        // with a note; other fp8.* settings than the checkpoint's are an error (Fp8State::load).
        if (fp8 && !whole.fp8.empty())
            fp8->state().load(whole.fp8, resume_from + "/state.bin");
        else if (fp8)
            log.print("note: %s holds no fp8 scaling state (saved with another precision): fp8 starts with fresh "
                      "scales\n", resume_from.c_str());
        else if (!whole.fp8.empty())
            log.print("note: %s holds an fp8 scaling state; precision \"%s\" does not use it\n", resume_from.c_str(),
                      cfg.precision.c_str());
        log.print("resumed from %s at step %d (saved at dp %d)\n", resume_from.c_str(), state.step, state.loader_dp);
        state.loader_dp = grid.dp;
    }

    // ---- output ----
    make_dirs(cfg.out_dir, "out_dir");
    const std::string jsonl = cfg.log.jsonl.empty() ? cfg.out_dir + "/log.jsonl" : cfg.log.jsonl;
    Logger run_log(jsonl, rt.is_main(), !resume_from.empty());

    const double tokens_per_step = double(B) * T * tc.grad_accum * grid.dp;
    log.print("train_gpt | device %s | precision %s | %s: %d layers, %d heads (%d kv), d_model %d, ffn %d, vocab %d "
              "(padded %d), max_seq_len %d\n",
              device.c_str(), (fp8 ? fp8->describe(device, dtype) : cfg.precision).c_str(),  // ==== fp8 ====
              arch_name(shape.arch), shape.n_layer, shape.n_head, shape.kv_heads(), shape.d_model, shape.ffn(),
              shape.vocab_size, shape.padded_vocab, shape.max_seq_len);
    log.print("parallel: %d process%s = %s; ZeRO-%d; comm %s; %zu gradient bucket%s of <= %zu elements\n",
              grid.world, grid.world == 1 ? "" : "es", grid.describe().c_str(), dp.zero(), groups.dp->name().c_str(),
              dp.buckets().size(), dp.buckets().size() == 1 ? "" : "s", dp.bucket_elems());
    if (grid.tp > 1)
        log.print("tensor parallel: %d ranks, %d heads and %d vocabulary rows each%s\n", grid.tp,
                  shape.n_head / grid.tp, shape.padded_vocab / grid.tp,
                  layout.sequence_parallel ? "; sequence parallel (1/tp of the tokens outside attention and MLP)" : "");
    if (grid.pp > 1) {
        std::string stages;
        const auto split = pp_layer_split(shape.n_layer, grid.pp, pc.pp_virtual, pc.pp_layers);
        for (size_t s = 0; s < split.size(); s++)
            stages += strfmt("%s[%d, %d)", s ? " " : "", split[s].first, split[s].second);
        log.print("pipeline: layers per virtual stage %s\n", stages.c_str());
        log.print("pipeline: %s\n", describe_pipeline(schedule_kind, grid.pp, tc.grad_accum, pc.pp_virtual).c_str());
    }
    log.print("batch: %d x %d tokens x %d accumulation x %d DP ranks = %.0f tokens per step; %d steps\n", B, T,
              tc.grad_accum, grid.dp, tokens_per_step, tc.steps);
    log.print("train data: %zu shard(s), %llu micro-batches per epoch\n", train_data.num_shards(),
              (unsigned long long)train_data.windows_per_epoch());
    const MemoryPlan mem = dp.memory_plan(opt.has_master());
    print_memory_table(log, mem, model, opt.has_master(), dtype, fp8.get());
    const MemoryPlan got = dp.allocated(opt.state_bytes());
    LLMC_ASSERT(got.params == mem.params && got.grads == mem.grads && got.optimizer == mem.optimizer &&
                    got.comm_buffers == mem.comm_buffers && got.unit_params == mem.unit_params &&
                    got.unit_grads == mem.unit_grads && got.activations == mem.activations,
                "allocations disagree with the memory table");

    // MFU on GPUs: model FLOPs (6N + 12LCT per token) over the dense peak of this GPU and precision
    const double peak_flops = device == "cpu" ? 0.0 : gpu_peak_flops(ops->device_name(), cfg.precision);
    const double model_flops_per_token = flops_per_token(shape, T);
    if (device != "cpu")
        log.print("device: %s, dense %s peak %.1f TFLOP/s%s\n", ops->device_name().c_str(), cfg.precision.c_str(),
                  peak_flops / 1e12, peak_flops > 0 ? "" : " (not in the table: no MFU)");

    // the state after state.step steps, saved by world rank 0; collective
    auto save_checkpoint = [&] {
        WholeState whole = gather_whole_state(model, opt, dp, pc, *groups.mp, grid);  // world rank 0 gets it
        if (!rt.is_main()) return;
        if (fp8) whole.fp8 = fp8->state().save();  // ==== fp8 ====
        std::string p = checkpoint_save(ckpt_dir, state, shape, dtype == DType::BF16 ? 5 : 3, whole, cfg.resolved,
                                        cfg.checkpoint.keep);
        log.print("checkpoint: %s\n", p.c_str());
    };

    // ---- the training loop ----
    std::vector<std::vector<int32_t>> x(size_t(tc.grad_accum), std::vector<int32_t>(size_t(B) * T)), y = x;
    const float dloss = float(1.0 / (double(B) * T * tc.grad_accum * grid.dp));
    int skipped = 0, bad_in_row = 0;  // steps skipped for a non-finite loss or gradient norm: in all, in a row
    for (int step = state.step; step <= tc.steps; step++) {
        const bool last = step == tc.steps;
        if (val_data && cfg.eval.every > 0 && (step % cfg.eval.every == 0 || last)) {
            double vl = evaluate(pipeline, *val_data, cfg.eval.batches, x[0], y[0], dp);
            log.print("step %d | val loss %.6f\n", step, vl);
            run_log.record({{"step", step}, {"val_loss", vl}});
        }
        // the model-parallel ranks of DP rank 0 sample together (under ZeRO-3 every DP rank, for the
        // gathers of the parameters); world rank 0 prints
        if ((grid.dp_rank == 0 || dp.zero() == 3) && cfg.eval.sample_every > 0 && (step % cfg.eval.sample_every == 0 || last) && step > 0) {
            const int eot = tok ? tok->eot() : std::min(50256, shape.vocab_size - 1);
            std::vector<int> ids = sample(pipeline, tp, eot, cfg.eval.sample_tokens,
                                          uint64_t(tc.seed) * 1000003ull + step);
            if (tok) {
                log.print("step %d | sample:\n%s\n---\n", step, tok->decode(ids).c_str());
            } else {
                std::string text;
                for (int id : ids) text += strfmt("%d ", id);
                log.print("step %d | sample (token ids; set \"tokenizer\" to decode): %s\n", step, text.c_str());
            }
        }
        if (last) break;

        const double t0 = now_ms();
        model.zero_grads();
        if (fp8) fp8->begin_step();  // ==== fp8 ====
        for (int micro = 0; micro < tc.grad_accum; micro++) train_data.next(x[size_t(micro)].data(), y[size_t(micro)].data());
        // gradient buckets go out during the last micro-step's backward, none before. Test hook:
        // LLMC_FAULT=nan:grad_<n> (LLMC_FAULT_RANK on a last pipeline stage) makes step n's gradients NaN
        double loss = pipeline.train_step(x, y, fault_point("grad", step + 1) ? NAN : dloss, dp.grads_ready());
        fault_point("train_step", step + 1);  // test hook: a rank dies mid-collective
        dp.finish_grad_sync();
        const int fp8_overflows = fp8 ? fp8->end_step(*groups.world) : 0;  // ==== fp8: next step's scales ====
        if (step == state.step) dump_gradients(model, dp, pc, *groups.mp, grid);
        loss = dp.mean(loss);
        const double grad_norm = dp.grad_norm(groups.mp.get());
        const float scale = clip_scale(grad_norm, tc.grad_clip);
        const double lr = lr_at(tc, step);
        AdamWHyper h{float(lr), float(tc.beta1), float(tc.beta2), float(tc.eps), float(tc.weight_decay)};
        // a non-finite loss or gradient norm (alike on every rank: both are reduced over all) skips
        // the update: weights and optimizer moments stay as they were
        const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
        bad_in_row = finite ? 0 : bad_in_row + 1;
        skipped += !finite;
        if (finite) opt.step(h, step + 1, scale, uint32_t(tc.seed * 2654435761u + step));
        dp.after_update();
        ops->synchronize();
        const double ms = now_ms() - t0;
        const double tok_s = tokens_per_step / (ms / 1000.0);
        nlohmann::json rec = {{"step", step + 1}, {"loss", loss},     {"lr", lr},
                              {"grad_norm", grad_norm}, {"ms", ms}, {"tok_per_s", tok_s}};
        std::string mfu_text;
        if (peak_flops > 0) {
            // tokens/s is the whole job's; each GPU does 1/world of the work
            const double mfu = model_flops_per_token * tok_s / grid.world / peak_flops;
            rec["mfu"] = mfu;
            mfu_text = strfmt(" | MFU %.1f%%", 100.0 * mfu);
        }
        if (fp8) {  // ==== fp8: the step line names the linears' precision and any overflow events ====
            rec["fp8_overflows"] = fp8_overflows;
            mfu_text += fp8_overflows ? strfmt(" | fp8 linears: %d overflow event%s (non-finite amax, scale kept)",
                                               fp8_overflows, fp8_overflows == 1 ? "" : "s")
                                      : std::string(" | fp8 linears");
        }
        if (!finite) {
            rec["skipped"] = "nonfinite";
            rec["skipped_steps"] = skipped;
            mfu_text += strfmt(" | skipped (non-finite): no update; %d skipped so far, %d in a row", skipped, bad_in_row);
        }
        log.print("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s\n", step + 1, tc.steps,
                  loss, lr, grad_norm, ms, tok_s, mfu_text.c_str());
        run_log.record(rec);
        if (bad_in_row >= tc.max_bad_steps) {
            log.print("error: %d consecutive steps (%d to %d) had a non-finite loss or gradient norm "
                      "(train.max_bad_steps = %d): stopping; the checkpoints are as they were; exit code %d\n",
                      bad_in_row, step + 2 - bad_in_row, step + 1, tc.max_bad_steps, int(kExitBadSteps));
            return kExitBadSteps;
        }

        state.step = step + 1;
        state.loader = train_data.position();
        const bool due = cfg.checkpoint.every > 0 && state.step % cfg.checkpoint.every == 0 && state.step < tc.steps;
        if (due) save_checkpoint();
        // a stop signal on any rank (llmc/preempt.h) stops every rank here: save, exit "resume me"
        if (const int sig = state.step < tc.steps ? preempt_agreed(*groups.world) : 0) {
            if (!due) save_checkpoint();
            log.print("%s: stopped after step %d, checkpoint saved; exit code %d (resume with checkpoint.resume=auto)\n",
                      signal_name(sig).c_str(), state.step, int(kExitPreempted));
            rt.barrier();  // no rank leaves (and makes its launcher end the job) before the save is done
            return kExitPreempted;
        }
    }

    if (ops->peak_memory_bytes() > 0)
        log.print("peak device memory: %s\n", human_bytes(double(ops->peak_memory_bytes())).c_str());

    // ---- final weights (fp32, llm.c format) and a resumable checkpoint, written by rank 0 ----
    dp.check_replicas();
    WholeState whole = gather_whole_state(model, opt, dp, pc, *groups.mp, grid);
    if (rt.is_main()) {
        const std::vector<float>& w = whole.master.empty() ? whole.params : whole.master;
        const std::string path = cfg.out_dir + strfmt("/model_%08d.bin", tc.steps);
        model_file_write(path, shape, w.data(), 3);
        log.print("wrote %s\n", path.c_str());
        if (shape.arch == Arch::Llama) {  // transformers' format too: safetensors and config.json
            const std::string st = cfg.out_dir + strfmt("/model_%08d.safetensors", tc.steps);
            hf_write_weights(st, shape, w);
            hf_write_config(cfg.out_dir + "/config.json", shape);
            log.print("wrote %s and %s/config.json\n", st.c_str(), cfg.out_dir.c_str());
        }
        if (cfg.checkpoint.every > 0) {
            if (fp8) whole.fp8 = fp8->state().save();  // ==== fp8 ====
            std::string p = checkpoint_save(ckpt_dir, state, shape, dtype == DType::BF16 ? 5 : 3, whole, cfg.resolved,
                                            cfg.checkpoint.keep);
            log.print("checkpoint: %s\n", p.c_str());
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Runtime rt(&argc, &argv);
    preempt_install();
    try {
        int rc = train(rt, argc, argv);
        return rc;
    } catch (const UserError& e) {
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
        rt.abort_job(2);
    }
}
