// Checker for llmc/cuda/rope.cuh: rope_forward and rope_backward (in place on the q and k parts of qkv, NeoX
// "rotate half" layout) against the double-precision reference of test/support/olmo_kernel_reference.h, with the
// table of llmc/base/rope_table.h, at OLMo-1B's shape (C = 2048, 16 heads of 128; the 128-bit path) and an odd one
// (head size 34: the scalar path); then timing. Exit 0 PASS, 1 FAIL, 77 SKIP (no GPU).
#include "dev/cuda/common.h"
#include "llmc/base/rope_table.h"
#include "llmc/cuda/rope.cuh"
#include "test/support/olmo_kernel_reference.h"

using namespace llmc;

static std::vector<float> to_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

static void check_shape(CudaEnv& env, check::Checker& ck, int B, int T, int C, int NH, bool timing) {
    const std::string label = "(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",C=" + std::to_string(C) +
                              ",NH=" + std::to_string(NH) + ")";
    const double theta = 10000.0;
    const size_t n = size_t(B) * T * 3 * C;
    const auto qkv = check::random_floatX_values(n, 1.0f, 1);
    auto table = check::to_device(rope_table(T, C / NH, theta), "rope table");
    auto d_qkv = check::to_device_floatX(qkv);
    rope_forward(d_qkv.data(), table.data(), B, T, C, NH, env.stream);
    env.sync();
    // one rounding of x1 c - x2 s (|x| ~ 1): atol for the fp32 products where the result cancels
    ck.compare("rope_forward " + label, check::from_device_floatX(d_qkv), to_floats(olmo_ref::rope(qkv, B, T, C, NH, theta)),
               1e-5f);
    auto d_grad = check::to_device_floatX(qkv);
    rope_backward(d_grad.data(), table.data(), B, T, C, NH, env.stream);
    env.sync();
    ck.compare("rope_backward " + label, check::from_device_floatX(d_grad),
               to_floats(olmo_ref::rope(qkv, B, T, C, NH, theta, true)), 1e-5f);
    if (timing) {
        // q and k read and written: 4 C floatX per token (plus the table, from L2)
        const double bytes = 4.0 * B * T * C * sizeof(floatX);
        const float f = check::time_ms(env.stream, 20, [&] { rope_forward(d_qkv.data(), table.data(), B, T, C, NH, env.stream); });
        check::report_bandwidth("rope_forward", f, bytes);
        const float b = check::time_ms(env.stream, 20, [&] { rope_backward(d_grad.data(), table.data(), B, T, C, NH, env.stream); });
        check::report_bandwidth("rope_backward", b, bytes);
    }
}

int main() {
    return check::run_checker("rope", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 4, 1024, 2048, 16, true);  // OLMo-1B: head size 128
        check_shape(env, ck, 3, 77, 136, 4, false);     // head size 34: scalar path
    });
}
