// AdamW-DDP on the CPU (see adamw.h). The update follows torch.optim.AdamW's arithmetic order so the
// PyTorch comparison stays within float rounding.
#include "llmc/optim/adamw/adamw.h"

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
// AdamW-DDP's bytes per rank per step: the gradient, and what a ring all-reduce of it sends, 2 (W-1)/W n.
void adamw_dry_run_report(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout, int world) {
    const bool bf16 = config.adamw.grad_wire == GradWire::bf16;
    const double payload = static_cast<double>(layout.num_params) * (bf16 ? 2.0 : 4.0);
    const double ring = 2.0 * (world - 1) / world * payload;
    char line[256];
    std::snprintf(line, sizeof line,
                  "AdamW-DDP traffic per rank per step, %s, %d ranks (MB = 1e6 bytes):\n"
                  "  gradient (payload), %zu x %s       %12.3f MB\n"
                  "  ring all-reduce sent, 2(W-1)/W n  %12.3f MB\n",
                  layout.config.describe().c_str(), world, layout.num_params, bf16 ? "bf16" : "fp32", payload / 1e6,
                  ring / 1e6);
    out << line;
}
}  // namespace

OptimizerFamily adamw_family() {
    return {"adamw", "AdamW-DDP",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_adamw_options(c, s); },
            [](const OptimizerConfig&, const ParamLayout&) { return std::vector<std::string>(); },
            adamw_dry_run_report,
            [](const OptimizerConfig&) { return std::string(); },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return std::make_unique<AdamW>(c, layout, t);
            }};
}

AdamW::AdamW(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : config_(config), layout_(layout), transport_(transport), m_(layout.num_params, 0.0f),
      v_(layout.num_params, 0.0f) {
    validate_adamw_options(config);
    for (const ParamTensor& t : layout.tensors) decay_mask_.push_back(decays(t, config.decay_groups) ? 1 : 0);
}

StepResult AdamW::step(std::span<float> params, std::span<float> grads, float lr) {
    LLMC_CHECK(params.size() == layout_.num_params && grads.size() == layout_.num_params,
               "adamw: parameter buffer size does not match the model layout");
    StepResult result;
    auto start = std::chrono::steady_clock::now();
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

    start = std::chrono::steady_clock::now();
    t_++;
    const AdamWConfig& a = config_.adamw;
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(t_));
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(t_));
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++) {
        const ParamTensor& t = layout_.tensors[ti];
        const float decay_factor = decay_mask_[ti] ? 1.0f - lr * config_.weight_decay : 1.0f;
        float* p = params.data() + t.offset;
        const float* g = grads.data() + t.offset;
        float* m = m_.data() + t.offset;
        float* v = v_.data() + t.offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) {
            p[i] *= decay_factor;
            m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g[i];
            v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g[i] * g[i];
            const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + a.eps;
            p[i] -= step_size * (m[i] / denom);
        }
    }
    result.seconds.apply = seconds_since(start);
    return result;
}

void AdamW::on_gradients_final(std::span<float> grads, std::span<const ParamRange> ranges) {
    LLMC_CHECK(grads.size() == layout_.num_params, "adamw: gradient buffer size does not match the model layout");
    for (const ParamRange& r : ranges) overlapped_ += r.numel;
    transport_.allreduce_mean_start(grads.data(), grads.size(), ranges, bf16_wire());
}

void AdamW::save_state(ByteWriter& out) const {
    // one allocation for the blob (1 GB on GPT-2 124M), not a doubling copy after copy
    out.reserve(out.bytes().size() + 64 + (m_.size() + v_.size()) * sizeof(float));
    out.put_string("adamw");
    out.put<uint64_t>(layout_.num_params);
    out.put<int64_t>(t_);
    out.put_array(std::span<const float>(m_));
    out.put_array(std::span<const float>(v_));
}

void AdamW::load_state(ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "adamw", in.source() + ": optimizer state is for '" + name + "', not 'adamw' (use the same --optimizer as the checkpointed run)");
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == layout_.num_params, in.source() + ": optimizer state has " + std::to_string(n) +
                                            " parameters, model has " + std::to_string(layout_.num_params));
    t_ = in.get<int64_t>("step count");
    in.get_array(std::span<float>(m_), "adamw first moment");
    in.get_array(std::span<float>(v_), "adamw second moment");
}

}  // namespace llmc
