// Signum with majority vote (Bernstein et al. 2018, "signSGD: compressed optimisation for non-convex problems"):
// each rank keeps a momentum of its own clipped local gradient, sends only its sign, 1 bit per element, and every
// rank applies the sign of the sum of the ranks' signs. No server: one all-gather of the packed bits, after which
// every rank counts the same votes in the same way, so the weights stay bit-identical on every rank.
//
// The step, per element i, on every rank r:
//   g = local gradient * clip_scale(||local gradient||, grad_clip)      (the local norm, as DeMo clips)
//   m_r = beta * m_r + (1 - beta) * g                                  (--signum_beta, default 0.9)
//   s_r = +1 if m_r >= 0 else -1                                       (1 bit: a zero momentum counts as +1)
//   vote = sign(sum over ranks of s_r)                                 (a tie, possible at an even world, is 0)
//   p = p * (1 - lr * weight_decay)   on the decay groups (decoupled, as AdamW and DeMo)
//   p = p - lr * vote
// On the wire: bit i % 8 of byte i / 8 of a rank's buffer is 1 for s_r = +1; ceil(n / 8) bytes per rank per step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

// Throws when --signum_beta or --weight_decay is out of range, naming the key as `sources` does (by default: the
// flag): the checks of the constructor and of validate_config.
void validate_signum_options(const OptimizerConfig& config, const ConfigSources& sources = {});

// Signum's entry in the registry of optimizers (optimizers.h).
OptimizerFamily signum_family();

// Bytes of one rank's packed signs for n elements.
inline size_t signum_packed_bytes(size_t n) { return (n + 7) / 8; }

// The votes of the 8 elements of byte b from the packed signs of `world` ranks laid back to back, rank r's at
// all[r * stride]: out[j] = sign(2 * (ranks voting +1 for element 8 b + j) - world), so +1, -1, or 0 on a tie.
inline void signum_votes_of_byte(const std::byte* all, size_t stride, int world, size_t b, int8_t out[8]) {
    int plus[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < world; r++) {
        const unsigned x = std::to_integer<unsigned>(all[r * stride + b]);
        for (unsigned j = 0; j < 8; j++) plus[j] += static_cast<int>((x >> j) & 1u);
    }
    for (int j = 0; j < 8; j++) {
        const int sum = 2 * plus[j] - world;
        out[j] = static_cast<int8_t>((sum > 0) - (sum < 0));
    }
}

class Signum final : public Optimizer {
public:
    // Validates the options (one-line llmc::Error naming the flag); --shard_group_size must be 1.
    Signum(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    std::string_view name() const override { return "signum"; }
    // Clip the local gradient, update the momentum and pack its signs (transform), all-gather the bits
    // (exchange), count the votes, weight-decay and update (apply).
    StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    // Blob: "signum", parameter count, step count, momentum.
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;

    std::span<const float> momentum() const { return momentum_; }
    int64_t steps() const { return steps_; }
    // This rank's packed signs of its last step.
    std::span<const std::byte> sent() const { return bits_; }
    size_t packed_bytes() const { return signum_packed_bytes(momentum_.size()); }

private:
    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    LargeVector<float> momentum_;     // this rank's m, flat like the parameters
    std::vector<uint8_t> decay_mask_;  // per tensor: 1 if weight decay applies
    std::vector<std::byte> bits_;      // this rank's packed signs
    std::vector<std::byte> gathered_;  // every rank's, back to back
    std::vector<size_t> offsets_;
    std::vector<int8_t> votes_;        // this step's vote per element: +1, -1, 0
    int64_t steps_ = 0;
    // The first all-gather exchanges the sizes; once every rank's matched (ceil(n / 8) is fixed for the run) the
    // later ones skip that round trip.
    GatherSizes gather_sizes_ = GatherSizes::exchange;
};

}  // namespace llmc
