// Signum with majority vote on the CPU (see signum.h): its config keys and checks, its dry-run report, its entry
// in the registry, and the step. Every pass is parallel over whole bytes of the packed signs (8 elements each), so
// no two threads write one byte and the result does not depend on the thread count.
#include "llmc/optim/signum/signum.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

std::vector<Key<SignumConfig>> signum_config_keys() {
    return {
        key("signum_beta", &SignumConfig::beta,
            "Signum: each rank's momentum m = beta * m + (1 - beta) * g, whose sign is its vote (0: signSGD)"),
    };
}

void validate_signum_options(const OptimizerConfig& config, const ConfigSources& sources) {
    const float beta = config.signum.beta;
    // written so that NaN fails too
    LLMC_CHECK(beta >= 0.0f && beta < 1.0f, sources.name("signum_beta") + " must be in [0, 1) (got " +
                                                format_float(beta) + ")");
    LLMC_CHECK(config.weight_decay >= 0.0f,
               sources.name("weight_decay") + " must be >= 0 (got " + format_float(config.weight_decay) + ")");
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bytes per rank per step: the packed signs (payload) and what the all-gather sends, (W - 1) of them, against
// AdamW-DDP's fp32 ring all-reduce, 2 (W - 1) / W * 4 n. The all-gather grows with the world, the ring does not.
void signum_dry_run_report(std::ostream& out, const OptimizerConfig&, const ParamLayout& layout, int world) {
    const double n = static_cast<double>(layout.num_params);
    const double payload = static_cast<double>(signum_packed_bytes(layout.num_params));
    const double sent = payload * (world - 1);
    const double adamw = 2.0 * (world - 1) / world * 4.0 * n;
    char line[768];
    std::snprintf(line, sizeof line,
                  "Signum (majority vote) traffic per rank per step, %s, %d ranks (MB = 1e6 bytes):\n"
                  "  packed signs (payload), %zu x 1 bit  %12.6f MB\n"
                  "  all-gather sent, (W-1) x payload     %12.6f MB\n"
                  "  AdamW-DDP fp32 ring all-reduce sent  %12.6f MB (%.2fx the all-gather's)\n"
                  "  (every rank gathers every rank's signs: (W-1) n/8 bytes, which reaches AdamW's 8 (W-1)/W n at "
                  "64 ranks)\n",
                  layout.config.describe().c_str(), world, layout.num_params, payload / 1e6, sent / 1e6, adamw / 1e6,
                  sent > 0 ? adamw / sent : 0.0);
    out << line;
}

}  // namespace

OptimizerFamily signum_family() {
    return {"signum", "signSGD with majority vote and local momentum, 1 bit per element",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_signum_options(c, s); },
            [](const OptimizerConfig&, const ParamLayout&) { return std::vector<std::string>(); },
            signum_dry_run_report, [](const OptimizerConfig&) { return std::string(); },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return std::make_unique<Signum>(c, layout, t);
            }};
}

Signum::Signum(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : config_(config), layout_(layout), transport_(transport) {
    validate_signum_options(config);
    LLMC_CHECK(config.shard_group_size == 1,
               "--shard_group_size: --optimizer signum runs flat only (1; got " +
                   (config.shard_group_size == kShardGroupAuto ? std::string("auto")
                                                               : std::to_string(config.shard_group_size)) +
                   ")");
    for (const ParamTensor& t : layout.tensors) decay_mask_.push_back(decays(t, config.decay_groups) ? 1 : 0);
    momentum_.assign(layout.num_params, 0.0f);
    bits_.assign(signum_packed_bytes(layout.num_params), std::byte{0});
    votes_.assign(layout.num_params, 0);
}

StepResult Signum::step(std::span<float> params, std::span<float> grads, float lr) {
    const size_t n = momentum_.size();
    LLMC_CHECK(params.size() == n && grads.size() == n,
               "signum: buffers of " + std::to_string(params.size()) + " / " + std::to_string(grads.size()) +
                   " floats, the layout has " + std::to_string(n));
    StepResult result;
    auto start = std::chrono::steady_clock::now();
    // The local gradient's norm; the scaling is folded into the momentum pass (bit-identical to clipping first).
    result.grad_norm = grad_norm(grads);
    const float scale = clip_scale(result.grad_norm, config_.grad_clip);
    result.seconds.clip = seconds_since(start);

    // transform: momentum, sign, pack. (1 - beta) is formed in double and rounded once, as a Python float is.
    start = std::chrono::steady_clock::now();
    const float beta = config_.signum.beta;
    const float one_minus_beta = static_cast<float>(1.0 - static_cast<double>(beta));
    float* m = momentum_.data();
    const float* g = grads.data();
    const size_t nbytes = bits_.size();
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nbytes; b++) {
        unsigned byte = 0;
        const size_t end = std::min(n, 8 * b + 8);
        for (size_t i = 8 * b; i < end; i++) {
            const float gi = scale == 1.0f ? g[i] : g[i] * scale;
            m[i] = beta * m[i] + one_minus_beta * gi;
            byte |= (m[i] < 0.0f ? 0u : 1u) << (i - 8 * b);
        }
        bits_[b] = static_cast<std::byte>(byte);
    }
    result.seconds.transform = seconds_since(start);

    start = std::chrono::steady_clock::now();
    transport_.allgather_bytes(bits_, gathered_, offsets_, gather_sizes_);
    const int world = static_cast<int>(offsets_.size()) - 1;
    for (int r = 0; r < world; r++)
        LLMC_CHECK(offsets_[r + 1] - offsets_[r] == nbytes,
                   "signum: rank " + std::to_string(r) + " sent " + std::to_string(offsets_[r + 1] - offsets_[r]) +
                       " bytes of signs, this rank " + std::to_string(nbytes) + " (a model of another size)");
    gather_sizes_ = next_gather_sizes(offsets_, nbytes);
    result.seconds.exchange = seconds_since(start);

    // apply: count the votes (8 elements per byte of every rank's bits), then decoupled weight decay and the
    // update per tensor, a loop the compiler vectorizes. Factors formed in double and rounded once, as DeMo does.
    start = std::chrono::steady_clock::now();
    const std::byte* all = gathered_.data();
    int8_t* votes = votes_.data();
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nbytes; b++) {
        int8_t v[8];
        signum_votes_of_byte(all, nbytes, world, b, v);
        const size_t end = std::min(n, 8 * b + 8);
        for (size_t i = 8 * b; i < end; i++) votes[i] = v[i - 8 * b];
    }
    const float wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
    float* p = params.data();
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++) {
        const ParamTensor& t = layout_.tensors[ti];
        const float f = decay_mask_[ti] && config_.weight_decay != 0.0f ? wd_factor : 1.0f;
        float* pt = p + t.offset;
        const int8_t* vt = votes + t.offset;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < t.numel; i++) {
            if (f != 1.0f) pt[i] *= f;
            pt[i] -= lr * static_cast<float>(vt[i]);
        }
    }
    steps_++;
    result.seconds.apply = seconds_since(start);
    return result;
}

void Signum::save_state(ByteWriter& out) const {
    out.reserve(out.bytes().size() + 64 + momentum_.size() * sizeof(float));
    out.put_string("signum");
    out.put<uint64_t>(momentum_.size());
    out.put<int64_t>(steps_);
    out.put_array(std::span<const float>(momentum_));
}

void Signum::load_state(ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "signum", in.source() + ": optimizer state is for '" + name +
                                     "', not 'signum' (use the checkpointed run's --optimizer)");
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == momentum_.size(), in.source() + ": Signum state has " + std::to_string(n) +
                                          " parameters, model has " + std::to_string(momentum_.size()));
    const int64_t steps = in.get<int64_t>("step count");
    LLMC_CHECK(steps >= 0, in.source() + ": corrupt or truncated (Signum step count " + std::to_string(steps) + ")");
    in.get_array(std::span<float>(momentum_), "Signum momentum");
    steps_ = steps;
}

}  // namespace llmc
