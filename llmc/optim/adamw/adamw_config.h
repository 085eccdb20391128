// AdamW-DDP's options: the schema keys beta1, beta2, eps, grad_wire and ddp_overlap, declared here and checked by
// validate_adamw_options (adamw.h).
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

enum class GradWire { fp32, bf16 };  // precision of the gradients in the all-reduce

struct AdamWConfig {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    GradWire grad_wire = GradWire::fp32;
    // With several ranks: each layer's gradient all-reduce starts as soon as the backward has finished that layer
    // (the same bits as the all-reduce after the backward).
    bool ddp_overlap = true;
};

std::vector<Key<AdamWConfig>> adamw_config_keys();

}  // namespace llmc
