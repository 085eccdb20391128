// Token sampling (see sampling.h). The weights are exp((logit - max) / temperature) in float, summed in double:
// at temperature 1 with no truncation this is the arithmetic the trainers' samples always used, so their text
// for a seed did not change when top-k and top-p came.
#include "llmc/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "llmc/base/limits.h"
#include "llmc/base/schema.h"
#include "llmc/base/error.h"

namespace llmc {

void validate_sampling(const SamplingParams& params) {
    LLMC_CHECK(params.temperature >= 0.0f && std::isfinite(params.temperature),
               "--temperature must be >= 0 (got " + format_float(params.temperature) + "; 0 is greedy)");
    LLMC_CHECK(params.top_k >= 0, "--top_k must be >= 0 (got " + std::to_string(params.top_k) + "; 0 keeps all)");
    LLMC_CHECK(params.top_p > 0.0f && params.top_p <= 1.0f,
               "--top_p must be in (0, 1] (got " + format_float(params.top_p) + "; 1 keeps all)");
}

int sample_token(std::span<const float> logits, int vocab_size, Rng& rng, const SamplingParams& params) {
    LLMC_CHECK(vocab_size > 0 && logits.size() >= static_cast<size_t>(vocab_size),
               "sample_token: fewer logits than vocab_size");
    const auto first = logits.begin(), last = logits.begin() + vocab_size;
    // NaN compares false with everything: a diverged model would otherwise "sample" token 0 or the last one
    LLMC_CHECK(std::all_of(first, last, [](float x) { return std::isfinite(x); }),
               "the model's logits are NaN or inf (its weights or its forward pass diverged): nothing to sample");
    const auto most_likely = std::max_element(first, last);
    if (params.temperature == 0.0f) return static_cast<int>(most_likely - first);
    const float max_logit = *most_likely;

    std::vector<float> weight(static_cast<size_t>(vocab_size));
    for (int v = 0; v < vocab_size; v++) weight[v] = std::exp((logits[v] - max_logit) / params.temperature);
    if (params.top_k > 0 && params.top_k < vocab_size) {
        std::vector<float> sorted = weight;
        std::nth_element(sorted.begin(), sorted.begin() + (params.top_k - 1), sorted.end(), std::greater<>());
        const float kth = sorted[params.top_k - 1];
        // ties with the k-th weight stay in: which of equal tokens to drop would be arbitrary
        for (float& w : weight)
            if (w < kth) w = 0.0f;
    }
    if (params.top_p < 1.0f) {
        std::vector<int> order(static_cast<size_t>(vocab_size));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
        double total = 0.0;
        for (const float w : weight) total += w;
        // keep tokens in order of probability up to and including the one that brings the sum to p
        double kept = 0.0;
        size_t n_kept = 0;
        while (n_kept < order.size() && kept < params.top_p * total) kept += weight[order[n_kept++]];
        for (size_t i = n_kept; i < order.size(); i++) weight[order[i]] = 0.0f;
    }
    double total = 0.0;
    for (int v = 0; v < vocab_size; v++) total += weight[v];
    const double coin = rng.uniform() * total;
    double cdf = 0.0;
    int last_kept = 0;
    for (int v = 0; v < vocab_size; v++) {
        if (weight[v] == 0.0f) continue;
        cdf += weight[v];
        last_kept = v;
        if (coin < cdf) return v;
    }
    return last_kept;  // the coin fell in the rounding gap at the top of the CDF
}

}  // namespace llmc
