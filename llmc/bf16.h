// bfloat16 <-> float conversion on the host (round to nearest even; NaN stays NaN). Shared by every wire
// format that sends bf16 (DeMo values, AdamW-DDP gradients) and by host references of the CUDA kernels.
#pragma once
#include <cstdint>
#include <cstring>

namespace llmc {

inline uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float round_to_bf16(float f) { return bf16_to_float(bf16_bits(f)); }

}  // namespace llmc
