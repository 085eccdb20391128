// NcclTransport: the Transport (transport.h) of the CUDA trainer, whose training collectives move device
// buffers with NCCL on a dedicated communication stream.
//  - World setup: the process-level transport (make_world_transport: MPI under mpirun when built with
//    LLMC_USE_MPI, else a world of one) gives rank and world size and broadcasts the ncclUniqueId from rank 0;
//    each rank then joins the NCCL communicator. A world of one never touches NCCL.
//  - allreduce_mean: ncclAllReduce(ncclAvg) in place on a device float buffer (a host buffer is staged).
//    allreduce_mean_bf16 (--grad_wire bf16): the values rounded to bf16 on the device, ncclAllReduce(ncclSum)
//    of bf16 (NCCL adds in fp32 and rounds each partial sum to bf16, the MPI transport's arithmetic), then
//    x = float(sum) / world as the CPU transport does.
//  - allreduce_mean_start / _finish (transport.h; device buffers): the same averages per range,
//    enqueued while the backward still runs (AdamW-DDP's overlap, --ddp_overlap in train_gpt.cu); each
//    start is one NCCL group of all-reduces behind an event of the compute stream, and only finish() blocks.
//    A start of more than kPackedRanges ranges (the embedding rows no input touches: thousands of runs) is
//    packed instead: a kernel gathers the ranges back to back into a scratch buffer (in the wire format), one
//    all-reduce moves it, a kernel scatters the averages back, all on the communication stream.
//  - allgather_bytes: GatherSizes::exchange: size exchange (ncclAllGather of one uint64 per rank, which the
//    host waits for), then one grouped ncclBroadcast per rank with its exact size, straight into the
//    concatenated layout (no padding to the largest bucket). GatherSizes::equal (DeMo after its first round):
//    one ncclAllGather, no size exchange, nothing for the host to wait for before the data moves.
//    The interface returns a host vector; allgather_device() is the same collective leaving the result on the
//    device (what a CUDA DeMo wants). `mine` may be host or device memory.
//  - allgather_device_start / _finish (DeMo's --demo_delay 1: a step's buckets travel during the next step's
//    forward and backward): allgather_device split in two. start() exchanges the sizes (tiny, synchronous;
//    with GatherSizes::equal nothing) and enqueues the broadcasts (the all-gather) on the communication stream
//    behind an event of the compute stream, so with equal sizes start() never blocks the host; finish() makes
//    the compute stream wait for them and blocks the host until they are done (finish(false), CudaDemo's: not
//    with one rank, whose "collective" is a device copy with nothing to watch). allgather_device is start then
//    finish (one code path). The host-vector all-gather keeps transport.h's default split (the whole
//    collective inside allgather_bytes_start): CudaDemo uses the device split whenever the transport is NCCL.
//  - Groups (split, the sharded steps' node and replica groups): ncclCommSplit of this communicator beside the
//    same split of the process transport. reduce_scatter_mean: grouped in-place ncclReduce (sum) per rank's
//    range, then the own range times 1 / world; allgather_inplace: grouped in-place ncclBroadcast per range.
//  - allreduce_sum / allreduce_max (host doubles), host broadcast, barrier, abort: delegated to the process
//    transport (MPI), where scalars belong; a device buffer passed to broadcast() goes through ncclBroadcast.
//  - Counters follow transport.h's ring model (the same numbers MpiTransport reports for the same sizes; the
//    overlapped all-reduce counts the ranges of one finish() as one buffer); `seconds` is host wall time from
//    the start of a counted collective until its result is complete, and for the overlapped all-reduce the
//    host's wait in finish() (the communication the backward did not hide). The split all-gather counts as
//    MpiTransport's does: its payload in start(), its wire bytes and one collective in finish(), and the host's
//    time inside start() (the size exchange) and finish() (the wait).
// Every NCCL collective runs inside a CollectiveWatchdog scope with the world transport's --comm_timeout: NCCL
// waits forever for a peer that hangs (on NVLink or shared memory nothing reports it), the watchdog does not.
// The compute stream is made to wait for nothing: callers hand in buffers whose producers are complete (the
// collective first waits on an event recorded on the compute stream, then blocks the host until done). The
// overlapped collectives' finish() is the exception: it also makes the compute stream wait for their end.
#pragma once
#include <nccl.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/comm/transport.h"

namespace llmc {

[[noreturn]] inline void nccl_fail(ncclResult_t r, const char* call, const char* file, int line) {
    std::string advice;
    switch (r) {
        case ncclSystemError:
        case ncclRemoteError:
            advice = "a network/peer failure: check that every rank is alive and NCCL_SOCKET_IFNAME / NCCL_IB_* fit this cluster (NCCL_DEBUG=INFO)";
            break;
        case ncclInvalidUsage:
        case ncclInvalidArgument:
            advice = "ranks disagree on a collective's size or order; rerun with NCCL_DEBUG=WARN";
            break;
        default:
            advice = "rerun with NCCL_DEBUG=INFO for details";
    }
    fail(std::string("NCCL error '") + ncclGetErrorString(r) + "' at " + file + ":" + std::to_string(line) + " in " +
         call + ": " + advice);
}

}  // namespace llmc

#define NCCL_CHECK(call)                                                                     \
    do {                                                                                     \
        const ncclResult_t llmc_nccl_ = (call);                                              \
        if (llmc_nccl_ != ncclSuccess) ::llmc::nccl_fail(llmc_nccl_, #call, __FILE__, __LINE__); \
    } while (0)

namespace llmc {

inline bool is_device_pointer(const void* p) {
    if (p == nullptr) return false;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// The GPU this process should use: the node-local rank (from the launcher's environment) modulo the number of
// visible devices; `fallback_rank` when no launcher variable is set.
inline int local_device_index(int fallback_rank) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    int local = fallback_rank;
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
        if (const char* v = std::getenv(var)) {
            local = std::atoi(v);
            break;
        }
    }
    return count > 0 ? local % count : 0;
}

// --grad_wire bf16 on the device: fp32 -> bf16 (round to nearest even) before the all-reduce, and the sum back
// to fp32 times 1 / world after it (transport_mpi.cpp's arithmetic).
__global__ void bf16_wire_pack_kernel(uint16_t* wire, const float* x, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        wire[i] = km::bf16_bits_rne(x[i]);
}
__global__ void bf16_wire_unpack_kernel(float* x, const uint16_t* wire, size_t n, float inv_world) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = km::bf16_bits_to_float(wire[i]) * inv_world;
}

// Ranges of a buffer packed back to back, for one all-reduce of many ranges. `table` holds n + 1 packed offsets
// (the ranges' starts in the packed buffer, then the total) followed by the n ranges' offsets in the buffer.
// The range holding packed element i: the last k with table[k] <= i.
__device__ inline size_t packed_source(const uint64_t* table, int n, size_t i) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return table[n + 1 + lo] + (i - table[lo]);
}
// packed <- the ranges of x: fp32, or rounded to bf16 (the bf16 wire); and back (bf16: the sums, times inv_world)
__global__ void pack_ranges_kernel(float* packed, const float* x, const uint64_t* table, int n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < table[n]; i += size_t(gridDim.x) * blockDim.x)
        packed[i] = x[packed_source(table, n, i)];
}
__global__ void pack_ranges_bf16_kernel(uint16_t* packed, const float* x, const uint64_t* table, int n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < table[n]; i += size_t(gridDim.x) * blockDim.x)
        packed[i] = km::bf16_bits_rne(x[packed_source(table, n, i)]);
}
__global__ void unpack_ranges_kernel(float* x, const float* packed, const uint64_t* table, int n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < table[n]; i += size_t(gridDim.x) * blockDim.x)
        x[packed_source(table, n, i)] = packed[i];
}
__global__ void unpack_ranges_bf16_kernel(float* x, const uint16_t* packed, const uint64_t* table, int n,
                                          float inv_world) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < table[n]; i += size_t(gridDim.x) * blockDim.x)
        x[packed_source(table, n, i)] = km::bf16_bits_to_float(packed[i]) * inv_world;
}

// x *= factor (the reduce-scatter's mean)
__global__ void scale_kernel(float* x, size_t n, float factor) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] *= factor;
}

class NcclTransport final : public Transport {
public:
    // `world`: the process transport (rank, size, id broadcast, scalars). `compute_stream`: where the buffers
    // handed to collectives are produced. The current CUDA device must already be set. A world of one skips
    // NCCL unless `nccl_for_one_rank` (the checker uses it to exercise the NCCL calls on a single GPU).
    NcclTransport(Transport& world, cudaStream_t compute_stream, bool nccl_for_one_rank = false)
        : world_(world), compute_(compute_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
        set_collective_timeout(world.collective_timeout());
        if (world_.world_size() > 1 || nccl_for_one_rank) {
            ncclUniqueId id;
            std::memset(&id, 0, sizeof(id));
            if (world_.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
            world_.broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(&id), sizeof(id)), 0);
            const auto watched = watch("NCCL communicator setup (ncclCommInitRank)");
            NCCL_CHECK(ncclCommInitRank(&comm_, world_.world_size(), id, world_.rank()));
        }
    }
    // A group of split(): `comm` (ncclCommSplit of the parent's; null for a group of one) over the ranks of
    // `world`, the matching split of the process transport, which this one owns (scalars, the host group).
    NcclTransport(std::unique_ptr<Transport> world, ncclComm_t comm, cudaStream_t compute_stream)
        : owned_world_(std::move(world)), world_(*owned_world_), compute_(compute_stream), comm_(comm) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    }
    ~NcclTransport() override {
        // a device all-gather still in flight (DeMo's last delayed round) completes: every rank enqueued it
        if (device_gather_in_flight_ && gathered_.existing()) {
            const auto watched = watch("NCCL all-gather of the DeMo buckets (at exit)");
            (void)cudaEventSynchronize(gathered_.existing());
        }
        if (comm_) (void)ncclCommDestroy(comm_);
        if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
    }
    NcclTransport(const NcclTransport&) = delete;
    NcclTransport& operator=(const NcclTransport&) = delete;

    std::string_view name() const override { return "nccl"; }
    int rank() const override { return world_.rank(); }
    int world_size() const override { return world_.world_size(); }
    cudaStream_t comm_stream() const { return comm_stream_; }
    bool uses_nccl() const { return comm_ != nullptr; }

    void allreduce_mean(std::span<float> data) override {
        counters_.payload_bytes += data.size_bytes();
        const int W = world_size();
        if (comm_ == nullptr || data.empty()) return;
        Timed timed(counters_);
        const auto watched = watch("NCCL all-reduce of the gradients");
        wait_for_compute();
        float* buf = data.data();
        const bool on_device = is_device_pointer(buf);
        if (!on_device) {
            stage_.reserve_bytes(data.size_bytes());
            CUDA_CHECK(cudaMemcpyAsync(stage_.ptr, buf, data.size_bytes(), cudaMemcpyHostToDevice, comm_stream_));
            buf = reinterpret_cast<float*>(stage_.ptr);
        }
        NCCL_CHECK(ncclAllReduce(buf, buf, data.size(), ncclFloat, ncclAvg, comm_, comm_stream_));
        if (!on_device)
            CUDA_CHECK(cudaMemcpyAsync(data.data(), buf, data.size_bytes(), cudaMemcpyDeviceToHost, comm_stream_));
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
        const uint64_t wire = 2 * static_cast<uint64_t>(W - 1) * data.size_bytes() / W;
        counters_.bytes_sent += wire;
        counters_.bytes_recv += wire;
    }

    void allreduce_mean_bf16(std::span<float> data) override {
        if (data.empty()) return;
        float* buf = data.data();
        const bool on_device = comm_ == nullptr || is_device_pointer(buf);
        if (!on_device) {
            stage_.reserve_bytes(data.size_bytes());
            buf = reinterpret_cast<float*>(stage_.ptr);
            CUDA_CHECK(cudaMemcpy(buf, data.data(), data.size_bytes(), cudaMemcpyHostToDevice));
        }
        const ParamRange whole{0, data.size()};
        allreduce_mean_start(buf, data.size(), std::span<const ParamRange>(&whole, 1), true);
        allreduce_mean_finish();
        if (!on_device) CUDA_CHECK(cudaMemcpy(data.data(), buf, data.size_bytes(), cudaMemcpyDeviceToHost));
    }

protected:
    // The overlapped all-reduce of transport.h (whose books check the ranges); finish also makes the compute
    // stream wait for it. A world of one only counts the payload (allreduce_mean's behaviour).
    void start_allreduce_ranges(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16,
                                size_t elems) override {
        if (comm_ == nullptr || elems == 0) return;
        const auto watched = watch("NCCL all-reduce of the gradients (enqueue)");
        if (ranges.size() > kPackedRanges) {
            start_packed(base, ranges, bf16, elems);
            return;
        }
        uint16_t* wire = nullptr;
        if (bf16) {
            // grows only on a step's first start (total is the same for every start until finish), when nothing
            // in flight reads it
            wire_.reserve_bytes(total * sizeof(uint16_t));
            wire = reinterpret_cast<uint16_t*>(wire_.ptr);
        }
        wait_for_compute();
        if (bf16)
            for (const ParamRange& r : ranges)
                if (r.numel)
                    LLMC_LAUNCH(grid_stride_blocks(r.numel, 256), 256, 0, comm_stream_, bf16_wire_pack_kernel)(
                        wire + r.offset, base + r.offset, r.numel);
        NCCL_CHECK(ncclGroupStart());
        for (const ParamRange& r : ranges) {
            if (r.numel == 0) continue;
            if (bf16)
                NCCL_CHECK(ncclAllReduce(wire + r.offset, wire + r.offset, r.numel, ncclBfloat16, ncclSum, comm_, comm_stream_));
            else
                NCCL_CHECK(ncclAllReduce(base + r.offset, base + r.offset, r.numel, ncclFloat, ncclAvg, comm_, comm_stream_));
        }
        NCCL_CHECK(ncclGroupEnd());
        if (bf16) {
            const float inv = 1.0f / static_cast<float>(world_size());
            for (const ParamRange& r : ranges)
                if (r.numel)
                    LLMC_LAUNCH(grid_stride_blocks(r.numel, 256), 256, 0, comm_stream_, bf16_wire_unpack_kernel)(
                        base + r.offset, wire + r.offset, r.numel, inv);
        }
        CUDA_CHECK_LAUNCH();
    }

    // More ranges than this in one start travel packed into one all-reduce (start_packed).
    static constexpr size_t kPackedRanges = 16;

    // One start's ranges gathered into pack_ (fp32, or bf16 for the bf16 wire), all-reduced as one buffer, and
    // scattered back, on the communication stream behind the compute stream. Its scratch buffers are reused by the
    // next packed start only behind this one on the same stream. Growing them (cudaFree, cudaFreeHost) waits for
    // the device, so they are sized to last: the packed buffer for the ranges' whole span plus an eighth (the
    // trainer's early embedding rows change every step, their span hardly), the table in powers of two.
    void start_packed(float* base, std::span<const ParamRange> ranges, bool bf16, size_t elems) {
        std::vector<uint64_t> table;  // packed offsets (n + 1), then the ranges' offsets (n)
        uint64_t packed = 0;
        size_t lowest = SIZE_MAX, end = 0;
        for (const ParamRange& r : ranges)
            if (r.numel) {
                table.push_back(packed);
                packed += r.numel;
                lowest = std::min(lowest, r.offset);
                end = std::max(end, r.offset + r.numel);
            }
        const int n = static_cast<int>(table.size());
        table.push_back(packed);
        for (const ParamRange& r : ranges)
            if (r.numel) table.push_back(r.offset);
        table.resize(std::bit_ceil(std::max<size_t>(table.size(), 4096)));
        table_.reserve_bytes(table.size() * sizeof(uint64_t));
        const size_t wire_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
        if (elems * wire_bytes > pack_.bytes) pack_.reserve_bytes((end - lowest) * wire_bytes * 9 / 8);
        auto* device_table = reinterpret_cast<uint64_t*>(table_.ptr);
        wait_for_compute();
        table_upload_.upload(device_table, table.data(), table.size(), comm_stream_);
        const int blocks = grid_stride_blocks(elems, 256);
        if (bf16) {
            auto* wire = reinterpret_cast<uint16_t*>(pack_.ptr);
            LLMC_LAUNCH(blocks, 256, 0, comm_stream_, pack_ranges_bf16_kernel)(wire, base, device_table, n);
            NCCL_CHECK(ncclAllReduce(wire, wire, elems, ncclBfloat16, ncclSum, comm_, comm_stream_));
            LLMC_LAUNCH(blocks, 256, 0, comm_stream_, unpack_ranges_bf16_kernel)(
                base, wire, device_table, n, 1.0f / static_cast<float>(world_size()));
        } else {
            auto* values = reinterpret_cast<float*>(pack_.ptr);
            LLMC_LAUNCH(blocks, 256, 0, comm_stream_, pack_ranges_kernel)(values, base, device_table, n);
            NCCL_CHECK(ncclAllReduce(values, values, elems, ncclFloat, ncclAvg, comm_, comm_stream_));
            LLMC_LAUNCH(blocks, 256, 0, comm_stream_, unpack_ranges_kernel)(base, values, device_table, n);
        }
        CUDA_CHECK_LAUNCH();
    }

    void finish_allreduce_ranges(size_t elems, bool bf16) override {
        const size_t bytes = elems * (bf16 ? sizeof(uint16_t) : sizeof(float));
        counters_.payload_bytes += bytes;
        if (comm_ == nullptr || elems == 0) return;  // start enqueued nothing
        Timed timed(counters_);
        const auto watched = watch("NCCL all-reduce of the gradients");
        reduced_.record(comm_stream_);
        reduced_.wait_in(compute_);
        reduced_.synchronize();
        const int W = world_size();
        const uint64_t wire = 2 * static_cast<uint64_t>(W - 1) * bytes / W;
        counters_.bytes_sent += wire;
        counters_.bytes_recv += wire;
    }

    // The starts' all-reduces are queued on the communication stream in order: waiting for all of it covers them.
    void wait_allreduce_ranges(size_t starts) override {
        if (comm_ == nullptr || starts == 0) return;
        const auto watched = watch("NCCL all-reduce of the gradients (early ranges)");
        const auto start = std::chrono::steady_clock::now();
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
        counters_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }

public:
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes how) override {
        Timed timed(counters_);
        const auto watched = watch("NCCL all-gather of the DeMo buckets");
        gather_.reserve_bytes(1);  // make sure a device target exists even for empty gathers
        const size_t total = gather_sizes(mine.size(), how, offsets);
        gather_.reserve_bytes(total);
        count_wire(gather_into_device(mine, gather_.ptr, offsets, how));
        all.resize(total);
        if (total) CUDA_CHECK(cudaMemcpyAsync(all.data(), gather_.ptr, total, cudaMemcpyDeviceToHost, comm_stream_));
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    }

    // Like allgather_bytes, with the concatenation left on the device: `out` must hold `capacity` bytes (the
    // required size is offsets.back(); throws if it does not fit). `mine` may be host or device memory.
    void allgather_device(std::span<const std::byte> mine, std::byte* out, size_t capacity, std::vector<size_t>& offsets,
                          GatherSizes how) {
        allgather_device_start(mine, out, capacity, offsets, how);
        allgather_device_finish();
    }

    // allgather_device in two halves. start() fills `offsets` at once (the size exchange, if any) and enqueues the
    // broadcasts behind the compute stream's work so far; `mine` and `out` must stay untouched until finish()
    // (the broadcasts read `mine` and write `out` meanwhile), after which the compute stream's later work sees
    // the result. One device all-gather at a time; other collectives may run in between (they queue behind it
    // on the communication stream).
    void allgather_device_start(std::span<const std::byte> mine, std::byte* out, size_t capacity,
                                std::vector<size_t>& offsets, GatherSizes how) {
        LLMC_CHECK(!device_gather_in_flight_, "NCCL: a device all-gather was started while another is in flight");
        const auto start = std::chrono::steady_clock::now();
        {
            const auto watched = watch("NCCL all-gather of the DeMo buckets (start)");
            const size_t total = gather_sizes(mine.size(), how, offsets);
            LLMC_CHECK(total <= capacity, "allgather_device: gathered buckets need " + std::to_string(total) +
                                              " bytes, the output holds " + std::to_string(capacity));
            device_wire_ = gather_into_device(mine, out, offsets, how);  // counted by finish()
            gathered_.record(comm_stream_);
        }
        device_gather_in_flight_ = true;
        counters_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    void allgather_device_finish(bool host_waits = true) {
        LLMC_CHECK(device_gather_in_flight_, "NCCL: device all-gather finished without a start");
        Timed timed(counters_);
        device_gather_in_flight_ = false;
        count_wire(device_wire_);
        gathered_.wait_in(compute_);
        if (comm_ == nullptr && !host_waits) return;  // one rank: a device copy, ordered for the compute stream
        const auto watched = watch("NCCL all-gather of the DeMo buckets");
        gathered_.synchronize();
    }
    bool allgather_device_in_flight() const { return device_gather_in_flight_; }

    HostGroup host_group() override { return world_.host_group(); }

    // The sharded step's reduce-scatter on a device buffer: one ncclReduce (sum) per rank's range, grouped, in
    // place, then this rank's range times 1 / world (the MPI transport's arithmetic), on the communication stream.
    void reduce_scatter_mean(std::span<float> data, std::span<const size_t> offsets) override {
        check_group_offsets(offsets, data.size(), "reduce-scatter");
        counters_.payload_bytes += data.size_bytes();
        const int W = world_size(), r = rank();
        if (comm_ == nullptr || data.empty()) return;
        LLMC_CHECK(is_device_pointer(data.data()), "NCCL reduce-scatter: the gradients must be in device memory");
        Timed timed(counters_);
        const auto watched = watch("NCCL reduce-scatter of the gradients (sharded step)");
        wait_for_compute();
        NCCL_CHECK(ncclGroupStart());
        for (int root = 0; root < W; root++) {
            float* range = data.data() + offsets[root];
            const size_t n = offsets[root + 1] - offsets[root];
            if (n) NCCL_CHECK(ncclReduce(range, range, n, ncclFloat, ncclSum, root, comm_, comm_stream_));
        }
        NCCL_CHECK(ncclGroupEnd());
        const size_t mine = offsets[r + 1] - offsets[r];
        if (mine) {
            LLMC_LAUNCH(grid_stride_blocks(mine, 256), 256, 0, comm_stream_, scale_kernel)(
                data.data() + offsets[r], mine, 1.0f / static_cast<float>(W));
            CUDA_CHECK_LAUNCH();
        }
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
        counters_.bytes_sent += (offsets[W] - mine) * sizeof(float);
        counters_.bytes_recv += static_cast<uint64_t>(W - 1) * mine * sizeof(float);
    }

    // The sharded step's all-gather of the updated weights on a device buffer: one ncclBroadcast per rank's
    // range, grouped, in place.
    void allgather_inplace(std::span<std::byte> data, std::span<const size_t> offsets) override {
        check_group_offsets(offsets, data.size(), "in-place all-gather");
        const int W = world_size(), r = rank();
        const size_t mine = offsets[r + 1] - offsets[r];
        counters_.payload_bytes += mine;
        if (comm_ == nullptr || data.empty()) return;
        LLMC_CHECK(is_device_pointer(data.data()), "NCCL in-place all-gather: the weights must be in device memory");
        Timed timed(counters_);
        const auto watched = watch("NCCL all-gather of the updated weights (sharded step)");
        wait_for_compute();
        NCCL_CHECK(ncclGroupStart());
        for (int root = 0; root < W; root++) {
            std::byte* range = data.data() + offsets[root];
            const size_t n = offsets[root + 1] - offsets[root];
            if (n) NCCL_CHECK(ncclBroadcast(range, range, n, ncclUint8, root, comm_, comm_stream_));
        }
        NCCL_CHECK(ncclGroupEnd());
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
        counters_.bytes_sent += static_cast<uint64_t>(W - 1) * mine;
        counters_.bytes_recv += offsets[W] - mine;
    }

    void allreduce_sum(std::span<double> values) override { world_.allreduce_sum(values); }
    void allreduce_sum_start(std::span<const double> values) override { world_.allreduce_sum_start(values); }
    void allreduce_sum_finish(std::span<double> values) override { world_.allreduce_sum_finish(values); }
    void allreduce_max(std::span<double> values) override { world_.allreduce_max(values); }
    void allreduce_or(std::span<uint64_t> bits) override { world_.allreduce_or(bits); }
    void allreduce_or_start(std::span<const uint64_t> bits) override { world_.allreduce_or_start(bits); }
    void allreduce_or_finish(std::span<uint64_t> bits) override { world_.allreduce_or_finish(bits); }

    void broadcast(std::span<std::byte> data, int root) override {
        if (data.empty()) return;
        if (comm_ == nullptr || !is_device_pointer(data.data())) {
            world_.broadcast(data, root);
            return;
        }
        const auto watched = watch("NCCL broadcast");
        wait_for_compute();
        NCCL_CHECK(ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8, root, comm_, comm_stream_));
        CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    }

    void barrier() override { world_.barrier(); }

    [[noreturn]] void abort(int exit_code) override {
        if (comm_) (void)ncclCommAbort(comm_);
        comm_ = nullptr;
        world_.abort(exit_code);
        std::_Exit(exit_code);  // not reached: Transport::abort does not return
    }

protected:
    // A communicator of the ranks with this color (ncclCommSplit), beside the same split of the process transport.
    std::unique_ptr<Transport> split_group(int color, int key) override {
        std::unique_ptr<Transport> world = world_.split(color, key, Link::inter);
        ncclComm_t sub = nullptr;
        if (comm_) {
            const auto watched = watch("NCCL communicator split (ncclCommSplit)");
            NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
        }
        if (sub && world->world_size() == 1) {  // a group of one moves nothing, as a world of one
            NCCL_CHECK(ncclCommDestroy(sub));
            sub = nullptr;
        }
        return std::make_unique<NcclTransport>(std::move(world), sub, compute_);
    }

private:
    // Grow-only device staging buffer.
    struct Scratch {
        std::byte* ptr = nullptr;
        size_t bytes = 0;
        ~Scratch() {
            if (ptr) (void)cudaFree(ptr);
        }
        void reserve_bytes(size_t n) {
            if (n <= bytes) return;
            if (ptr) CUDA_CHECK(cudaFree(ptr));
            ptr = nullptr;
            bytes = 0;
            CUDA_CHECK(cudaMalloc(&ptr, n));
            bytes = n;
        }
    };
    struct Timed {
        CommCounters& c;
        std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
        explicit Timed(CommCounters& counters) : c(counters) {}
        ~Timed() {
            c.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            c.collectives++;
        }
    };

    void wait_for_compute() {
        ready_.record(compute_);
        ready_.wait_in(comm_stream_);
    }

    // Every rank's bucket size: exchanged, or my_size everywhere (GatherSizes::equal); fills offsets (world + 1
    // entries) and returns the total. Counts the payload.
    size_t gather_sizes(size_t my_size, GatherSizes how, std::vector<size_t>& offsets) {
        const int W = world_size(), r = rank();
        counters_.payload_bytes += my_size;
        std::vector<uint64_t> sizes(W, my_size);
        if (comm_ && how == GatherSizes::exchange) {
            counters_.size_exchanges++;
            sizes_.reserve_bytes(W * sizeof(uint64_t));
            uint64_t* dev = reinterpret_cast<uint64_t*>(sizes_.ptr);
            const uint64_t mine64 = my_size;
            CUDA_CHECK(cudaMemcpyAsync(dev + r, &mine64, sizeof(uint64_t), cudaMemcpyHostToDevice, comm_stream_));
            NCCL_CHECK(ncclAllGather(dev + r, dev, 1, ncclUint64, comm_, comm_stream_));
            CUDA_CHECK(cudaMemcpyAsync(sizes.data(), dev, W * sizeof(uint64_t), cudaMemcpyDeviceToHost, comm_stream_));
            CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
        }
        offsets.assign(W + 1, 0);
        for (int i = 0; i < W; i++) offsets[i + 1] = offsets[i] + sizes[i];
        return offsets[W];
    }

    struct WireBytes {
        uint64_t sent = 0, recv = 0;
    };
    void count_wire(WireBytes w) {
        counters_.bytes_sent += w.sent;
        counters_.bytes_recv += w.recv;
    }
    // Every rank's bucket into out[offsets[r], offsets[r+1]) (enqueued on the comm stream; caller syncs). Returns
    // the ring model's wire bytes, for the caller to count at the end of the collective.
    WireBytes gather_into_device(std::span<const std::byte> mine, std::byte* out, const std::vector<size_t>& offsets,
                                 GatherSizes how) {
        const int W = world_size(), r = rank();
        wait_for_compute();
        std::byte* my_slot = out + offsets[r];
        const bool on_device = !mine.empty() && is_device_pointer(mine.data());
        if (comm_ && how == GatherSizes::equal && on_device) {  // straight from `mine`: no copy into the output
            NCCL_CHECK(ncclAllGather(mine.data(), out, mine.size(), ncclUint8, comm_, comm_stream_));
        } else if (!mine.empty()) {
            const cudaMemcpyKind kind = on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
            CUDA_CHECK(cudaMemcpyAsync(my_slot, mine.data(), mine.size(), kind, comm_stream_));
        }
        if (comm_ && how == GatherSizes::equal && !on_device) {  // in place: this rank's slot is in the output now
            const size_t n = offsets[r + 1] - offsets[r];
            if (n) NCCL_CHECK(ncclAllGather(my_slot, out, n, ncclUint8, comm_, comm_stream_));
        } else if (comm_ && how == GatherSizes::exchange) {
            NCCL_CHECK(ncclGroupStart());
            for (int root = 0; root < W; root++) {
                const size_t n = offsets[root + 1] - offsets[root];
                if (n == 0) continue;
                std::byte* slot = out + offsets[root];
                NCCL_CHECK(ncclBroadcast(slot, slot, n, ncclUint8, root, comm_, comm_stream_));
            }
            NCCL_CHECK(ncclGroupEnd());
        }
        const uint64_t total = offsets[W];
        const uint64_t own = offsets[r + 1] - offsets[r];
        const int next = (r + 1) % W;
        return {W > 1 ? total - (offsets[next + 1] - offsets[next]) : 0, total - own};
    }

    std::unique_ptr<Transport> owned_world_;  // a group's split of the process transport (null for the world)
    Transport& world_;
    cudaStream_t compute_;
    cudaStream_t comm_stream_ = nullptr;
    CudaEvent ready_;     // the compute stream's position, which the next collective waits for
    CudaEvent reduced_;   // the overlapped all-reduce's end, for finish()
    CudaEvent gathered_;  // the split device all-gather's end, for allgather_device_finish()
    ncclComm_t comm_ = nullptr;
    Scratch stage_, gather_, sizes_, wire_;
    Scratch pack_, table_;                   // start_packed: the ranges back to back, and their offsets
    PinnedUpload<uint64_t> table_upload_;
    // the split device all-gather: between start and finish, and its wire bytes (counted by finish)
    bool device_gather_in_flight_ = false;
    WireBytes device_wire_;
};

}  // namespace llmc
