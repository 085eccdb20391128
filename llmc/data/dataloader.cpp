// Rank-sliced, optionally shuffled reading of llm.c token shards and OLMo token files (see dataloader.h).
#include "llmc/data/dataloader.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/base/targets.h"
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
                       uint64_t seed, int vocab_size, DataFormat format, TokenDtype dtype)
    : B_(batch_size), T_(seq_len), rank_(rank), world_(world), vocab_size_(vocab_size), shuffle_(shuffle),
      seed_(seed) {
    trace_windows_ = std::getenv("LLMC_TRACE_WINDOWS") != nullptr;
    LLMC_CHECK(B_ > 0 && T_ > 0 && world_ > 0 && rank_ >= 0 && rank_ < world_,
               "data loader: invalid batch/rank parameters");
    const std::vector<std::string> paths = data_files(pattern);
    format_ = resolve_data_format(paths, format, pattern);
    dtype_ = format_ == DataFormat::llmc ? TokenDtype::uint16 : dtype;
    const uint64_t window_stride = static_cast<uint64_t>(B_) * T_;
    const uint64_t group_instances = static_cast<uint64_t>(B_) * world_;  // OLMo: a group's instances
    for (const std::string& path : paths) {
        uint64_t ntok = 0, groups = 0, windows = 0;
        if (format_ == DataFormat::llmc) {
            ntok = read_shard_header(path);
            windows = ntok > window_stride ? (ntok - 1) / window_stride : 0;
            groups = windows / world_;
        } else {
            ntok = olmo_file_tokens(path, dtype_);
            LLMC_CHECK(ntok >= static_cast<uint64_t>(T_),
                       path + ": " + std::to_string(ntok) + " tokens, fewer than one instance of seq_len " +
                           std::to_string(T_) + " (a file too small, or another --memmap_dtype?)");
            groups = ntok / T_ / group_instances;
            windows = ntok / T_;
        }
        shards_.push_back({path, ntok, groups, windows});
        groups_per_epoch_ += groups;
        total_tokens_ += ntok;
    }
    if (format_ == DataFormat::llmc)
        LLMC_CHECK(groups_per_epoch_ > 0, pattern + ": shards too small: no shard holds " + std::to_string(world_) +
                                              " windows of B*T+1 = " + std::to_string(window_stride + 1) +
                                              " tokens (lower --batch_size/--seq_len or add data)");
    else
        LLMC_CHECK(groups_per_epoch_ > 0, pattern + ": files too small: no file holds ranks*B = " +
                                              std::to_string(group_instances) + " instances of seq_len " +
                                              std::to_string(T_) +
                                              " tokens (lower --batch_size/--seq_len or add data)");
    buffer_.resize(window_stride + (format_ == DataFormat::llmc));  // llm.c: a window of B*T+1; OLMo: B instances
    reset();
}

DataFingerprint DataLoader::fingerprint() const {
    DataFingerprint f{shards_.size(), total_tokens_, 0xcbf29ce484222325ull};  // FNV-1a over names and counts
    auto add = [&](const void* p, size_t n) {
        for (size_t i = 0; i < n; i++) f.hash = (f.hash ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
    };
    if (format_ == DataFormat::olmo) {  // llm.c shards hash as they did before OLMo files: their checkpoints resume
        const std::string tag = std::string("olmo ") + token_dtype_name(dtype_);
        add(tag.data(), tag.size() + 1);
    }
    for (const Shard& s : shards_) {
        const std::string name = s.path.substr(s.path.find_last_of('/') + 1);  // npos + 1 == 0: no directory
        add(name.data(), name.size() + 1);  // with its terminating zero: "ab" + "c" differs from "a" + "bc"
        add(&s.num_tokens, sizeof s.num_tokens);
    }
    return f;
}

uint64_t DataLoader::shard_at(uint64_t order_index) const { return shard_order_[order_index]; }

TokenReader& DataLoader::reader_for(const Shard& s) {
    if (!reader_.is_open() || reader_.path() != s.path)
        reader_ = TokenReader(s.path, format_ == DataFormat::llmc ? kHeaderBytes : 0, dtype_);
    return reader_;
}

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
    // every window (OLMo: instance), not only those of whole groups: a shuffle reaches the remainder that does not
    // fill a group in other epochs, and the order does not depend on the number of ranks, so an elastic resume
    // (reslice) continues the same order (with whole groups only, llm.c shards were permuted over
    // num_groups * world windows: the same order when the ranks divide the shard's windows)
    window_order_.resize(s.num_windows);
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
    TokenReader& reader = reader_for(s);
    if (format_ == DataFormat::llmc) {
        const uint64_t window = window_order_[pos_.group * world_ + rank_];
        reader.read(window * n, buffer_, vocab_size_);
        for (size_t i = 0; i < n; i++) {
            inputs[i] = buffer_[i];
            targets[i] = buffer_[i + 1];
        }
    } else {
        const uint64_t* order = window_order_.data() + (pos_.group * world_ + rank_) * B_;
        const size_t T = static_cast<size_t>(T_);
        // in order (no shuffle), this rank's B instances are one stretch of the file: one read
        bool contiguous = true;
        for (int b = 1; b < B_; b++) contiguous = contiguous && order[b] == order[b - 1] + 1;
        if (contiguous) reader.read(order[0] * T, buffer_, vocab_size_);
        for (int b = 0; b < B_; b++) {
            const int* row = buffer_.data() + b * T;
            if (!contiguous) reader.read(order[b] * T, std::span(buffer_).subspan(b * T, T), vocab_size_);
            // one fused loop, as for llm.c's windows: a std::copy of the shifted row became a memmove that ran at a
            // third of the speed (rep movsb on a misaligned source)
            int* x = inputs.data() + b * T;
            int* y = targets.data() + b * T;
            for (size_t t = 0; t + 1 < T; t++) {
                x[t] = row[t];
                y[t] = row[t + 1];
            }
            x[T - 1] = row[T - 1];
            y[T - 1] = kNoTarget;  // the last position predicts nothing (OLMo drops its logit)
        }
    }
    if (trace_windows_)
        std::fprintf(stderr, "llmc window: %s epoch %llu window %llu rank %d\n", s.path.c_str(),
                     static_cast<unsigned long long>(pos_.epoch),
                     static_cast<unsigned long long>(format_ == DataFormat::llmc ? window_order_[pos_.group * world_ + rank_]
                                                                                 : window_order_[(pos_.group * world_ + rank_) * B_]),
                     rank_);
    pos_.group++;
}

DataLoader::Reslice DataLoader::reslice(const DataPosition& old, int old_world) const {
    LLMC_CHECK(old.shard < shards_.size(), "data position: shard " + std::to_string(old.shard) + " out of range");
    // the old ranks had consumed the first old.group * old_world entries (OLMo: their B-instance blocks) of this
    // shard's window order, which does not depend on the number of ranks
    const uint64_t consumed = old.group * static_cast<uint64_t>(old_world);
    Reslice r;
    r.position = old;
    r.position.group = (consumed + world_ - 1) / world_;  // up to a whole group of the new ranks: never a repeat
    r.skipped = r.position.group * world_ - consumed;
    // past this shard's last whole group of the new ranks: the next shard (as next_batch would move on)
    r.position.group = std::min<uint64_t>(r.position.group, shards_[shard_at_order(old)].num_groups);
    return r;
}

uint64_t DataLoader::shard_at_order(const DataPosition& p) const {
    if (!shuffle_) return p.shard;
    std::vector<uint64_t> order(shards_.size());
    std::iota(order.begin(), order.end(), 0);
    Rng rng(mix(seed_, p.epoch, UINT64_MAX));
    shuffle_in_place(order, rng);
    return order[p.shard];
}

}  // namespace llmc
