// The evaluations a step owes, the same in both trainers: the validation loss, the multiple-choice accuracy and the
// text sample, on whatever model the trainer runs (a template over its forward).
#pragma once
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/targets.h"
#include "llmc/comm/transport.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/multiple_choice.h"
#include "llmc/data/tokenizer.h"
#include "llmc/run/config.h"
#include "llmc/run/metrics.h"
#include "llmc/run/run_setup.h"

namespace llmc {

// Mean validation loss over the positions with a target of `batches` batches of every rank (the loader restarts
// from its beginning), as TargetMean (llmc/base/targets.h) weighs the batch means: OLMo rows give torch's mean over
// their B*(T-1) targets, llm.c windows the plain mean of the batch means.
// Model: anything with double forward(const int* inputs, const int* targets, int B, int T) and
// size_t target_count(), the positions with a target in the last forward.
template <class Model>
double evaluate_loss(Model& model, DataLoader& loader, int batches, const TrainConfig& cfg, Transport& transport) {
    const size_t n = static_cast<size_t>(cfg.batch_size) * cfg.seq_len;
    std::vector<int> x(n), y(n);
    loader.reset();
    TargetMean mean;
    for (int i = 0; i < batches; i++) {
        loader.next_batch(x, y);
        const double batch_mean = model.forward(x.data(), y.data(), cfg.batch_size, cfg.seq_len);
        mean.add(batch_mean, model.target_count(), n);
    }
    double sums[2] = {mean.weighted, mean.weights};
    transport.allreduce_sum(sums);
    return TargetMean{sums[0], sums[1]}.value();
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
    const ChoiceBatching batching{static_cast<size_t>(cfg.seq_len) + 1, cfg.batch_size, cfg.seq_len, true,
                                  cfg.pad_token_id};
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

}  // namespace llmc
