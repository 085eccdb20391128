// Checker for llmc/cuda/layernorm.cuh: layernorm_forward, fused_residual_layernorm_forward and layernorm_backward
// (dinp accumulation, fp32 dweight/dbias by the deterministic column reduction) against the CPU row references
// of kernel_math.h, on GPT-2 shapes and an odd channel count; the backward runs twice to confirm bit-identical
// weight gradients. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/layernorm.cuh"

using namespace llmc;

static void check_shape(CudaEnv& env, check::Checker& ck, int N, int C, bool timing) {
    const std::string label = "(N=" + std::to_string(N) + ",C=" + std::to_string(C) + ")";
    const auto a = check::random_floatX_values(size_t(N) * C, 1.0f, 11, 0.3f);
    const auto b = check::random_floatX_values(size_t(N) * C, 0.5f, 12);
    const auto w = check::random_floatX_values(C, 0.2f, 13, 1.0f);
    const auto bias = check::random_floatX_values(C, 0.1f, 14);
    const auto dout = check::random_floatX_values(size_t(N) * C, 1.0f, 15);
    const auto dinp0 = check::random_floatX_values(size_t(N) * C, 0.5f, 16);
    const auto dw0 = check::random_floats(C, 0.1f, 17), db0 = check::random_floats(C, 0.1f, 18);

    // CPU: plain forward of a; fused: residual = round(a + b), then layernorm; backward on the residual.
    std::vector<float> out_a(size_t(N) * C), mean_a(N), rstd_a(N);
    std::vector<float> resid(size_t(N) * C), out_r(size_t(N) * C), mean_r(N), rstd_r(N);
    std::vector<float> dinp = dinp0, dw(C, 0.0f), db(C, 0.0f);
    for (size_t i = 0; i < resid.size(); i++) resid[i] = a[i] + b[i];
    resid = round_to_floatX(resid);
#pragma omp parallel for
    for (int r = 0; r < N; r++) {
        const size_t o = size_t(r) * C;
        km::layernorm_row_forward_ref(&a[o], w.data(), bias.data(), &out_a[o], C, &mean_a[r], &rstd_a[r]);
        km::layernorm_row_forward_ref(&resid[o], w.data(), bias.data(), &out_r[o], C, &mean_r[r], &rstd_r[r]);
        km::layernorm_row_backward_ref(&dout[o], &resid[o], w.data(), mean_r[r], rstd_r[r], &dinp[o], nullptr, nullptr, C);
    }
    std::vector<double> dwd(dw0.begin(), dw0.end()), dbd(db0.begin(), db0.end());
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = size_t(r) * C + c;
            dwd[c] += double(dout[i]) * ((resid[i] - mean_r[r]) * rstd_r[r]);
            dbd[c] += dout[i];
        }

    auto d_a = check::to_device_floatX(a), d_b = check::to_device_floatX(b);
    auto d_w = check::to_device_floatX(w), d_bias = check::to_device_floatX(bias);
    auto d_dout = check::to_device_floatX(dout);
    DeviceBuffer<floatX> d_out(size_t(N) * C), d_resid(size_t(N) * C);
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(), d_w.data(), d_bias.data(), N, C, env.stream);
    env.sync();
    ck.compare("forward out " + label, check::from_device_floatX(d_out), out_a, 1e-5f);
    ck.compare("forward mean " + label, check::from_device(d_mean), mean_a, 1e-6f, 1e-5f);
    ck.compare("forward rstd " + label, check::from_device(d_rstd), rstd_a, 1e-6f, 1e-5f);

    fused_residual_layernorm_forward(d_resid.data(), d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(), d_b.data(),
                                     d_w.data(), d_bias.data(), N, C, env.stream);
    env.sync();
    ck.compare("fused residual " + label, check::from_device_floatX(d_resid), resid, 0.0f, 0.0f);
    ck.compare("fused out " + label, check::from_device_floatX(d_out), out_r, 1e-5f);

    DeviceBuffer<float> scratch(layernorm_backward_scratch_floats(N, C));
    std::vector<float> dw_runs[2];
    for (int run = 0; run < 2; run++) {
        auto d_dinp = check::to_device_floatX(dinp0);
        auto d_dw = check::to_device(dw0), d_db = check::to_device(db0);
        layernorm_backward(d_dinp.data(), d_dw.data(), d_db.data(), scratch.data(), d_dout.data(), d_resid.data(),
                           d_w.data(), d_mean.data(), d_rstd.data(), N, C, env.stream);
        env.sync();
        dw_runs[run] = check::from_device(d_dw);
        if (run == 0) {
            // dx ~ rstd * O(1): bf16 rounding of the accumulated value dominates
            ck.compare("backward dinp " + label, check::from_device_floatX(d_dinp), dinp, 2e-3f);
            ck.compare("backward dweight " + label, dw_runs[0], std::vector<float>(dwd.begin(), dwd.end()), 1e-3f, 1e-4f);
            ck.compare("backward dbias " + label, check::from_device(d_db), std::vector<float>(dbd.begin(), dbd.end()), 1e-3f, 1e-4f);
        }
    }
    ck.expect(std::memcmp(dw_runs[0].data(), dw_runs[1].data(), C * sizeof(float)) == 0, "dweight bit-identical " + label);

    if (timing) {
        const double bytes = double(N) * C * sizeof(floatX);
        const float f1 = check::time_ms(env.stream, 20, [&] {
            layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(), d_w.data(), d_bias.data(), N, C, env.stream);
        });
        check::report_bandwidth("layernorm_forward", f1, 2 * bytes);
        const float f2 = check::time_ms(env.stream, 20, [&] {
            fused_residual_layernorm_forward(d_resid.data(), d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(),
                                             d_b.data(), d_w.data(), d_bias.data(), N, C, env.stream);
        });
        check::report_bandwidth("fused_residual_layernorm_forward", f2, 4 * bytes);
        auto d_dinp = check::to_device_floatX(dinp0);
        auto d_dw = check::to_device(dw0), d_db = check::to_device(db0);
        const float f3 = check::time_ms(env.stream, 20, [&] {
            layernorm_backward(d_dinp.data(), d_dw.data(), d_db.data(), scratch.data(), d_dout.data(), d_resid.data(),
                               d_w.data(), d_mean.data(), d_rstd.data(), N, C, env.stream);
        });
        // inp, dout and dinp read, dinp written: the bytes the fused kernel moves (the partial sums are ~1% more)
        check::report_bandwidth("layernorm_backward", f3, 4 * bytes);
    }
}

int main() {
    return check::run_checker("layernorm", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 8 * 1024, 768, true);  // B=8, T=1024, GPT-2 124M
        check_shape(env, ck, 77, 36, false);        // odd shapes
    });
}
