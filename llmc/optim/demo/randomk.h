// --optimizer randomk: DeMo without the transform (as --optimizer topk: the momentum itself is selected, error
// feedback goes through the momentum, the same sign step), but each chunk sends k coefficients at seeded-random
// positions instead of its k largest. Every rank draws the same positions, so no index travels: the selected values
// of all chunks form one buffer that the ranks all-reduce (mean), and the pair randomk / topk isolates what choosing
// by magnitude is worth.
//
// The step on every rank r (the chunk plan, momentum rule and options are DeMo's: demo_chunk, demo_topk, demo_decay,
// demo_momentum, demo_alpha, demo_values fp32|bf16, demo_sign; weight_decay, decay_groups, grad_clip):
//   g = local gradient * clip_scale(||local gradient||, grad_clip)          (its own norm, as DeMo clips)
//   p = p * (1 - lr * wd)                                    on the decay groups (the factor formed in double)
//   delta = decay * delta + lr * g    (demo_momentum ema: decay * delta + (1 - decay) * g)
//   per chunk: the k positions idx below; v = delta[idx], rounded to bf16 (nearest even) with demo_values bf16;
//              delta[idx] -= alpha * v
//   mean = all-reduce mean of every chunk's v, one buffer in plan order (Transport::allreduce_mean: the sum in rank
//          order times 1/W; bf16: allreduce_mean_bf16, partial sums rounded to bf16, nothing rounds at W = 1)
//   p[idx] -= lr * sign(mean)   (sign(0) = 0; demo_sign false: lr * mean); positions not drawn do not move
//
// The positions (a counter-based generator, so every rank and a resumed run draw them without any RNG state):
//   splitmix64(x): z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//                  z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)      (all mod 2^64)
//   key = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ step) ^ tensor) ^ chunk)
//     seed: --randomk_seed; step: the optimizer steps completed before this one (0 at the first, carried by the
//     checkpoint); tensor: the tensor's index in the layout; chunk: its chunk index c = i * block_cols + j
//   draw_j = splitmix64(key + j), j = 0, 1, ..., k - 1
//   partial Fisher-Yates over the chunk's n = n1 * n2 flat positions: a = [0, 1, ..., n - 1];
//     for j in 0 .. k-1: r = j + draw_j mod (n - j); swap(a[j], a[r])
//   idx = a[0 .. k) sorted ascending (chunk-local flat b * n2 + d, as DeMo's; k = clamp(demo_topk, 1, n))
//
// Bytes: the one all-reduce of S = sum over chunks of k values, 4 bytes each (bf16: 2): the ring model's
// 2 (W-1) / W * S * 4 per rank per step, against AdamW-DDP's 2 (W-1) / W * n * 4 and DeMo's all-gather of
// indices and values. Not supported (one-line refusals): demo_values sign, demo_indices packed12 (no index is
// sent), demo_delay 1, demo_transform, demo_replicate_every and shard_group_size other than their defaults, and
// the CUDA trainer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/optimizer.h"

namespace demo {

// randomk's entry in the registry of optimizers (optimizers.h).
llmc::OptimizerFamily randomk_family();

// Throws naming the key as `sources` does (by default: the flag) when randomk_seed, a demo_* option it uses or
// weight_decay is out of range, or an option it does not support is set: the constructor's and the dry run's check
// (validate_config, which runs every family's check for any --optimizer, checks randomk_seed's range only).
void validate_randomk_options(const llmc::OptimizerConfig& config, const llmc::ConfigSources& sources = {});

inline uint64_t randomk_splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The key of one chunk's draws (see above).
inline uint64_t randomk_chunk_key(uint64_t seed, uint64_t step, uint64_t tensor, uint64_t chunk) {
    return randomk_splitmix64(randomk_splitmix64(randomk_splitmix64(randomk_splitmix64(seed) ^ step) ^ tensor) ^
                              chunk);
}

// The k (<= n) positions of a chunk of n elements under `key`, ascending, into out[0..k). `scratch` grows on first
// use; where k is small against n only the k swapped slots are kept (the same draws, the same result).
void randomk_select(uint64_t key, size_t n, size_t k, uint32_t* out, std::vector<uint32_t>& scratch);

// Bytes one rank sends per step under the ring model of transport.h (integer, as the transports count it).
uint64_t randomk_bytes_sent(const ModelPlan& plan, llmc::DemoValueEncoding values, int world);

class RandomK final : public llmc::Optimizer {
public:
    // Validates the options (validate_randomk_options) and plans every tensor of the layout as DeMo does.
    RandomK(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& transport);
    std::string_view name() const override { return "randomk"; }
    // clip (the local norm), transform (weight decay, momentum, the draws, values and feedback), exchange (the
    // all-reduce), apply (the sign step on the drawn positions).
    llmc::StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    // Blob: "randomk", parameter count, plan fingerprint, seed, step count, momentum.
    void save_state(llmc::ByteWriter& out) const override;
    void load_state(llmc::ByteReader& in) override;

    const ModelPlan& plan() const { return plan_; }
    std::span<const float> momentum() const { return momentum_; }
    int64_t steps() const { return steps_; }
    // The last step's chunk-local positions and their means over the ranks, item s = select_offset + c * k + j.
    std::span<const uint32_t> indices() const { return indices_; }
    std::span<const float> means() const { return values_; }

private:
    llmc::OptimizerConfig config_;
    llmc::Transport& transport_;
    ModelPlan plan_;
    std::vector<uint8_t> decays_;        // per tensor: weight decay applies (config.decay_groups)
    llmc::LargeVector<float> momentum_;  // delta, laid out like the parameters
    std::vector<uint32_t> indices_;      // this step's positions (the same on every rank)
    std::vector<float> values_;          // this rank's selected values, then their means over the ranks
    int64_t steps_ = 0;
};

}  // namespace demo
