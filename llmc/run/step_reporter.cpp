// Step reports and early stops (see step_reporter.h).
#include "llmc/run/step_reporter.h"
#include <cmath>
#include <cstdio>
#include <string>

#include "llmc/base/error.h"
#include "llmc/base/stop_signal.h"

namespace llmc {

namespace {
StepReporter::Clock::duration seconds(double n) {
    return std::chrono::duration_cast<StepReporter::Clock::duration>(std::chrono::duration<double>(n));
}
}  // namespace

StepReporter::StepReporter(const TrainConfig& cfg, int start_step, MetricsLog* log, ModelFlops flops,
                           Clock::time_point launched)
    : cfg_(cfg), start_step_(start_step), log_(log), flops_(flops), last_checkpoint_(launched) {
    if (cfg.time_limit_minutes > 0.0f) deadline_ = launched + seconds(60.0 * cfg.time_limit_minutes);
    // Until a save is timed: the weights and two fp32 moments per parameter (AdamW's state; DeMo's is smaller)
    // written at 200 MB/s, a slow shared file system's pace.
    checkpoint_seconds_ = static_cast<double>(ParamLayout::of(cfg.model).num_params) * 12.0 / 200e6;
}

double StepReporter::time_to_next_stop(int step, double step_seconds) const {
    // A stop asked for at this report happens after step + 1 (the ranks learn of it at that step's report) and its
    // evaluations; one asked for at the next report, after step + 2. Each step's evaluations come after its report.
    int evaluations = 0;
    for (int s = step; s <= step + 2 && s < cfg_.steps; s++) {
        const StepDuties due = step_duties(cfg_, s);
        evaluations += due.validate || due.sample;
    }
    return 2.0 * step_seconds + evaluations * evaluation_seconds_ + checkpoint_seconds_;
}

void StepReporter::evaluations_done(Clock::time_point began) {
    evaluation_seconds_ = std::chrono::duration<double>(Clock::now() - began).count();
}

void StepReporter::checkpoint_saved(Clock::time_point began, int64_t step) {
    last_checkpoint_ = Clock::now();
    checkpoint_seconds_ = std::chrono::duration<double>(last_checkpoint_ - began).count();
    last_checkpoint_step_ = step;
    checkpoint_requested_ = false;
}

void StepReporter::report(int step, Clock::time_point started, double local_loss, float lr, const StepResult& result,
                          const CommCounters& comm, Transport& transport, TrainingState& state) {
    flush(transport);  // the last step's averages travelled during this step
    const double step_seconds = std::chrono::duration<double>(Clock::now() - started).count();

    state.step = step + 1;
    state.tokens += cfg_.total_batch_size;
    state.cumulative_bytes_sent += static_cast<int64_t>(comm.bytes_sent);
    StepMetrics m;
    m.step = step + 1;
    m.total_steps = cfg_.steps;
    m.loss = local_loss;
    m.lr = lr;
    m.grad_norm = result.grad_norm;
    m.step_seconds = step_seconds;
    m.comm = comm;
    m.comm_seconds = m.comm.seconds;
    m.compute_seconds = m.step_seconds - m.comm_seconds;
    m.tokens = state.tokens;
    m.tokens_per_second = cfg_.total_batch_size / m.step_seconds;
    m.model_tflops = flops_.per_token * m.tokens_per_second / transport.world_size() / 1e12;
    if (flops_.peak_tflops > 0.0) m.mfu = m.model_tflops / flops_.peak_tflops;
    m.cumulative_bytes_sent = state.cumulative_bytes_sent;
    m.optimizer = result.seconds;
    m.diagnostics = result.diagnostics;
    if (step > start_step_ || cfg_.steps - start_step_ == 1) {
        session_seconds_ += m.step_seconds;
        session_steps_++;
    }
    m.eta_seconds = session_steps_ ? session_seconds_ / session_steps_ * (cfg_.steps - step - 1) : 0.0;
    // the third value: how many ranks were asked to stop (a signal that reached one rank stops every one); the
    // fourth: how many would pass the time limit if they did not ask now (see stop_requested); the fifth: how
    // many found --checkpoint_every_minutes passed since the last checkpoint
    const Clock::time_point now = Clock::now();
    const bool out_of_time = deadline_ && now + seconds(time_to_next_stop(step, step_seconds)) >= *deadline_;
    const bool checkpoint_due = cfg_.checkpoint_every_minutes > 0.0f &&
                                now >= last_checkpoint_ + seconds(60.0 * cfg_.checkpoint_every_minutes);
    const double local[5] = {m.loss, m.grad_norm, StopSignals::received() != 0 ? 1.0 : 0.0, out_of_time ? 1.0 : 0.0,
                             checkpoint_due ? 1.0 : 0.0};
    transport.allreduce_sum_start(local);
    pending_ = m;
    if (step + 1 == cfg_.steps || transport.world_size() == 1) flush(transport);  // one rank: nothing to wait for
}

void StepReporter::flush(Transport& transport) {
    if (!pending_) return;
    StepMetrics m = *pending_;
    pending_.reset();
    double sums[5];
    transport.allreduce_sum_finish(sums);
    m.loss = sums[0] / transport.world_size();
    m.grad_norm = sums[1] / transport.world_size();
    if (sums[2] > 0.0) stop_reason_ = StopReason::signal;
    else if (sums[3] > 0.0 && stop_reason_ == StopReason::none) stop_reason_ = StopReason::time_limit;
    // a request sent before the last checkpoint was saved (its step's report travelled meanwhile) is spent
    if (sums[4] > 0.0 && m.step > last_checkpoint_step_) checkpoint_requested_ = true;
    const bool diverged = !std::isfinite(m.loss) || !std::isfinite(m.grad_norm);
    if (log_) {
        log_->log_step(m);
        if (!m.diagnostics.empty()) log_->log_event(m.diagnostics);
        if (diverged) log_->log_diverged(m.step, m.loss, m.grad_norm);
        if (m.step % cfg_.log_every == 0 || m.step == cfg_.steps || diverged) {
            std::printf("%s\n", format_progress(m).c_str());
            std::fflush(stdout);
        }
    }
    // Every rank holds the same averages, so every rank stops here, before this step's evaluations and
    // checkpoint: no checkpoint holds the diverged weights, and --resume auto goes back to the last good one.
    if (diverged)
        throw Diverged("step " + std::to_string(m.step) + ": the loss is " + format_value(m.loss) +
                       " and the gradient norm " + format_value(m.grad_norm) +
                       ": training diverged (lower --lr, or clip the gradients with --grad_clip); no checkpoint "
                       "was written for it");
}

int finish_stopped_run(const TrainConfig& cfg, const Transport& transport, MetricsLog* log, int64_t step,
                       StopReason reason) {
    if (transport.rank() == 0) {
        const int signal = StopSignals::received();
        const std::string why = reason == StopReason::time_limit
                                    ? "time limit of " + format_float(cfg.time_limit_minutes) + " minutes"
                                : signal == 0                ? "a stop signal on another rank"
                                : transport.world_size() > 1 ? std::string(signal_name(signal)) + " on rank 0"
                                                             : std::string(signal_name(signal));
        std::optional<std::string> checkpoint;
        if (cfg.checkpoint_every >= 0) checkpoint = checkpoint_dir(cfg.out_dir, step);
        if (log) log->log_stopped(static_cast<int>(step), cfg.steps, why, checkpoint);
        const std::string saved = checkpoint ? "; checkpoint " + *checkpoint + ": continue with --resume auto"
                                             : "; no checkpoint (--checkpoint_every -1)";
        std::printf("stopped after step %lld of %d on %s%s%s\n", static_cast<long long>(step), cfg.steps,
                    reason == StopReason::time_limit ? "the " : "", why.c_str(), saved.c_str());
        std::fflush(stdout);
    }
    return kStoppedExitStatus;
}

}  // namespace llmc
