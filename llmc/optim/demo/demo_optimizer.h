// DeMo (Decoupled Momentum Optimization) on the CPU: each rank keeps its own momentum, sends only the top-k
// DCT coefficients of every chunk of it in one bucket, and all ranks apply sign(decode(mean of what was
// sent)). Follows the DeMo paper's reference implementation exactly in its default mode (the torch oracle
// dev/reference/demo_reference.py restates that step); the options (EMA momentum, feedback strength alpha,
// bf16/sign values, 12-bit indices, the unsigned update, a random orthogonal transform) are variants of it.
//
// The step is split into compress() (this rank: weight decay, momentum, encode, top-k, quantize, error
// feedback, pack) and apply() (all ranks' buckets: scatter-mean, sparse inverse DCT, sign, update) so tests
// and benchmarks can simulate several ranks in one process; step() chains them with the transport.
//
// Determinism: block rows and chunks are independent and each is processed by one thread in a fixed order,
// every sgemm runs in its calling thread, and the scatter-mean sums ranks in rank order, so the same inputs and thread
// count give bit-identical parameters and momentum. Top-k ties (equal |E|) go to the lower chunk-local index.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/dct.h"
#include "llmc/optim/demo/diagnostics.h"
#include "llmc/base/host_memory.h"
#include "llmc/optim/optimizer.h"

namespace demo {

// DeMo's entry in the registry of optimizers (optimizers.h).
llmc::OptimizerFamily demo_family();
// --optimizer topk: DeMo with no transform (demo_transform identity), its own entry in the registry.
llmc::OptimizerFamily topk_family();
// `config` with the identity for DeMo's transform (what topk runs); throws the one-line refusal when `config` names
// another transform (topk has none to choose).
llmc::OptimizerConfig as_topk(llmc::OptimizerConfig config);

// Per-thread scratch of select_topk (grows on first use).
struct TopkScratch {
    std::vector<uint32_t> keys;        // |value| as ordered integer keys
    std::vector<uint32_t> candidates;  // indices at or above the threshold found by the search
};

// Indices of the k largest |values[i]| (k <= values.size()), written to out[0..k) in ascending index order.
// Ties in magnitude go to the lower index, so the selected SET is unique. Linear time: a binary search over
// the magnitude keys with vectorized counting passes narrows the candidates to about k, and only those are
// partially sorted.
void select_topk(std::span<const float> values, size_t k, uint32_t* out, TopkScratch& scratch);

class DemoOptimizer final : public llmc::Optimizer {
public:
    // Validates the options (one-line llmc::Error naming --demo_topk, --demo_chunk, --demo_decay,
    // --demo_alpha, --weight_decay or --demo_indices) and plans every tensor of the layout.
    DemoOptimizer(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& transport);
    // DeMo on a given plan (FlexDeMo: one shard's slice_plan, offsets from the shard's start), with its tensors'
    // weight-decay flags; params and grads are then the shard's.
    DemoOptimizer(const llmc::OptimizerConfig& config, ModelPlan plan, std::vector<uint8_t> decays,
                  llmc::Transport& transport);

    std::string_view name() const override { return "demo"; }
    void set_step(int64_t step) override { step_ = step; }

    // clip_grad_norm on the LOCAL gradient (config.grad_clip), compress, all-gather the buckets, apply.
    // With config.demo.delay == 1 (--demo_delay 1) the update of step t is applied at step t+1, so its
    // all-gather runs during step t+1's forward and backward: step t first finishes round t-1's all-gather and
    // applies it (with round t-1's lr), then compresses its own gradient (weight decay on the parameters as
    // they are then) and starts round t's all-gather. The first step applies nothing; the last step's round
    // stays pending in the optimizer state (a checkpoint keeps it) until finish_updates() applies it.
    // With config.demo.eager as well, the shared weights live in the optimizer (master_weights) and params are
    // this rank's working weights: the shared ones minus lr * sign(decode(this rank's own bucket)) of the
    // pending round, the update this rank can see before the all-gather ends. step() applies the rounds to the
    // shared weights and rewrites params from them after each compress.
    llmc::StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    // step() with the gradient's norm given (FlexDeMo: that of the node's averaged gradient, of which grads is
    // one shard): clips by it and reports it.
    llmc::StepResult step_with_norm(std::span<float> params, std::span<float> grads, float lr, double norm);
    // Bytes of the state this optimizer holds (momentum, buckets, selections, shared weights): the dry run's
    // per-rank figure.
    size_t state_bytes() const;

    // This rank's half of the step: decoupled weight decay on the tensors in config.decay_groups, momentum
    // update, block DCT, per-chunk top-k, value quantization, error feedback with the dequantized values,
    // and packing into `bucket`. Adds to timings.transform and timings.topk. The gradient enters as
    // grads[i] * grad_clip_scale (bit-identical to clipping it in place first; step() saves that pass).
    void compress(std::span<float> params, std::span<const float> grads, float lr, std::vector<std::byte>& bucket,
                  llmc::StepTimings& timings, float grad_clip_scale = 1.0f);

    // Every rank's half: all_buckets holds the ranks' buckets back to back, rank r's in
    // [offsets[r], offsets[r+1]). Per coefficient, the mean over the ranks that selected it (0 where none
    // did), inverse DCT, sign (sign(0) = 0), params -= lr * sign (--demo_sign false: params -= lr * decode).
    // Adds to timings.apply.
    void apply(std::span<const std::byte> all_buckets, std::span<const size_t> offsets, std::span<float> params,
               float lr, llmc::StepTimings& timings);

    // --demo_delay 1: waits for the pending round's all-gather and applies it to the shared weights (its lr, no
    // weight decay), which params then equal. Without a pending round, nothing.
    void finish_updates(std::span<float> params, llmc::StepResult& result) override;

    void save_state(llmc::ByteWriter& out) const override;
    void load_state(llmc::ByteReader& in) override;
    // Eager delayed updates: params are the shared weights; they are copied in and rewritten as this rank's
    // working weights (a pending round's own share, when load_state brought one). Otherwise nothing.
    void set_weights(std::span<float> params) override;
    std::span<float> master_weights(std::span<float> params) override;

    std::span<const float> momentum() const { return momentum_; }
    const Selection& selection() const { return selection_; }  // what this rank sent at its last compress
    bool has_pending_round() const { return pending_.present; }  // --demo_delay 1: a round not yet applied
    const ModelPlan& plan() const { return plan_; }
    WireFormat wire_format() const { return format_; }
    size_t bucket_bytes() const { return demo::bucket_bytes(plan_, format_); }

private:
    void init();  // everything the constructors share once plan_ and decays_ are set
    void check_buffers(size_t params, size_t grads, const char* what) const;
    bool eager() const { return config_.demo.delay == 1 && config_.demo.eager; }
    // --demo_delay 1: finishes the pending round's all-gather (starting it first if load_state brought the
    // round) and applies it to the shared weights with the round's lr.
    void apply_pending_round(std::span<float> shared, llmc::StepTimings& timings);
    // params = master_ - pending lr * sign(decode(this rank's pending bucket)), or master_ without one.
    void write_working_weights(std::span<float> params, llmc::StepTimings& timings);

    llmc::OptimizerConfig config_;
    llmc::Transport& transport_;
    ModelPlan plan_;
    WireFormat format_;
    std::vector<uint8_t> decays_;  // per tensor: weight decay applies (config.decay_groups)
    DctBases bases_;
    struct BlockRow {
        size_t tensor, row;  // block row `row` (tensor rows [row*n1, (row+1)*n1)) of plan_.tensors[tensor]
    };
    std::vector<BlockRow> block_rows_;  // compress()'s work items, all tensors in order
    size_t max_block_row_ = 0, max_block_row_scratch_ = 0;  // per-thread scratch sizes (floats)
    llmc::LargeVector<float> momentum_;  // delta, laid out like the parameters
    Selection selection_;          // what this rank sends this step
    std::vector<Selection> received_;  // apply(): every rank's decoded bucket
    std::vector<std::byte> bucket_;    // step(): this rank's bucket
    PendingRound pending_;            // --demo_delay 1: the round compressed last step, applied next step
    bool pending_in_flight_ = false;   // its all-gather was started (false after load_state)
    llmc::LargeVector<float> master_;  // eager delayed updates: the shared weights (set_weights; empty before)
    std::vector<std::byte> gathered_;  // step(): all ranks' buckets
    std::vector<size_t> offsets_;
    // The first all-gather of a process exchanges the bucket sizes; once every rank's matched (a bucket's size
    // follows from the plan and the wire format, fixed for the run) the later ones skip that round trip.
    llmc::GatherSizes gather_sizes_ = llmc::GatherSizes::exchange;
    // --demo_diagnostics (the layout's constructor only; null when off): compress copies the momentum before error
    // feedback into its capture buffer at the steps it asks for (capturing_), and step() hands it the rest.
    std::unique_ptr<DemoDiagnostics> diagnostics_;
    bool capturing_ = false;
    int64_t step_ = 0;  // 0-based number of the next step (set_step, else counted)
};

}  // namespace demo
