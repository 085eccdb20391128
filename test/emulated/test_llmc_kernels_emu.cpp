// The GPT-2 CUDA kernels of llmc/*.cuh run on the CPU through emu/block_emulator.h, each against its own
// straightforward host reference (plain loops, in double, written from the maths and not from the kernel):
// encoder forward / backward (wte by the token-bucket plan, wpe), LayerNorm forward (plain and fused with the
// residual add), the residual add, the LayerNorm backward (the scalar dinp kernel, and the 128-bit one with
// its dweight/dbias partials fused), the deterministic column reduction of cuda_common.cuh (LayerNorm
// dweight/dbias, matmul dbias), GELU forward / backward, the
// attention permutes and the causal softmax forward / backward (scalar and 128-bit), the fused classifier
// (scalar and 128-bit), AdamW and the parameter rounding (nearest and stochastic), the global norm (partial and
// final kernels) and the bias add of matmul.cuh. Every kernel is launched as its host wrapper launches it (grid, block, template arguments,
// scalar or 128-bit path) at small GPT-2-like shapes, odd sizes included, and grid-stride kernels also on a grid
// too small to cover the data. Kernels whose results are promised deterministic (encoder backward, LayerNorm,
// column reduction, norms, softmax, classifier) must also give the same bits when the threads of every block
// run in another order between barriers. So CI checks the kernels' indexing, shared memory and reductions
// without a GPU (dev/cuda/<name>.cu checks them on one, with speed). Built with g++ by the Makefile's emu rule.
//
// Tolerances: a value stored as floatX (bf16) is correctly rounded, so within 2^-8 of the exact value relative
// (kRound); fp32 results and the fp32 arithmetic before a rounding are held to ~1e-5 relative, with an absolute
// floor where a result cancels (stated per check). Copies, the residual add and the rounding of parameters are
// compared bit for bit.

// g++ (not nvcc) warns that layernorm_backward_kernel may read registers it did not load: its second pass skips
// exactly the slices the first one skipped. The warning points into cuda_bf16.hpp, so it is off for
// the whole file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "emu/block_emulator.h"
// block_emulator.h first: the kernels below see its threadIdx, intrinsics and min/max.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "llmc/optim/adamw/adamw.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/fused_classifier.cuh"
#include "llmc/cuda/gelu.cuh"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/matmul.cuh"
#include "test/support/testing.h"

EMU_DEFINE_SHARED(llmc, classifier_smem)  // the staged classifier's row

namespace {

using emu::Dim3;
using emu::Order;
using llmc::floatX;
namespace km = llmc::km;

constexpr double kRound = llmc::kFloatXIsFloat ? 1e-5 : 1.0 / 256 + 1e-5;
constexpr int kVec = llmc::x128::size;

// ---- launching -------------------------------------------------------------------------------------------
// Every block of a grid, with `shared_bytes` of dynamic shared memory poisoned before each block (only the staged
// classifier has any).
void launch(Dim3 grid, Dim3 block, Order order, const std::function<void()>& kernel, size_t shared_bytes = 0) {
    emu::run_grid(block, grid, order, 1234, shared_bytes, kernel);
}
void launch(unsigned grid, unsigned block, Order order, const std::function<void()>& kernel, size_t shared_bytes = 0) {
    launch(Dim3{grid, 1, 1}, Dim3{block, 1, 1}, order, kernel, shared_bytes);
}

// ---- data ------------------------------------------------------------------------------------------------
std::vector<float> random_floats(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * d(rng);
    return v;
}
// Values exactly representable in floatX (what a kernel reads), as floats for the references.
std::vector<float> random_floatX_values(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    return llmc::round_to_floatX(random_floats(n, scale, seed, offset));
}
std::vector<floatX> fx(const std::vector<float>& v) { return llmc::host_to_floatX(v); }
std::vector<float> fl(const std::vector<floatX>& v) { return llmc::host_from_floatX(v); }
std::vector<int> random_ints(size_t n, int range, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> v(n);
    for (int& x : v) x = int(rng() % uint32_t(range));
    return v;
}

// ---- comparisons -----------------------------------------------------------------------------------------
// |got - ref| <= atol + rtol |ref| for every element (NaN fails); prints one line with the largest errors.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref, double atol,
                  double rtol) {
    EXPECT_EQ(got.size(), ref.size());
    double max_abs = 0.0, max_rel = 0.0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < got.size() && i < ref.size(); i++) {
        const double err = std::fabs(double(got[i]) - ref[i]);
        if (!(err <= atol + rtol * std::fabs(ref[i]))) {
            if (bad++ == 0) first_bad = i;
        }
        if (!(err <= max_abs)) max_abs = std::isnan(err) ? INFINITY : err;
        if (std::fabs(ref[i]) > atol && err / std::fabs(ref[i]) > max_rel) max_rel = err / std::fabs(ref[i]);
    }
    std::printf("  %-52s max_abs %.2e max_rel %.2e  (atol %.0e rtol %.1e, n=%zu)%s\n", what.c_str(), max_abs, max_rel,
                atol, rtol, got.size(), bad ? "  FAIL" : "");
    if (bad)
        std::printf("    %zu out of tolerance, first at %zu: got %.8g want %.8g\n", bad, first_bad, double(got[first_bad]),
                    ref[first_bad]);
    EXPECT_EQ(bad, size_t{0});
}
std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

template <class T>
size_t bit_diffs(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return SIZE_MAX;
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n;
}
// Bit-for-bit equality (copies, exact arithmetic, or the same computation in another thread order).
template <class T>
void expect_same_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    const size_t d = bit_diffs(got, want);
    std::printf("  %-52s %zu of %zu values differ (bit for bit)%s\n", what.c_str(), d == SIZE_MAX ? got.size() : d,
                want.size(), d ? "  FAIL" : "");
    EXPECT_EQ(d, size_t{0});
}
// A double reference of an exact sum of floatX values as the kernel stores it: rounded to fp32 (as the fp32 add
// rounds the same exact sum), then to floatX by the host's rounding (kernel_math.h), for bit-exact checks.
std::vector<floatX> rounded(const std::vector<double>& v) {
    std::vector<floatX> out(v.size());
    for (size_t i = 0; i < v.size(); i++) llmc::host_store(&out[i], float(v[i]));
    return out;
}

// =========================================================================================================
// Encoder
// A 128-bit load or store off 16 bytes faults on the GPU; the emulator must stop there too (x86 would not).
TEST(misaligned_128_bit_access_is_caught) {
    alignas(16) static floatX buf[4 * kVec];
    EXPECT_ABORTS(launch(1, 32, Order::Forward, [&] { (void)llmc::load128(buf + (threadIdx.x == 7 ? 1 : 0)); }),
                  "misaligned 16-byte access");
    EXPECT_ABORTS(launch(1, 32, Order::Forward, [&] { llmc::store128(buf + kVec + 2, llmc::x128{}); }),
                  "misaligned 16-byte access");
    launch(1, 32, Order::Forward, [&] { llmc::store128(buf + kVec * (threadIdx.x % 4), llmc::load128(buf)); });
}

// Static __shared__ variables hold garbage at the start of every block on the GPU; the emulator fills them with
// 0xff bytes before each block, so a kernel that reads one before writing it sees NaN / -1, not zero or the
// previous block's value.
TEST(static_shared_memory_starts_poisoned) {
    uint32_t seen[2] = {0, 0};
    for (unsigned block = 0; block < 2; block++)
        launch(1, 32, Order::Forward, [&] {
            __shared__ float scratch[8];
            __syncthreads();
            if (threadIdx.x == 0) std::memcpy(&seen[block], &scratch[3], sizeof(uint32_t));
            __syncthreads();
            scratch[threadIdx.x % 8] = 1.0f;
        });
    EXPECT_EQ(seen[0], 0xffffffffu);
    EXPECT_EQ(seen[1], 0xffffffffu);  // not the 1.0f the first block left
}

TEST(encoder_forward) {
    struct Shape {
        int B, T, C, V;
    };
    for (const Shape s : {Shape{2, 16, 96, 50}, Shape{2, 9, 37, 11}}) {
        const int B = s.B, T = s.T, C = s.C;
        const std::vector<int> tokens = random_ints(size_t(B) * T, s.V, 1);
        const auto wte = random_floatX_values(size_t(s.V) * C, 0.5f, 2), wpe = random_floatX_values(size_t(T) * C, 0.5f, 3);
        std::vector<double> ref(size_t(B) * T * C);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < C; c++)
                    ref[(size_t(b) * T + t) * C + c] =
                        double(wte[size_t(tokens[size_t(b) * T + t]) * C + c]) + wpe[size_t(t) * C + c];
        const std::vector<floatX> wte_x = fx(wte), wpe_x = fx(wpe);
        std::vector<floatX> out(ref.size());
        const size_t total = ref.size();
        // encoder_forward's choice: 128-bit when C % 8 == 0 and the buffers are aligned
        const bool vec = C % kVec == 0 && llmc::aligned16(out.data()) && llmc::aligned16(wte_x.data()) &&
                         llmc::aligned16(wpe_x.data());
        if (vec)
            launch(unsigned(llmc::ceil_div<size_t>(total / kVec, 256)), 256, Order::Forward, [&] {
                llmc::encoder_forward_kernel<true>(out.data(), tokens.data(), wte_x.data(), wpe_x.data(), B, T, C);
            });
        else
            launch(unsigned(llmc::ceil_div<size_t>(total, 256)), 256, Order::Forward, [&] {
                llmc::encoder_forward_kernel<false>(out.data(), tokens.data(), wte_x.data(), wpe_x.data(), B, T, C);
            });
        const std::string label = std::string(vec ? "128-bit" : "scalar") + " (B=" + std::to_string(B) +
                                  ",T=" + std::to_string(T) + ",C=" + std::to_string(C) + ")";
        // one rounding of an exact sum: equal to the correctly rounded reference
        expect_same_bits("encoder_forward " + label + " = round(wte+wpe)", out, rounded(ref));
    }
}

// dwte by buckets of equal tokens (encoder_backward_wte_kernel, 2-D grid), dwpe by a sum over the batch.
void check_encoder_backward(int B, int T, int C, int V, int token_range) {
    const int BT = B * T;
    const std::vector<int> tokens = random_ints(size_t(BT), token_range, uint32_t(C));
    const auto dout = random_floatX_values(size_t(BT) * C, 1.0f, 4);
    const auto dwte0 = random_floats(size_t(V) * C, 0.1f, 5), dwpe0 = random_floats(size_t(T) * C, 0.1f, 6);
    std::vector<double> ref_dwte = to_double(dwte0), ref_dwpe = to_double(dwpe0);
    for (int bt = 0; bt < BT; bt++)
        for (int c = 0; c < C; c++) {
            ref_dwte[size_t(tokens[size_t(bt)]) * C + c] += dout[size_t(bt) * C + c];
            ref_dwpe[size_t(bt % T) * C + c] += dout[size_t(bt) * C + c];
        }
    llmc::EncoderBackwardPlan plan;
    plan.build(tokens.data(), BT);
    const std::vector<floatX> dout_x = fx(dout);
    const bool vec = C % kVec == 0 && llmc::aligned16(dout_x.data());
    const std::string label = std::string(vec ? "128-bit" : "scalar") + " (B=" + std::to_string(B) + ",T=" +
                              std::to_string(T) + ",C=" + std::to_string(C) + ", " + std::to_string(plan.num_buckets) +
                              " buckets)";
    std::vector<float> dwte[2], dwpe[2];
    const Order orders[2] = {Order::Forward, Order::Reverse};
    for (int run = 0; run < 2; run++) {
        dwte[run] = dwte0;
        dwpe[run] = dwpe0;
        float* dw = dwte[run].data();
        // as encoder_backward launches them
        if (vec) {
            const Dim3 grid{unsigned(plan.num_buckets), unsigned(llmc::ceil_div(C / kVec, llmc::kEncoderBwdBlock)), 1};
            launch(grid, Dim3{llmc::kEncoderBwdBlock, 1, 1}, orders[run], [&] {
                llmc::encoder_backward_wte_kernel<kVec>(dw, plan.packed.data(), plan.num_buckets, dout_x.data(), C);
            });
        } else {
            const Dim3 grid{unsigned(plan.num_buckets), unsigned(llmc::ceil_div(C, llmc::kEncoderBwdBlock)), 1};
            launch(grid, Dim3{llmc::kEncoderBwdBlock, 1, 1}, orders[run], [&] {
                llmc::encoder_backward_wte_kernel<1>(dw, plan.packed.data(), plan.num_buckets, dout_x.data(), C);
            });
        }
        float* dp = dwpe[run].data();
        launch(unsigned(llmc::ceil_div(T * C, 256)), 256, orders[run],
               [&] { llmc::encoder_backward_wpe_kernel(dp, dout_x.data(), B, T, C, true); });
    }
    // dwpe written instead (accumulate false, the first micro-step after ModelCuda::zero_grad): over NaN, the bits of
    // adding the sums to zeros
    std::vector<float> wpe_zero(size_t(T) * C, 0.0f), wpe_nan(size_t(T) * C, NAN);
    launch(unsigned(llmc::ceil_div(T * C, 256)), 256, Order::Forward,
           [&] { llmc::encoder_backward_wpe_kernel(wpe_zero.data(), dout_x.data(), B, T, C, true); });
    launch(unsigned(llmc::ceil_div(T * C, 256)), 256, Order::Reverse,
           [&] { llmc::encoder_backward_wpe_kernel(wpe_nan.data(), dout_x.data(), B, T, C, false); });
    EXPECT_EQ(bit_diffs(wpe_nan, wpe_zero), size_t{0});
    // fp32 sums of up to BT terms of size ~1 onto ~0.1
    expect_close("encoder_backward_wte " + label, dwte[0], ref_dwte, 1e-5, 1e-5);
    expect_close("encoder_backward_wpe (B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",C=" + std::to_string(C) + ")",
                 dwpe[0], ref_dwpe, 1e-5, 1e-5);
    expect_same_bits("  wte, wpe gradients: forward vs reverse thread order", dwte[0], dwte[1]);
    EXPECT_EQ(bit_diffs(dwpe[0], dwpe[1]), size_t{0});
}

TEST(encoder_backward) {
    check_encoder_backward(2, 16, 1040, 40, 24);  // 128-bit, C / 8 = 130 > 128: two blocks along y
    check_encoder_backward(2, 9, 203, 13, 7);     // scalar (odd C), two blocks along y, big buckets
}

// =========================================================================================================
// LayerNorm
struct LnRef {
    std::vector<double> out, mean, rstd;
};
// torch.nn.LayerNorm (biased variance, eps 1e-5), in double.
LnRef layernorm_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b, int N, int C) {
    LnRef r{std::vector<double>(size_t(N) * C), std::vector<double>(size_t(N)), std::vector<double>(size_t(N))};
    for (int n = 0; n < N; n++) {
        const float* row = &x[size_t(n) * C];
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) mean += row[c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (row[c] - mean) * (row[c] - mean);
        var /= C;
        const double rstd = 1.0 / std::sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = (row[c] - mean) * rstd * w[size_t(c)] + b[size_t(c)];
        r.mean[size_t(n)] = mean;
        r.rstd[size_t(n)] = rstd;
    }
    return r;
}

// layernorm_forward_kernel<kResidual, vecs> (vecs: 0 scalar, or x128 slices per lane), as the wrappers launch it.
template <bool kResidual>
void run_layernorm_forward(int vecs, floatX* out, float* mean, float* rstd, floatX* residual, const floatX* inp1,
                           const floatX* inp2, const floatX* w, const floatX* b, int N, int C, Order order) {
    const unsigned blocks = unsigned(llmc::ceil_div(N, llmc::kLayerNormBlock / llmc::kWarpSize));
    launch(blocks, llmc::kLayerNormBlock, order, [&] {
        const auto args = std::make_tuple(out, mean, rstd, residual, inp1, inp2, w, b, N, C);
        switch (vecs) {
            case 1: std::apply(llmc::layernorm_forward_kernel<kResidual, 1>, args); break;
            case 2: std::apply(llmc::layernorm_forward_kernel<kResidual, 2>, args); break;
            case 3: std::apply(llmc::layernorm_forward_kernel<kResidual, 3>, args); break;
            case 4: std::apply(llmc::layernorm_forward_kernel<kResidual, 4>, args); break;
            case 8: std::apply(llmc::layernorm_forward_kernel<kResidual, 8>, args); break;
            default: std::apply(llmc::layernorm_forward_kernel<kResidual, 0>, args); break;
        }
    });
}

void check_layernorm_forward(int N, int C, int vecs) {
    const std::string label = "(N=" + std::to_string(N) + ",C=" + std::to_string(C) + ", " +
                              (vecs ? std::to_string(vecs) + " x128 per lane)" : std::string("scalar)"));
    const auto a = random_floatX_values(size_t(N) * C, 1.0f, 11, 0.3f), b = random_floatX_values(size_t(N) * C, 0.5f, 12);
    const auto w = random_floatX_values(size_t(C), 0.2f, 13, 1.0f), bias = random_floatX_values(size_t(C), 0.1f, 14);
    const std::vector<floatX> a_x = fx(a), b_x = fx(b), w_x = fx(w), bias_x = fx(bias);

    // layernorm_forward
    const LnRef ref = layernorm_ref(a, w, bias, N, C);
    std::vector<floatX> out[2];
    std::vector<float> mean[2], rstd[2];
    const Order orders[2] = {Order::Forward, Order::Shuffled};
    for (int run = 0; run < 2; run++) {
        out[run].assign(size_t(N) * C, floatX{});
        mean[run].assign(size_t(N), 0.0f);
        rstd[run].assign(size_t(N), 0.0f);
        run_layernorm_forward<false>(vecs, out[run].data(), mean[run].data(), rstd[run].data(), nullptr, a_x.data(),
                                     nullptr, w_x.data(), bias_x.data(), N, C, orders[run]);
    }
    // out ~ O(1) rounded once; fp32 statistics; the absolute floor covers outputs that cancel to ~0
    expect_close("layernorm_forward out " + label, fl(out[0]), ref.out, 1e-5, kRound);
    expect_close("layernorm_forward mean " + label, mean[0], ref.mean, 1e-6, 1e-5);
    expect_close("layernorm_forward rstd " + label, rstd[0], ref.rstd, 1e-6, 1e-5);
    expect_same_bits("  out: forward vs shuffled thread order", out[0], out[1]);
    EXPECT_EQ(bit_diffs(mean[0], mean[1]) + bit_diffs(rstd[0], rstd[1]), size_t{0});

    // fused_residual_layernorm_forward: residual = round(a + b), then its LayerNorm
    std::vector<double> sum(size_t(N) * C);
    for (size_t i = 0; i < sum.size(); i++) sum[i] = double(a[i]) + b[i];
    const std::vector<floatX> resid_want = rounded(sum);
    const LnRef rref = layernorm_ref(fl(resid_want), w, bias, N, C);
    std::vector<floatX> resid(size_t(N) * C), rout(size_t(N) * C);
    std::vector<float> rmean(static_cast<size_t>(N)), rrstd(static_cast<size_t>(N));
    run_layernorm_forward<true>(vecs, rout.data(), rmean.data(), rrstd.data(), resid.data(), a_x.data(), b_x.data(),
                                w_x.data(), bias_x.data(), N, C, Order::Reverse);
    expect_same_bits("fused residual " + label + " = round(a+b)", resid, resid_want);
    expect_close("fused residual layernorm out " + label, fl(rout), rref.out, 1e-5, kRound);
    expect_close("fused residual layernorm mean " + label, rmean, rref.mean, 1e-6, 1e-5);
    expect_close("fused residual layernorm rstd " + label, rrstd, rref.rstd, 1e-6, 1e-5);
}

// The path the wrappers pick for C (the test buffers are 16-byte aligned when C allows), then the scalar one.
void check_layernorm_forward(int N, int C) {
    const int chosen = llmc::layernorm_lane_vecs(C, true);
    for (const int vecs : chosen ? std::vector<int>{chosen, 0} : std::vector<int>{0})
        check_layernorm_forward(N, C, vecs);
}

TEST(layernorm_forward) {
    check_layernorm_forward(26, 96);   // 26 rows: the last block of 8 warps has 2 rows; 128-bit: lanes 12..31 idle
    check_layernorm_forward(19, 37);   // odd C: scalar only, lanes 5..31 take one element fewer
    check_layernorm_forward(10, 200);  // 6 or 7 elements per lane; 128-bit: 25 lanes
    check_layernorm_forward(9, 768);   // GPT-2 124M: 3 x128 slices per lane
    check_layernorm_forward(5, 2056);  // 9 slices for some lanes: over the register path's 8, scalar only
}

TEST(residual_forward) {
    const size_t n = 2 * 13 * 37;
    const auto a = random_floatX_values(n, 1.0f, 21), b = random_floatX_values(n, 1.0f, 22);
    std::vector<double> sum(n);
    for (size_t i = 0; i < n; i++) sum[i] = double(a[i]) + b[i];
    const std::vector<floatX> a_x = fx(a), b_x = fx(b), want = rounded(sum);
    // the wrapper's grid, then a grid of 2 blocks (the grid-stride loop)
    for (const unsigned grid : {unsigned(llmc::grid_stride_blocks(n, 256)), 2u}) {
        std::vector<floatX> out(n);
        launch(grid, 256, Order::Forward, [&] { llmc::residual_forward_kernel(out.data(), a_x.data(), b_x.data(), n); });
        expect_same_bits("residual_forward (n=" + std::to_string(n) + ", " + std::to_string(grid) + " blocks)", out, want);
    }
}

// dinp += dx of a LayerNorm with the given (fp32) statistics, in double.
std::vector<double> layernorm_dinp_ref(const std::vector<float>& dinp0, const std::vector<float>& dout,
                                       const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& mean, const std::vector<float>& rstd, int N, int C) {
    std::vector<double> out = to_double(dinp0);
    for (int n = 0; n < N; n++) {
        const size_t o = size_t(n) * C;
        double sd = 0.0, sdn = 0.0;
        for (int c = 0; c < C; c++) {
            const double norm = (double(x[o + c]) - mean[size_t(n)]) * rstd[size_t(n)];
            const double dnorm = double(w[size_t(c)]) * dout[o + c];
            sd += dnorm;
            sdn += dnorm * norm;
        }
        for (int c = 0; c < C; c++) {
            const double norm = (double(x[o + c]) - mean[size_t(n)]) * rstd[size_t(n)];
            const double dnorm = double(w[size_t(c)]) * dout[o + c];
            out[o + c] += (dnorm - sd / C - norm * (sdn / C)) * rstd[size_t(n)];
        }
    }
    return out;
}

struct LnBackwardData {
    int N, C;
    std::vector<float> x, w, dout, dinp0, mean, rstd;
    std::vector<floatX> x_x, w_x, dout_x;
    LnBackwardData(int n, int c) : N(n), C(c) {
        x = random_floatX_values(size_t(N) * C, 1.0f, 31, 0.3f);
        w = random_floatX_values(size_t(C), 0.2f, 32, 1.0f);
        dout = random_floatX_values(size_t(N) * C, 1.0f, 33);
        dinp0 = random_floatX_values(size_t(N) * C, 0.5f, 34);
        const LnRef r = layernorm_ref(x, w, std::vector<float>(size_t(C), 0.0f), N, C);
        mean.assign(r.mean.begin(), r.mean.end());
        rstd.assign(r.rstd.begin(), r.rstd.end());
        x_x = fx(x);
        w_x = fx(w);
        dout_x = fx(dout);
    }
};

// dweight0 + sum dout * norm and dbias0 + sum dout over the rows, in double (LayerNorm's parameter gradients).
std::pair<std::vector<double>, std::vector<double>> layernorm_param_grads_ref(const LnBackwardData& d,
                                                                              const std::vector<float>& dw0,
                                                                              const std::vector<float>& db0) {
    std::vector<double> dw = to_double(dw0), db = to_double(db0);
    for (int r = 0; r < d.N; r++)
        for (int c = 0; c < d.C; c++) {
            const size_t i = size_t(r) * d.C + c;
            dw[size_t(c)] += double(d.dout[i]) * ((double(d.x[i]) - d.mean[size_t(r)]) * d.rstd[size_t(r)]);
            db[size_t(c)] += d.dout[i];
        }
    return {dw, db};
}

// column_reduce: stage 1 on a (ceil(cols/(32 vec)), splits) grid of (32, 8) blocks, stage 2 on ceil(cols/32)
// blocks of (32, 8) adds the splits (to the outputs, or written over them: accumulate false). vec:
// column_reduce's choice (column_reduce_vec), or 1 to force the scalar loads.
template <int NV>
void run_column_reduce_finish(llmc::ColumnOutputs<NV> outs, const std::vector<float>& partial, int splits, int cols,
                              Order order, bool accumulate = true) {
    const Dim3 block{unsigned(llmc::kWarpSize), unsigned(llmc::kColumnReduceThreadsY), 1};
    launch(Dim3{unsigned(llmc::ceil_div(cols, llmc::kWarpSize)), 1, 1}, block, order,
           [&] { llmc::column_reduce_stage2_kernel<NV>(outs, partial.data(), splits, cols, accumulate); });
}
template <int NV, class F>
void run_column_reduce(llmc::ColumnOutputs<NV> outs, int rows, int cols, F f, Order order, int vec,
                       bool accumulate = true) {
    const int splits = llmc::ceil_div(rows, llmc::kColumnReduceRowsPerSplit);
    std::vector<float> scratch(llmc::column_reduce_scratch_floats(rows, cols, NV), NAN);
    const Dim3 grid{unsigned(llmc::ceil_div(cols, llmc::kWarpSize * vec)), unsigned(splits), 1};
    const Dim3 block{unsigned(llmc::kWarpSize), unsigned(llmc::kColumnReduceThreadsY), 1};
    launch(grid, block, order, [&] {
        if (vec > 1) llmc::column_reduce_stage1_kernel<NV, kVec>(scratch.data(), rows, cols, f);
        else llmc::column_reduce_stage1_kernel<NV, 1>(scratch.data(), rows, cols, f);
    });
    run_column_reduce_finish<NV>(outs, scratch, splits, cols, order, accumulate);
}

// layernorm_backward as it launches its kernels for this C: vecs > 0 the fused 128-bit kernel (dinp, and the
// dweight / dbias partials of its rows, which column_reduce_finish adds to dw0 / db0), 0 the strided dinp kernel
// and the column reduction. with_sum: also the column sums of the updated dinp (layernorm_backward's dinp_sum),
// added to ds0.
struct LnBackwardResult {
    std::vector<floatX> dinp;
    std::vector<float> dw, db, ds;
};
LnBackwardResult run_layernorm_backward(const LnBackwardData& d, int vecs, Order order, const std::vector<float>& dw0,
                                        const std::vector<float>& db0, const std::vector<float>* ds0 = nullptr) {
    LnBackwardResult r{fx(d.dinp0), dw0, db0, ds0 ? *ds0 : std::vector<float>{}};
    if (vecs == 0) {
        const unsigned blocks = unsigned(llmc::ceil_div(d.N, llmc::kLayerNormBlock / llmc::kWarpSize));
        launch(blocks, llmc::kLayerNormBlock, order, [&] {
            llmc::layernorm_backward_dinp_kernel(r.dinp.data(), d.dout_x.data(), d.x_x.data(), d.w_x.data(),
                                                 d.mean.data(), d.rstd.data(), d.N, d.C);
        });
        const llmc::LayerNormParamGrad f{d.dout_x.data(), d.x_x.data(), d.mean.data(), d.rstd.data(), d.C};
        run_column_reduce<2>(llmc::ColumnOutputs<2>{{r.dw.data(), r.db.data()}}, d.N, d.C, f, order,
                             llmc::column_reduce_vec(d.C, f));
        if (ds0) {
            const llmc::BiasGrad fb{r.dinp.data(), d.C};
            run_column_reduce<1>(llmc::ColumnOutputs<1>{{r.ds.data()}}, d.N, d.C, fb, order, llmc::column_reduce_vec(d.C, fb));
        }
        return r;
    }
    const int splits = llmc::ceil_div(d.N, llmc::kColumnReduceRowsPerSplit), nv = ds0 ? 3 : 2;
    std::vector<float> partial(size_t(splits) * nv * d.C, NAN);
    launch(unsigned(splits), llmc::kLayerNormBlock, order, [&] {
        const auto args = std::make_tuple(r.dinp.data(), partial.data(), d.dout_x.data(), d.x_x.data(), d.w_x.data(),
                                          d.mean.data(), d.rstd.data(), d.N, d.C);
        auto run = [&]<int NV>() {
            switch (vecs) {
                case 1: std::apply(llmc::layernorm_backward_kernel<1, NV>, args); break;
                case 2: std::apply(llmc::layernorm_backward_kernel<2, NV>, args); break;
                case 3: std::apply(llmc::layernorm_backward_kernel<3, NV>, args); break;
                case 4: std::apply(llmc::layernorm_backward_kernel<4, NV>, args); break;
                default: std::apply(llmc::layernorm_backward_kernel<8, NV>, args); break;
            }
        };
        if (ds0) run.template operator()<3>();
        else run.template operator()<2>();
    });
    if (ds0) run_column_reduce_finish<3>(llmc::ColumnOutputs<3>{{r.dw.data(), r.db.data(), r.ds.data()}}, partial, splits, d.C, order);
    else run_column_reduce_finish<2>(llmc::ColumnOutputs<2>{{r.dw.data(), r.db.data()}}, partial, splits, d.C, order);
    return r;
}

TEST(layernorm_backward) {
    // scalar (odd C); 128-bit with 1, 2, 3, 4 and 8 slices per lane (C = 200: lanes 25..31 idle); 19 rows (one
    // split, warps without rows) and 150 (three, the last partial; with 3 slices, C = 520, the rows loaded a row
    // ahead cross no split's end)
    for (const int N : {19, 150})
        for (const int C : {37, 96, 200, 320, 520, 776, 1032}) {
            if (N == 150 && C > 520) continue;  // the splits do not depend on C
            const LnBackwardData d(N, C);
            // layernorm_backward's choice
            const int vecs = llmc::layernorm_lane_vecs(
                C, llmc::aligned16(d.dout_x.data()) && llmc::aligned16(d.x_x.data()) && llmc::aligned16(d.w_x.data()));
            const std::vector<double> ref = layernorm_dinp_ref(d.dinp0, d.dout, d.x, d.w, d.mean, d.rstd, d.N, C);
            const auto dw0 = random_floats(size_t(C), 0.1f, 35), db0 = random_floats(size_t(C), 0.1f, 36);
            const auto [ref_dw, ref_db] = layernorm_param_grads_ref(d, dw0, db0);
            const std::string label = (vecs ? "layernorm_backward_kernel<" + std::to_string(vecs) + ">"
                                            : std::string("layernorm_backward_dinp_kernel")) +
                                      " (N=" + std::to_string(d.N) + ",C=" + std::to_string(C) + ")";
            const LnBackwardResult a = run_layernorm_backward(d, vecs, Order::Forward, dw0, db0);
            // dx ~ rstd * O(1) added to dinp ~ 0.5 and rounded; fp32 row sums before it; fp32 sums of N terms ~1
            expect_close(label + " dinp", fl(a.dinp), ref, 2e-5, kRound);
            expect_close("  dweight", a.dw, ref_dw, 1e-4, 1e-5);
            expect_close("  dbias", a.db, ref_db, 1e-4, 1e-5);
            const LnBackwardResult b = run_layernorm_backward(d, vecs, Order::Shuffled, dw0, db0);
            expect_same_bits("  forward vs shuffled thread order: dinp", b.dinp, a.dinp);
            expect_same_bits("  forward vs shuffled thread order: dweight", b.dw, a.dw);
            // with the column sums of the updated dinp (the projection's bias gradient): the same dinp, dweight
            // and dbias, and sums of the stored dinp values against a double sum of them
            const auto ds0 = random_floats(size_t(C), 0.1f, 37);
            const LnBackwardResult w = run_layernorm_backward(d, vecs, Order::WarpSerial, dw0, db0, &ds0);
            std::vector<double> ref_ds = to_double(ds0);
            const std::vector<float> w_dinp = fl(w.dinp);
            for (int r = 0; r < N; r++)
                for (int c = 0; c < C; c++) ref_ds[size_t(c)] += double(w_dinp[size_t(r) * C + c]);
            expect_same_bits("  with dinp sums: dinp", w.dinp, a.dinp);
            expect_same_bits("  with dinp sums: dweight", w.dw, a.dw);
            expect_same_bits("  with dinp sums: dbias", w.db, a.db);
            expect_close("  dinp sums", w.ds, ref_ds, 1e-4, 1e-5);
            if (vecs) {
                // the strided kernel and the column reductions on the same rows (they take any C): the parameter
                // gradients and the dinp sums are the same additions in the same order
                const LnBackwardResult s = run_layernorm_backward(d, 0, Order::Reverse, dw0, db0, &ds0);
                expect_close("  layernorm_backward_dinp_kernel dinp", fl(s.dinp), ref, 2e-5, kRound);
                expect_same_bits("  fused vs column_reduce: dweight", a.dw, s.dw);
                expect_same_bits("  fused vs column_reduce: dbias", a.db, s.db);
                if (bit_diffs(s.dinp, w.dinp) == 0)  // the two dinp kernels' rows sums may round apart
                    expect_same_bits("  fused vs column_reduce: dinp sums", w.ds, s.ds);
            }
        }
}

TEST(column_reduce_layernorm_and_bias_grads) {
    struct Shape {
        int N, C;
    };
    // 10, 5, 2, 5 and 33 row splits (2,100 rows: stage 2's threads add 4 or 5 splits, the last one partial);
    // 128-bit loads where cols % 8 == 0 (264: a partial second block of columns)
    for (const Shape s : {Shape{600, 96}, Shape{300, 37}, Shape{77, 40}, Shape{300, 264}, Shape{2100, 16}}) {
        const LnBackwardData d(s.N, s.C);
        const int N = s.N, C = s.C;
        std::string label = "(rows=" + std::to_string(N) + ",cols=" + std::to_string(C) + ")";
        const auto dw0 = random_floats(size_t(C), 0.1f, 35), db0 = random_floats(size_t(C), 0.1f, 36);
        const auto [ref_dw, ref_db] = layernorm_param_grads_ref(d, dw0, db0);
        const llmc::LayerNormParamGrad f{d.dout_x.data(), d.x_x.data(), d.mean.data(), d.rstd.data(), C};
        const llmc::BiasGrad fb{d.dout_x.data(), C};
        const int vec = llmc::column_reduce_vec(C, f);
        EXPECT_EQ(llmc::column_reduce_vec(C, fb), vec);
        label += vec > 1 ? " 128-bit" : " scalar";
        std::vector<float> dw[3], db[3];
        const Order orders[3] = {Order::Forward, Order::Reverse, Order::WarpSerial};
        for (int run = 0; run < 3; run++) {
            dw[run] = dw0;
            db[run] = db0;
            run_column_reduce<2>(llmc::ColumnOutputs<2>{{dw[run].data(), db[run].data()}}, N, C, f, orders[run], vec);
        }
        // fp32 sums of N terms ~1 (dweight, dbias of layernorm_backward)
        expect_close("column_reduce<2> LayerNorm dweight " + label, dw[0], ref_dw, 1e-4, 1e-5);
        expect_close("column_reduce<2> LayerNorm dbias " + label, db[0], ref_db, 1e-4, 1e-5);
        expect_same_bits("  forward vs reverse thread order", dw[0], dw[1]);
        expect_same_bits("  forward vs one warp at a time", dw[0], dw[2]);
        EXPECT_EQ(bit_diffs(db[0], db[1]) + bit_diffs(db[0], db[2]), size_t{0});
        if (vec > 1) {  // the scalar loads: the same additions in the same order
            std::vector<float> dws = dw0, dbs = db0;
            run_column_reduce<2>(llmc::ColumnOutputs<2>{{dws.data(), dbs.data()}}, N, C, f, Order::Shuffled, 1);
            expect_same_bits("  128-bit vs scalar loads", dws, dw[0]);
            EXPECT_EQ(bit_diffs(dbs, db[0]), size_t{0});
        }

        // matmul_backward's bias gradient (NV = 1), and a skipped output (nullptr) stays untouched
        std::vector<float> dbias = db0;
        run_column_reduce<1>(llmc::ColumnOutputs<1>{{dbias.data()}}, N, C, fb, Order::Shuffled, vec);
        expect_close("column_reduce<1> matmul dbias " + label, dbias, ref_db, 1e-4, 1e-5);
        EXPECT_EQ(bit_diffs(dbias, db[0]), size_t{0});  // the same sums in the same order
        std::vector<float> only_db = db0;
        run_column_reduce<2>(llmc::ColumnOutputs<2>{{nullptr, only_db.data()}}, N, C, f, Order::Forward, vec);
        EXPECT_EQ(bit_diffs(only_db, db[0]), size_t{0});

        // accumulate false (the first micro-step after ModelCuda::zero_grad): the sums written over whatever the
        // outputs held (NaN here), the bits of adding them to zeros
        std::vector<float> zero_dw(size_t(C), 0.0f), zero_db(size_t(C), 0.0f), nan_dw(size_t(C), NAN),
            nan_db(size_t(C), NAN);
        run_column_reduce<2>(llmc::ColumnOutputs<2>{{zero_dw.data(), zero_db.data()}}, N, C, f, Order::Forward, vec);
        run_column_reduce<2>(llmc::ColumnOutputs<2>{{nan_dw.data(), nan_db.data()}}, N, C, f, Order::Reverse, vec, false);
        expect_same_bits("  written (accumulate false) over NaN vs added to zeros: dweight", nan_dw, zero_dw);
        EXPECT_EQ(bit_diffs(nan_db, zero_db), size_t{0});
    }
}

// =========================================================================================================
// GELU (tanh approximation), in double
double gelu_ref(double x) {
    const double s = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
    const double s = std::sqrt(2.0 / M_PI), u = s * (x + 0.044715 * x * x * x), th = std::tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

TEST(gelu_forward_and_backward) {
    for (const size_t n : {size_t(2 * 16 * 4 * 96), size_t(1001)}) {
        const auto x = random_floatX_values(n, 2.0f, 41), d = random_floatX_values(n, 1.0f, 42);
        std::vector<double> ref_y(n), ref_dx(n);
        for (size_t i = 0; i < n; i++) {
            ref_y[i] = gelu_ref(x[i]);
            ref_dx[i] = d[i] * gelu_grad_ref(x[i]);
        }
        const std::vector<floatX> x_x = fx(x);
        const bool vec = n % kVec == 0 && llmc::aligned16(x_x.data());  // gelu_forward / gelu_backward_inplace
        const unsigned wrapper_grid = unsigned(llmc::grid_stride_blocks(vec ? n / kVec : n, 256));
        for (const unsigned grid : {wrapper_grid, 1u}) {
            const std::string label = std::string(vec ? "128-bit" : "scalar") + " (n=" + std::to_string(n) + ", " +
                                      std::to_string(grid) + " blocks)";
            std::vector<floatX> y(n), dd = fx(d);
            launch(grid, 256, Order::Forward, [&] {
                if (vec) llmc::gelu_forward_kernel<true>(y.data(), x_x.data(), n);
                else llmc::gelu_forward_kernel<false>(y.data(), x_x.data(), n);
            });
            launch(grid, 256, Order::Forward, [&] {
                if (vec) llmc::gelu_backward_inplace_kernel<true>(dd.data(), x_x.data(), n);
                else llmc::gelu_backward_inplace_kernel<false>(dd.data(), x_x.data(), n);
            });
            // fp32 tanhf: ~1e-7 absolute where gelu(x) ~ 0 for x << 0 (cancellation in 1 + tanh); the derivative's
            // terms (~2, times |d| up to ~4) cancel there too
            expect_close("gelu_forward " + label, fl(y), ref_y, 1e-6, kRound);
            expect_close("gelu_backward_inplace " + label, fl(dd), ref_dx, 3e-6, kRound);
        }
    }
}

// =========================================================================================================
// Attention: the permutes (copies) and the causal softmax
TEST(attention_permutes) {
    struct Shape {
        int B, T, C, NH;
    };
    for (const Shape s : {Shape{2, 16, 64, 4}, Shape{2, 9, 48, 4}, Shape{1, 5, 24, 3}}) {  // HS 16, 12, 8
        const int B = s.B, T = s.T, C = s.C, NH = s.NH, HS = C / NH;
        const size_t btc = size_t(B) * T * C;
        const std::vector<floatX> qkv = fx(random_floatX_values(3 * btc, 1.0f, 51));
        // reference layouts: qkv (B,T,3,NH,HS), q/k/v (B,NH,T,HS), y (B,T,NH,HS)
        auto qkv_at = [&](int b, int t, int which, int h, int e) { return ((size_t(b) * T + t) * 3 + which) * C + size_t(h) * HS + e; };
        auto head_at = [&](int b, int h, int t, int e) { return ((size_t(b) * NH + h) * T + t) * HS + e; };
        auto y_at = [&](int b, int t, int h, int e) { return (size_t(b) * T + t) * C + size_t(h) * HS + e; };
        std::vector<floatX> want_q(btc), want_k(btc), want_v(btc), want_y(btc);
        const std::vector<floatX> heads = fx(random_floatX_values(btc, 1.0f, 52));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < NH; h++)
                    for (int e = 0; e < HS; e++) {
                        want_q[head_at(b, h, t, e)] = qkv[qkv_at(b, t, 0, h, e)];
                        want_k[head_at(b, h, t, e)] = qkv[qkv_at(b, t, 1, h, e)];
                        want_v[head_at(b, h, t, e)] = qkv[qkv_at(b, t, 2, h, e)];
                        want_y[y_at(b, t, h, e)] = heads[head_at(b, h, t, e)];
                    }
        std::vector<floatX> q(btc), k(btc), v(btc), y(btc), back_qkv(3 * btc), back_heads(btc);
        // launch_permute: 128-bit copies when HS % 8 == 0 and every buffer is aligned
        const bool vec = HS % kVec == 0 && llmc::aligned16(q.data()) && llmc::aligned16(qkv.data());
        const unsigned blocks = unsigned(llmc::ceil_div<size_t>(btc / (vec ? kVec : 1), llmc::kAttentionBlock));
        auto run = [&](auto kernel_vec, auto kernel_scalar) {
            launch(blocks, llmc::kAttentionBlock, Order::Forward, [&] { vec ? kernel_vec() : kernel_scalar(); });
        };
        run([&] { llmc::permute_qkv_kernel<kVec>(q.data(), k.data(), v.data(), qkv.data(), B, T, NH, HS); },
            [&] { llmc::permute_qkv_kernel<1>(q.data(), k.data(), v.data(), qkv.data(), B, T, NH, HS); });
        run([&] { llmc::permute_qkv_backward_kernel<kVec>(back_qkv.data(), q.data(), k.data(), v.data(), B, T, NH, HS); },
            [&] { llmc::permute_qkv_backward_kernel<1>(back_qkv.data(), q.data(), k.data(), v.data(), B, T, NH, HS); });
        run([&] { llmc::unpermute_kernel<kVec>(y.data(), heads.data(), B, T, NH, HS); },
            [&] { llmc::unpermute_kernel<1>(y.data(), heads.data(), B, T, NH, HS); });
        run([&] { llmc::unpermute_backward_kernel<kVec>(back_heads.data(), y.data(), B, T, NH, HS); },
            [&] { llmc::unpermute_backward_kernel<1>(back_heads.data(), y.data(), B, T, NH, HS); });
        const std::string label = std::string(vec ? "128-bit" : "scalar") + " (B=" + std::to_string(B) + ",T=" +
                                  std::to_string(T) + ",C=" + std::to_string(C) + ",NH=" + std::to_string(NH) + ")";
        std::vector<floatX> got_qkv = q;
        got_qkv.insert(got_qkv.end(), k.begin(), k.end());
        got_qkv.insert(got_qkv.end(), v.begin(), v.end());
        std::vector<floatX> want_qkv = want_q;
        want_qkv.insert(want_qkv.end(), want_k.begin(), want_k.end());
        want_qkv.insert(want_qkv.end(), want_v.begin(), want_v.end());
        expect_same_bits("permute_qkv " + label, got_qkv, want_qkv);
        expect_same_bits("permute_qkv_backward " + label + " (the inverse)", back_qkv, qkv);
        expect_same_bits("unpermute " + label, y, want_y);
        expect_same_bits("unpermute_backward " + label + " (the inverse)", back_heads, heads);
    }
}

// att[j] = softmax over j <= t of scale * preatt[j], 0 above the diagonal; rows (b, h, t) of length T.
std::vector<double> causal_softmax_ref(const std::vector<float>& pre, double scale, int rows, int T) {
    std::vector<double> att(size_t(rows) * T, 0.0);
    for (int r = 0; r < rows; r++) {
        const int t = r % T;
        const float* x = &pre[size_t(r) * T];
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; j++) mx = std::max(mx, scale * x[j]);
        for (int j = 0; j <= t; j++) sum += std::exp(scale * x[j] - mx);
        for (int j = 0; j <= t; j++) att[size_t(r) * T + j] = std::exp(scale * x[j] - mx) / sum;
    }
    return att;
}
// d preatt = scale * att * (datt - sum_{j<=t} att_j datt_j), 0 above the diagonal.
std::vector<double> causal_softmax_backward_ref(const std::vector<float>& att, const std::vector<float>& datt,
                                                double scale, int rows, int T) {
    std::vector<double> d(size_t(rows) * T, 0.0);
    for (int r = 0; r < rows; r++) {
        const int t = r % T;
        const size_t o = size_t(r) * T;
        double dot = 0.0;
        for (int j = 0; j <= t; j++) dot += double(att[o + j]) * datt[o + j];
        for (int j = 0; j <= t; j++) d[o + j] = scale * att[o + j] * (datt[o + j] - dot);
    }
    return d;
}

// Entries above the diagonal (key > query) of (rows x T) rows that are not exact zeros.
size_t masked_nonzero(const std::vector<floatX>& a, int rows, int T) {
    size_t n = 0;
    for (int r = 0; r < rows; r++)
        for (int j = r % T + 1; j < T; j++) n += !(llmc::host_from_floatX(a[size_t(r) * T + j]) == 0.0f);
    return n;
}

void check_causal_softmax(int B, int NH, int T, int HS) {
    const int rows = B * NH * T;
    const float scale = 1.0f / std::sqrt(float(HS));
    const auto pre = random_floatX_values(size_t(rows) * T, 2.0f, uint32_t(52 + T));
    const auto datt = random_floatX_values(size_t(rows) * T, 1.0f, uint32_t(53 + T));
    const std::vector<floatX> pre_x = fx(pre), datt_x = fx(datt);
    const std::vector<double> ref_att = causal_softmax_ref(pre, scale, rows, T);
    const unsigned blocks = unsigned(llmc::ceil_div(rows, llmc::kAttentionBlock / llmc::kWarpSize));
    const std::string shape = "(B=" + std::to_string(B) + ",NH=" + std::to_string(NH) + ",T=" + std::to_string(T) + ")";
    // attention_forward / attention_backward: 128-bit rows when T % 8 == 0 and aligned; the scalar kernels take
    // any T, so they run on the 128-bit shapes too
    const bool vec = T % kVec == 0 && llmc::aligned16(pre_x.data()) && llmc::aligned16(datt_x.data());
    for (const bool use_vec : vec ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
        const std::string fwd_name = use_vec ? "causal_softmax_forward_vec " : "causal_softmax_forward ";
        const std::string bwd_name = use_vec ? "causal_softmax_backward_inplace_vec " : "causal_softmax_backward_inplace ";
        std::vector<floatX> att[2];
        const Order orders[2] = {Order::Forward, Order::Shuffled};
        for (int run = 0; run < 2; run++) {
            att[run].assign(size_t(rows) * T, llmc::host_to_floatX(NAN));  // every element must be written
            launch(blocks, llmc::kAttentionBlock, orders[run], [&] {
                if (use_vec) llmc::causal_softmax_forward_vec_kernel(att[run].data(), pre_x.data(), scale, rows, T);
                else llmc::causal_softmax_forward_kernel(att[run].data(), pre_x.data(), scale, rows, T);
            });
        }
        // probabilities rounded once; the masked entries exact zeros
        expect_close(fwd_name + shape, fl(att[0]), ref_att, 1e-7, kRound);
        expect_same_bits("  forward vs shuffled thread order", att[1], att[0]);
        EXPECT_EQ(masked_nonzero(att[0], rows, T), size_t{0});

        const std::vector<float> att_in = fl(att[0]);  // the backward reads the kept (rounded) probabilities
        const std::vector<double> ref_d = causal_softmax_backward_ref(att_in, datt, scale, rows, T);
        std::vector<floatX> d[2];
        for (int run = 0; run < 2; run++) {
            d[run] = datt_x;
            launch(blocks, llmc::kAttentionBlock, orders[run], [&] {
                if (use_vec) llmc::causal_softmax_backward_inplace_vec_kernel(d[run].data(), att[0].data(), scale, rows, T);
                else llmc::causal_softmax_backward_inplace_kernel(d[run].data(), att[0].data(), scale, rows, T);
            });
        }
        // fp32 dot over the row before the subtraction: ~1e-7 absolute where datt - dot cancels
        expect_close(bwd_name + shape, fl(d[0]), ref_d, 1e-6, kRound);
        expect_same_bits("  forward vs shuffled thread order", d[1], d[0]);
        EXPECT_EQ(masked_nonzero(d[0], rows, T), size_t{0});
    }
}

TEST(causal_softmax) {
    check_causal_softmax(2, 4, 16, 16);  // 128-bit rows (and the scalar kernels on them)
    check_causal_softmax(2, 2, 40, 24);  // 128-bit, 5 lanes busy
    check_causal_softmax(1, 1, 264, 64);  // 128-bit, rows longer than one 256-element stretch
    check_causal_softmax(2, 3, 37, 12);  // scalar: T not a multiple of 8, lanes wrap at 32
    check_causal_softmax(1, 2, 9, 16);   // scalar
}

// =========================================================================================================
// Fused classifier: losses and in-place dlogits over the first V of Vp columns; a row without a target (kNoTarget)
// has loss 0 and a zero gradient row; `masked`: every row is one.
void check_fused_classifier(int N, int V, int Vp, bool masked = false) {
    const auto logits = random_floatX_values(size_t(N) * Vp, 2.0f, uint32_t(61 + V));
    std::vector<int> targets = random_ints(size_t(N), V, uint32_t(62 + V));
    targets[0] = 0;
    targets[1] = V - 1;
    targets[2] = llmc::kNoTarget;
    if (N > 3) targets[3] = V;  // out of range: NaN loss, no one-hot term
    if (masked) targets.assign(size_t(N), llmc::kNoTarget);
    const float dloss = 1.0f / float(N);
    std::vector<double> ref_loss(static_cast<size_t>(N)), ref_d(size_t(N) * Vp, 0.0);
    for (int r = 0; r < N; r++) {
        const float* x = &logits[size_t(r) * Vp];
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < V; i++) mx = std::max(mx, double(x[i]));
        for (int i = 0; i < V; i++) sum += std::exp(x[i] - mx);
        const int t = targets[size_t(r)];
        if (t == llmc::kNoTarget) continue;  // loss 0, dlogits 0
        ref_loss[size_t(r)] = t < V ? std::log(sum) + mx - x[t] : NAN;
        for (int i = 0; i < V; i++) ref_d[size_t(r) * Vp + i] = (std::exp(x[i] - mx) / sum - (i == t ? 1.0 : 0.0)) * dloss;
    }
    const std::string shape = "(N=" + std::to_string(N) + ",V=" + std::to_string(V) + ",Vp=" + std::to_string(Vp) +
                              (masked ? ", no targets)" : ")");
    auto check_losses = [&](const std::string& what, const std::vector<float>& got) {
        std::vector<float> valid;
        std::vector<double> want;
        bool nan_ok = true;
        for (int r = 0; r < N; r++) {
            if (std::isnan(ref_loss[size_t(r)])) nan_ok = nan_ok && std::isnan(got[size_t(r)]);
            else {
                valid.push_back(got[size_t(r)]);
                want.push_back(ref_loss[size_t(r)]);
            }
        }
        expect_close(what + shape, valid, want, 1e-5, 1e-5);  // fp32 log-sum-exp over V terms
        EXPECT(nan_ok);
    };
    // The scalar kernel always; the 128-bit one and the staged one (its row in dynamic shared memory) where
    // fused_classifier would launch them (width 0 below: the staged kernel).
    std::vector<floatX> x = fx(logits);
    std::vector<int> widths = {1};
    if (llmc::fused_classifier_vec(x.data(), Vp) > 1) widths.push_back(kVec);
    if (llmc::fused_classifier_staged(x.data(), Vp, 9)) widths.push_back(0);
    for (int vec : widths) {
        const std::string name = vec == 0  ? "fused_classifier (staged)"
                                 : vec > 1 ? "fused_classifier (128-bit)"
                                           : "fused_classifier (scalar)";
        auto kernel = [&](bool grad, floatX* lg, float* ls) {
            if (vec == 0 && grad) llmc::fused_classifier_staged_kernel<true>(lg, ls, targets.data(), dloss, V, Vp);
            else if (vec == 0) llmc::fused_classifier_staged_kernel<false>(lg, ls, targets.data(), dloss, V, Vp);
            else if (grad && vec > 1) llmc::fused_classifier_kernel<true, kVec>(lg, ls, targets.data(), dloss, V, Vp);
            else if (grad) llmc::fused_classifier_kernel<true, 1>(lg, ls, targets.data(), dloss, V, Vp);
            else if (vec > 1) llmc::fused_classifier_kernel<false, kVec>(lg, ls, targets.data(), dloss, V, Vp);
            else llmc::fused_classifier_kernel<false, 1>(lg, ls, targets.data(), dloss, V, Vp);
        };
        const size_t smem = vec == 0 ? size_t(Vp) * sizeof(floatX) : 0;
        // evaluation (no gradient): losses, logits untouched
        std::vector<float> losses(size_t(N), 0.0f);
        x = fx(logits);
        launch(unsigned(N), llmc::kClassifierBlock, Order::Forward, [&] { kernel(false, x.data(), losses.data()); },
               smem);
        check_losses(name + " eval losses ", losses);
        EXPECT_EQ(bit_diffs(x, fx(logits)), size_t{0});
        // training: losses and dlogits, in three thread orders
        std::vector<floatX> d[3];
        std::vector<float> l[3];
        const Order orders[3] = {Order::Forward, Order::Reverse, Order::WarpSerial};
        for (int run = 0; run < 3; run++) {
            d[run] = fx(logits);
            l[run].assign(size_t(N), 0.0f);
            launch(unsigned(N), llmc::kClassifierBlock, orders[run], [&] { kernel(true, d[run].data(), l[run].data()); },
                   smem);
        }
        check_losses(name + " losses ", l[0]);
        // probabilities ~1/V times dloss, rounded once; padded columns and rows without a target exact zeros
        expect_close(name + " dlogits " + shape, fl(d[0]), ref_d, 1e-6 * dloss, kRound);
        size_t masked_nonzero = 0;
        for (int r = 0; r < N; r++)
            for (int i = 0; i < Vp && targets[size_t(r)] == llmc::kNoTarget; i++)
                masked_nonzero += !(llmc::host_from_floatX(d[0][size_t(r) * Vp + i]) == 0.0f);
        EXPECT_EQ(masked_nonzero, size_t{0});
        expect_same_bits("  forward vs reverse thread order", d[1], d[0]);
        expect_same_bits("  forward vs one warp at a time", d[2], d[0]);
        size_t pad_nonzero = 0;
        for (int r = 0; r < N; r++)
            for (int i = V; i < Vp; i++) pad_nonzero += !(llmc::host_from_floatX(d[0][size_t(r) * Vp + i]) == 0.0f);
        EXPECT_EQ(pad_nonzero, size_t{0});
        EXPECT_EQ(bit_diffs(l[1], l[0]), size_t{0});
        EXPECT_EQ(bit_diffs(l[2], l[0]), size_t{0});
    }
}

TEST(fused_classifier) {
    check_fused_classifier(6, 50, 64);       // odd V, padded columns
    check_fused_classifier(3, 1500, 1536);   // V > 1024: the block strides over the row
    check_fused_classifier(3, 9000, 9008);   // 128-bit: more than one 8192-column stride, a partial last chunk
    check_fused_classifier(4, 37, 44);       // Vp not a multiple of 8: scalar only
    check_fused_classifier(3, 9000, 9008, true);  // no row has a target: every path's early exit
}

// =========================================================================================================
// params[i] must be master[i] rounded to floatX: to nearest (bit-exact with the host's rounding), or
// stochastically: one of the two bf16 neighbours of master[i], and exactly the one that element's noise (index
// offset + i, seed) picks, so the noise index does not depend on the launch.
void check_rounding(const std::string& what, const std::vector<floatX>& params, const std::vector<float>& master,
                    bool stochastic, uint64_t offset, uint32_t seed) {
    size_t differ = 0, outside = 0, ups = 0;
    for (size_t i = 0; i < master.size(); i++) {
        const uint32_t got = llmc::storage_bits(params[i]);
        uint32_t want = llmc::storage_bits(llmc::host_to_floatX(master[i]));
        if (stochastic && !llmc::kFloatXIsFloat) {
            const uint32_t below = km::float_to_bits(master[i]) >> 16;  // truncation toward zero; +1: away from zero
            outside += got != below && got != below + 1;
            ups += got == below + 1;
            want = km::bf16_bits_stochastic(master[i], km::element_noise(offset + i, seed));
        }
        differ += got != want;
    }
    std::printf("  %-52s %zu of %zu differ%s%s\n", what.c_str(), differ, master.size(),
                stochastic ? (", " + std::to_string(outside) + " outside the two neighbours, " + std::to_string(ups) +
                              " rounded up").c_str()
                           : "",
                differ || outside ? "  FAIL" : "");
    EXPECT_EQ(differ, size_t{0});
    EXPECT_EQ(outside, size_t{0});
}

// =========================================================================================================
// AdamW (torch.optim.AdamW's update in double) and the floatX rounding of the master weights
TEST(adamw_and_round_params) {
    const size_t n = 3001;
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.7f;
    const long long t = 3;
    const auto master0 = random_floats(n, 0.5f, 71), grads = random_floats(n, 1.0f, 72);
    const auto m0 = random_floats(n, 0.1f, 73);
    std::vector<float> v0 = random_floats(n, 0.1f, 74);
    for (float& x : v0) x = x * x;
    for (const bool decays : {true, false}) {
        std::vector<double> ref_p(n), ref_m(n), ref_v(n);
        const double bc1 = 1.0 - std::pow(double(beta1), double(t)), bc2 = 1.0 - std::pow(double(beta2), double(t));
        for (size_t i = 0; i < n; i++) {
            const double g = double(grads[i]) * grad_scale;
            double p = master0[i] * (decays ? 1.0 - double(lr) * wd : 1.0);
            ref_m[i] = beta1 * double(m0[i]) + (1.0 - beta1) * g;
            ref_v[i] = beta2 * double(v0[i]) + (1.0 - beta2) * g * g;
            p -= lr * (ref_m[i] / bc1) / (std::sqrt(ref_v[i] / bc2) + eps);
            ref_p[i] = p;
        }
        const km::AdamWParams h = km::adamw_params(lr, beta1, beta2, eps, wd, decays, t, grad_scale);
        const uint64_t offset = 12345;  // the range's offset in the flat buffer: part of the rounding noise index
        const uint32_t seed = llmc::adamw_step_seed(42, t);
        std::vector<float> master_first;
        for (const bool stochastic : {false, true}) {
            for (const unsigned grid : {unsigned(llmc::grid_stride_blocks(n, 512)), 2u}) {  // adamw_update's, and small
                std::vector<float> master = master0, m = m0, v = v0;
                std::vector<floatX> params(n);
                launch(grid, 512, Order::Forward, [&] {
                    llmc::adamw_kernel(params.data(), master.data(), grads.data(), m.data(), v.data(), n, h, nullptr,
                                       offset, seed, stochastic);
                });
                const std::string label = std::string(decays ? "decay" : "no decay") + (stochastic ? ", stochastic" : "") +
                                          " (n=" + std::to_string(n) + ", " + std::to_string(grid) + " blocks)";
                if (!stochastic && grid != 2) {
                    // fp32 update of ~0.5-sized weights by ~lr
                    expect_close("adamw_kernel master " + label, master, ref_p, 1e-7, 1e-6);
                    // m, v: fp32 sums of terms up to ~0.3 that may cancel
                    expect_close("adamw_kernel m " + label, m, ref_m, 5e-8, 1e-6);
                    expect_close("adamw_kernel v " + label, v, ref_v, 5e-8, 1e-6);
                    master_first = master;
                } else {
                    EXPECT_EQ(bit_diffs(master, master_first), size_t{0});  // any grid, either rounding
                }
                check_rounding("adamw_kernel params " + label, params, master, stochastic, offset, seed);
            }
        }
        // The clip coefficient read from the device (CudaAdamW: global_norm_for_clip_async's) in place of
        // AdamWParams::grad_scale: the same update, bit for bit.
        std::vector<float> master = master0, m = m0, v = v0;
        std::vector<floatX> params(n);
        const km::AdamWParams unscaled = km::adamw_params(lr, beta1, beta2, eps, wd, decays, t, 1.0f);
        const float device_clip = grad_scale;
        launch(unsigned(llmc::grid_stride_blocks(n, 512)), 512, Order::Forward, [&] {
            llmc::adamw_kernel(params.data(), master.data(), grads.data(), m.data(), v.data(), n, unscaled, &device_clip,
                               offset, seed, false);
        });
        const size_t differ = bit_diffs(master, master_first);
        std::printf("  %-52s %zu of %zu values differ from grad_scale's%s\n",
                    (std::string("adamw_kernel, clip from the device, ") + (decays ? "decay" : "no decay")).c_str(),
                    differ, n, differ ? "  FAIL" : "");
        EXPECT_EQ(differ, size_t{0});
    }
    // round_params_kernel (CudaAdamW::set_weights): noise index = position, no offset
    const auto master = random_floats(n, 0.5f, 75);
    for (const bool stochastic : {false, true}) {
        std::vector<floatX> params(n);
        launch(unsigned(llmc::grid_stride_blocks(n, 512)), 512, Order::Forward,
               [&] { llmc::round_params_kernel(params.data(), master.data(), n, 99u, stochastic); });
        check_rounding(std::string("round_params_kernel") + (stochastic ? " stochastic" : "") + " (n=" +
                           std::to_string(n) + ")",
                       params, master, stochastic, 0, 99u);
    }
}

// =========================================================================================================
// Global norm: norm_squared_partial_kernel on the fixed (kNormBlocks x kNormThreads) grid, then the final
// kernel over the partials in double, as global_norm_squared_async launches them.
TEST(global_norm) {
    // 600001 > 1024 x 512: some threads take two elements; 1000: most threads idle
    for (const size_t n : {size_t(600001), size_t(1000)}) {
        const auto g = random_floats(n, 1e-3f, 81);
        double ref = 0.0;
        for (const float x : g) ref += double(x) * x;
        std::vector<float> scratch[2];
        double sumsq[2];
        const Order orders[2] = {Order::Forward, Order::Reverse};
        for (int run = 0; run < 2; run++) {
            scratch[run].assign(llmc::kNormScratchFloats, NAN);
            float* s = scratch[run].data();
            double* out = reinterpret_cast<double*>(s + llmc::kNormBlocks);
            launch(llmc::kNormBlocks, llmc::kNormThreads, orders[run],
                   [&] { llmc::norm_squared_partial_kernel(s, g.data(), n); });
            launch(1, 1024, orders[run], [&] { llmc::norm_squared_final_kernel(out, s, llmc::kNormBlocks); });
            sumsq[run] = *out;
        }
        // fp32 squares summed in fp32 per block (512 threads, a tree), then in double: 1e-5 relative of the double
        // sum; the host mirror of that order (global_norm.cuh, with the FMA nvcc contracts to) within 1e-6
        const double mirror = llmc::global_norm_squared_host_mirror(g.data(), n);
        const double rel = std::fabs(sumsq[0] - ref) / ref, rel_mirror = std::fabs(sumsq[0] - mirror) / mirror;
        std::printf("  %-52s rel err %.2e vs double sum (rtol 1e-5), %.2e vs host mirror (rtol 1e-6)%s\n",
                    ("norm_squared_partial + final kernels (n=" + std::to_string(n) + ")").c_str(), rel, rel_mirror,
                    rel <= 1e-5 && rel_mirror <= 1e-6 ? "" : "  FAIL");
        EXPECT(rel <= 1e-5);
        EXPECT(rel_mirror <= 1e-6);
        EXPECT_EQ(bit_diffs(scratch[0], scratch[1]), size_t{0});
        expect_same_bits("  forward vs reverse thread order", std::vector<double>{sumsq[0]}, std::vector<double>{sumsq[1]});
        // The clip coefficient the final kernel leaves beside the sum (global_norm_for_clip_async), against
        // torch.nn.utils.clip_grad_norm_'s rule written out here: min(1, max_norm / (norm + 1e-6)), 1 without a clip.
        const double norm = std::sqrt(sumsq[0]);
        for (const float max_norm : {0.0f, -1.0f, float(norm) * 0.5f, float(norm) * 2.0f, 1e-30f}) {
            std::vector<float> sc(llmc::kNormScratchFloats, NAN);
            float* s = sc.data();
            double* out = reinterpret_cast<double*>(s + llmc::kNormBlocks);
            float* clip = s + llmc::kNormBlocks + 2;
            launch(llmc::kNormBlocks, llmc::kNormThreads, Order::Forward,
                   [&] { llmc::norm_squared_partial_kernel(s, g.data(), n); });
            launch(1, 1024, Order::Forward,
                   [&] { llmc::norm_squared_final_kernel(out, s, llmc::kNormBlocks, clip, max_norm); });
            const double coef = max_norm / (std::sqrt(*out) + 1e-6);
            const float want = max_norm <= 0.0f || coef >= 1.0 ? 1.0f : static_cast<float>(coef);
            char label[64];
            std::snprintf(label, sizeof label, "final kernel's clip coefficient, max_norm %g", double(max_norm));
            std::printf("  %-52s %.9g (rule: %.9g)%s\n", label, *clip, want, *clip == want ? "" : "  FAIL");
            EXPECT(*clip == want);
            EXPECT(*out == sumsq[0]);
        }
    }
}

// =========================================================================================================
// matmul.cuh's bias add (when the bias cannot be a cuBLASLt epilogue): out (N, OC) += bias (OC)
TEST(add_bias) {
    const int N = 26, OC = 37;
    const size_t total = size_t(N) * OC;
    const auto out0 = random_floatX_values(total, 1.0f, 91), bias = random_floatX_values(size_t(OC), 1.0f, 92);
    std::vector<double> sum(total);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < OC; c++) sum[size_t(r) * OC + c] = double(out0[size_t(r) * OC + c]) + bias[size_t(c)];
    const std::vector<floatX> bias_x = fx(bias), want = rounded(sum);
    for (const unsigned grid : {unsigned(llmc::grid_stride_blocks(total, 256)), 2u}) {  // matmul_forward's, and small
        std::vector<floatX> out = fx(out0);
        launch(grid, 256, Order::Forward, [&] { llmc::add_bias_kernel(out.data(), bias_x.data(), size_t(N), OC); });
        expect_same_bits("add_bias_kernel (N=26,OC=37, " + std::to_string(grid) + " blocks) = round(out+bias)", out, want);
    }
}

}  // namespace

TEST_MAIN()
