// A run's folders, prepared on world rank 0 after the plan and before any work:
//  - out_dir is locked for the life of the process (flock on <out_dir>/train_gpt.lock, which
//    holds the pid): a second trainer on the same folder stops with a UserError naming the
//    holder's pid, instead of deleting the first one's temporary checkpoint and interleaving
//    log.jsonl. The kernel drops the lock when the process ends, however it ends.
//  - out_dir and the checkpoint folder exist and are writable (a probe file in each), so that a
//    bad path fails now and not at the first save or after the last step.
//  - checkpoint.resume "never" (a fresh run) in a folder that holds another run's checkpoints,
//    log.jsonl or final model is refused: its retention would delete the new run's checkpoints
//    in favour of the old ones, and a later "auto" would continue the old run.
#pragma once
#include <string>
#include <vector>

#include "llmc/config.h"

// Throws UserError naming the folder, the key and the way out.
void prepare_run_dirs(const Config& cfg, const std::string& ckpt_dir);

// Rolling back (checkpoint.resume = a folder of step `step`): the checkpoints in ckpt_dir of later
// steps belong to the abandoned branch. Each is renamed abandoned_step_NNNNNNNN (abandoned2_...
// after a second rollback past it; kept, never
// resumed by "auto", never counted by retention); returns the new names. Rank 0 only.
std::vector<std::string> set_aside_later_checkpoints(const std::string& ckpt_dir, int step);
