// LocalTransport's out-of-line pieces (see transport.h).
#include "llmc/comm/transport.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

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
