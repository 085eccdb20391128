// DiLoCo on the CPU (see diloco.h): its config keys and checks, its registry entry with the dry-run traffic report,
// the int8 wire codec, and the optimizer. The inner update is km::adamw_update (torch.optim.AdamW's arithmetic
// order, as AdamW-DDP), so the PyTorch reference stays within float rounding.
#include "llmc/optim/diloco/diloco.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "llmc/base/error.h"
#include "llmc/base/kernel_math.h"

namespace llmc {

std::vector<Key<DilocoConfig>> diloco_config_keys() {
    return {
        key("diloco_inner_steps", &DilocoConfig::inner_steps,
            "DiLoCo: inner AdamW steps per round (H); the ranks sync at steps divisible by H")
            .fixed(),
        key("diloco_outer_lr", &DilocoConfig::outer_lr, "DiLoCo: the outer Nesterov SGD's learning rate"),
        key("diloco_outer_momentum", &DilocoConfig::outer_momentum, "DiLoCo: the outer Nesterov SGD's momentum"),
        key("diloco_wire", &DilocoConfig::wire,
            "DiLoCo pseudo-gradient on the wire: fp32 or bf16 (all-reduce), or int8 (per-block absmax scale, "
            "all-gathered)",
            {{"fp32", DilocoWire::fp32}, {"bf16", DilocoWire::bf16}, {"int8", DilocoWire::int8}}),
    };
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
const char* wire_name(DilocoWire w) { return w == DilocoWire::fp32 ? "fp32" : w == DilocoWire::bf16 ? "bf16" : "int8"; }
size_t blocks_of(size_t numel) { return (numel + kDilocoInt8Block - 1) / kDilocoInt8Block; }
}  // namespace

void validate_diloco_options(const OptimizerConfig& c, const ConfigSources& sources) {
    const DilocoConfig& d = c.diloco;
    const auto check = [&](bool ok, const char* key, const char* range, const std::string& value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + value + ")");
    };
    check(d.inner_steps >= 1, "diloco_inner_steps", ">= 1", std::to_string(d.inner_steps));
    check(d.outer_lr > 0.0f && std::isfinite(d.outer_lr), "diloco_outer_lr", "> 0", format_float(d.outer_lr));
    check(d.outer_momentum >= 0.0f && d.outer_momentum < 1.0f, "diloco_outer_momentum", "in [0, 1)",
          format_float(d.outer_momentum));
    // the inner AdamW's options (AdamW's keys; validate_adamw_options checks them too, but lives in another room)
    check(c.adamw.beta1 >= 0.0f && c.adamw.beta1 < 1.0f, "beta1", "in [0, 1)", format_float(c.adamw.beta1));
    check(c.adamw.beta2 >= 0.0f && c.adamw.beta2 < 1.0f, "beta2", "in [0, 1)", format_float(c.adamw.beta2));
    check(c.adamw.eps > 0.0f, "eps", "> 0", format_float(c.adamw.eps));
    check(c.weight_decay >= 0.0f, "weight_decay", ">= 0", format_float(c.weight_decay));
}

size_t diloco_int8_blocks(const ParamLayout& layout) {
    size_t blocks = 0;
    for (const ParamTensor& t : layout.tensors) blocks += blocks_of(t.numel);
    return blocks;
}

double diloco_sync_bytes_sent(DilocoWire wire, const ParamLayout& layout, int world) {
    const double n = static_cast<double>(layout.num_params);
    if (wire == DilocoWire::int8)  // an all-gather of equal blocks: every rank forwards W-1 of them
        return (world - 1) * (n + 4.0 * static_cast<double>(diloco_int8_blocks(layout)));
    return 2.0 * (world - 1) / world * n * (wire == DilocoWire::bf16 ? 2.0 : 4.0);
}

void diloco_int8_encode(const ParamLayout& layout, std::span<const float> x, std::vector<std::byte>& out) {
    const size_t blocks = diloco_int8_blocks(layout);
    out.resize(blocks * sizeof(float) + layout.num_params);
    std::byte* scales = out.data();
    int8_t* values = reinterpret_cast<int8_t*>(out.data() + blocks * sizeof(float));
    size_t b = 0;
    for (const ParamTensor& t : layout.tensors) {
        for (size_t lo = 0; lo < t.numel; lo += kDilocoInt8Block, b++) {
            const size_t hi = std::min(t.numel, lo + kDilocoInt8Block);
            const float* v = x.data() + t.offset;
            float absmax = 0.0f;
            bool finite = true;
            for (size_t i = lo; i < hi; i++) {
                absmax = std::max(absmax, std::fabs(v[i]));
                finite = finite && std::isfinite(v[i]);
            }
            // a non-finite value makes the block's scale NaN, so the mean shows it (as an fp32 all-reduce would)
            const float s = finite ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
            std::memcpy(scales + b * sizeof(float), &s, sizeof s);
            for (size_t i = lo; i < hi; i++) {
                const float q = s > 0.0f ? std::clamp(std::nearbyint(v[i] / s), -127.0f, 127.0f) : 0.0f;
                values[t.offset + i] = static_cast<int8_t>(q);
            }
        }
    }
}

void diloco_int8_accumulate(const ParamLayout& layout, std::span<const std::byte> msg, std::span<float> sum) {
    const size_t blocks = diloco_int8_blocks(layout);
    LLMC_CHECK(msg.size() == blocks * sizeof(float) + layout.num_params,
               "diloco: an int8 pseudo-gradient of " + std::to_string(msg.size()) + " bytes, expected " +
                   std::to_string(blocks * sizeof(float) + layout.num_params));
    const int8_t* values = reinterpret_cast<const int8_t*>(msg.data() + blocks * sizeof(float));
    size_t b = 0;
    for (const ParamTensor& t : layout.tensors) {
        for (size_t lo = 0; lo < t.numel; lo += kDilocoInt8Block, b++) {
            const size_t hi = std::min(t.numel, lo + kDilocoInt8Block);
            float s;
            std::memcpy(&s, msg.data() + b * sizeof(float), sizeof s);
            for (size_t i = t.offset + lo; i < t.offset + hi; i++) sum[i] += static_cast<float>(values[i]) * s;
        }
    }
}

namespace {
// Bytes per rank per sync and per step (a sync every H steps), against AdamW-DDP's fp32 all-reduce every step.
void diloco_dry_run_report(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout, int world) {
    const DilocoConfig& d = config.diloco;
    const double payload = d.wire == DilocoWire::int8
                               ? static_cast<double>(layout.num_params + 4 * diloco_int8_blocks(layout))
                               : static_cast<double>(layout.num_params) * (d.wire == DilocoWire::bf16 ? 2.0 : 4.0);
    const double sent = diloco_sync_bytes_sent(d.wire, layout, world);
    const double adamw = 2.0 * (world - 1) / world * static_cast<double>(layout.num_params) * 4.0;
    const std::string sent_label =
        std::string("sent per sync (") + (d.wire == DilocoWire::int8 ? "all-gather, (W-1) n)" : "ring, 2(W-1)/W n)");
    char line[1024];
    std::snprintf(line, sizeof line,
                  "DiLoCo traffic per rank, %s, %d ranks, a sync every %d steps, %s wire (MB = 1e6 bytes):\n"
                  "  %-38s %12.3f MB\n"
                  "  %-38s %12.3f MB (%.0f bytes; %zu parameters)\n"
                  "  %-38s %12.3f MB\n"
                  "  %-38s %12.3f MB (%.1fx DiLoCo's)\n",
                  layout.config.describe().c_str(), world, d.inner_steps, wire_name(d.wire),
                  "pseudo-gradient (payload) per sync", payload / 1e6, sent_label.c_str(), sent / 1e6, sent,
                  layout.num_params, "sent per step, averaged", sent / d.inner_steps / 1e6, "AdamW-DDP fp32 per step",
                  adamw / 1e6, sent > 0 ? adamw * d.inner_steps / sent : 0.0);
    out << line;
    // every rank forwards the other W-1 int8 messages: from about 8 ranks on that is more than the fp32 ring
    if (d.wire == DilocoWire::int8 && sent > diloco_sync_bytes_sent(DilocoWire::fp32, layout, world))
        out << "  note: at " << world << " ranks the int8 all-gather sends more per sync than an fp32 all-reduce ("
            << diloco_sync_bytes_sent(DilocoWire::fp32, layout, world) / 1e6 << " MB)\n";
}
}  // namespace

OptimizerFamily diloco_family() {
    return {"diloco", "DiLoCo: H local AdamW steps per outer Nesterov step",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_diloco_options(c, s); },
            [](const OptimizerConfig&, const ParamLayout&) { return std::vector<std::string>(); },
            diloco_dry_run_report,
            [](const OptimizerConfig& c) {
                return "a sync every " + std::to_string(c.diloco.inner_steps) + " steps, " + wire_name(c.diloco.wire) +
                       " pseudo-gradients";
            },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return std::make_unique<Diloco>(c, layout, t);
            }};
}

DenseWire::DenseWire(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : wire_(config.diloco.wire), layout_(layout), transport_(transport) {}

void DenseWire::average(std::span<float> delta, StepTimings& seconds) {
    const size_t n = layout_.num_params;
    auto start = std::chrono::steady_clock::now();
    if (wire_ == DilocoWire::int8) diloco_int8_encode(layout_, delta, message_);
    seconds.transform += seconds_since(start);

    start = std::chrono::steady_clock::now();
    if (wire_ == DilocoWire::fp32) {
        transport_.allreduce_mean(delta);
    } else if (wire_ == DilocoWire::bf16) {
        transport_.allreduce_mean_bf16(delta);
    } else {
        transport_.allgather_bytes(message_, gathered_, offsets_, GatherSizes::exchange);
    }
    seconds.exchange += seconds_since(start);

    if (wire_ != DilocoWire::int8) return;
    start = std::chrono::steady_clock::now();
    const int world = transport_.world_size();
    LLMC_CHECK(offsets_.size() == static_cast<size_t>(world) + 1, "diloco: the int8 all-gather's offsets");
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (int r = 0; r < world; r++)
        diloco_int8_accumulate(
            layout_, std::span<const std::byte>(gathered_).subspan(offsets_[r], offsets_[r + 1] - offsets_[r]), delta);
    const float inv = 1.0f / static_cast<float>(world);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) delta[i] *= inv;
    seconds.apply += seconds_since(start);
}

Diloco::Diloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : Diloco(config, layout, transport, std::make_unique<DenseWire>(config, layout, transport)) {}

Diloco::Diloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport,
               std::unique_ptr<PseudoGradientWire> wire)
    : config_(config), layout_(layout), wire_(std::move(wire)) {
    validate_diloco_options(config);
    LLMC_CHECK(config.shard_group_size == 1, "--shard_group_size: " + std::string(wire_->name()) +
                                                 " runs one replica per rank (1, got " +
                                                 std::to_string(config.shard_group_size) + ")");
    for (const ParamTensor& t : layout.tensors) decay_mask_.push_back(decays(t, config.decay_groups) ? 1 : 0);
    const size_t n = layout.num_params;
    global_.assign(n, 0.0f);
    momentum_.assign(n, 0.0f);
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    delta_.assign(n, 0.0f);
}

void Diloco::set_weights(std::span<float> params) {
    LLMC_CHECK(params.size() == layout_.num_params, "diloco: parameter buffer size does not match the model layout");
    params_ = params;
    if (!loaded_) {
        std::copy(params.begin(), params.end(), global_.begin());
        return;
    }
    LLMC_CHECK(std::memcmp(params.data(), global_.data(), params.size_bytes()) == 0,
               "diloco: the checkpoint's model file is not its optimizer state's global weights");
    std::copy(loaded_local_.begin(), loaded_local_.end(), params.begin());
    loaded_local_ = LargeVector<float>();
    loaded_ = false;
}

std::span<float> Diloco::master_weights(std::span<float> params) {
    LLMC_CHECK(params.size() == layout_.num_params, "diloco: parameter buffer size does not match the model layout");
    return std::span<float>(global_);
}

StepResult Diloco::step(std::span<float> params, std::span<float> grads, float lr) {
    LLMC_CHECK(params.size() == layout_.num_params && grads.size() == layout_.num_params,
               "diloco: parameter buffer size does not match the model layout");
    LLMC_CHECK(!loaded_, "diloco: step() before set_weights() took the checkpoint's local weights");
    params_ = params;
    StepResult result;
    auto start = std::chrono::steady_clock::now();
    result.grad_norm = grad_norm(grads);  // this rank's own gradient: nothing is exchanged inside a round
    const float scale = clip_scale(result.grad_norm, config_.grad_clip);
    result.seconds.clip = seconds_since(start);

    start = std::chrono::steady_clock::now();
    steps_++;
    inner_update(params, grads, lr, scale);
    result.seconds.apply = seconds_since(start);
    if (steps_ % config_.diloco.inner_steps == 0) outer_step(params, result.seconds);
    return result;
}

// km::adamw_update with the clip folded in as grad_scale: the bits of clipping the gradient first, as
// torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW do.
void Diloco::inner_update(std::span<float> params, std::span<const float> grads, float lr, float grad_scale) {
    const AdamWConfig& a = config_.adamw;
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++) {
        const ParamTensor& t = layout_.tensors[ti];
        const km::AdamWParams h =
            km::adamw_params(lr, a.beta1, a.beta2, a.eps, config_.weight_decay, decay_mask_[ti] != 0, steps_,
                             grad_scale);
        float* p = params.data() + t.offset;
        const float* g = grads.data() + t.offset;
        float* m = m_.data() + t.offset;
        float* v = v_.data() + t.offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) p[i] = km::adamw_update(p[i], g[i], m[i], v[i], h);
    }
}

// The sync: the wire averages the pseudo-gradients, the outer Nesterov step moves the global weights, the local
// weights restart from them.
void Diloco::outer_step(std::span<float> params, StepTimings& seconds) {
    const size_t n = layout_.num_params;
    auto start = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) delta_[i] = global_[i] - params[i];
    seconds.transform += seconds_since(start);
    wire_->average(delta_, seconds);

    start = std::chrono::steady_clock::now();
    const float mu = config_.diloco.outer_momentum, outer_lr = config_.diloco.outer_lr;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float d = delta_[i];
        momentum_[i] = mu * momentum_[i] + d;
        const float update = d + mu * momentum_[i];
        global_[i] -= outer_lr * update;
        params[i] = global_[i];
    }
    seconds.apply += seconds_since(start);
}

void Diloco::save_state(ByteWriter& out) const {
    const size_t n = layout_.num_params;
    out.reserve(out.bytes().size() + 128 + 5 * n * sizeof(float) + wire_->state_bytes());
    out.put_string(std::string(wire_->name()));
    out.put<uint64_t>(n);
    out.put<uint32_t>(static_cast<uint32_t>(config_.diloco.inner_steps));
    out.put<int64_t>(steps_);
    out.put<int64_t>(steps_);  // the inner AdamW's t: every step is one inner step
    out.put_array(std::span<const float>(global_));
    out.put_array(std::span<const float>(momentum_));
    out.put_array(std::span<const float>(m_));
    out.put_array(std::span<const float>(v_));
    // the local weights: this rank's own, which the model file (the global weights) does not hold mid-round
    if (loaded_) out.put_array(std::span<const float>(loaded_local_));
    else if (params_.size() == n) out.put_array(std::span<const float>(params_));
    else out.put_array(std::span<const float>(global_));
    wire_->save_state(out);
}

void Diloco::load_state(ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    const std::string mine(wire_->name());
    LLMC_CHECK(name == mine, in.source() + ": optimizer state is for '" + name + "', not '" + mine +
                                 "' (use the checkpointed run's --optimizer)");
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == layout_.num_params, in.source() + ": optimizer state has " + std::to_string(n) +
                                            " parameters, model has " + std::to_string(layout_.num_params));
    const uint32_t h = in.get<uint32_t>("inner steps");
    LLMC_CHECK(static_cast<int>(h) == config_.diloco.inner_steps,
               in.source() + ": DiLoCo state of rounds of " + std::to_string(h) + " steps; this run has " +
                   std::to_string(config_.diloco.inner_steps) + " (--diloco_inner_steps)");
    const int64_t steps = in.get<int64_t>("step count"), t = in.get<int64_t>("inner step count");
    LLMC_CHECK(steps >= 0 && t == steps, in.source() + ": DiLoCo state with step count " + std::to_string(steps) +
                                             " and inner AdamW step count " + std::to_string(t));
    steps_ = steps;
    in.get_array(std::span<float>(global_), "diloco global weights");
    in.get_array(std::span<float>(momentum_), "diloco outer momentum");
    in.get_array(std::span<float>(m_), "diloco inner first moment");
    in.get_array(std::span<float>(v_), "diloco inner second moment");
    loaded_local_.assign(n, 0.0f);
    in.get_array(std::span<float>(loaded_local_), "diloco local weights");
    wire_->load_state(in);
    loaded_ = true;
}

}  // namespace llmc
