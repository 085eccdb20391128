// GPT-2's own parts of the model layer: its tensors (ParamLayout::gpt2, llm.c's checkpoint order and shapes, so a
// buffer laid out here is written after llm.c's 256-int header as is) and its initialization.
#pragma once
#include <cstdint>
#include <span>

#include "llmc/model/param_layout.h"

namespace llmc {

// GPT-2 init: matrices and embeddings normal(0, 0.02), the two residual projections (attn.c_proj, mlp.c_proj)
// normal(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1 / bias 0, padded wte rows 0.
void gpt2_init(const ParamLayout& layout, std::span<float> params, uint64_t seed);

}  // namespace llmc
