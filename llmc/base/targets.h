// Targets of a batch: at each position the token id the model is trained to predict, or kNoTarget where it
// predicts nothing (OLMo's rows: the last position, whose logit OLMo drops). The models weigh positions as
// torch.nn.functional.cross_entropy(logits, targets, ignore_index=-1, reduction='mean') does: the loss is the
// mean over the positions with a target, a position without one has loss 0 and no gradient.
#pragma once
#include <cstddef>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

inline constexpr int kNoTarget = -1;

// Whether a target is one the models take: kNoTarget or a token id in [0, vocab_size).
constexpr bool target_allowed(int target, int vocab_size) {
    return target == kNoTarget || (target >= 0 && target < vocab_size);
}

// The number of positions of targets[0, n) that have a target. Any other negative id or one of vocab_size or
// more is an llmc::Error naming `who`, the id and its position.
inline size_t count_targets(const int* targets, size_t n, int vocab_size, const std::string& who) {
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        LLMC_CHECK(target_allowed(targets[i], vocab_size),
                   who + ": target token id " + std::to_string(targets[i]) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(vocab_size) + ") and is not " +
                       std::to_string(kNoTarget) + " (no target)");
        count += targets[i] != kNoTarget;
    }
    return count;
}

// The gradient weight of each position with a target for loss_scale * (mean loss over `count` targets); 0 when
// there are none, so that a batch without targets adds nothing instead of NaN.
inline float loss_scale_per_target(float loss_scale, size_t count) {
    return count > 0 ? loss_scale / static_cast<float>(count) : 0.0f;
}

// The mean loss over `count` targets whose losses sum to `sum`; 0 for none.
inline double mean_over_targets(double sum, size_t count) {
    return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

// The mean loss over the targets of several batches of `positions` each, from each batch's mean: a batch weighs
// its share of positions with a target, so batches whose every position has one give the plain mean of their
// means bit for bit (their weights are exactly 1), and OLMo rows (the last of each without) the mean over all
// B*(T-1) targets of each batch.
struct TargetMean {
    double weighted = 0.0, weights = 0.0;  // sum of mean * weight, sum of weights
    void add(double batch_mean, size_t count, size_t positions) {
        const double weight = static_cast<double>(count) / static_cast<double>(positions);
        weighted += batch_mean * weight;
        weights += weight;
    }
    double value() const { return weights > 0.0 ? weighted / weights : 0.0; }
};

}  // namespace llmc
