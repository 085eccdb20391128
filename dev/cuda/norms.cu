// Checker for llmc/cuda/norms.cuh: the affine-free LayerNorm and RMSNorm, forward, fused-residual forward and
// backward (dinp accumulated; RMSNorm's fp32 dweight by the deterministic column reduction, run twice to confirm
// bit-identical results) against the double-precision references of test/support/olmo_kernel_reference.h, at
// OLMo-1B's C = 2048 (8 x128 slices per lane: dweight fused into the dinp pass), OLMo-7B's C = 4096 (16 slices:
// dweight by a separate column reduction) and an odd C (the scalar kernels); then timing. Exit 0 PASS, 1 FAIL,
// 77 SKIP (no GPU).
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/norms.cuh"
#include "test/support/olmo_kernel_reference.h"

using namespace llmc;

static std::vector<float> to_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

static void check_shape(CudaEnv& env, check::Checker& ck, int N, int C, bool rms, bool timing) {
    const std::string label = std::string(rms ? "rmsnorm " : "layernorm_noaffine ") + "(N=" + std::to_string(N) +
                              ",C=" + std::to_string(C) + ")";
    const size_t n = size_t(N) * C;
    const auto a = check::random_floatX_values(n, 1.0f, 11, 0.3f), b = check::random_floatX_values(n, 0.5f, 12);
    const auto w = check::random_floatX_values(C, 0.2f, 13, 1.0f);
    const auto dout = check::random_floatX_values(n, 1.0f, 15), dinp0 = check::random_floatX_values(n, 0.5f, 16);
    const auto dw0 = check::random_floats(C, 0.1f, 17);
    std::vector<float> resid(n);
    for (size_t i = 0; i < n; i++) resid[i] = a[i] + b[i];
    resid = round_to_floatX(resid);
    const olmo_ref::NormForward fa = olmo_ref::norm_forward(a, w, N, C, rms), fr = olmo_ref::norm_forward(resid, w, N, C, rms);
    const olmo_ref::NormBackward gr =
        olmo_ref::norm_backward(dinp0, dout, resid, w, rms ? dw0 : std::vector<float>{}, N, C, rms);

    auto d_a = check::to_device_floatX(a), d_b = check::to_device_floatX(b), d_w = check::to_device_floatX(w);
    auto d_dout = check::to_device_floatX(dout);
    DeviceBuffer<floatX> d_out(n), d_resid(n);
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    auto forward = [&] {
        if (rms) rmsnorm_forward(d_out.data(), d_rstd.data(), d_a.data(), d_w.data(), N, C, env.stream);
        else layernorm_noaffine_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(), N, C, env.stream);
    };
    auto fused = [&] {
        if (rms)
            fused_residual_rmsnorm_forward(d_resid.data(), d_out.data(), d_rstd.data(), d_a.data(), d_b.data(), d_w.data(),
                                           N, C, env.stream);
        else
            fused_residual_layernorm_noaffine_forward(d_resid.data(), d_out.data(), d_mean.data(), d_rstd.data(), d_a.data(),
                                                      d_b.data(), N, C, env.stream);
    };
    forward();
    env.sync();
    // out ~ O(1), rounded once; fp32 statistics
    ck.compare("forward out " + label, check::from_device_floatX(d_out), to_floats(fa.out), 1e-5f);
    if (!rms) ck.compare("forward mean " + label, check::from_device(d_mean), to_floats(fa.mean), 1e-6f, 1e-5f);
    ck.compare("forward rstd " + label, check::from_device(d_rstd), to_floats(fa.rstd), 1e-6f, 1e-5f);
    fused();
    env.sync();
    ck.compare("fused residual " + label, check::from_device_floatX(d_resid), resid, 0.0f, 0.0f);
    ck.compare("fused out " + label, check::from_device_floatX(d_out), to_floats(fr.out), 1e-5f);

    DeviceBuffer<float> scratch(rmsnorm_backward_scratch_floats(N, C));
    auto backward = [&](DeviceBuffer<floatX>& dinp, DeviceBuffer<float>& dw) {
        if (rms)
            rmsnorm_backward(dinp.data(), dw.data(), scratch.data(), d_dout.data(), d_resid.data(), d_w.data(),
                             d_rstd.data(), N, C, env.stream);
        else
            layernorm_noaffine_backward(dinp.data(), d_dout.data(), d_resid.data(), d_mean.data(), d_rstd.data(), N, C,
                                        env.stream);
    };
    std::vector<float> dw_runs[2];
    for (int run = 0; run < 2; run++) {
        auto d_dinp = check::to_device_floatX(dinp0);
        auto d_dw = check::to_device(dw0);
        backward(d_dinp, d_dw);
        env.sync();
        dw_runs[run] = check::from_device(d_dw);
        if (run == 0) {
            // dx ~ rstd * O(1): the bf16 rounding of the accumulated value dominates
            ck.compare("backward dinp " + label, check::from_device_floatX(d_dinp), to_floats(gr.dinp), 2e-3f);
            if (rms) ck.compare("backward dweight " + label, dw_runs[0], to_floats(gr.dweight), 1e-3f, 1e-4f);
        }
    }
    if (rms)
        ck.expect(std::memcmp(dw_runs[0].data(), dw_runs[1].data(), C * sizeof(float)) == 0, "dweight bit-identical " + label);

    if (timing) {
        const double bytes = double(n) * sizeof(floatX);
        const std::string name = rms ? "rmsnorm" : "layernorm_noaffine";
        check::report_bandwidth((name + "_forward").c_str(), check::time_ms(env.stream, 20, forward), 2 * bytes);
        check::report_bandwidth(("fused_residual_" + name).c_str(), check::time_ms(env.stream, 20, fused), 4 * bytes);
        auto d_dinp = check::to_device_floatX(dinp0);
        auto d_dw = check::to_device(dw0);
        // inp, dout and dinp read, dinp written (RMSNorm's partial sums are ~1.5% more at C = 2048)
        check::report_bandwidth((name + "_backward").c_str(),
                                check::time_ms(env.stream, 20, [&] { backward(d_dinp, d_dw); }), 4 * bytes);
    }
}

int main() {
    return check::run_checker("norms", [](CudaEnv& env, check::Checker& ck) {
        for (const bool rms : {false, true}) {
            check_shape(env, ck, 8 * 1024, 2048, rms, true);  // B=8, T=1024, OLMo-1B
            check_shape(env, ck, 2 * 1024, 4096, rms, false);  // OLMo-7B's width
            check_shape(env, ck, 77, 36, rms, false);          // odd shapes: scalar kernels
        }
    });
}
