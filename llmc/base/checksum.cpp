// XXH64 and file digests (see checksum.h). The constants and the mixing steps are the xxHash specification's.
#include "llmc/base/checksum.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llmc/base/fileio.h"

namespace llmc {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL,
                   kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t read64(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian, as every supported machine is
    return v;
}
uint32_t read32(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t mix_round(uint64_t lane, uint64_t input) { return rotl(lane + input * kP2, 31) * kP1; }
uint64_t merge(uint64_t h, uint64_t lane) { return (h ^ mix_round(0, lane)) * kP1 + kP4; }

void mix_stripe(uint64_t* lanes, const unsigned char* p) {
    lanes[0] = mix_round(lanes[0], read64(p));
    lanes[1] = mix_round(lanes[1], read64(p + 8));
    lanes[2] = mix_round(lanes[2], read64(p + 16));
    lanes[3] = mix_round(lanes[3], read64(p + 24));
}
}  // namespace

void Xxh64::update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += n;
    if (pending_size_ > 0) {
        const size_t take = std::min(n, sizeof pending_ - pending_size_);
        std::memcpy(pending_ + pending_size_, p, take);
        pending_size_ += take;
        p += take;
        n -= take;
        if (pending_size_ < sizeof pending_) return;
        mix_stripe(lanes_, pending_);
        pending_size_ = 0;
    }
    for (; n >= 32; p += 32, n -= 32) mix_stripe(lanes_, p);
    std::memcpy(pending_, p, n);
    pending_size_ = n;
}

uint64_t Xxh64::digest() const {
    uint64_t h;
    if (length_ >= 32) {
        h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
        for (const uint64_t lane : lanes_) h = merge(h, lane);
    } else {
        h = kP5;  // seed 0
    }
    h += length_;
    const unsigned char* p = pending_;
    size_t n = pending_size_;
    for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ mix_round(0, read64(p)), 27) * kP1 + kP4;
    if (n >= 4) {
        h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * kP1), 23) * kP2 + kP3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) h = rotl(h ^ (*p * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
}

std::string FileDigest::hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(xxh64));
    return text;
}

FileDigest digest_bytes(std::span<const std::byte> bytes) {
    Xxh64 hash;
    hash.update(bytes);
    return {hash.length(), hash.digest()};
}

FileDigest digest_file(const std::string& path) {
    File f(path, "rb");
    std::vector<unsigned char> block(8 << 20);
    Xxh64 hash;
    for (size_t got; (got = std::fread(block.data(), 1, block.size(), f.get())) > 0;) hash.update(block.data(), got);
    LLMC_CHECK(!std::ferror(f.get()),
               path + ": read failed while checking its checksum (" + std::strerror(errno) + ")");
    return {hash.length(), hash.digest()};
}

}  // namespace llmc
