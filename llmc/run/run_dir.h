// A run's folders, prepared on world rank 0 after the plan and before any work:
//  - out_dir is locked for the life of the process (flock on <out_dir>/train_gpt.lock, which
//    holds the pid): a second trainer on the same folder stops with a UserError naming the
//    holder's pid, instead of deleting the first one's temporary checkpoint and interleaving
//    log.jsonl. The checkpoint folder is locked the same way (<checkpoint.dir>/train_gpt.lock):
//    two runs with different out_dirs may name one checkpoint.dir. The kernel drops the locks
//    when the process ends, however it ends.
//  - out_dir and the checkpoint folder exist and are writable (a probe file in each), so that a
//    bad path fails now and not at the first save or after the last step.
//  - checkpoint.resume "never" (a fresh run) in a folder that holds another run's checkpoints,
//    log.jsonl or final model is refused: its retention would delete the new run's checkpoints
//    in favour of the old ones, and a later "auto" would continue the old run.
//  - resuming compares the checkpoint's run (its resolved config, data-parallel size and training
//    shards, stored in state.bin) with this one: resume_changes() lists every difference and
//    check_resume_changes() refuses those that break an exact continuation unless
//    checkpoint.allow_changes is true (docs/checkpoints.md, "What a resume may change").
#pragma once
#include <string>
#include <vector>

#include "llmc/io/checkpoint.h"
#include "llmc/core/config.h"

// Throws UserError naming the folder, the key and the way out.
void prepare_run_dirs(const Config& cfg, const std::string& ckpt_dir);

// Rolling back (checkpoint.resume = a folder of step `step`): the checkpoints in ckpt_dir of later
// steps belong to the abandoned branch. Each is renamed abandoned_step_NNNNNNNN (abandoned2_...
// after a second rollback past it; kept, never
// resumed by "auto", never counted by retention); returns the new names. Rank 0 only.
std::vector<std::string> set_aside_later_checkpoints(const std::string& ckpt_dir, int step);

// One difference between the run that saved a checkpoint and this run.
struct ResumeChange {
    std::string key;            // a config key, or "tokens per step", "training shards", "learning rate"
    std::string before, after;  // the values, as the config writes them
    bool breaks = false;        // the run can no longer continue exactly as the saved one would have
};

// The differences between the run that saved `saved` (read from its checkpoint) and this run: cfg
// at data-parallel size dp, reading the training shards `shards` (shard_list()). Breaking: another
// shard set (names or sizes; a glob that matches the same shards elsewhere is not), data.shuffle,
// train.micro_batch, train.seq_len, the tokens per step (micro_batch x seq_len x grad_accum x dp),
// the learning rate of any remaining step (so train.steps only where the schedule depends on it),
// the optimizer's and the model's hyperparameters, parallel.local_sgd.* (the outer optimizer), and
// train.seed. Harmless: how the run is laid out and computed (the other parallel.*, device, recompute, precision; fp8.* is the fp8 converter's to
// refuse), evaluated, logged and saved (eval.*, log.*, out.*, checkpoint.*, out_dir, data.val,
// tokenizer), and model.init/init_seed (the weights come from the checkpoint). Keys the saved
// config lacks (older train_gpt) are not compared.
std::vector<ResumeChange> resume_changes(const TrainState& saved, const Config& cfg, int dp,
                                         const nlohmann::json& shards);

// The changes as lines to print (empty when there are none). Throws UserError naming each breaking
// change (key, saved value, this run's value) and the way out when there is one and
// cfg.checkpoint.allow_changes is false; when it is true the lines say the run continues anyway.
std::string check_resume_changes(const std::vector<ResumeChange>& changes, const Config& cfg, const std::string& from);
