// train_gpt: GPT-2 pretraining, one binary for one CPU core or a cluster of GPUs.
//
//   ./train_gpt configs/tiny_cpu.json [key=value ...] [--print-config]
//   mpirun -np N ./train_gpt config.json
//
// Reads top to bottom as the algorithm: config -> runtime -> model -> data -> loop.
// Every kernel call goes through Ops (llmc/ops.h): the CPU reference backend or CUDA.
#include <sys/stat.h>

#include <cerrno>
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
#include "llmc/dataloader.h"
#include "llmc/logger.h"
#include "llmc/mfu.h"
#include "llmc/model.h"
#include "llmc/model_file.h"
#include "llmc/ops.h"
#include "llmc/optimizer.h"
#include "llmc/process_grid.h"
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
double evaluate(GPT2& model, DataLoader& val, int batches, std::vector<int32_t>& x, std::vector<int32_t>& y,
                DataParallel& dp) {
    val.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        val.next(x.data(), y.data());
        sum += model.forward(x.data(), y.data(), model.B, model.T, 0.0f);
    }
    return dp.mean(batches > 0 ? sum / batches : 0.0);
}

// Samples n tokens after <|endoftext|> at temperature 1, seeded: the same step gives the same text.
std::vector<int> sample(GPT2& model, int eot, int n, uint64_t seed) {
    Rng rng(seed, 0x5A3D1E);
    std::vector<int32_t> ctx = {eot};
    std::vector<int> out;
    std::vector<float> logits(model.shape.vocab_size);
    for (int i = 0; i < n; i++) {
        const int t = std::min<int>(int(ctx.size()), model.T);
        model.forward(ctx.data() + ctx.size() - t, nullptr, 1, t, 0.0f);
        model.get_logits(0, t - 1, logits.data());
        float mx = logits[0];
        for (float v : logits) mx = std::max(mx, v);
        double total = 0.0;
        for (float& v : logits) total += (v = std::exp(v - mx));
        double r = rng.uniform() * total, c = 0.0;
        int next = model.shape.vocab_size - 1;
        for (int k = 0; k < model.shape.vocab_size; k++)
            if ((c += logits[k]) > r) {
                next = k;
                break;
            }
        ctx.push_back(next);
        out.push_back(next);
    }
    return out;
}

// fp32 weights in llm.c order: the master copy (whole, memory order) when the model runs in a lower precision.
std::vector<float> final_weights_llmc(const GPT2& model, const std::vector<float>& master) {
    if (!master.empty()) return model.to_llmc_order(master);
    std::vector<float> w(model.num_params);
    model.get_params_llmc(w.data());
    return w;
}

// The backend and the communicator a config asks for. Throws UserError.
std::string resolve_device(const Config& cfg) {
    std::string device = cfg.device;
    if (device == "auto") device = cuda_device_available() ? "cuda" : "cpu";
    if (device == "cuda" && !cuda_device_available())
        throw UserError("device: \"cuda\" was asked for but no CUDA device is usable (use \"cpu\" or \"auto\")");
    if (device == "cpu" && cfg.precision != "fp32")
        throw UserError(strfmt("precision: \"%s\" needs device \"cuda\"; the CPU backend trains in \"fp32\"",
                               cfg.precision.c_str()));
    return device;
}
std::string resolve_comm(const ParallelConfig& pc, const std::string& device) {
    if (pc.comm == "nccl" && device != "cuda")
        throw UserError(strfmt("parallel.comm: \"nccl\" needs device \"cuda\" (this run is on %s; use \"mpi\" or "
                               "\"auto\")", device.c_str()));
    if (pc.comm == "nccl")
        throw UserError("parallel.comm: \"nccl\" is not supported yet (use \"mpi\" or \"auto\": MPI stages device "
                        "buffers through the host)");
    return "mpi";  // auto: MPI until the NCCL communicator lands
}

void print_memory_table(Logger& log, const MemoryPlan& m, size_t num_params, bool master, DType dtype) {
    auto row = [&](const char* name, size_t bytes, const std::string& note) {
        log.print("  %-13s %11s  %12zu B%s\n", name, human_bytes(double(bytes)).c_str(), bytes, note.c_str());
    };
    log.print("memory per rank (ZeRO-%d over dp %d; %zu parameters padded to %zu):\n", m.zero, m.dp, num_params,
              m.padded_params);
    row("parameters", m.params, strfmt("  (%s)", dtype_name(dtype)));
    row("gradients", m.grads,
        m.zero >= 2 ? "  (shard: ZeRO-2 formula; this build still accumulates into a full buffer)" : "");
    row("optimizer", m.optimizer, strfmt("  (m, v%s fp32%s)", master ? ", master" : "", m.zero >= 1 ? ", shard" : ""));
    row("comm buffers", m.comm_buffers, m.zero == 0 ? "  (1 bucket, fp32)" : "  (2 buckets, fp32)");
    row("activations", m.activations, "");
    row("total", m.total(), "");
}

int train(Runtime& rt, int argc, char** argv) {
    // ---- config, backend and process grid: every rank decides alike, and they agree before any work ----
    bool print_config = false;
    Config cfg;
    ProcessGrid grid;
    std::string device, comm_kind, setup_error;
    try {
        cfg = load_config(argc, argv, &print_config);
        grid = make_process_grid(cfg.parallel, rt.world, rt.rank);
        if (cfg.parallel.zero == 3)
            throw UserError("parallel.zero: 3 (parameters sharded, gathered per layer) is not supported yet "
                            "(use 0, 1 or 2)");
        device = resolve_device(cfg);
        comm_kind = resolve_comm(cfg.parallel, device);
    } catch (const UserError& e) {
        setup_error = e.what();
    }
    bool rank0_failed = false;
    if (rt.any_failed(!setup_error.empty(), &rank0_failed)) {
        if (!setup_error.empty() && (rt.is_main() || !rank0_failed))
            std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), setup_error.c_str());
        return 2;
    }
    if (print_config) {
        if (rt.is_main()) std::printf("%s\n", cfg.resolved.dump(2).c_str());
        return 0;
    }
    ProcessGroups groups = make_process_groups(grid, comm_kind);

    // ---- backend ----
    std::unique_ptr<Ops> ops = device == "cpu" ? make_cpu_ops() : make_cuda_ops(rt.local_rank);
    const DType dtype = cfg.precision == "bf16" ? DType::BF16 : DType::F32;
    Logger log(std::string(), rt.is_main(), false);  // console only until out_dir exists

    // ---- model ----
    const TrainConfig& tc = cfg.train;
    const int B = tc.micro_batch, T = tc.seq_len;
    ModelShape shape{cfg.model.n_layer, cfg.model.n_head,  cfg.model.d_model,
                     cfg.model.vocab_size, cfg.model.padded_vocab(), cfg.model.max_seq_len};
    GPT2 model(shape, *ops, dtype, B, T, DataParallel::pad_multiple(grid.dp));
    if (cfg.model.init == "random") {
        model.init_random(uint64_t(cfg.model.init_seed));
    } else {
        std::vector<float> w = model_file_read(cfg.model.init, &shape);
        model.set_params_llmc(w.data());
    }
    // data parallelism: the DP group's gradient sync; this rank's optimizer owns its ZeRO range
    DataParallel dp(model, *groups.dp, cfg.parallel.zero, cfg.parallel.bucket_mb);
    AdamW opt(model, dp.opt_begin(), dp.opt_end());

    // ---- data: each DP rank reads its own windows ----
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
        // every rank reads the whole checkpoint and keeps its range: any layout resumes any other
        OptimizerState whole;
        state = checkpoint_load(resume_from, model, &whole);
        dp.load_optimizer_state(opt, whole);
        state.loader = convert_loader_position(state.loader, state.loader_dp, grid.dp, cfg.data.shuffle);
        train_data.set_position(state.loader);
        log.print("resumed from %s at step %d (saved at dp %d)\n", resume_from.c_str(), state.step, state.loader_dp);
        state.loader_dp = grid.dp;
    }

    // ---- output ----
    make_dirs(cfg.out_dir, "out_dir");
    const std::string jsonl = cfg.log.jsonl.empty() ? cfg.out_dir + "/log.jsonl" : cfg.log.jsonl;
    Logger run_log(jsonl, rt.is_main(), !resume_from.empty());

    const double tokens_per_step = double(B) * T * tc.grad_accum * grid.dp;
    log.print("train_gpt | device %s | precision %s | %d layers, %d heads, d_model %d, vocab %d (padded %d), "
              "max_seq_len %d\n",
              device.c_str(), cfg.precision.c_str(), shape.n_layer, shape.n_head, shape.d_model, shape.vocab_size,
              shape.padded_vocab, shape.max_seq_len);
    log.print("parallel: %d process%s = %s; ZeRO-%d; comm %s; %zu gradient bucket%s of <= %zu elements\n",
              grid.world, grid.world == 1 ? "" : "es", grid.describe().c_str(), dp.zero(), groups.dp->name().c_str(),
              dp.buckets().size(), dp.buckets().size() == 1 ? "" : "s", dp.bucket_elems());
    log.print("batch: %d x %d tokens x %d accumulation x %d DP ranks = %.0f tokens per step; %d steps\n", B, T,
              tc.grad_accum, grid.dp, tokens_per_step, tc.steps);
    log.print("train data: %zu shard(s), %llu micro-batches per epoch\n", train_data.num_shards(),
              (unsigned long long)train_data.windows_per_epoch());
    const MemoryPlan mem = dp.memory_plan(opt.has_master());
    print_memory_table(log, mem, model.num_params, opt.has_master(), dtype);
    LLMC_ASSERT(mem.optimizer == opt.state_bytes() && mem.params == model.param_buf.bytes(),
                "allocations disagree with the memory table");

    // MFU on GPUs: model FLOPs (6N + 12LCT per token) over the dense peak of this GPU and precision
    const double peak_flops = device == "cpu" ? 0.0 : gpu_peak_flops(ops->device_name(), cfg.precision);
    const double model_flops_per_token = flops_per_token(shape, T);
    if (device != "cpu")
        log.print("device: %s, dense %s peak %.1f TFLOP/s%s\n", ops->device_name().c_str(), cfg.precision.c_str(),
                  peak_flops / 1e12, peak_flops > 0 ? "" : " (not in the table: no MFU)");

    // ---- the training loop ----
    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    const float dloss = float(1.0 / (double(B) * T * tc.grad_accum * grid.dp));
    for (int step = state.step; step <= tc.steps; step++) {
        const bool last = step == tc.steps;
        if (val_data && cfg.eval.every > 0 && (step % cfg.eval.every == 0 || last)) {
            double vl = evaluate(model, *val_data, cfg.eval.batches, x, y, dp);
            log.print("step %d | val loss %.6f\n", step, vl);
            run_log.record({{"step", step}, {"val_loss", vl}});
        }
        // parameters are whole on every rank (ZeRO <= 2): rank 0 samples alone
        if (rt.is_main() && cfg.eval.sample_every > 0 && (step % cfg.eval.sample_every == 0 || last) && step > 0) {
            const int eot = tok ? tok->eot() : std::min(50256, shape.vocab_size - 1);
            std::vector<int> ids = sample(model, eot, cfg.eval.sample_tokens, uint64_t(tc.seed) * 1000003ull + step);
            if (tok) {
                log.print("step %d | sample:\n%s\n---\n", step, tok->decode(ids).c_str());
            } else {
                std::string s;
                for (int id : ids) s += strfmt("%d ", id);
                log.print("step %d | sample (token ids; set \"tokenizer\" to decode): %s\n", step, s.c_str());
            }
        }
        if (last) break;

        const double t0 = now_ms();
        model.zero_grads();
        double loss = 0.0;
        for (int micro = 0; micro < tc.grad_accum; micro++) {
            train_data.next(x.data(), y.data());
            loss += model.forward(x.data(), y.data(), B, T, dloss);
            // gradient buckets go out during the last micro-step's backward, none before
            const bool last_micro = micro == tc.grad_accum - 1;
            model.backward(last_micro ? dp.grads_ready() : std::function<void(size_t)>());
            if (last_micro) fault_point("train_step", step + 1);  // test hook: a rank dies mid-collective
        }
        dp.finish_grad_sync();
        loss = dp.mean(loss / tc.grad_accum);
        const double grad_norm = dp.grad_norm();
        const float scale = clip_scale(grad_norm, tc.grad_clip);
        const double lr = lr_at(tc, step);
        AdamWHyper h{float(lr), float(tc.beta1), float(tc.beta2), float(tc.eps), float(tc.weight_decay)};
        opt.step(h, step + 1, scale, uint32_t(tc.seed * 2654435761u + step));
        dp.after_update();
        ops->synchronize();
        const double ms = now_ms() - t0;
        const double tok_s = tokens_per_step / (ms / 1000.0);
        if (!std::isfinite(loss)) throw UserError(strfmt("step %d: loss is %f (diverged); lower train.lr", step + 1, loss));
        nlohmann::json rec = {{"step", step + 1}, {"loss", loss},     {"lr", lr},
                              {"grad_norm", grad_norm}, {"ms", ms}, {"tok_per_s", tok_s}};
        std::string mfu_text;
        if (peak_flops > 0) {
            // tokens/s is this DP group's; each rank's GPU does 1/dp of the work
            const double mfu = model_flops_per_token * tok_s / grid.dp / peak_flops;
            rec["mfu"] = mfu;
            mfu_text = strfmt(" | MFU %.1f%%", 100.0 * mfu);
        }
        log.print("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s\n", step + 1, tc.steps,
                  loss, lr, grad_norm, ms, tok_s, mfu_text.c_str());
        run_log.record(rec);

        state.step = step + 1;
        state.loader = train_data.position();
        if (cfg.checkpoint.every > 0 && state.step % cfg.checkpoint.every == 0 && state.step < tc.steps) {
            OptimizerState whole = dp.gather_optimizer_state(opt);  // collective: rank 0 gets it all
            if (rt.is_main()) {
                std::string p = checkpoint_save(ckpt_dir, state, model, whole, cfg.resolved, cfg.checkpoint.keep);
                log.print("checkpoint: %s\n", p.c_str());
            }
        }
    }

    if (ops->peak_memory_bytes() > 0)
        log.print("peak device memory: %s\n", human_bytes(double(ops->peak_memory_bytes())).c_str());

    // ---- final weights (fp32, llm.c format) and a resumable checkpoint, written by rank 0 ----
    dp.check_replicas();
    OptimizerState whole;
    if (cfg.checkpoint.every > 0 || opt.has_master()) whole = dp.gather_optimizer_state(opt);
    if (rt.is_main()) {
        std::vector<float> w = final_weights_llmc(model, whole.master);
        const std::string path = cfg.out_dir + strfmt("/model_%08d.bin", tc.steps);
        model_file_write(path, shape, w.data(), 3);
        log.print("wrote %s\n", path.c_str());
        if (cfg.checkpoint.every > 0) {
            std::string p = checkpoint_save(ckpt_dir, state, model, whole, cfg.resolved, cfg.checkpoint.keep);
            log.print("checkpoint: %s\n", p.c_str());
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Runtime rt(&argc, &argv);
    try {
        int rc = train(rt, argc, argv);
        return rc;
    } catch (const UserError& e) {
        std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), e.what());
        rt.abort_job(2);
    }
}
