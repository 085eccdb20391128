// MpiTransport: collectives over MPI_COMM_WORLD with the byte counters of transport.h. Failures of MPI calls
// abort the whole job (MPI_ERRORS_ARE_FATAL), so a rank that dies takes the others down instead of leaving
// them blocked in a collective; mpirun reports which rank failed.
#include "llmc/transport_mpi.h"

#include <chrono>
#include <cstdlib>

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

class Timer {
public:
    explicit Timer(CommCounters& c) : c_(c), start_(std::chrono::steady_clock::now()) {}
    ~Timer() {
        c_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        c_.collectives++;
    }

private:
    CommCounters& c_;
    std::chrono::steady_clock::time_point start_;
};

class MpiTransport final : public Transport {
public:
    MpiTransport(int* argc, char*** argv) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            if (MPI_Init(argc, argv) != MPI_SUCCESS) fail("MPI_Init failed (is the MPI runtime installed?)");
            owns_mpi_ = true;
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &world_);
    }
    ~MpiTransport() override {
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
        const int my_size = static_cast<int>(mine.size());
        std::vector<int> sizes(world_), displs(world_);
        MPI_Allgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
        offsets.assign(world_ + 1, 0);
        for (int r = 0; r < world_; r++) offsets[r + 1] = offsets[r] + static_cast<size_t>(sizes[r]);
        LLMC_CHECK(offsets[world_] <= static_cast<size_t>(INT32_MAX), "allgather: buckets larger than 2 GiB in total");
        for (int r = 0; r < world_; r++) displs[r] = static_cast<int>(offsets[r]);
        all.resize(offsets[world_]);
        MPI_Allgatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE,
                       MPI_COMM_WORLD);
        const uint64_t total = offsets[world_];
        counters_.bytes_recv += total - static_cast<uint64_t>(sizes[rank_]);
        counters_.bytes_sent += world_ > 1 ? total - static_cast<uint64_t>(sizes[(rank_ + 1) % world_]) : 0;
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
    int rank_ = 0, world_ = 1;
    bool owns_mpi_ = false;
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
