// DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models"): each rank
// takes H inner AdamW steps on its own gradient with no communication, from the global weights of the last sync;
// at steps divisible by H the ranks average their pseudo-gradients delta = global - local and an outer Nesterov
// SGD step moves the global weights, which every rank's local weights then restart from.
//
// Inner step: torch.optim.AdamW on the local gradient clipped to --grad_clip (its norm is this rank's own), with
// the trainer's scheduled lr, --beta1/--beta2/--eps (AdamW's keys) and --weight_decay on --decay_groups; its moments
// and step count carry across rounds, as in the paper. Outer step, torch.optim.SGD(nesterov=True, dampening 0, no
// weight decay): buf = mu * buf + delta; update = delta + mu * buf; global -= outer_lr * update.
//
// The pseudo-gradient on the wire (--diloco_wire):
//   fp32  Transport::allreduce_mean (summed in rank order, times 1/W).
//   bf16  Transport::allreduce_mean_bf16 (values and every partial sum rounded to bf16; nothing rounds at W = 1).
//   int8  each tensor is cut into blocks of kDilocoInt8Block elements (the last one shorter); a block's scale is
//         s = absmax / 127 (fp32 division; 0 for an all-zero block, NaN for a block holding a non-finite value,
//         so the mean shows it as an fp32 all-reduce would) and its values q = rint(x / s) clamped to
//         [-127, 127] (rint: nearest, ties to even; q = 0 where s = 0). A rank's message is its scales (fp32,
//         block order) followed by its int8 values (parameter order), exchanged with allgather_bytes; every rank
//         then forms mean = (sum over ranks in rank order of float(q_r) * s_r) * (1 / W) in fp32. Applied at
//         every world size, W = 1 included, so a run's arithmetic does not depend on W.
//
// The exchange is a PseudoGradientWire: DenseWire does the three --diloco_wire formats above; SparseLoCo
// (sparseloco.h) is this same optimizer with its compressed wire, so the round, the inner AdamW and the outer step
// are written once, here.
//
// Weights: params (what every forward sees) are this rank's local weights, which differ between ranks inside a
// round. master_weights() is the global copy, identical on every rank at every step (changed only by the outer
// step, from the same averaged delta), so --weight_check_every compares it over the whole world at any step; at a
// sync step the local weights are a copy of it too. Checkpoints hold the global weights as the model file and the
// local weights in the state blob, so a resume mid-round continues bit-identically.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

inline constexpr size_t kDilocoInt8Block = 4096;  // elements per absmax scale (0.1% overhead on the wire)

// Throws when a diloco_* option, --beta1, --beta2, --eps or --weight_decay is out of range, naming the key as
// `sources` does (by default: the flag).
void validate_diloco_options(const OptimizerConfig& config, const ConfigSources& sources = {});

// DiLoCo's entry in the registry of optimizers (optimizers.h).
OptimizerFamily diloco_family();

// Bytes one rank sends per sync for `layout` on `world` ranks under the ring model of transport.h.
double diloco_sync_bytes_sent(DilocoWire wire, const ParamLayout& layout, int world);
// The int8 wire message of one rank (its scales, then its values), and its decoding added onto `sum`.
size_t diloco_int8_blocks(const ParamLayout& layout);
void diloco_int8_encode(const ParamLayout& layout, std::span<const float> x, std::vector<std::byte>& out);
void diloco_int8_accumulate(const ParamLayout& layout, std::span<const std::byte> msg, std::span<float> sum);

// How the ranks turn their pseudo-gradients into the one mean every rank's outer step applies.
class PseudoGradientWire {
public:
    virtual ~PseudoGradientWire() = default;
    // The optimizer's name, which tags its state blob: "diloco", "sparseloco".
    virtual std::string_view name() const = 0;
    // delta: this rank's pseudo-gradient (global - local) on entry; on return the mean that every rank applies,
    // bit-identical on every rank. Adds its encoding's time to seconds.transform, the collective's to exchange and
    // its decoding's to apply.
    virtual void average(std::span<float> delta, StepTimings& seconds) = 0;
    // The wire's own state (SparseLoCo's error feedback), written after Diloco's in the blob; none by default.
    virtual size_t state_bytes() const { return 0; }
    virtual void save_state(ByteWriter& /*out*/) const {}
    virtual void load_state(ByteReader& /*in*/) {}
};

// DiLoCo's own wire: --diloco_wire fp32 / bf16 (all-reduce) or int8 (all-gather), as described above.
class DenseWire final : public PseudoGradientWire {
public:
    DenseWire(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    std::string_view name() const override { return "diloco"; }
    void average(std::span<float> delta, StepTimings& seconds) override;

private:
    DilocoWire wire_;
    const ParamLayout& layout_;
    Transport& transport_;
    std::vector<std::byte> message_, gathered_;  // int8 wire
    std::vector<size_t> offsets_;
};

class Diloco final : public Optimizer {
public:
    // DiLoCo with its dense wire (--diloco_wire).
    Diloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    // The same round and outer step with another wire (SparseLoCo's), which also names the optimizer.
    Diloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport,
           std::unique_ptr<PseudoGradientWire> wire);
    std::string_view name() const override { return wire_->name(); }
    StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;
    // Fresh: the starting weights become the global ones. After load_state: params (the checkpoint's model file)
    // must be the blob's global weights, and are replaced by its local ones.
    void set_weights(std::span<float> params) override;
    std::span<float> master_weights(std::span<float> params) override;

    int64_t steps() const { return steps_; }
    bool synced_last_step() const { return steps_ > 0 && steps_ % config_.diloco.inner_steps == 0; }

private:
    void inner_update(std::span<float> params, std::span<const float> grads, float lr, float grad_scale);
    void outer_step(std::span<float> params, StepTimings& seconds);

    OptimizerConfig config_;
    const ParamLayout& layout_;
    std::unique_ptr<PseudoGradientWire> wire_;
    LargeVector<float> global_, momentum_;  // the last sync's weights; the outer Nesterov buffer
    LargeVector<float> m_, v_;              // inner AdamW moments
    LargeVector<float> delta_;              // the pseudo-gradient, then its mean over ranks
    LargeVector<float> loaded_local_;       // a checkpoint's local weights, until set_weights puts them in params
    std::vector<uint8_t> decay_mask_;       // per tensor: 1 if weight decay applies
    std::span<float> params_;               // the trainer's weights (local), seen at set_weights and step
    int64_t steps_ = 0;                     // completed optimizer steps (= the inner AdamW's t)
    bool loaded_ = false;
};

}  // namespace llmc
