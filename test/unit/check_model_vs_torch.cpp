// Checks ModelCpu (every family), llmc::AdamW and demo::DemoOptimizer against the independent PyTorch models
// (dev/reference/gpt2_reference.py, dev/reference/olmo_reference.py): the same initial model and batch must give
// the same logits, loss and every parameter's gradient, and 10 AdamW steps on that batch the same losses and
// gradient norms, up to fp32 rounding. A batch with targets -1 (no target: torch's ignore_index) must also give
// per-position losses of 0 there, and count only the other positions. Where the reference also wrote DeMo runs (olmo_reference.py --demo-ranks:
// demo_rN.bin), 10 DeMo steps on N simulated ranks, each on its own batch, must give the same losses and end at
// the same parameters, up to the few signs that rounding decides.
//
// Usage: check_model_vs_torch                 cases in build/reference/{tiny,d12}/ (SKIP when none exist)
//        check_model_vs_torch DIR...           each DIR holds model.bin and state.bin (and maybe demo_r*.bin)
//        check_model_vs_torch MODEL STATE      one case from two files
//        LLMC_REF_MODEL=.. LLMC_REF_STATE=.. check_model_vs_torch
// test/unit/test_gpt2_vs_torch.sh and test/unit/test_olmo_vs_torch.sh write the reference files and run this.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "llmc/optim/adamw/adamw.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/base/fileio.h"
#include "llmc/base/targets.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/comm/transport.h"
#include "test/support/testing.h"
#include "test/support/torch_reference.h"

namespace {

// ---- tolerances ----
// Both sides are fp32 but sum in different orders (OpenBLAS vs PyTorch's kernels, our LayerNorm statistics in
// double, our own exp). Each rounding is ~6e-8 relative; a d12 forward chains ~40 matmuls with sums of 768
// to 50304 terms. Measured (tiny / d12): logits 3.4e-7 / 2.7e-6 absolute (max |logit| 1.1 / 3.1), loss
// 9e-8 / 0 relative, worst gradient tensor 7e-7 / 1.8e-6 of its max. OLMo (tiny LayerNorm / tiny RMSNorm /
// C=1024): logits 4.1e-6 / 4.4e-6 / 6.9e-6 absolute (max |logit| 5.3 / 5.7 / 5.2), loss 8.4e-8 / 0 / 8.6e-8,
// worst gradient tensor 8.7e-7 / 1.2e-6 / 1.4e-6 of its max. With targets -1 (tiny GPT-2 / tiny RMSNorm OLMo):
// loss 0 / 8.3e-8, worst gradient tensor 5.3e-7 / 9.7e-7. The bounds below leave 15-100x of headroom and stay
// far below what a real bug produces (a wrong mask, scale, bias or transposition changes results at the 1e-3..1
// level; the finite-difference test in test_model_io catches 5% errors).
constexpr double kLogitTolerance = 1e-4;     // max |diff| relative to max(1, max |logit|)
constexpr double kLossTolerance = 1e-5;      // initial loss, relative (~10.8 for random init)
// Gradients: per tensor, max |diff| / max |reference grad|. Relative to the max because many entries are
// near 0, where a per-entry relative comparison is meaningless, while the largest entries set the scale.
constexpr double kGradTolerance = 1e-4;
// After 10 AdamW steps (measured worst 9e-8 / 2.5e-6; OLMo 8.8e-8 / 8.8e-8 / 1.8e-7): Adam scales each update to about lr whatever the
// gradient's size, so entries whose gradient is at rounding-noise level can move by lr in different
// directions on the two sides; they barely affect the loss, but the differences grow with each step.
constexpr double kStepLossTolerance = 1e-4;  // relative, each of the 10 losses
// Pre-clipping norms (measured 5e-5 / 7.4e-5; OLMo 1.1e-5 / 9.2e-6 / 9.0e-5): PyTorch's clip_grad_norm_ sums
// squares in fp32 and is itself off by that much from the fp64 norm of its own gradients (C=1024's first step:
// torch 15.806852, the fp64 norm of torch's gradients 15.808163, ours 15.808163); ours accumulates in double.
constexpr double kGradNormTolerance = 1e-3;

double relative(double ours, double ref) { return std::fabs(ours - ref) / std::max(std::fabs(ref), 1e-30); }

void compare_with_torch(const std::string& model_path, const std::string& state_path) {
    const llmc::ModelConfig config = llmc::read_model_config(model_path);
    llmc::ModelCpu model(config);
    llmc::load_model(model_path, config, model.params());
    const llmc::ParamLayout& layout = model.layout();
    const torch_reference::State ref = torch_reference::read_state(state_path, layout.num_params);
    LLMC_CHECK(ref.vocab_size == config.vocab_size && ref.padded_vocab_size == config.padded_vocab_size,
               state_path + ": vocabulary sizes disagree with " + model_path);
    std::printf("  model %s, batch B=%d T=%d, AdamW lr %g\n", config.describe().c_str(), ref.B, ref.T, ref.lr);

    // ---- one forward/backward ----
    model.zero_grad();
    const float loss = model.forward(ref.inputs.data(), ref.targets.data(), ref.B, ref.T);
    model.backward();
    const size_t masked = size_t(std::count(ref.targets.begin(), ref.targets.end(), llmc::kNoTarget));
    if (masked > 0) {
        size_t nonzero = 0;
        for (size_t i = 0; i < ref.targets.size(); i++)
            nonzero += ref.targets[i] == llmc::kNoTarget && model.losses()[i] != 0.0f;
        std::printf("  %zu of %zu positions without a target; their losses nonzero: %zu\n", masked,
                    ref.targets.size(), nonzero);
        EXPECT_EQ(nonzero, size_t{0});
    }
    EXPECT_EQ(model.target_count(), ref.targets.size() - masked);

    const auto logits = model.logits();
    double max_logit_diff = 0.0, max_logit = 0.0;
    for (size_t i = 0; i < logits.size(); i++) {
        max_logit_diff = std::max(max_logit_diff, double(std::fabs(logits[i] - ref.logits[i])));
        max_logit = std::max(max_logit, double(std::fabs(ref.logits[i])));
    }
    std::printf("  logits: max |diff| %.3g (max |logit| %.3g)\n", max_logit_diff, max_logit);
    EXPECT(max_logit_diff <= kLogitTolerance * std::max(1.0, max_logit));
    std::printf("  loss: ours %.7f torch %.7f (rel diff %.3g)\n", loss, ref.loss, relative(loss, ref.loss));
    EXPECT(relative(loss, ref.loss) <= kLossTolerance);

    const auto grads = model.grads();
    double worst = 0.0;
    std::string worst_name;
    for (const llmc::ParamTensor& t : layout.tensors) {
        double max_diff = 0.0, max_ref = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            max_diff = std::max(max_diff, double(std::fabs(grads[i] - ref.grads[i])));
            max_ref = std::max(max_ref, double(std::fabs(ref.grads[i])));
        }
        const double rel = max_ref > 0.0 ? max_diff / max_ref : max_diff;
        if (rel > kGradTolerance)
            testing::report_failure(__FILE__, __LINE__,
                                    "gradient of " + t.name + ": max |diff| " + std::to_string(max_diff) +
                                        " is " + std::to_string(rel) + " of max |grad| " + std::to_string(max_ref));
        if (rel >= worst) {
            worst = rel;
            worst_name = t.name;
        }
    }
    std::printf("  grads: worst tensor %s, max |diff| / max |grad| = %.3g\n", worst_name.c_str(), worst);

    // ---- AdamW steps on the same batch (the first reuses the gradients above) ----
    llmc::OptimizerConfig opt_config;
    opt_config.weight_decay = 0.1f;
    opt_config.decay_groups = llmc::DecayGroups::matrices;
    opt_config.grad_clip = 1.0f;
    llmc::LocalTransport transport;
    llmc::AdamW adamw(opt_config, layout, transport);
    double worst_loss = 0.0, worst_norm = 0.0;
    for (int step = 0; step < ref.steps; step++) {
        float step_loss = loss;
        if (step > 0) {
            model.zero_grad();
            step_loss = model.forward(ref.inputs.data(), ref.targets.data(), ref.B, ref.T);
            model.backward();
        }
        const llmc::StepResult result = adamw.step(model.params(), model.grads(), ref.lr);
        const double loss_rel = relative(step_loss, ref.losses[step]);
        const double norm_rel = relative(result.grad_norm, ref.grad_norms[step]);
        std::printf("  step %d: loss %.6f (torch %.6f, rel %.2g)  grad norm %.6f (torch %.6f, rel %.2g)\n", step,
                    step_loss, ref.losses[step], loss_rel, result.grad_norm, ref.grad_norms[step], norm_rel);
        worst_loss = std::max(worst_loss, loss_rel);
        worst_norm = std::max(worst_norm, norm_rel);
    }
    std::printf("  %d AdamW steps: worst loss rel diff %.3g, worst grad norm rel diff %.3g\n", ref.steps,
                worst_loss, worst_norm);
    EXPECT(worst_loss <= kStepLossTolerance);
    EXPECT(worst_norm <= kGradNormTolerance);
}

// ---- DeMo runs ----
// DeMo moves every parameter by exactly +-lr (0 where the update is exactly 0) after weight decay, so the two
// sides stay bit-identical until fp32 rounding decides a sign differently: an update within rounding of 0, or a
// top-k near-tie (the 32nd and 33rd |coefficient| of a chunk within ~1e-7 of each other), which changes a whole
// chunk's update. Such a flip moves the runs apart by 2 lr in a few elements (1 lr where one side's update
// rounds to exactly 0), and the forwards after it see slightly different weights, so later flips follow; the
// larger lr, the more. Measured at lr 1e-4 (tiny model, LayerNorm / RMSNorm, 1 and 2 ranks): losses within
// 7.7e-7 relative, grad norms 1.1e-5, at most 1502 of 3.35M parameters (0.045%) differ at the end, per tensor
// ||diff|| / ||moved|| <= 0.0084, every difference a whole multiple of lr to 1.2e-3 lr (weight decay scales a
// flip's 2 lr by (1 - lr wd) per later step). (At lr 1e-3 a cascade reached 9% of the parameters and 0.24.)
// What the reference's mutations gave: weight decay on the norm weights too: differences 0.498 lr off a
// multiple, 3.7% differ, ||diff|| / ||moved|| 0.20; no local clip: 14.5% differ, 0.27-0.36; the sum of the ranks'
// coefficients instead of their mean: 52% differ, 0.45, loss 1.3e-4.
constexpr double kDemoLossTolerance = 1e-5;        // each step's loss on each rank, relative
constexpr double kDemoGradNormTolerance = 1e-4;    // each rank's local pre-clipping norm, relative (torch: fp32)
constexpr double kDemoDifferTolerance = 0.01;      // fraction of all parameters that differ at all at the end
constexpr double kDemoMovedTolerance = 0.1;        // per tensor ||ours - ref|| / ||ref - initial|| at the end
constexpr double kDemoLrMultipleTolerance = 0.01;  // per element, distance from a whole multiple of lr, in lr
// Runs run.steps DeMo steps of run.ranks simulated ranks from model.bin as olmo_reference.py did: every rank's
// gradient at the shared parameters on its own batch, then the step. One rank goes through DemoOptimizer::step
// (the trainer's path); several through compress() per rank, the buckets concatenated as the all-gather would,
// and apply() on every rank (test_demo_optimizer and test_mpi_optimizers check that this equals step() over a
// real transport). Each step's losses and norms, and the parameters at the end.
struct DemoResult {
    std::vector<float> losses, grad_norms;  // [step * ranks + rank]
    std::vector<float> params;
    bool ranks_agree = true;
};

DemoResult run_demo(const std::string& model_path, const torch_reference::DemoRun& run) {
    const llmc::ModelConfig config = llmc::read_model_config(model_path);
    llmc::ModelCpu model(config);
    llmc::load_model(model_path, config, model.params());
    const llmc::ParamLayout& layout = model.layout();
    llmc::OptimizerConfig cfg;  // the rest as olmo_reference.py: lr-scaled momentum, fp32 values, alpha 1, no delay
    cfg.weight_decay = run.weight_decay;
    cfg.decay_groups = llmc::DecayGroups::matrices;
    cfg.grad_clip = run.grad_clip;
    cfg.demo.topk = run.topk;
    cfg.demo.chunk = run.chunk;
    cfg.demo.decay = run.decay;
    cfg.demo.delay = 0;
    llmc::LocalTransport transport;
    std::vector<std::unique_ptr<demo::DemoOptimizer>> opts;
    for (int r = 0; r < run.ranks; r++) opts.push_back(std::make_unique<demo::DemoOptimizer>(cfg, layout, transport));
    const std::vector<float> initial(model.params().begin(), model.params().end());
    std::vector<std::vector<float>> params(run.ranks, initial);
    DemoResult res;
    llmc::StepTimings timings;
    auto gradient = [&](int r) {  // rank r's loss; its gradient in model.grads()
        std::copy(params[r].begin(), params[r].end(), model.params().begin());
        model.zero_grad();
        const float loss = model.forward(run.inputs[r].data(), run.targets[r].data(), run.B, run.T);
        model.backward();
        return loss;
    };
    for (int step = 0; step < run.steps; step++) {
        if (run.ranks == 1) {
            res.losses.push_back(gradient(0));
            const llmc::StepResult sr = opts[0]->step(model.params(), model.grads(), run.lr);
            res.grad_norms.push_back(static_cast<float>(sr.grad_norm));
            params[0].assign(model.params().begin(), model.params().end());
            continue;
        }
        std::vector<std::byte> all, bucket;
        std::vector<size_t> offsets{0};
        for (int r = 0; r < run.ranks; r++) {
            res.losses.push_back(gradient(r));
            res.grad_norms.push_back(static_cast<float>(llmc::clip_grad_norm(model.grads(), run.grad_clip)));
            opts[r]->compress(params[r], model.grads(), run.lr, bucket, timings);
            all.insert(all.end(), bucket.begin(), bucket.end());
            offsets.push_back(all.size());
        }
        for (int r = 0; r < run.ranks; r++) opts[r]->apply(all, offsets, params[r], run.lr, timings);
        for (int r = 1; r < run.ranks; r++) res.ranks_agree = res.ranks_agree && params[r] == params[0];
    }
    res.params = params[0];
    return res;
}

void compare_demo_with_torch(const std::string& model_path, const std::string& run_path) {
    const llmc::ModelConfig config = llmc::read_model_config(model_path);
    const llmc::ParamLayout layout = llmc::ParamLayout::of(config);
    const torch_reference::DemoRun run = torch_reference::read_demo_run(run_path, layout.num_params);
    LLMC_CHECK(run.vocab_size == config.vocab_size && run.padded_vocab_size == config.padded_vocab_size,
               run_path + ": vocabulary sizes disagree with " + model_path);
    std::printf("  model %s, %d ranks of B=%d T=%d, %d DeMo steps (top-%d of %dx%d chunks, lr %g, weight decay %g, "
                "clip %g)\n", config.describe().c_str(), run.ranks, run.B, run.T, run.steps, run.topk, run.chunk,
                run.chunk, run.lr, run.weight_decay, run.grad_clip);
    const DemoResult ours = run_demo(model_path, run);
    EXPECT(ours.ranks_agree);

    double worst_loss = 0.0, worst_norm = 0.0;
    for (int step = 0; step < run.steps; step++) {
        std::printf("  step %d:", step);
        for (int r = 0; r < run.ranks; r++) {
            const size_t i = size_t(step) * run.ranks + r;
            const double loss_rel = relative(ours.losses[i], run.losses[i]);
            const double norm_rel = relative(ours.grad_norms[i], run.grad_norms[i]);
            std::printf("  rank %d loss %.6f (torch %.6f, rel %.2g) norm rel %.2g", r, ours.losses[i], run.losses[i],
                        loss_rel, norm_rel);
            worst_loss = std::max(worst_loss, loss_rel);
            worst_norm = std::max(worst_norm, norm_rel);
        }
        std::printf("\n");
    }
    std::printf("  worst loss rel diff %.3g, worst grad norm rel diff %.3g\n", worst_loss, worst_norm);
    EXPECT(worst_loss <= kDemoLossTolerance);
    EXPECT(worst_norm <= kDemoGradNormTolerance);

    // The final parameters, per tensor: how many differ at all, the largest difference in units of lr, and the
    // difference's L2 norm relative to how far the reference moved the tensor.
    std::vector<float> initial(layout.num_params);
    llmc::load_model(model_path, config, initial);
    size_t differ = 0;
    double worst_lr_units = 0.0, worst_moved = 0.0, worst_residual = 0.0;
    for (const llmc::ParamTensor& t : layout.tensors) {
        size_t n = 0;
        double max_diff = 0.0, d2 = 0.0, m2 = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double d = double(ours.params[i]) - run.params[i], m = double(run.params[i]) - initial[i];
            n += d != 0.0;
            max_diff = std::max(max_diff, std::fabs(d));
            const double steps = std::round(d / run.lr);  // a sign flip is 2 lr, an exactly-0 update on one side 1 lr
            worst_residual = std::max(worst_residual, std::fabs(d - steps * run.lr) / run.lr);

            d2 += d * d;
            m2 += m * m;
        }
        differ += n;
        const double moved = m2 > 0 ? std::sqrt(d2 / m2) : std::sqrt(d2);
        std::printf("  %-40s %8zu of %9zu differ, max |diff| %.3g lr, |diff| / |moved| %.3g\n", t.name.c_str(), n,
                    t.numel, max_diff / run.lr, moved);
        worst_lr_units = std::max(worst_lr_units, max_diff / run.lr);
        worst_moved = std::max(worst_moved, moved);
        if (moved > kDemoMovedTolerance)
            testing::report_failure(__FILE__, __LINE__, t.name + ": |ours - torch| is " + std::to_string(moved) +
                                                            " of how far torch moved it");
    }
    std::printf("  final params: %zu of %zu differ (%.3g%%), worst max |diff| %.3g lr, worst |diff| / |moved| %.3g, "
                "worst distance from a multiple of lr %.3g lr\n",
                differ, layout.num_params, 100.0 * differ / layout.num_params, worst_lr_units, worst_moved,
                worst_residual);
    EXPECT(worst_residual <= kDemoLrMultipleTolerance);
    EXPECT(double(differ) <= kDemoDifferTolerance * double(layout.num_params));
}

bool is_directory(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int main(int argc, char** argv) {
    struct Case { std::string name, model, state; };
    std::vector<Case> cases;
    const char* env_model = std::getenv("LLMC_REF_MODEL");
    const char* env_state = std::getenv("LLMC_REF_STATE");
    if (argc == 3 && !is_directory(argv[1])) {
        cases.push_back({argv[1], argv[1], argv[2]});
    } else if (argc > 1) {
        for (int i = 1; i < argc; i++) cases.push_back({argv[i], std::string(argv[i]) + "/model.bin", std::string(argv[i]) + "/state.bin"});
    } else if (env_model != nullptr && env_state != nullptr) {
        cases.push_back({env_model, env_model, env_state});
    } else {
        for (const char* dir : {"build/reference/tiny", "build/reference/d12"}) {
            const std::string model = std::string(dir) + "/model.bin", state = std::string(dir) + "/state.bin";
            if (llmc::file_exists(model) && llmc::file_exists(state)) cases.push_back({dir, model, state});
            else std::printf("note: %s has no model.bin/state.bin; test/unit/test_gpt2_vs_torch.sh writes them\n", dir);
        }
        if (cases.empty())
            testing::skip("no PyTorch reference files in build/reference/ (run test/unit/test_gpt2_vs_torch.sh)");
    }
    for (const Case& c : cases) {
        testing::Registry::get().tests.emplace_back("vs_torch " + c.name,
                                                    [c] { compare_with_torch(c.model, c.state); });
        if (!is_directory(c.name)) continue;
        std::vector<std::string> runs;  // demo_r1.bin, demo_r2.bin, ... in name order
        for (const auto& entry : std::filesystem::directory_iterator(c.name)) {
            const std::string file = entry.path().filename().string();
            if (file.rfind("demo_r", 0) == 0 && entry.path().extension() == ".bin") runs.push_back(entry.path().string());
        }
        std::sort(runs.begin(), runs.end());
        for (const std::string& run : runs)
            testing::Registry::get().tests.emplace_back("demo vs_torch " + run,
                                                        [c, run] { compare_demo_with_torch(c.model, run); });
    }
    return testing::run_all();
}
