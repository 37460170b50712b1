// The trainer's exit codes: one table, documented in docs/exit-codes.md, so that job
// scripts (scripts/slurm/*.sbatch) and users can tell what happened without reading the log.
#pragma once

enum ExitCode : int {
    kExitOk = 0,
    kExitInternal = 1,     // a bug: a broken invariant (LLMC_ASSERT) or an unexpected crash
    kExitUserError = 2,    // bad input: config, command line, shard, checkpoint, tokenizer; nothing was damaged
    kExitPreempted = 3,    // a signal (SIGUSR1, SIGTERM, SIGINT) asked the job to stop: a checkpoint was saved, resume me
    kExitBadSteps = 4,     // non-finite training: train.max_bad_steps consecutive non-finite steps, or non-finite
                           // weights at a save (never written); stopped, checkpoints untouched
    kExitCommFailure = 5,  // a rank died or a collective stalled past parallel.timeout_s
};
