// OLMo's own parts of the model layer (the DeMo paper's model, as allenai/OLMo builds it with block_type
// sequential, no biases, weight tying): its tensors (ParamLayout::olmo, under OLMo's parameter names) and its
// "mitchell" initialization.
#pragma once
#include <cstdint>
#include <span>

#include "llmc/model/param_layout.h"

namespace llmc {

// OLMo's mitchell init: every matrix from a normal truncated at 3 standard deviations; std 1/sqrt(C) for wte,
// att_proj and ff_proj; 1/sqrt(2 * C * (l + 1)) for layer l's attn_out and 1/sqrt(2 * 4C * (l + 1)) for its
// ff_out (2 * fan_in * (l + 1)); RMSNorm weights 1; padded wte rows 0.
void olmo_init(const ParamLayout& layout, std::span<float> params, uint64_t seed);

}  // namespace llmc
