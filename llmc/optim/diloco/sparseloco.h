// SparseLoCo (Sarfi, Thérien, Lidin, Belilovsky 2025, "Communication Efficient LLM Pre-training with SparseLoCo";
// public code tplr-ai/templar src/tplr/compress.py, src/tplr/neurons.py): DiLoCo (diloco.h: H inner AdamW steps, the
// pseudo-gradient delta = global - local at steps divisible by H, the outer Nesterov step, the same keys) whose
// pseudo-gradient travels compressed. SparseLocoWire is that exchange; the optimizer is a Diloco holding it.
//
// At a sync, on every rank r, in fp32:
//   1. error feedback   e_r = ef_decay * e_r + delta_r                        (templar: lr * delta, its outer lr 1)
//   2. compress         per chunk the top-k of |e_r|, 2-bit quantized per tensor (sparseloco_codec.h has the exact
//                        chunking, order, quantizer and byte layout), or fp32 values (--sparseloco_values fp32)
//   3. feedback         e_r -= decode(own message): the transmitted values as every rank decodes them
//   4. exchange         Transport::allgather_bytes of the messages (all the same size)
//   5. clip             per tensor: n_r = L2 norm of rank r's decoded values of that tensor (double, rounded to
//                        fp32); med = torch.median of n_0..n_{W-1} (the lower middle value); rank r's values of the
//                        tensor are scaled by min(med / (n_r + 1e-8), 1) (templar's batch_decompress clip_norm; at
//                        W = 1 too, where it is 1 - 1e-8 / (n + 1e-8) rounded)
//   6. average          mean_i = (sum over ranks in rank order of the clipped value at i, 0 where the rank did not
//                        send i) * (1 / W): the paper's (1/R) sum over replicas. (templar's code divides each
//                        coordinate by the number of peers that sent it, DeMo's scatter-mean; we follow the paper.)
//   7. outer step       Diloco's Nesterov SGD on mean (--diloco_outer_lr, --diloco_outer_momentum; the paper's and
//                        templar's setting is plain SGD: momentum 0, outer lr 1, the error feedback standing in for
//                        the outer momentum).
// Every rank decodes the same bytes with the same code in the same order, so the global weights stay bit-identical.
// The error feedback is each rank's own and is checkpointed after Diloco's state; --diloco_wire does not apply and
// is refused unless left at fp32.
#pragma once
#include <memory>
#include <vector>

#include "llmc/optim/diloco/diloco.h"
#include "llmc/optim/diloco/sparseloco_codec.h"

namespace llmc {

// Throws when a sparseloco_* or diloco_* option (or the inner AdamW's) is out of range, naming the key as `sources`
// does. The config layer runs every family's check whatever --optimizer is, so this one leaves --diloco_wire alone.
void validate_sparseloco_options(const OptimizerConfig& config, const ConfigSources& sources = {});
// Throws when --diloco_wire is not fp32: SparseLoCo's own wire replaces it (the constructor checks, and so does
// the dry-run report).
void check_sparseloco_wire(const OptimizerConfig& config, const ConfigSources& sources = {});

// SparseLoCo's entry in the registry of optimizers (optimizers.h).
OptimizerFamily sparseloco_family();

// The plan of `layout` for config.sparseloco's chunk, top-k and values.
sparseloco::Plan sparseloco_plan(const OptimizerConfig& config, const ParamLayout& layout);
// Bytes one rank sends per sync on `world` ranks: an all-gather of equal messages forwards (W - 1) of them.
double sparseloco_sync_bytes_sent(const OptimizerConfig& config, const ParamLayout& layout, int world);

class SparseLocoWire final : public PseudoGradientWire {
public:
    SparseLocoWire(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    std::string_view name() const override { return "sparseloco"; }
    void average(std::span<float> delta, StepTimings& seconds) override;
    size_t state_bytes() const override { return 64 + ef_.size() * sizeof(float); }
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;

    const sparseloco::Plan& plan() const { return plan_; }
    std::span<const float> error_feedback() const { return ef_; }

private:
    SparselocoConfig options_;
    sparseloco::Plan plan_;
    Transport& transport_;
    LargeVector<float> ef_;  // this rank's error feedback e
    std::vector<std::byte> message_, gathered_;
    std::vector<size_t> offsets_;
    std::vector<sparseloco::Decoded> decoded_;  // per rank
    GatherSizes gather_sizes_ = GatherSizes::exchange;
};

// A Diloco with SparseLoCo's wire: what --optimizer sparseloco builds.
std::unique_ptr<Diloco> make_sparseloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);

}  // namespace llmc
