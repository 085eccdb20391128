// HostStagedTransport: the CUDA trainer's communication without NCCL. It wraps the process transport (MPI
// under mpirun) and moves device buffers through pinned host memory: a device gradient is copied to the host,
// averaged by the wrapped transport's all-reduce, and copied back; a device DeMo bucket is copied to the host
// before the all-gather (CudaDemo already reads gathered buckets from host memory with any non-NCCL
// transport). For clusters without NCCL, or to compare against it: LLMC_TRANSPORT=mpi ./train_gpt ...
// Byte counters and communication time are the wrapped transport's (the same ring model as NcclTransport);
// the staging copies are counted as communication time, since they exist only to communicate.
// The split all-gather (allgather_bytes_start / _finish, DeMo's --demo_delay 1) is the wrapped transport's, so
// MPI overlaps it with the next step's compute; a device `mine` is staged in a host buffer of its own, which
// the collectives in between do not touch.
// The overlapped all-reduce (allreduce_mean_start / _finish, AdamW-DDP's gradients during the backward) is the
// wrapped transport's too: each start waits for the compute stream (the backward kernels that wrote its
// ranges; the host is then briefly not ahead of the device), copies the ranges into the pinned buffer, which
// mirrors the whole gradient, and hands them to the wrapped transport's start (MPI's reducer thread);
// finish waits for it and copies the averaged ranges back. Until that finish the pinned buffer is theirs:
// the other staged collectives refuse to run.
#pragma once
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/cuda_common.cuh"
#include "llmc/transport.h"
#include "llmc/transport_nccl.cuh"  // is_device_pointer

namespace llmc {

class HostStagedTransport final : public Transport {
public:
    HostStagedTransport(Transport& world, cudaStream_t compute_stream) : world_(world), stream_(compute_stream) {}
    ~HostStagedTransport() override {
        if (host_) (void)cudaFreeHost(host_);
    }
    HostStagedTransport(const HostStagedTransport&) = delete;
    HostStagedTransport& operator=(const HostStagedTransport&) = delete;

    std::string_view name() const override { return "mpi (host-staged)"; }
    int rank() const override { return world_.rank(); }
    int world_size() const override { return world_.world_size(); }

    void allreduce_mean(std::span<float> data) override {
        staged(data, [&](std::span<float> host) { world_.allreduce_mean(host); });
    }
    void allreduce_mean_bf16(std::span<float> data) override {
        staged(data, [&](std::span<float> host) { world_.allreduce_mean_bf16(host); });
    }
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes how) override {
        const auto start = std::chrono::steady_clock::now();
        std::span<const std::byte> host = mine;
        if (!mine.empty() && is_device_pointer(mine.data())) {
            reserve(mine.size());
            CUDA_CHECK(cudaMemcpyAsync(host_, mine.data(), mine.size(), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            host = std::span<const std::byte>(host_, mine.size());
        }
        world_.reset_counters();
        world_.allgather_bytes(host, all, offsets, how);
        absorb_counters(start);
    }
    void allgather_bytes_start(std::span<const std::byte> mine, GatherSizes how) override {
        const auto start = std::chrono::steady_clock::now();
        std::span<const std::byte> host = mine;
        if (!mine.empty() && is_device_pointer(mine.data())) {
            gather_host_.resize(mine.size());  // pageable: the copy completes before it returns
            CUDA_CHECK(cudaMemcpyAsync(gather_host_.data(), mine.data(), mine.size(), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            host = gather_host_;
        }
        world_.reset_counters();
        world_.allgather_bytes_start(host, how);
        absorb_counters(start);
    }
    void allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) override {
        const auto start = std::chrono::steady_clock::now();
        world_.reset_counters();
        world_.allgather_bytes_finish(all, offsets);
        absorb_counters(start);
    }
    void allreduce_sum(std::span<double> values) override { world_.allreduce_sum(values); }
    void allreduce_max(std::span<double> values) override { world_.allreduce_max(values); }
    void broadcast(std::span<std::byte> data, int root) override {
        if (data.empty() || !is_device_pointer(data.data())) {
            world_.broadcast(data, root);
            return;
        }
        reserve(data.size());
        CUDA_CHECK(cudaMemcpyAsync(host_, data.data(), data.size(), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        world_.broadcast(std::span<std::byte>(host_, data.size()), root);
        CUDA_CHECK(cudaMemcpyAsync(data.data(), host_, data.size(), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void barrier() override { world_.barrier(); }
    [[noreturn]] void abort(int exit_code) override {
        world_.abort(exit_code);
        std::_Exit(exit_code);  // not reached: Transport::abort does not return
    }

protected:
    void start_allreduce_ranges(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16,
                                size_t) override {
        float* host = base;
        if (is_device_pointer(base)) {
            CUDA_CHECK(cudaStreamSynchronize(stream_));  // the backward's kernels: compute time, not communication
            if (overlapped_.empty()) reserve(total * sizeof(float));  // the first start: nothing in it is in flight
            host = reinterpret_cast<float*>(host_);
        }
        const auto start = std::chrono::steady_clock::now();
        if (host != base) copy_ranges(host, base, ranges, cudaMemcpyDeviceToHost);
        world_.reset_counters();
        world_.allreduce_mean_start(host, total, ranges, bf16);
        absorb_counters(start);
        overlapped_base_ = base;
        overlapped_.insert(overlapped_.end(), ranges.begin(), ranges.end());
    }
    void finish_allreduce_ranges(size_t, bool) override {
        const auto start = std::chrono::steady_clock::now();
        world_.reset_counters();
        world_.allreduce_mean_finish();
        if (!overlapped_.empty() && is_device_pointer(overlapped_base_))
            copy_ranges(overlapped_base_, reinterpret_cast<const float*>(host_), overlapped_, cudaMemcpyHostToDevice);
        overlapped_.clear();
        absorb_counters(start);
    }

private:
    // dst[r] <- src[r] for each range r of two buffers laid out alike; returns when the copies are done
    void copy_ranges(float* dst, const float* src, std::span<const ParamRange> ranges, cudaMemcpyKind kind) {
        for (const ParamRange& r : ranges)
            if (r.numel)
                CUDA_CHECK(cudaMemcpyAsync(dst + r.offset, src + r.offset, r.numel * sizeof(float), kind, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    template <class Reduce>
    void staged(std::span<float> data, Reduce reduce) {
        const auto start = std::chrono::steady_clock::now();
        world_.reset_counters();
        if (data.empty() || !is_device_pointer(data.data())) {
            reduce(data);
        } else {
            reserve(data.size_bytes());
            // The producer of `data` ran on the compute stream: copying on that stream orders after it.
            CUDA_CHECK(cudaMemcpyAsync(host_, data.data(), data.size_bytes(), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            float* host = reinterpret_cast<float*>(host_);
            reduce(std::span<float>(host, data.size()));
            CUDA_CHECK(cudaMemcpyAsync(data.data(), host, data.size_bytes(), cudaMemcpyHostToDevice, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        absorb_counters(start);
    }
    void absorb_counters(std::chrono::steady_clock::time_point start) {
        const CommCounters& c = world_.counters();
        counters_.bytes_sent += c.bytes_sent;
        counters_.bytes_recv += c.bytes_recv;
        counters_.payload_bytes += c.payload_bytes;
        counters_.collectives += c.collectives;
        counters_.size_exchanges += c.size_exchanges;
        counters_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    void reserve(size_t bytes) {
        LLMC_CHECK(overlapped_.empty(), "host-staged transport: a collective through the staging buffer while the "
                                        "overlapped all-reduce holds it (finish that first)");
        if (bytes <= host_bytes_) return;
        if (host_) CUDA_CHECK(cudaFreeHost(host_));
        host_ = nullptr;
        host_bytes_ = 0;
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), bytes));
        host_bytes_ = bytes;
    }

    Transport& world_;
    cudaStream_t stream_;
    std::byte* host_ = nullptr;  // pinned, grow-only
    std::vector<std::byte> gather_host_;  // a device bucket of the split all-gather, until its finish()
    size_t host_bytes_ = 0;
    float* overlapped_base_ = nullptr;    // the overlapped all-reduce's gradient buffer and the ranges started
    std::vector<ParamRange> overlapped_;  // since its last finish (their host copies live in host_)
};

}  // namespace llmc
