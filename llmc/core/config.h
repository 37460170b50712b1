// The run's configuration: JSON file + command-line overrides -> a validated Config.
// Every key has a schema entry (type, default, allowed values) in config_schema.cpp; errors
// name the key path and what is allowed, and are UserErrors (exit code 2).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/core/tensor.h"

// Mixture of experts (llmc/model/moe.h has the exact definitions).
struct MoeConfig {
    int num_experts = 0;  // 0 = no MoE layers
    int top_k = 2;
    int expert_ffn_dim = 0;  // 0 = the family's MLP width
    int every = 1;
    double aux_loss_coef = 0.01;
    double capacity_factor = 0.0;  // 0 = dropless
};

struct ModelConfig {
    std::string arch = "gpt2";
    int n_layer = 12;
    int n_head = 12;
    int d_model = 768;
    int vocab_size = 50257;
    int max_seq_len = 1024;
    // Llama (model.arch "llama"; GPT-2 has n_kv_head = n_head, ffn_dim = 4 d_model, a tied head)
    int n_kv_head = 0;            // 0 = n_head
    int ffn_dim = 0;              // 0 = the family's default
    double rope_theta = 10000.0;
    double norm_eps = 1e-5;
    bool tie_embeddings = false;
    MoeConfig moe;
    std::string init = "random";  // "random", an llm.c checkpoint, or a transformers .safetensors file
    int init_seed = 0;
    int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
};

struct DataConfig {
    std::string train;  // glob of training shards (required)
    std::string val;    // glob of validation shards ("" = no validation)
    bool shuffle = false;
};

struct TrainConfig {
    int micro_batch = 4;
    int seq_len = 64;
    int grad_accum = 1;
    int steps = 10;
    double lr = 3e-4;
    std::string lr_schedule = "cosine";  // constant | cosine | linear | wsd
    int warmup_steps = 0;
    double final_lr_frac = 0.0;
    double decay_frac = 0.2;  // wsd: fraction of steps spent in the final decay
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
    double grad_clip = 1.0;  // 0 = off
    int seed = 1337;
    int max_bad_steps = 8;  // consecutive non-finite (skipped) steps that end the run
    // precision "fp16": the loss scale (0 = "dynamic": starts at 2^16, halves on an overflow,
    // doubles after loss_scale_window clean steps; a number: that scale, fixed)
    double loss_scale = 0.0;
    int loss_scale_window = 1000;
    std::string recompute = "none";  // none | selective | full: activations recomputed in backward
    bool offload_optimizer = false;  // AdamW's state and update on the host (llmc/model/optimizer.h)
    bool offload_activations = false;  // the kept layer inputs in host memory (llmc/model/model.h; recompute full)
    bool cuda_graphs = false;  // each step's device work replayed as one CUDA graph (llmc/cuda/step_graph.cuh)
};

struct EvalConfig {
    int every = 0;  // 0 = off
    int batches = 10;
    int sample_every = 0;  // 0 = off
    int sample_tokens = 64;
};

struct LogConfig {
    std::string jsonl;  // "" = <out_dir>/log.jsonl
};

// The final weights' formats: llm.c's model_<steps>.bin, transformers' model_<steps>.safetensors
// with config.json, or both.
struct OutConfig {
    std::string format = "both";  // llmc | hf | both
};

struct CheckpointConfig {
    int every = 0;           // 0 = only the final model
    int keep = 2;            // last K complete checkpoints kept
    std::string dir;         // "" = <out_dir>/checkpoints
    std::string resume = "auto";  // auto | never | <path>
    // resuming with changes that break an exact continuation (llmc/run/run_dir.h): false refuses them
    bool allow_changes = false;
    // write each checkpoint on a thread of its own while training goes on (llmc/io/async_save.h);
    // the final one, and one for a stop signal, are written before the run ends either way
    bool async = false;
};

// Local SGD / DiLoCo over the DP group (llmc/train/local_sgd.h): each DP rank takes `every` AdamW
// steps on its own gradients, then the replicas' parameters are averaged and the outer optimizer
// (SGD with Nesterov momentum on the averaged delta) moves them. The defaults (1, 0) are plain
// periodic averaging (local SGD); DiLoCo's recipe is outer_lr 0.7, outer_momentum 0.9 (docs/parallelism.md).
struct LocalSgdConfig {
    int every = 0;                // H, inner steps between syncs; 0 = off (plain data parallelism)
    double outer_lr = 1.0;        // the outer SGD's learning rate
    double outer_momentum = 0.0;  // its Nesterov momentum (0: none)
};

// Process layout: world = dp x tp x pp (tp fastest, then dp, then pp; see llmc/parallel/process_grid.h).
struct ParallelConfig {
    int dp = 0;                 // data-parallel ranks; 0 = "auto" (world / (tp * pp * cp))
    int tp = 1;                 // tensor-parallel ranks (Megatron column/row split; n_head % tp == 0)
    bool sequence_parallel = false;  // LayerNorm/residual regions sharded along the tokens over TP
    int pp = 1;                 // pipeline stages
    int cp = 1;                 // context-parallel ranks (every sequence split over them; ring attention)
    int ep = 1;                 // expert-parallel ranks (model.moe's experts split over ep of the dp ranks)
    std::vector<int> pp_layers;      // layers per stage (and per chunk when interleaved); empty = balanced
    bool pp_layers_auto = false;     // "auto": balanced by the planner's cost model (resolve_pp_layers)
    std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved
    int pp_virtual = 1;         // model chunks per pipeline rank (interleaved)
    int zero = 0;               // ZeRO stage over the DP group: 0, 1, 2, 3
    std::string comm = "auto";  // auto | mpi | nccl
    double bucket_mb = 25.0;    // gradient bucket size in MiB (fp32 elements)
    double timeout_s = 300.0;   // a blocking collective or send/recv that takes longer ends the job
    bool overlap = true;        // communication posted non-blocking, waited for where its result is needed
    LocalSgdConfig local_sgd;
    // The DP all-reduce's gradients: "none" (as they are) or "powersgd" (rank-powersgd_rank
    // approximations of the matrices with error feedback, llmc/train/powersgd.h; ZeRO-0, dp only)
    std::string grad_compression = "none";
    int powersgd_rank = 4;
};

// FP8 linear layers (precision "fp8"): formats and per-tensor scaling (see llmc/precision/fp8.h).
struct Fp8Config {
    std::string format = "hybrid";  // hybrid (E4M3 forward, E5M2 gradients) | e4m3
    std::string recipe = "delayed";  // delayed (amax history) | current (this tensor's amax)
    int amax_history = 16;           // steps of amax history (delayed)
    int margin = 0;                  // scale = 2^-margin * fp8_max / amax
};

// The CUDA kernels' ways where more than one is built and a GPU has not yet chosen between them
// (device cuda; the CPU backend ignores these): "auto" is the measured choice.
struct KernelsConfig {
    std::string attention_forward = "auto";   // auto | keys128 | wgmma | wgmma_pipelined (attention_forward v6-v8)
    // auto | dq_from_ds | fused | wgmma_dq | wgmma | wgmma_pipelined | wgmma_ss (attention_backward v7-v12)
    std::string attention_backward = "auto";
    std::string layernorm_backward = "auto";  // auto (rows in registers) | streamed (dev/cuda/layernorm v5)
    // auto (transposed copies) | mn_major (the wgmma ways' V, K, Q, dO as they lie: attention_forward
    // v9/v10, attention_backward v13-v15)
    std::string attention_wgmma_layout = "auto";
};

// The planner (train_gpt --plan): the cluster it plans for.
// The device and link numbers are the table's (llmc/plan/step_model.cpp) for plan.gpu where 0.
struct PlanConfig {
    int world = 0;  // processes; 0 = "auto" (dp x tp x pp when parallel.dp is a number, else 1)
    std::string gpu = "h100";  // h100 | h200 | a100-80 | a100-40: the device table's row
    int gpus_per_node = 8;     // GPUs joined by NVLink; groups spanning nodes use InfiniBand
    double efficiency = 0.5;   // achieved fraction of the dense peak while computing
    double peak_tflops = 0;    // dense peak of the run's precision, TFLOP/s
    double hbm_gb_s = 0;       // HBM bandwidth, GB/s
    double gpu_mem_gib = 0;    // memory per GPU, GiB
    double nvlink_gb_s = 0;    // NVLink bandwidth per GPU, one direction, GB/s
    double ib_gb_s = 0;        // InfiniBand bandwidth per GPU, one direction, GB/s
    double nvlink_latency_us = 0, ib_latency_us = 0;  // per step of a ring collective, microseconds
    bool tp_overlap = false;   // tensor-parallel collectives overlapped with the GEMMs (Megatron's, not ours)
};

struct Config {
    std::string device = "auto";     // auto | cpu | cuda
    std::string precision = "fp32";  // fp32 | bf16 | fp16 | fp8
    ModelConfig model;
    DataConfig data;
    TrainConfig train;
    EvalConfig eval;
    LogConfig log;
    OutConfig out;
    CheckpointConfig checkpoint;
    ParallelConfig parallel;
    Fp8Config fp8;
    KernelsConfig kernels;
    PlanConfig plan;
    std::string tokenizer_dir;  // key "tokenizer": folder with encoder.json + vocab.bpe ("" = ids only)
    std::string out_dir = "out";

    nlohmann::json resolved;  // the fully resolved config (defaults filled), as JSON
};

// Parses argv: argv[1] = config path (or "-" for none; it may also be omitted when the first
// argument is an override or a flag), then key=value overrides and flags. An override's value
// is JSON when it parses as JSON, else plain text; dotted paths create nested objects.
// Recognised flags: --print-config (sets *print_config; may be null), --plan / --plan=json (sets
// *plan to "text" or "json"; may be null), --help / -h (prints config_usage() to stdout and exits
// with code 0). Throws UserError on any bad input. Reads files only (config, globs); writes nothing.
Config load_config(int argc, char** argv, bool* print_config, std::string* plan = nullptr);

// The command-line help: usage line, flags, and every config key with its default and
// allowed values (generated from the schema table in config_schema.cpp).
std::string config_usage();

// Validates a JSON object against the schema and builds the Config (also used by tests
// and by checkpoint resume to read the stored config). Throws UserError. check_files: the data
// globs must match files (false for --plan, which reads no data).
Config config_from_json(const nlohmann::json& j, bool check_files = true);

// The dtype of parameters, gradients and activations for a precision on a device ("cpu"/"cuda").
DType run_dtype(const std::string& precision, const std::string& device);
