// Checker for llmc/cuda/swiglu.cuh: swiglu_forward (out = silu(gate) * x, fch = [x | gate]) and swiglu_backward
// (dfch from dout, also in place on fch) against the double-precision reference of
// test/support/olmo_kernel_reference.h, at OLMo-1B's MLP width (H = 4C = 8192; the 128-bit path) and an odd one
// (scalar path); then timing. Exit 0 PASS, 1 FAIL, 77 SKIP (no GPU).
#include "dev/cuda/common.h"
#include "llmc/cuda/swiglu.cuh"
#include "test/support/olmo_kernel_reference.h"

using namespace llmc;

static std::vector<float> to_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

static void check_shape(CudaEnv& env, check::Checker& ck, int N, int H, bool timing) {
    const std::string label = "(N=" + std::to_string(N) + ",H=" + std::to_string(H) + ")";
    const auto fch = check::random_floatX_values(size_t(N) * 2 * H, 2.0f, 1);
    const auto dout = check::random_floatX_values(size_t(N) * H, 1.0f, 2);
    auto d_fch = check::to_device_floatX(fch), d_dout = check::to_device_floatX(dout);
    DeviceBuffer<floatX> d_out(size_t(N) * H), d_dfch(size_t(N) * 2 * H);
    swiglu_forward(d_out.data(), d_fch.data(), N, H, env.stream);
    swiglu_backward(d_dfch.data(), d_dout.data(), d_fch.data(), N, H, env.stream);
    env.sync();
    // fast-math expf and division: ~1e-6 relative in fp32; the atol covers dgate where 1 + g (1 - sigmoid(g))
    // cancels (g near -1.28)
    ck.compare("swiglu_forward " + label, check::from_device_floatX(d_out), to_floats(olmo_ref::swiglu_forward(fch, N, H)),
               2e-5f);
    const auto ref_d = to_floats(olmo_ref::swiglu_backward(dout, fch, N, H));
    ck.compare("swiglu_backward " + label, check::from_device_floatX(d_dfch), ref_d, 2e-5f);
    swiglu_backward(d_fch.data(), d_dout.data(), d_fch.data(), N, H, env.stream);  // in place
    env.sync();
    ck.compare("swiglu_backward in place " + label, check::from_device_floatX(d_fch), ref_d, 2e-5f);
    if (timing) {
        const double elems = double(N) * H * sizeof(floatX);
        const float f = check::time_ms(env.stream, 20, [&] { swiglu_forward(d_out.data(), d_fch.data(), N, H, env.stream); });
        check::report_bandwidth("swiglu_forward", f, 3 * elems);
        const float b = check::time_ms(env.stream, 20, [&] {
            swiglu_backward(d_dfch.data(), d_dout.data(), d_fch.data(), N, H, env.stream);
        });
        check::report_bandwidth("swiglu_backward", b, 5 * elems);
    }
}

int main() {
    return check::run_checker("swiglu", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 4 * 1024, 8192, true);  // B=4, T=1024, OLMo-1B (C=2048)
        check_shape(env, ck, 77, 100, false);        // H not a multiple of 8: scalar path
    });
}
