// Checks GPT2Cpu and llmc::AdamW against an independent PyTorch GPT-2 (dev/reference/gpt2_reference.py): the
// same initial model and batch must give the same logits, loss and every parameter's gradient, and 10 AdamW
// steps on that batch the same losses and gradient norms, up to fp32 rounding.
//
// Usage: check_gpt2_vs_torch                 cases in build/reference/{tiny,d12}/ (SKIP when none exist)
//        check_gpt2_vs_torch DIR...           each DIR holds model.bin and state.bin
//        check_gpt2_vs_torch MODEL STATE      one case from two files
//        LLMC_REF_MODEL=.. LLMC_REF_STATE=.. check_gpt2_vs_torch
// test/unit/test_gpt2_vs_torch.sh writes the reference files and runs this.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "llmc/optim/adamw/adamw.h"
#include "llmc/base/fileio.h"
#include "llmc/model/gpt2/gpt2_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/comm/transport.h"
#include "test/support/testing.h"
#include "test/support/torch_reference.h"

namespace {

// ---- tolerances ----
// Both sides are fp32 but sum in different orders (OpenBLAS vs PyTorch's kernels, our LayerNorm statistics in
// double, our own exp). Each rounding is ~6e-8 relative; a d12 forward chains ~40 matmuls with sums of 768
// to 50304 terms. Measured (tiny / d12): logits 3.4e-7 / 2.7e-6 absolute (max |logit| 1.1 / 3.1), loss
// 9e-8 / 0 relative, worst gradient tensor 7e-7 / 1.8e-6 of its max. The bounds below leave 20-100x of
// headroom and stay far below what a real bug produces (a wrong mask, scale, bias or transposition changes
// results at the 1e-3..1 level; the finite-difference test in test_model_io catches 5% errors).
constexpr double kLogitTolerance = 1e-4;     // max |diff| relative to max(1, max |logit|)
constexpr double kLossTolerance = 1e-5;      // initial loss, relative (~10.8 for random init)
// Gradients: per tensor, max |diff| / max |reference grad|. Relative to the max because many entries are
// near 0, where a per-entry relative comparison is meaningless, while the largest entries set the scale.
constexpr double kGradTolerance = 1e-4;
// After 10 AdamW steps (measured worst 9e-8 / 2.5e-6): Adam scales each update to about lr whatever the
// gradient's size, so entries whose gradient is at rounding-noise level can move by lr in different
// directions on the two sides; they barely affect the loss, but the differences grow with each step.
constexpr double kStepLossTolerance = 1e-4;  // relative, each of the 10 losses
// Pre-clipping norms (measured 5e-5 / 7.4e-5): PyTorch's clip_grad_norm_ sums squares in fp32 and is itself
// off by ~5e-5 from the fp64 norm of its own gradients; ours accumulates in double.
constexpr double kGradNormTolerance = 1e-3;

double relative(double ours, double ref) { return std::fabs(ours - ref) / std::max(std::fabs(ref), 1e-30); }

void compare_with_torch(const std::string& model_path, const std::string& state_path) {
    const llmc::ModelConfig config = llmc::read_model_config(model_path);
    llmc::GPT2Cpu model(config);
    llmc::load_model(model_path, config, model.params());
    const llmc::ParamLayout& layout = model.layout();
    const torch_reference::State ref = torch_reference::read_state(state_path, layout.num_params);
    LLMC_CHECK(ref.vocab_size == config.vocab_size && ref.padded_vocab_size == config.padded_vocab_size,
               state_path + ": vocabulary sizes disagree with " + model_path);
    std::printf("  model %s, batch B=%d T=%d\n", config.describe().c_str(), ref.B, ref.T);

    // ---- one forward/backward ----
    model.zero_grad();
    const float loss = model.forward(ref.inputs.data(), ref.targets.data(), ref.B, ref.T);
    model.backward();

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
        const llmc::StepResult result = adamw.step(model.params(), model.grads(), 1e-4f);
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
    for (const Case& c : cases)
        testing::Registry::get().tests.emplace_back("vs_torch " + c.name,
                                                    [c] { compare_with_torch(c.model, c.state); });
    return testing::run_all();
}
