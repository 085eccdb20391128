// Signum's options (signSGD with majority vote and local momentum): the schema key signum_beta, declared here and
// checked by validate_signum_options (signum.h). The shared weight_decay, decay_groups and grad_clip apply too.
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

struct SignumConfig {
    // Each rank's local momentum m = beta * m + (1 - beta) * g; what it sends is sign(m).
    float beta = 0.9f;
};

std::vector<Key<SignumConfig>> signum_config_keys();

}  // namespace llmc
