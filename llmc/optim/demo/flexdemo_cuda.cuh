// CudaFlexDemo: FlexDeMo (flexdemo.h) in the CUDA trainer. The node's ranks reduce-scatter their device gradients
// (NcclTransport: grouped ncclReduce; HostStagedTransport: through the host), each rank runs CudaDemo on its shard
// (the same shard plan as the CPU's: whole DCT block rows) with its replica group, holding the momentum AND the
// fp32 master weights of its shard only, and the node all-gathers the updated floatX parameters. The clip uses the
// norm of the node's whole gradient: each rank's shard's sum of squares on the device, summed over the node on the
// host. --demo_replicate_every N: between exchanges each rank takes the sign step on its shard alone.
// The state blob is the CPU FlexDemo's (topology, steps, the shard's DeMo state, the shard's weights when the
// nodes part), so checkpoints move between the trainers; the model file is gathered from the shards.
#pragma once
#include <chrono>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llmc/comm/topology.h"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/optim/demo/demo_cuda.cuh"
#include "llmc/optim/demo/flexdemo.h"

namespace demo {

class CudaFlexDemo final : public llmc::DeviceOptimizer {
public:
    // `world`: every rank (NcclTransport or HostStagedTransport); split here into nodes of `group_size` (resolved).
    CudaFlexDemo(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& world,
                 int group_size, cudaStream_t stream, bool stochastic_rounding, uint32_t seed)
        : config_(config), n_(layout.num_params), world_(world.world_size()), stream_(stream) {
        validate_demo_options(config_);
        std::vector<uint8_t> decays, shard_decays;
        const ModelPlan full = cm::plan_for_layout(config_, layout, &decays);
        bounds_ = shard_boundaries(full, static_cast<size_t>(group_size));
        for (size_t b : bounds_) {
            param_bytes_.push_back(b * sizeof(llmc::floatX));
            master_bytes_.push_back(b * sizeof(float));
        }
        topology_ = llmc::make_topology(world, group_size);
        const ModelPlan plan = shard_plan_of(full, decays, bounds_, topology_.local_rank, shard_decays);
        inner_ = std::make_unique<CudaDemo>(config_, plan, shard_decays, shard_size(), *topology_.replica_group, stream,
                                            stochastic_rounding, seed);
        memory_.add(&norm_scratch_, llmc::kNormScratchFloats);
        memory_.add(&clip_, 1);
        memory_.allocate("FlexDeMo norm scratch");
    }

    std::string_view name() const override { return "demo"; }

    llmc::StepResult step(llmc::floatX* params, float* grads, float lr) override {
        const size_t begin = shard_begin(), count = shard_size();
        auto t0 = std::chrono::steady_clock::now();
        topology_.node_group->reduce_scatter_mean(std::span<float>(grads, n_), bounds_);
        timings_ = llmc::StepTimings{};
        timings_.reduce_scatter = seconds_since(t0);

        t0 = std::chrono::steady_clock::now();
        double squares = 0.0;  // the node gradient's norm, from its shards
        if (count) {
            const double* sum = llmc::global_norm_squared_async(norm_scratch_, grads + begin, count, stream_);
            CUDA_CHECK(cudaMemcpyAsync(&squares, sum, sizeof(double), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        topology_.node_group->allreduce_sum(std::span<double>(&squares, 1));
        norm_ = std::sqrt(squares);
        clip_host_ = llmc::km::clip_scale_of_squares(squares, config_.grad_clip);
        CUDA_CHECK(cudaMemcpyAsync(clip_, &clip_host_, sizeof(float), cudaMemcpyHostToDevice, stream_));
        timings_.clip = seconds_since(t0);

        steps_++;
        llmc::StepResult result;
        exchanged_ = steps_ % config_.demo.replicate_every == 0;
        if (exchanged_) {
            result = inner_->step_with_clip(params + begin, grads + begin, lr, clip_, norm_);
        } else {
            t0 = std::chrono::steady_clock::now();
            inner_->local_sign_step(params + begin, grads + begin, lr);
            timings_.apply = seconds_since(t0);
        }
        gather_params(params);
        return result;
    }

    void complete_step(llmc::StepResult& result) override {
        if (exchanged_) inner_->complete_step(result);
        exchanged_ = false;
        result.grad_norm = norm_;
        result.seconds += timings_;
        timings_ = llmc::StepTimings{};
    }

    void finish_updates(llmc::floatX* params, llmc::StepResult& result) override {
        if (!inner_->has_pending_round()) return;
        inner_->finish_updates(params + shard_begin(), result);
        gather_params(params);
        result.seconds.allgather += timings_.allgather;
        timings_.allgather = 0.0;
    }

    // weights: all n (device); this rank keeps its shard (a resume of parted nodes: the state's shard instead).
    void set_weights(const float* weights, llmc::floatX* params) override {
        float* master = inner_->master_weights();
        if (!loaded_shard_.empty()) {
            CUDA_CHECK(cudaMemcpy(master, loaded_shard_.data(), loaded_shard_.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
            loaded_shard_.clear();
            weights = nullptr;
        }
        inner_->set_weights(weights ? weights + shard_begin() : master, params + shard_begin());
        gather_params(params);
        timings_ = llmc::StepTimings{};
    }

    float* master_weights() override {
        llmc::fail("FlexDeMo holds the master weights of its shard only (master_shard, download_master_weights)");
    }
    MasterShard master_shard() override { return {inner_->master_weights(), shard_begin(), shard_size()}; }
    std::vector<float> download_master_weights(size_t n, float* scratch, bool wanted) override {
        LLMC_CHECK(n == n_, "FlexDeMo: master weights of another model asked for");
        CUDA_CHECK(cudaMemcpyAsync(scratch + shard_begin(), inner_->master_weights(), shard_size() * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
        topology_.node_group->allgather_inplace(
            std::as_writable_bytes(std::span<float>(scratch, n_)), master_bytes_);
        std::vector<float> host(wanted ? n_ : 0);
        if (wanted) CUDA_CHECK(cudaMemcpy(host.data(), scratch, n_ * sizeof(float), cudaMemcpyDeviceToHost));
        return host;
    }
    llmc::Transport& weight_group(llmc::Transport& world) override {
        return config_.demo.replicate_every > 1 ? *topology_.node_group : world;
    }

    // The CPU FlexDemo's blob (flexdemo.cpp): the same bytes for the same state.
    void save_state(llmc::ByteWriter& out) const override {
        write_shard_state_head(out, head(steps_));
        inner_->save_state(out);
        if (config_.demo.replicate_every > 1) {  // the nodes' weights part: each rank keeps its own shard's
            std::vector<float> shard(shard_size());
            CUDA_CHECK(cudaMemcpy(shard.data(), const_cast<CudaDemo&>(*inner_).master_weights(),
                                  shard.size() * sizeof(float), cudaMemcpyDeviceToHost));
            out.put<uint64_t>(shard.size());
            out.put_array(std::span<const float>(shard));
        }
    }
    void load_state(llmc::ByteReader& in) override {
        steps_ = read_shard_state_head(in, head(0));
        inner_->load_state(in);
        loaded_shard_.clear();
        if (config_.demo.replicate_every > 1) {
            const uint64_t n = in.get<uint64_t>("shard weight count");
            LLMC_CHECK(n == shard_size(), in.source() + ": the saved shard weights do not fit this shard");
            loaded_shard_.resize(n);
            in.get_array(std::span<float>(loaded_shard_), "shard weights");
        }
    }
    void set_steps_done(int64_t steps) override { inner_->set_steps_done(steps); }

    const CudaDemo& shard_optimizer() const { return *inner_; }
    size_t shard_begin() const { return bounds_[topology_.local_rank]; }
    size_t shard_size() const { return bounds_[topology_.local_rank + 1] - shard_begin(); }

private:
    ShardStateHead head(int64_t steps) const {
        return {topology_.group_size, world_, shard_begin(), shard_begin() + shard_size(), steps};
    }
    static double seconds_since(std::chrono::steady_clock::time_point s) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    }
    // Every rank's updated shard of the floatX parameters to the rest of its node.
    void gather_params(llmc::floatX* params) {
        const auto t0 = std::chrono::steady_clock::now();
        topology_.node_group->allgather_inplace(
            std::as_writable_bytes(std::span<llmc::floatX>(params, n_)), param_bytes_);
        timings_.allgather += seconds_since(t0);
    }

    llmc::OptimizerConfig config_;
    size_t n_ = 0;
    int world_ = 1;
    cudaStream_t stream_;
    llmc::Topology topology_;
    std::vector<size_t> bounds_;                     // the node's shards, flat offsets (S + 1)
    std::vector<size_t> param_bytes_, master_bytes_;  // the same in bytes of floatX and of fp32
    std::unique_ptr<CudaDemo> inner_;                // DeMo on this rank's shard, over the replica group
    llmc::DeviceArena memory_;
    float* norm_scratch_ = nullptr;
    float* clip_ = nullptr;  // the clip coefficient of the node's norm, for the compress kernel
    float clip_host_ = 1.0f;
    double norm_ = 0.0;
    bool exchanged_ = false;        // this step ran the inner DeMo step (complete_step completes it)
    llmc::StepTimings timings_;     // this step's reduce-scatter, norm and all-gather (and a local step's apply)
    int64_t steps_ = 0;             // steps taken (the replicate_every schedule counts from 1)
    std::vector<float> loaded_shard_;  // replicate_every > 1: the state's shard weights, until set_weights
};

}  // namespace demo
