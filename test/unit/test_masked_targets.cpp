// Target -1 ("no target", llmc/base/targets.h) on the CPU, without PyTorch (test_gpt2_vs_torch and
// test_olmo_vs_torch compare masked batches with torch's ignore_index): the classifier layers of cpu_layers.h
// against a plain double-precision reference, the helpers that count and weigh targets, and ModelCpu in every
// family. A causal model's rows are independent and a position's input reaches no earlier position, so a batch
// whose row 1 and every row's last position have no target must give the loss and gradients of the other rows cut
// to T-1 positions; one without any target gives loss 0 and adds nothing to the gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/rng.h"
#include "llmc/base/targets.h"
#include "llmc/model/cpu_layers.h"
#include "llmc/model/model_cpu.h"
#include "test/support/testing.h"
#include "test/support/tiny_models.h"

namespace {

using llmc::kNoTarget;

std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
    llmc::Rng rng(seed);
    std::vector<int> tokens(n);
    for (int& t : tokens) t = static_cast<int>(rng.below(vocab));
    return tokens;
}

// The B rows of `stride` tokens other than `skip_row`, cut to their first T positions, and their targets.
struct Batch {
    std::vector<int> inputs, targets;
};
Batch rows_of(const std::vector<int>& tokens, int B, int stride, int T, int skip_row) {
    Batch b;
    for (int r = 0; r < B; r++) {
        if (r == skip_row) continue;
        const int* row = tokens.data() + size_t(r) * stride;
        b.inputs.insert(b.inputs.end(), row, row + T);
        b.targets.insert(b.targets.end(), row + 1, row + T + 1);
    }
    return b;
}

using testing::every_family;

// max |a - b| / max |b| over all entries.
double relative_max_diff(std::span<const float> a, std::span<const float> b) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        diff = std::max(diff, double(std::fabs(a[i] - b[i])));
        scale = std::max(scale, double(std::fabs(b[i])));
    }
    return scale > 0.0 ? diff / scale : diff;
}

}  // namespace

// crossentropy_forward, mean_loss and crossentropy_softmax_backward on rows with and without a target, against
// the softmax and cross-entropy computed in double from their definitions.
TEST(classifier_layers_skip_rows_without_a_target) {
    const size_t N = 7, V = 37, Vp = 48;
    llmc::Rng rng(3);
    std::vector<float> logits(N * Vp);
    for (float& x : logits) x = 3.0f * float(rng.normal());
    const std::vector<int> targets = {5, kNoTarget, 0, int(V) - 1, kNoTarget, 17, kNoTarget};
    const size_t count = 4;
    const float dloss = 0.5f / float(count);
    std::vector<float> losses(N, -1.0f), lse(N), dlogits(N * Vp, -1.0f);
    llmc::cpu::crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
    llmc::cpu::crossentropy_softmax_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), dloss, N, V,
                                             Vp);
    double ref_sum = 0.0;
    for (size_t r = 0; r < N; r++) {
        const float* x = &logits[r * Vp];
        double mx = -INFINITY, sum = 0.0;
        for (size_t i = 0; i < V; i++) mx = std::max(mx, double(x[i]));
        for (size_t i = 0; i < V; i++) sum += std::exp(x[i] - mx);
        const int t = targets[r];
        if (t == kNoTarget) {
            EXPECT_EQ(losses[r], 0.0f);
        } else {
            const double ref = std::log(sum) + mx - x[t];
            EXPECT_NEAR(losses[r], ref, 1e-5 * std::max(1.0, ref));
            ref_sum += ref;
        }
        for (size_t i = 0; i < Vp; i++) {
            const double ref = t == kNoTarget || i >= V
                                   ? 0.0
                                   : (std::exp(x[i] - mx) / sum - (int(i) == t ? 1.0 : 0.0)) * double(dloss);
            if (ref == 0.0) EXPECT_EQ(dlogits[r * Vp + i], 0.0f);  // padding and rows without a target: exact 0
            else EXPECT_NEAR(dlogits[r * Vp + i], ref, 1e-6 * double(dloss));
        }
    }
    EXPECT_NEAR(llmc::cpu::mean_loss(losses.data(), N, count), ref_sum / count, 1e-6);
    EXPECT_EQ(llmc::cpu::mean_loss(losses.data(), N, 0), 0.0);
}

// count_targets takes -1 as no target and refuses anything else outside the vocabulary, naming the position;
// the weights are loss_scale over the count, 0 when there is none; TargetMean gives the plain mean of the batch
// means when every position has a target and the mean over all targets when batches have fewer.
TEST(targets_are_counted_and_weighed) {
    const std::vector<int> t = {3, kNoTarget, 0, 9, kNoTarget};
    EXPECT_EQ(llmc::count_targets(t.data(), t.size(), 10, "who"), size_t{3});
    const std::vector<int> below = {3, -2, 0}, above = {3, 1, 10};
    EXPECT_ERROR(llmc::count_targets(below.data(), below.size(), 10, "who"), "who: target token id -2 at position 1");
    EXPECT_ERROR(llmc::count_targets(above.data(), above.size(), 10, "who"),
                 "target token id 10 at position 2 is outside");
    EXPECT_EQ(llmc::loss_scale_per_target(0.25f, 0), 0.0f);
    EXPECT_EQ(llmc::loss_scale_per_target(0.25f, 6), 0.25f / 6.0f);

    const double means[3] = {2.5, 3.25, 1.0 / 3.0};
    llmc::TargetMean full;
    for (double m : means) full.add(m, 64, 64);
    EXPECT_EQ(full.value(), (means[0] + means[1] + means[2]) / 3.0);
    llmc::TargetMean partial;  // batches of 64 positions with 63, 60 and 0 targets
    partial.add(means[0], 63, 64);
    partial.add(means[1], 60, 64);
    partial.add(0.0, 0, 64);
    EXPECT_NEAR(partial.value(), (63 * means[0] + 60 * means[1]) / 123.0, 1e-14);
    EXPECT_EQ(llmc::TargetMean{}.value(), 0.0);
}

// The masked batch against the batch of the rows that have targets, each cut to T-1 positions: the same loss and
// gradients up to fp32 rounding (their matmuls have other shapes), per-position losses 0 without a target and
// bit for bit a full forward's elsewhere.
TEST(masked_positions_add_no_loss_and_no_gradient) {
    for (const llmc::ModelConfig& config : every_family()) {
        const int B = 4, T = 12;
        const std::vector<int> tokens = random_tokens(size_t(B) * (T + 1), config.vocab_size, 21);
        const Batch all = rows_of(tokens, B, T + 1, T, -1);
        Batch masked = all;
        for (int r = 0; r < B; r++) masked.targets[size_t(r) * T + T - 1] = kNoTarget;  // OLMo's rows
        std::fill_n(masked.targets.begin() + T, T, kNoTarget);                            // row 1: none at all
        const Batch kept = rows_of(tokens, B, T + 1, T - 1, 1);  // rows 0, 2, 3 of T - 1 positions
        llmc::ModelCpu model(config), reference(config);
        model.init_random(7);
        std::copy(model.params().begin(), model.params().end(), reference.params().begin());

        model.forward(all.inputs.data(), all.targets.data(), B, T);
        const std::vector<float> full_losses(model.losses().begin(), model.losses().end());
        model.zero_grad();
        const float loss = model.forward(masked.inputs.data(), masked.targets.data(), B, T);
        model.backward();
        EXPECT_EQ(model.target_count(), size_t((B - 1) * (T - 1)));
        double sum = 0.0;
        size_t same = 0;
        for (size_t i = 0; i < masked.targets.size(); i++) {
            const bool has = masked.targets[i] != kNoTarget;
            same += has ? model.losses()[i] == full_losses[i] : model.losses()[i] == 0.0f;
            if (has) sum += model.losses()[i];
        }
        EXPECT_EQ(same, masked.targets.size());
        EXPECT_EQ(loss, static_cast<float>(sum / double((B - 1) * (T - 1))));

        reference.zero_grad();
        const float ref_loss = reference.forward(kept.inputs.data(), kept.targets.data(), B - 1, T - 1);
        reference.backward();
        const double grad_diff = relative_max_diff(model.grads(), reference.grads());
        std::printf("  %s: loss %.7f vs rows with targets %.7f, gradients max |diff| / max |grad| %.2g\n",
                    config.describe().c_str(), loss, ref_loss, grad_diff);
        EXPECT_NEAR(loss, ref_loss, 1e-6 * ref_loss);
        EXPECT(grad_diff <= 1e-5);

        // -2 and vocab_size stay errors, naming the position
        masked.targets[5] = -2;
        EXPECT_ERROR(model.forward(masked.inputs.data(), masked.targets.data(), B, T),
                     "target token id -2 at position 5 is outside the vocabulary [0, 100)");
        masked.targets[5] = config.vocab_size;
        EXPECT_ERROR(model.forward(masked.inputs.data(), masked.targets.data(), B, T),
                     "target token id 100 at position 5");
    }
}

// A forward without a single target: loss 0, losses() all 0, and a backward that leaves the gradients as they were
// (bit for bit: it adds exact zeros), with no NaN.
TEST(a_batch_without_targets_gives_zero_loss_and_gradient) {
    for (const llmc::ModelConfig& config : every_family()) {
        const int B = 2, T = 8;
        const std::vector<int> tokens = random_tokens(size_t(B) * (T + 1), config.vocab_size, 31);
        const Batch all = rows_of(tokens, B, T + 1, T, -1);
        const std::vector<int> none(all.targets.size(), kNoTarget);
        llmc::ModelCpu model(config);
        model.init_random(8);

        model.zero_grad();
        EXPECT_EQ(model.forward(all.inputs.data(), none.data(), B, T), 0.0f);
        EXPECT_EQ(model.target_count(), size_t{0});
        EXPECT(std::all_of(model.losses().begin(), model.losses().end(), [](float l) { return l == 0.0f; }));
        model.backward();
        EXPECT(std::all_of(model.grads().begin(), model.grads().end(), [](float g) { return g == 0.0f; }));

        model.forward(all.inputs.data(), all.targets.data(), B, T);
        model.backward();
        const std::vector<float> grads(model.grads().begin(), model.grads().end());
        model.forward(all.inputs.data(), none.data(), B, T);
        model.backward();
        EXPECT(std::memcmp(grads.data(), model.grads().data(), grads.size() * sizeof(float)) == 0);
    }
}

TEST_MAIN()
