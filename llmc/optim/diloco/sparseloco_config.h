// SparseLoCo's options: the schema keys sparseloco_* (the per-chunk top-k, the chunk length, the error-feedback
// decay, the values' format), declared here and checked by validate_sparseloco_options (sparseloco.h). The round
// and the outer step are DiLoCo's keys (diloco_config.h), which SparseLoCo shares.
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

// The selected values on the wire: 2 bits each with a per-tensor codebook of bin means (SparseLoCo's recipe), or
// fp32 as selected (an ablation: the top-k alone).
enum class SparselocoValues { two_bit, fp32 };

struct SparselocoConfig {
    int topk = 64;            // values sent per chunk (64 of a 64 x 64 chunk: density 1.56%)
    int chunk = 64;           // target chunk length per dimension (12-bit chunk-local indices: at most 64)
    float ef_decay = 0.95f;   // error feedback e = ef_decay * e + delta before the selection
    SparselocoValues values = SparselocoValues::two_bit;
};

std::vector<Key<SparselocoConfig>> sparseloco_config_keys();

}  // namespace llmc
