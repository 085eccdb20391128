// The rotary embedding's cos/sin table, built once on the host and shared by the CPU model and the CUDA kernels
// (llmc/cuda/rope.cuh uploads the very same floats), so both rotate by bit-identical angles.
// Layout: max_T rows (positions t = 0 .. max_T - 1) of head_size / 2 pairs {cos, sin}, row-major and interleaved:
//   table[2 * (t * (head_size / 2) + i)]     = cos(t * theta^(-2i / head_size))
//   table[2 * (t * (head_size / 2) + i) + 1] = sin(t * theta^(-2i / head_size))
// computed in double and rounded to float once (PyTorch's OLMo builds the angles in fp32; at t of a few thousand
// that differs from these by up to ~1e-4 rad, below what bf16 activations resolve).
#pragma once
#include <cmath>
#include <vector>

#include "llmc/base/error.h"

namespace llmc {

inline std::vector<float> rope_table(int max_T, int head_size, double theta) {
    LLMC_CHECK(max_T > 0 && head_size > 0 && head_size % 2 == 0 && theta > 0.0,
               "rope_table: needs max_T > 0, an even head_size and theta > 0");
    const int half = head_size / 2;
    std::vector<float> table(size_t(max_T) * half * 2);
    for (int i = 0; i < half; i++) {
        const double inv_freq = std::pow(theta, -2.0 * i / head_size);
        for (int t = 0; t < max_T; t++) {
            const double angle = double(t) * inv_freq;
            const size_t at = 2 * (size_t(t) * half + i);
            table[at] = static_cast<float>(std::cos(angle));
            table[at + 1] = static_cast<float>(std::sin(angle));
        }
    }
    return table;
}

}  // namespace llmc
