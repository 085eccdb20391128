// FlexDeMo (hybrid sharded DeMo; the public code is DeToNATION): ranks form nodes of S (--shard_group_size). Each
// step the node averages its ranks' gradients with a reduce-scatter over the fast link, so each rank holds the
// node's gradient for its shard; the rank keeps DeMo's momentum for that shard only and runs DeMo's compress,
// all-gather, decode, sign and update on it with its replica group (the ranks of the other nodes holding the same
// shard) over the slow link; then the node all-gathers the updated shards, so every rank has the whole model.
// Shards are runs of whole DCT block rows (chunk_plan.h: shard_boundaries), so the chunks and their top-k are
// flat DeMo's: N nodes x S ranks of batch B step as flat DeMo on N ranks of batch S x B, up to the rounding of
// the average. --demo_replicate_every N exchanges across nodes at steps divisible by N only; at the others each
// node steps on the sign of its own averaged gradient and the momentum rests (DeToNATION's replicate_every), so
// the nodes' weights part: only a node's ranks hold the same weights then.
#pragma once
#include <memory>
#include <vector>

#include "llmc/comm/topology.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/optimizer.h"

namespace demo {

class FlexDemo final : public llmc::Optimizer {
public:
    // `world`: every rank of the job; split here into nodes of `group_size` (resolve_shard_group_size).
    FlexDemo(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& world,
             int group_size);
    std::string_view name() const override { return "demo"; }
    llmc::StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    void finish_updates(std::span<float> params, llmc::StepResult& result) override;
    // The topology (S, world size, this rank's shard) and then the shard's DeMo state; load_state refuses a blob of
    // another topology with one line.
    void save_state(llmc::ByteWriter& out) const override;
    void load_state(llmc::ByteReader& in) override;
    // --demo_replicate_every > 1: the nodes' weights part between rounds, so the state holds this rank's shard of
    // them and set_weights puts it back (and the node gathers its weights); weight_group is then the node.
    void set_weights(std::span<float> params) override;
    llmc::Transport& weight_group(llmc::Transport& world) override;

    size_t state_bytes() const { return inner_->state_bytes(); }
    const DemoOptimizer& shard_optimizer() const { return *inner_; }
    const llmc::Topology& topology() const { return topology_; }
    size_t shard_begin() const { return bounds_[topology_.local_rank]; }
    size_t shard_end() const { return bounds_[topology_.local_rank + 1]; }

private:
    // The node's weights go round: every rank's updated shard to the others.
    void gather_weights(std::span<float> params, llmc::StepTimings& timings);
    // A step without the exchange across nodes (--demo_replicate_every): weight decay, then -lr * sign(gradient).
    void local_sign_step(std::span<float> shard, std::span<const float> grads, float lr);

    llmc::OptimizerConfig config_;
    llmc::Topology topology_;
    std::vector<size_t> bounds_;       // the node's shards, flat offsets (S + 1)
    std::vector<size_t> byte_bounds_;  // the same in bytes of fp32
    int world_ = 1;
    ModelPlan shard_plan_;
    std::vector<uint8_t> shard_decays_;  // per tensor of shard_plan_
    std::unique_ptr<DemoOptimizer> inner_;  // DeMo on this rank's shard, over the replica group
    int64_t steps_ = 0;                     // steps taken (the replicate_every schedule counts from 1)
    std::vector<float> saved_shard_;        // replicate_every > 1: this shard's weights after the last step
    std::vector<float> loaded_shard_;       // the same from load_state, until set_weights
};

// The plan of shard `part` of a node (bounds: shard_boundaries of `full`) and its tensors' weight-decay flags,
// from those of `full` (`decays`).
ModelPlan shard_plan_of(const ModelPlan& full, const std::vector<uint8_t>& decays, const std::vector<size_t>& bounds,
                        int part, std::vector<uint8_t>& shard_decays);

// The head of the sharded DeMo state blob, both trainers' (flexdemo_cuda.cuh): the topology, this rank's shard and
// the steps taken; the shard's DeMo state follows.
struct ShardStateHead {
    int group_size = 1, world = 1;
    size_t begin = 0, end = 0;
    int64_t steps = 0;
};
void write_shard_state_head(llmc::ByteWriter& out, const ShardStateHead& head);
// Reads a head and checks it against this rank's (`mine`; its steps unused): one-line errors naming in.source().
// Returns the saved steps.
int64_t read_shard_state_head(llmc::ByteReader& in, const ShardStateHead& mine);

// The optimizer state one rank of a node of `group_size` holds for `layout` (the largest shard), measured on a
// DemoOptimizer built for that shard: the dry run's figure.
size_t flexdemo_state_bytes_per_rank(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout,
                                     int group_size);

}  // namespace demo
