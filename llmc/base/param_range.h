// A range of a flat parameter (or gradient) buffer: what a backward has finished, what a transport reduces.
#pragma once
#include <cstddef>

namespace llmc {

struct ParamRange {
    size_t offset = 0;
    size_t numel = 0;
    bool operator==(const ParamRange&) const = default;
};

}  // namespace llmc
