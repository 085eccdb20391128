// Helpers shared by the kernel checkers in dev/cuda/*.cu (in the spirit of llm.c's dev/cuda): seeded random
// inputs rounded to floatX (so the CPU reference sees exactly what the kernel reads), device upload/download,
// comparison with max abs / rel error and a floatX-aware tolerance, event timing, and the exit protocol of
// test/run_tests.sh and dev/cuda/gpu_check.sh: 0 = PASS, 1 = FAIL, 77 = SKIP (no GPU). Timing lines start with
// "TIME " so gpu_check.sh can collect them.
#pragma once
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"

namespace check {

using llmc::floatX;

// bf16 keeps 8 significant bits: one rounding is 2^-9 relative; outputs that went through a few roundings and
// fp32 accumulations of bf16 products sit within ~1e-2. fp32 builds are held to ~1e-4 (fast-math exp/tanh and
// different summation orders).
inline constexpr float kRtol = llmc::kFloatXIsFloat ? 1e-4f : 2e-2f;

inline std::vector<float> random_floats(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * d(rng);
    return v;
}

inline std::vector<float> random_floatX_values(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    return llmc::round_to_floatX(random_floats(n, scale, seed, offset));
}

template <typename T>
llmc::DeviceBuffer<T> to_device(const std::vector<T>& host, const char* what = "checker input") {
    llmc::DeviceBuffer<T> d(host.size(), what);
    d.upload(host);
    return d;
}
inline llmc::DeviceBuffer<floatX> to_device_floatX(const std::vector<float>& host) {
    return to_device(llmc::host_to_floatX(host), "checker floatX input");
}
inline std::vector<float> from_device_floatX(const llmc::DeviceBuffer<floatX>& d, size_t n = SIZE_MAX) {
    return llmc::host_from_floatX(d.download(n == SIZE_MAX ? d.size() : n));
}
inline std::vector<float> from_device(const llmc::DeviceBuffer<float>& d, size_t n = SIZE_MAX) {
    return d.download(n == SIZE_MAX ? d.size() : n);
}

struct Checker {
    int failures = 0;
    // |gpu - ref| <= atol + rtol * |ref| elementwise; prints the worst errors.
    bool compare(const std::string& name, const std::vector<float>& gpu, const std::vector<float>& ref, float atol,
                 float rtol = kRtol) {
        if (gpu.size() != ref.size()) {
            std::printf("  %-28s FAIL size %zu vs %zu\n", name.c_str(), gpu.size(), ref.size());
            failures++;
            return false;
        }
        double max_abs = 0.0, max_rel = 0.0;
        size_t bad = 0, first_bad = SIZE_MAX, nonfinite = 0;
        for (size_t i = 0; i < gpu.size(); i++) {
            if (!std::isfinite(gpu[i]) && std::isfinite(ref[i])) nonfinite++;
            const double err = std::fabs(double(gpu[i]) - ref[i]);
            const double rel = err / (std::fabs(double(ref[i])) + 1e-12);
            if (err > max_abs || std::isnan(err)) max_abs = std::isnan(err) ? INFINITY : err;
            if (std::fabs(ref[i]) > atol && rel > max_rel) max_rel = rel;
            if (!(err <= atol + rtol * std::fabs(double(ref[i])))) {
                if (first_bad == SIZE_MAX) first_bad = i;
                bad++;
            }
        }
        const bool ok = bad == 0 && nonfinite == 0;
        std::printf("  %-28s %s  max_abs %.3e  max_rel %.3e  (atol %.1e rtol %.1e, n=%zu)\n", name.c_str(),
                    ok ? "ok  " : "FAIL", max_abs, max_rel, atol, rtol, gpu.size());
        if (!ok) {
            std::printf("    %zu elements out of tolerance; first at %zu: gpu %.6g ref %.6g\n", bad, first_bad,
                        gpu[first_bad == SIZE_MAX ? 0 : first_bad], ref[first_bad == SIZE_MAX ? 0 : first_bad]);
            failures++;
        }
        return ok;
    }
    // |gpu - ref| <= factor * magnitude[i] + floor elementwise, where magnitude[i] is the sum of the absolute
    // values of the terms that make up ref[i] (the usual floating-point error bound of a sum of products):
    // right for results that cancel, where a tolerance relative to |ref| or to the output's rms is not.
    bool compare_bound(const std::string& name, const std::vector<float>& gpu, const std::vector<float>& ref,
                       const std::vector<float>& magnitude, float factor, float floor = 1e-6f) {
        size_t bad = 0, first_bad = SIZE_MAX;
        double worst = 0.0, max_abs = 0.0;
        for (size_t i = 0; i < gpu.size() && i < ref.size(); i++) {
            const double err = std::fabs(double(gpu[i]) - ref[i]);
            const double bound = double(factor) * magnitude[i] + floor;
            if (err > max_abs || std::isnan(err)) max_abs = std::isnan(err) ? INFINITY : err;
            worst = std::max(worst, std::isnan(err) ? INFINITY : err / bound);
            if (!(err <= bound)) {
                if (first_bad == SIZE_MAX) first_bad = i;
                bad++;
            }
        }
        const bool ok = bad == 0 && gpu.size() == ref.size() && magnitude.size() == ref.size();
        std::printf("  %-28s %s  max_abs %.3e  worst err/bound %.3f  (bound %.1e x term magnitude, n=%zu)\n",
                    name.c_str(), ok ? "ok  " : "FAIL", max_abs, worst, factor, gpu.size());
        if (!ok && first_bad != SIZE_MAX)
            std::printf("    %zu elements out of bound; first at %zu: gpu %.6g ref %.6g magnitude %.6g\n", bad, first_bad,
                        gpu[first_bad], ref[first_bad], magnitude[first_bad]);
        if (!ok) failures++;
        return ok;
    }
    void expect(bool cond, const std::string& what) {
        std::printf("  %-28s %s\n", what.c_str(), cond ? "ok" : "FAIL");
        if (!cond) failures++;
    }
};

// Average milliseconds of f() over `repeats` runs after one warm-up.
template <typename F>
float time_ms(cudaStream_t stream, int repeats, F&& f) {
    f();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    llmc::CudaTimer timer(stream);
    timer.start();
    for (int i = 0; i < repeats; i++) f();
    return timer.stop_ms() / repeats;
}

inline void report_bandwidth(const char* name, float ms, double bytes) {
    std::printf("TIME %-32s %8.4f ms  %8.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}
inline void report_flops(const char* name, float ms, double flops) {
    std::printf("TIME %-32s %8.4f ms  %8.1f TFLOP/s\n", name, ms, flops / (ms * 1e-3) / 1e12);
}
// A variant's time against its baseline's: the ratio and the change in percent (below 1 / negative: faster).
inline void report_ratio(const std::string& name, float ms, float baseline_ms, const char* note = nullptr) {
    const double ratio = double(ms) / baseline_ms;
    std::printf("TIME %-32s %.3f  (%+.1f%%%s%s)\n", name.c_str(), ratio, 100.0 * (ratio - 1.0), note ? "; " : "",
                note ? note : "");
}

// Runs body(env, checker) after the no-GPU check; exit code per the protocol above.
template <typename Body>
int run_checker(const char* title, Body&& body) {
    llmc::skip_without_cuda_device();
    try {
        llmc::CudaEnv env;
        std::printf("%s on %s, floatX = %s\n", title, env.describe().c_str(), llmc::kFloatXName);
        Checker checker;
        body(env, checker);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::printf("%s\n", checker.failures == 0 ? "PASS" : "FAIL");
        return checker.failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::printf("error: %s\nFAIL\n", e.what());
        return 1;
    }
}

}  // namespace check
