// DeMo's options: the schema keys demo_* (the step's semantics, the wire format, the delayed update, and the CUDA
// kernels' choices), declared here and checked by validate_demo_options.
#pragma once
#include <string>
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

enum class DemoMomentum { lr_scaled, ema };          // delta = decay*delta + lr*g  |  decay*delta + (1-decay)*g
enum class DemoValueEncoding { fp32, bf16, sign };   // values on the wire: exact, bf16, 1 bit (sign only)
// chunk-local indices: u8/u16/u32 by chunk size | 12-bit | Elias-Fano per chunk (codec.h)
enum class DemoIndexEncoding { smallest, packed12, entropy };
enum class DemoDct { fp32, tensor };                 // train_gpt: the compress kernel's DCTs in fp32 | on tensor cores
enum class DemoMomentumDomain { spatial, dct };      // train_gpt: the 64 x 64 chunks' momentum as is | DCT-transformed
// the chunks' basis: DCT-II | a seeded random orthogonal matrix | none (the identity: --optimizer topk)
enum class DemoTransform { dct, random, identity };

struct DemoConfig {
    float decay = 0.999f;
    int topk = 32;
    int chunk = 64;
    DemoMomentum momentum = DemoMomentum::lr_scaled;
    float feedback_alpha = 1.0f;  // delta -= alpha * decode(transmitted)
    DemoValueEncoding values = DemoValueEncoding::fp32;
    DemoIndexEncoding indices = DemoIndexEncoding::smallest;
    int delay = 0;  // 1: each step's gathered update is applied at the next step (the exchange overlaps it)
    // With delay 1: each rank also takes its own compressed share of the update at once, as a stand-in for the
    // whole until the all-gather lands (eager updates). The ranks' working weights then differ by that share;
    // the shared weights (master_weights) stay identical and are what checkpoints hold.
    bool eager = true;
    // FlexDeMo (--shard_group_size > 1): the exchange across nodes runs at steps divisible by this; in between
    // each node steps on the sign of its own averaged gradient (DeToNATION's replicate_every).
    int replicate_every = 1;
    // The ablations the paper's reviewers asked for. sign false: p -= lr * decode(G) instead of lr * sign(decode(G))
    // (weight decay unchanged). transform random: every chunk length's DCT-II basis replaced by a fixed random
    // orthogonal matrix (demo::random_orthogonal_basis_f64), for encode and decode alike: is the DCT the point?
    // identity: top-k of the momentum itself (what --optimizer topk runs).
    bool sign = true;
    DemoTransform transform = DemoTransform::dct;
    // The CUDA kernels (train_gpt; the CPU optimizer computes the same step either way).
    DemoDct dct = DemoDct::fp32;
    DemoMomentumDomain momentum_domain = DemoMomentumDomain::spatial;
    int kernel_tuning = -1;
    // --demo_diagnostics N: every N steps the CPU optimizer measures the conjectures on its state (diagnostics.h)
    // and the trainer writes a "diagnostics" line; 0: off. Reads the state only: training is the same either way.
    int diagnostics = 0;  // a row of the kernel lab's tunings table; -1: the one dct and momentum_domain pick
};

// The "optimizer" group's demo_* keys, and the "cuda" group's (the kernels').
std::vector<Key<DemoConfig>> demo_config_keys();
std::vector<Key<DemoConfig>> demo_cuda_keys();

struct OptimizerConfig;

}  // namespace llmc

namespace demo {

// Throws naming the key as `sources` does (by default: the flag) when a demo_* option or weight_decay is out of
// range: the checks of both trainers' DeMo (CPU and CUDA) and of validate_config.
void validate_demo_options(const llmc::OptimizerConfig& config, const llmc::ConfigSources& sources = {});

}  // namespace demo
