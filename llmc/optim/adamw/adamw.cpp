// AdamW-DDP on the CPU (see adamw.h). The update follows torch.optim.AdamW's arithmetic order so the
// PyTorch comparison stays within float rounding.
#include "llmc/optim/adamw/adamw.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "llmc/base/error.h"

namespace llmc {

std::vector<Key<AdamWConfig>> adamw_config_keys() {
    return {
        key("beta1", &AdamWConfig::beta1, "AdamW beta1"),
        key("beta2", &AdamWConfig::beta2, "AdamW beta2"),
        key("eps", &AdamWConfig::eps, "AdamW epsilon"),
        key("grad_wire", &AdamWConfig::grad_wire, "AdamW-DDP gradients on the wire: fp32 or bf16",
            {{"fp32", GradWire::fp32}, {"bf16", GradWire::bf16}}),
        key("ddp_overlap", &AdamWConfig::ddp_overlap,
            "AdamW-DDP with several ranks: all-reduce each layer's gradients as soon as the backward has finished "
            "them, during the rest of the backward (false: after the backward; the same bits)"),
    };
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

void validate_adamw_options(const OptimizerConfig& config, const ConfigSources& sources) {
    const AdamWConfig& a = config.adamw;
    const auto check = [&](bool ok, const char* key, const char* range, float value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + format_float(value) + ")");
    };
    check(a.beta1 >= 0.0f && a.beta1 < 1.0f, "beta1", "in [0, 1)", a.beta1);
    check(a.beta2 >= 0.0f && a.beta2 < 1.0f, "beta2", "in [0, 1)", a.beta2);
    check(a.eps > 0.0f, "eps", "> 0", a.eps);
    check(config.weight_decay >= 0.0f, "weight_decay", ">= 0", config.weight_decay);
}

namespace {
// fp32 weights travel in the node's all-gather, whatever the gradient's wire
double bf16_factor(bool bf16) { return bf16 ? 0.5 : 1.0; }
// AdamW-DDP's bytes per rank per step: the gradient, and what a ring all-reduce of it sends, 2 (W-1)/W n.
void adamw_dry_run_report(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout, int world) {
    const bool bf16 = config.adamw.grad_wire == GradWire::bf16;
    const double payload = static_cast<double>(layout.num_params) * (bf16 ? 2.0 : 4.0);
    const double ring = 2.0 * (world - 1) / world * payload;
    char line[512];
    std::snprintf(line, sizeof line,
                  "AdamW-DDP traffic per rank per step, %s, %d ranks (MB = 1e6 bytes):\n"
                  "  gradient (payload), %zu x %s       %12.3f MB\n"
                  "  ring all-reduce sent, 2(W-1)/W n  %12.3f MB\n",
                  layout.config.describe().c_str(), world, layout.num_params, bf16 ? "bf16" : "fp32", payload / 1e6,
                  ring / 1e6);
    out << line;
    // The sharded step: the moments one rank holds, measured on its shard's buffers (auto counts as 1 here).
    const int s = std::max(1, config.shard_group_size);
    if (s == 1 || layout.num_params > (size_t{1} << 30)) return;  // measured: a sharded run of a model that fits
    const std::vector<size_t> bounds = adamw_shard_boundaries(layout.num_params, s);
    size_t largest = 0;
    for (int p = 0; p < s; p++) largest = std::max(largest, bounds[p + 1] - bounds[p]);
    LargeVector<float> m(largest, 0.0f), v(largest, 0.0f);
    const double mine = static_cast<double>((m.size() + v.size()) * sizeof(float));
    const double flat = static_cast<double>(layout.num_params) * 8.0;
    std::snprintf(line, sizeof line,
                  "sharded step, %d ranks in nodes of %d (--shard_group_size%s):\n"
                  "  optimizer state per rank, measured   %12.3f MB (flat AdamW %.3f MB: %.3f of it)\n"
                  "  intra-node reduce-scatter sent       %12.3f MB\n"
                  "  intra-node all-gather sent           %12.3f MB\n",
                  world, s, s == world ? "; ZeRO-1" : "", mine / 1e6, flat / 1e6, mine / flat,
                  payload / bf16_factor(bf16) * (s - 1) / s / 1e6, payload / bf16_factor(bf16) * (s - 1) / s / 1e6);
    out << line;
    if (s > 1 && world % s == 0)
        out << "  across nodes: an all-reduce of a shard of 1/" << s << " of the gradient among " << world / s
            << " nodes\n";
}
// Elastic resume: AdamW-DDP's moments and step count are the same on every rank (each steps on the averaged
// gradient), so every new rank takes old rank 0's, bit for bit. ZeRO-1's shards are refused.
std::string adamw_reshard_state(int, int, int, const std::function<ByteReader(int)>& old_blob, ByteWriter& out) {
    ByteReader in = old_blob(0);
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "adamw", in.source() + ": optimizer state '" + name +
                                    "' cannot be redistributed to another number of ranks (sharded AdamW, "
                                    "--shard_group_size > 1, is not); resume with the same ranks or --reset_momentum");
    const uint64_t n = in.get<uint64_t>("parameter count");
    const int64_t t = in.get<int64_t>("step count");
    const std::vector<float> m = in.get_vector<float>("first moment"), v = in.get_vector<float>("second moment");
    LLMC_CHECK(m.size() == n && v.size() == n && in.at_end(), in.source() + ": corrupt AdamW state");
    out.put_string(name);
    out.put<uint64_t>(n);
    out.put<int64_t>(t);
    out.put_array(std::span<const float>(m));
    out.put_array(std::span<const float>(v));
    return "moments: old rank 0's (the same on every rank)";
}
}  // namespace

OptimizerFamily adamw_family() {
    return {"adamw", "AdamW-DDP",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_adamw_options(c, s); },
            [](const OptimizerConfig&, const ParamLayout&) { return std::vector<std::string>(); },
            adamw_dry_run_report,
            [](const OptimizerConfig& c) {
                if (c.shard_group_size == 1) return std::string();
                return std::string("sharded over nodes of ") +
                       (c.shard_group_size == kShardGroupAuto ? "the ranks on a host"
                                                              : std::to_string(c.shard_group_size) + " ranks");
            },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return std::make_unique<AdamW>(c, layout, t, resolve_shard_group_size(t, c.shard_group_size));
            },
            adamw_reshard_state};
}

std::vector<size_t> adamw_shard_boundaries(size_t n, int group_size) {
    std::vector<size_t> bounds;
    for (int p = 0; p < group_size; p++) bounds.push_back(n * static_cast<size_t>(p) / group_size / 16 * 16);
    bounds.push_back(n);
    return bounds;
}

AdamW::AdamW(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport, int group_size)
    : config_(config), layout_(layout), transport_(transport), world_(transport.world_size()) {
    validate_adamw_options(config);
    for (const ParamTensor& t : layout.tensors) decay_mask_.push_back(decays(t, config.decay_groups) ? 1 : 0);
    end_ = layout.num_params;
    if (group_size > 1) {
        bounds_ = adamw_shard_boundaries(layout.num_params, group_size);
        for (size_t b : bounds_) byte_bounds_.push_back(b * sizeof(float));
        topology_ = make_topology(transport, group_size);
        begin_ = bounds_[topology_.local_rank];
        end_ = bounds_[topology_.local_rank + 1];
    }
    m_.assign(end_ - begin_, 0.0f);
    v_.assign(end_ - begin_, 0.0f);
}

StepResult AdamW::step(std::span<float> params, std::span<float> grads, float lr) {
    LLMC_CHECK(params.size() == layout_.num_params && grads.size() == layout_.num_params,
               "adamw: parameter buffer size does not match the model layout");
    StepResult result;
    auto start = std::chrono::steady_clock::now();
    if (sharded()) {
        topology_.node_group->reduce_scatter_mean(grads, bounds_);
        result.seconds.reduce_scatter = seconds_since(start);
        start = std::chrono::steady_clock::now();
        const std::span<float> shard = grads.subspan(begin_, end_ - begin_);
        if (bf16_wire()) topology_.replica_group->allreduce_mean_bf16(shard);
        else topology_.replica_group->allreduce_mean(shard);
        result.seconds.exchange = seconds_since(start);

        start = std::chrono::steady_clock::now();
        double squares = sum_of_squares(shard);  // the whole averaged gradient's norm, from its shards
        topology_.node_group->allreduce_sum(std::span<double>(&squares, 1));
        result.grad_norm = std::sqrt(squares);
        clip_by_norm(shard, result.grad_norm, config_.grad_clip);
        result.seconds.clip = seconds_since(start);
    } else {
        if (overlapped_ > 0) {
            LLMC_CHECK(overlapped_ == layout_.num_params,
                       "adamw: the backward reported " + std::to_string(overlapped_) + " of " +
                           std::to_string(layout_.num_params) + " gradients as final; the overlapped all-reduce needs all");
            overlapped_ = 0;
            transport_.allreduce_mean_finish();
        } else if (bf16_wire()) {
            transport_.allreduce_mean_bf16(grads);
        } else {
            transport_.allreduce_mean(grads);
        }
        result.seconds.exchange = seconds_since(start);

        start = std::chrono::steady_clock::now();
        result.grad_norm = clip_grad_norm(grads, config_.grad_clip);
        result.seconds.clip = seconds_since(start);
    }

    start = std::chrono::steady_clock::now();
    update(params, grads, lr, begin_, end_);
    result.seconds.apply = seconds_since(start);
    if (sharded()) {
        start = std::chrono::steady_clock::now();
        topology_.node_group->allgather_inplace(std::as_writable_bytes(params), byte_bounds_);
        result.seconds.allgather = seconds_since(start);
    }
    return result;
}

void AdamW::update(std::span<float> params, std::span<const float> grads, float lr, size_t begin, size_t end) {
    t_++;
    const AdamWConfig& a = config_.adamw;
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(t_));
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(t_));
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++) {
        const ParamTensor& t = layout_.tensors[ti];
        const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
        if (lo >= hi) continue;
        const float decay_factor = decay_mask_[ti] ? 1.0f - lr * config_.weight_decay : 1.0f;
        float* p = params.data() + lo;
        const float* g = grads.data() + lo;
        float* m = m_.data() + (lo - begin);
        float* v = v_.data() + (lo - begin);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < hi - lo; i++) {
            p[i] *= decay_factor;
            m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g[i];
            v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g[i] * g[i];
            const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + a.eps;
            p[i] -= step_size * (m[i] / denom);
        }
    }
}

void AdamW::on_gradients_final(std::span<float> grads, std::span<const ParamRange> ranges) {
    if (sharded()) return;  // the sharded step reduce-scatters after the backward
    LLMC_CHECK(grads.size() == layout_.num_params, "adamw: gradient buffer size does not match the model layout");
    for (const ParamRange& r : ranges) overlapped_ += r.numel;
    transport_.allreduce_mean_start(grads.data(), grads.size(), ranges, bf16_wire());
}

// The sharded state starts with its topology, so a resume with another world or --shard_group_size is refused.
void AdamW::save_state(ByteWriter& out) const {
    // one allocation for the blob (1 GB on GPT-2 124M), not a doubling copy after copy
    out.reserve(out.bytes().size() + 96 + (m_.size() + v_.size()) * sizeof(float));
    out.put_string(sharded() ? "adamw-sharded" : "adamw");
    if (sharded()) {
        out.put<uint32_t>(static_cast<uint32_t>(topology_.group_size));
        out.put<uint32_t>(static_cast<uint32_t>(world_));
        out.put<uint64_t>(begin_);
        out.put<uint64_t>(end_);
    }
    out.put<uint64_t>(layout_.num_params);
    out.put<int64_t>(t_);
    out.put_array(std::span<const float>(m_));
    out.put_array(std::span<const float>(v_));
}

void AdamW::load_state(ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    const std::string mine = sharded() ? "adamw-sharded" : "adamw";
    LLMC_CHECK(name == mine, in.source() + ": optimizer state is for '" + name + "', not '" + mine +
                                 "' (use the checkpointed run's --optimizer and --shard_group_size)");
    if (sharded()) {
        const uint32_t s = in.get<uint32_t>("shard group size"), w = in.get<uint32_t>("world size");
        const uint64_t begin = in.get<uint64_t>("shard start"), end = in.get<uint64_t>("shard end");
        LLMC_CHECK(static_cast<int>(s) == topology_.group_size && static_cast<int>(w) == world_ && begin == begin_ &&
                       end == end_,
                   in.source() + ": sharded AdamW state of " + std::to_string(w) + " ranks in nodes of " +
                       std::to_string(s) + "; this run has " + std::to_string(world_) + " in nodes of " +
                       std::to_string(topology_.group_size) + " (resume with the same world and --shard_group_size)");
    }
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == layout_.num_params, in.source() + ": optimizer state has " + std::to_string(n) +
                                            " parameters, model has " + std::to_string(layout_.num_params));
    t_ = in.get<int64_t>("step count");
    in.get_array(std::span<float>(m_), "adamw first moment");
    in.get_array(std::span<float>(v_), "adamw second moment");
}

}  // namespace llmc
