// A graceful stop for preemptible jobs: SIGUSR1, SIGINT and SIGTERM ask a run to stop rather than kill it. The
// ranks agree on the step (the request travels in the step report's all-reduce, so a signal that reached one
// rank stops them all at the same step, with no collective of its own), write a checkpoint and exit with
// kStoppedExitStatus; `--resume auto` continues bit for bit. A second signal of the same kind kills at once.
// SIGTERM is left alone in ranks that mpirun/mpiexec started: it is how the launcher ends the other ranks when
// one fails, and a rank blocked in a collective with a dead peer never reaches a step's end. There, send SIGUSR1
// (mpirun passes it on to every rank); SLURM's srun tasks (and single processes) also stop on SIGTERM.
#pragma once

namespace llmc {

inline constexpr int kStoppedExitStatus = 4;

// Whether this process is a rank that mpirun/mpiexec started (not srun's, not a single process). Ask before
// MPI_Init, which sets Open MPI's variables in a single process too.
bool started_by_mpi_launcher();

// Installs the handlers for its lifetime (the previous dispositions come back on destruction); SIGTERM's only
// with `sigterm` (false in ranks of mpirun/mpiexec).
class StopSignals {
public:
    explicit StopSignals(bool sigterm);
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;
    // The first stop signal this process received since the handlers were installed, or 0.
    static int received();
};

// "SIGTERM", "SIGINT", "SIGUSR1" (or "signal N").
const char* signal_name(int signal);

}  // namespace llmc
