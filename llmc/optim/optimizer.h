// The optimizer interface. An optimizer owns data parallelism: it gets this rank's local gradient and talks to the
// other ranks only through a Transport. AdamW-DDP averages gradients and then clips and updates; DeMo clips the
// local gradient, compresses its own momentum and exchanges that; DiLoCo steps on the local gradient alone and
// averages pseudo-gradients every H steps; Signum votes on the signs of the ranks' momenta. All see parameters as
// the named tensors of a ParamLayout, and choose weight-decay groups by shape/name (2-D weights by default), never
// by index. Each optimizer lives in its own folder (adamw/, demo/, diloco/, signum/) with its options, and
// registers an OptimizerFamily (optimizers.h): its checks, warnings, dry-run report and constructor, which the run
// layer asks for by name.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/base/schema.h"
#include "llmc/comm/transport.h"
#include "llmc/model/param_layout.h"
#include "llmc/optim/adamw/adamw_config.h"
#include "llmc/optim/demo/demo_config.h"
#include "llmc/optim/demo/randomk_config.h"
#include "llmc/optim/diloco/diloco_config.h"
#include "llmc/optim/diloco/sparseloco_config.h"
#include "llmc/optim/signum/signum_config.h"
#include "llmc/optim/powersgd/powersgd_config.h"

namespace llmc {

inline constexpr int kShardGroupAuto = 0;  // --shard_group_size auto

enum class DecayGroups { matrices, all };  // "2d" (default): weight decay on 2-D weights only; "all": everything

struct OptimizerConfig {
    float weight_decay = 0.0f;
    DecayGroups decay_groups = DecayGroups::matrices;
    float grad_clip = 1.0f;  // max global L2 norm; <= 0 disables clipping
    // Ranks per node for the sharded step (FlexDeMo; sharded AdamW / ZeRO-1): the node's ranks average their
    // gradients and split the optimizer state; 1: every rank its own replica (flat DeMo, AdamW-DDP);
    // kShardGroupAuto: the ranks that share a host.
    int shard_group_size = 1;
    AdamWConfig adamw;
    DemoConfig demo;
    DilocoConfig diloco;
    SignumConfig signum;
    RandomkConfig randomk;  // --optimizer randomk (demo/randomk.h): its index seed; the rest is DeMo's
    SparselocoConfig sparseloco;  // SparseLoCo's own keys; it shares diloco's
    PowerSgdConfig powersgd;
};

// The options every optimizer shares: weight_decay, decay_groups, grad_clip.
std::vector<Key<OptimizerConfig>> optimizer_config_keys();

// Wall time of the parts of one step, for the metrics and the benchmark breakdown.
struct StepTimings {
    double clip = 0.0;       // norm + scaling (and, for AdamW, nothing else)
    double transform = 0.0;  // DeMo: momentum update + DCT encode + error feedback; Signum: momentum + sign + pack
    double topk = 0.0;       // DeMo: per-chunk selection + packing
    double exchange = 0.0;   // time inside transport collectives
    double apply = 0.0;      // AdamW update, DeMo scatter-mean + decode + sign + update, Signum vote + update
    // The sharded step (--shard_group_size): the node's reduce-scatter of the gradients and all-gather of the
    // updated weights; `exchange` is then the traffic across nodes (DeMo's buckets, AdamW's shard all-reduce).
    double reduce_scatter = 0.0;
    double allgather = 0.0;
    double diagnostics = 0.0;  // --demo_diagnostics: the measurements and their reductions (off: 0)

    // Phase by phase (a sharded step adds its own phases to its inner step's).
    StepTimings& operator+=(const StepTimings& t) {
        clip += t.clip;
        transform += t.transform;
        topk += t.topk;
        exchange += t.exchange;
        apply += t.apply;
        reduce_scatter += t.reduce_scatter;
        allgather += t.allgather;
        diagnostics += t.diagnostics;
        return *this;
    }
};

struct StepResult {
    double grad_norm = 0.0;  // L2 norm before clipping: of the averaged gradient (AdamW), of the local one (DeMo)
    StepTimings seconds;
    // --demo_diagnostics: this step's complete {"type":"diagnostics",...} line for metrics.jsonl, or "" (none due)
    std::string diagnostics;
};

class Optimizer {
public:
    virtual ~Optimizer() = default;
    virtual std::string_view name() const = 0;
    // params/grads are flat buffers laid out as in the ParamLayout given at construction. grads may be
    // modified (averaged, clipped). `lr` is this step's scheduled learning rate.
    virtual StepResult step(std::span<float> params, std::span<float> grads, float lr) = 0;
    // The 0-based number of the step the next step() runs (the trainers call it before each, so a resumed run
    // counts on; an optimizer that is never told counts its own steps from 0). Only --demo_diagnostics reads it.
    virtual void set_step(int64_t /*step*/) {}
    // Everything needed to continue bit-identically (moments, step count, DeMo momentum...).
    virtual void save_state(ByteWriter& out) const = 0;
    // Throws llmc::Error naming in.source() if the blob does not belong to this optimizer and shape.
    virtual void load_state(ByteReader& in) = 0;
    // The run's starting weights (fresh, from a model file, or a checkpoint's master weights after load_state)
    // are in params, before the first step. An optimizer whose working weights differ from the shared ones
    // (DeMo with eager delayed updates) takes its copy here and rewrites params.
    virtual void set_weights(std::span<float> /*params*/) {}
    // The shared weights that step() updates and checkpoints hold: params itself unless the optimizer keeps its
    // own copy (set_weights).
    virtual std::span<float> master_weights(std::span<float> params) { return params; }
    // The ranks of `world` whose shared weights are identical after every step (--weight_check_every compares
    // them): all of them, except where the method lets groups part (FlexDeMo's --demo_replicate_every: a node).
    virtual Transport& weight_group(Transport& world) { return world; }
    // Called during the last backward before step() (in backward order) with ranges of `grads` that nothing
    // later in this step's backward writes: an optimizer may start exchanging them while the backward goes on
    // (AdamW-DDP's overlapped all-reduce). Every range of the buffer is reported exactly once per step, or none
    // is (the trainer may not call this at all). The default ignores it.
    virtual void on_gradients_final(std::span<float> /*grads*/, std::span<const ParamRange> /*ranges*/) {}
    // Folds in any update still in flight after step(), so that the shared weights and params hold every
    // step's update: DeMo with --demo_delay 1 waits for the last round's all-gather and applies it with its own
    // lr (no weight decay: in the delayed order that belongs to the next step's compress), and the working
    // weights become the shared ones. The trainers call it after the last step, before its evaluation and
    // checkpoint (which then holds no pending round). Its time is added to `result`. The default has nothing in
    // flight.
    virtual void finish_updates(std::span<float> /*params*/, StepResult& /*result*/) {}
};

// What the run layer needs of an optimizer besides its steps, registered by name (optimizers.h).
struct OptimizerFamily {
    std::string name;  // the value of --optimizer
    std::string help;  // for --help: "AdamW-DDP"
    // Throws naming the key as `sources` does when an option is out of range (the constructors check again).
    void (*validate)(const OptimizerConfig& config, const ConfigSources& sources);
    // Legal settings that probably do not do what was meant for this model, one line each (no "warning: ").
    std::vector<std::string> (*warnings)(const OptimizerConfig& config, const ParamLayout& layout);
    // --dry_run: this optimizer's traffic per rank per step for `layout` on `world` ranks.
    void (*dry_run_report)(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout, int world);
    // For the banner: what sets this run's step apart ("applied a step late"), or "".
    std::string (*describe)(const OptimizerConfig& config);
    // The CPU trainer's optimizer.
    std::unique_ptr<Optimizer> (*make)(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    // Elastic resume (a checkpoint of `old_world` ranks on `new_world`, llmc/optim/reshard.h): writes new rank
    // `new_rank`'s state blob into `out` from the old ranks' blobs, which `old_blob(r)` reads (checked against the
    // checkpoint's marker; ByteReader::source() names the file), and returns the rule applied, for the "resumed
    // from" line. Throws naming the file for a blob it cannot redistribute. Null: unsupported (--reset_momentum only).
    std::string (*reshard_state)(int old_world, int new_rank, int new_world,
                                 const std::function<ByteReader(int)>& old_blob, ByteWriter& out) = nullptr;
};

// True when weight decay applies to this tensor under `groups`.
inline bool decays(const ParamTensor& t, DecayGroups groups) {
    return groups == DecayGroups::all || t.is_matrix();
}

// Sum of g[i]^2 in double, in a fixed order (deterministic for any thread count).
double sum_of_squares(std::span<const float> g);
// L2 norm of g: sqrt(sum_of_squares(g)).
double grad_norm(std::span<const float> g);
// The factor that brings a gradient of norm `norm` to at most max_norm (1 when no clipping is needed or
// max_norm <= 0), with torch.nn.utils.clip_grad_norm_'s rule: max_norm / (norm + 1e-6) when that is below 1.
float clip_scale(double norm, float max_norm);
// Scales g in place by clip_scale(grad_norm(g), max_norm). Returns the norm before clipping.
double clip_grad_norm(std::span<float> g, float max_norm);
// g *= clip_scale(norm, max_norm), for a gradient whose norm is known (a shard of one, whose norm the node summed).
void clip_by_norm(std::span<float> g, double norm, float max_norm);

}  // namespace llmc
