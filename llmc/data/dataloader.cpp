// Rank-sliced, optionally shuffled reading of llm.c token shards (see dataloader.h).
#include "llmc/data/dataloader.h"

#include <numeric>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/data/token_shard.h"

namespace llmc {

namespace {
// Fisher-Yates with our own RNG, so the order is the same on every platform and library version.
void shuffle_in_place(std::vector<uint64_t>& v, Rng& rng) {
    for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[rng.below(i)]);
}
uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
    return seed * 0x9E3779B97F4A7C15ull ^ (a + 1) * 0xC2B2AE3D27D4EB4Full ^ (b + 1) * 0x165667B19E3779F9ull;
}
}  // namespace

DataLoader::DataLoader(const std::string& pattern, int batch_size, int seq_len, int rank, int world, bool shuffle,
                       uint64_t seed, int vocab_size)
    : B_(batch_size), T_(seq_len), rank_(rank), world_(world), vocab_size_(vocab_size), shuffle_(shuffle),
      seed_(seed) {
    LLMC_CHECK(B_ > 0 && T_ > 0 && world_ > 0 && rank_ >= 0 && rank_ < world_,
               "data loader: invalid batch/rank parameters");
    const uint64_t window_stride = static_cast<uint64_t>(B_) * T_;
    for (const std::string& path : glob_files(pattern)) {
        const uint64_t ntok = read_shard_header(path);
        const uint64_t windows = ntok > window_stride ? (ntok - 1) / window_stride : 0;
        const uint64_t groups = windows / world_;
        shards_.push_back({path, ntok, groups});
        groups_per_epoch_ += groups;
        total_tokens_ += ntok;
    }
    LLMC_CHECK(groups_per_epoch_ > 0,
               pattern + ": shards too small: no shard holds " + std::to_string(world_) + " windows of B*T+1 = " +
                   std::to_string(window_stride + 1) + " tokens (lower --batch_size/--seq_len or add data)");
    buffer_.resize(window_stride + 1);
    reset();
}

DataFingerprint DataLoader::fingerprint() const {
    DataFingerprint f{shards_.size(), total_tokens_, 0xcbf29ce484222325ull};  // FNV-1a over names and counts
    auto add = [&](const void* p, size_t n) {
        for (size_t i = 0; i < n; i++) f.hash = (f.hash ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
    };
    for (const Shard& s : shards_) {
        const std::string name = s.path.substr(s.path.find_last_of('/') + 1);  // npos + 1 == 0: no directory
        add(name.data(), name.size() + 1);  // with its terminating zero: "ab" + "c" differs from "a" + "bc"
        add(&s.num_tokens, sizeof s.num_tokens);
    }
    return f;
}

uint64_t DataLoader::shard_at(uint64_t order_index) const { return shard_order_[order_index]; }

void DataLoader::reset() { set_position(DataPosition{}); }

void DataLoader::set_position(const DataPosition& position) {
    LLMC_CHECK(position.shard < shards_.size(), "data position: shard " + std::to_string(position.shard) +
                                                    " out of range (" + std::to_string(shards_.size()) +
                                                    " shards match the pattern now)");
    pos_ = position;
    shard_order_.resize(shards_.size());
    std::iota(shard_order_.begin(), shard_order_.end(), 0);
    if (shuffle_) {
        Rng rng(mix(seed_, pos_.epoch, UINT64_MAX));
        shuffle_in_place(shard_order_, rng);
    }
    start_shard();
    LLMC_CHECK(pos_.group <= shards_[shard_at(pos_.shard)].num_groups,
               "data position: batch group out of range for " + shards_[shard_at(pos_.shard)].path);
}

void DataLoader::start_shard() {
    const Shard& s = shards_[shard_at(pos_.shard)];
    window_order_.resize(s.num_groups * world_);
    std::iota(window_order_.begin(), window_order_.end(), 0);
    if (shuffle_) {
        Rng rng(mix(seed_, pos_.epoch, shard_at(pos_.shard)));
        shuffle_in_place(window_order_, rng);
    }
}

void DataLoader::next_batch(std::span<int> inputs, std::span<int> targets) {
    const size_t n = static_cast<size_t>(B_) * T_;
    LLMC_CHECK(inputs.size() == n && targets.size() == n, "data loader: batch buffers have the wrong size");
    // Skip exhausted (or too small) shards, wrapping to a new epoch after the last one.
    while (pos_.group >= shards_[shard_at(pos_.shard)].num_groups) {
        pos_.group = 0;
        if (++pos_.shard == shards_.size()) {
            DataPosition next{pos_.epoch + 1, 0, 0};
            set_position(next);
        } else {
            start_shard();
        }
    }
    const Shard& s = shards_[shard_at(pos_.shard)];
    const uint64_t window = window_order_[pos_.group * world_ + rank_];
    read_shard_tokens(s.path, window * n, buffer_, vocab_size_);
    for (size_t i = 0; i < n; i++) {
        inputs[i] = buffer_[i];
        targets[i] = buffer_[i + 1];
    }
    pos_.group++;
}

}  // namespace llmc
