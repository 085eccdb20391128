// Virtual ranks (--virtual_ranks V): one process simulates V data-parallel ranks, so that P processes x V virtual
// ranks compute what P*V real MPI ranks compute, bit for bit: a way to run a 64-rank experiment on a few machines.
// The trainer stays rank-agnostic: each virtual rank is a thread running train() on its own endpoint of a
// VirtualRanks group, an endpoint with rank p*V + v in a world of P*V (p: this process's real rank, v: the lane).
//
// Every collective is a rendezvous of the V lanes (a generation-counted barrier); lane 0 then does the work for
// all of them, on the real transport when P > 1, and writes every lane's result while the others wait at a second
// barrier. The results have MpiTransport's bits over P*V ranks: gradient means sum every element in global rank
// order (sum = c0; sum += c_r) and scale by 1/W, bf16 means round each value and every partial sum to bf16 (RNE);
// the scalar and bitmap reductions combine in global rank order (MpiTransport's direct exchange, used up to 64
// ranks: above that MPI_Allreduce picks the order, so scalar sums over more than 64 ranks may differ in the last
// bits). For P > 1 lane 0 learns the other processes' contributions with a real all-gather of its V lanes' buffers,
// in slices of at most 256 MB per process (so a fold holds P x 256 MB at most besides the lanes' own buffers).
// Only lane 0's thread calls the real transport, one call at a time (MPI_THREAD_SERIALIZED is enough; Open MPI
// gives MPI_THREAD_MULTIPLE). The byte counters are each endpoint's own and count what a rank of a P*V ring would (transport.h), not the real
// transport's traffic, so the metrics' bytes per step are those of the P*V real run.
//
// If a lane fails, abort() wakes the lanes waiting at a rendezvous with VirtualRanksAborted, and every later
// collective throws it too, so no lane hangs waiting for one that is gone. Groups of ranks (split, host_group,
// reduce_scatter_mean, allgather_inplace: FlexDeMo and sharded steps) are refused; the config refuses them first.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/comm/transport.h"

namespace llmc {

// What a lane's collective throws once another lane has failed (the failing lane reports its own error).
struct VirtualRanksAborted : Error {
    using Error::Error;
};

class VirtualTransport;

class VirtualRanks {
public:
    // `real` (this process's transport, rank p of P) must outlive the group; `lanes` >= 1.
    VirtualRanks(Transport& real, int lanes);
    ~VirtualRanks();
    VirtualRanks(const VirtualRanks&) = delete;
    VirtualRanks& operator=(const VirtualRanks&) = delete;

    int lanes() const { return lanes_; }
    Transport& real() { return real_; }
    // Lane v's endpoint: rank real.rank() * lanes + v in a world of real.world_size() * lanes.
    Transport& lane(int v);
    // Wakes every lane waiting at a rendezvous, and makes every later collective throw VirtualRanksAborted.
    void abort();

    // One lane's call of a collective, as the leader sees it: which collective and its arguments.
    struct Call {
        int kind = 0;
        std::span<float> floats;
        std::span<double> doubles;
        std::span<uint64_t> bits;
        std::span<std::byte> bytes;             // broadcast's buffer
        std::span<const std::byte> mine;        // all-gather's contribution
        std::vector<std::byte>* all = nullptr;  // all-gather's results
        std::vector<size_t>* offsets = nullptr;
        int root = 0;
    };

private:
    friend class VirtualTransport;
    // The lanes' rendezvous around one collective: every lane posts its call; lane 0 runs `lead` over all of
    // them (when every lane made the same kind of call with the same count) and every lane returns after it.
    template <class Lead>
    void collective(int lane, const Call& call, Lead lead);
    void rendezvous();  // a barrier of the V lanes; throws VirtualRanksAborted once aborted
    [[noreturn]] void throw_aborted() const;

    Transport& real_;
    const int lanes_;
    std::vector<std::unique_ptr<VirtualTransport>> endpoints_;
    std::vector<const Call*> calls_;  // the lanes' calls of the collective in progress
    std::mutex mutex_;
    std::condition_variable arrived_all_;
    int arrived_ = 0;
    uint64_t generation_ = 0;
    bool aborted_ = false;
};

// A lane's endpoint (VirtualRanks::lane). The split reductions and the overlapped all-reduce's wait keep the base
// class's defaults (they reduce in start(), which every lane calls at the same point).
class VirtualTransport final : public Transport {
public:
    VirtualTransport(VirtualRanks& group, int lane);
    std::string_view name() const override { return "virtual"; }
    void configure(const CommOptions& options) override;
    int rank() const override { return rank_; }
    int world_size() const override { return world_; }
    void allreduce_mean(std::span<float> data) override;
    void allreduce_mean_bf16(std::span<float> data) override;
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes sizes) override;
    void allgather_bytes_start(std::span<const std::byte> mine, GatherSizes sizes) override;
    void allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) override;
    void allreduce_sum(std::span<double> values) override;
    void allreduce_max(std::span<double> values) override;
    void allreduce_or(std::span<uint64_t> bits) override;
    void broadcast(std::span<std::byte> data, int root) override;
    void barrier() override;
    [[noreturn]] void abort(int exit_code) override;
    HostGroup host_group() override;

protected:
    void start_allreduce_ranges(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16,
                                size_t elems) override;
    void finish_allreduce_ranges(size_t elems, bool bf16) override;

private:
    void mean(std::span<float> data, bool bf16);  // uncounted: the callers count
    void gather(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets);
    template <typename T, class Combine>
    void reduce_small(std::span<T> values, int kind, Combine combine);
    void count_allreduce(uint64_t bytes);
    void count_gather(std::span<const size_t> offsets);

    VirtualRanks& group_;
    const int lane_, rank_, world_;
    std::vector<std::byte> early_all_;  // the overlapped all-gather's result (gathered in start)
    std::vector<size_t> early_offsets_;
};

}  // namespace llmc
