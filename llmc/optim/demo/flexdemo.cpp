// FlexDeMo on the CPU (see flexdemo.h).
#include "llmc/optim/demo/flexdemo.h"

#include <chrono>
#include <cmath>
#include <string>

#include "llmc/base/error.h"
#include "llmc/optim/demo/plan_tables.h"

namespace demo {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ModelPlan shard_plan_of(const ModelPlan& full, const std::vector<uint8_t>& decays, const std::vector<size_t>& bounds,
                        int part, std::vector<uint8_t>& shard_decays) {
    std::vector<size_t> tensors;
    ModelPlan plan = slice_plan(full, bounds[part], bounds[part + 1], &tensors);
    shard_decays.clear();
    for (size_t t : tensors) shard_decays.push_back(decays[t]);
    return plan;
}

void write_shard_state_head(llmc::ByteWriter& out, const ShardStateHead& head) {
    out.put_string("flexdemo");
    out.put<uint32_t>(static_cast<uint32_t>(head.group_size));
    out.put<uint32_t>(static_cast<uint32_t>(head.world));
    out.put<uint64_t>(head.begin);
    out.put<uint64_t>(head.end);
    out.put<int64_t>(head.steps);
}

int64_t read_shard_state_head(llmc::ByteReader& in, const ShardStateHead& mine) {
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "flexdemo", in.source() + ": optimizer state is flat '" + name +
                                       "', not a sharded DeMo step's (resume with the checkpoint's --shard_group_size)");
    const uint32_t s = in.get<uint32_t>("shard group size"), w = in.get<uint32_t>("world size");
    const uint64_t begin = in.get<uint64_t>("shard start"), end = in.get<uint64_t>("shard end");
    LLMC_CHECK(static_cast<int>(s) == mine.group_size && static_cast<int>(w) == mine.world,
               in.source() + ": sharded DeMo state of " + std::to_string(w) + " ranks in nodes of " +
                   std::to_string(s) + "; this run has " + std::to_string(mine.world) + " in nodes of " +
                   std::to_string(mine.group_size) + " (resume with the same world and --shard_group_size)");
    LLMC_CHECK(begin == mine.begin && end == mine.end,
               in.source() + ": the saved shard [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ") is not this rank's [" + std::to_string(mine.begin) + ", " + std::to_string(mine.end) + ")");
    return in.get<int64_t>("step count");
}

FlexDemo::FlexDemo(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& world,
                   int group_size)
    : config_(config), world_(world.world_size()) {
    validate_demo_options(config_);
    std::vector<uint8_t> decays;
    const ModelPlan full = cm::plan_for_layout(config_, layout, &decays);
    bounds_ = shard_boundaries(full, static_cast<size_t>(group_size));
    for (size_t b : bounds_) byte_bounds_.push_back(b * sizeof(float));
    topology_ = llmc::make_topology(world, group_size);
    shard_plan_ = shard_plan_of(full, decays, bounds_, topology_.local_rank, shard_decays_);
    inner_ = std::make_unique<DemoOptimizer>(config_, shard_plan_, shard_decays_, *topology_.replica_group);
}

llmc::StepResult FlexDemo::step(std::span<float> params, std::span<float> grads, float lr) {
    LLMC_CHECK(params.size() == bounds_.back() && grads.size() == bounds_.back(),
               "FlexDeMo: buffers of " + std::to_string(params.size()) + " / " + std::to_string(grads.size()) +
                   " floats, the layout has " + std::to_string(bounds_.back()));
    llmc::StepTimings timings;
    auto t0 = std::chrono::steady_clock::now();
    topology_.node_group->reduce_scatter_mean(grads, bounds_);
    timings.reduce_scatter = seconds_since(t0);

    const size_t begin = shard_begin(), n = shard_end() - begin;
    const std::span<float> shard = params.subspan(begin, n), shard_grads = grads.subspan(begin, n);
    t0 = std::chrono::steady_clock::now();
    double squares = llmc::sum_of_squares(shard_grads);  // the node gradient's norm, from its shards
    topology_.node_group->allreduce_sum(std::span<double>(&squares, 1));
    const double norm = std::sqrt(squares);
    timings.clip = seconds_since(t0);

    steps_++;
    llmc::StepResult result;
    if (steps_ % config_.demo.replicate_every == 0) {
        result = inner_->step_with_norm(shard, shard_grads, lr, norm);
    } else {
        t0 = std::chrono::steady_clock::now();
        local_sign_step(shard, shard_grads, lr);
        result.grad_norm = norm;
        result.seconds.apply = seconds_since(t0);
    }
    result.seconds += timings;
    gather_weights(params, result.seconds);
    if (config_.demo.replicate_every > 1) saved_shard_.assign(shard.begin(), shard.end());
    return result;
}

void FlexDemo::local_sign_step(std::span<float> shard, std::span<const float> grads, float lr) {
    const float wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
    for (size_t t = 0; t < shard_plan_.tensors.size(); t++) {
        const TensorPlan& tp = shard_plan_.tensors[t];
        float* p = shard.data() + tp.offset;
        const float* g = grads.data() + tp.offset;
        const bool decay = config_.weight_decay != 0.0f && shard_decays_[t];
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < tp.numel(); i++) {
            if (decay) p[i] *= wd_factor;
            p[i] -= lr * static_cast<float>((g[i] > 0.0f) - (g[i] < 0.0f));
        }
    }
}

void FlexDemo::gather_weights(std::span<float> params, llmc::StepTimings& timings) {
    const auto t0 = std::chrono::steady_clock::now();
    topology_.node_group->allgather_inplace(std::as_writable_bytes(params), byte_bounds_);
    timings.allgather += seconds_since(t0);
}

void FlexDemo::finish_updates(std::span<float> params, llmc::StepResult& result) {
    if (!inner_->has_pending_round()) return;
    const size_t begin = shard_begin(), n = shard_end() - begin;
    llmc::StepResult inner;
    inner_->finish_updates(params.subspan(begin, n), inner);
    result.seconds += inner.seconds;
    gather_weights(params, result.seconds);
}

void FlexDemo::save_state(llmc::ByteWriter& out) const {
    write_shard_state_head(out, {topology_.group_size, world_, shard_begin(), shard_end(), steps_});
    inner_->save_state(out);
    // the nodes' weights part between rounds: each rank keeps its own shard's (the model file holds node 0's)
    if (config_.demo.replicate_every > 1) {
        out.put<uint64_t>(saved_shard_.size());
        out.put_array(std::span<const float>(saved_shard_));
    }
}

void FlexDemo::load_state(llmc::ByteReader& in) {
    steps_ = read_shard_state_head(in, {topology_.group_size, world_, shard_begin(), shard_end(), 0});
    inner_->load_state(in);
    loaded_shard_.clear();
    if (config_.demo.replicate_every > 1) {
        const uint64_t n = in.get<uint64_t>("shard weight count");
        LLMC_CHECK(n == shard_end() - shard_begin(), in.source() + ": the saved shard weights do not fit this shard");
        loaded_shard_.resize(n);
        in.get_array(std::span<float>(loaded_shard_), "shard weights");
    }
}

void FlexDemo::set_weights(std::span<float> params) {
    if (config_.demo.replicate_every == 1) return;
    if (!loaded_shard_.empty()) {  // a resume: this node's weights, not node 0's from the model file
        std::copy(loaded_shard_.begin(), loaded_shard_.end(), params.begin() + static_cast<std::ptrdiff_t>(shard_begin()));
        loaded_shard_.clear();
    }
    llmc::StepTimings unused;
    gather_weights(params, unused);
}

llmc::Transport& FlexDemo::weight_group(llmc::Transport& world) {
    return config_.demo.replicate_every > 1 ? *topology_.node_group : world;
}

size_t flexdemo_state_bytes_per_rank(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout,
                                     int group_size) {
    std::vector<uint8_t> decays, shard_decays;
    const ModelPlan full = cm::plan_for_layout(config, layout, &decays);
    const std::vector<size_t> bounds = shard_boundaries(full, static_cast<size_t>(group_size));
    int largest = 0;
    for (int p = 1; p < group_size; p++)
        if (bounds[p + 1] - bounds[p] > bounds[largest + 1] - bounds[largest]) largest = p;
    llmc::LocalTransport local;
    ModelPlan plan = shard_plan_of(full, decays, bounds, largest, shard_decays);
    const DemoOptimizer shard(config, std::move(plan), shard_decays, local);
    return shard.state_bytes();
}

}  // namespace demo
