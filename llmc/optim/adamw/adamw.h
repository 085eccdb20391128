// AdamW with data parallelism in the DDP style: average the ranks' gradients (one all-reduce through the
// Transport), clip the global norm of the averaged gradient, then the decoupled-weight-decay Adam update
// (torch.optim.AdamW semantics). Weight decay applies per parameter group chosen by shape (2-D weights by
// default, or everything), so every rank holds identical parameters and moments.
#pragma once
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

// Throws when --beta1, --beta2, --eps or --weight_decay is out of range, naming the key as `sources` does (by
// default: the flag): the checks of both trainers' AdamW (CPU and CUDA) and of validate_config.
void validate_adamw_options(const OptimizerConfig& config, const ConfigSources& sources = {});

// AdamW's entry in the registry of optimizers (optimizers.h).
OptimizerFamily adamw_family();

class AdamW final : public Optimizer {
public:
    AdamW(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    std::string_view name() const override { return "adamw"; }
    StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;
    // Starts the transport's overlapped all-reduce of the ranges; step() then waits for it instead of
    // all-reducing the whole buffer (same arithmetic per element).
    void on_gradients_final(std::span<float> grads, std::span<const ParamRange> ranges) override;

private:
    bool bf16_wire() const { return config_.adamw.grad_wire == GradWire::bf16; }

    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    LargeVector<float> m_, v_;          // first and second moments, flat like the parameters
    std::vector<uint8_t> decay_mask_;   // per tensor: 1 if weight decay applies
    int64_t t_ = 0;                     // completed steps (for bias correction)
    size_t overlapped_ = 0;             // gradients whose all-reduce on_gradients_final started this step
};

}  // namespace llmc
