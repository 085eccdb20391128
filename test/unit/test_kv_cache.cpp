// ModelCpu's key/value cache (start_sequence / append / truncate_sequence) in every family, checked against the
// model's own full forward() on the same tokens, which test_gpt2_vs_torch and test_olmo_vs_torch check against
// PyTorch (for OLMo the cache holds the rotated keys, so a wrong position shows): at every position of a sequence
// up to max_seq_len, the logits of the cached path equal the full forward's last row to float rounding. Then the
// cache's edges: a full sequence, bad token ids, truncation and restarts giving the same bits again. And an
// inference model (ModelUse::inference: no gradients, no backward scratch, one layer of activations, the
// classifier in blocks of rows) gives a training model's bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/model/model_cpu.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"

namespace {

// Odd sizes on purpose: head size 24, a padded vocabulary, C not a multiple of 64.
llmc::ModelConfig test_config() {
    llmc::ModelConfig c;
    c.num_layers = 3;
    c.num_heads = 4;
    c.channels = 96;
    c.max_seq_len = 40;
    c.vocab_size = 500;
    c.padded_vocab_size = 512;
    return c;
}

// test_config as GPT-2, as OLMo, and as OLMo with RMSNorm.
std::vector<llmc::ModelConfig> test_configs() {
    llmc::ModelConfig olmo = test_config(), olmo_rms = test_config();
    olmo.arch = olmo_rms.arch = llmc::ModelArch::olmo;
    olmo_rms.norm = llmc::NormKind::rmsnorm;
    return {test_config(), olmo, olmo_rms};
}

std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
    llmc::Rng rng(seed);
    std::vector<int> tokens(n);
    for (int& t : tokens) t = static_cast<int>(rng.below(static_cast<uint64_t>(vocab)));
    return tokens;
}

// Random init with every weight doubled, so that the logits are less uniform (a wrong position, key or value shows
// more). Larger factors amplify rounding along the way: 8 gives 3e-5 between the paths, 2 gives 9e-7.
llmc::ModelCpu make_model(const llmc::ModelConfig& config, llmc::ModelUse use = llmc::ModelUse::training) {
    llmc::ModelCpu model(config, use);
    model.init_random(11);
    for (float& w : model.params()) w *= 2.0f;
    return model;
}

// max |a - b| over the first n, against the largest |b|
double max_relative_difference(std::span<const float> a, std::span<const float> b, size_t n) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    return diff / scale;
}

}  // namespace

TEST(cached_logits_equal_the_full_forward_at_every_position) {
  for (const llmc::ModelConfig& config : test_configs()) {
    llmc::ModelCpu cached = make_model(config), full = make_model(config);
    const std::vector<int> tokens = random_tokens(config.max_seq_len, config.vocab_size, 3);
    const size_t Vp = config.padded_vocab_size;
    for (const int prompt : {1, 7}) {
        std::vector<float> logits;
        {
            const std::span<const float> l = cached.start_sequence(std::span<const int>(tokens).first(prompt));
            logits.assign(l.begin(), l.end());
        }
        double worst = 0.0, off_by_one = 1e30;  // the least difference to the position before: a bug's size
        std::vector<float> previous;
        for (int t = prompt; t <= config.max_seq_len; t++) {
            EXPECT_EQ(cached.sequence_length(), t);
            full.forward(tokens.data(), nullptr, 1, t);
            const std::span<const float> expected = full.logits().subspan((t - 1) * Vp, Vp);
            EXPECT_EQ(logits.size(), Vp);
            worst = std::max(worst, max_relative_difference(logits, expected, Vp));
            if (!previous.empty()) off_by_one = std::min(off_by_one, max_relative_difference(logits, previous, Vp));
            previous.assign(expected.begin(), expected.end());
            if (t < config.max_seq_len) {
                const std::span<const float> l = cached.append(tokens[t]);
                logits.assign(l.begin(), l.end());
            }
        }
        std::printf("  prompt of %d: largest difference %.2e of the largest logit (%.2e to the previous position)\n",
                    prompt, worst, off_by_one);
        EXPECT(off_by_one > 1e-2);
        // The paths' matmuls block differently (one row against t rows), so their rounding depends on the BLAS
        // kernels the machine picks: 1.3e-5 seen with RMSNorm on one machine, 2e-6 on another. A wrong position,
        // key or value moves the logits by far more than 1e-4.
        EXPECT(worst < 1e-4);
    }
  }
}

// continue_sequence, as the samplers call it: one token at a time while the context fits the window, then the
// window's last tokens run whole; each step's logits are the full forward's on the window's tokens.
TEST(continue_sequence_slides_the_window) {
  for (const llmc::ModelConfig& config : test_configs()) {
    llmc::ModelCpu cached = make_model(config), full = make_model(config);
    const int window = 9;
    const std::vector<int> tokens = random_tokens(25, config.vocab_size, 4);
    const size_t Vp = config.padded_vocab_size;
    cached.start_sequence(std::span<const int>(tokens).first(1));
    double worst = 0.0;
    for (size_t n = 2; n <= tokens.size(); n++) {
        const std::span<const int> context = std::span<const int>(tokens).first(n);
        const std::vector<float> logits = [&] {
            const std::span<const float> l = cached.continue_sequence(context, window);
            return std::vector<float>(l.begin(), l.end());
        }();
        const int held = std::min(int(n), window);
        EXPECT_EQ(cached.sequence_length(), held);
        const std::span<const int> seen = context.last(std::min<size_t>(n, window));
        full.forward(seen.data(), nullptr, 1, int(seen.size()));
        const std::span<const float> expected = full.logits().subspan((seen.size() - 1) * Vp, Vp);
        EXPECT_EQ(logits.size(), Vp);
        worst = std::max(worst, max_relative_difference(logits, expected, Vp));
        // once the window slides, the window runs whole: the full forward's bits
        if (n > size_t(window)) EXPECT(std::equal(logits.begin(), logits.end(), expected.begin()));
    }
    EXPECT(worst < 1e-5);
    EXPECT_ERROR(cached.continue_sequence(tokens, 0), "window 0 outside [1, max_seq_len]");
    EXPECT_ERROR(cached.continue_sequence(tokens, config.max_seq_len + 1), "window 41 outside [1, max_seq_len]");
    EXPECT_ERROR(cached.continue_sequence(std::span<const int>(), window), "no context");
  }
}

TEST(truncation_and_restarts_repeat_the_same_bits) {
  for (const llmc::ModelConfig& config : test_configs()) {
    llmc::ModelCpu model = make_model(config);
    const std::vector<int> tokens = random_tokens(config.max_seq_len, config.vocab_size, 5);
    const std::vector<int> other = random_tokens(config.max_seq_len, config.vocab_size, 6);
    const auto run = [&](const std::vector<int>& seq, int from) {
        std::vector<float> all;
        for (int t = from; t < 20; t++) {
            const std::span<const float> l = model.append(seq[t]);
            all.insert(all.end(), l.begin(), l.end());
        }
        return all;
    };
    model.start_sequence(std::span<const int>(tokens).first(5));
    const std::vector<float> first = run(tokens, 5);
    model.truncate_sequence(5);
    const std::vector<float> other_continuation = run(other, 5);
    model.truncate_sequence(5);
    EXPECT(run(tokens, 5) == first);  // the other continuation left nothing behind
    EXPECT(other_continuation != first);
    model.start_sequence(std::span<const int>(tokens).first(5));
    EXPECT(run(tokens, 5) == first);
  }
}

TEST(bad_calls_are_refused) {
  for (const llmc::ModelConfig& config : test_configs()) {
    llmc::ModelCpu model = make_model(config);
    EXPECT_ERROR(model.append(1), "needs a start_sequence");
    const std::vector<int> tokens = random_tokens(config.max_seq_len + 1, config.vocab_size, 7);
    EXPECT_ERROR(model.start_sequence(tokens), "exceeds the model's max_seq_len");
    EXPECT_ERROR(model.start_sequence(std::span<const int>()), "no tokens");
    model.start_sequence(std::span<const int>(tokens).first(config.max_seq_len - 1));
    EXPECT_ERROR(model.append(config.vocab_size), "outside the vocabulary");
    EXPECT_ERROR(model.append(-1), "outside the vocabulary");
    model.append(3);
    EXPECT_ERROR(model.append(3), "already holds max_seq_len 40 tokens");
    EXPECT_ERROR(model.truncate_sequence(0), "is not in [1, 40]");
    EXPECT_ERROR(model.truncate_sequence(41), "is not in [1, 40]");
    model.truncate_sequence(39);
    EXPECT_EQ(model.sequence_length(), 39);
  }
}

TEST(an_inference_model_gives_the_training_models_bits) {
  for (const llmc::ModelConfig& config : test_configs()) {
    llmc::ModelCpu training = make_model(config), inference = make_model(config, llmc::ModelUse::inference);
    EXPECT(inference.grads().empty());
    EXPECT_EQ(training.grads().size(), training.params().size());
    // 31 x 17 = 527 rows: the classifier's second block of kClassifierRows starts inside sequence 30
    const int B = 31, T = 17;
    static_assert(B * T > llmc::kClassifierRows && llmc::kClassifierRows % T != 0);
    const std::vector<int> tokens = random_tokens(B * T + 1, config.vocab_size, 9);
    const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
    const float loss_training = training.forward(inputs.data(), targets.data(), B, T);
    const float loss_inference = inference.forward(inputs.data(), targets.data(), B, T);
    EXPECT_EQ(loss_inference, loss_training);
    const std::span<const float> la = training.losses(), lb = inference.losses();
    EXPECT(la.size() == size_t(B * T) && lb.size() == la.size() && std::equal(la.begin(), la.end(), lb.begin()));
    // the inference model keeps each sequence's last row of logits only; they are the training model's rows
    const size_t Vp = size_t(config.padded_vocab_size);
    EXPECT(inference.logits().empty());
    EXPECT_EQ(inference.last_logits().size(), B * Vp);
    EXPECT_EQ(training.last_logits().size(), B * Vp);
    for (int b = 0; b < B; b++) {
        const std::span<const float> row = training.logits().subspan((size_t(b) * T + T - 1) * Vp, Vp);
        EXPECT(std::equal(row.begin(), row.end(), inference.last_logits().begin() + b * Vp));
        EXPECT(std::equal(row.begin(), row.end(), training.last_logits().begin() + b * Vp));
    }
    // with one layer's activations instead of 3: at least two layers' fewer (16 N x C tensors, 4 N-vectors and the
    // attention probabilities each), which is more than the backward scratch alone; and 512 rows of logits, not N
    const size_t N = B * T, layer_floats = 16 * N * config.channels + 4 * N + B * config.num_heads * T * T;
    EXPECT(inference.activation_bytes() + (2 * layer_floats + (N - llmc::kClassifierRows) * Vp) * sizeof(float) <=
           training.activation_bytes());
    // the key/value cache too, filled layer by layer as the one slot is reused
    training.start_sequence(std::span<const int>(inputs).first(17));
    inference.start_sequence(std::span<const int>(inputs).first(17));
    for (int t = 17; t < 22; t++) {
        const std::span<const float> next = inference.append(inputs[t]), expected = training.append(inputs[t]);
        EXPECT(std::equal(next.begin(), next.end(), expected.begin()));
    }
    EXPECT_ERROR(inference.backward(), "an inference model has no gradients");
    EXPECT_ERROR(inference.zero_grad(), "an inference model has no gradients");
  }
}

TEST_MAIN()
