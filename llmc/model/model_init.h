// A fresh model's seeded weights, by family (gpt2_init, olmo_init). Each 64Ki-element block of each tensor draws
// from its own Rng seeded from (seed, tensor, block), so the result does not depend on the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "llmc/model/param_layout.h"

namespace llmc {

void init_params(const ParamLayout& layout, std::span<float> params, uint64_t seed);

// How one tensor starts: every element `value`, or draws from normal(0, value) (truncated to +-3 value when
// `truncated`, by redrawing outside it).
struct TensorInit {
    bool random = false, truncated = false;
    double value = 0.0;
};

// Fills every tensor of `layout` by `rule`, block-seeded as above, the wte rows past vocab_size 0.
void init_by_rule(const ParamLayout& layout, std::span<float> params, uint64_t seed,
                  TensorInit (*rule)(const ParamLayout& layout, const ParamTensor& tensor));

}  // namespace llmc
