// Feeds (inputs, targets) batches from token files to one data-parallel rank: llm.c shards or OLMo token files
// (token_files.h), one format per data set.
//
// llm.c shards: each shard is cut into windows of B*T+1 tokens that start every B*T tokens (consecutive windows
// share one token: the last target of one is the first input of the next, as in llm.c). Windows are dealt out in
// groups of `world` — one global step's worth — and rank r takes the r-th window of each group.
//
// OLMo files, read as OLMo reads them: each file is cut into instances of T tokens (the remainder dropped), and a
// row is one instance, whole: inputs = its T tokens, targets[t] = instance[t+1] for t < T-1 and targets[T-1] = -1,
// "no target" (kNoTarget, llmc/base/targets.h: OLMo predicts input_ids[1:] and drops the last position's logit;
// the models' loss skips it). A group is world*B instances of one file, and rank r takes instances
// order[(g*world + r)*B + b], b < B.
//
// Either way ranks read disjoint data and together cover what one rank with world*B sequences would; what does not
// fill a group is skipped. With shuffle on, file order and the window (instance) order inside each file are
// permuted afresh every epoch from (seed, epoch, file), over all of a file's windows whatever the number of ranks
// (so a resume on another number of ranks, reslice(), continues the same order); without it, files in the order given and everything in
// order. The position (epoch, shard, group) is all the state, so a checkpoint restores the exact stream.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmc/data/token_files.h"

namespace llmc {

struct DataPosition {
    uint64_t epoch = 0;
    uint64_t shard = 0;  // index into this epoch's shard order
    uint64_t group = 0;  // next window group within the shard
    bool operator==(const DataPosition&) const = default;
};

// What a checkpoint keeps of the training shards, so that a resume on other files is refused (a data position
// means nothing there): their number, their tokens, and a hash of their file names and token counts (not their
// directory: moved data still resumes) and, for OLMo files, of the format and dtype (the same files read as other
// ids are other data; llm.c shards hash as before, so their older checkpoints still resume).
struct DataFingerprint {
    uint64_t shards = 0, tokens = 0, hash = 0;
    bool operator==(const DataFingerprint&) const = default;
};

class DataLoader {
public:
    // `pattern`: a glob or @list file (data_files). Validates every file up front (llm.c: magic, version, size;
    // OLMo: not empty, whole items, at least one instance); token ids are checked as they are read. `format` auto
    // detects it from the files; `dtype` is that of OLMo files (llm.c shards hold uint16).
    DataLoader(const std::string& pattern, int batch_size, int seq_len, int rank, int world, bool shuffle,
               uint64_t seed, int vocab_size, DataFormat format = DataFormat::auto_detect,
               TokenDtype dtype = TokenDtype::uint16);

    // Fills inputs/targets (each batch_size*seq_len) and advances; wraps to the next epoch after the last shard.
    void next_batch(std::span<int> inputs, std::span<int> targets);
    void reset();  // back to epoch 0, first shard, first group

    DataPosition position() const { return pos_; }
    void set_position(const DataPosition& position);  // throws if out of range for these shards
    // Global window groups (optimizer micro-steps of all ranks) per epoch.
    uint64_t groups_per_epoch() const { return groups_per_epoch_; }
    uint64_t total_tokens() const { return total_tokens_; }
    size_t num_shards() const { return shards_.size(); }
    DataFormat format() const { return format_; }  // llmc or olmo (auto resolved)
    DataFingerprint fingerprint() const;
    // Elastic resume: the position of this loader (its number of ranks) that continues a run of `old_world` ranks
    // saved at `old`: the same epoch and shard, after the windows the old ranks consumed there, rounded up to a
    // whole group of this loader's ranks (`skipped` windows, 0 when they divide the count; none is ever read twice).
    struct Reslice {
        DataPosition position;
        uint64_t skipped = 0;
    };
    Reslice reslice(const DataPosition& old, int old_world) const;

private:
    struct Shard {
        std::string path;
        uint64_t num_tokens;
        uint64_t num_groups;
        uint64_t num_windows;  // llm.c: windows of B*T+1; OLMo: instances of T
    };
    uint64_t shard_at_order(const DataPosition& p) const;  // the shard at p.shard of p.epoch's order
    void start_shard();  // builds the window order of the current shard
    uint64_t shard_at(uint64_t order_index) const;
    TokenReader& reader_for(const Shard& s);  // the open file of the shard being read

    std::vector<Shard> shards_;
    int B_, T_, rank_, world_, vocab_size_;
    bool shuffle_;
    uint64_t seed_;
    DataFormat format_;
    TokenDtype dtype_;
    uint64_t groups_per_epoch_ = 0, total_tokens_ = 0;
    DataPosition pos_;
    std::vector<uint64_t> shard_order_;   // this epoch's shard order
    std::vector<uint64_t> window_order_;  // this shard's window (OLMo: instance) order
    std::vector<int> buffer_;             // an llm.c window of B*T+1 tokens, or B OLMo instances
    TokenReader reader_;
    bool trace_windows_ = false;  // LLMC_TRACE_WINDOWS set: each batch's first window to stderr (the elastic test)
};

}  // namespace llmc
