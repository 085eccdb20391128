// The cross-rank weight check (--weight_check_every): data-parallel ranks must hold bit-identical shared weights
// after every step (AdamW-DDP, DeMo's sign update, the sharded steps' all-gather); a hash of them is compared across
// ranks, so a rank that drifted is caught at the step it happened instead of as a bad loss much later.
#pragma once
#include <span>

#include "llmc/comm/transport.h"

namespace llmc {

// Throws a one-line llmc::Error naming `step` (1-based) unless every rank's `weights` hash alike (XXH64 of the
// bytes). Collective; uncounted (two scalar reductions).
void check_weights_agree(Transport& transport, std::span<const std::byte> weights, int step);
inline void check_weights_agree(Transport& transport, std::span<const float> weights, int step) {
    check_weights_agree(transport, std::as_bytes(weights), step);
}

}  // namespace llmc
