#include "llmc/run/preempt.h"

#include <signal.h>

#include <cstring>

#include "llmc/comm/comm.h"
#include "llmc/core/common.h"

namespace {

volatile sig_atomic_t g_signal = 0;  // the first stop signal this process received (0: none)

void on_stop_signal(int sig) {
    if (g_signal == 0) g_signal = sig;
}

}  // namespace

void preempt_install() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // system calls the signal interrupts (file writes, MPI's polls) resume
    for (int sig : {SIGUSR1, SIGTERM, SIGINT})
        LLMC_ASSERT(::sigaction(sig, &sa, nullptr) == 0, strfmt("sigaction(%d) failed", sig));
}

void preempt_uninstall() {
    for (int sig : {SIGUSR1, SIGTERM, SIGINT}) ::signal(sig, SIG_DFL);
    if (g_signal != 0) ::raise(g_signal);
}

int preempt_agreed(Comm& world) {
    double sig = double(g_signal);
    world.all_reduce(&sig, 1, ReduceOp::Max);
    return int(sig);
}

std::string signal_name(int sig) {
    switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return strfmt("signal %d", sig);
    }
}
