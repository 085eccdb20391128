// --optimizer randomk on the CPU (see randomk.h): its key and checks, its dry-run report and registry entry, the
// seeded draws, and the step. The momentum pass runs per tensor over its elements and the draws per chunk, each
// element and chunk in one thread with a fixed arithmetic, so the result does not depend on the thread count.
#include "llmc/optim/demo/randomk.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>

#include "llmc/base/error.h"
#include "llmc/base/kernel_math.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/demo/plan_tables.h"

namespace llmc {

std::vector<Key<RandomkConfig>> randomk_config_keys() {
    return {
        key("randomk_seed", &RandomkConfig::seed,
            "randomk: seed of the positions each chunk sends (drawn per step, tensor and chunk; the same on every "
            "rank)")
            .fixed(),
    };
}

}  // namespace llmc

namespace demo {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where chunk-local position i of chunk c of `tp` lies in the flat parameter buffer.
inline size_t flat_position(const TensorPlan& tp, size_t c, uint32_t i) {
    return tp.offset + (c / tp.block_cols) * tp.n1 * tp.cols + (c % tp.block_cols) * tp.n2 + (i / tp.n2) * tp.cols +
           (i % tp.n2);
}

// The range of randomk's own key: what validate_config checks whatever the run's optimizer (it runs every
// family's check), so the refusals of DeMo options that only randomk lacks wait for the constructor (and dry run).
void check_randomk_seed(const llmc::OptimizerConfig& c, const llmc::ConfigSources& s) {
    LLMC_CHECK(c.randomk.seed >= 0,
               s.name("randomk_seed") + " must be >= 0 (got " + std::to_string(c.randomk.seed) + ")");
}

}  // namespace

void validate_randomk_options(const llmc::OptimizerConfig& c, const llmc::ConfigSources& s) {
    check_randomk_seed(c, s);
    LLMC_CHECK(c.demo.transform == llmc::DemoTransform::dct,
               s.name("demo_transform") + ": --optimizer randomk has no transform (it sends the momentum itself)");
    validate_demo_options(c, s);  // the ranges of the demo_* keys and weight_decay
    LLMC_CHECK(c.demo.values != llmc::DemoValueEncoding::sign,
               s.name("demo_values") + ": --optimizer randomk all-reduces fp32 or bf16 values (sign is DeMo's)");
    LLMC_CHECK(c.demo.indices == llmc::DemoIndexEncoding::smallest,
               s.name("demo_indices") + ": --optimizer randomk sends no indices (every rank draws the same)");
    LLMC_CHECK(c.demo.delay == 0, s.name("demo_delay") + ": --optimizer randomk runs --demo_delay 0 only");
    LLMC_CHECK(c.demo.replicate_every == 1,
               s.name("demo_replicate_every") + ": --optimizer randomk exchanges every step (1 only)");
    LLMC_CHECK(c.shard_group_size == 1, s.name("shard_group_size") + ": --optimizer randomk runs flat only (1; got " +
                                            (c.shard_group_size == llmc::kShardGroupAuto
                                                 ? std::string("auto")
                                                 : std::to_string(c.shard_group_size)) +
                                            ")");
}

void randomk_select(uint64_t key, size_t n, size_t k, uint32_t* out, std::vector<uint32_t>& scratch) {
    LLMC_CHECK(k >= 1 && k <= n, "internal: randomk draws " + std::to_string(k) + " of " + std::to_string(n));
    if (k * 16 >= n) {  // the array itself
        scratch.resize(n);
        std::iota(scratch.begin(), scratch.end(), 0u);
        for (size_t j = 0; j < k; j++) {
            const size_t r = j + static_cast<size_t>(randomk_splitmix64(key + j) % (n - j));
            std::swap(scratch[j], scratch[r]);
        }
        std::copy(scratch.begin(), scratch.begin() + static_cast<ptrdiff_t>(k), out);
    } else {
        // Only the slots a swap moved: (slot, value) pairs; every other slot p still holds p. Slot j is never read
        // after step j, so a swap records just the value that lands in slot r.
        scratch.clear();
        const auto value_at = [&](size_t slot) {
            for (size_t q = 0; q < scratch.size(); q += 2)
                if (scratch[q] == slot) return scratch[q + 1];
            return static_cast<uint32_t>(slot);
        };
        const auto set = [&](size_t slot, uint32_t v) {
            for (size_t q = 0; q < scratch.size(); q += 2)
                if (scratch[q] == slot) {
                    scratch[q + 1] = v;
                    return;
                }
            scratch.push_back(static_cast<uint32_t>(slot));
            scratch.push_back(v);
        };
        for (size_t j = 0; j < k; j++) {
            const size_t r = j + static_cast<size_t>(randomk_splitmix64(key + j) % (n - j));
            const uint32_t at_j = value_at(j), at_r = value_at(r);
            out[j] = at_r;
            set(r, at_j);
        }
    }
    std::sort(out, out + k);
}

uint64_t randomk_bytes_sent(const ModelPlan& plan, llmc::DemoValueEncoding values, int world) {
    if (world <= 1) return 0;
    const uint64_t bytes = plan.total_selected * (values == llmc::DemoValueEncoding::bf16 ? 2u : 4u);
    return 2 * static_cast<uint64_t>(world - 1) * bytes / static_cast<uint64_t>(world);
}

namespace {

// Bytes per rank per step: the drawn values (payload) and the ring all-reduce's, against AdamW-DDP's fp32 ring.
void randomk_dry_run_report(std::ostream& out, const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout,
                            int world) {
    validate_randomk_options(c);  // the refusals validate_config leaves to the constructor
    const ModelPlan plan = cm::plan_for_layout(c, layout);
    const bool bf16 = c.demo.values == llmc::DemoValueEncoding::bf16;
    const double payload = static_cast<double>(plan.total_selected) * (bf16 ? 2.0 : 4.0);
    const uint64_t sent = randomk_bytes_sent(plan, c.demo.values, world);
    const double adamw = 2.0 * (world - 1) / world * 4.0 * static_cast<double>(layout.num_params);
    const std::string payload_label =
        "drawn values (payload), " + std::to_string(plan.total_selected) + " of " + std::to_string(layout.num_params);
    char line[1024];
    std::snprintf(line, sizeof line,
                  "randomk traffic per rank per step, %s, %d ranks, %s values (MB = 1e6 bytes):\n"
                  "  %-44s %12.6f MB\n"
                  "  %-44s %12.6f MB (%llu bytes)\n"
                  "  %-44s %12.6f MB (%.1fx randomk's)\n",
                  layout.config.describe().c_str(), world, bf16 ? "bf16" : "fp32", payload_label.c_str(),
                  payload / 1e6, "all-reduce sent (ring, 2(W-1)/W x payload)", static_cast<double>(sent) / 1e6,
                  static_cast<unsigned long long>(sent), "AdamW-DDP fp32 ring all-reduce sent", adamw / 1e6,
                  sent > 0 ? adamw / static_cast<double>(sent) : 0.0);
    out << line;
}

}  // namespace

llmc::OptimizerFamily randomk_family() {
    llmc::OptimizerFamily f;
    f.name = "randomk";
    f.help = "DeMo without the transform, k seeded-random coefficients per chunk (all-reduced, no indices); the "
             "demo_* keys apply";
    f.validate = check_randomk_seed;
    // DeMo's (a demo_topk clamped to small chunks), on the same plan
    f.warnings = [](const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout) {
        return demo_family().warnings(as_topk(c), layout);
    };
    f.dry_run_report = randomk_dry_run_report;
    f.describe = [](const llmc::OptimizerConfig& c) {
        std::string d = "seeded-random coefficients, all-reduced";
        if (c.demo.values == llmc::DemoValueEncoding::bf16) d += ", bf16 values";
        if (!c.demo.sign) d += ", unsigned update";
        return d;
    };
    f.make = [](const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout,
                llmc::Transport& t) -> std::unique_ptr<llmc::Optimizer> {
        return std::make_unique<RandomK>(c, layout, t);
    };
    return f;
}

RandomK::RandomK(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& transport)
    : config_(config), transport_(transport) {
    validate_randomk_options(config_);
    plan_ = cm::plan_for_layout(config_, layout, &decays_);
    momentum_.assign(plan_.num_params, 0.0f);
    indices_.assign(plan_.total_selected, 0);
    values_.assign(plan_.total_selected, 0.0f);
}

llmc::StepResult RandomK::step(std::span<float> params, std::span<float> grads, float lr) {
    const size_t n = momentum_.size();
    LLMC_CHECK(params.size() == n && grads.size() == n,
               "randomk: buffers of " + std::to_string(params.size()) + " / " + std::to_string(grads.size()) +
                   " floats, the layout has " + std::to_string(n));
    llmc::StepResult result;
    auto start = std::chrono::steady_clock::now();
    result.grad_norm = llmc::grad_norm(grads);  // the local gradient's: its scaling is folded into the momentum
    const float scale = llmc::clip_scale(result.grad_norm, config_.grad_clip);
    result.seconds.clip = seconds_since(start);

    // transform: weight decay and momentum (DeMo's arithmetic), then per chunk the draws, values and feedback.
    // Factors are formed in double and rounded once, as the reference's Python floats are.
    start = std::chrono::steady_clock::now();
    const llmc::DemoConfig& dc = config_.demo;
    const float wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
    const float decay = dc.decay;
    const float grad_scale =
        dc.momentum == llmc::DemoMomentum::ema ? static_cast<float>(1.0 - static_cast<double>(dc.decay)) : lr;
    float* p = params.data();
    float* delta = momentum_.data();
    const float* g = grads.data();
    for (size_t t = 0; t < plan_.tensors.size(); t++) {
        const TensorPlan& tp = plan_.tensors[t];
        const bool wd = config_.weight_decay != 0.0f && decays_[t];
        const size_t lo = tp.offset, hi = tp.offset + tp.numel();
#pragma omp parallel for schedule(static)
        for (size_t i = lo; i < hi; i++) {
            if (wd) p[i] *= wd_factor;
            if (scale == 1.0f) delta[i] = decay * delta[i] + grad_scale * g[i];
            else delta[i] = decay * delta[i] + grad_scale * (g[i] * scale);
        }
    }
    const bool bf16 = dc.values == llmc::DemoValueEncoding::bf16;
    const float alpha = dc.feedback_alpha;
    const uint64_t seed = static_cast<uint64_t>(config_.randomk.seed), step = static_cast<uint64_t>(steps_);
#pragma omp parallel
    {
        std::vector<uint32_t> scratch;
#pragma omp for schedule(dynamic, 16)
        for (size_t gc = 0; gc < plan_.total_chunks; gc++) {
            const size_t t = plan_.tensor_of_chunk(gc);
            const TensorPlan& tp = plan_.tensors[t];
            const size_t c = gc - tp.chunk_offset, s = tp.select_offset + c * tp.k;
            randomk_select(randomk_chunk_key(seed, step, t, c), tp.chunk_elems, tp.k, indices_.data() + s, scratch);
            for (size_t q = 0; q < tp.k; q++) {
                const size_t at = flat_position(tp, c, indices_[s + q]);
                const float v = bf16 ? llmc::km::round_bf16(delta[at]) : delta[at];
                values_[s + q] = v;
                delta[at] -= alpha * v;
            }
        }
    }
    result.seconds.transform = seconds_since(start);

    start = std::chrono::steady_clock::now();
    if (bf16) transport_.allreduce_mean_bf16(values_);
    else transport_.allreduce_mean(values_);
    result.seconds.exchange = seconds_since(start);

    // apply: the drawn positions only (an undrawn one's update, sign(0) = 0, leaves it as it is)
    start = std::chrono::steady_clock::now();
    const bool use_sign = dc.sign;
#pragma omp parallel for schedule(dynamic, 16)
    for (size_t gc = 0; gc < plan_.total_chunks; gc++) {
        const TensorPlan& tp = plan_.tensors[plan_.tensor_of_chunk(gc)];
        const size_t c = gc - tp.chunk_offset, s = tp.select_offset + c * tp.k;
        for (size_t q = 0; q < tp.k; q++) {
            const float m = values_[s + q];
            const float u = use_sign ? static_cast<float>((m > 0.0f) - (m < 0.0f)) : m;
            p[flat_position(tp, c, indices_[s + q])] -= lr * u;
        }
    }
    steps_++;
    result.seconds.apply = seconds_since(start);
    return result;
}

void RandomK::save_state(llmc::ByteWriter& out) const {
    out.reserve(out.bytes().size() + 64 + momentum_.size() * sizeof(float));
    out.put_string("randomk");
    out.put<uint64_t>(momentum_.size());
    out.put<uint64_t>(plan_.fingerprint());
    out.put<int64_t>(config_.randomk.seed);
    out.put<int64_t>(steps_);
    out.put_array(std::span<const float>(momentum_));
}

void RandomK::load_state(llmc::ByteReader& in) {
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "randomk", in.source() + ": optimizer state is for '" + name +
                                      "', not 'randomk' (use the checkpointed run's --optimizer)");
    const uint64_t n = in.get<uint64_t>("parameter count");
    LLMC_CHECK(n == momentum_.size(), in.source() + ": randomk state has " + std::to_string(n) +
                                          " parameters, model has " + std::to_string(momentum_.size()));
    const uint64_t fingerprint = in.get<uint64_t>("chunk plan");
    LLMC_CHECK(fingerprint == plan_.fingerprint(),
               in.source() + ": randomk state was saved with another chunk plan (--demo_chunk, --demo_topk)");
    const int64_t seed = in.get<int64_t>("seed");
    LLMC_CHECK(seed == config_.randomk.seed, in.source() + ": randomk state was saved with --randomk_seed " +
                                                 std::to_string(seed) + ", this run has " +
                                                 std::to_string(config_.randomk.seed));
    const int64_t steps = in.get<int64_t>("step count");
    LLMC_CHECK(steps >= 0, in.source() + ": corrupt or truncated (randomk step count " + std::to_string(steps) + ")");
    in.get_array(std::span<float>(momentum_), "randomk momentum");
    steps_ = steps;
}

}  // namespace demo
