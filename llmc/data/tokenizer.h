// The llm.c tokenizer decode file, which is all the trainer needs to turn sampled token ids back into text:
// a header of 256 little-endian uint32 (magic 20240328, version 2, token count, EOT id; version 1 files lack the
// EOT id, which is then 50256), then for each token a uint8 length and that many raw bytes. The data-prep tool
// writes it next to the shards; the trainer reads it (or a tokenizer.json's bytes of each token) to print samples.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llmc {

inline constexpr uint32_t kTokenizerMagic = 20240328;
inline constexpr uint32_t kTokenizerVersion = 2;

class TokenizerDecoder {
public:
    // Validates magic, version, token count, EOT id, every length byte and the exact file size; each problem
    // throws llmc::Error naming the file.
    static TokenizerDecoder load(const std::string& path);
    // A decoder over the bytes of each id (empty for an id nothing decodes to), e.g. a tokenizer.json's, which
    // `source` names in messages.
    static TokenizerDecoder from_token_bytes(const std::string& source, std::span<const std::string> token_bytes,
                                             int eot);

    // The raw bytes of token `id` (may be a partial UTF-8 sequence); throws for ids outside [0, size()).
    std::string decode(int id) const;
    std::string decode(std::span<const int> ids) const;
    int eot() const { return eot_; }
    size_t size() const { return offsets_.size() - 1; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    std::string bytes_;             // all tokens back to back
    std::vector<uint32_t> offsets_; // token i is bytes_[offsets_[i], offsets_[i + 1])
    int eot_ = -1;
};

// Writes the decode file atomically (temporary file + rename). Every token must be 1..255 bytes long.
void write_tokenizer_file(const std::string& path, const std::vector<std::string>& token_bytes, int eot);

}  // namespace llmc
