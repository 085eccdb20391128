// The chunk-length rule shared by the optimizers that cut tensors into chunks (DeMo's DCT chunks, SparseLoCo's
// top-k chunks), so both rooms cut a dimension the same way without including each other's headers.
#pragma once
#include <cstddef>

namespace llmc {

// Largest divisor of `size` that is <= `chunk`; `size` itself when size <= chunk; 1 when no divisor in (1, chunk]
// exists (a prime size above chunk). Callers check size >= 1 and chunk >= 1 themselves, naming their own key.
inline size_t largest_divisor_at_most(size_t size, size_t chunk) {
    if (size <= chunk) return size;
    for (size_t n = chunk; n > 1; n--)
        if (size % n == 0) return n;
    return 1;
}

}  // namespace llmc
