// Parameter layouts for the optimizer tests: tensors of given shapes laid out back to back, so a test can pick
// awkward sizes (not multiples of a chunk, of 8, of 64) without a model.
#pragma once
#include <string>
#include <vector>

#include "llmc/model/param_layout.h"

namespace testing {

// Tensors "tensor_0", "tensor_1", ... of `shapes`, in order from offset 0 (kind wte, no layer).
inline llmc::ParamLayout layout_of_shapes(const std::vector<std::vector<size_t>>& shapes) {
    llmc::ParamLayout layout;
    size_t offset = 0;
    for (size_t i = 0; i < shapes.size(); i++) {
        size_t numel = 1;
        for (size_t d : shapes[i]) numel *= d;
        layout.tensors.push_back({"tensor_" + std::to_string(i), llmc::ParamKind::wte, -1, offset, numel, shapes[i]});
        offset += numel;
    }
    layout.num_params = offset;
    return layout;
}

}  // namespace testing
