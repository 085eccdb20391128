// Checker for llmc/cuda/global_norm.cuh: the deterministic gradient norm against a double-precision sum, against
// the CPU mirror of its exact reduction order, and against itself (two runs must agree bit for bit), on a
// GPT-2 124M-sized gradient and a small odd size. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/global_norm.cuh"

using namespace llmc;

static void check_size(CudaEnv& env, check::Checker& ck, size_t n, bool timing) {
    const std::string label = "(n=" + std::to_string(n) + ")";
    const auto g = check::random_floats(n, 1e-3f, 51);
    double ref = 0;
#pragma omp parallel for reduction(+ : ref)
    for (size_t i = 0; i < n; i++) ref += double(g[i]) * g[i];
    ref = std::sqrt(ref);
    auto d_g = check::to_device(g);
    DeviceBuffer<float> scratch(kNormScratchFloats);
    const double a = global_norm(scratch.data(), d_g.data(), n, env.stream);
    const double b = global_norm(scratch.data(), d_g.data(), n, env.stream);
    std::printf("  norm %.10g  reference %.10g  rel err %.2e\n", a, ref, std::fabs(a - ref) / ref);
    ck.expect(std::fabs(a - ref) <= 1e-5 * ref, "matches double sum " + label);
    ck.expect(std::memcmp(&a, &b, sizeof(double)) == 0, "bit-identical reruns " + label);
    const double mirror = std::sqrt(global_norm_squared_host_mirror(g.data(), n));
    std::printf("  host mirror of the reduction order: %s (%.17g vs %.17g)\n", mirror == a ? "bit-exact" : "differs",
                mirror, a);
    if (timing) {
        const float ms = check::time_ms(env.stream, 20, [&] { global_norm_squared_async(scratch.data(), d_g.data(), n, env.stream); });
        check::report_bandwidth("global_norm (124M fp32)", ms, double(n) * sizeof(float));
    }
}

int main() {
    return check::run_checker("global_norm", [](CudaEnv& env, check::Checker& ck) {
        check_size(env, ck, 124475904, true);  // GPT-2 124M parameter count (padded vocab)
        check_size(env, ck, 1000003, false);
    });
}
