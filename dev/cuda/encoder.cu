// Checker for llmc/cuda/encoder.cuh: encoder_forward (token + position embedding) and the deterministic
// encoder_backward (bucketed dwte, dwpe) against CPU loops, on GPT-2 shapes with frequently repeated tokens
// (big buckets) and on an odd channel count (scalar path); the backward runs twice to confirm bit-identical
// results. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/encoder.cuh"

using namespace llmc;

static void check_shape(CudaEnv& env, check::Checker& ck, int B, int T, int C, int V, int token_range, bool timing) {
    const std::string label = "(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",C=" + std::to_string(C) + ")";
    std::mt19937 rng(5);
    std::vector<int> tokens(size_t(B) * T);
    for (int& t : tokens) t = static_cast<int>(rng() % token_range);
    const auto wte = check::random_floatX_values(size_t(V) * C, 0.02f, 6);
    const auto wpe = check::random_floatX_values(size_t(T) * C, 0.02f, 7);
    const auto dout = check::random_floatX_values(size_t(B) * T * C, 1.0f, 8);
    const auto dwte0 = check::random_floats(size_t(V) * C, 0.1f, 9);
    const auto dwpe0 = check::random_floats(size_t(T) * C, 0.1f, 10);

    // CPU reference
    std::vector<float> ref_out(size_t(B) * T * C);
    std::vector<double> ref_dwte(dwte0.begin(), dwte0.end()), ref_dwpe(dwpe0.begin(), dwpe0.end());
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t bt = size_t(b) * T + t;
            for (int c = 0; c < C; c++) {
                ref_out[bt * C + c] = wte[size_t(tokens[bt]) * C + c] + wpe[size_t(t) * C + c];
                ref_dwte[size_t(tokens[bt]) * C + c] += dout[bt * C + c];
                ref_dwpe[size_t(t) * C + c] += dout[bt * C + c];
            }
        }

    auto d_tokens = check::to_device(tokens);
    auto d_wte = check::to_device_floatX(wte);
    auto d_wpe = check::to_device_floatX(wpe);
    auto d_dout = check::to_device_floatX(dout);
    DeviceBuffer<floatX> d_out(ref_out.size());
    encoder_forward(d_out.data(), d_tokens.data(), d_wte.data(), d_wpe.data(), B, T, C, env.stream);
    env.sync();
    ck.compare("forward " + label, check::from_device_floatX(d_out), ref_out, 1e-6f);

    EncoderBackwardPlan plan;
    plan.build(tokens.data(), B * T);
    DeviceBuffer<int> d_plan(EncoderBackwardPlan::device_ints(B * T));
    PinnedUpload<int> staging;
    plan.upload(d_plan.data(), staging, env.stream);
    std::vector<float> runs[2];
    std::vector<float> dwpe_gpu;
    for (int run = 0; run < 2; run++) {
        auto d_dwte = check::to_device(dwte0);
        auto d_dwpe = check::to_device(dwpe0);
        encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), plan, d_plan.data(), B, T, C, env.stream);
        env.sync();
        runs[run] = check::from_device(d_dwte);
        if (run == 0) dwpe_gpu = check::from_device(d_dwpe);
    }
    ck.compare("backward dwte " + label, runs[0], std::vector<float>(ref_dwte.begin(), ref_dwte.end()), 1e-4f, 1e-5f);
    ck.compare("backward dwpe " + label, dwpe_gpu, std::vector<float>(ref_dwpe.begin(), ref_dwpe.end()), 1e-4f, 1e-5f);
    ck.expect(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0,
              "backward bit-identical " + label);
    std::printf("  buckets: %d distinct tokens in %d positions\n", plan.num_buckets, B * T);

    if (timing) {
        const float fwd = check::time_ms(env.stream, 20, [&] {
            encoder_forward(d_out.data(), d_tokens.data(), d_wte.data(), d_wpe.data(), B, T, C, env.stream);
        });
        check::report_bandwidth("encoder_forward", fwd, 3.0 * B * T * C * sizeof(floatX));
        auto d_dwte = check::to_device(dwte0);
        auto d_dwpe = check::to_device(dwpe0);
        const float bwd = check::time_ms(env.stream, 20, [&] {
            encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), plan, d_plan.data(), B, T, C, env.stream);
        });
        check::report_bandwidth("encoder_backward (kernels)", bwd, 2.0 * B * T * C * sizeof(floatX) + 4.0 * B * T * C * sizeof(float));
    }
}

int main() {
    return check::run_checker("encoder", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 4, 1024, 768, 50304, 50257, true);  // GPT-2 124M, realistic spread of tokens
        check_shape(env, ck, 4, 256, 768, 50304, 20, false);     // few tokens: very large buckets
        check_shape(env, ck, 3, 17, 36, 100, 50, false);         // C not a multiple of 8: scalar path
    });
}
