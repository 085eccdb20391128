// Drawing the next token from a model's logits: temperature, top-k and nucleus (top-p) truncation, greedy at
// temperature 0. Shared by the trainers' samples (temperature 1, no truncation) and sample_gpt. The draw uses
// the caller's seeded Rng, so a seed gives the same text on every machine.
#pragma once
#include <span>

#include "llmc/base/rng.h"

namespace llmc {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy (the first largest logit), no random draw
    int top_k = 0;             // keep the k most likely tokens (0: all)
    float top_p = 1.0f;        // then keep the smallest most-likely set whose probability reaches p (1: all)
};

// Throws llmc::Error naming the flag for a temperature < 0, top_k < 0 or top_p outside (0, 1].
void validate_sampling(const SamplingParams& params);

// The next token from the first vocab_size logits: softmax(logits / temperature) restricted to the top-k and
// then the top-p tokens and renormalized, sampled by inverse CDF in token order with one rng.uniform().
int sample_token(std::span<const float> logits, int vocab_size, Rng& rng, const SamplingParams& params = {});

}  // namespace llmc
