// The tiny model shapes the CPU unit tests share: small enough to be instant, with a padded vocabulary and more
// than one layer and head, in each family and norm, so the checks that hold for any model run on all three.
#pragma once
#include <vector>

#include "llmc/model/model_config.h"

namespace testing {

inline llmc::ModelConfig tiny_config() {
    llmc::ModelConfig c;
    c.max_seq_len = 16;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 32;
    return c;
}

// tiny_config as GPT-2, as OLMo (LayerNorm) and as OLMo with RMSNorm.
inline std::vector<llmc::ModelConfig> every_family() {
    llmc::ModelConfig olmo = tiny_config(), olmo_rms = tiny_config();
    olmo.arch = olmo_rms.arch = llmc::ModelArch::olmo;
    olmo_rms.norm = llmc::NormKind::rmsnorm;
    return {tiny_config(), olmo, olmo_rms};
}

}  // namespace testing
