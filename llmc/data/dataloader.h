// Feeds (inputs, targets) batches from llm.c token shards to one data-parallel rank.
//
// Each shard is cut into windows of B*T+1 tokens that start every B*T tokens (consecutive windows share one
// token: the last target of one is the first input of the next, as in llm.c). Windows are dealt out in
// groups of `world` — one global step's worth — and rank r takes the r-th window of each group, so ranks
// read disjoint data and together cover what one rank with world*B sequences would. Leftover windows that
// do not fill a group are skipped. With shuffle on, shard order and the window order inside each shard are
// permuted afresh every epoch from (seed, epoch, shard); without it, everything is sequential. The position
// (epoch, shard, group) is all the state, so a checkpoint restores the exact stream.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llmc {

struct DataPosition {
    uint64_t epoch = 0;
    uint64_t shard = 0;  // index into this epoch's shard order
    uint64_t group = 0;  // next window group within the shard
    bool operator==(const DataPosition&) const = default;
};

// What a checkpoint keeps of the training shards, so that a resume on other files is refused (a data position
// means nothing there): their number, their tokens, and a hash of their file names and token counts (not their
// directory: moved data still resumes).
struct DataFingerprint {
    uint64_t shards = 0, tokens = 0, hash = 0;
    bool operator==(const DataFingerprint&) const = default;
};

class DataLoader {
public:
    // Validates every shard header up front (magic, version, size); token ids are checked as they are read.
    DataLoader(const std::string& pattern, int batch_size, int seq_len, int rank, int world, bool shuffle,
               uint64_t seed, int vocab_size);

    // Fills inputs/targets (each batch_size*seq_len) and advances; wraps to the next epoch after the last shard.
    void next_batch(std::span<int> inputs, std::span<int> targets);
    void reset();  // back to epoch 0, first shard, first group

    DataPosition position() const { return pos_; }
    void set_position(const DataPosition& position);  // throws if out of range for these shards
    // Global window groups (optimizer micro-steps of all ranks) per epoch.
    uint64_t groups_per_epoch() const { return groups_per_epoch_; }
    uint64_t total_tokens() const { return total_tokens_; }
    size_t num_shards() const { return shards_.size(); }
    DataFingerprint fingerprint() const;

private:
    struct Shard {
        std::string path;
        uint64_t num_tokens;
        uint64_t num_groups;
    };
    void start_shard();  // builds the window order of the current shard
    uint64_t shard_at(uint64_t order_index) const;

    std::vector<Shard> shards_;
    int B_, T_, rank_, world_, vocab_size_;
    bool shuffle_;
    uint64_t seed_;
    uint64_t groups_per_epoch_ = 0, total_tokens_ = 0;
    DataPosition pos_;
    std::vector<uint64_t> shard_order_;   // this epoch's shard order
    std::vector<uint64_t> window_order_;  // this shard's window order
    std::vector<uint16_t> buffer_;
};

}  // namespace llmc
