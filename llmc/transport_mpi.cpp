// MpiTransport: collectives over MPI_COMM_WORLD with the byte counters of transport.h. Failures of MPI calls
// abort the whole job (MPI_ERRORS_ARE_FATAL), so a rank that dies takes the others down instead of leaving
// them blocked in a collective; mpirun reports which rank failed.
// The overlapped all-gather (allgather_bytes_start / _finish) runs on its own duplicate of MPI_COMM_WORLD, so
// it can be in flight while the main thread's collectives go on. With MPI_THREAD_MULTIPLE (Open MPI provides
// it) a helper thread runs the blocking all-gather, which moves the bytes while the trainer computes;
// otherwise (or with LLMC_MPI_GATHER_THREAD=0) it is an MPI_Iallgatherv that MPI may only progress inside
// finish()'s wait. MPI's counts are ints: all-gathers of more than 2 GiB in total run in rounds (gather_in_slices).
#include "llmc/transport_mpi.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "llmc/kernel_math.h"
#include "llmc/error.h"

#ifdef LLMC_USE_MPI
#include <mpi.h>

namespace llmc {

namespace {

// MPI reduction operator for bf16 values carried as 16-bit integers: add in fp32, round back to bf16.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; i++) b[i] = km::bf16_bits_rne(km::bf16_bits_to_float(a[i]) + km::bf16_bits_to_float(b[i]));
}

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
        const char* thread_env = std::getenv("LLMC_MPI_GATHER_THREAD");  // "0": test the MPI_Iallgatherv path
        gather_thread_ok_ = provided >= MPI_THREAD_MULTIPLE && !(thread_env && std::string(thread_env) == "0");
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &world_);
    }
    ~MpiTransport() override {
        // an all-gather still in flight (DeMo's last delayed round) completes: every rank started it
        if (gather_in_flight_) {
            const auto watched = watch("MPI all-gather of the DeMo buckets (at exit)");
            wait_gather();
        }
        if (gather_comm_ != MPI_COMM_NULL) MPI_Comm_free(&gather_comm_);
        if (bf16_sum_op_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_op_);
        if (owns_mpi_) MPI_Finalize();
    }
    std::string_view name() const override { return "mpi"; }
    int rank() const override { return rank_; }
    int world_size() const override { return world_; }

    void allreduce_mean(std::span<float> data) override {
        counters_.payload_bytes += data.size_bytes();
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-reduce of the gradients");
        // MPI counts are int: reduce in slices of at most 2^30 elements.
        constexpr size_t kSlice = size_t{1} << 30;
        for (size_t off = 0; off < data.size(); off += kSlice) {
            const int n = static_cast<int>(std::min(kSlice, data.size() - off));
            MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        const float inv = 1.0f / static_cast<float>(world_);
        for (float& x : data) x *= inv;
        const uint64_t wire = 2 * static_cast<uint64_t>(world_ - 1) * data.size_bytes() / world_;
        counters_.bytes_sent += wire;
        counters_.bytes_recv += wire;
    }

    void allreduce_mean_bf16(std::span<float> data) override {
        counters_.payload_bytes += data.size_bytes() / 2;
        if (world_ == 1) return;
        Timer t(counters_);
        const auto watched = watch("MPI all-reduce of the gradients (bf16)");
        if (bf16_sum_op_ == MPI_OP_NULL) MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_);
        wire_.resize(data.size());
        for (size_t i = 0; i < data.size(); i++) wire_[i] = km::bf16_bits_rne(data[i]);
        constexpr size_t kSlice = size_t{1} << 30;
        for (size_t off = 0; off < data.size(); off += kSlice) {
            const int n = static_cast<int>(std::min(kSlice, data.size() - off));
            MPI_Allreduce(MPI_IN_PLACE, wire_.data() + off, n, MPI_UINT16_T, bf16_sum_op_, MPI_COMM_WORLD);
        }
        const float inv = 1.0f / static_cast<float>(world_);
        for (size_t i = 0; i < data.size(); i++) data[i] = km::bf16_bits_to_float(wire_[i]) * inv;
        const uint64_t wire = 2 * static_cast<uint64_t>(world_ - 1) * (data.size_bytes() / 2) / world_;
        counters_.bytes_sent += wire;
        counters_.bytes_recv += wire;
    }

    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all,
                         std::vector<size_t>& offsets) override {
        counters_.payload_bytes += mine.size();
        Timer t(counters_);
        const auto watched = watch("MPI all-gather of the DeMo buckets");
        LLMC_CHECK(mine.size() <= static_cast<size_t>(INT32_MAX), "allgather: bucket larger than 2 GiB");
        std::vector<int> sizes(world_);
        exchange_sizes(static_cast<int>(mine.size()), sizes, MPI_COMM_WORLD);
        offsets = offsets_of(sizes);
        all.resize(offsets[world_]);
        gather_in_slices(mine.data(), sizes, offsets, all.data(), MPI_COMM_WORLD);
        count_gather(sizes, offsets);
    }

    void allgather_bytes_start(std::span<const std::byte> mine) override {
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
        if (gather_comm_ == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &gather_comm_);
        if (gather_thread_ok_) {
            gather_thread_ = std::thread([this] {
                lay_out_gather();
                gather_in_slices(gather_send_.data(), gather_sizes_, gather_offsets_, gather_all_.data(), gather_comm_);
            });
            return;
        }
        lay_out_gather();
        const std::vector<int> displs = int_displs(gather_offsets_);
        if (gather_offsets_[world_] <= gather_slice_limit())  // one call, moved by MPI meanwhile
            MPI_Iallgatherv(gather_send_.data(), static_cast<int>(gather_send_.size()), MPI_BYTE, gather_all_.data(),
                            gather_sizes_.data(), displs.data(), MPI_BYTE, gather_comm_, &gather_request_);
        else  // too large for one call: the rounds run in finish()
            gather_deferred_ = true;
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
        MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                      MPI_COMM_WORLD);
    }
    void allreduce_max(std::span<double> values) override {
        const auto watched = watch("MPI all-reduce (max) of scalars");
        MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                      MPI_COMM_WORLD);
    }
    void broadcast(std::span<std::byte> data, int root) override {
        const auto watched = watch("MPI broadcast");
        MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, MPI_COMM_WORLD);
    }
    void barrier() override {
        const auto watched = watch("MPI barrier");
        MPI_Barrier(MPI_COMM_WORLD);
    }
    [[noreturn]] void abort(int exit_code) override {
        if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
        if (owns_mpi_) MPI_Finalize();
        std::exit(exit_code);
    }

private:
    void exchange_sizes(int my_size, std::vector<int>& sizes, MPI_Comm comm) const {
        sizes.resize(world_);
        MPI_Allgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
    }
    std::vector<size_t> offsets_of(const std::vector<int>& sizes) const {
        std::vector<size_t> offsets(world_ + 1, 0);
        for (int r = 0; r < world_; r++) offsets[r + 1] = offsets[r] + static_cast<size_t>(sizes[r]);
        return offsets;
    }
    static std::vector<int> int_displs(const std::vector<size_t>& offsets) {
        std::vector<int> displs(offsets.size() - 1);
        for (size_t r = 0; r + 1 < offsets.size(); r++) displs[r] = static_cast<int>(offsets[r]);
        return displs;
    }
    // The most bytes one MPI_Allgatherv may gather (its counts and displacements are ints);
    // LLMC_MPI_GATHER_SLICE lowers it, so tests can exercise the rounds below with small buckets.
    size_t gather_slice_limit() const {
        size_t limit = static_cast<size_t>(INT32_MAX);
        if (const char* env = std::getenv("LLMC_MPI_GATHER_SLICE")) limit = std::min(limit, std::max<size_t>(1, std::strtoull(env, nullptr, 10)));
        return limit;
    }
    // Every rank's sizes[r] bytes into all + offsets[r]. One MPI_Allgatherv when the total fits its int counts;
    // otherwise rounds: round k moves bytes [k s, (k + 1) s) of every bucket (s = limit / world) through a
    // staging buffer, so the paper's 1B model on 64 ranks (3.5 GB of fp32 buckets) still goes through MPI.
    void gather_in_slices(const std::byte* mine, const std::vector<int>& sizes, const std::vector<size_t>& offsets,
                          std::byte* all, MPI_Comm comm) {
        const size_t limit = gather_slice_limit();
        if (offsets[world_] <= limit) {
            const std::vector<int> displs = int_displs(offsets);
            MPI_Allgatherv(mine, sizes[rank_], MPI_BYTE, all, sizes.data(), displs.data(), MPI_BYTE, comm);
            return;
        }
        const size_t slice = std::max<size_t>(1, limit / static_cast<size_t>(world_));
        size_t largest = 0;
        for (int r = 0; r < world_; r++) largest = std::max(largest, static_cast<size_t>(sizes[r]));
        std::vector<std::byte> stage(slice * static_cast<size_t>(world_));
        std::vector<int> counts(world_), displs(world_);
        for (size_t begin = 0; begin < largest; begin += slice) {
            for (int r = 0; r < world_; r++) {
                const size_t size = static_cast<size_t>(sizes[r]);
                counts[r] = static_cast<int>(begin < size ? std::min(slice, size - begin) : 0);
                displs[r] = static_cast<int>(slice * static_cast<size_t>(r));
            }
            MPI_Allgatherv(mine + std::min(begin, static_cast<size_t>(sizes[rank_])), counts[rank_], MPI_BYTE,
                           stage.data(), counts.data(), displs.data(), MPI_BYTE, comm);
            for (int r = 0; r < world_; r++)
                if (counts[r] > 0) std::memcpy(all + offsets[r] + begin, stage.data() + displs[r], static_cast<size_t>(counts[r]));
        }
    }
    // The overlapped gather's sizes (exchanged on gather_comm_), offsets and result buffer.
    void lay_out_gather() {
        exchange_sizes(static_cast<int>(gather_send_.size()), gather_sizes_, gather_comm_);
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
        if (gather_request_ != MPI_REQUEST_NULL) MPI_Wait(&gather_request_, MPI_STATUS_IGNORE);
        if (gather_deferred_) {
            gather_deferred_ = false;
            gather_in_slices(gather_send_.data(), gather_sizes_, gather_offsets_, gather_all_.data(), gather_comm_);
        }
        gather_in_flight_ = false;
    }

    int rank_ = 0, world_ = 1;
    bool owns_mpi_ = false;
    bool gather_deferred_ = false;  // an overlapped gather too large for one MPI_Iallgatherv: finish() runs it
    bool gather_thread_ok_ = false;  // MPI_THREAD_MULTIPLE: the overlapped all-gather runs on a helper thread
    MPI_Comm gather_comm_ = MPI_COMM_NULL;
    std::thread gather_thread_;
    MPI_Request gather_request_ = MPI_REQUEST_NULL;
    std::vector<int> gather_sizes_;
    std::vector<size_t> gather_offsets_;
    std::vector<std::byte> gather_send_, gather_all_;  // the overlapped all-gather's own copy of `mine`; its result
    MPI_Op bf16_sum_op_ = MPI_OP_NULL;
    std::vector<uint16_t> wire_;  // bf16 staging buffer of allreduce_mean_bf16
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
