// XXH64 checksums of checkpoint files. A checkpoint's COMPLETE marker records each file's size and XXH64, so a
// resume finds a flipped bit, a truncated copy or a file from another checkpoint before training on it. XXH64
// (the xxHash specification's 64-bit variant, seed 0) because it hashes at memory speed, so checking a 1B
// model's gigabytes adds a fraction of the time it takes to read them, and because `xxhsum -H64` prints the
// same value: a user can check a copied checkpoint by hand, and the tests check this code against it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace llmc {

// Streaming XXH64: update() with the bytes in any pieces, then digest(). update() may continue after digest().
class Xxh64 {
public:
    void update(const void* data, size_t n);
    void update(std::span<const std::byte> bytes) { update(bytes.data(), bytes.size()); }
    uint64_t digest() const;
    uint64_t length() const { return length_; }

private:
    static constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL, kPrime2 = 0xC2B2AE3D27D4EB4FULL;
    uint64_t lanes_[4] = {kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1};  // seed 0
    unsigned char pending_[32] = {};  // the start of a 32-byte stripe not yet mixed into the lanes
    size_t pending_size_ = 0;
    uint64_t length_ = 0;
};

// A file's size and XXH64, as a checkpoint marker records them.
struct FileDigest {
    uint64_t bytes = 0;
    uint64_t xxh64 = 0;
    bool operator==(const FileDigest&) const = default;
    std::string hex() const;  // 16 lowercase hex digits, as `xxhsum -H64` prints them
};

// Reads `path` to its end and returns its digest; throws "<path>: ..." when it cannot be read.
FileDigest digest_file(const std::string& path);
// The digest of bytes already in memory (a file read whole).
FileDigest digest_bytes(std::span<const std::byte> bytes);

}  // namespace llmc
