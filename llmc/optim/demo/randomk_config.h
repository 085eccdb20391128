// --optimizer randomk's own option: the schema key randomk_seed (the index stream's seed), declared here and checked
// by validate_randomk_options (randomk.h). Its chunks, k, momentum and wire values are DeMo's demo_* keys.
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

struct RandomkConfig {
    int seed = 0;  // keys every chunk's draws with the step, tensor and chunk (randomk.h), the same on every rank
};

std::vector<Key<RandomkConfig>> randomk_config_keys();

}  // namespace llmc
