// Reader and writer of llm.c token shards (see token_shard.h).
#include "llmc/data/token_shard.h"

#include <array>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

size_t read_shard_header(const std::string& path) {
    require_regular_file(path);
    File f(path, "rb");
    const size_t file_size = f.size();
    LLMC_CHECK(file_size >= kHeaderBytes, path + ": truncated shard: " + std::to_string(file_size) +
                                              " bytes is shorter than the 1024-byte header");
    std::array<int32_t, 256> header;
    f.read_exact(header.data(), kHeaderBytes, "shard header");
    LLMC_CHECK(header[0] == kShardMagic, path + ": bad magic " + std::to_string(header[0]) +
                                             " (expected 20240520: not an llm.c token shard)");
    LLMC_CHECK(header[1] == kShardVersion,
               path + ": unsupported shard version " + std::to_string(header[1]) + " (expected 1)");
    LLMC_CHECK(header[2] >= 0, path + ": negative token count in header");
    const size_t ntok = static_cast<size_t>(header[2]);
    const size_t expected = kHeaderBytes + 2 * ntok;
    LLMC_CHECK(file_size == expected, path + ": " + (file_size < expected ? "truncated" : "oversized") +
                                          " shard: header says " + std::to_string(ntok) + " tokens (" +
                                          std::to_string(expected) + " bytes) but file has " +
                                          std::to_string(file_size) + " bytes");
    return ntok;
}

void read_shard_tokens(const std::string& path, size_t first, std::span<uint16_t> out, int vocab_size) {
    File f(path, "rb");
    f.seek(static_cast<long>(kHeaderBytes + 2 * first));
    f.read_exact(out.data(), out.size_bytes(), "tokens");
    for (size_t i = 0; i < out.size(); i++)
        LLMC_CHECK(out[i] < vocab_size, path + ": token id " + std::to_string(out[i]) + " at position " +
                                            std::to_string(first + i) + " is out of range (vocab_size " +
                                            std::to_string(vocab_size) + ")");
}

std::vector<uint16_t> read_shard(const std::string& path, int vocab_size) {
    std::vector<uint16_t> tokens(read_shard_header(path));
    read_shard_tokens(path, 0, tokens, vocab_size);
    return tokens;
}

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
    LLMC_CHECK(tokens.size() <= INT32_MAX, path + ": too many tokens for one shard");
    std::array<int32_t, 256> header{};
    header[0] = kShardMagic;
    header[1] = kShardVersion;
    header[2] = static_cast<int32_t>(tokens.size());
    AtomicFile f(path);
    f.write(header.data(), kHeaderBytes);
    f.write(tokens.data(), tokens.size_bytes());
    f.commit();
}

}  // namespace llmc
