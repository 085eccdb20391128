// PowerSGD on the CPU (see powersgd.h): its config keys and checks, the plan of which tensors are compressed, the
// ring-model bytes and dry-run report, the registry entry, the normal draw and Gram-Schmidt, and the step. The
// AdamW update is km::adamw_update (torch.optim.AdamW's arithmetic order, as AdamW-DDP), so the PyTorch reference
// stays within float rounding.
#include "llmc/optim/powersgd/powersgd.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "llmc/base/error.h"
#include "llmc/base/kernel_math.h"
#include "llmc/model/cpu_layers.h"

namespace llmc {

std::vector<Key<PowerSgdConfig>> powersgd_config_keys() {
    return {
        key("powersgd_rank", &PowerSgdConfig::rank,
            "PowerSGD: rank r of each matrix gradient's approximation P Q^T (a matrix n x m is compressed when "
            "r (n + m) < n m)")
            .fixed(),
        key("powersgd_warm_start", &PowerSgdConfig::warm_start,
            "PowerSGD: start each step's power iteration from last step's Q (false: a fresh random Q every step)"),
        key("powersgd_seed", &PowerSgdConfig::seed, "PowerSGD: seed of the random starting Q, the same on every rank"),
    };
}

void validate_powersgd_options(const OptimizerConfig& c, const ConfigSources& sources) {
    const auto check = [&](bool ok, const char* key, const char* range, const std::string& value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + value + ")");
    };
    check(c.powersgd.rank >= 1, "powersgd_rank", ">= 1", std::to_string(c.powersgd.rank));
    check(c.powersgd.seed >= 0, "powersgd_seed", ">= 0", std::to_string(c.powersgd.seed));
    // the AdamW update's options (AdamW's keys; validate_adamw_options checks them too, but lives in another room)
    check(c.adamw.beta1 >= 0.0f && c.adamw.beta1 < 1.0f, "beta1", "in [0, 1)", format_float(c.adamw.beta1));
    check(c.adamw.beta2 >= 0.0f && c.adamw.beta2 < 1.0f, "beta2", "in [0, 1)", format_float(c.adamw.beta2));
    check(c.adamw.eps > 0.0f, "eps", "> 0", format_float(c.adamw.eps));
    check(c.weight_decay >= 0.0f, "weight_decay", ">= 0", format_float(c.weight_decay));
}

PowerSgdPlan powersgd_plan(const ParamLayout& layout, int rank) {
    PowerSgdPlan plan;
    for (size_t ti = 0; ti < layout.tensors.size(); ti++) {
        const ParamTensor& t = layout.tensors[ti];
        if (t.is_matrix()) {
            const size_t n = t.shape[0], m = t.shape[1];
            const size_t k = std::min({n, m, static_cast<size_t>(rank)});
            if (k * (n + m) < n * m) {
                plan.matrices.push_back({ti, n, m, k, plan.p_floats, plan.q_floats});
                plan.p_floats += n * k;
                plan.q_floats += m * k;
                continue;
            }
        }
        plan.full.push_back(ti);
        plan.full_floats += t.numel;
    }
    return plan;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
uint64_t ring_bytes(uint64_t bytes, int world) { return 2 * static_cast<uint64_t>(world - 1) * bytes / world; }
uint64_t splitmix(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
}  // namespace

uint64_t powersgd_bytes_sent(const ParamLayout& layout, int rank, int world) {
    const PowerSgdPlan plan = powersgd_plan(layout, rank);
    uint64_t sent = 0;
    if (plan.p_floats > 0) sent += ring_bytes(plan.p_floats * sizeof(float), world);
    if (plan.q_floats + plan.full_floats > 0)
        sent += ring_bytes((plan.q_floats + plan.full_floats) * sizeof(float), world);
    return sent;
}

float powersgd_normal(uint64_t seed, uint64_t d, uint64_t tensor, uint64_t j) {
    const uint64_t key = splitmix(splitmix(seed) ^ ((d << 32) | tensor));
    const uint64_t a = splitmix(key + 2 * j), b = splitmix(key + 2 * j + 1);
    const double u1 = static_cast<double>((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]: the log stays finite
    const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void powersgd_orthogonalize(float* x, size_t rows, size_t k, float epsilon) {
    for (size_t i = 0; i < k; i++) {
        double squares = 0.0;
        for (size_t r = 0; r < rows; r++) squares += static_cast<double>(x[r * k + i]) * x[r * k + i];
        const float denom = static_cast<float>(std::sqrt(squares)) + epsilon;
        for (size_t r = 0; r < rows; r++) x[r * k + i] /= denom;
        for (size_t c = i + 1; c < k; c++) {
            double dot = 0.0;
            for (size_t r = 0; r < rows; r++) dot += static_cast<double>(x[r * k + i]) * x[r * k + c];
            const float d = static_cast<float>(dot);
            for (size_t r = 0; r < rows; r++) x[r * k + c] -= d * x[r * k + i];
        }
    }
}

namespace {
// Bytes per rank per step under the ring model, by collective, against AdamW-DDP's fp32 all-reduce of everything.
void powersgd_dry_run_report(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout, int world) {
    const PowerSgdPlan plan = powersgd_plan(layout, config.powersgd.rank);
    const double ring = 2.0 * (world - 1) / world;
    const double p = 4.0 * static_cast<double>(plan.p_floats);
    const double qf = 4.0 * static_cast<double>(plan.q_floats + plan.full_floats);
    const double sent = static_cast<double>(powersgd_bytes_sent(layout, config.powersgd.rank, world));
    const double adamw = ring * 4.0 * static_cast<double>(layout.num_params);
    char l1[96], l2[96], line[1024];
    std::snprintf(l1, sizeof l1, "all-reduce 1: every P, %zu x fp32", plan.p_floats);
    std::snprintf(l2, sizeof l2, "all-reduce 2: every Q %zu + full %zu", plan.q_floats, plan.full_floats);
    std::snprintf(line, sizeof line,
                  "PowerSGD traffic per rank per step, %s, %d ranks, rank %d (MB = 1e6 bytes):\n"
                  "  %-44s %zu of %zu tensors\n"
                  "  %-44s %12.6f MB payload\n"
                  "  %-44s %12.6f MB payload\n"
                  "  %-44s %12.6f MB (%.0f bytes)\n"
                  "  %-44s %12.6f MB (%.2fx PowerSGD's)\n",
                  layout.config.describe().c_str(), world, config.powersgd.rank, "compressed matrices",
                  plan.matrices.size(), layout.tensors.size(), l1, p / 1e6, l2, qf / 1e6,
                  "ring all-reduces sent, 2(W-1)/W", sent / 1e6, sent, "AdamW-DDP fp32 ring all-reduce sent",
                  adamw / 1e6, sent > 0 ? adamw / sent : 0.0);
    out << line;
}

std::vector<std::string> powersgd_warnings(const OptimizerConfig& config, const ParamLayout& layout) {
    std::vector<std::string> out;
    if (powersgd_plan(layout, config.powersgd.rank).matrices.empty())
        out.push_back("powersgd_rank " + std::to_string(config.powersgd.rank) +
                      " compresses no tensor of this model: every gradient is all-reduced in full, as AdamW-DDP");
    if (config.adamw.grad_wire == GradWire::bf16)
        out.push_back("grad_wire bf16 is AdamW-DDP's: powersgd all-reduces its P, Q and full tensors in fp32");
    return out;
}
}  // namespace

OptimizerFamily powersgd_family() {
    return {"powersgd", "PowerSGD: rank-r power-iteration compression of the gradient all-reduce, then AdamW",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_powersgd_options(c, s); },
            powersgd_warnings, powersgd_dry_run_report,
            [](const OptimizerConfig& c) {
                return "rank " + std::to_string(c.powersgd.rank) +
                       (c.powersgd.warm_start ? ", warm-started Q" : ", a fresh Q every step");
            },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return std::make_unique<PowerSgd>(c, layout, t);
            }};
}

PowerSgd::PowerSgd(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : config_(config), layout_(layout), transport_(transport), plan_(powersgd_plan(layout, config.powersgd.rank)) {
    validate_powersgd_options(config);
    LLMC_CHECK(config.shard_group_size == 1,
               "--shard_group_size: --optimizer powersgd runs one replica per rank (1; got " +
                   (config.shard_group_size == kShardGroupAuto ? std::string("auto")
                                                               : std::to_string(config.shard_group_size)) +
                   ")");
    for (const ParamTensor& t : layout.tensors) decay_mask_.push_back(decays(t, config.decay_groups) ? 1 : 0);
    const size_t n = layout.num_params;
    error_.assign(n, 0.0f);
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    p_.assign(plan_.p_floats, 0.0f);
    qf_.assign(plan_.q_floats + plan_.full_floats, 0.0f);
}

StepResult PowerSgd::step(std::span<float> params, std::span<float> grads, float lr) {
    const size_t n = layout_.num_params;
    LLMC_CHECK(params.size() == n && grads.size() == n,
               "powersgd: buffers of " + std::to_string(params.size()) + " / " + std::to_string(grads.size()) +
                   " floats, the layout has " + std::to_string(n));
    StepResult result;
    const cpu::SingleThreadedBlas single_threaded_blas;  // cpu::gemm's slices, one per OpenMP thread
    float* g = grads.data();
    float* e = error_.data();

    // transform: M = g + e (held in e), Q (drawn or warm), orth(Q), P = M Q
    auto start = std::chrono::steady_clock::now();
    const bool draw = t_ == 0 || !config_.powersgd.warm_start;
    const uint64_t d = config_.powersgd.warm_start ? 0 : static_cast<uint64_t>(t_);
    for (const PowerSgdPlan::Matrix& mx : plan_.matrices) {
        const ParamTensor& t = layout_.tensors[mx.tensor];
        float* mt = e + t.offset;
        const float* gt = g + t.offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) mt[i] += gt[i];
        float* q = qf_.data() + mx.q_offset;
        if (draw)
            for (size_t j = 0; j < mx.cols * mx.k; j++)
                q[j] = powersgd_normal(static_cast<uint64_t>(config_.powersgd.seed), d, mx.tensor, j);
        powersgd_orthogonalize(q, mx.cols, mx.k);
        cpu::gemm(false, false, mx.rows, mx.k, mx.cols, mt, mx.cols, q, mx.k, 0.0f, p_.data() + mx.p_offset, mx.k);
    }
    result.seconds.transform = seconds_since(start);

    start = std::chrono::steady_clock::now();
    if (!p_.empty()) transport_.allreduce_mean(std::span<float>(p_));
    result.seconds.exchange = seconds_since(start);

    // transform: orth(P), Q = M^T P; the full tensors' gradients join the Qs in collective 2's buffer
    start = std::chrono::steady_clock::now();
    for (const PowerSgdPlan::Matrix& mx : plan_.matrices) {
        float* p = p_.data() + mx.p_offset;
        powersgd_orthogonalize(p, mx.rows, mx.k);
        cpu::gemm(true, false, mx.cols, mx.k, mx.rows, e + layout_.tensors[mx.tensor].offset, mx.cols, p, mx.k, 0.0f,
                  qf_.data() + mx.q_offset, mx.k);
    }
    size_t at = plan_.q_floats;
    for (size_t ti : plan_.full) {
        const ParamTensor& t = layout_.tensors[ti];
        std::copy(g + t.offset, g + t.offset + t.numel, qf_.begin() + static_cast<std::ptrdiff_t>(at));
        at += t.numel;
    }
    result.seconds.transform += seconds_since(start);

    start = std::chrono::steady_clock::now();
    if (!qf_.empty()) transport_.allreduce_mean(std::span<float>(qf_));
    result.seconds.exchange += seconds_since(start);

    // transform: g_hat = P Q^T, e = M - g_hat; the full tensors' means back into grads
    start = std::chrono::steady_clock::now();
    for (const PowerSgdPlan::Matrix& mx : plan_.matrices) {
        const ParamTensor& t = layout_.tensors[mx.tensor];
        float* gt = g + t.offset;
        float* mt = e + t.offset;
        cpu::gemm(false, true, mx.rows, mx.cols, mx.k, p_.data() + mx.p_offset, mx.k, qf_.data() + mx.q_offset, mx.k,
                  0.0f, gt, mx.cols);
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) mt[i] -= gt[i];
    }
    at = plan_.q_floats;
    for (size_t ti : plan_.full) {
        const ParamTensor& t = layout_.tensors[ti];
        std::copy(qf_.begin() + static_cast<std::ptrdiff_t>(at),
                  qf_.begin() + static_cast<std::ptrdiff_t>(at + t.numel), g + t.offset);
        at += t.numel;
    }
    result.seconds.transform += seconds_since(start);

    // clip the averaged approximation by its global norm (as AdamW-DDP clips the averaged gradient)
    start = std::chrono::steady_clock::now();
    result.grad_norm = grad_norm(grads);
    const float scale = clip_scale(result.grad_norm, config_.grad_clip);
    result.seconds.clip = seconds_since(start);

    // apply: AdamW with the clip folded in as grad_scale (the bits of clipping first)
    start = std::chrono::steady_clock::now();
    t_++;
    const AdamWConfig& a = config_.adamw;
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++) {
        const ParamTensor& t = layout_.tensors[ti];
        const km::AdamWParams h =
            km::adamw_params(lr, a.beta1, a.beta2, a.eps, config_.weight_decay, decay_mask_[ti] != 0, t_, scale);
        float* p = params.data() + t.offset;
        const float* gt = g + t.offset;
        float* m = m_.data() + t.offset;
        float* v = v_.data() + t.offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) p[i] = km::adamw_update(p[i], gt[i], m[i], v[i], h);
    }
    result.seconds.apply = seconds_since(start);
    return result;
}

void PowerSgd::save_state(ByteWriter& out) const {
    const size_t n = layout_.num_params;
    out.reserve(out.bytes().size() + 128 + (3 * n + plan_.q_floats) * sizeof(float));
    out.put_string("powersgd");
    out.put<uint64_t>(n);
    out.put<uint32_t>(static_cast<uint32_t>(config_.powersgd.rank));
    out.put<uint64_t>(plan_.matrices.size());
    out.put<int64_t>(t_);
    out.put_array(std::span<const float>(error_));
    out.put_array(std::span<const float>(qf_.data(), plan_.q_floats));
    out.put_array(std::span<const float>(m_));
    out.put_array(std::span<const float>(v_));
}

void PowerSgd::load_state(ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "powersgd", in.source() + ": optimizer state is for '" + name +
                                       "', not 'powersgd' (use the checkpointed run's --optimizer)");
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == layout_.num_params, in.source() + ": optimizer state has " + std::to_string(n) +
                                            " parameters, model has " + std::to_string(layout_.num_params));
    const uint32_t r = in.get<uint32_t>("rank");
    LLMC_CHECK(static_cast<int>(r) == config_.powersgd.rank,
               in.source() + ": PowerSGD state of rank " + std::to_string(r) + "; this run has " +
                   std::to_string(config_.powersgd.rank) + " (--powersgd_rank)");
    const uint64_t matrices = in.get<uint64_t>("compressed tensor count");
    LLMC_CHECK(matrices == plan_.matrices.size(), in.source() + ": PowerSGD state of " + std::to_string(matrices) +
                                                      " compressed tensors, this model has " +
                                                      std::to_string(plan_.matrices.size()));
    const int64_t t = in.get<int64_t>("step count");
    LLMC_CHECK(t >= 0, in.source() + ": corrupt or truncated (PowerSGD step count " + std::to_string(t) + ")");
    in.get_array(std::span<float>(error_), "PowerSGD error feedback");
    in.get_array(std::span<float>(qf_.data(), plan_.q_floats), "PowerSGD Q");
    in.get_array(std::span<float>(m_), "PowerSGD AdamW first moment");
    in.get_array(std::span<float>(v_), "PowerSGD AdamW second moment");
    t_ = t;
}

}  // namespace llmc
