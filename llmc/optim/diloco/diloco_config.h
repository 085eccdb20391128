// DiLoCo's options: the schema keys diloco_* (the round length H, the outer Nesterov step, the pseudo-gradient's
// wire format), declared here and checked by validate_diloco_options (diloco.h).
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

// The pseudo-gradient on the wire: an fp32 all-reduce, a bf16 all-reduce (Transport::allreduce_mean_bf16), or
// int8 values with an absmax scale per block of kDilocoInt8Block floats, all-gathered and averaged after
// dequantization (diloco.h describes the scheme).
enum class DilocoWire { fp32, bf16, int8 };

struct DilocoConfig {
    int inner_steps = 50;        // H: inner AdamW steps per round; the sync runs at steps divisible by H
    float outer_lr = 0.7f;       // the outer Nesterov SGD's learning rate
    float outer_momentum = 0.9f; // its momentum mu
    DilocoWire wire = DilocoWire::fp32;
};

std::vector<Key<DilocoConfig>> diloco_config_keys();

}  // namespace llmc
