// The communication interface between optimizers (which own data parallelism) and the network. AdamW-DDP
// needs an average all-reduce of gradients; DeMo needs an all-gather of variable-size byte buckets; the
// trainer needs scalar reductions, broadcast and a barrier. Backends: LocalTransport (one rank, no MPI),
// MpiTransport (transport_mpi.cpp), and the NCCL backend of the CUDA trainer.
//
// Byte counters model what a rank puts on / takes off the wire under ring algorithms, so they are comparable
// across backends: all-reduce of n bytes sends and receives 2 (W-1)/W n; all-gather of per-rank sizes s_j
// receives sum_{j != r} s_j and sends sum_{j != r+1} s_j (a ring forwards every block but its successor's).
// `payload_bytes` is this rank's own contribution (its gradient buffer or its bucket), the quantity the
// DeMo paper counts. Scalar reductions, broadcasts and barriers are not counted (bookkeeping, not training
// traffic). `seconds` is wall time spent inside counted collectives (communication wait, for the metrics).
//
// Every collective of a multi-rank backend runs inside a CollectiveWatchdog scope (watchdog.h) once the
// trainer has set --comm_timeout: a rank that hangs then ends the job instead of blocking it forever.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/base/param_range.h"
#include "llmc/comm/comm_options.h"
#include "llmc/comm/watchdog.h"

namespace llmc {

// How an all-gather learns how many bytes each rank contributes. `exchange`: any size per rank, learnt from a
// small all-gather of the sizes first (one more round trip per call; on NCCL the host also waits for it).
// `equal`: every rank passes the same number of bytes and the caller knows it (one collective; on NCCL a plain
// ncclAllGather the host does not wait for at start). A rank whose size differs breaks the collective (a hang
// or garbage), so a caller uses `equal` only for sizes it has seen exchanged and checked before: DeMo exchanges
// its first round's sizes and checks them, and its bucket size never changes afterwards.
enum class GatherSizes { exchange, equal };

// The all-gather mode for the next round of a fixed-size exchange, given this round's offsets (world + 1
// entries): `equal` once a round showed every rank contributing `size` bytes, else `exchange`. Every rank
// compares the same offsets with its own size, one of those it compares, so all ranks switch together.
inline GatherSizes next_gather_sizes(std::span<const size_t> offsets, size_t size) {
    for (size_t r = 0; r + 1 < offsets.size(); r++)
        if (offsets[r + 1] - offsets[r] != size) return GatherSizes::exchange;
    return offsets.size() >= 2 ? GatherSizes::equal : GatherSizes::exchange;
}

// Which kind of link a transport's collectives cross. A world transport's traffic is `inter` (every rank its own
// node); FlexDeMo's and sharded AdamW's node group (Transport::split) is `intra`, their replica group `inter`.
enum class Link { inter, intra };

struct CommCounters {
    uint64_t bytes_sent = 0;
    // bytes_sent split by link (Link): with sub-transports, what crossed the node's fast link and the slow one
    uint64_t bytes_sent_intra = 0, bytes_sent_inter = 0;
    uint64_t bytes_recv = 0;
    uint64_t payload_bytes = 0;
    double seconds = 0.0;
    uint64_t collectives = 0;
    // all-gathers that ran a collective to learn their sizes first (GatherSizes::exchange; a world of one runs
    // none, but NCCL's one-rank communicator does)
    uint64_t size_exchanges = 0;
};

class Transport {
public:
    virtual ~Transport();
    virtual std::string_view name() const = 0;
    // The config's comm options, before any collective but the config check (which every rank runs with the
    // defaults): the MPI transport's message sizes and helper threads. The others have nothing to set.
    virtual void configure(const CommOptions& /*options*/) {}
    virtual int rank() const = 0;
    virtual int world_size() const = 0;

    // data <- mean over ranks of data (counted).
    virtual void allreduce_mean(std::span<float> data) = 0;
    // The same with bf16 on the wire (half the bytes): each rank's values are rounded to bf16 and partial
    // sums are rounded to bf16 at every reduction hop, as a bf16 all-reduce does. Backends that cannot do it
    // keep this default, which refuses with a message naming --grad_wire.
    virtual void allreduce_mean_bf16(std::span<float> data);
    // AdamW-DDP's all-reduce overlapped with the backward, as PyTorch's DDP overlaps its buckets. start()
    // begins base[r] <- mean over ranks of base[r] for each range r of the buffer `base` (`total` floats, in the
    // memory this transport's all-reduce takes: host for MPI, device for NCCL; bf16: allreduce_mean_bf16's
    // arithmetic) and returns; finish() waits for every range started since the last finish(). The caller
    // leaves the ranges alone until finish(); ranges do not overlap; every rank starts the same ranges in the
    // same order, and one finish() covers one buffer in one wire format. Counted as one all-reduce of all the
    // ranges together, in finish(); `seconds` is the time inside start(), wait() and finish() (what the backward
    // did not hide). They check and keep the books here and hand the work to start_/wait_/finish_allreduce_ranges.
    void allreduce_mean_start(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16);
    void allreduce_mean_finish();
    // Blocks until the first `starts` start() calls since the last finish() are complete: their ranges hold the
    // mean. finish() must still follow (it ends the round and counts it). So a caller can use the early ranges
    // while later ones are in flight (the host-staged transport copies them back to the GPU meanwhile).
    void allreduce_mean_wait(size_t starts);
    // Every rank contributes `mine` (GatherSizes::exchange: any size, may differ per rank; equal: the same size
    // on every rank). On return `all` holds the ranks' buffers concatenated in rank order and
    // offsets[r]..offsets[r+1] delimits rank r's (offsets has world+1 entries).
    virtual void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all,
                                 std::vector<size_t>& offsets, GatherSizes sizes) = 0;
    // The same all-gather split in two, so it can run while this rank computes (DeMo's --demo_delay 1: a
    // step's buckets travel during the next step's forward and backward). start() begins gathering `mine`,
    // which must stay unchanged until finish(); finish() waits for it and fills `all` and `offsets` as
    // allgather_bytes does. One all-gather at a time; every rank starts and finishes in the same order. Other
    // collectives may run in between. `seconds` counts the time spent inside start() and finish() (what the
    // computation did not hide). This default runs the whole all-gather in start(); MpiTransport overlaps.
    virtual void allgather_bytes_start(std::span<const std::byte> mine, GatherSizes sizes);
    virtual void allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets);
    bool allgather_in_flight() const { return gather_in_flight_; }

    // values <- elementwise sum / max over ranks (uncounted; losses, norms, consistency checks).
    virtual void allreduce_sum(std::span<double> values) = 0;
    virtual void allreduce_max(std::span<double> values) = 0;
    // allreduce_sum split in two, so a few values travel while this rank computes (the step report's loss and
    // norm, summed during the next step: on a link with a delay that is a latency a step off the critical
    // path). start() keeps a copy of `values`; finish() waits and writes the sums into `values` (as many), with
    // allreduce_sum's bits. One at a time; every rank starts and finishes in the same order; other collectives
    // may run in between. This default sums in start(); MpiTransport overlaps.
    virtual void allreduce_sum_start(std::span<const double> values);
    virtual void allreduce_sum_finish(std::span<double> values);
    // allreduce_or split the same way (AdamW-DDP's bitmap of touched embedding rows, in flight during the last
    // micro-step's forward); independent of the split sum: both may be in flight at once.
    virtual void allreduce_or_start(std::span<const uint64_t> bits);
    virtual void allreduce_or_finish(std::span<uint64_t> bits);
    // bits <- bitwise OR over ranks (uncounted bookkeeping, as the scalars: AdamW-DDP's overlapped all-reduce
    // learns which embedding rows some rank's batch touches, 6 KB for GPT-2's vocabulary).
    virtual void allreduce_or(std::span<uint64_t> bits) = 0;
    virtual void broadcast(std::span<std::byte> data, int root) = 0;
    virtual void barrier() = 0;
    // Ends every rank of the job (after an error on one rank, so the others do not hang in a collective).
    [[noreturn]] virtual void abort(int exit_code) = 0;

    // ---- groups of ranks (FlexDeMo, sharded AdamW) ----
    // A transport over the ranks of this one that pass the same `color`, ordered by `key` (ties: by this rank):
    // a collective call of every rank. The sub-transport's counted traffic is also this one's (counters(), under
    // `link`); it takes this one's options and collective timeout, and must be destroyed before this one.
    std::unique_ptr<Transport> split(int color, int key, Link link);
    // The ranks that share this rank's host (MPI's shared-memory split): how many, this rank's place among them,
    // and the lowest and highest rank of them (--shard_group_size auto). Collective. One rank per host by default.
    struct HostGroup {
        int size = 1, index = 0, first_rank = 0, last_rank = 0;
    };
    virtual HostGroup host_group() { return {1, 0, rank(), rank()}; }
    // The reduce half of a sharded step: on return data[offsets[r], offsets[r+1]) of rank r holds the mean over
    // ranks of that range (summed in rank order); the rest of data is unspecified. offsets has world+1 entries,
    // the same on every rank. Counted as a ring reduce-scatter: sends the ranges of the others, receives W-1
    // copies of its own; payload: the whole buffer.
    virtual void reduce_scatter_mean(std::span<float> data, std::span<const size_t> offsets);
    // The gather half: rank r's bytes data[offsets[r], offsets[r+1]) reach every rank, in place (the updated
    // weights of each shard, fp32 or bf16). Counted as a ring all-gather; payload: this rank's range.
    virtual void allgather_inplace(std::span<std::byte> data, std::span<const size_t> offsets);

    // This step's traffic: this transport's and its live sub-transports' together, split by link.
    CommCounters counters() const;
    void reset_counters();
    Link link() const { return link_; }

    // From now on a collective that has not returned after `seconds` ends this process with a message
    // (0: wait forever). A world of one has nothing to wait for and starts no watchdog.
    void set_collective_timeout(double seconds) {
        timeout_seconds_ = seconds;
        watchdog_.reset();
        if (seconds > 0 && world_size() > 1) watchdog_ = std::make_unique<CollectiveWatchdog>(seconds, rank());
    }
    double collective_timeout() const { return timeout_seconds_; }

protected:
    // split()'s backend half: the sub-transport of the ranks with this color, ordered by key.
    virtual std::unique_ptr<Transport> split_group(int color, int key);
    // Throws unless `offsets` cut a buffer of `size` into one range per rank (reduce_scatter_mean, allgather_inplace).
    void check_group_offsets(std::span<const size_t> offsets, size_t size, const char* what) const;
    // A backend's half of the overlapped all-reduce. start_allreduce_ranges gets ranges already checked (inside
    // the buffer, the same buffer and wire format as those started before it; `elems` floats in all);
    // finish_allreduce_ranges waits for every range started since the last finish, `elems` floats in all (0 if
    // none), and counts them. This default reduces each range inside start (no overlap) with
    // allreduce_mean(_bf16), which counts it, and has nothing left to finish.
    virtual void start_allreduce_ranges(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16,
                                        size_t elems);
    virtual void finish_allreduce_ranges(size_t /*elems*/, bool /*bf16*/) {}
    // allreduce_mean_wait's half: `starts` is at most the starts since the last finish, counting the present one
    // inside start_allreduce_ranges (overlap_starts()). The default start reduced its ranges already.
    virtual void wait_allreduce_ranges(size_t /*starts*/) {}
    size_t overlap_starts() const { return overlap_starts_; }

    // Backends open one of these around every blocking collective.
    CollectiveWatchdog::Scope watch(const char* what) {
        return watchdog_ ? watchdog_->watch(what) : CollectiveWatchdog::Scope{};
    }

    CommCounters counters_;
    bool gather_in_flight_ = false;  // between allgather_bytes_start and _finish

private:
    float* overlap_base_ = nullptr;  // the overlapped all-reduce since the last finish: its buffer and wire,
    size_t overlap_total_ = 0, overlap_elems_ = 0;  // and the elements started
    size_t overlap_starts_ = 0;                     // start() calls since the last finish()
    bool overlap_bf16_ = false;
    std::vector<std::byte> early_all_;  // the default start()'s result, handed out by finish()
    std::vector<size_t> early_offsets_;
    // The default split reductions: reduced whole in start(), the result handed out by finish().
    template <typename T>
    struct EarlyReduction {
        std::vector<T> values;
        bool in_flight = false;
    };
    template <typename T, class Reduce>
    void start_early(EarlyReduction<T>& r, std::span<const T> values, Reduce reduce, const char* kind);
    template <typename T>
    void finish_early(EarlyReduction<T>& r, std::span<T> values, const char* kind);
    EarlyReduction<double> early_sum_;
    EarlyReduction<uint64_t> early_or_;

    double timeout_seconds_ = 0.0;
    std::unique_ptr<CollectiveWatchdog> watchdog_;
    Link link_ = Link::inter;
    Transport* parent_ = nullptr;         // split()'s parent, which counts this one's traffic
    std::vector<Transport*> children_;    // the live sub-transports of split()
};

// World of one: collectives are identities, nothing is counted as sent.
class LocalTransport final : public Transport {
public:
    std::string_view name() const override { return "local"; }
    int rank() const override { return 0; }
    int world_size() const override { return 1; }
    void allreduce_mean(std::span<float> data) override { counters_.payload_bytes += data.size_bytes(); }
    void allreduce_mean_bf16(std::span<float> data) override { counters_.payload_bytes += data.size_bytes() / 2; }
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes) override {
        counters_.payload_bytes += mine.size();
        all.assign(mine.begin(), mine.end());
        offsets = {0, mine.size()};
    }
    void allreduce_sum(std::span<double>) override {}
    void allreduce_max(std::span<double>) override {}
    void allreduce_or(std::span<uint64_t>) override {}
    void broadcast(std::span<std::byte>, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int exit_code) override;
    void reduce_scatter_mean(std::span<float> data, std::span<const size_t>) override {
        counters_.payload_bytes += data.size_bytes();
    }
    void allgather_inplace(std::span<std::byte> data, std::span<const size_t>) override {
        counters_.payload_bytes += data.size();
    }

protected:
    std::unique_ptr<Transport> split_group(int, int) override { return std::make_unique<LocalTransport>(); }
    void start_allreduce_ranges(float*, size_t, std::span<const ParamRange>, bool, size_t) override {}
    void finish_allreduce_ranges(size_t elems, bool bf16) override {
        counters_.payload_bytes += elems * (bf16 ? 2 : 4);
    }
};

}  // namespace llmc
