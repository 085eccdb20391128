// Checker for llmc/cuda/fused_classifier.cuh: per-row cross-entropy losses over the first V of Vp columns and the
// in-place dlogits (softmax - onehot) * dloss with zeroed padding (a row without a target: loss 0, dlogits 0),
// against a CPU computation in double; the evaluation variant must leave the logits untouched; the kernel
// fused_classifier launches (on sm_80 and newer for GPT-2's rows: the staged one), and the two-pass 128-bit kernel
// it runs for longer rows. Timing of both at B*T = 8192 rows of 50304.
// Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/fused_classifier.cuh"

using namespace llmc;

int main() {
    return check::run_checker("fused_classifier", [](CudaEnv& env, check::Checker& ck) {
        const int N = 256, V = 50257, Vp = 50304;
        auto logits = check::random_floatX_values(size_t(N) * Vp, 2.0f, 41);
        std::mt19937 rng(42);
        std::vector<int> targets(N);
        for (int& t : targets) t = static_cast<int>(rng() % V);
        targets[0] = 0;
        targets[1] = V - 1;
        targets[2] = kNoTarget;
        const float dloss = 1.0f / N;
        std::vector<float> ref_loss(N), ref_d(size_t(N) * Vp, 0.0f);
#pragma omp parallel for
        for (int r = 0; r < N; r++) {
            if (targets[r] == kNoTarget) continue;  // loss 0, dlogits 0
            const float* x = &logits[size_t(r) * Vp];
            double mx = -1e300;
            for (int i = 0; i < V; i++) mx = std::max(mx, double(x[i]));
            double sum = 0;
            for (int i = 0; i < V; i++) sum += std::exp(x[i] - mx);
            ref_loss[r] = float(std::log(sum) + mx - x[targets[r]]);
            for (int i = 0; i < V; i++)
                ref_d[size_t(r) * Vp + i] = float((std::exp(x[i] - mx) / sum - (i == targets[r] ? 1.0 : 0.0)) * dloss);
        }
        auto d_targets = check::to_device(targets);
        DeviceBuffer<float> losses(N);
        // classify(logits, write_dlogits, n): fused_classifier, or (two_pass) the two-pass 128-bit kernel
        auto check_kernel = [&](const std::string& name, auto classify) {
            auto d_logits = check::to_device_floatX(logits);
            CUDA_CHECK(cudaMemset(losses.data(), 0xff, losses.bytes()));
            classify(d_logits.data(), false, N);
            env.sync();
            ck.compare(name + " eval losses", check::from_device(losses), ref_loss, 1e-5f, 1e-5f);
            const auto untouched = check::from_device_floatX(d_logits);
            ck.expect(std::memcmp(untouched.data(), logits.data(), logits.size() * sizeof(float)) == 0,
                      name + " eval leaves logits intact");
            CUDA_CHECK(cudaMemset(losses.data(), 0xff, losses.bytes()));
            classify(d_logits.data(), true, N);
            env.sync();
            ck.compare(name + " train losses", check::from_device(losses), ref_loss, 1e-5f, 1e-5f);
            const auto d = check::from_device_floatX(d_logits);
            // probabilities are ~1/V; the target entries ~-dloss
            ck.compare(name + " dlogits", d, ref_d, 1e-3f * dloss);
            bool pad_zero = true;
            for (int r = 0; r < N; r++)
                for (int i = V; i < Vp; i++) pad_zero &= d[size_t(r) * Vp + i] == 0.0f;
            ck.expect(pad_zero, name + " padded columns zero");
        };
        auto launched = [&](floatX* lg, bool grad, int n) {
            fused_classifier(env, lg, losses.data(), d_targets.data(), dloss, n, V, Vp, grad);
        };
        auto two_pass = [&](floatX* lg, bool grad, int n) {
            constexpr int kVec = x128::size;
            if (grad)
                fused_classifier_kernel<true, kVec><<<n, kClassifierBlock, 0, env.stream>>>(lg, losses.data(),
                                                                                          d_targets.data(), dloss, V, Vp);
            else
                fused_classifier_kernel<false, kVec><<<n, kClassifierBlock, 0, env.stream>>>(lg, losses.data(),
                                                                                           d_targets.data(), dloss, V, Vp);
            CUDA_CHECK_LAUNCH();
        };
        check_kernel("fused_classifier", launched);
        check_kernel("two-pass kernel", two_pass);

        const int NT = 8 * 1024;
        DeviceBuffer<floatX> big(size_t(NT) * Vp);
        DeviceBuffer<int> big_targets(NT);
        DeviceBuffer<float> big_losses(NT);
        CUDA_CHECK(cudaMemset(big.data(), 0, big.bytes()));
        CUDA_CHECK(cudaMemset(big_targets.data(), 0, big_targets.bytes()));
        std::printf("fused_classifier launches the %s kernel here\n",
                    fused_classifier_staged(big.data(), Vp, env.props.major) ? "staged" : "two-pass");
        const float ms = check::time_ms(env.stream, 10, [&] {
            fused_classifier(env, big.data(), big_losses.data(), big_targets.data(), 1.0f / NT, NT, V, Vp, true);
        });
        check::report_bandwidth("fused_classifier (8192x50304)", ms, 2.0 * NT * Vp * sizeof(floatX));
        const float ms2 = check::time_ms(env.stream, 10, [&] {
            fused_classifier_kernel<true, x128::size><<<NT, kClassifierBlock, 0, env.stream>>>(
                big.data(), big_losses.data(), big_targets.data(), 1.0f / NT, V, Vp);
        });
        check::report_bandwidth("two-pass kernel (8192x50304)", ms2, 2.0 * NT * Vp * sizeof(floatX));
        check::report_ratio("fused_classifier / two-pass", ms, ms2);
    });
}
