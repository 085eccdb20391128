// Pieces of the training program that the CPU trainer (train_gpt_cpu.cpp) and the CUDA trainer (train_gpt.cu)
// share verbatim: batch geometry, the cross-rank config check, the --dry_run report, the data a run reads and
// the banner's batch line, the run record written
// next to the metrics, where a run starts (checkpoint, llm.c model file or fresh init), checkpoint writing,
// the validation loss, the sampling rule, per-step metrics and the fatal-error exit. Keeping them here means
// the two trainers differ only where the model and the optimizer run.
#pragma once
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <chrono>

#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/dataloader.h"
#include "llmc/fileio.h"
#include "llmc/metrics.h"
#include "llmc/multiple_choice.h"
#include "llmc/optimizer.h"
#include "llmc/rng.h"
#include "llmc/sampling.h"
#include "llmc/tokenizer.h"
#include "llmc/transport.h"

namespace llmc {

// Resolves total_batch_size (0 -> B*T*world) and returns the gradient-accumulation steps; throws naming
// total_batch_size as cfg.sources does when it is not a multiple of batch_size*seq_len*world.
int resolve_batch_geometry(TrainConfig& cfg, int world);

// Every rank must run the same configuration: compares each rank's resolved config with rank 0's and throws
// naming the first differing key. Resets the transport's counters afterwards.
void check_same_config_everywhere(Transport& transport, const std::string& config_json);

// --dry_run: the config's warnings, the resolved config and the traffic report (for the paper's 64 ranks when run on
// one).
void print_dry_run_report(const TrainConfig& cfg, int world);

// Settings a run accepts that probably do not do what was meant, one line each (without "warning: "):
// lr * weight_decay >= 1 (decoupled weight decay then zeroes or flips the decayed weights each step), warmup_steps >
// steps (the learning rate never reaches its peak) and, with DeMo, a demo_topk above the elements of some tensor's
// chunks (the plan clamps k to them: those chunks send every coefficient), and a time limit or time-based
// checkpoints with --checkpoint_every -1 (no checkpoint is ever written).
std::vector<std::string> config_warnings(const TrainConfig& cfg);
// config_warnings on stderr, "warning: ..." each: the trainers' rank 0 prints them before training, after the
// checks that could still stop the run, and a dry run with its report.
void print_config_warnings(const TrainConfig& cfg);

// For the trainers' banner: "applied a step late" (--demo_delay 1), with ", own share at once" when eager;
// empty for every other setting.
std::string demo_delay_phrase(const TrainConfig& cfg);

// LLMC_DDP_OVERLAP (both trainers): 1 (the default) overlaps AdamW-DDP's gradient all-reduce with the backward,
// layer by layer; 0 all-reduces after the backward. Anything else is an error.
bool ddp_overlap_from_env();

// The overlapped all-reduce's early embedding rows: the runs of wte rows (at most `max_runs`, the longest) that
// no rank's `inputs` (its step's last micro-batch) touch. Their gradients are final once the classifier's weight
// gradient is done (earlier micro-steps finished their encoder backward before it), so their all-reduce can
// travel during the rest of the backward instead of waiting for the encoder's. One host collective (the ranks' row
// bitmaps OR-ed), so every rank reports the same ranges.
std::vector<ParamRange> untouched_wte_ranges(Transport& transport, const ParamLayout& layout,
                                             std::span<const int> inputs, size_t max_runs);
// The ranks' agreement on the batches a step is about to queue, in one split OR whose latency passes while
// something else runs: whether every rank read them (a rank must not queue collectives its peers will not join)
// and, with `rows` (AdamW-DDP's overlapped all-reduce), untouched_wte_ranges of the last batch. train_gpt starts
// it for the step it queues ahead before the step before it runs its optimizer and finishes it after; the CPU
// trainer starts it before the last micro-step's forward and finishes it before its backward. Every rank starts
// and finishes it with the same `rows`; a rank that failed to load passes no inputs.
struct BatchAgreement {
    bool all_loaded = false;
    std::vector<ParamRange> wte_early;  // with `rows`, when all_loaded
};
void batch_agreement_start(Transport& transport, const ParamLayout& layout, bool loaded, bool rows,
                           std::span<const int> last_inputs);
BatchAgreement batch_agreement_finish(Transport& transport, const ParamLayout& layout, bool rows, size_t max_runs);

// What a run reads besides its weights: this rank's training stream, the validation stream (null without
// --val_data or with --val_batches 0), the tokenizer's decoder on the rank that prints samples (rank 0 with
// --sample_every > 0; null elsewhere) and the --choices examples (every rank). Opening them validates every shard
// header, the tokenizer file and the examples (each must fit rows of seq_len + 1 tokens), and reads the validation
// batches once (every validation reads the same ones), so a bad token id there stops the run before it trains.
// A --val_batches above the batches each rank's share of the validation shards holds is lowered to them, with a
// warning from rank 0: more would read the same windows again.
struct RunData {
    DataLoader train;
    std::unique_ptr<DataLoader> val;
    int val_batches = 0;  // per rank, each validation
    std::unique_ptr<TokenizerDecoder> tokenizer;
    std::vector<ChoiceExample> choices;
};
RunData open_run_data(const TrainConfig& cfg, int rank, int world);

// The banner's batch line: "batch B x T tokens x W ranks x A accumulation = N tokens/step | ..." (train tokens
// and window groups per epoch); a trainer appends what it knows besides.
std::string batch_banner(const TrainConfig& cfg, int world, int grad_accum, const DataLoader& train);

// The resolved config plus "_run": code version, trainer, world size, accumulation, tokens per step, argv.
// Trainers add their own fields to record["_run"] before writing it to <out_dir>/config.json.
nlohmann::ordered_json run_record(const TrainConfig& cfg, int world, int grad_accum, const char* trainer, int argc,
                                  char** argv);
void write_run_record(const std::string& out_dir, const nlohmann::ordered_json& record);

// Where a run starts, from --resume / --init_from (the CPU and the CUDA trainer alike):
//  - a checkpoint written by as many ranks: weights, step, tokens, bytes sent, data position and sampling
//    RNG are restored and `load_optimizer_state` gets this rank's optimizer blob;
//  - a checkpoint of another world size: refused, unless --reset_momentum, which keeps the weights, step,
//    tokens, rank 0's sampling RNG and byte count, continues the data stream after the window groups already
//    consumed, and leaves the optimizer state fresh (it is per rank and cannot be re-dealt);
//  - --init_from: weights from an llm.c model file; otherwise nothing is loaded (a fresh run: the caller
//    draws the seeded init).
// Each rank checks the checkpoint files it reads against the marker's sizes and checksums first. The ranks
// then meet, so rank 0 reports the resume, and --overwrite deletes later checkpoints, only when every rank
// has loaded its files (a rank that failed has ended the job).
// `weights` receives the fp32 parameters when something was loaded. Returns the checkpoint resumed from.
struct RunStart {
    std::optional<CheckpointInfo> checkpoint;
    bool weights_loaded = false;
};
RunStart resolve_run_start(const TrainConfig& cfg, const std::string& config_json, int64_t tokens_per_micro,
                           Transport& transport, std::span<float> weights, DataLoader& train_loader, Rng& sample_rng,
                           TrainingState& state, const std::function<void(ByteReader&)>& load_optimizer_state);

// Writes checkpoint <out_dir>/checkpoints/step_N: rank 0 writes model.bin from `weights` (fp32; other ranks
// may pass an empty span), every rank its state file with the optimizer blob from `save_optimizer_state`,
// and rank 0 the COMPLETE marker once every rank's files are in place; then older checkpoints are pruned.
void save_checkpoint(const TrainConfig& cfg, Transport& transport, std::span<const float> weights,
                     const std::function<void(ByteWriter&)>& save_optimizer_state, TrainingState state);

// Mean validation loss over `batches` batches of every rank (the loader restarts from its beginning).
// Model: anything with double forward(const int* inputs, const int* targets, int B, int T).
template <class Model>
double evaluate_loss(Model& model, DataLoader& loader, int batches, const TrainConfig& cfg, Transport& transport) {
    const size_t n = static_cast<size_t>(cfg.batch_size) * cfg.seq_len;
    std::vector<int> x(n), y(n);
    loader.reset();
    double sum[1] = {0.0};
    for (int i = 0; i < batches; i++) {
        loader.next_batch(x, y);
        sum[0] += model.forward(x.data(), y.data(), cfg.batch_size, cfg.seq_len);
    }
    transport.allreduce_sum(sum);
    return sum[0] / (static_cast<double>(batches) * transport.world_size());
}

// Multiple-choice accuracy (--choices) over every rank: rank r scores examples r, r + world, ..., each completion a
// row of the training shape (B rows of T = seq_len positions a forward, the context cropped to seq_len + 1
// tokens), as eval_gpt --choices does with rows of max_seq_len + 1.
// Model: also std::span<const float> losses(), the last forward's per-position cross-entropies on the host.
struct ChoiceAccuracy {
    double acc = 0.0, acc_norm = 0.0;
    long long examples = 0, cropped = 0;
};
template <class Model>
ChoiceAccuracy evaluate_choices(Model& model, std::span<const ChoiceExample> examples, const TrainConfig& cfg,
                                Transport& transport) {
    const size_t rank = transport.rank(), world = transport.world_size();
    const ChoiceBatching batching{static_cast<size_t>(cfg.seq_len) + 1, cfg.batch_size, cfg.seq_len, true};
    const std::vector<ChoiceScore> scores =
        score_choices(examples, rank, world, batching, [&](const int* inputs, const int* targets, int B, int T) {
            model.forward(inputs, targets, B, T);
            return model.losses();
        });
    double counts[3] = {0.0, 0.0, 0.0};  // right by summed loss, by mean loss, cropped
    for (size_t k = 0; k < scores.size(); k++) {
        const int label = examples[rank + k * world].label;
        counts[0] += scores[k].prediction == label;
        counts[1] += scores[k].prediction_norm == label;
        counts[2] += scores[k].cropped > 0;
    }
    transport.allreduce_sum(counts);
    const double n = static_cast<double>(examples.size());
    return {counts[0] / n, counts[1] / n, static_cast<long long>(examples.size()), static_cast<long long>(counts[2])};
}

// What the end of optimizer step `step` (0-based) owes, from the config's cadences: the last step always
// validates, samples (when sampling is on) and checkpoints (unless --checkpoint_every -1: benchmarks).
struct StepDuties {
    bool validate = false, sample = false, checkpoint = false;
};
inline StepDuties step_duties(const TrainConfig& cfg, int step) {
    const bool last = step + 1 == cfg.steps;
    auto every = [&](int n) { return n > 0 && (step + 1) % n == 0; };
    return {last || every(cfg.val_every), cfg.sample_every > 0 && (last || every(cfg.sample_every)),
            cfg.checkpoint_every >= 0 && (last || every(cfg.checkpoint_every))};
}

// The validation pass (every rank; no val loader: no validation data), the --choices accuracy with it (every rank,
// when there are examples) and the text sample (sample_text(*tokenizer); no tokenizer where the rank does not
// sample) that a step owes, logged to `log` (rank 0; null elsewhere) and printed. Both trainers end their steps
// with this; the checkpoint, which differs between them, follows it.
template <class Model, class SampleText>
void run_step_evaluations(const StepDuties& due, int step, Model& model, const RunData& data,
                          const TrainConfig& cfg, Transport& transport, MetricsLog* log, int64_t tokens,
                          SampleText&& sample_text) {
    if (due.validate && data.val) {
        const double val_loss = evaluate_loss(model, *data.val, data.val_batches, cfg, transport);
        if (log) {
            log->log_val(step + 1, val_loss, tokens);
            std::printf("step %d: val loss %.4f\n", step + 1, val_loss);
        }
    }
    if (due.validate && !data.choices.empty()) {
        const ChoiceAccuracy a = evaluate_choices(model, data.choices, cfg, transport);
        if (log) {
            log->log_choices(step + 1, a.acc, a.acc_norm, a.examples, a.cropped, tokens);
            std::printf("step %d: %s: acc_norm %.4f, acc %.4f over %lld examples (%lld with the context cropped to "
                        "seq_len)\n", step + 1, cfg.choices.c_str(), a.acc_norm, a.acc, a.examples, a.cropped);
        }
    }
    const TokenizerDecoder* tokenizer = data.tokenizer.get();
    if (due.sample && log && tokenizer) {
        const std::string text = sample_text(*tokenizer);
        log->log_sample(step + 1, text);
        std::printf("sample at step %d:\n%s\n---\n", step + 1, text.c_str());
    }
}

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

// What trainer_main hands a trainer besides its config and transport.
struct Launch {
    int argc;
    char** argv;
    StepReporter::Clock::time_point started;  // when the process started (--time_limit_minutes counts from here)
};

// A trainer's main(): the world transport (MPI under mpirun), the command line (--help prints and returns 0),
// train(), and the one-line exit of report_fatal_error for any error on the way.
using TrainFunction = int (*)(TrainConfig cfg, Transport& world, const Launch& launch);
int trainer_main(int argc, char** argv, const char* program, TrainFunction train);

// Prints "error[ (rank r)]: <message>" and ends the process: with several ranks without MPI_Finalize (which
// could wait for ranks blocked in a collective; mpirun then ends the job), else by returning 1 to main.
int report_fatal_error(const std::exception& e, const Transport* transport);

}  // namespace llmc
