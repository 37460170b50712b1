// The config's schema: config_schema.h says what a key holds; the table below is every key.
#include "llmc/core/config_schema.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace config_schema {
namespace {

// The largest value of any one model dimension: keeps the shape arithmetic (4 d_model, 8/3 d_model,
// parameter counts) defined; far past any model that fits a machine.
constexpr double kMaxModelDim = 1 << 26;

#define FIELD(expr) [](Config& c) -> void* { return static_cast<void*>(&c.expr); }

Key int_key(const char* path, void* (*f)(Config&), double lo, double hi, const char* help) {
    Key k;
    k.path = path, k.type = KType::Int, k.field = f, k.lo = lo, k.hi = hi, k.help = help;
    return k;
}
Key num_key(const char* path, void* (*f)(Config&), double lo, bool lo_excl, double hi, bool hi_excl,
            const char* help) {
    Key k;
    k.path = path, k.type = KType::Number, k.field = f, k.help = help;
    k.lo = lo, k.lo_excl = lo_excl, k.hi = hi, k.hi_excl = hi_excl;
    return k;
}
Key bool_key(const char* path, void* (*f)(Config&), const char* help) {
    Key k;
    k.path = path, k.type = KType::Bool, k.field = f, k.help = help;
    return k;
}
Key str_key(const char* path, void* (*f)(Config&), bool nonempty, const char* help) {
    Key k;
    k.path = path, k.type = KType::String, k.field = f, k.nonempty = nonempty, k.help = help;
    return k;
}
Key int_list_key(const char* path, void* (*f)(Config&), double lo, const char* help) {
    Key k;
    k.path = path, k.type = KType::IntList, k.field = f, k.lo = lo, k.help = help;
    return k;
}
Key enum_key(const char* path, void* (*f)(Config&), std::vector<std::string> allowed,
             std::vector<std::string> planned, const char* help) {
    Key k;
    k.path = path, k.type = KType::Enum, k.field = f, k.help = help;
    k.allowed = std::move(allowed), k.planned = std::move(planned);
    return k;
}

}  // namespace

// Defaults are the initialisers of the structs in config.h (read from a default Config).
const std::vector<Key>& schema() {
    static const std::vector<Key> keys = {
        enum_key("device", FIELD(device), {"auto", "cpu", "cuda"}, {},
                 "where to train: auto = cuda when a GPU is present, else cpu"),
        enum_key("precision", FIELD(precision), {"fp32", "bf16", "fp16", "fp8"}, {},
                 "compute precision (fp16: IEEE half with fp32 master weights and loss scaling, emulated exactly on "
                 "the CPU; fp8: the blocks' linear layers in FP8, the rest as bf16 on CUDA; on the CPU FP8 is "
                 "emulated exactly and the rest stays fp32)"),

        enum_key("model.arch", FIELD(model.arch), {"gpt2", "llama"}, {},
                 "model family: gpt2 (llm.c's GPT-2) or llama (transformers' LlamaForCausalLM)"),
        int_key("model.n_layer", FIELD(model.n_layer), 1, kMaxModelDim, "transformer blocks"),
        int_key("model.n_head", FIELD(model.n_head), 1, kMaxModelDim, "attention heads (must divide d_model)"),
        int_key("model.d_model", FIELD(model.d_model), 1, kMaxModelDim, "embedding width"),
        int_key("model.vocab_size", FIELD(model.vocab_size), 2, 16777216,
                "vocabulary size (padded to a multiple of 128 internally; past 65536 the shards need uint32 tokens)"),
        int_key("model.max_seq_len", FIELD(model.max_seq_len), 1, kMaxModelDim,
                "longest sequence (GPT-2: positional embedding rows)"),
        int_key("model.n_kv_head", FIELD(model.n_kv_head), 0, kMaxModelDim,
                "llama: key/value heads, dividing n_head (grouped-query attention); 0 = n_head"),
        int_key("model.ffn_dim", FIELD(model.ffn_dim), 0, kMaxModelDim,
                "llama: MLP width; 0 = 8/3 d_model rounded up to a multiple of 256 (GPT-2: always 4 d_model)"),
        num_key("model.rope_theta", FIELD(model.rope_theta), 0, true, NONE, false, "llama: rotary embedding base"),
        num_key("model.norm_eps", FIELD(model.norm_eps), 0, true, NONE, false,
                "llama: RMSNorm epsilon (GPT-2's LayerNorm uses 1e-5)"),
        bool_key("model.tie_embeddings", FIELD(model.tie_embeddings),
                 "llama: the LM head is the token embedding (GPT-2's head is always tied)"),
        int_key("model.moe.num_experts", FIELD(model.moe.num_experts), 0, 4096,
                "mixture of experts: experts per MoE layer (0 = no MoE layers; >= 2 with MoE)"),
        int_key("model.moe.top_k", FIELD(model.moe.top_k), 1, 4096, "experts each token is routed to (<= num_experts)"),
        int_key("model.moe.expert_ffn_dim", FIELD(model.moe.expert_ffn_dim), 0, kMaxModelDim,
                "each expert's MLP width; 0 = the family's MLP width (model.ffn_dim)"),
        int_key("model.moe.every", FIELD(model.moe.every), 1, kMaxModelDim,
                "which layers are MoE: layers every-1, 2 every-1, ... (1 = all, 2 = every second layer)"),
        num_key("model.moe.aux_loss_coef", FIELD(model.moe.aux_loss_coef), 0, false, NONE, false,
                "weight of each MoE layer's load-balancing loss (Switch: num_experts * sum_e f_e P_e) in the loss"),
        num_key("model.moe.capacity_factor", FIELD(model.moe.capacity_factor), 0, false, NONE, false,
                "0 = dropless; else each expert takes ceil(capacity_factor * tokens * top_k / num_experts) "
                "(token, slot) pairs of a micro-batch, in token order; the rest pass through the residual only"),
        str_key("model.init", FIELD(model.init), true,
                "\"random\", the path of an llm.c checkpoint, or a transformers .safetensors file (GPT2LMHeadModel, "
                "LlamaForCausalLM; a sharded one by its .safetensors.index.json)"),
        int_key("model.init_seed", FIELD(model.init_seed), 0, NONE, "seed of the random init"),

        str_key("data.train", FIELD(data.train), false, "glob of training shards (required)"),
        str_key("data.val", FIELD(data.val), false, "glob of validation shards (\"\" = no validation)"),
        bool_key("data.shuffle", FIELD(data.shuffle), "seeded shuffle of shards and windows"),

        int_key("train.micro_batch", FIELD(train.micro_batch), 1, NONE, "sequences per micro-batch (B)"),
        int_key("train.seq_len", FIELD(train.seq_len), 1, NONE, "tokens per sequence (T), <= model.max_seq_len"),
        int_key("train.grad_accum", FIELD(train.grad_accum), 1, NONE, "micro-batches per optimizer step"),
        int_key("train.steps", FIELD(train.steps), 1, NONE, "optimizer steps"),
        num_key("train.lr", FIELD(train.lr), 0, true, std::numeric_limits<float>::max(), false,
                "peak learning rate (the optimizer computes in fp32)"),
        enum_key("train.lr_schedule", FIELD(train.lr_schedule), {"constant", "cosine", "linear", "wsd"}, {},
                 "decay after warmup"),
        int_key("train.warmup_steps", FIELD(train.warmup_steps), 0, NONE, "linear warmup steps (<= train.steps)"),
        num_key("train.final_lr_frac", FIELD(train.final_lr_frac), 0, false, 1, false,
                "final lr as a fraction of the peak"),
        num_key("train.decay_frac", FIELD(train.decay_frac), 0, false, 1, false,
                "wsd: fraction of the steps spent in the final decay"),
        num_key("train.beta1", FIELD(train.beta1), 0, false, 1, true, "AdamW beta1"),
        num_key("train.beta2", FIELD(train.beta2), 0, false, 1, true, "AdamW beta2"),
        num_key("train.eps", FIELD(train.eps), 0, true, NONE, false, "AdamW epsilon"),
        num_key("train.weight_decay", FIELD(train.weight_decay), 0, false, NONE, false,
                "decoupled weight decay (2-D weights only)"),
        num_key("train.grad_clip", FIELD(train.grad_clip), 0, false, NONE, false,
                "global gradient-norm clip (0 = off)"),
        int_key("train.seed", FIELD(train.seed), 0, NONE, "seed of data shuffling and sampling"),
        int_key("train.max_bad_steps", FIELD(train.max_bad_steps), 1, NONE,
                "consecutive steps with a non-finite loss or gradient norm (each skipped) that end the run "
                "(exit code 4)"),
        [] {
            Key k = num_key("train.loss_scale", FIELD(train.loss_scale), 0, true, std::numeric_limits<float>::max(), false,
                            "precision fp16: the loss scale; \"dynamic\" starts at 65536, halves on a gradient "
                            "overflow (the step is skipped) and doubles after train.loss_scale_window clean steps; a "
                            "number is a fixed scale");
            k.word = "dynamic";
            return k;
        }(),
        int_key("train.loss_scale_window", FIELD(train.loss_scale_window), 1, NONE,
                "precision fp16, dynamic loss scale: clean steps after which the scale doubles"),
        enum_key("train.recompute", FIELD(train.recompute), {"none", "selective", "full"}, {},
                 "activation recomputation: none; selective = keep the linear layers' inputs, recompute the "
                 "attention core and the MLP activation in backward; full = keep each layer's input, recompute the "
                 "layer in backward (bitwise the same training, less activation memory)"),
        bool_key("train.offload_optimizer", FIELD(train.offload_optimizer),
                 "AdamW's moments and master weights in host memory (pinned on CUDA), the update on the host "
                 "(every ZeRO stage: each rank its shard); gradients stream down and parameters up in pieces of "
                 "parallel.bucket_mb"),
        bool_key("train.offload_activations", FIELD(train.offload_activations),
                 "with train.recompute = full: the layer inputs it keeps live in host memory (pinned on CUDA), "
                 "copied down after each layer's forward and up again for its backward, beside the compute; the "
                 "device keeps two staging buffers (bitwise the same training)"),
        bool_key("train.cuda_graphs", FIELD(train.cuda_graphs),
                 "device cuda, one process: after a warm-up step whose work neither waits for the host nor "
                 "allocates, one step's device work is captured as a CUDA graph and every later step launches it "
                 "(the host code runs as before, queuing nothing; bitwise the same training); not with offload, "
                 "MoE or fp8"),

        int_key("eval.every", FIELD(eval.every), 0, NONE, "validation every N steps (0 = off)"),
        int_key("eval.batches", FIELD(eval.batches), 0, 1e6, "micro-batches per validation"),
        int_key("eval.sample_every", FIELD(eval.sample_every), 0, NONE, "text sample every N steps (0 = off)"),
        int_key("eval.sample_tokens", FIELD(eval.sample_tokens), 0, 65536, "tokens per text sample"),

        str_key("log.jsonl", FIELD(log.jsonl), false, "JSONL log path (\"\" = <out_dir>/log.jsonl)"),

        int_key("checkpoint.every", FIELD(checkpoint.every), 0, NONE,
                "checkpoint every N steps (0 = only the final model)"),
        int_key("checkpoint.keep", FIELD(checkpoint.keep), 1, NONE, "complete checkpoints kept"),
        str_key("checkpoint.dir", FIELD(checkpoint.dir), false, "checkpoint folder (\"\" = <out_dir>/checkpoints)"),
        str_key("checkpoint.resume", FIELD(checkpoint.resume), true,
                "auto (latest complete checkpoint, else fresh) | never | <path of a checkpoint>"),
        bool_key("checkpoint.allow_changes", FIELD(checkpoint.allow_changes),
                 "resume even when the data, the batch, the lr schedule or the optimizer differ from the "
                 "checkpoint's run (each change is printed; false refuses them, exit code 2)"),
        bool_key("checkpoint.async", FIELD(checkpoint.async),
                 "write checkpoints in the background while training goes on (the state is gathered first; the "
                 "next save, a stop signal and the end of the run wait for it)"),

        [] {
            Key k = int_key("parallel.dp", FIELD(parallel.dp), 1, NONE,
                            "data-parallel ranks, or \"auto\" = world size / (tp * pp * cp)");
            k.auto_ok = true;
            return k;
        }(),
        int_key("parallel.tp", FIELD(parallel.tp), 1, NONE,
                "tensor-parallel ranks (heads, MLP and vocabulary split; must divide n_head)"),
        bool_key("parallel.sequence_parallel", FIELD(parallel.sequence_parallel),
                 "shard LayerNorm/residual activations along the tokens over the TP group"),
        int_key("parallel.pp", FIELD(parallel.pp), 1, NONE, "pipeline stages"),
        int_key("parallel.cp", FIELD(parallel.cp), 1, NONE,
                "context-parallel ranks: each sequence's tokens split over them, attention as a ring (train.seq_len "
                "must divide by 2 x cp; device cpu)"),
        int_key("parallel.ep", FIELD(parallel.ep), 1, NONE,
                "expert-parallel ranks (model.moe): each MoE layer's experts split over ep consecutive data-parallel "
                "ranks, tokens moved to them by all-to-all (must divide parallel.dp and model.moe.num_experts)"),
        [] {
            Key k = int_list_key("parallel.pp_layers", FIELD(parallel.pp_layers), 1,
                                 "layers per pipeline stage (per chunk, in order, when interleaved); [] = as many "
                                 "each; \"auto\" = balanced by the planner's cost model (the embedding counted on the "
                                 "first stage, the head on the last; plan.gpu's device)");
            k.auto_flag = [](Config& c) { return &c.parallel.pp_layers_auto; };
            return k;
        }(),
        enum_key("parallel.pp_schedule", FIELD(parallel.pp_schedule), {"gpipe", "1f1b", "interleaved"}, {},
                 "pipeline schedule (micro-batches = train.grad_accum)"),
        int_key("parallel.pp_virtual", FIELD(parallel.pp_virtual), 1, NONE,
                "model chunks per pipeline rank (interleaved schedule)"),
        int_key("parallel.zero", FIELD(parallel.zero), 0, 3,
                "ZeRO stage over the DP group: 0 replicated, 1 optimizer sharded, 2 + gradients sharded, "
                "3 + parameters sharded (gathered per layer)"),
        enum_key("parallel.comm", FIELD(parallel.comm), {"auto", "mpi", "nccl"}, {},
                 "communicator of the data-parallel group: mpi (host buffers; several ranks may share a GPU), nccl "
                 "(CUDA, device buffers, a GPU per rank), auto = nccl on CUDA when several ranks each have a GPU of their "
                 "own, else mpi"),
        num_key("parallel.bucket_mb", FIELD(parallel.bucket_mb), 0, true, NONE, false,
                "gradient bucket size in MiB of fp32 elements"),
        num_key("parallel.timeout_s", FIELD(parallel.timeout_s), 0, true, NONE, false,
                "seconds before a blocking collective or send/recv that has not completed ends the job"),
        bool_key("parallel.overlap", FIELD(parallel.overlap),
                 "true: collectives and transfers run while the computation goes on, waited for where their "
                 "result is needed; false: each is waited for as soon as it is posted (the same results)"),

        int_key("parallel.local_sgd.every", FIELD(parallel.local_sgd.every), 0, NONE,
                "local SGD / DiLoCo: each DP rank takes this many AdamW steps on its own gradients (no gradient "
                "all-reduce), then the replicas' parameters are averaged and the outer optimizer applied; 0 = off "
                "(plain data parallelism). ZeRO stage 0 or 1 (1 shards the outer state); not with cp or ep"),
        num_key("parallel.local_sgd.outer_lr", FIELD(parallel.local_sgd.outer_lr), 0, true, NONE, false,
                "local SGD: learning rate of the outer SGD on the averaged parameter delta (1 with outer_momentum "
                "0 = plain parameter averaging; DiLoCo: 0.7)"),
        num_key("parallel.local_sgd.outer_momentum", FIELD(parallel.local_sgd.outer_momentum), 0, false, 1, true,
                "local SGD: Nesterov momentum of the outer SGD (0 = none; DiLoCo: 0.9)"),

        enum_key("parallel.grad_compression", FIELD(parallel.grad_compression), {"none", "powersgd"}, {},
                 "the gradients of the DP all-reduce: none = as they are; powersgd = a rank-parallel.powersgd_rank "
                 "approximation of each matrix with error feedback (PowerSGD; ZeRO-0 over dp only, CPU backend)"),
        int_key("parallel.powersgd_rank", FIELD(parallel.powersgd_rank), 1, NONE,
                "PowerSGD: the rank of each matrix's approximation; a matrix with rank x (rows + cols) >= rows x cols "
                "(rank >= its smaller side among them) is sent uncompressed"),

        enum_key("fp8.format", FIELD(fp8.format), {"hybrid", "e4m3"}, {},
                 "hybrid: E4M3 weights/activations, E5M2 gradients; e4m3: E4M3 everywhere"),
        enum_key("fp8.recipe", FIELD(fp8.recipe), {"delayed", "current"}, {},
                 "per-tensor scale from an amax history (delayed) or from the tensor itself (current)"),
        int_key("fp8.amax_history", FIELD(fp8.amax_history), 1, 1024, "steps of amax history (delayed recipe)"),
        int_key("fp8.margin", FIELD(fp8.margin), 0, 32, "scale = fp8_max / amax / 2^margin"),

        enum_key("kernels.attention_forward", FIELD(kernels.attention_forward),
                 {"auto", "keys128", "wgmma", "wgmma_pipelined"}, {},
                 "device cuda: the flash forward; auto = 64-key tiles on mma.sync; keys128 = 128-key tiles at "
                 "head size 64 (FlashAttention-2's tiles; dev/cuda/attention_forward v6); wgmma = Hopper's warpgroup "
                 "MMA at head sizes 64 and 128 on an sm_90 device with a build for sm_90a (v7); wgmma_pipelined = "
                 "the same with each key tile's softmax overlapping the previous tile's PV product (v8); auto "
                 "elsewhere. "
                 "The same results up to the summation order; the CPU backend ignores it"),
        enum_key("kernels.attention_backward", FIELD(kernels.attention_backward),
                 {"auto", "dq_from_ds", "fused", "wgmma_dq", "wgmma", "wgmma_pipelined", "wgmma_ss"}, {},
                 "device cuda: the flash backward; auto = dQ recomputed in its own kernel; dq_from_ds = the "
                 "dK/dV kernel also writes dS to a scratch buffer (2 bytes a visible query-key pair) and dQ = dS K "
                 "reads it (dev/cuda/attention_backward v7); fused = one kernel that also adds dS K into fp32 dQ "
                 "accumulators, deterministically (v8; 4 bytes a dQ element a split); wgmma_dq = the dQ kernel "
                 "on Hopper's warpgroup MMA on an sm_90 device with a build for sm_90a (v9); wgmma = the dK/dV "
                 "kernel on it too (v10; v12 at head size 128); wgmma_pipelined = both kernels with each tile's dS "
                 "overlapping the previous tile's products (v11; at head size 128 the dQ kernel's alone); wgmma_ss "
                 "= wgmma with the dK/dV kernel's K and V read from shared memory by the tensor cores (v12); these "
                 "six at head sizes 64 and 128, auto elsewhere; the CPU backend ignores it"),
        enum_key("kernels.attention_wgmma_layout", FIELD(kernels.attention_wgmma_layout), {"auto", "mn_major"}, {},
                 "device cuda: the wgmma ways of attention_forward and attention_backward; auto = V (forward), "
                 "K, Q and dO (backward) transposed into shared memory for the tensor cores; mn_major = read by "
                 "them as they lie (MN-major; attention_forward v9/v10, attention_backward v13-v15); the same "
                 "results; the CPU backend ignores it"),
        enum_key("kernels.layernorm_backward", FIELD(kernels.layernorm_backward), {"auto", "streamed"}, {},
                 "device cuda: auto = each row kept in registers where d_model allows (up to 2048 in bf16); "
                 "streamed = every row read twice (dev/cuda/layernorm v5); the same bits either way; the CPU "
                 "backend ignores it"),

        [] {
            Key k = int_key("plan.world", FIELD(plan.world), 1, NONE,
                            "--plan: processes to plan for; \"auto\" = dp x cp x tp x pp when parallel.dp is a "
                            "number, else 1");
            k.auto_ok = true;
            return k;
        }(),
        enum_key("plan.gpu", FIELD(plan.gpu), {"h100", "h200", "a100-80", "a100-40"}, {},
                 "--plan: the device of the step-time model and of --plan=search's memory (H100 SXM, H200 SXM, "
                 "A100 SXM 80 GB or 40 GB; peaks, HBM and links in dev/bench/PLANNER.md)"),
        int_key("plan.gpus_per_node", FIELD(plan.gpus_per_node), 1, NONE,
                "--plan: GPUs per node (NVLink inside, InfiniBand between nodes)"),
        num_key("plan.efficiency", FIELD(plan.efficiency), 0, true, 1, false,
                "--plan: achieved fraction of the dense peak FLOP/s while computing"),
        num_key("plan.peak_tflops", FIELD(plan.peak_tflops), 0, false, NONE, false,
                "--plan: dense peak TFLOP/s of the run's precision (0 = plan.gpu's)"),
        num_key("plan.hbm_gb_s", FIELD(plan.hbm_gb_s), 0, false, NONE, false,
                "--plan: HBM bandwidth in GB/s (0 = plan.gpu's)"),
        num_key("plan.gpu_mem_gib", FIELD(plan.gpu_mem_gib), 0, false, NONE, false,
                "--plan: memory per GPU in GiB (0 = plan.gpu's)"),
        num_key("plan.nvlink_gb_s", FIELD(plan.nvlink_gb_s), 0, false, NONE, false,
                "--plan: NVLink bandwidth per GPU, one direction, GB/s (0 = plan.gpu's)"),
        num_key("plan.ib_gb_s", FIELD(plan.ib_gb_s), 0, false, NONE, false,
                "--plan: InfiniBand bandwidth per GPU, one direction, GB/s (0 = plan.gpu's)"),
        num_key("plan.nvlink_latency_us", FIELD(plan.nvlink_latency_us), 0, false, NONE, false,
                "--plan: NVLink latency per step of a ring collective, microseconds (0 = plan.gpu's)"),
        num_key("plan.ib_latency_us", FIELD(plan.ib_latency_us), 0, false, NONE, false,
                "--plan: InfiniBand latency per step of a ring collective, microseconds (0 = plan.gpu's)"),
        bool_key("plan.tp_overlap", FIELD(plan.tp_overlap),
                 "--plan: assume the tensor-parallel collectives overlap the GEMMs (Megatron's --tp-comm-overlap; "
                 "this trainer runs them in line)"),

        str_key("tokenizer", FIELD(tokenizer_dir), false,
                "folder with GPT-2's encoder.json + vocab.bpe (\"\" = token ids only)"),
        str_key("out_dir", FIELD(out_dir), true, "output folder"),
        enum_key("out.format", FIELD(out.format), {"llmc", "hf", "both", "none"}, {},
                 "final weights: llmc = <out_dir>/model_<steps>.bin (llm.c), hf = model_<steps>.safetensors + "
                 "config.json (transformers), both, none (benchmarks: no final weights; checkpoints as usual)"),
    };
    return keys;
}

#undef FIELD

}  // namespace config_schema
