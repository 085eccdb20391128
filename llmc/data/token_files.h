// The token files the data loader reads, in either format: llm.c's shards (token_shard.h: a 1024-byte header with
// a magic number, then uint16 ids) and OLMo's memmap files (raw, headerless little-endian ids of `memmap_dtype`,
// read by OLMo with np.memmap; named *.npy but without numpy's header). What both share lives here: naming a set of
// files (a glob, or a list file of paths as OLMo configs list Dolma's), telling the formats apart, and reading ids
// at a token offset with one pread, converted to int and checked against the vocabulary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llmc {

// `auto`: a file that starts with llm.c's shard magic is a shard (its header must then be valid: version 1, the exact
// size); anything else is an OLMo token file.
enum class DataFormat { auto_detect, llmc, olmo };
enum class TokenDtype { uint8, uint16, uint32, uint64 };

const char* data_format_name(DataFormat format);  // "auto", "llmc", "olmo"
const char* token_dtype_name(TokenDtype dtype);   // "uint8" ... "uint64"
size_t token_dtype_bytes(TokenDtype dtype);
uint64_t token_dtype_max(TokenDtype dtype);       // the largest id the type holds
// Parse a name as the config keys and tools spell it; throws "<where>: ..." listing the choices.
DataFormat parse_data_format(const std::string& name, const std::string& where);
TokenDtype parse_token_dtype(const std::string& name, const std::string& where);

// The files a data key names, in the order they are read: `@FILE` reads paths from FILE, one a line (blank lines
// and lines starting with '#' skipped; a relative path is relative to FILE's directory; a line with * ? or [ is a
// glob, expanded sorted), in the order given; anything else is a glob, expanded sorted. Throws "<spec>: ..." when
// it names no file.
std::vector<std::string> data_files(const std::string& spec);

// True when the regular file `path` starts with the llm.c shard magic (20240520). Such a file claims to be a shard:
// read_shard_header then checks its version and size, so a truncated shard gets the shard's error instead of being
// read as raw tokens (an OLMo file that starts with those 4 bytes would hold ids 55432 and 308 in uint16, or
// 20240520 in uint32: no real vocabulary's). Throws only for a file that cannot be opened.
bool has_shard_magic(const std::string& path);

// One format for a set of files: `format` itself unless auto, else the format every file is detected as. A set that
// mixes the two throws naming a file of each; `spec` names the set in messages.
DataFormat resolve_data_format(const std::vector<std::string>& paths, DataFormat format, const std::string& spec);

// Validates an OLMo token file (a regular file, not empty, a whole number of `dtype` items) and returns its tokens.
size_t olmo_file_tokens(const std::string& path, TokenDtype dtype);

// Reads ids from one open token file at token offsets: `header_bytes` before the first token (1024 for an llm.c
// shard, 0 for an OLMo file), ids of `dtype`. One pread per call, then a conversion to int; an id at or above
// vocab_size throws "<path>: token id N at position P is out of range (vocab_size V)".
class TokenReader {
public:
    TokenReader() = default;
    TokenReader(const std::string& path, size_t header_bytes, TokenDtype dtype);
    ~TokenReader();
    TokenReader(TokenReader&& other) noexcept;
    TokenReader& operator=(TokenReader&& other) noexcept;
    TokenReader(const TokenReader&) = delete;
    TokenReader& operator=(const TokenReader&) = delete;

    void read(uint64_t first, std::span<int> out, int vocab_size);
    const std::string& path() const { return path_; }
    bool is_open() const { return fd_ >= 0; }

private:
    int fd_ = -1;
    std::string path_;
    size_t header_bytes_ = 0;
    TokenDtype dtype_ = TokenDtype::uint16;
    std::vector<std::byte> bytes_;
};

// Appends `ids` to `out` as little-endian items of `dtype` (what an OLMo token file holds). An id the type cannot
// hold throws "<path>: token id N at position P does not fit uint16"; `first` is the position of ids[0].
void append_token_bytes(std::span<const uint32_t> ids, TokenDtype dtype, const std::string& path, uint64_t first,
                        std::vector<std::byte>& out);
// Writes `ids` as an OLMo token file of `dtype`, atomically.
void write_olmo_file(const std::string& path, std::span<const uint32_t> ids, TokenDtype dtype);

}  // namespace llmc
