// VirtualRanks and its endpoints (see transport_virtual.h): the lanes' rendezvous, and each collective as lane 0
// computes it for P*V ranks, with MpiTransport's arithmetic and the byte counters of a P*V ring.
#include "llmc/comm/transport_virtual.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "llmc/base/kernel_math.h"

namespace llmc {

namespace {

enum Kind { kMean = 1, kMeanBf16, kGather, kSum, kMax, kOr, kBroadcast, kBarrier };

// The most bytes of one process's lanes that one real all-gather of a fold carries (MPI counts in int).
constexpr size_t kFoldBytes = size_t{1} << 28;

// Wall time and the count of one collective into the counters.
class Timer {
public:
    Timer(CommCounters& c, bool counts) : c_(c), counts_(counts), start_(std::chrono::steady_clock::now()) {}
    ~Timer() {
        c_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (counts_) c_.collectives++;
    }

private:
    CommCounters& c_;
    bool counts_;
    std::chrono::steady_clock::time_point start_;
};

// body(begin, len, from): from[r] points at global rank r's elements [begin, begin + len) of the lanes' equal-length
// buffers `lanes` (this process's, lane v = rank p*V + v). With P > 1 the other processes' come from a real
// all-gather of this process's lanes, a slice at a time. body may write the lanes' elements it has read.
template <typename T, class Body>
void for_each_slice(Transport& real, const std::vector<T*>& lanes, size_t n, Body body) {
    const size_t V = lanes.size(), P = static_cast<size_t>(real.world_size());
    std::vector<const T*> from(P * V);
    if (P == 1) {
        for (size_t v = 0; v < V; v++) from[v] = lanes[v];
        body(size_t{0}, n, from);
        return;
    }
    const size_t slice = std::max<size_t>(1, kFoldBytes / (V * sizeof(T)));
    std::vector<std::byte> mine, all;
    std::vector<size_t> offsets;
    for (size_t begin = 0; begin < n; begin += slice) {
        const size_t len = std::min(slice, n - begin), bytes = len * sizeof(T);
        mine.resize(V * bytes);
        for (size_t v = 0; v < V; v++) std::memcpy(mine.data() + v * bytes, lanes[v] + begin, bytes);
        real.allgather_bytes(mine, all, offsets, GatherSizes::equal);
        std::vector<T> copy(P * V * len);  // aligned for T
        std::memcpy(copy.data(), all.data(), copy.size() * sizeof(T));
        for (size_t r = 0; r < P * V; r++) from[r] = copy.data() + r * len;
        body(begin, len, from);
    }
}

// lanes[v][i] <- the in-order combination of every rank's element i (MpiTransport::combine_in_rank_order), then
// finish(combined) (the means' scaling).
template <typename T, class Combine, class Finish>
void fold_in_rank_order(Transport& real, const std::vector<T*>& lanes, size_t n, Combine combine, Finish finish) {
    for_each_slice<T>(real, lanes, n, [&](size_t begin, size_t len, const std::vector<const T*>& from) {
        for (size_t i = 0; i < len; i++) {
            T v = from[0][i];
            for (size_t r = 1; r < from.size(); r++) v = combine(v, from[r][i]);
            for (T* lane : lanes) lane[begin + i] = finish(v);
        }
    });
}

uint16_t add_bf16(uint16_t a, uint16_t b) {
    return km::bf16_bits_rne(km::bf16_bits_to_float(a) + km::bf16_bits_to_float(b));
}

}  // namespace

// ---- the group ----

VirtualRanks::VirtualRanks(Transport& real, int lanes) : real_(real), lanes_(lanes), calls_(lanes, nullptr) {
    LLMC_CHECK(lanes >= 1, "--virtual_ranks must be > 0");
    for (int v = 0; v < lanes; v++) endpoints_.push_back(std::make_unique<VirtualTransport>(*this, v));
}

VirtualRanks::~VirtualRanks() = default;

Transport& VirtualRanks::lane(int v) { return *endpoints_.at(static_cast<size_t>(v)); }

void VirtualRanks::abort() {
    {
        std::lock_guard lock(mutex_);
        aborted_ = true;
    }
    arrived_all_.notify_all();
}

void VirtualRanks::throw_aborted() const {
    throw VirtualRanksAborted("virtual ranks: another virtual rank of this process failed");
}

void VirtualRanks::rendezvous() {
    std::unique_lock lock(mutex_);
    if (aborted_) throw_aborted();
    const uint64_t generation = generation_;
    if (++arrived_ == lanes_) {
        arrived_ = 0;
        generation_++;
        arrived_all_.notify_all();
        return;
    }
    arrived_all_.wait(lock, [&] { return generation_ != generation || aborted_; });
    if (generation_ == generation) throw_aborted();
}

template <class Lead>
void VirtualRanks::collective(int lane, const Call& call, Lead lead) {
    calls_[static_cast<size_t>(lane)] = &call;
    rendezvous();
    if (lane == 0) {
        for (const Call* c : calls_)
            if (c->kind != call.kind || c->floats.size() != call.floats.size() ||
                c->doubles.size() != call.doubles.size() || c->bits.size() != call.bits.size() ||
                c->bytes.size() != call.bytes.size() || c->root != call.root) {
                abort();
                fail("internal: virtual ranks: the lanes of a process called different collectives");
            }
        try {
            lead();
        } catch (...) {
            abort();
            throw;
        }
    }
    rendezvous();
}

// ---- an endpoint ----

VirtualTransport::VirtualTransport(VirtualRanks& group, int lane)
    : group_(group), lane_(lane), rank_(group.real().rank() * group.lanes() + lane),
      world_(group.real().world_size() * group.lanes()) {}

void VirtualTransport::configure(const CommOptions& options) {
    if (lane_ == 0) group_.real().configure(options);  // lane 0 alone calls the real transport
}

void VirtualTransport::mean(std::span<float> data, bool bf16) {
    VirtualRanks::Call call;
    call.kind = bf16 ? kMeanBf16 : kMean;
    call.floats = data;
    group_.collective(lane_, call, [&] {
        const size_t n = data.size();
        std::vector<float*> lanes;
        for (const VirtualRanks::Call* c : group_.calls_) lanes.push_back(c->floats.data());
        const float inv = 1.0f / static_cast<float>(world_);
        if (!bf16) {
            fold_in_rank_order<float>(
                group_.real(), lanes, n, [](float a, float b) { return a + b; }, [&](float s) { return s * inv; });
            return;
        }
        // bf16: every value to the wire first (nearest even), the partial sums rounded at every hop
        std::vector<uint16_t> wire(lanes.size() * n);
        std::vector<uint16_t*> wires;
        for (size_t v = 0; v < lanes.size(); v++) {
            wires.push_back(wire.data() + v * n);
            for (size_t i = 0; i < n; i++) wires[v][i] = km::bf16_bits_rne(lanes[v][i]);
        }
        fold_in_rank_order<uint16_t>(group_.real(), wires, n, add_bf16, [](uint16_t s) { return s; });
        for (size_t v = 0; v < lanes.size(); v++)
            for (size_t i = 0; i < n; i++) lanes[v][i] = km::bf16_bits_to_float(wires[v][i]) * inv;
    });
}

// Ring model of an all-reduce of `bytes` (transport.h), as MpiTransport counts it.
void VirtualTransport::count_allreduce(uint64_t bytes) {
    const uint64_t wire = 2 * static_cast<uint64_t>(world_ - 1) * bytes / static_cast<uint64_t>(world_);
    counters_.bytes_sent += wire;
    counters_.bytes_recv += wire;
}

void VirtualTransport::allreduce_mean(std::span<float> data) {
    counters_.payload_bytes += data.size_bytes();
    Timer t(counters_, true);
    const auto watched = watch("virtual ranks: all-reduce of the gradients");
    mean(data, false);
    count_allreduce(data.size_bytes());
}

void VirtualTransport::allreduce_mean_bf16(std::span<float> data) {
    counters_.payload_bytes += data.size_bytes() / 2;
    Timer t(counters_, true);
    const auto watched = watch("virtual ranks: all-reduce of the gradients (bf16)");
    mean(data, true);
    count_allreduce(data.size_bytes() / 2);
}

// The overlapped all-reduce reduces each range at once (every element summed in rank order, so the bits of one
// all-reduce of the buffer) and counts them together in finish, as MpiTransport does.
void VirtualTransport::start_allreduce_ranges(float* base, size_t, std::span<const ParamRange> ranges, bool bf16,
                                              size_t) {
    Timer t(counters_, false);
    const auto watched = watch("virtual ranks: all-reduce of the gradients (start)");
    for (const ParamRange& r : ranges)
        if (r.numel > 0) mean(std::span<float>(base + r.offset, r.numel), bf16);
}

void VirtualTransport::finish_allreduce_ranges(size_t elems, bool bf16) {
    if (elems == 0) return;
    const size_t bytes = elems * (bf16 ? sizeof(uint16_t) : sizeof(float));
    counters_.payload_bytes += bytes;
    counters_.collectives++;
    count_allreduce(bytes);
}

void VirtualTransport::gather(std::span<const std::byte> mine, std::vector<std::byte>& all,
                              std::vector<size_t>& offsets) {
    VirtualRanks::Call call;
    call.kind = kGather;
    call.mine = mine;
    call.all = &all;
    call.offsets = &offsets;
    group_.collective(lane_, call, [&] {
        const auto& calls = group_.calls_;
        const size_t V = calls.size(), P = static_cast<size_t>(group_.real().world_size());
        std::vector<size_t> sizes;  // every rank's, in global rank order
        std::vector<const std::byte*> from;
        std::vector<std::byte> packed, gathered;
        if (P == 1) {
            for (const VirtualRanks::Call* c : calls) {
                sizes.push_back(c->mine.size());
                from.push_back(c->mine.data());
            }
        } else {
            // this process's contribution: its lanes' sizes, then their buffers in lane order
            size_t total = 0;
            for (const VirtualRanks::Call* c : calls) total += c->mine.size();
            packed.resize(V * sizeof(uint64_t) + total);
            size_t at = V * sizeof(uint64_t);
            for (size_t v = 0; v < V; v++) {
                const uint64_t size = calls[v]->mine.size();
                std::memcpy(packed.data() + v * sizeof(uint64_t), &size, sizeof(size));
                if (size > 0) std::memcpy(packed.data() + at, calls[v]->mine.data(), size);
                at += size;
            }
            std::vector<size_t> process_offsets;
            group_.real().allgather_bytes(packed, gathered, process_offsets, GatherSizes::exchange);
            for (size_t q = 0; q < P; q++) {
                const std::byte* block = gathered.data() + process_offsets[q];
                size_t data_at = V * sizeof(uint64_t);
                for (size_t v = 0; v < V; v++) {
                    uint64_t size = 0;
                    std::memcpy(&size, block + v * sizeof(uint64_t), sizeof(size));
                    sizes.push_back(size);
                    from.push_back(block + data_at);
                    data_at += size;
                }
            }
        }
        std::vector<size_t> out_offsets(sizes.size() + 1, 0);
        for (size_t r = 0; r < sizes.size(); r++) out_offsets[r + 1] = out_offsets[r] + sizes[r];
        std::vector<std::byte> out(out_offsets.back());
        for (size_t r = 0; r < sizes.size(); r++)
            if (sizes[r] > 0) std::memcpy(out.data() + out_offsets[r], from[r], sizes[r]);
        for (const VirtualRanks::Call* c : calls) {
            *c->all = out;
            *c->offsets = out_offsets;
        }
    });
}

// A ring all-gather's bytes (transport.h), as MpiTransport counts them.
void VirtualTransport::count_gather(std::span<const size_t> offsets) {
    const auto size = [&](int r) { return offsets[static_cast<size_t>(r) + 1] - offsets[static_cast<size_t>(r)]; };
    const uint64_t total = offsets[static_cast<size_t>(world_)];
    counters_.bytes_recv += total - size(rank_);
    counters_.bytes_sent += world_ > 1 ? total - size((rank_ + 1) % world_) : 0;
}

// GatherSizes::equal is gathered as exchange (the lanes learn the sizes anyway); counted as MpiTransport counts.
void VirtualTransport::allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all,
                                       std::vector<size_t>& offsets, GatherSizes how) {
    counters_.payload_bytes += mine.size();
    Timer t(counters_, true);
    const auto watched = watch("virtual ranks: all-gather of the DeMo buckets");
    if (how == GatherSizes::exchange && world_ > 1) counters_.size_exchanges++;
    gather(mine, all, offsets);
    count_gather(offsets);
}

// Gathered whole in start (no overlap: the lanes compute in turn anyway), counted as MpiTransport's split one.
void VirtualTransport::allgather_bytes_start(std::span<const std::byte> mine, GatherSizes how) {
    LLMC_CHECK(!gather_in_flight_, "virtual ranks: an all-gather was started while another is in flight");
    counters_.payload_bytes += mine.size();
    Timer t(counters_, false);
    const auto watched = watch("virtual ranks: all-gather of the DeMo buckets (start)");
    if (how == GatherSizes::exchange && world_ > 1) counters_.size_exchanges++;
    gather(mine, early_all_, early_offsets_);
    gather_in_flight_ = true;
}

void VirtualTransport::allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) {
    LLMC_CHECK(gather_in_flight_, "virtual ranks: all-gather finished without a start");
    Timer t(counters_, true);
    gather_in_flight_ = false;
    all.swap(early_all_);
    offsets.swap(early_offsets_);
    count_gather(offsets);
}

template <typename T, class Combine>
void VirtualTransport::reduce_small(std::span<T> values, int kind, Combine combine) {
    VirtualRanks::Call call;
    call.kind = kind;
    if constexpr (std::is_same_v<T, double>) call.doubles = values;
    else call.bits = values;
    group_.collective(lane_, call, [&] {
        std::vector<T*> lanes;
        for (const VirtualRanks::Call* c : group_.calls_) {
            if constexpr (std::is_same_v<T, double>) lanes.push_back(c->doubles.data());
            else lanes.push_back(c->bits.data());
        }
        fold_in_rank_order<T>(group_.real(), lanes, values.size(), combine, [](T v) { return v; });
    });
}

void VirtualTransport::allreduce_sum(std::span<double> values) {
    const auto watched = watch("virtual ranks: all-reduce (sum) of scalars");
    reduce_small(values, kSum, [](double a, double b) { return a + b; });
}

void VirtualTransport::allreduce_max(std::span<double> values) {
    const auto watched = watch("virtual ranks: all-reduce (max) of scalars");
    reduce_small(values, kMax, [](double a, double b) { return std::max(a, b); });
}

void VirtualTransport::allreduce_or(std::span<uint64_t> bits) {
    const auto watched = watch("virtual ranks: all-reduce (or) of a bitmap");
    reduce_small(bits, kOr, [](uint64_t a, uint64_t b) { return a | b; });
}

void VirtualTransport::broadcast(std::span<std::byte> data, int root) {
    LLMC_CHECK(root >= 0 && root < world_, "virtual ranks: broadcast from rank " + std::to_string(root) +
                                               " outside the world of " + std::to_string(world_));
    const auto watched = watch("virtual ranks: broadcast");
    VirtualRanks::Call call;
    call.kind = kBroadcast;
    call.bytes = data;
    call.root = root;
    group_.collective(lane_, call, [&] {
        const auto& calls = group_.calls_;
        const int V = group_.lanes(), root_process = root / V, root_lane = root % V;
        std::span<std::byte> first = calls[0]->bytes;
        if (group_.real().rank() == root_process && root_lane != 0 && !first.empty())
            std::memcpy(first.data(), calls[static_cast<size_t>(root_lane)]->bytes.data(), first.size());
        if (group_.real().world_size() > 1) group_.real().broadcast(first, root_process);
        for (size_t v = 1; v < calls.size(); v++)
            if (!first.empty()) std::memcpy(calls[v]->bytes.data(), first.data(), first.size());
    });
}

void VirtualTransport::barrier() {
    const auto watched = watch("virtual ranks: barrier");
    VirtualRanks::Call call;
    call.kind = kBarrier;
    group_.collective(lane_, call, [&] {
        if (group_.real().world_size() > 1) group_.real().barrier();
    });
}

void VirtualTransport::abort(int exit_code) {
    group_.abort();
    group_.real().abort(exit_code);
    std::_Exit(exit_code);  // (the real abort does not return)
}

Transport::HostGroup VirtualTransport::host_group() {
    fail("--virtual_ranks: groups of ranks (--shard_group_size) are not simulated yet");
}

}  // namespace llmc
