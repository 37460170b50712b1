// Preemption: stop at a step boundary, save, and tell the job script to resume.
//
// SIGUSR1 (Slurm's warning before the time limit, sbatch --signal), SIGTERM (scancel, scontrol
// requeue, preemption; SIGKILL follows after the cluster's KillWait) and SIGINT (Ctrl-C) ask the
// run to stop. The handler only records the signal, so whatever runs when it arrives (a step, a
// collective, a checkpoint save) finishes first. At every step boundary the training loop calls
// preempt_agreed(), one max-reduce of a single number over the world: a signal that reached
// only some ranks stops them all at the same step, world rank 0 writes a checkpoint, and every
// rank exits with kExitPreempted (llmc/core/exit_codes.h). `checkpoint.resume: auto` continues from it
// bit-exactly.
#pragma once
#include <string>

class Comm;

// Installs the handlers for SIGUSR1, SIGTERM and SIGINT (once per process; before the loop).
void preempt_install();
// Restores the default action of the three signals (ending the process, so that the shell sees
// 128 + the signal: SIGINT 130, SIGTERM 143), for work that has nothing to save (--plan); a
// signal that already arrived ends the process now.
void preempt_uninstall();
// Collective over world, called by every rank at every step boundary: 0 when no rank has
// received a stop signal since preempt_install(), else the highest number among the first
// signals the ranks got.
int preempt_agreed(Comm& world);
// "SIGUSR1", "SIGTERM", "SIGINT" for the numbers above.
std::string signal_name(int sig);
