// HostStagedTransport: the CUDA trainer's communication without NCCL. It wraps the process transport (MPI
// under mpirun) and moves device buffers through pinned host memory: a device gradient is copied to the host,
// averaged by the wrapped transport's all-reduce, and copied back; a device DeMo bucket is copied to the host
// before the all-gather (CudaDemo already reads gathered buckets from host memory with any non-NCCL
// transport). For clusters without NCCL, or to compare against it: --transport mpi ./train_gpt ...
// Byte counters and communication time are the wrapped transport's (the same ring model as NcclTransport);
// the staging copies of the blocking collectives are counted as communication time, since they exist only to
// communicate.
// Groups (split, the sharded steps) wrap the same split of the process transport; their reduce-scatter and
// in-place all-gather stage the whole buffer.
// The split all-gather (allgather_bytes_start / _finish, DeMo's --demo_delay 1) is the wrapped transport's, so
// MPI overlaps it with the next step's compute; a device `mine` is staged in a host buffer of its own, which
// the collectives in between do not touch.
// The overlapped all-reduce (allreduce_mean_start / _finish, AdamW-DDP's gradients during the backward) runs
// on a copy stream of its own, so neither the backward's kernels nor the host wait for it during the
// backward: each start enqueues, behind an event of the compute stream (the kernels that wrote its ranges),
// the copies of the ranges into the pinned buffer, which mirrors the whole gradient, and returns. A started
// group goes to the wrapped transport's start (MPI's reducer thread) once its copies are done: at a later start
// if they are by then, else in finish(), which waits for each group's copies in turn and hands it over at
// once (the host reaches finish() while the GPU is still in the backward, so the reducer gets each layer about
// when the GPU finishes it). finish() then enqueues each group's copies back on the copy stream as soon as the
// reducer has averaged it (allreduce_mean_wait), while the reducer goes on with the next groups; the compute
// stream waits for the last copy, the host does not. Only the waits for the reducer count as communication
// time (the copies to the host overlap the backward; waiting for them is waiting for the backward). Until
// that finish the pinned buffer is the overlapped all-reduce's: the other staged collectives refuse to run.
#pragma once
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/comm/transport.h"
#include "llmc/comm/transport_nccl.cuh"  // is_device_pointer

namespace llmc {

class HostStagedTransport final : public Transport {
public:
    HostStagedTransport(Transport& world, cudaStream_t compute_stream) : world_(world), stream_(compute_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    }
    // A group of split(): over `world`, the same split of the process transport, which this one owns.
    HostStagedTransport(std::unique_ptr<Transport> world, cudaStream_t compute_stream)
        : owned_world_(std::move(world)), world_(*owned_world_), stream_(compute_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    }
    ~HostStagedTransport() override {
        if (copy_stream_) (void)cudaStreamSynchronize(copy_stream_);  // nothing may still read host_
        if (copy_stream_) (void)cudaStreamDestroy(copy_stream_);
        // Groups handed over and never finished (an error ended the step): the wrapped transport's reducer may
        // still read host_, and the process is ending, so it stays.
        if (host_ && handed_ == 0) (void)cudaFreeHost(host_);
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
        timed_world([&] {
            std::span<const std::byte> host = mine;
            if (!mine.empty() && is_device_pointer(mine.data())) {
                reserve(mine.size());
                CUDA_CHECK(cudaMemcpyAsync(host_, mine.data(), mine.size(), cudaMemcpyDeviceToHost, stream_));
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                host = std::span<const std::byte>(host_, mine.size());
            }
            world_.allgather_bytes(host, all, offsets, how);
        });
    }
    void allgather_bytes_start(std::span<const std::byte> mine, GatherSizes how) override {
        timed_world([&] {
            std::span<const std::byte> host = mine;
            if (!mine.empty() && is_device_pointer(mine.data())) {
                gather_host_.resize(mine.size());  // pageable: the copy completes before it returns
                CUDA_CHECK(cudaMemcpyAsync(gather_host_.data(), mine.data(), mine.size(), cudaMemcpyDeviceToHost, stream_));
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                host = gather_host_;
            }
            world_.allgather_bytes_start(host, how);
        });
    }
    void allgather_bytes_finish(std::vector<std::byte>& all, std::vector<size_t>& offsets) override {
        timed_world([&] { world_.allgather_bytes_finish(all, offsets); });
    }
    HostGroup host_group() override { return world_.host_group(); }
    void reduce_scatter_mean(std::span<float> data, std::span<const size_t> offsets) override {
        staged(data, [&](std::span<float> host) { world_.reduce_scatter_mean(host, offsets); });
    }
    void allgather_inplace(std::span<std::byte> data, std::span<const size_t> offsets) override {
        timed_world([&] {
            if (data.empty() || !is_device_pointer(data.data())) return world_.allgather_inplace(data, offsets);
            reserve(data.size());
            CUDA_CHECK(cudaMemcpyAsync(host_, data.data(), data.size(), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            world_.allgather_inplace(std::span<std::byte>(host_, data.size()), offsets);
            CUDA_CHECK(cudaMemcpyAsync(data.data(), host_, data.size(), cudaMemcpyHostToDevice, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        });
    }
    void allreduce_sum(std::span<double> values) override { world_.allreduce_sum(values); }
    void allreduce_sum_start(std::span<const double> values) override { world_.allreduce_sum_start(values); }
    void allreduce_sum_finish(std::span<double> values) override { world_.allreduce_sum_finish(values); }
    void allreduce_max(std::span<double> values) override { world_.allreduce_max(values); }
    void allreduce_or(std::span<uint64_t> bits) override { world_.allreduce_or(bits); }
    void allreduce_or_start(std::span<const uint64_t> bits) override { world_.allreduce_or_start(bits); }
    void allreduce_or_finish(std::span<uint64_t> bits) override { world_.allreduce_or_finish(bits); }
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
    std::unique_ptr<Transport> split_group(int color, int key) override {
        return std::make_unique<HostStagedTransport>(world_.split(color, key, Link::inter), stream_);
    }
    void start_allreduce_ranges(float* base, size_t total, std::span<const ParamRange> ranges, bool bf16,
                                size_t) override {
        if (!is_device_pointer(base)) {  // host gradients: the wrapped transport's own overlap
            timed_world([&] { world_.allreduce_mean_start(base, total, ranges, bf16); });
            return;
        }
        if (groups_.empty()) reserve(total * sizeof(float));  // the step's first start: nothing of it is in flight
        grads_ready_.record(stream_);
        grads_ready_.wait_in(copy_stream_);
        enqueue_copies(reinterpret_cast<float*>(host_), base, ranges, cudaMemcpyDeviceToHost);
        if (groups_.size() == copied_.size()) copied_.emplace_back();
        copied_[groups_.size()].record(copy_stream_);
        groups_.emplace_back(ranges.begin(), ranges.end());
        overlapped_base_ = base;  // the base class holds every start of a round to one buffer and wire
        overlapped_total_ = total;
        overlapped_bf16_ = bf16;
        // hand over what the GPU has copied by now (done() does not wait)
        while (handed_ < groups_.size() && copied_[handed_].done()) hand_over_next();
    }
    // The first `starts` groups averaged and back on the device (the host waits for their copies back).
    void wait_allreduce_ranges(size_t starts) override {
        if (groups_.empty()) {  // host gradients (or nothing started): the wrapped transport's ranges
            timed_world([&] { world_.allreduce_mean_wait(starts); });
            return;
        }
        hand_over_through(starts);
        timed_world([&] {
            copy_back_through(starts);
            CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
        });
    }
    void finish_allreduce_ranges(size_t, bool) override {
        hand_over_through(groups_.size());
        timed_world([&] {
            copy_back_through(groups_.size());
            world_.allreduce_mean_finish();
        });
        if (!groups_.empty()) {
            copied_back_.record(copy_stream_);
            copied_back_.wait_in(stream_);
        }
        groups_.clear();
        handed_ = returned_ = 0;
    }

private:
    // dst[r] <- src[r] for each range r of two buffers laid out alike, enqueued on the copy stream
    void enqueue_copies(float* dst, const float* src, std::span<const ParamRange> ranges, cudaMemcpyKind kind) {
        for (const ParamRange& r : ranges)
            if (r.numel)
                CUDA_CHECK(cudaMemcpyAsync(dst + r.offset, src + r.offset, r.numel * sizeof(float), kind, copy_stream_));
    }
    // The next group, its host copy complete, starts in the wrapped transport (for MPI: onto its reducer thread).
    void hand_over_next() {
        const std::vector<ParamRange>& group = groups_[handed_++];
        timed_world([&] {
            world_.allreduce_mean_start(reinterpret_cast<float*>(host_), overlapped_total_, group, overlapped_bf16_);
        });
    }
    // Hands over the first n groups, waiting for their copies to the host: a wait for the backward, not for
    // communication (untimed).
    void hand_over_through(size_t n) {
        while (handed_ < n) {
            copied_[handed_].synchronize();
            hand_over_next();
        }
    }
    // Enqueues the copies back of the first n groups (all handed over), each as soon as the wrapped transport
    // has averaged it, while it goes on with the later ones.
    void copy_back_through(size_t n) {
        for (; returned_ < n; returned_++) {
            world_.allreduce_mean_wait(returned_ + 1);
            enqueue_copies(overlapped_base_, reinterpret_cast<const float*>(host_), groups_[returned_],
                           cudaMemcpyHostToDevice);
        }
    }
    // Runs collectives of the wrapped transport, adding their counters and the time to this transport's.
    template <class WorldCalls>
    void timed_world(WorldCalls calls) {
        const auto start = std::chrono::steady_clock::now();
        world_.reset_counters();
        calls();
        absorb_counters(start);
    }
    template <class Reduce>
    void staged(std::span<float> data, Reduce reduce) {
        timed_world([&] {
            if (data.empty() || !is_device_pointer(data.data())) return reduce(data);
            reserve(data.size_bytes());
            // The producer of `data` ran on the compute stream: copying on that stream orders after it.
            CUDA_CHECK(cudaMemcpyAsync(host_, data.data(), data.size_bytes(), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            float* host = reinterpret_cast<float*>(host_);
            reduce(std::span<float>(host, data.size()));
            CUDA_CHECK(cudaMemcpyAsync(data.data(), host, data.size_bytes(), cudaMemcpyHostToDevice, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        });
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
        LLMC_CHECK(groups_.empty(), "host-staged transport: a collective through the staging buffer while the "
                                    "overlapped all-reduce holds it (finish that first)");
        if (bytes <= host_bytes_) return;
        CUDA_CHECK(cudaStreamSynchronize(copy_stream_));  // the last overlapped all-reduce's copies back read host_
        if (host_) CUDA_CHECK(cudaFreeHost(host_));
        host_ = nullptr;
        host_bytes_ = 0;
        CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), bytes));
        host_bytes_ = bytes;
    }

    std::unique_ptr<Transport> owned_world_;  // a group's split of the process transport (null for the world)
    Transport& world_;
    cudaStream_t stream_;                 // the compute stream
    cudaStream_t copy_stream_ = nullptr;  // the overlapped all-reduce's copies
    std::byte* host_ = nullptr;           // pinned, grow-only
    std::vector<std::byte> gather_host_;  // a device bucket of the split all-gather, until its finish()
    size_t host_bytes_ = 0;
    // the overlapped all-reduce since its last finish: the gradient buffer (its length and wire), each start's
    // group of ranges (their host copies live in host_ at the same offsets), the event after its copies
    // (copied_[i], a pool reused every step), how many groups went to the wrapped transport and how many of
    // those have their copies back enqueued
    float* overlapped_base_ = nullptr;
    size_t overlapped_total_ = 0;
    bool overlapped_bf16_ = false;
    std::vector<std::vector<ParamRange>> groups_;
    std::vector<CudaEvent> copied_;
    size_t handed_ = 0, returned_ = 0;
    CudaEvent grads_ready_;  // the compute stream's position at a start
    CudaEvent copied_back_;  // the end of finish()'s copies back, which the compute stream waits for
};

}  // namespace llmc
