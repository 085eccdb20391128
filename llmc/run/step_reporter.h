// A finished step turned into metrics (the progress line and metrics.jsonl), the ranks' agreement to stop early on a
// signal or the time limit, and the end of a run that stopped early, the same in both trainers.
#pragma once
#include <chrono>
#include <exception>
#include <optional>

#include "llmc/comm/transport.h"
#include "llmc/optim/optimizer.h"
#include "llmc/run/checkpoint.h"
#include "llmc/run/config.h"
#include "llmc/run/evaluation.h"
#include "llmc/run/metrics.h"

namespace llmc {

// Why the ranks agreed to stop a run early (finish_stopped_run).
enum class StopReason { none, signal, time_limit };

// Turns one finished optimizer step into metrics, identically in both trainers: averages loss and gradient
// norm over the ranks, advances the training state's step, token and byte counts, estimates the ETA (the
// first step of a session, which pays for allocation, is left out), writes the JSONL line and prints the
// progress line every log_every steps (rank 0, which passes its MetricsLog; other ranks pass null).
// With several ranks the averages travel while the next step computes (Transport::allreduce_sum_start: on a
// link with a delay a blocking sum would cost each step a latency), so a step's lines are written when the
// next step reports, or at flush(): the trainers flush before anything that prints or saves after a step
// (evaluations, samples, checkpoints) and on an error, and the last step flushes itself.
class StepReporter {
public:
    using Clock = std::chrono::steady_clock;
    // `launched`: when the process started, from which --time_limit_minutes counts
    StepReporter(const TrainConfig& cfg, int start_step, MetricsLog* log, ModelFlops flops, Clock::time_point launched);
    // `step` is 0-based; `started` is when the step's first micro-batch began (or, where the step was queued
    // while the last one ran, when the last one ended); `comm` its traffic (transport's counters, reset at its
    // start); `transport` averages the loss and the norm over the ranks. The state advances at once.
    void report(int step, Clock::time_point started, double local_loss, float lr, const StepResult& result,
                const CommCounters& comm, Transport& transport, TrainingState& state);
    // Waits for the reported step's averages, if one is waiting, and writes its lines.
    void flush(Transport& transport);
    // Whether some rank had received a stop signal (stop_signal.h), or found at a step's report that waiting one
    // more step to ask would take it past --time_limit_minutes (time_to_next_stop), when it reported a step
    // flushed so far: the same answer on every rank at the same point of the loop, since every rank flushes the
    // same steps there.
    bool stop_requested() const { return stop_reason_ != StopReason::none; }
    StopReason stop_reason() const { return stop_reason_; }  // a signal wins over the time limit
    // Whether --checkpoint_every_minutes had passed on some rank since the last checkpoint (or the start) when it
    // reported a step flushed so far and later than that checkpoint: the same answer on every rank, as above.
    bool checkpoint_requested() const { return checkpoint_requested_; }
    // The checkpoint of step `step`, begun at `began`, is saved: its time is part of the time limit's margin (until
    // then, an estimate from the model's size), and --checkpoint_every_minutes counts from now.
    void checkpoint_saved(Clock::time_point began, int64_t step);
    // A step's evaluations (validation, sample), begun at `began`, are done: their time is part of the time limit's
    // margin when the step being reported or the next one owes evaluations.
    void evaluations_done(Clock::time_point began);
    // Seconds from the report of 0-based `step` (which took step_seconds) to the end of the checkpoint of a stop
    // asked for at the next report: two more steps, the evaluations that this step and those two owe (each at the
    // last evaluations' time), and a checkpoint (the last one's save time, or the estimate).
    double time_to_next_stop(int step, double step_seconds) const;
    // Flushes the reporter when the training loop is left by an error, so the last step's lines come before
    // the error's message (every rank that reported that step has sent its share: the wait ends).
    class FlushOnError {
    public:
        FlushOnError(StepReporter& reporter, Transport& transport)
            : reporter_(reporter), transport_(transport), exceptions_(std::uncaught_exceptions()) {}
        ~FlushOnError() {
            if (std::uncaught_exceptions() <= exceptions_) return;
            try {
                reporter_.flush(transport_);
            } catch (...) {  // the error in flight is the one to report
            }
        }
        FlushOnError(const FlushOnError&) = delete;
        FlushOnError& operator=(const FlushOnError&) = delete;

    private:
        StepReporter& reporter_;
        Transport& transport_;
        int exceptions_;
    };

private:
    const TrainConfig& cfg_;
    int start_step_;
    MetricsLog* log_;
    ModelFlops flops_;
    double session_seconds_ = 0.0;
    int session_steps_ = 0;
    std::optional<StepMetrics> pending_;  // reported, its averages in flight
    std::optional<Clock::time_point> deadline_;  // launched + --time_limit_minutes
    double checkpoint_seconds_ = 0.0, evaluation_seconds_ = 0.0;
    StopReason stop_reason_ = StopReason::none;
    Clock::time_point last_checkpoint_;  // or the launch
    int64_t last_checkpoint_step_ = -1;
    bool checkpoint_requested_ = false;
};

// The end of a run that stopped early, on a stop signal or its time limit, after `step` (its checkpoint written,
// unless --checkpoint_every -1): rank 0 says where it stopped, why and how to continue, on stdout and in `log` (a
// "stopped" line; null on the other ranks). Returns kStoppedExitStatus.
int finish_stopped_run(const TrainConfig& cfg, const Transport& transport, MetricsLog* log, int64_t step,
                       StopReason reason);

}  // namespace llmc
