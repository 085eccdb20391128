// SparseLoCo on the CPU (see sparseloco.h): its config keys and checks, its registry entry with the dry-run traffic
// report, and the compressed pseudo-gradient exchange that a Diloco runs at each sync.
#include "llmc/optim/diloco/sparseloco.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

std::vector<Key<SparselocoConfig>> sparseloco_config_keys() {
    return {
        key("sparseloco_topk", &SparselocoConfig::topk,
            "SparseLoCo: values sent per chunk, the k largest |error feedback| (at most the chunk's elements)"),
        key("sparseloco_chunk", &SparselocoConfig::chunk,
            "SparseLoCo: chunk length per dimension, <= 64 (the largest divisor of each dimension <= it; 12-bit "
            "indices)"),
        key("sparseloco_ef_decay", &SparselocoConfig::ef_decay,
            "SparseLoCo: error feedback e = decay * e + pseudo-gradient, before the top-k"),
        key("sparseloco_values", &SparselocoConfig::values,
            "SparseLoCo values on the wire: 2bit (4 bins over +-6 std, per-tensor bin means) or fp32 (ablation)",
            {{"2bit", SparselocoValues::two_bit}, {"fp32", SparselocoValues::fp32}}),
    };
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
const char* values_name(SparselocoValues v) { return v == SparselocoValues::two_bit ? "2-bit" : "fp32"; }
}  // namespace

void validate_sparseloco_options(const OptimizerConfig& c, const ConfigSources& sources) {
    validate_diloco_options(c, sources);
    const SparselocoConfig& s = c.sparseloco;
    const auto check = [&](bool ok, const char* key, const char* range, const std::string& value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + value + ")");
    };
    check(s.topk >= 1 && s.topk <= 4096, "sparseloco_topk", "in [1, 4096]", std::to_string(s.topk));
    check(s.chunk >= 1 && s.chunk <= static_cast<int>(sparseloco::kMaxChunk), "sparseloco_chunk", "in [1, 64]",
          std::to_string(s.chunk));
    check(s.ef_decay >= 0.0f && s.ef_decay <= 1.0f, "sparseloco_ef_decay", "in [0, 1]", format_float(s.ef_decay));
}

void check_sparseloco_wire(const OptimizerConfig& c, const ConfigSources& sources) {
    // refused rather than ignored: a run that asks for DiLoCo's int8 or bf16 wire would silently get another one
    LLMC_CHECK(c.diloco.wire == DilocoWire::fp32,
               sources.name("diloco_wire") +
                   " does not apply to --optimizer sparseloco, which sends its own values (--sparseloco_values); "
                   "leave it at fp32");
}

sparseloco::Plan sparseloco_plan(const OptimizerConfig& config, const ParamLayout& layout) {
    return sparseloco::make_plan(layout, static_cast<size_t>(config.sparseloco.chunk),
                                 static_cast<size_t>(config.sparseloco.topk),
                                 config.sparseloco.values == SparselocoValues::two_bit);
}

double sparseloco_sync_bytes_sent(const OptimizerConfig& config, const ParamLayout& layout, int world) {
    return static_cast<double>(world - 1) * static_cast<double>(sparseloco_plan(config, layout).message_bytes());
}

namespace {
// Bytes per rank per sync and per step (a sync every H steps), against DiLoCo's fp32 all-reduce per sync and
// AdamW-DDP's every step.
void sparseloco_dry_run_report(std::ostream& out, const OptimizerConfig& config, const ParamLayout& layout,
                               int world) {
    check_sparseloco_wire(config);
    const sparseloco::Plan plan = sparseloco_plan(config, layout);
    const int h = config.diloco.inner_steps;
    const double n = static_cast<double>(layout.num_params);
    const double payload = static_cast<double>(plan.message_bytes());
    const double sent = sparseloco_sync_bytes_sent(config, layout, world);
    const double dense = 2.0 * (world - 1) / world * n * 4.0;  // DiLoCo fp32 per sync = AdamW-DDP per step
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    char line[2048];
    std::snprintf(
        line, sizeof line,
        "SparseLoCo traffic per rank, %s, %d ranks, a sync every %d steps, top-%d per chunk (target %d), %s "
        "values (MB = 1e6 bytes):\n"
        "  %-38s %12zu of %zu (density %.2f%%)\n"
        "  %-38s %12.3f MB (codebooks %zu, values %zu, indices %zu bytes; %.2f bits per parameter)\n"
        "  %-38s %12.3f MB (%.0f bytes; %zu parameters)\n"
        "  %-38s %12.3f MB\n"
        "  %-38s %12.3f MB (%.1fx SparseLoCo's per sync)\n"
        "  %-38s %12.3f MB (%.1fx SparseLoCo's per step)\n",
        layout.config.describe().c_str(), world, h, config.sparseloco.topk, config.sparseloco.chunk,
        values_name(config.sparseloco.values), "values sent per sync", plan.total_slots, layout.num_params,
        100.0 * static_cast<double>(plan.total_slots) / n, "message (payload) per sync", payload / 1e6,
        plan.codebook_bytes(), plan.value_bytes(), plan.index_bytes(), 8.0 * payload / n,
        "sent per sync (all-gather, (W-1) x msg)", sent / 1e6, sent, layout.num_params, "sent per step, averaged",
        sent / h / 1e6, "DiLoCo fp32 all-reduce per sync", dense / 1e6, ratio(dense, sent), "AdamW-DDP fp32 per step",
        dense / 1e6, ratio(dense * h, sent));
    out << line;
    // every rank forwards the other W-1 messages: at enough ranks that outgrows a dense ring
    if (sent > dense)
        out << "  note: at " << world << " ranks the all-gather sends more per sync than an fp32 all-reduce\n";
}

std::vector<std::string> sparseloco_warnings(const OptimizerConfig& config, const ParamLayout& layout) {
    const sparseloco::Plan plan = sparseloco_plan(config, layout);
    if (plan.total_slots == layout.num_params)
        return {"sparseloco_topk " + std::to_string(config.sparseloco.topk) + " selects every element of every chunk " +
                "(sparseloco_chunk " + std::to_string(config.sparseloco.chunk) + "): nothing is sparsified"};
    return {};
}
}  // namespace

OptimizerFamily sparseloco_family() {
    return {"sparseloco",
            "SparseLoCo: DiLoCo whose pseudo-gradient is error feedback + per-chunk top-k + 2-bit values",
            [](const OptimizerConfig& c, const ConfigSources& s) { validate_sparseloco_options(c, s); },
            sparseloco_warnings, sparseloco_dry_run_report,
            [](const OptimizerConfig& c) {
                return "a sync every " + std::to_string(c.diloco.inner_steps) + " steps, top-" +
                       std::to_string(c.sparseloco.topk) + " per chunk of " + std::to_string(c.sparseloco.chunk) +
                       ", " + values_name(c.sparseloco.values) + " values, error feedback " +
                       format_float(c.sparseloco.ef_decay);
            },
            [](const OptimizerConfig& c, const ParamLayout& layout, Transport& t) -> std::unique_ptr<Optimizer> {
                return make_sparseloco(c, layout, t);
            }};
}

std::unique_ptr<Diloco> make_sparseloco(const OptimizerConfig& config, const ParamLayout& layout,
                                        Transport& transport) {
    return std::make_unique<Diloco>(config, layout, transport,
                                    std::make_unique<SparseLocoWire>(config, layout, transport));
}

SparseLocoWire::SparseLocoWire(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport)
    : options_(config.sparseloco), transport_(transport) {
    validate_sparseloco_options(config);
    check_sparseloco_wire(config);
    plan_ = sparseloco_plan(config, layout);
    ef_.assign(layout.num_params, 0.0f);
}

void SparseLocoWire::average(std::span<float> delta, StepTimings& seconds) {
    const size_t n = ef_.size();
    LLMC_CHECK(delta.size() == n, "sparseloco: pseudo-gradient size does not match the model layout");
    // 1-3: error feedback, compress, subtract what was sent (as every rank decodes it)
    auto start = std::chrono::steady_clock::now();
    const float decay = options_.ef_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) ef_[i] = decay * ef_[i] + delta[i];
    sparseloco::encode(plan_, ef_, message_);
    const size_t W = static_cast<size_t>(transport_.world_size());
    decoded_.resize(W);
    sparseloco::Decoded& own = decoded_[static_cast<size_t>(transport_.rank())];
    sparseloco::decode(plan_, message_, own, "sparseloco");
    // slots name distinct positions: no two threads write one element
#pragma omp parallel for schedule(static)
    for (size_t s = 0; s < own.positions.size(); s++) ef_[own.positions[s]] -= own.values[s];
    seconds.transform += seconds_since(start);

    // 4: every rank's message
    start = std::chrono::steady_clock::now();
    transport_.allgather_bytes(message_, gathered_, offsets_, gather_sizes_);
    gather_sizes_ = next_gather_sizes(offsets_, message_.size());
    seconds.exchange += seconds_since(start);

    // 5-6: decode every rank's, clip each tensor's contributions to their median norm, average
    start = std::chrono::steady_clock::now();
    LLMC_CHECK(offsets_.size() == W + 1, "sparseloco: the all-gather's offsets");
    for (size_t r = 0; r < W; r++)
        sparseloco::decode(plan_,
                           std::span<const std::byte>(gathered_).subspan(offsets_[r], offsets_[r + 1] - offsets_[r]),
                           decoded_[r], "sparseloco: rank " + std::to_string(r) + "'s message");
    const size_t tensors = plan_.tensors.size();
    std::vector<float> factor(tensors * W), norms(W);
    for (size_t ti = 0; ti < tensors; ti++) {
        for (size_t r = 0; r < W; r++) norms[r] = sparseloco::tensor_norm(plan_.tensors[ti], decoded_[r]);
        const float median = sparseloco::lower_median(norms);
        for (size_t r = 0; r < W; r++) factor[ti * W + r] = sparseloco::clip_factor(median, norms[r]);
    }
    std::fill(delta.begin(), delta.end(), 0.0f);
    for (size_t r = 0; r < W; r++) {  // rank order: every element sums its contributions in the same order
        const sparseloco::Decoded& d = decoded_[r];
        for (size_t ti = 0; ti < tensors; ti++) {
            const sparseloco::TensorPlan& p = plan_.tensors[ti];
            const float f = factor[ti * W + r];
#pragma omp parallel for schedule(static) if (p.slots() >= 16384)
            for (size_t s = p.first_slot; s < p.first_slot + p.slots(); s++) delta[d.positions[s]] += d.values[s] * f;
        }
    }
    const float inv = 1.0f / static_cast<float>(W);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) delta[i] *= inv;
    seconds.apply += seconds_since(start);
}

void SparseLocoWire::save_state(ByteWriter& out) const {
    out.put_string("sparseloco error feedback");
    out.put_array(std::span<const float>(ef_));
}

void SparseLocoWire::load_state(ByteReader& in) {
    const std::string tag = in.get_string("sparseloco error feedback tag");
    LLMC_CHECK(tag == "sparseloco error feedback",
               in.source() + ": no SparseLoCo error feedback after the DiLoCo state");
    in.get_array(std::span<float>(ef_), "sparseloco error feedback");
}

}  // namespace llmc
