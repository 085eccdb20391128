// StepReporter's time-limit margin (--time_limit_minutes): at a step's report a rank asks to stop when waiting one
// more step to ask would end the run's checkpoint past the limit. The margin is worked out here by hand from its
// parts (two steps, the evaluations owed by this step and the next two, the last checkpoint's save time or the
// estimate before the first) and compared; then the decision itself, on a one-rank transport, with the launch,
// the step's start and the evaluations' start placed in the past so that no test waits.
#include <chrono>
#include <cmath>

#include "llmc/run/config.h"
#include "llmc/model/param_layout.h"
#include "llmc/run/dry_run.h"
#include "llmc/run/run_setup.h"
#include "llmc/run/step_reporter.h"
#include "llmc/comm/transport.h"
#include "test/support/testing.h"

namespace {

using Clock = llmc::StepReporter::Clock;
using llmc::StepReporter;
using llmc::TrainConfig;

Clock::time_point ago(double seconds) {
    return Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

TrainConfig tiny_config() {
    TrainConfig cfg;
    cfg.model.num_layers = 2;
    cfg.model.num_heads = 4;
    cfg.model.channels = 64;
    cfg.model.max_seq_len = 64;
    cfg.steps = 100;
    cfg.val_every = 10;
    cfg.sample_every = 0;
    cfg.total_batch_size = 256;
    cfg.time_limit_minutes = 1.0f;
    return cfg;
}

// 12 bytes per parameter at 200 MB/s, the estimate before a save is timed
double estimate(const TrainConfig& cfg) {
    return static_cast<double>(llmc::ParamLayout::gpt2(cfg.model).num_params) * 12.0 / 200e6;
}

}  // namespace

TEST(margin_counts_steps_evaluations_and_the_checkpoint) {
    TrainConfig cfg = tiny_config();
    StepReporter reporter(cfg, 0, nullptr, {}, Clock::now());
    const double first = estimate(cfg);
    EXPECT(first > 0.1 && first < 0.3);  // 3.3M parameters of the tiny model
    EXPECT_NEAR(reporter.time_to_next_stop(0, 1.0), 2.0 + first, 1e-9);
    EXPECT_NEAR(reporter.time_to_next_stop(7, 1.0), 2.0 + first, 1e-9);  // step 9 validates, untimed yet: 0 s
    reporter.evaluations_done(ago(4.0));
    // steps 6-8 owe nothing; 7-9 and 9-11 owe step 9's validation; 97-99 the last step's
    EXPECT_NEAR(reporter.time_to_next_stop(6, 1.0), 2.0 + first, 1e-9);
    EXPECT_NEAR(reporter.time_to_next_stop(7, 1.0), 2.0 + 4.0 + first, 0.05);
    EXPECT_NEAR(reporter.time_to_next_stop(9, 0.5), 1.0 + 4.0 + first, 0.05);
    EXPECT_NEAR(reporter.time_to_next_stop(97, 1.0), 2.0 + 4.0 + first, 0.05);
    reporter.checkpoint_saved(ago(1.5), 5);
    EXPECT_NEAR(reporter.time_to_next_stop(6, 1.0), 2.0 + 1.5, 0.05);
    // samples count as evaluations, once per step that also validates (samples at steps 1, 3, 5, ...)
    cfg.sample_every = 2;
    StepReporter sampling(cfg, 0, nullptr, {}, Clock::now());
    sampling.evaluations_done(ago(2.0));
    EXPECT_NEAR(sampling.time_to_next_stop(1, 1.0), 2.0 + 2.0 * 2 + first, 0.05);  // steps 1 and 3
    EXPECT_NEAR(sampling.time_to_next_stop(2, 1.0), 2.0 + 2.0 + first, 0.05);      // step 3
    EXPECT_NEAR(sampling.time_to_next_stop(8, 1.0), 2.0 + 2.0 + first, 0.05);      // step 9: sample and validation
    // GPT-2 124M's first checkpoint: 124,475,904 parameters, 7.47 s
    TrainConfig d12;
    d12.time_limit_minutes = 1.0f;
    StepReporter large(d12, 0, nullptr, {}, Clock::now());
    EXPECT_NEAR(large.time_to_next_stop(0, 0.0), 124475904.0 * 12 / 200e6, 1e-9);
}

TEST(a_rank_asks_to_stop_when_the_next_chance_would_be_too_late) {
    const TrainConfig cfg = tiny_config();
    llmc::LocalTransport transport;
    const auto report = [&](StepReporter& reporter, int step, double step_seconds) {
        llmc::TrainingState state;
        reporter.report(step, ago(step_seconds), 10.0, 1e-3f, llmc::StepResult{}, llmc::CommCounters{}, transport,
                        state);
    };
    {
        // 5 s left: one-second steps and a 0.2 s checkpoint leave room at step 0
        StepReporter reporter(cfg, 0, nullptr, {}, ago(55.0));
        report(reporter, 0, 1.0);
        EXPECT(!reporter.stop_requested());
        // at step 7 the validation of step 9 (3 s, as the last one took) would not fit
        reporter.evaluations_done(ago(3.0));
        report(reporter, 7, 1.0);
        EXPECT(reporter.stop_requested());
        EXPECT(reporter.stop_reason() == llmc::StopReason::time_limit);
    }
    {
        // the same at step 6, whose next three steps owe nothing
        StepReporter reporter(cfg, 0, nullptr, {}, ago(55.0));
        reporter.evaluations_done(ago(3.0));
        report(reporter, 6, 1.0);
        EXPECT(!reporter.stop_requested());
    }
    {
        // 9 s left and a GPT-2 124M: the first checkpoint's estimate (7.47 s) and two 0.8 s steps do not fit
        TrainConfig d12;
        d12.steps = 100;
        d12.total_batch_size = 1024;
        d12.time_limit_minutes = 1.0f;
        StepReporter reporter(d12, 0, nullptr, {}, ago(51.0));
        report(reporter, 0, 0.8);
        EXPECT(reporter.stop_requested());
        // once a save was timed at 1 s, they do
        StepReporter timed(d12, 0, nullptr, {}, ago(51.0));
        timed.checkpoint_saved(ago(1.0), 0);
        report(timed, 1, 0.8);
        EXPECT(!timed.stop_requested());
    }
    {
        // no limit: never
        TrainConfig unlimited = tiny_config();
        unlimited.time_limit_minutes = 0.0f;
        StepReporter reporter(unlimited, 0, nullptr, {}, ago(1e6));
        reporter.evaluations_done(ago(1e5));
        report(reporter, 8, 1e4);
        EXPECT(!reporter.stop_requested());
    }
}

TEST_MAIN()
