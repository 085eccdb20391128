// Stop-signal handlers (see stop_signal.h). The trainers' only process-global state: a signal handler can only
// reach statics, and it may only store to a sig_atomic_t.
#include "llmc/base/stop_signal.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace llmc {

namespace {
volatile std::sig_atomic_t g_received = 0;
constexpr int kStopSignals[] = {SIGUSR1, SIGINT, SIGTERM};
struct sigaction g_previous[3];
int g_installed = 0;  // how many of kStopSignals have handlers

void on_stop_signal(int signal) {
    if (g_received == 0) g_received = signal;
}
}  // namespace

StopSignals::StopSignals(bool sigterm) {
    g_received = 0;
    struct sigaction action = {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    // SA_RESTART: a signal during a read or an MPI wait must not fail it; SA_RESETHAND: the second one kills
    action.sa_flags = SA_RESTART | SA_RESETHAND;
    g_installed = sigterm ? 3 : 2;
    for (int i = 0; i < g_installed; i++) sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
    for (int i = 0; i < g_installed; i++) sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() { return g_received; }

bool started_by_mpi_launcher() {
    // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE in its ranks; MPICH's mpiexec PMI_RANK. srun's tasks have
    // SLURM_STEP_ID too: SLURM sends SIGTERM before its SIGKILL, at preemption as at a failure, so they stop on it.
    const bool pmi = std::getenv("PMI_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr;
    return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || (pmi && std::getenv("SLURM_STEP_ID") == nullptr);
}

const char* signal_name(int signal) {
    switch (signal) {
        case SIGTERM: return "SIGTERM";
        case SIGINT: return "SIGINT";
        case SIGUSR1: return "SIGUSR1";
    }
    static thread_local char text[32];
    std::snprintf(text, sizeof text, "signal %d", signal);
    return text;
}

}  // namespace llmc
