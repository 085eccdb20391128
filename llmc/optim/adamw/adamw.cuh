// AdamW on the GPU with fp32 master weights.
//  - adamw_update: the kernel over one contiguous range of the flat buffers: master (fp32) and moments m, v
//    (fp32) are updated with km::adamw_update (kernel_math.h: torch.optim.AdamW's arithmetic, the same as the
//    CPU optimizer llmc/optim/adamw/adamw.cpp), and the floatX parameters are written from the new master value with
//    round-to-nearest-even or stochastic rounding (noise from the element's global index and a per-step
//    seed, so the result does not depend on the launch shape). Weight decay is on or off per range: the caller
//    passes its mask by calling once per run of same-mask tensors.
//  - CudaAdamW: the DeviceOptimizer of --optimizer adamw (AdamW-DDP): all-reduce-mean of the gradient
//    through the Transport (fp32, or bf16 with --grad_wire bf16), deterministic global norm (global_norm.cuh)
//    and clipping folded into the update as a gradient scale, which the kernel takes from the norm on the
//    device (on one rank step() never waits for the GPU; complete_step reads the norm), then the update. With
//    `overlap` (several ranks; NCCL, or MPI through host memory), the all-reduce starts range by range as the
//    backward finishes each layer's gradients (on_gradients_final) and step() only waits for it, as PyTorch's
//    DDP overlaps its buckets.
//    Master weights, m and v are one allocation. Its state blob is the CPU AdamW's (name, count, step, m, v),
//    so checkpoints are interchangeable.
//    Sharded (group_size S > 1, adamw.h): the node reduce-scatters the gradient, each rank all-reduces its shard
//    with its replica group, clips by the norm of the whole averaged gradient (the shards' sums of squares summed
//    over the node), updates its shard, whose master weights and moments alone it holds, and the node all-gathers
//    the floatX parameters. The stochastic rounding's noise follows the flat index, as the flat step's.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <vector>

#include "llmc/optim/adamw/adamw.h"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/optim/optimizer_cuda.cuh"
#include "llmc/comm/topology.h"
#include "llmc/comm/transport.h"

namespace llmc {

__global__ void adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                             km::AdamWParams h, const float* clip, uint64_t noise_offset, uint32_t seed,
                             bool stochastic) {
    if (clip) h.grad_scale = *clip;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        float mi = m[i], vi = v[i];
        const float p = km::adamw_update(master[i], grads[i], mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (stochastic) store_stochastic(params + i, p, noise_offset + i, seed);
        else params[i] = from_float<floatX>(p);
    }
}

// One range [0, n) of already-offset pointers; `noise_offset` is the range's offset in the flat buffer. With
// `clip` (the clip coefficient on the device, global_norm_for_clip_async) the kernel takes h.grad_scale from
// it: the host need not read the norm first.
inline void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                         const km::AdamWParams& h, uint64_t noise_offset, uint32_t seed, bool stochastic,
                         cudaStream_t stream, const float* clip = nullptr) {
    if (n == 0) return;
    LLMC_LAUNCH(grid_stride_blocks(n, 512), 512, 0, stream, adamw_kernel)(
        params, master, grads, m, v, n, h, clip, noise_offset, seed, stochastic);
    CUDA_CHECK_LAUNCH();
}

__global__ void round_params_kernel(floatX* params, const float* master, size_t n, uint32_t seed, bool stochastic) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        if (stochastic) store_stochastic(params + i, master[i], i, seed);
        else params[i] = from_float<floatX>(master[i]);
    }
}

// The stochastic-rounding seed of step t (1-based), derived from the run's seed.
inline uint32_t adamw_step_seed(uint32_t base_seed, int64_t t) {
    return km::squirrel_noise5(static_cast<uint32_t>(t), base_seed ^ 0x9e3779b9u);
}

class CudaAdamW final : public DeviceOptimizer {
public:
    // transport: collectives on device pointers (NcclTransport, HostStagedTransport, or LocalTransport for one
    // rank). overlap: use the transport's overlapped all-reduce (allreduce_mean_start) when the trainer reports
    // final gradient ranges. group_size: ranks per node (resolved); 1 is AdamW-DDP.
    CudaAdamW(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport, cudaStream_t stream,
              bool stochastic_rounding, uint32_t seed, bool overlap = false, int group_size = 1)
        : config_(config), layout_(layout), transport_(transport), stream_(stream),
          stochastic_(stochastic_rounding && !kFloatXIsFloat), seed_(seed), overlap_(overlap && group_size == 1) {
        validate_adamw_options(config);
        end_ = layout.num_params;
        if (group_size > 1) {
            bounds_ = adamw_shard_boundaries(layout.num_params, group_size);
            for (size_t b : bounds_) param_bytes_.push_back(b * sizeof(floatX));
            topology_ = make_topology(transport, group_size);
            begin_ = bounds_[topology_.local_rank];
            end_ = bounds_[topology_.local_rank + 1];
        }
        // Runs of consecutive tensors with the same decay flag become one kernel launch each; offsets from begin_.
        for (const ParamTensor& t : layout.tensors) {
            const size_t lo = std::max(begin_, t.offset), hi = std::min(end_, t.offset + t.numel);
            if (lo >= hi) continue;
            const bool d = decays(t, config.decay_groups);
            if (!ranges_.empty() && ranges_.back().decays == d && ranges_.back().offset + ranges_.back().numel == lo - begin_)
                ranges_.back().numel += hi - lo;
            else
                ranges_.push_back({lo - begin_, hi - lo, d});
        }
        const size_t n = end_ - begin_;
        memory_.add(&master_, n);
        memory_.add(&m_, n);
        memory_.add(&v_, n);
        memory_.add(&norm_scratch_, kNormScratchFloats);
        memory_.allocate("master weights + AdamW state (" + std::to_string(n) + " parameters x 3 x fp32)");
        memory_.zero(stream_);
    }
    CudaAdamW(const CudaAdamW&) = delete;
    CudaAdamW& operator=(const CudaAdamW&) = delete;

    std::string_view name() const override { return "adamw"; }

    // Sharded: every rank gets all the weights, keeps its shard and rounds all of them (the noise of the flat index).
    void set_weights(const float* weights, floatX* params) override {
        const size_t n = layout_.num_params;
        if (weights != master_)
            CUDA_CHECK(cudaMemcpyAsync(master_, weights + begin_, (end_ - begin_) * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream_));
        const bool sr = stochastic_ && t_ > 0;
        LLMC_LAUNCH(grid_stride_blocks(n, 512), 512, 0, stream_, round_params_kernel)(
            params, sharded() ? weights : master_, n, adamw_step_seed(seed_, t_), sr);
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    void on_gradients_final(float* grads, std::span<const ParamRange> ranges) override {
        if (!overlap_) return;  // never when sharded: its reduce-scatter follows the backward
        for (const ParamRange& r : ranges) overlapped_ += r.numel;
        transport_.allreduce_mean_start(grads, layout_.num_params, ranges, bf16_wire());
    }

    // No wait for the GPU on one rank: the norm, the clip and the update are queued, the clip coefficient taken
    // on the device (global_norm_for_clip_async); complete_step reads the norm and the GPU times.
    StepResult step(floatX* params, float* grads, float lr) override {
        const size_t n = layout_.num_params;
        LLMC_CHECK(!step_pending_, "AdamW: step() again before complete_step() of the last one");
        StepResult result;
        const auto start = std::chrono::steady_clock::now();
        if (sharded()) return sharded_step(params, grads, lr);
        if (overlapped_ > 0) {
            LLMC_CHECK(overlapped_ == n, "AdamW: the backward reported " + std::to_string(overlapped_) + " of " +
                                             std::to_string(n) + " gradients as final; the overlapped all-reduce needs all");
            overlapped_ = 0;
            transport_.allreduce_mean_finish();  // the compute stream now waits for it
        } else {
            // Several ranks: the backward finished first, so the collective's time is its own (every transport
            // orders its reads after the compute stream's work anyway). One rank: nothing travels, no wait.
            if (transport_.world_size() > 1) CUDA_CHECK(cudaStreamSynchronize(stream_));
            if (bf16_wire()) transport_.allreduce_mean_bf16(std::span<float>(grads, n));
            else transport_.allreduce_mean(std::span<float>(grads, n));
        }
        result.seconds.exchange = seconds_since(start);

        const float* clip = clip_norm_.queue(norm_scratch_, grads, n, config_.grad_clip, stream_);
        queue_update(params, grads, lr, clip, 1.0f);  // grad_scale from the device's clip coefficient
        return result;
    }

    // The norm before clipping, and the GPU times of the norm (StepTimings::clip) and of the update (apply).
    void complete_step(StepResult& result) override {
        if (!step_pending_) return;
        step_pending_ = false;
        update_end_.synchronize();
        if (sharded()) result.grad_norm = sharded_norm_;
        else clip_norm_.read(result.grad_norm, result.seconds.clip);
        result.seconds.apply = update_end_.ms_since(update_start_) * 1e-3;
    }

    float* master_weights() override {
        LLMC_CHECK(!sharded(), "sharded AdamW holds the master weights of its shard only (master_shard)");
        return master_;
    }
    MasterShard master_shard() override {
        return sharded() ? MasterShard{master_, begin_, end_ - begin_} : MasterShard{master_, 0, SIZE_MAX};
    }
    std::vector<float> download_master_weights(size_t n, float* scratch, bool wanted) override {
        if (!sharded()) return DeviceOptimizer::download_master_weights(n, scratch, wanted);
        LLMC_CHECK(n == layout_.num_params, "AdamW: master weights of another model asked for");
        CUDA_CHECK(cudaMemcpyAsync(scratch + begin_, master_, (end_ - begin_) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream_));
        std::vector<size_t> bytes;
        for (size_t b : bounds_) bytes.push_back(b * sizeof(float));
        topology_.node_group->allgather_inplace(std::as_writable_bytes(std::span<float>(scratch, n)), bytes);
        std::vector<float> host(wanted ? n : 0);
        if (wanted) CUDA_CHECK(cudaMemcpy(host.data(), scratch, n * sizeof(float), cudaMemcpyDeviceToHost));
        return host;
    }

    // The CPU AdamW's blobs: "adamw", or "adamw-sharded" with the topology and this rank's shard of the moments.
    void save_state(ByteWriter& out) const override {
        const size_t n = end_ - begin_;
        out.reserve(out.bytes().size() + 96 + 2 * n * sizeof(float));  // the moments copied into the blob itself
        out.put_string(sharded() ? "adamw-sharded" : "adamw");
        if (sharded()) {
            out.put<uint32_t>(static_cast<uint32_t>(topology_.group_size));
            out.put<uint32_t>(static_cast<uint32_t>(transport_.world_size()));
            out.put<uint64_t>(begin_);
            out.put<uint64_t>(end_);
        }
        out.put<uint64_t>(layout_.num_params);
        out.put<int64_t>(t_);
        for (const float* moment : {m_, v_}) {  // each copied before the next put may move the blob
            std::byte* slot = out.put_array_space<float>(n);
            CUDA_CHECK(cudaMemcpyAsync(slot, moment, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }

    void load_state(ByteReader& in) override {
        const std::string name = in.get_string("optimizer name");
        const std::string mine = sharded() ? "adamw-sharded" : "adamw";
        LLMC_CHECK(name == mine, in.source() + ": optimizer state is for '" + name + "', not '" + mine +
                                     "' (use the checkpointed run's --optimizer and --shard_group_size)");
        if (sharded()) {
            const uint32_t s = in.get<uint32_t>("shard group size"), w = in.get<uint32_t>("world size");
            const uint64_t begin = in.get<uint64_t>("shard start"), end = in.get<uint64_t>("shard end");
            LLMC_CHECK(static_cast<int>(s) == topology_.group_size && static_cast<int>(w) == transport_.world_size() &&
                           begin == begin_ && end == end_,
                       in.source() + ": sharded AdamW state of " + std::to_string(w) + " ranks in nodes of " +
                           std::to_string(s) + "; this run has " + std::to_string(transport_.world_size()) +
                           " in nodes of " + std::to_string(topology_.group_size) +
                           " (resume with the same world and --shard_group_size)");
        }
        const uint64_t total = in.get<uint64_t>("parameter count");
        LLMC_CHECK(total == layout_.num_params, in.source() + ": optimizer state has " + std::to_string(total) +
                                                    " parameters, model has " + std::to_string(layout_.num_params));
        const size_t n = end_ - begin_;
        const int64_t t = in.get<int64_t>("step count");
        // both checked before either is copied, so a truncated blob leaves the moments as they were
        const std::byte* m = in.get_array_space<float>(n, "adamw first moment");
        const std::byte* v = in.get_array_space<float>(n, "adamw second moment");
        CUDA_CHECK(cudaMemcpyAsync(m_, m, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(v_, v, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        t_ = t;
    }

    int64_t steps_done() const { return t_; }
    bool sharded() const { return topology_.node_group != nullptr; }

private:
    // The update of this rank's ranges, queued; the clip scale from the device (`clip`) or `grad_scale`.
    void queue_update(floatX* params, const float* grads, float lr, const float* clip, float grad_scale) {
        update_start_.record(stream_);
        t_++;
        const uint32_t seed = adamw_step_seed(seed_, t_);
        const AdamWConfig& a = config_.adamw;
        for (const Range& r : ranges_) {
            const size_t flat = begin_ + r.offset;
            const km::AdamWParams h =
                km::adamw_params(lr, a.beta1, a.beta2, a.eps, config_.weight_decay, r.decays, t_, grad_scale);
            adamw_update(params + flat, master_ + r.offset, grads + flat, m_ + r.offset, v_ + r.offset, r.numel, h,
                         flat, seed, stochastic_, stream_, clip);
        }
        update_end_.record(stream_);
        step_pending_ = true;
    }
    // Reduce-scatter in the node, all-reduce of the shard across nodes, the norm of the node's whole gradient,
    // the shard's update, all-gather of the floatX parameters in the node.
    StepResult sharded_step(floatX* params, float* grads, float lr) {
        StepResult result;
        auto start = std::chrono::steady_clock::now();
        topology_.node_group->reduce_scatter_mean(std::span<float>(grads, layout_.num_params), bounds_);
        result.seconds.reduce_scatter = seconds_since(start);
        start = std::chrono::steady_clock::now();
        const std::span<float> shard(grads + begin_, end_ - begin_);
        if (bf16_wire()) topology_.replica_group->allreduce_mean_bf16(shard);
        else topology_.replica_group->allreduce_mean(shard);
        result.seconds.exchange = seconds_since(start);

        start = std::chrono::steady_clock::now();
        double squares = 0.0;
        if (!shard.empty()) {
            const double* sum = global_norm_squared_async(norm_scratch_, shard.data(), shard.size(), stream_);
            CUDA_CHECK(cudaMemcpyAsync(&squares, sum, sizeof(double), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        topology_.node_group->allreduce_sum(std::span<double>(&squares, 1));
        sharded_norm_ = std::sqrt(squares);
        result.seconds.clip = seconds_since(start);
        queue_update(params, grads, lr, nullptr, km::clip_scale_of_squares(squares, config_.grad_clip));

        start = std::chrono::steady_clock::now();
        topology_.node_group->allgather_inplace(
            std::as_writable_bytes(std::span<floatX>(params, layout_.num_params)), param_bytes_);
        result.seconds.allgather = seconds_since(start);
        return result;
    }

    struct Range {
        size_t offset, numel;
        bool decays;
    };
    bool bf16_wire() const { return config_.adamw.grad_wire == GradWire::bf16; }
    static double seconds_since(std::chrono::steady_clock::time_point s) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    }

    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    cudaStream_t stream_;
    bool stochastic_;
    uint32_t seed_;
    std::vector<Range> ranges_;
    DeviceArena memory_;
    float* master_ = nullptr;
    float* m_ = nullptr;
    float* v_ = nullptr;
    float* norm_scratch_ = nullptr;
    QueuedClipNorm clip_norm_;
    TimedCudaEvent update_start_, update_end_;
    bool step_pending_ = false;  // step() ran, complete_step() not yet
    bool overlap_ = false;
    size_t overlapped_ = 0;  // gradients whose all-reduce on_gradients_final started this step
    int64_t t_ = 0;
    // sharded: the nodes, the node's shards (S + 1 flat offsets; in bytes of floatX), this rank's [begin_, end_)
    Topology topology_;
    std::vector<size_t> bounds_, param_bytes_;
    size_t begin_ = 0, end_ = 0;
    double sharded_norm_ = 0.0;  // the last sharded step's norm
};

}  // namespace llmc
