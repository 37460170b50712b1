// Training checkpoints: everything needed to continue a run exactly.
//
// A checkpoint is a folder <checkpoint.dir>/step_NNNNNNNN/ holding
//   model.bin  the model in llm.c's format (version 3 fp32, or 5 bf16 for bf16 runs)
//   state.bin  optimizer moments m, v and fp32 master weights (when the model is not fp32),
//              all in llm.c tensor order, then (precision "fp8") the FP8 scaling state as
//              Fp8State::save() wrote it, plus JSON metadata (step, data-loader position,
//              seeds, the resolved config, the training shards, "fp8_bytes", the count of skipped
//              steps, fp16's loss scale and its clean-step count) and a checksum of both files; a
//              local SGD run (parallel.local_sgd, state version 2) then its outer state and the other
//              DP ranks' replicas (LocalSgdState); a PowerSGD run (parallel.grad_compression,
//              version 3) then every DP rank's error feedback and the factors Q (PowerSgdState)
//   DONE       the completion marker, written last
// Tensors are stored whole (logical shape), so any later parallel layout can load them.
// Saving writes step_NNNNNNNN.tmp/, fsyncs, renames it, then writes DONE: a run killed at any
// point leaves the previous checkpoint intact, and only folders with DONE are ever resumed.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/data/dataloader.h"
#include "llmc/model/model.h"
#include "llmc/model/optimizer.h"

struct TrainState {
    int step = 0;  // steps completed
    LoaderPosition loader;
    int loader_dp = 1;  // data-parallel ranks the loader position counts window groups of
    int skipped = 0;    // steps skipped so far for a non-finite loss or gradient norm (0 in older checkpoints)
    // precision "fp16": the loss scale of the next step and the clean steps since it last changed
    // (the dynamic scale doubles when they reach train.loss_scale_window); 0: a run without one
    double loss_scale = 0.0;
    int loss_scale_clean = 0;
    // What an exact continuation depends on besides the above (compared on resume, llmc/run/run_dir.h):
    // the training shards as [base name, bytes] pairs (shard_list()), null in older checkpoints;
    // and, filled when a checkpoint is read, the resolved config of the run that saved it.
    nlohmann::json train_shards;
    nlohmann::json config;
};

// The training shards' identity for TrainState::train_shards: [[base name, size in bytes], ...].
nlohmann::json shard_list(const std::vector<std::string>& files);

// This rank's whole optimizer state, fp32, in memory order over the model's padded flat buffer
// (ParamLayout::padded_params elements; master empty when the model is fp32). ZeRO shards are
// gathered into one before saving and cut from one after loading (llmc/train/data_parallel.h).
struct OptimizerState {
    std::vector<float> m, v, master;
};

// One data-parallel replica's training state, as WholeState's fields of the same names.
struct ReplicaState {
    std::vector<float> params, m, v, master;
};
// Local SGD's state (llmc/train/local_sgd.h), llm.c order: the outer optimizer's anchor (the weights
// at the last sync) and momentum, and the replicas of DP ranks 1 .. dp - 1 (each trains its own
// between syncs; DP rank 0's is WholeState's params, m, v, master). Empty without local SGD.
struct LocalSgdState {
    std::vector<float> anchor, momentum;
    std::vector<ReplicaState> replicas;
    bool empty() const { return anchor.empty(); }
    int dp() const { return empty() ? 0 : int(replicas.size()) + 1; }  // the replicas saved
};

// PowerSGD's state (llmc/train/powersgd.h): every DP rank's error feedback (llm.c order, zero outside
// the compressed matrices; DP rank 0's first) and the warm-start factors Q of the compressed
// matrices (each cols x rank, row-major, concatenated in memory order: a dp-only layout's, the only
// one PowerSGD runs on). Empty without PowerSGD.
struct PowerSgdState {
    int rank = 0;
    std::vector<std::vector<float>> errors;
    std::vector<float> q;
    bool empty() const { return errors.empty(); }
    int dp() const { return int(errors.size()); }
};

// The whole model's training state in llm.c tensor order (num_params elements each):
// what a checkpoint holds, independent of the layout that wrote it. Assembled from the ranks'
// pieces by llmc/train/layout.h; every layout takes its pieces with Model::from_file_order.
struct WholeState {
    std::vector<float> params, m, v, master;  // master empty when the run keeps no master weights
    // Fp8State::save() of a precision "fp8" run, empty otherwise. After each step's amax
    // reduction every rank holds the same whole-model state, so it is layout-independent too.
    std::vector<uint8_t> fp8;
    LocalSgdState local_sgd;
    PowerSgdState powersgd;
};

// Training state that is not finite (NaN or infinite weights or moments): never written over a
// good checkpoint. main ends the run with kExitBadSteps (llmc/core/exit_codes.h).
struct NonFiniteState : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct StateView;
// Throws NonFiniteState naming the first non-finite tensor element (by llm.c order index) and
// the step, so that nothing non-finite is ever saved (a checkpoint or the final model).
void check_finite_state(const StateView& state, int step);
void check_finite_state(const WholeState& whole, int step);

// Latest complete checkpoint folder in dir, or "" when there is none.
std::string checkpoint_latest(const std::string& dir);
// Saves state (state.st: its TrainState), then deletes complete checkpoints older than the newest
// `keep` and stale temporaries. Each array is read a chunk at a time as it is written (from the
// ranks' pieces gathered to world rank 0, never assembled whole: llmc/train/layout.h), checked
// finite (NonFiniteState, as check_finite_state) and hashed. Throws UserError when writing fails;
// either way the previous checkpoints are kept and nothing of this one is left.
// Called by one process (rank 0). model_version: 3 (fp32) or 5 (bf16) for model.bin.
std::string checkpoint_save(const std::string& dir, const StateView& state, const ModelShape& shape, int model_version,
                            const nlohmann::json& config, int keep);
// The same from a whole state in memory.
std::string checkpoint_save(const std::string& dir, const TrainState& st, const ModelShape& shape, int model_version,
                            const WholeState& whole, const nlohmann::json& config, int keep);
// Loads a checkpoint folder into *whole. Every rank may call it. Throws UserError naming the
// file when it is incomplete, corrupt, truncated or of another model shape, or its weights are not
// finite. With whole null it checks all of that and keeps nothing: both files are read through a
// buffer of 1 MB and hashed (what world rank 0 does before a resume reads its pieces).
TrainState checkpoint_load(const std::string& path, const ModelShape& shape, WholeState* whole);

// A checkpoint's state with each array (llm.c order, num_params elements) handed out in pieces:
// as a rank takes it when it resumes, so that it reads only what it holds (its tensor- and
// pipeline-parallel piece of the weights, its ZeRO shard of the moments: Model::from_file_order);
// and as checkpoint_save writes it, from the ranks' gathered pieces.
struct ArraysView {
    ReadFileOrder params, m, v, master;  // master: null when the checkpoint keeps none
};
struct StateView {
    TrainState st;
    size_t num_params = 0;  // each array's elements
    ArraysView main;  // DP rank 0's (WholeState's params, m, v, master)
    // local SGD (empty: local_dp 0): the DP ranks saved, the outer state, replicas 1 .. local_dp - 1
    int local_dp = 0;
    ReadFileOrder anchor, momentum;
    std::vector<ArraysView> replicas;
    // PowerSGD (empty: no errors): its rank, each DP rank's error feedback, the factors Q
    int psgd_rank = 0;
    std::vector<ReadFileOrder> psgd_errors;
    std::vector<float> psgd_q;
    std::vector<uint8_t> fp8;  // WholeState::fp8
    // bytes of state.bin and model.bin read so far by the arrays' reads (checkpoint_open's; 0 in memory)
    std::shared_ptr<size_t> bytes_read = std::make_shared<size_t>(0);
};
// A view of a whole state in memory (checkpoint_load's), which must outlive it.
StateView view_of(const WholeState& whole, const TrainState& st);
// A view of the checkpoint folder at path that reads the files where each piece lies, as it is
// asked for (at the open only the small sections: fp8's bytes, PowerSGD's Q). What it checks before
// it returns, with the messages of checkpoint_load: the DONE marker, state.bin's header and
// metadata, model.bin's header against shape, both files' sizes. Not the checksums, which cover
// whole files, nor the weights' finiteness: world rank 0 checks them first (checkpoint_load with
// no WholeState), and every rank stops on its error (train()'s agreement) before any step. A read
// that fails or comes short is a UserError naming the file.
StateView checkpoint_open(const std::string& path, const ModelShape& shape);

// The checksums of a checkpoint's two files are of the kind in state.bin's header (its fourth
// int32): XXH3-64 in what checkpoint_save writes, FNV-1a 64 in checkpoints written before
// 2026-11-28 (still loaded). checkpoint_checksum: n bytes' checksum of that kind.
constexpr int32_t CHECKSUM_FNV1A = 0, CHECKSUM_XXH3 = 1;
uint64_t checkpoint_checksum(int32_t kind, const void* data, size_t n);

// Throws UserError, naming train.steps and the checkpoint's step, when the checkpoint at `from`
// (loaded as st) is past the end of a run of `steps` steps: its weights are not those of any
// step of this run.
void check_resume_within(const TrainState& st, int steps, const std::string& from);

// Test hook: when the environment variable LLMC_FAULT equals name (or name_<step>), the
// process kills itself with SIGKILL: a crash at that point (of a checkpoint write, of a
// training step). LLMC_FAULT=hang:name (or hang:name_<step>) makes it sleep forever instead
// (a hung rank, for the collective watchdog). LLMC_FAULT=usr1:name (term:, int:) sends the
// process that signal and returns (preemption, llmc/run/preempt.h). LLMC_FAULT=nan:name makes it
// return true: the caller injects a NaN there. LLMC_FAULT=slow:name sleeps 5 s there and goes on
// (a slow disk). With LLMC_FAULT_RANK=r set, only world rank r
// does any of these. Returns false otherwise.
bool fault_point(const char* name, int step);
