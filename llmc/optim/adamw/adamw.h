// AdamW with data parallelism in the DDP style: average the ranks' gradients (one all-reduce through the
// Transport), clip the global norm of the averaged gradient, then the decoupled-weight-decay Adam update
// (torch.optim.AdamW semantics). Weight decay applies per parameter group chosen by shape (2-D weights by
// default, or everything), so every rank holds identical parameters and moments.
// Sharded (--shard_group_size S > 1; topology.h): the node's S ranks reduce-scatter their gradients, each rank
// all-reduces its shard with the ranks holding the same shard in the other nodes, clips by the norm of the whole
// averaged gradient, updates its shard with moments for that shard only, and the node all-gathers the weights.
// S = world is ZeRO-1 (optimizer state split over all ranks); the update's arithmetic is the flat one's.
#pragma once
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/comm/topology.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

// Throws when --beta1, --beta2, --eps or --weight_decay is out of range, naming the key as `sources` does (by
// default: the flag): the checks of both trainers' AdamW (CPU and CUDA) and of validate_config.
void validate_adamw_options(const OptimizerConfig& config, const ConfigSources& sources = {});

// AdamW's entry in the registry of optimizers (optimizers.h).
OptimizerFamily adamw_family();

class AdamW final : public Optimizer {
public:
    // `group_size`: ranks per node (resolved, resolve_shard_group_size); 1 is AdamW-DDP.
    AdamW(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport, int group_size = 1);
    std::string_view name() const override { return "adamw"; }
    StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;
    // Starts the transport's overlapped all-reduce of the ranges; step() then waits for it instead of
    // all-reducing the whole buffer (same arithmetic per element).
    void on_gradients_final(std::span<float> grads, std::span<const ParamRange> ranges) override;

    // Bytes of the moments this rank holds (the dry run's figure).
    size_t state_bytes() const { return (m_.size() + v_.size()) * sizeof(float); }
    bool sharded() const { return topology_.node_group != nullptr; }

private:
    bool bf16_wire() const { return config_.adamw.grad_wire == GradWire::bf16; }
    // the update of the flat range [begin, end) of every tensor, moments indexed from `begin`
    void update(std::span<float> params, std::span<const float> grads, float lr, size_t begin, size_t end);

    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    LargeVector<float> m_, v_;          // first and second moments, flat like the parameters
    std::vector<uint8_t> decay_mask_;   // per tensor: 1 if weight decay applies
    int64_t t_ = 0;                     // completed steps (for bias correction)
    size_t overlapped_ = 0;             // gradients whose all-reduce on_gradients_final started this step
    // sharded: the nodes, the node's shards (S + 1 flat offsets; the same in bytes) and this rank's
    Topology topology_;
    std::vector<size_t> bounds_, byte_bounds_;
    size_t begin_ = 0, end_ = 0;
    int world_ = 1;
};

// The node's shards of AdamW's n parameters: S parts of about equal size, cut at multiples of 16 floats.
std::vector<size_t> adamw_shard_boundaries(size_t n, int group_size);

}  // namespace llmc
