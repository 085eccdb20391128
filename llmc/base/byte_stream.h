// Sequential reading of an input file that may be compressed, for prepro_gpt2: public pretraining corpora ship
// as gzip (.gz: Dolma, The Pile's mirrors) or Zstandard (.zst: RedPajama, SlimPajama) JSON Lines, and
// decompressing them to disk first would need several times their size. The compression is chosen by the name's
// suffix; files of several gzip members or Zstandard frames (as `cat a.gz b.gz` makes) read as their
// concatenation, as gzip and zstd do. Errors name the file: corrupt data, a stream cut short, garbage after it.
// Link with -lz -lzstd (only prepro_gpt2 uses it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace llmc {

enum class Compression { none, gzip, zstd };

// By the suffix: ".gz" gzip, ".zst" Zstandard, anything else none.
Compression compression_of(std::string_view path);
// The name without its compression suffix ("a.jsonl.zst" -> "a.jsonl"), which says what the content is.
std::string_view content_name(std::string_view path);

class ByteStream {
public:
    explicit ByteStream(const std::string& path);  // throws "<path>: cannot open (<reason>)"
    ~ByteStream();
    ByteStream(const ByteStream&) = delete;
    ByteStream& operator=(const ByteStream&) = delete;

    // Up to n bytes of the (decompressed) content into out; 0 only at its end. Throws for corrupt or cut data.
    size_t read(void* out, size_t n);
    // Reads and drops n bytes; throws when the content ends before them.
    void skip(uint64_t n);
    // Bytes of content returned or skipped so far.
    uint64_t position() const { return position_; }
    const std::string& path() const { return path_; }

private:
    struct Decoder;  // the file and the decompressor's state

    std::string path_;
    uint64_t position_ = 0;
    std::unique_ptr<Decoder> decoder_;
};

// The whole (decompressed) content of a file; throws "<path>: larger than N bytes" past max_bytes (a device or
// pipe may never end).
std::string read_all_content(const std::string& path, size_t max_bytes = SIZE_MAX);

}  // namespace llmc
