// MpiTransport: collectives over MPI_COMM_WORLD (or a group of its ranks: split) with the byte counters of transport.h. Failures of MPI calls
// abort the whole job (MPI_ERRORS_ARE_FATAL), so a rank that dies takes the others down instead of leaving
// them blocked in a collective; mpirun reports which rank failed.
// The gradient all-reduces sum every element in rank order (RankOrderMean: a reduce-scatter and an
// all-gather over point-to-point messages, the bytes of a ring), so their bits depend only on the ranks'
// values: not on the buffer's length or split, nor on the algorithm MPI_Allreduce would choose.
// The all-reduces, DeMo's all-gathers and the small per-step reductions post every message of a phase at once
// (direct exchange) in pieces MPI sends without a handshake, so a phase costs one message latency where a ring
// pays W-1 rounds (and Open MPI's handshake two more per round above 64 KB), for the same bytes through each
// rank's link. What that is worth on links with a delay: docs/BANDWIDTH.md.
// The overlapped all-gather (allgather_bytes_start / _finish) runs on its own duplicate of the communicator, so
// it can be in flight while the main thread's collectives go on. With MPI_THREAD_MULTIPLE (Open MPI provides
// it) a helper thread runs the blocking all-gather, which moves the bytes while the trainer computes;
// otherwise (or with --mpi_helper_threads false) its messages are posted in start() and waited for in finish(), and
// MPI may only progress them inside finish()'s wait. With GatherSizes::equal no all-gather exchanges sizes first.
// The overlapped all-reduce (allreduce_mean_start / _finish, AdamW-DDP's gradients during the backward) works
// the same way on a third communicator: a reducer thread takes the ranges in the order they were started and
// all-reduces each as allreduce_mean does (so the ranges get the bits of a blocking all-reduce of the buffer),
// up to --mpi_reduce_jobs (2) starts at a time, so that on a distant link one start's message latencies
// pass while another's are under way. It polls its requests and sleeps in between instead of spinning in MPI on a core
// the backward needs, until finish() waits for it. (The same for the all-gather thread gained nothing in the
// bandwidth lab, 4 hosts at 20 and 100 Mbit/s, so that thread still blocks.)
// --mpi_helper_threads false turns both helper threads off: the all-gather's messages are posted in start() and
// the ranges are all-reduced inside finish() (or a wait for early ranges).
#include "llmc/comm/transport_mpi.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "llmc/base/kernel_math.h"
#include "llmc/base/error.h"

#ifdef LLMC_USE_MPI
#include <mpi.h>

namespace llmc {

namespace {

// Wall time into the counters; `counts`: this is a collective of its own (an overlapped all-gather counts once,
// in finish()).
class Timer {
public:
    explicit Timer(CommCounters& c, bool counts = true) : c_(c), counts_(counts), start_(std::chrono::steady_clock::now()) {}
    ~Timer() {
        c_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (counts_) c_.collectives++;
    }

private:
    CommCounters& c_;
    bool counts_;
    std::chrono::steady_clock::time_point start_;
};

class MpiTransport final : public Transport {
public:
    MpiTransport(int* argc, char*** argv) {
        int initialized = 0, provided = MPI_THREAD_SINGLE;
        MPI_Initialized(&initialized);
        if (!initialized) {
            if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
                fail("MPI_Init_thread failed (is the MPI runtime installed?)");
            owns_mpi_ = true;
        } else {
            MPI_Query_thread(&provided);
        }
        thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
        comm_thread_ok_ = thread_multiple_;
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &world_);
    }
    // A group of the parent's ranks (split_group): its own communicator, the parent's options.
    MpiTransport(MPI_Comm comm, const MpiTransport& parent)
        : comm_(comm), reduce_slice_(parent.reduce_slice_), message_bytes_(parent.message_bytes_),
          thread_multiple_(parent.thread_multiple_), comm_thread_ok_(parent.comm_thread_ok_),
          reduce_jobs_in_flight_(parent.reduce_jobs_in_flight_) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &world_);
    }
    ~MpiTransport() override {
        // an all-gather still in flight (DeMo's last delayed round) completes: every rank started it
        if (gather_in_flight_) {
            const auto watched = watch("MPI all-gather of the DeMo buckets (at exit)");
            wait_gather();
        }
        stop_reducer();
        if (gather_comm_ != MPI_COMM_NULL) MPI_Comm_free(&gather_comm_);
        if (reduce_comm_ != MPI_COMM_NULL) MPI_Comm_free(&reduce_comm_);
        if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
        if (owns_mpi_) MPI_Finalize();
    }
    std::string_view name() const override { return "mpi"; }
    void configure(const CommOptions& options) override {
        LLMC_CHECK(!gather_in_flight_ && !reducer_.joinable() && !gather_thread_.joinable(),
                   "internal: MpiTransport::configure after an overlapped collective started");
        reduce_slice_ = static_cast<size_t>(options.mpi_reduce_slice);
        message_bytes_ = static_cast<size_t>(options.mpi_message_bytes);
        reduce_jobs_in_flight_ = static_cast<size_t>(options.mpi_reduce_jobs);
        comm_thread_ok_ = thread_multiple_ && options.mpi_helper_threads;
    }
    int rank() const override { return rank_; }
    int world_size() const override { return world_; }

    void allreduce_mean(std::span<float> data) override {
        counters_.payload_bytes += data.size_bytes();
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-reduce of the gradients");
        mean_fp32(data.data(), data.size(), stage_, comm_);
        count_allreduce(data.size_bytes());
    }

    void allreduce_mean_bf16(std::span<float> data) override {
        counters_.payload_bytes += data.size_bytes() / 2;
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-reduce of the gradients (bf16)");
        wire_.resize(data.size());
        mean_bf16(data.data(), wire_.data(), data.size(), stage_bf16_, comm_);
        count_allreduce(data.size_bytes() / 2);
    }

    HostGroup host_group() override {
        MPI_Comm host;
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
        HostGroup g;
        MPI_Comm_size(host, &g.size);
        MPI_Comm_rank(host, &g.index);
        MPI_Allreduce(&rank_, &g.first_rank, 1, MPI_INT, MPI_MIN, host);
        MPI_Allreduce(&rank_, &g.last_rank, 1, MPI_INT, MPI_MAX, host);
        MPI_Comm_free(&host);
        return g;
    }

    // Direct exchange, as the all-gathers: every rank posts its pieces of the others' ranges and receives the
    // others' pieces of its own, then sums them in rank order.
    void reduce_scatter_mean(std::span<float> data, std::span<const size_t> offsets) override {
        check_group_offsets(offsets, data.size(), "reduce-scatter");
        counters_.payload_bytes += data.size_bytes();
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI reduce-scatter of the gradients (sharded step)");
        const size_t begin = offsets[rank_], n = offsets[rank_ + 1] - begin;
        stage_.resize(n * static_cast<size_t>(world_));
        std::vector<MPI_Request> requests;
        for (int k = 1; k < world_; k++) {
            const int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
            post_recv(stage_.data() + n * static_cast<size_t>(from), n, MPI_FLOAT, from, kScatterTag, comm_, requests);
            post_send(data.data() + offsets[to], offsets[to + 1] - offsets[to], MPI_FLOAT, to, kScatterTag, comm_,
                      requests);
        }
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
        std::copy(data.begin() + static_cast<std::ptrdiff_t>(begin),
                  data.begin() + static_cast<std::ptrdiff_t>(begin + n),
                  stage_.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(rank_)));
        float* mine = data.data() + begin;
        const float inv = 1.0f / static_cast<float>(world_);
        for (size_t i = 0; i < n; i++) {
            float sum = stage_[i];
            for (int r = 1; r < world_; r++) sum += stage_[n * static_cast<size_t>(r) + i];
            mine[i] = sum * inv;
        }
        uint64_t others = 0;
        for (int r = 0; r < world_; r++)
            if (r != rank_) others += offsets[r + 1] - offsets[r];
        counters_.bytes_sent += others * sizeof(float);
        counters_.bytes_recv += static_cast<uint64_t>(world_ - 1) * n * sizeof(float);
    }

    void allgather_inplace(std::span<std::byte> data, std::span<const size_t> offsets) override {
        check_group_offsets(offsets, data.size(), "in-place all-gather");
        const size_t begin = offsets[rank_], n = offsets[rank_ + 1] - begin;
        counters_.payload_bytes += n;
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-gather of the updated weights (sharded step)");
        std::vector<MPI_Request> requests;
        for (int k = 1; k < world_; k++) {
            const int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
            post_recv(data.data() + offsets[from], offsets[from + 1] - offsets[from], MPI_BYTE, from, kInplaceTag,
                      comm_, requests);
            post_send(data.data() + begin, n, MPI_BYTE, to, kInplaceTag, comm_, requests);
        }
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
        const uint64_t others = offsets[world_] - n;
        counters_.bytes_sent += static_cast<uint64_t>(world_ - 1) * n;
        counters_.bytes_recv += others;
    }

protected:
    std::unique_ptr<Transport> split_group(int color, int key) override {
        LLMC_CHECK(!gather_in_flight_, "internal: MpiTransport::split while an all-gather is in flight");
        MPI_Comm sub;
        MPI_Comm_split(comm_, color, key, &sub);
        return std::make_unique<MpiTransport>(sub, *this);
    }

    // the overlapped all-reduce (transport.h's books): ranges queued for the reducer thread, finish waits for it
    void start_allreduce_ranges(float* base, size_t, std::span<const ParamRange> ranges, bool bf16,
                                size_t elems) override {
        Timer t(counters_, /*counts=*/false);
        if (world_ == 1) return;
        const auto watched = watch("MPI all-reduce of the gradients (start)");
        if (reduce_comm_ == MPI_COMM_NULL) MPI_Comm_dup(comm_, &reduce_comm_);  // every rank's first start
        if (elems == 0) return;
        {
            std::lock_guard lock(reduce_mutex_);
            ReduceJob& job = reduce_queue_.emplace_back();
            job.base = base;
            job.ranges.assign(ranges.begin(), ranges.end());
            job.elems = elems;
            job.bf16 = bf16;
            job.start = overlap_starts() - 1;
        }
        if (!comm_thread_ok_) return;  // finish() reduces them
        if (!reducer_.joinable()) reducer_ = std::thread([this] { run_reducer(); });
        reduce_ready_.notify_one();
    }

    // the jobs of the first `starts` starts reduced (the queue holds the others; empty ones were never queued)
    void wait_allreduce_ranges(size_t starts) override {
        if (world_ == 1) return;
        Timer t(counters_, /*counts=*/false);
        const auto watched = watch("MPI all-reduce of the gradients (early ranges)");
        const auto reduced = [&] { return reduce_queue_.empty() || reduce_queue_.front().start >= starts; };
        std::unique_lock lock(reduce_mutex_);
        if (comm_thread_ok_) {
            reduce_awaited_ = true;
            reduce_done_.wait(lock, reduced);
            reduce_awaited_ = false;
        } else {
            while (!reduced()) reduce_pass(lock);
        }
    }

    void finish_allreduce_ranges(size_t elems, bool bf16) override {
        if (elems == 0) return;
        const size_t bytes = elems * (bf16 ? sizeof(uint16_t) : sizeof(float));
        counters_.payload_bytes += bytes;
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-reduce of the gradients (overlapped)");
        std::unique_lock lock(reduce_mutex_);
        if (comm_thread_ok_) {
            reduce_awaited_ = true;  // the reducer stops sleeping between its polls: nothing else runs now
            reduce_done_.wait(lock, [this] { return reduce_queue_.empty(); });
            reduce_awaited_ = false;
        } else {
            while (!reduce_queue_.empty()) reduce_pass(lock);
        }
        count_allreduce(bytes);
    }

public:
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes how) override {
        counters_.payload_bytes += mine.size();
        Timer t(counters_);
        const auto watched = watch("MPI all-gather of the DeMo buckets");
        LLMC_CHECK(mine.size() <= static_cast<size_t>(INT32_MAX), "allgather: bucket larger than 2 GiB");
        std::vector<int> sizes;
        learn_sizes(static_cast<int>(mine.size()), how, sizes, comm_);
        if (how == GatherSizes::exchange && world_ > 1) counters_.size_exchanges++;
        offsets = offsets_of(sizes);
        all.resize(offsets[world_]);
        std::vector<MPI_Request> requests;
        post_gather(mine.data(), sizes, offsets, all.data(), comm_, requests);
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
        count_gather(sizes, offsets);
    }

    void allgather_bytes_start(std::span<const std::byte> mine, GatherSizes how) override {
        LLMC_CHECK(!gather_in_flight_, "MPI: an all-gather was started while another is in flight");
        LLMC_CHECK(mine.size() <= static_cast<size_t>(INT32_MAX), "allgather: bucket larger than 2 GiB");
        counters_.payload_bytes += mine.size();
        Timer t(counters_, /*counts=*/false);
        gather_in_flight_ = true;
        // Send from a copy: the caller's buffer may be gone before the gather ends (DeMo's last delayed round
        // is still in flight when the trainer destroys the optimizer, and peers may read the send buffer
        // directly, e.g. over CMA, until then).
        gather_send_.assign(mine.begin(), mine.end());
        if (world_ == 1) {
            gather_sizes_ = {static_cast<int>(mine.size())};
            gather_offsets_ = offsets_of(gather_sizes_);
            gather_all_ = gather_send_;
            return;
        }
        const auto watched = watch("MPI all-gather of the DeMo buckets (start)");
        if (how == GatherSizes::exchange) counters_.size_exchanges++;  // here: the helper thread must not count
        if (gather_comm_ == MPI_COMM_NULL) MPI_Comm_dup(comm_, &gather_comm_);
        if (comm_thread_ok_) {
            gather_thread_ = std::thread([this, how] {
                lay_out_gather(how);
                post_gather(gather_send_.data(), gather_sizes_, gather_offsets_, gather_all_.data(), gather_comm_,
                            gather_requests_);
                MPI_Waitall(static_cast<int>(gather_requests_.size()), gather_requests_.data(), MPI_STATUSES_IGNORE);
            });
            return;
        }
        lay_out_gather(how);  // the messages are posted now; MPI moves them as far as it can until finish() waits
        post_gather(gather_send_.data(), gather_sizes_, gather_offsets_, gather_all_.data(), gather_comm_,
                    gather_requests_);
    }

    void allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) override {
        LLMC_CHECK(gather_in_flight_, "MPI: all-gather finished without a start");
        Timer t(counters_);
        {
            const auto watched = watch("MPI all-gather of the DeMo buckets (overlapped)");
            wait_gather();
        }
        offsets = gather_offsets_;
        count_gather(gather_sizes_, offsets);
        all.swap(gather_all_);
    }

    void allreduce_sum(std::span<double> values) override {
        const auto watched = watch("MPI all-reduce (sum) of scalars");
        small_allreduce(values, MPI_DOUBLE, MPI_SUM, [](double a, double b) { return a + b; });
    }
    void allreduce_sum_start(std::span<const double> values) override {
        split_start(split_sum_, values, MPI_DOUBLE, MPI_SUM, kSplitSumTag, "a sum");
    }
    void allreduce_sum_finish(std::span<double> values) override {
        split_finish(split_sum_, values, [](double a, double b) { return a + b; }, "a sum",
                     "MPI all-reduce (sum) of scalars (overlapped)");
    }
    void allreduce_or_start(std::span<const uint64_t> bits) override {
        split_start(split_or_, bits, MPI_UINT64_T, MPI_BOR, kSplitOrTag, "an OR");
    }
    void allreduce_or_finish(std::span<uint64_t> bits) override {
        split_finish(split_or_, bits, [](uint64_t a, uint64_t b) { return a | b; }, "an OR",
                     "MPI all-reduce (or) of a bitmap (overlapped)");
    }
    void allreduce_max(std::span<double> values) override {
        const auto watched = watch("MPI all-reduce (max) of scalars");
        small_allreduce(values, MPI_DOUBLE, MPI_MAX, [](double a, double b) { return std::max(a, b); });
    }
    void allreduce_or(std::span<uint64_t> bits) override {
        const auto watched = watch("MPI all-reduce (or) of a bitmap");
        small_allreduce(bits, MPI_UINT64_T, MPI_BOR, [](uint64_t a, uint64_t b) { return a | b; });
    }
    void broadcast(std::span<std::byte> data, int root) override {
        const auto watched = watch("MPI broadcast");
        MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, comm_);
    }
    void barrier() override {
        const auto watched = watch("MPI barrier");
        MPI_Barrier(comm_);
    }
    [[noreturn]] void abort(int exit_code) override {
        if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
        if (owns_mpi_) MPI_Finalize();
        std::exit(exit_code);
    }

private:
    // Every rank's contribution to an all-gather: exchanged (one MPI_Allgather of an int), or this rank's own
    // size everywhere (GatherSizes::equal: the caller vouches for it).
    void learn_sizes(int my_size, GatherSizes how, std::vector<int>& sizes, MPI_Comm comm) const {
        sizes.assign(world_, my_size);
        if (how == GatherSizes::exchange) MPI_Allgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
    }
    std::vector<size_t> offsets_of(const std::vector<int>& sizes) const {
        std::vector<size_t> offsets(world_ + 1, 0);
        for (int r = 0; r < world_; r++) offsets[r + 1] = offsets[r] + static_cast<size_t>(sizes[r]);
        return offsets;
    }
    // Every rank's sizes[r] bytes into all + offsets[r], as a direct exchange: a receive from and a send to every
    // other rank, all posted at once (appended to `requests`, which the caller waits for), so the gather costs
    // one message latency where a ring pays W-1; each rank still sends its bucket W-1 times, a ring's bytes. Each
    // message is one bucket (under 2 GiB), so no int count limits the total, which reaches 3.5 GB for the paper's
    // 1B model on 64 ranks.
    void post_gather(const std::byte* mine, const std::vector<int>& sizes, const std::vector<size_t>& offsets,
                     std::byte* all, MPI_Comm comm, std::vector<MPI_Request>& requests) const {
        std::memcpy(all + offsets[rank_], mine, static_cast<size_t>(sizes[rank_]));
        for (int k = 1; k < world_; k++) {  // in ring order: the next rank first
            const int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
            post_recv(all + offsets[from], static_cast<size_t>(sizes[from]), MPI_BYTE, from, kGatherTag, comm,
                      requests);
            post_send(mine, static_cast<size_t>(sizes[rank_]), MPI_BYTE, to, kGatherTag, comm, requests);
        }
    }
    // data <- mean over ranks of data, every element summed in rank order (((g0 + g1) + g2) + ...) and scaled
    // by 1/W, however long the buffer and however the caller splits it (overlapped ranges give the bits of one
    // all-reduce of the whole buffer), and whatever algorithm MPI would pick for MPI_Allreduce. Per slice, rank
    // r owns share r (1/W of the slice). Reduce-scatter: every rank sends its values of share r to rank r, so the
    // owner holds all W contributions and adds them in rank order. All-gather: every owner sends its reduced
    // share to every other rank. Each phase posts all its messages at once (direct exchange: one message
    // latency, where a ring's phase has W-1 rounds) and moves a ring's bytes: 2 (W-1)/W of the buffer each way.
    // bf16: the values go to bf16 before they travel, and every partial sum is rounded to bf16, as a bf16
    // all-reduce rounds at each hop.
    // RankOrderMean is one such all-reduce as steps (advance posts the next phase once the last one's messages
    // are in), so that the reducer can keep several in flight; the blocking all-reduces drive one to its end.
    template <typename Wire>
    struct RankOrderMean {
        Wire* data = nullptr;
        size_t n = 0;
        size_t begin = 0, length = 0;  // the slice in progress
        enum class Phase { idle, reduce_scatter, all_gather } phase = Phase::idle;  // of the slice in progress
        int tag = 0;                   // its reduce-scatter's messages; tag + 1 its all-gather's
        std::vector<size_t> begin_of;  // share r of the slice is [begin_of[r], begin_of[r + 1])
        std::vector<Wire> stage;       // the contributions to this rank's share, in rank order
        std::vector<MPI_Request> requests;
        void reset(Wire* values, size_t count, int first_tag) {
            data = values;
            n = count;
            tag = first_tag;
            begin = length = 0;
            phase = Phase::idle;
        }
    };
    // Posts the next phase of m (its last one's messages must have arrived); true once every slice is reduced.
    template <typename Wire, typename Add>
    bool advance(RankOrderMean<Wire>& m, MPI_Datatype type, Add add, MPI_Comm comm) const {
        const int W = world_, me = rank_;
        const auto count = [&](int r) { return m.begin_of[r + 1] - m.begin_of[r]; };
        Wire* slice = m.data + m.begin;
        if (m.phase == RankOrderMean<Wire>::Phase::reduce_scatter) {
            const size_t share = count(me);
            for (size_t i = 0; i < share; i++) {
                Wire sum = m.stage[i];
                for (int r = 1; r < W; r++) sum = add(sum, m.stage[share * static_cast<size_t>(r) + i]);
                slice[m.begin_of[me] + i] = sum;
            }
            for (int k = 1; k < W; k++) {  // all-gather of the reduced shares, in ring order: the next rank first
                const int to = (me + k) % W, from = (me - k + W) % W;
                post_recv(slice + m.begin_of[from], count(from), type, from, m.tag + 1, comm, m.requests);
                post_send(slice + m.begin_of[me], count(me), type, to, m.tag + 1, comm, m.requests);
            }
            m.phase = RankOrderMean<Wire>::Phase::all_gather;
            return false;
        }
        if (m.phase == RankOrderMean<Wire>::Phase::all_gather) m.begin += m.length;
        if (m.begin >= m.n) return true;
        m.length = std::min(reduce_slice_, m.n - m.begin);
        slice = m.data + m.begin;
        m.begin_of.resize(static_cast<size_t>(W) + 1);
        for (int r = 0; r <= W; r++) m.begin_of[r] = m.length * static_cast<size_t>(r) / static_cast<size_t>(W);
        const size_t share = count(me);
        m.stage.resize(std::max(m.stage.size(), share * static_cast<size_t>(W)));
        std::copy(slice + m.begin_of[me], slice + m.begin_of[me + 1],
                  m.stage.begin() + static_cast<std::ptrdiff_t>(share * me));
        for (int k = 1; k < W; k++) {  // reduce-scatter
            const int to = (me + k) % W, from = (me - k + W) % W;
            post_recv(m.stage.data() + share * static_cast<size_t>(from), share, type, from, m.tag, comm, m.requests);
            post_send(slice + m.begin_of[to], count(to), type, to, m.tag, comm, m.requests);
        }
        m.phase = RankOrderMean<Wire>::Phase::reduce_scatter;
        return false;
    }
    // The ends of every all-reduce, blocking or overlapped, so that both give the same bits: values to the bf16
    // wire (nearest even) before, and the sums to means after (times 1/W, from the wire for bf16).
    static void to_bf16_wire(const float* values, uint16_t* wire, size_t n) {
        for (size_t i = 0; i < n; i++) wire[i] = km::bf16_bits_rne(values[i]);
    }
    void sums_to_means(float* values, size_t n) const {
        const float inv = 1.0f / static_cast<float>(world_);
        for (size_t i = 0; i < n; i++) values[i] *= inv;
    }
    void sums_to_means(const uint16_t* wire, float* values, size_t n) const {
        const float inv = 1.0f / static_cast<float>(world_);
        for (size_t i = 0; i < n; i++) values[i] = km::bf16_bits_to_float(wire[i]) * inv;
    }
    static float add_fp32(float a, float b) { return a + b; }
    static uint16_t add_bf16(uint16_t a, uint16_t b) {
        return km::bf16_bits_rne(km::bf16_bits_to_float(a) + km::bf16_bits_to_float(b));
    }
    template <typename Wire, typename Add>
    void drive_to_end(RankOrderMean<Wire>& m, MPI_Datatype type, Add add, MPI_Comm comm) const {
        while (!advance(m, type, add, comm)) {
            MPI_Waitall(static_cast<int>(m.requests.size()), m.requests.data(), MPI_STATUSES_IGNORE);
            m.requests.clear();
        }
    }
    void mean_fp32(float* data, size_t n, std::vector<float>& stage, MPI_Comm comm) const {
        RankOrderMean<float> m;
        m.reset(data, n, kMeanTag);
        m.stage.swap(stage);  // the caller's buffer, kept across calls
        drive_to_end(m, MPI_FLOAT, add_fp32, comm);
        stage.swap(m.stage);
        sums_to_means(data, n);
    }
    void mean_bf16(float* data, uint16_t* wire, size_t n, std::vector<uint16_t>& stage, MPI_Comm comm) const {
        to_bf16_wire(data, wire, n);
        RankOrderMean<uint16_t> m;
        m.reset(wire, n, kMeanTag);
        m.stage.swap(stage);
        drive_to_end(m, MPI_UINT16_T, add_bf16, comm);
        stage.swap(m.stage);
        sums_to_means(wire, data, n);
    }
    // Ring model of an all-reduce of `bytes` (transport.h).
    void count_allreduce(uint64_t bytes) {
        const uint64_t wire = 2 * static_cast<uint64_t>(world_ - 1) * bytes / world_;
        counters_.bytes_sent += wire;
        counters_.bytes_recv += wire;
    }
    // One start()'s ranges of the overlapped all-reduce, on its own communicator (the reducer thread, or
    // finish()). Several ranges are packed into one buffer and travel as one all-reduce: 2 message latencies
    // for a layer instead of as many per tensor (its biases and LayerNorms are a few hundred values each), with
    // the same bits, since every element is summed in rank order either way. The fields after `start` belong
    // to the thread that reduces.
    struct ReduceJob {
        float* base = nullptr;
        std::vector<ParamRange> ranges;
        size_t elems = 0;
        bool bf16 = false;
        size_t start = 0;  // which start() since the last finish() queued it, from 0
        bool begun = false, done = false;
        float* values = nullptr;  // the one nonempty range in place, or `pack`
        std::vector<float> pack;  // the ranges back to back
        std::vector<uint16_t> wire;
        RankOrderMean<float> fp32;
        RankOrderMean<uint16_t> bf16_wire;
    };
    // A buffer of at least n elements from the pool. Buffers keep their size, so a step's jobs find theirs
    // grown already and nothing is zero-filled again (the jobs read only their first elements).
    template <typename T>
    static std::vector<T> take(std::vector<std::vector<T>>& pool, size_t n) {
        std::vector<T> v;
        if (!pool.empty()) {
            v.swap(pool.back());
            pool.pop_back();
        }
        if (v.size() < n) v.resize(n);
        return v;
    }
    // Tags of their own for the jobs in flight: a job whose reduce-scatter completes first may send its
    // all-gather before an earlier job does, and a peer must not take it for the earlier one's.
    static int job_tag(const ReduceJob& job) { return kFirstJobTag + 2 * static_cast<int>(job.start % 8192); }
    void begin_job(ReduceJob& job) {
        const auto nonempty = [](const ParamRange& r) { return r.numel > 0; };
        if (std::count_if(job.ranges.begin(), job.ranges.end(), nonempty) == 1) {
            job.values = job.base + std::find_if(job.ranges.begin(), job.ranges.end(), nonempty)->offset;
        } else {
            job.pack = take(float_pool_, job.elems);
            size_t at = 0;
            for (const ParamRange& r : job.ranges) {
                std::copy(job.base + r.offset, job.base + r.offset + r.numel,
                          job.pack.begin() + static_cast<std::ptrdiff_t>(at));
                at += r.numel;
            }
            job.values = job.pack.data();
        }
        if (job.bf16) {
            job.wire = take(bf16_pool_, job.elems);
            to_bf16_wire(job.values, job.wire.data(), job.elems);
            job.bf16_wire.reset(job.wire.data(), job.elems, job_tag(job));
            job.bf16_wire.stage = take(bf16_pool_, 0);
        } else {
            job.fp32.reset(job.values, job.elems, job_tag(job));
            job.fp32.stage = take(float_pool_, 0);
        }
        job.begun = true;
    }
    void end_job(ReduceJob& job) {
        if (job.bf16) {
            sums_to_means(job.wire.data(), job.values, job.elems);
            bf16_pool_.push_back(std::move(job.wire));
            bf16_pool_.push_back(std::move(job.bf16_wire.stage));
        } else {
            sums_to_means(job.values, job.elems);
            float_pool_.push_back(std::move(job.fp32.stage));
        }
        if (job.values == job.pack.data()) {
            size_t at = 0;
            for (const ParamRange& r : job.ranges) {
                std::copy(job.pack.begin() + static_cast<std::ptrdiff_t>(at),
                          job.pack.begin() + static_cast<std::ptrdiff_t>(at + r.numel), job.base + r.offset);
                at += r.numel;
            }
            float_pool_.push_back(std::move(job.pack));
        }
        job.done = true;
    }
    static std::vector<MPI_Request>& requests_of(ReduceJob& job) {
        return job.bf16 ? job.bf16_wire.requests : job.fp32.requests;
    }
    // Posts the job's next phase (its messages are in); ends it when it is reduced.
    void advance_job(ReduceJob& job) {
        requests_of(job).clear();
        const bool reduced = job.bf16 ? advance(job.bf16_wire, MPI_UINT16_T, add_bf16, reduce_comm_)
                                      : advance(job.fp32, MPI_FLOAT, add_fp32, reduce_comm_);
        if (reduced) end_job(job);
    }
    // One pass of whichever thread reduces (the reducer, or the main thread without one) over the queue: begins
    // jobs up to reduce_jobs_in_flight_, moves those whose messages arrived, and takes the reduced ones off the
    // front (in start order: an empty queue means every started range is done, and one whose front came from
    // start s means the starts before s are). One MPI_Testsome over every job's messages per pass: each test
    // call that finds work pending runs a round of MPI's progress engine (a poll of its sockets). `lock` holds
    // reduce_mutex_ on entry and on return, not in between (a job in the queue stays put while start()
    // appends). Returns whether any job moved.
    bool reduce_pass(std::unique_lock<std::mutex>& lock) {
        while (reduce_active_.size() < reduce_jobs_in_flight_ && reduce_active_.size() < reduce_queue_.size())
            reduce_active_.push_back(&reduce_queue_[reduce_active_.size()]);
        lock.unlock();
        bool moved = false;
        pass_requests_.clear();
        for (ReduceJob* job : reduce_active_) {
            if (!job->begun) {
                begin_job(*job);
                advance_job(*job);
                moved = true;
            }
            const std::vector<MPI_Request>& own = requests_of(*job);
            pass_requests_.insert(pass_requests_.end(), own.begin(), own.end());
        }
        if (!pass_requests_.empty()) {
            int completed = 0;
            pass_indices_.resize(pass_requests_.size());
            MPI_Testsome(static_cast<int>(pass_requests_.size()), pass_requests_.data(), &completed,
                         pass_indices_.data(), MPI_STATUSES_IGNORE);
        }
        size_t at = 0;  // the handles back (MPI_REQUEST_NULL where complete), and the jobs whose messages are all in
        for (ReduceJob* job : reduce_active_) {
            std::vector<MPI_Request>& own = requests_of(*job);
            std::copy(pass_requests_.begin() + static_cast<std::ptrdiff_t>(at),
                      pass_requests_.begin() + static_cast<std::ptrdiff_t>(at + own.size()), own.begin());
            at += own.size();
            const auto arrived = [](MPI_Request r) { return r == MPI_REQUEST_NULL; };
            if (job->done || !std::all_of(own.begin(), own.end(), arrived)) continue;
            advance_job(*job);
            moved = true;
        }
        lock.lock();
        bool popped = false;
        while (!reduce_active_.empty() && reduce_active_.front()->done) {
            reduce_active_.erase(reduce_active_.begin());
            reduce_queue_.pop_front();
            popped = true;
        }
        if (popped) reduce_done_.notify_all();
        return moved;
    }
    // The reducer thread. While nothing arrives it sleeps between passes, leaving the cores to the backward
    // (the kernel moves the TCP data meanwhile), unless finish() waits for it and nothing else runs.
    void run_reducer() {
        std::unique_lock lock(reduce_mutex_);
        for (;;) {
            reduce_ready_.wait(lock, [this] { return reducer_stop_ || !reduce_queue_.empty(); });
            if (reduce_queue_.empty()) return;
            if (!reduce_pass(lock) && !reduce_awaited_.load(std::memory_order_relaxed)) {
                lock.unlock();
                std::this_thread::sleep_for(std::chrono::microseconds(50));
                lock.lock();
            }
        }
    }
    void stop_reducer() {
        if (!reducer_.joinable()) return;
        {
            std::lock_guard lock(reduce_mutex_);
            reducer_stop_ = true;
        }
        reduce_ready_.notify_one();
        reducer_.join();
    }
    // The overlapped gather's sizes (exchanged on gather_comm_ unless equal), offsets and result buffer.
    void lay_out_gather(GatherSizes how) {
        learn_sizes(static_cast<int>(gather_send_.size()), how, gather_sizes_, gather_comm_);
        gather_offsets_ = offsets_of(gather_sizes_);
        gather_all_.resize(gather_offsets_[world_]);
    }
    void count_gather(const std::vector<int>& sizes, const std::vector<size_t>& offsets) {
        const uint64_t total = offsets[world_];
        counters_.bytes_recv += total - static_cast<uint64_t>(sizes[rank_]);
        counters_.bytes_sent += world_ > 1 ? total - static_cast<uint64_t>(sizes[(rank_ + 1) % world_]) : 0;
    }
    void wait_gather() {
        if (gather_thread_.joinable()) gather_thread_.join();
        MPI_Waitall(static_cast<int>(gather_requests_.size()), gather_requests_.data(), MPI_STATUSES_IGNORE);
        gather_requests_.clear();
        gather_in_flight_ = false;
    }

    // The per-step reductions of a few values (the loss and norm of every step, AdamW's 6 KB bitmap of touched
    // embedding rows): every rank sends its values to every other, all at once, and combines them in rank order.
    // One message latency, where MPI_Allreduce's recursive doubling takes log2(W) in a row (2 at 4 ranks, 6 at
    // 64: 40 and 120 ms a step on links with a 20 ms delay); the sums' bits no longer depend on MPI's choice.
    // Above kDirectReduceRanks ranks the W-1 messages per rank cost more than the rounds save: MPI_Allreduce.
    static constexpr int kDirectReduceRanks = 64;
    template <typename T, class Combine>
    void small_allreduce(std::span<T> values, MPI_Datatype type, MPI_Op op, Combine combine) {
        if (world_ == 1 || values.empty()) return;
        if (world_ > kDirectReduceRanks) {
            MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), type, op, comm_);
            return;
        }
        std::vector<T> all;
        std::vector<MPI_Request> requests;
        post_small_allreduce(std::span<const T>(values), type, kSmallReduceTag, all, requests);
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
        combine_in_rank_order(std::span<const T>(all), values, combine);
    }
    // small_allreduce's messages: `mine` to every other rank, theirs into `all` (rank r's values at r * n), whose
    // own slot holds `mine`. `mine` and `all` stay put until the requests complete.
    template <typename T>
    void post_small_allreduce(std::span<const T> mine, MPI_Datatype type, int tag, std::vector<T>& all,
                              std::vector<MPI_Request>& requests) const {
        const size_t n = mine.size();
        all.resize(n * static_cast<size_t>(world_));
        std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(n * rank_));
        for (int k = 1; k < world_; k++) {
            const int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
            post_recv(all.data() + n * static_cast<size_t>(from), n, type, from, tag, comm_, requests);
            post_send(mine.data(), n, type, to, tag, comm_, requests);
        }
    }
    template <typename T, class Combine>
    void combine_in_rank_order(std::span<const T> all, std::span<T> values, Combine combine) const {
        const size_t n = values.size();
        for (size_t i = 0; i < n; i++) {
            T v = all[i];
            for (int r = 1; r < world_; r++) v = combine(v, all[n * static_cast<size_t>(r) + i]);
            values[i] = v;
        }
    }

    // A small reduction split in two (allreduce_sum_start, allreduce_or_start): small_allreduce's messages
    // posted in start() with a tag of the kind's own, so neither the collectives in between nor the other kind
    // can take them, and waited for in finish(); the same rank-order combination, so the same bits.
    template <typename T>
    struct SplitReduction {
        std::vector<T> mine, all;  // this rank's values; every rank's (post_small_allreduce)
        std::vector<MPI_Request> requests;
        bool in_flight = false;
    };
    template <typename T>
    void split_start(SplitReduction<T>& r, std::span<const T> values, MPI_Datatype type, MPI_Op op, int tag,
                     const char* kind) {
        LLMC_CHECK(!r.in_flight, std::string("MPI transport: ") + kind + " was started while another is in flight");
        r.in_flight = true;
        r.mine.assign(values.begin(), values.end());
        r.requests.clear();
        if (world_ == 1 || values.empty()) return;
        if (world_ > kDirectReduceRanks) {
            r.requests.emplace_back();
            MPI_Iallreduce(MPI_IN_PLACE, r.mine.data(), static_cast<int>(r.mine.size()), type, op, comm_,
                           &r.requests.back());
            return;
        }
        post_small_allreduce(std::span<const T>(r.mine), type, tag, r.all, r.requests);
    }
    template <typename T, class Combine>
    void split_finish(SplitReduction<T>& r, std::span<T> values, Combine combine, const char* kind,
                      const char* watched_as) {
        LLMC_CHECK(r.in_flight && values.size() == r.mine.size(),
                   std::string("MPI transport: ") + kind + " finished without its start, or with another count");
        r.in_flight = false;
        {
            const auto watched = watch(watched_as);
            MPI_Waitall(static_cast<int>(r.requests.size()), r.requests.data(), MPI_STATUSES_IGNORE);
        }
        if (world_ == 1 || values.empty() || world_ > kDirectReduceRanks)
            std::copy(r.mine.begin(), r.mine.end(), values.begin());
        else
            combine_in_rank_order(std::span<const T>(r.all), values, combine);
    }

    // One message of `count` elements as pieces of at most message_bytes_ each, appended to `requests`. MPI
    // sends a short message at once (eagerly) and a long one only after a handshake with the receiver: Open
    // MPI's TCP transport above 64 KB with its header, a round trip more on a distant link. In pieces that fit,
    // a phase's messages all travel at once. MPI keeps one sender's messages with one tag in order, so the
    // receiver's pieces match the sender's.
    void post_send(const void* data, size_t count, MPI_Datatype type, int to, int tag, MPI_Comm comm,
                   std::vector<MPI_Request>& requests) const {
        post_pieces(const_cast<void*>(data), count, type, [&](void* at, int n, MPI_Request* request) {
            MPI_Isend(at, n, type, to, tag, comm, request);
        }, requests);
    }
    void post_recv(void* data, size_t count, MPI_Datatype type, int from, int tag, MPI_Comm comm,
                   std::vector<MPI_Request>& requests) const {
        post_pieces(data, count, type, [&](void* at, int n, MPI_Request* request) {
            MPI_Irecv(at, n, type, from, tag, comm, request);
        }, requests);
    }
    template <class Post>
    void post_pieces(void* data, size_t count, MPI_Datatype type, Post post, std::vector<MPI_Request>& requests) const {
        int type_bytes = 1;
        MPI_Type_size(type, &type_bytes);
        const size_t piece = std::max<size_t>(1, message_bytes_ / static_cast<size_t>(type_bytes));
        for (size_t begin = 0; begin < count; begin += piece) {
            requests.emplace_back();
            post(static_cast<std::byte*>(data) + begin * static_cast<size_t>(type_bytes),
                 static_cast<int>(std::min(piece, count - begin)), &requests.back());
        }
    }
    // Message tags: an all-reduce's reduce-scatter kMeanTag (or its job's tag), its all-gather that plus one (a
    // fast rank's all-gather may arrive while this rank still waits in the reduce-scatter); the overlapped
    // all-reduce's jobs from kFirstJobTag up (job_tag: at most 16,399, under the 32,767 every MPI allows); the
    // split reductions kSplitSumTag and kSplitOrTag, as other small reductions run while they are in flight.
    static constexpr int kMeanTag = 1, kGatherTag = 3, kSmallReduceTag = 4, kSplitSumTag = 5, kSplitOrTag = 6,
                         kScatterTag = 7, kInplaceTag = 8,
                         kFirstJobTag = 16;

    MPI_Comm comm_ = MPI_COMM_WORLD;  // the world, or a group of it (split_group)
    int rank_ = 0, world_ = 1;
    bool owns_mpi_ = false;
    // CommOptions (configure): an all-reduce's slice (bounds `stage`), the largest message piece, and whether the
    // overlapped collectives run on helper threads (they need MPI_THREAD_MULTIPLE)
    size_t reduce_slice_ = size_t{1} << 24;
    size_t message_bytes_ = 65536 - 256;
    bool thread_multiple_ = false;
    bool comm_thread_ok_ = false;
    MPI_Comm gather_comm_ = MPI_COMM_NULL;
    std::thread gather_thread_;
    std::vector<MPI_Request> gather_requests_;  // the overlapped all-gather's messages (post_gather)
    std::vector<int> gather_sizes_;
    std::vector<size_t> gather_offsets_;
    std::vector<std::byte> gather_send_, gather_all_;  // the overlapped all-gather's own copy of `mine`; its result
    std::vector<uint16_t> wire_;  // bf16 staging buffer of allreduce_mean_bf16
    SplitReduction<double> split_sum_;  // allreduce_sum_start's
    SplitReduction<uint64_t> split_or_;  // allreduce_or_start's
    std::vector<float> stage_;     // the all-reduces' contributions to this rank's share (RankOrderMean)
    std::vector<uint16_t> stage_bf16_;
    // The overlapped all-reduce: its communicator, the jobs not yet reduced (guarded by reduce_mutex_), and the
    // reducer's buffers.
    MPI_Comm reduce_comm_ = MPI_COMM_NULL;
    std::thread reducer_;
    std::mutex reduce_mutex_;
    std::condition_variable reduce_ready_, reduce_done_;
    std::deque<ReduceJob> reduce_queue_;
    bool reducer_stop_ = false;
    std::atomic<bool> reduce_awaited_{false};  // finish() is waiting for the reducer
    // Overlapped starts reduced at the same time (--mpi_reduce_jobs, default 2): on a link with a delay each
    // start's two phases are mostly waiting, so while one waits another moves. In the bandwidth lab (4 hosts,
    // 1gbit, 20 ms) 1 / 2 / 4 gave 532-546 / 459-489 / 416-436 ms steps; without a delay (2 hosts, 12 layers)
    // 2,050-2,095 / 2,079-2,184 / 2,146-2,434 ms, the backward slower with more in flight on 2 shared cores.
    // Each job in flight holds its packed ranges and a stage, about twice its size.
    size_t reduce_jobs_in_flight_ = 2;
    std::vector<ReduceJob*> reduce_active_;  // the jobs begun and not reduced (the reducing thread's, as below)
    std::vector<MPI_Request> pass_requests_;  // reduce_pass's copy of every active job's requests
    std::vector<int> pass_indices_;
    std::vector<std::vector<float>> float_pool_;  // the jobs' buffers, kept for the next steps' jobs
    std::vector<std::vector<uint16_t>> bf16_pool_;
};

}  // namespace

std::unique_ptr<Transport> make_world_transport(int* argc, char*** argv) {
    return std::make_unique<MpiTransport>(argc, argv);
}

}  // namespace llmc

#else

namespace llmc {
std::unique_ptr<Transport> make_world_transport(int*, char***) { return std::make_unique<LocalTransport>(); }
}  // namespace llmc

#endif
