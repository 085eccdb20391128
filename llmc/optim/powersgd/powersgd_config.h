// PowerSGD's options: the schema keys powersgd_rank, powersgd_warm_start and powersgd_seed, declared here and
// checked by validate_powersgd_options (powersgd.h). The shared grad_clip, weight_decay and decay_groups and
// AdamW's beta1, beta2 and eps apply to the AdamW update that follows the compressed all-reduce.
#pragma once
#include <cstdint>
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

struct PowerSgdConfig {
    int rank = 4;             // r: the rank of each matrix's approximation (at most min(rows, cols) per matrix)
    bool warm_start = true;   // reuse last step's Q (false: a fresh random Q every step)
    int64_t seed = 0;         // the random starting Q, identical on every rank
};

std::vector<Key<PowerSgdConfig>> powersgd_config_keys();

}  // namespace llmc
