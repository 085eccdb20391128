// Limits that the trainers' schema and the tools' flags share.
#pragma once

namespace llmc {

// --threads (OpenMP threads per rank) and --sample_tokens (tokens per text sample).
inline constexpr long long kMaxThreads = 4096, kMaxSampleTokens = 1'000'000;
// --virtual_ranks (data-parallel ranks one process simulates, each with its own model and optimizer state).
inline constexpr long long kMaxVirtualRanks = 1024;

}  // namespace llmc
