// LocalTransport's out-of-line pieces (see transport.h).
#include "llmc/comm/transport.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

Transport::~Transport() {
    if (parent_) std::erase(parent_->children_, this);
    for (Transport* child : children_) child->parent_ = nullptr;
}

std::unique_ptr<Transport> Transport::split(int color, int key, Link link) {
    std::unique_ptr<Transport> child = split_group(color, key);
    child->link_ = link;
    child->parent_ = this;
    children_.push_back(child.get());
    child->set_collective_timeout(timeout_seconds_);
    return child;
}

std::unique_ptr<Transport> Transport::split_group(int, int) {
    fail("the " + std::string(name()) + " transport cannot form groups of ranks (--shard_group_size)");
}

void Transport::check_group_offsets(std::span<const size_t> offsets, size_t size, const char* what) const {
    const size_t W = static_cast<size_t>(world_size());
    bool ok = offsets.size() == W + 1 && offsets[0] == 0 && offsets[W] == size;
    for (size_t r = 0; ok && r < W; r++) ok = offsets[r] <= offsets[r + 1];
    LLMC_CHECK(ok, std::string(name()) + " " + what + ": the offsets do not cut the buffer into one range per rank");
}

void Transport::reduce_scatter_mean(std::span<float>, std::span<const size_t>) {
    fail("the " + std::string(name()) + " transport has no reduce-scatter (--shard_group_size)");
}

void Transport::allgather_inplace(std::span<std::byte>, std::span<const size_t>) {
    fail("the " + std::string(name()) + " transport has no in-place all-gather (--shard_group_size)");
}

namespace {
void add_counters(CommCounters& into, const CommCounters& c) {
    into.bytes_sent += c.bytes_sent;
    into.bytes_sent_intra += c.bytes_sent_intra;
    into.bytes_sent_inter += c.bytes_sent_inter;
    into.bytes_recv += c.bytes_recv;
    into.payload_bytes += c.payload_bytes;
    into.seconds += c.seconds;
    into.collectives += c.collectives;
    into.size_exchanges += c.size_exchanges;
}
}  // namespace

CommCounters Transport::counters() const {
    CommCounters total = counters_;
    (link_ == Link::intra ? total.bytes_sent_intra : total.bytes_sent_inter) = counters_.bytes_sent;
    for (const Transport* child : children_) add_counters(total, child->counters());
    return total;
}

void Transport::reset_counters() {
    counters_ = CommCounters{};
    for (Transport* child : children_) child->reset_counters();
}

void Transport::allreduce_mean_bf16(std::span<float>) {
    fail("--grad_wire bf16 is not supported by the " + std::string(name()) + " transport");
}

void Transport::allreduce_mean_start(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16) {
    const std::string who = std::string(name()) + " transport, overlapped all-reduce: ";
    LLMC_CHECK(overlap_elems_ == 0 || (base == overlap_base_ && total == overlap_total_ && bf16 == overlap_bf16_),
               who + "one finish() covers one buffer in one wire format");
    size_t elems = 0;
    for (const ParamRange& r : ranges) {
        LLMC_CHECK(r.offset + r.numel <= total, who + "a range lies outside the buffer");
        elems += r.numel;
    }
    overlap_base_ = base;
    overlap_total_ = total;
    overlap_bf16_ = bf16;
    overlap_elems_ += elems;
    overlap_starts_++;
    start_allreduce_ranges(base, total, ranges, bf16, elems);
}

void Transport::allreduce_mean_finish() {
    const size_t elems = overlap_elems_;
    overlap_elems_ = 0;
    overlap_starts_ = 0;
    finish_allreduce_ranges(elems, overlap_bf16_);
}

void Transport::allreduce_mean_wait(size_t starts) {
    LLMC_CHECK(starts <= overlap_starts_, std::string(name()) + " transport, overlapped all-reduce: waiting for " +
                                              std::to_string(starts) + " starts, but only " +
                                              std::to_string(overlap_starts_) + " began since the last finish()");
    wait_allreduce_ranges(starts);
}

void Transport::start_allreduce_ranges(float* base, size_t, std::span<const ParamRange> ranges, bool bf16, size_t) {
    for (const ParamRange& r : ranges) {
        if (bf16) allreduce_mean_bf16(std::span<float>(base + r.offset, r.numel));
        else allreduce_mean(std::span<float>(base + r.offset, r.numel));
    }
}

void Transport::allgather_bytes_start(std::span<const std::byte> mine, GatherSizes sizes) {
    LLMC_CHECK(!gather_in_flight_, std::string(name()) + " transport: an all-gather was started while another is in flight");
    allgather_bytes(mine, early_all_, early_offsets_, sizes);
    gather_in_flight_ = true;
}

void Transport::allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) {
    LLMC_CHECK(gather_in_flight_, std::string(name()) + " transport: all-gather finished without a start");
    gather_in_flight_ = false;
    all.swap(early_all_);
    offsets.swap(early_offsets_);
}

template <typename T, class Reduce>
void Transport::start_early(EarlyReduction<T>& r, std::span<const T> values, Reduce reduce, const char* kind) {
    LLMC_CHECK(!r.in_flight, std::string(name()) + " transport: " + kind + " was started while another is in flight");
    r.values.assign(values.begin(), values.end());
    reduce(std::span<T>(r.values));
    r.in_flight = true;
}

template <typename T>
void Transport::finish_early(EarlyReduction<T>& r, std::span<T> values, const char* kind) {
    LLMC_CHECK(r.in_flight && values.size() == r.values.size(),
               std::string(name()) + " transport: " + kind + " finished without its start, or with another count");
    r.in_flight = false;
    std::copy(r.values.begin(), r.values.end(), values.begin());
}

void Transport::allreduce_sum_start(std::span<const double> values) {
    start_early(early_sum_, values, [this](std::span<double> v) { allreduce_sum(v); }, "a sum");
}
void Transport::allreduce_sum_finish(std::span<double> values) { finish_early(early_sum_, values, "a sum"); }
void Transport::allreduce_or_start(std::span<const uint64_t> bits) {
    start_early(early_or_, bits, [this](std::span<uint64_t> v) { allreduce_or(v); }, "an OR");
}
void Transport::allreduce_or_finish(std::span<uint64_t> bits) { finish_early(early_or_, bits, "an OR"); }

void LocalTransport::abort(int exit_code) { std::exit(exit_code); }

}  // namespace llmc
