// DeMo's options (demo_config.h): its config keys, their checks, its warnings and dry-run report, and its entry in
// the registry of optimizers.
#include "llmc/optim/demo/demo_config.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "llmc/base/error.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/demo/demo_reshard.h"
#include "llmc/optim/demo/flexdemo.h"
#include "llmc/optim/demo/kernels/tunings.h"
#include "llmc/optim/demo/traffic_report.h"

namespace llmc {

std::vector<Key<DemoConfig>> demo_config_keys() {
    return {
        key("demo_decay", &DemoConfig::decay, "DeMo momentum decay"),
        key("demo_topk", &DemoConfig::topk, "DeMo coefficients sent per chunk").fixed(),
        key("demo_chunk", &DemoConfig::chunk, "DeMo chunk length per dimension").fixed(),
        key("demo_momentum", &DemoConfig::momentum,
            "DeMo momentum: lr (decay*m + lr*g, reference) or ema (decay*m + (1-decay)*g)",
            {{"lr", DemoMomentum::lr_scaled}, {"ema", DemoMomentum::ema}}),
        key("demo_alpha", &DemoConfig::feedback_alpha, "DeMo error-feedback strength in (0, 1]"),
        key("demo_values", &DemoConfig::values, "DeMo values on the wire: fp32, bf16 or sign (1 bit)",
            {{"fp32", DemoValueEncoding::fp32}, {"bf16", DemoValueEncoding::bf16}, {"sign", DemoValueEncoding::sign}})
            .fixed(),
        key("demo_indices", &DemoConfig::indices,
            "DeMo indices on the wire: auto (smallest integer), packed12 or entropy (Elias-Fano per chunk, about "
            "log2(C(chunk elements, k)) bits; train_gpt_cpu only)",
            {{"auto", DemoIndexEncoding::smallest},
             {"packed12", DemoIndexEncoding::packed12},
             {"entropy", DemoIndexEncoding::entropy}})
            .fixed(),
        key("demo_delay", &DemoConfig::delay,
            "DeMo: 1 applies each step's update at the next step, so the exchange overlaps that step's compute (0: "
            "the reference's order)")
            .fixed(),
        key("demo_eager", &DemoConfig::eager,
            "DeMo with --demo_delay 1: each rank takes its own share of an update at once, until the gathered update "
            "lands a step later (false: nothing until then)"),
        key("demo_replicate_every", &DemoConfig::replicate_every,
            "DeMo: exchange across nodes only at steps divisible by N; in between each node (--shard_group_size) "
            "steps on the sign of its own averaged gradient (FlexDeMo's schedule; 1: every step)")
            .fixed(),
        key("demo_sign", &DemoConfig::sign,
            "DeMo: apply the sign of the decoded update (the reference) or, false, the decoded update itself, "
            "p -= lr * decode(G)"),
        key("demo_transform", &DemoConfig::transform,
            "DeMo chunk transform: dct (DCT-II, the reference), random (a fixed seeded random orthogonal matrix per "
            "chunk length) or identity (none: top-k of the momentum itself, --optimizer topk); train_gpt: dct, identity",
            {{"dct", DemoTransform::dct}, {"random", DemoTransform::random}, {"identity", DemoTransform::identity}})
            .fixed(),
        key("demo_diagnostics", &DemoConfig::diagnostics,
            "DeMo: every N steps measure the paper's conjectures (energy compaction, persistence, agreement, "
            "residual) per tensor group into a metrics.jsonl \"diagnostics\" line (0: off; train_gpt_cpu only, "
            "docs/conjectures.md)"),
    };
}

std::vector<Key<DemoConfig>> demo_cuda_keys() {
    return {
        key("demo_dct", &DemoConfig::dct,
            "train_gpt, DeMo: the compress kernel's DCTs in fp32 multiply-adds (bit-identical to the CPU reference) "
            "or on the tensor cores (3xTF32, within 2e-6 of the chunk maximum)",
            {{"fp32", DemoDct::fp32}, {"tensor", DemoDct::tensor}}),
        key("demo_momentum_domain", &DemoConfig::momentum_domain,
            "train_gpt, DeMo: the 64 x 64 chunks' momentum as the reference keeps it, or in the DCT domain (the same "
            "step to rounding, a faster compress; checkpoints record it and any trainer resumes them)",
            {{"spatial", DemoMomentumDomain::spatial}, {"dct", DemoMomentumDomain::dct}}),
        key("demo_kernel_tuning", &DemoConfig::kernel_tuning,
            "train_gpt, DeMo: run row N of the kernel lab's tunings table (demo::kTunings) instead of the one "
            "demo_dct and demo_momentum_domain pick (-1), to time the lab's candidates in whole steps")
            .experimental("a kernel-lab knob"),
    };
}

}  // namespace llmc

namespace demo {

void validate_demo_options(const llmc::OptimizerConfig& c, const llmc::ConfigSources& sources) {
    const llmc::DemoConfig& d = c.demo;
    const auto check = [&](bool ok, const char* key, const char* range, const std::string& value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + value + ")");
    };
    check(d.topk >= 1, "demo_topk", ">= 1", std::to_string(d.topk));
    check(d.chunk >= 1, "demo_chunk", ">= 1", std::to_string(d.chunk));
    // A chunk side n holds n x n DCT basis floats per distinct side (4 GB at n = 32768): far above any useful chunk
    check(d.chunk <= 4096, "demo_chunk", "<= 4096", std::to_string(d.chunk));
    check(d.decay >= 0.0f && d.decay < 1.0f, "demo_decay", "in [0, 1)", llmc::format_float(d.decay));
    check(d.feedback_alpha > 0.0f && d.feedback_alpha <= 1.0f, "demo_alpha", "in (0, 1]",
          llmc::format_float(d.feedback_alpha));
    check(c.weight_decay >= 0.0f, "weight_decay", ">= 0", llmc::format_float(c.weight_decay));
    check(d.delay == 0 || d.delay == 1, "demo_delay", "0 or 1", std::to_string(d.delay));
    check(d.replicate_every >= 1, "demo_replicate_every", ">= 1", std::to_string(d.replicate_every));
    check(d.diagnostics >= 0, "demo_diagnostics", ">= 0", std::to_string(d.diagnostics));
    LLMC_CHECK(d.diagnostics == 0 || (d.delay == 0 && d.replicate_every == 1 && c.shard_group_size == 1),
               sources.list({"demo_diagnostics", "demo_delay", "demo_replicate_every", "shard_group_size"}) +
                   ": --demo_diagnostics runs with flat DeMo only (--demo_delay 0, --demo_replicate_every 1, "
                   "--shard_group_size 1)");
    LLMC_CHECK(d.replicate_every == 1 || d.delay == 0,
               sources.list({"demo_replicate_every", "demo_delay"}) +
                   ": --demo_replicate_every above 1 runs with --demo_delay 0 only");
    LLMC_CHECK(c.shard_group_size == 1 || d.delay == 0 || !d.eager,
               sources.list({"shard_group_size", "demo_delay", "demo_eager"}) +
                   ": a sharded DeMo step (--shard_group_size) with --demo_delay 1 needs --demo_eager false (each "
                   "rank holds the shared weights of its shard only)");
    const int t = d.kernel_tuning;
    check(t >= -1 && t < kNumTunings, "demo_kernel_tuning",
          ("-1 or a row of demo::kTunings, 0 to " + std::to_string(kNumTunings - 1)).c_str(), std::to_string(t));
    if (t >= 0) {
        const bool tensor = d.dct == llmc::DemoDct::tensor, dct = d.momentum_domain == llmc::DemoMomentumDomain::dct;
        LLMC_CHECK(sources.origin("demo_dct").empty() || kTunings[t].tensor_dct == tensor,
                   sources.name("demo_kernel_tuning") + " " + std::to_string(t) + " runs the DCTs " +
                       (kTunings[t].tensor_dct ? "on the tensor cores" : "in fp32") + " but " +
                       sources.name("demo_dct") + " asks otherwise (give one of them)");
        LLMC_CHECK(sources.origin("demo_momentum_domain").empty() || kTunings[t].dct_momentum == dct,
                   sources.name("demo_kernel_tuning") + " " + std::to_string(t) + " keeps the momentum " +
                       (kTunings[t].dct_momentum ? "in the DCT domain" : "spatial") + " but " +
                       sources.name("demo_momentum_domain") + " asks otherwise (give one of them)");
    }
}

namespace {

// plan_tensor clamps a tensor's k to its chunks' elements (a 1-D tensor's chunk is one row): such chunks send every
// coefficient, which a demo_topk chosen for the 64 x 64 matrices probably did not mean.
std::vector<std::string> demo_warnings(const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout) {
    const llmc::DemoConfig& d = cfg.demo;
    size_t clamped = 0, fewest = SIZE_MAX;
    std::string example;
    for (const llmc::ParamTensor& t : layout.tensors) {
        const TensorPlan p = plan_tensor(t.shape, static_cast<size_t>(d.chunk), static_cast<size_t>(d.topk));
        if (p.k == static_cast<size_t>(d.topk)) continue;
        clamped++;
        if (p.chunk_elems < fewest) {
            fewest = p.chunk_elems;
            example = std::to_string(p.n1) + " x " + std::to_string(p.n2) + " in " + t.name;
        }
    }
    if (clamped == 0) return {};
    return {"demo_topk " + std::to_string(d.topk) + " exceeds the elements of the DeMo chunks of " +
            std::to_string(clamped) + " of " + std::to_string(layout.tensors.size()) + " tensors (demo_chunk " +
            std::to_string(d.chunk) + "; smallest: " + example +
            "): their k is clamped to a chunk's elements, so they send every coefficient"};
}

// The sharded step's part of the dry run: the state one rank holds, measured on the optimizer of its shard, against
// the flat step's, and the node's traffic. --shard_group_size auto counts as 1 here (the dry run sees no hosts).
void print_sharded_report(std::ostream& out, const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout,
                          int world) {
    const int s = std::max(1, cfg.shard_group_size);
    // measured by building the optimizers: only for a sharded run, and a model that fits here
    if (s == 1 || layout.num_params > (size_t{1} << 30)) return;
    const double flat = static_cast<double>(flexdemo_state_bytes_per_rank(cfg, layout, 1));
    const double mine = s == 1 ? flat : static_cast<double>(flexdemo_state_bytes_per_rank(cfg, layout, s));
    const double grads = static_cast<double>(layout.num_params) * 4.0;
    char line[512];
    std::snprintf(line, sizeof line,
                  "sharded step, %d ranks in nodes of %d (--shard_group_size):\n"
                  "  optimizer state per rank, measured   %12.3f MB (flat DeMo %.3f MB: %.3f of it)\n"
                  "  intra-node reduce-scatter sent       %12.3f MB\n"
                  "  intra-node all-gather sent           %12.3f MB\n",
                  world, s, mine / 1e6, flat / 1e6, mine / flat, grads * (s - 1) / s / 1e6,
                  grads * (s - 1) / s / 1e6);
    out << line;
    if (s > 1 && world % s == 0)
        out << "  across nodes: the buckets above for " << world / s << " replicas of a shard of about 1/" << s
            << " of the model\n";
}

void demo_dry_run_report(std::ostream& out, const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout,
                         int world) {
    TrafficOptions traffic;
    traffic.world_size = world;
    traffic.chunk = cfg.demo.chunk;
    std::vector<NamedShape> shapes;
    for (const llmc::ParamTensor& t : layout.tensors) shapes.push_back({t.name, t.shape});
    print_traffic_report(out,
                         "traffic per rank per step, " + layout.config.describe() + ", " + std::to_string(world) +
                             " ranks",
                         shapes, traffic);
    print_sharded_report(out, cfg, layout, world);
}

std::string demo_describe(const llmc::OptimizerConfig& cfg) {
    std::string d;
    if (cfg.shard_group_size != 1)
        d = cfg.shard_group_size == llmc::kShardGroupAuto ? "FlexDeMo, nodes of the ranks on a host"
                                                          : "FlexDeMo, nodes of " + std::to_string(cfg.shard_group_size);
    if (cfg.demo.replicate_every != 1)
        d += (d.empty() ? "" : ", ") + std::string("across nodes every ") + std::to_string(cfg.demo.replicate_every) +
             " steps";
    if (cfg.demo.delay == 1)
        d += (d.empty() ? "" : ", ") +
             std::string(cfg.demo.eager ? "applied a step late, own share at once" : "applied a step late");
    if (!cfg.demo.sign) d += (d.empty() ? "" : ", ") + std::string("unsigned update");
    if (cfg.demo.transform == llmc::DemoTransform::random)
        d += (d.empty() ? "" : ", ") + std::string("random orthogonal transform");
    if (cfg.demo.transform == llmc::DemoTransform::identity)
        d += (d.empty() ? "" : ", ") + std::string("no transform: top-k of the momentum itself");
    return d;
}

}  // namespace

llmc::OptimizerFamily demo_family() {
    return {"demo", "DeMo", [](const llmc::OptimizerConfig& c, const llmc::ConfigSources& s) { validate_demo_options(c, s); },
            demo_warnings, demo_dry_run_report, demo_describe,
            [](const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout,
               llmc::Transport& t) -> std::unique_ptr<llmc::Optimizer> {
                const int s = llmc::resolve_shard_group_size(t, c.shard_group_size);
                if (s == 1 && c.demo.replicate_every == 1) return std::make_unique<DemoOptimizer>(c, layout, t);
                return std::make_unique<FlexDemo>(c, layout, t, s);
            },
            reshard_state};
}

// Per-chunk top-k of the momentum itself: DeMo with the identity for its transform, the same wire format,
// error feedback and sign step, so the pair isolates what the DCT contributes.
llmc::OptimizerFamily topk_family() {
    llmc::OptimizerFamily f = demo_family();
    f.name = "topk";
    f.help = "DeMo without the transform: per-chunk top-k of the momentum; the demo_* keys apply";
    // validate runs for every run (config.cpp: a key is refused whether or not the run reads it), so a transform
    // given to topk is refused by as_topk, which every topk path goes through, not here: --optimizer demo
    // --demo_transform random must pass.
    f.describe = [](const llmc::OptimizerConfig& c) { return demo_describe(as_topk(c)); };
    f.dry_run_report = [](std::ostream& out, const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout, int world) {
        demo_dry_run_report(out, as_topk(c), layout, world);
    };
    f.warnings = [](const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout) {
        return demo_warnings(as_topk(c), layout);
    };
    f.make = [](const llmc::OptimizerConfig& c, const llmc::ParamLayout& layout,
                llmc::Transport& t) -> std::unique_ptr<llmc::Optimizer> {
        return demo_family().make(as_topk(c), layout, t);
    };
    return f;
}

llmc::OptimizerConfig as_topk(llmc::OptimizerConfig config) {
    LLMC_CHECK(config.demo.transform == llmc::DemoTransform::dct,
               "--demo_transform: --optimizer topk has no transform (it selects the momentum itself)");
    config.demo.transform = llmc::DemoTransform::identity;
    return config;
}

}  // namespace demo
