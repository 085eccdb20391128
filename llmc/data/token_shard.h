// llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count) followed by uint16
// tokens; the file size must be exactly 1024 + 2 * count. Shared by the data-prep tool (writer) and the
// data loader (reader); every malformed file gets a one-line error naming it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llmc {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kHeaderBytes = 256 * sizeof(int32_t);

// Validates magic, version and file size; returns the token count.
size_t read_shard_header(const std::string& path);
// Reads `count` tokens starting at token `first`; throws if any id >= vocab_size (naming file and position).
void read_shard_tokens(const std::string& path, size_t first, std::span<uint16_t> out, int vocab_size);
std::vector<uint16_t> read_shard(const std::string& path, int vocab_size);
// Writes a complete shard atomically.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace llmc
