// CPU checks of the maths the CUDA kernels share through llmc/base/kernel_math.h (plain g++, no CUDA headers). Each
// function is compared with an independent formulation: GELU and its derivative against the formula in double
// and central finite differences; LayerNorm forward against a double implementation and its backward against
// numeric gradients; the online-softmax merge against a direct max/sum; the cross-entropy and softmax
// gradients against finite differences; bf16 round-to-nearest-even against a reference that picks the nearer
// neighbour by exact arithmetic; stochastic rounding's bounds and unbiasedness; the AdamW element update
// against the literal torch formula and against the CPU optimizer (llmc::AdamW) itself; and the column-major
// GEMM problems the linear layers and attention hand to cuBLASLt against the row-major products they mean.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "llmc/optim/adamw/adamw.h"
#include "llmc/base/kernel_math.h"
#include "llmc/optim/optimizer.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

double gelu_double(double x) {
    const double pi = 3.14159265358979323846;
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Reference bf16 rounding: the two bf16 neighbours of f (truncation toward zero and one ulp further out) are
// compared by exact distance in long double; ties go to the even mantissa.
uint16_t bf16_reference(float f) {
    const uint32_t u = float_bits(f);
    if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
    if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
    const uint16_t lo = static_cast<uint16_t>(u >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude (may be inf: fine)
    const long double x = f;
    const long double a = bits_float(static_cast<uint32_t>(lo) << 16);
    // IEEE rounding treats the step past the largest finite value as 2^128 (overflow to infinity when nearer).
    const long double b = (hi & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0L, 128), x)
                                                  : bits_float(static_cast<uint32_t>(hi) << 16);
    const long double da = std::fabs(x - a), db = std::fabs(x - b);
    if (da < db) return lo;
    if (db < da) return hi;
    return (lo & 1) == 0 ? lo : hi;
}

std::vector<float> random_vector(std::mt19937& rng, int n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

}  // namespace

TEST(gelu_matches_formula_and_finite_differences) {
    for (double x = -8.0; x <= 8.0; x += 0.0625) {
        const float xf = static_cast<float>(x);
        EXPECT_NEAR(km::gelu_forward(xf), gelu_double(xf), 2e-6 * (1.0 + std::fabs(x)));
        const double h = 1e-4;
        const double fd = (gelu_double(xf + h) - gelu_double(xf - h)) / (2 * h);
        EXPECT_NEAR(km::gelu_derivative(xf), fd, 2e-5);
    }
    EXPECT_NEAR(km::gelu_forward(0.0f), 0.0, 0.0);
    EXPECT_NEAR(km::gelu_derivative(0.0f), 0.5, 1e-7);
    EXPECT_NEAR(km::gelu_forward(1.0f), 0.8411919906, 1e-6);  // torch.nn.functional.gelu(1, approximate="tanh")
}

TEST(layernorm_forward_matches_double_reference) {
    std::mt19937 rng(1);
    for (int C : {1, 7, 64, 768}) {
        auto x = random_vector(rng, C, 3.0f);
        for (float& v : x) v += 1.5f;
        auto w = random_vector(rng, C, 1.0f), b = random_vector(rng, C, 1.0f);
        std::vector<float> out(C);
        float mean = 0, rstd = 0;
        km::layernorm_row_forward_ref(x.data(), w.data(), b.data(), out.data(), C, &mean, &rstd);
        double m = 0;
        for (float v : x) m += v;
        m /= C;
        double var = 0;
        for (float v : x) var += (v - m) * (v - m);
        var /= C;
        const double r = 1.0 / std::sqrt(var + 1e-5);
        EXPECT_NEAR(mean, m, 1e-6 * (1 + std::fabs(m)));
        EXPECT_NEAR(rstd, r, 1e-5 * r);
        for (int i = 0; i < C; i++) EXPECT_NEAR(out[i], (x[i] - m) * r * w[i] + b[i], 1e-4);
    }
}

TEST(layernorm_backward_matches_numeric_gradient) {
    std::mt19937 rng(2);
    const int C = 16;
    auto x = random_vector(rng, C, 2.0f);
    auto w = random_vector(rng, C, 1.0f), b = random_vector(rng, C, 1.0f);
    auto dout = random_vector(rng, C, 1.0f);
    // loss(x, w, b) = sum_i dout_i * layernorm(x)_i, evaluated in double.
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>& ws, const std::vector<double>& bs) {
        double m = 0;
        for (double v : xs) m += v;
        m /= C;
        double var = 0;
        for (double v : xs) var += (v - m) * (v - m);
        var /= C;
        const double r = 1.0 / std::sqrt(var + 1e-5);
        double s = 0;
        for (int i = 0; i < C; i++) s += dout[i] * ((xs[i] - m) * r * ws[i] + bs[i]);
        return s;
    };
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end());
    std::vector<float> y(C), dx(C, 0.5f), dw(C, 0.25f), db(C, -0.125f);  // non-zero: the reference accumulates
    float mean, rstd;
    km::layernorm_row_forward_ref(x.data(), w.data(), b.data(), y.data(), C, &mean, &rstd);
    km::layernorm_row_backward_ref(dout.data(), x.data(), w.data(), mean, rstd, dx.data(), dw.data(), db.data(), C);
    const double h = 1e-5;
    for (int i = 0; i < C; i++) {
        auto xp = xd, xm = xd;
        xp[i] += h;
        xm[i] -= h;
        EXPECT_NEAR(dx[i] - 0.5f, (loss(xp, wd, bd) - loss(xm, wd, bd)) / (2 * h), 2e-4);
        auto wp = wd, wm = wd;
        wp[i] += h;
        wm[i] -= h;
        EXPECT_NEAR(dw[i] - 0.25f, (loss(xd, wp, bd) - loss(xd, wm, bd)) / (2 * h), 2e-4);
        auto bp = bd, bm = bd;
        bp[i] += h;
        bm[i] -= h;
        EXPECT_NEAR(db[i] + 0.125f, (loss(xd, wd, bp) - loss(xd, wd, bm)) / (2 * h), 2e-4);
    }
}

TEST(online_softmax_merge_matches_direct_computation) {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 50; trial++) {
        const int n = 1 + static_cast<int>(rng() % 300);
        auto x = random_vector(rng, n, 4.0f);
        double mx = -INFINITY;
        for (float v : x) mx = std::max<double>(mx, v);
        double sum = 0;
        for (float v : x) sum += std::exp(v - mx);
        // sequential pushes
        km::SoftmaxStat s = km::softmax_stat_empty();
        for (float v : x) s = km::softmax_stat_push(s, v);
        EXPECT_NEAR(s.max, mx, 0.0);
        EXPECT_NEAR(s.sum, sum, 1e-5 * sum);
        // strided partial stats (as 32 lanes would hold), merged in a butterfly tree
        std::vector<km::SoftmaxStat> lanes(32, km::softmax_stat_empty());
        for (int i = 0; i < n; i++) lanes[i % 32] = km::softmax_stat_push(lanes[i % 32], x[i]);
        for (int offset = 16; offset > 0; offset /= 2)
            for (int l = 0; l < offset; l++) lanes[l] = km::softmax_stat_merge(lanes[l], lanes[l + offset]);
        EXPECT_NEAR(lanes[0].max, mx, 0.0);
        EXPECT_NEAR(lanes[0].sum, sum, 1e-5 * sum);
    }
    // empty sides
    const km::SoftmaxStat e = km::softmax_stat_empty();
    const km::SoftmaxStat m = km::softmax_stat_merge(e, e);
    EXPECT(m.sum == 0.0f && std::isinf(m.max) && m.max < 0);
    const km::SoftmaxStat one = km::softmax_stat_push(e, 2.5f);
    EXPECT_NEAR(one.max, 2.5, 0.0);
    EXPECT_NEAR(one.sum, 1.0, 0.0);
    const km::SoftmaxStat m2 = km::softmax_stat_merge(e, one);
    EXPECT_NEAR(m2.sum, 1.0, 0.0);
    EXPECT_NEAR(km::softmax_stat_merge(one, e).sum, 1.0, 0.0);
}

TEST(crossentropy_loss_and_gradient) {
    std::mt19937 rng(4);
    const int V = 37;
    auto x = random_vector(rng, V, 2.0f);
    const int target = 11;
    const float dloss = 0.25f;
    km::SoftmaxStat s = km::softmax_stat_empty();
    for (float v : x) s = km::softmax_stat_push(s, v);
    auto ce = [&](const std::vector<double>& z) {
        double mx = -INFINITY;
        for (double v : z) mx = std::max(mx, v);
        double sum = 0;
        for (double v : z) sum += std::exp(v - mx);
        return std::log(sum) + mx - z[target];
    };
    std::vector<double> xd(x.begin(), x.end());
    EXPECT_NEAR(km::crossentropy_loss(s, x[target]), ce(xd), 1e-5);
    for (int i = 0; i < V; i++) {
        auto p = xd, m = xd;
        p[i] += 1e-5;
        m[i] -= 1e-5;
        const double fd = dloss * (ce(p) - ce(m)) / 2e-5;
        EXPECT_NEAR(km::crossentropy_dlogit(x[i], s, i == target, dloss), fd, 1e-5);
    }
}

TEST(softmax_backward_element_matches_numeric_gradient) {
    std::mt19937 rng(5);
    const int n = 9;
    const float scale = 0.125f;
    auto z = random_vector(rng, n, 3.0f), dp = random_vector(rng, n, 1.0f);
    // f(z) = sum_i dp_i * softmax(scale * z)_i
    auto f = [&](const std::vector<double>& zz) {
        double mx = -INFINITY;
        for (double v : zz) mx = std::max(mx, scale * v);
        double sum = 0;
        for (double v : zz) sum += std::exp(scale * v - mx);
        double r = 0;
        for (int i = 0; i < n; i++) r += dp[i] * std::exp(scale * zz[i] - mx) / sum;
        return r;
    };
    std::vector<double> zd(z.begin(), z.end());
    std::vector<float> p(n);
    double mx = -INFINITY, sum = 0;
    for (float v : z) mx = std::max<double>(mx, scale * v);
    for (float v : z) sum += std::exp(scale * v - mx);
    for (int i = 0; i < n; i++) p[i] = static_cast<float>(std::exp(scale * z[i] - mx) / sum);
    float dot = 0;
    for (int i = 0; i < n; i++) dot += p[i] * dp[i];
    for (int i = 0; i < n; i++) {
        auto a = zd, b = zd;
        a[i] += 1e-4;
        b[i] -= 1e-4;
        EXPECT_NEAR(km::softmax_backward_element(p[i], dp[i], dot, scale), (f(a) - f(b)) / 2e-4, 1e-6);
    }
}

TEST(bf16_round_to_nearest_even_is_bit_exact) {
    std::mt19937 rng(6);
    int mismatches = 0;
    auto check = [&](float f) {
        if (km::bf16_bits_rne(f) != bf16_reference(f)) {
            if (mismatches++ < 5)
                std::fprintf(stderr, "  bf16 mismatch for %a: got %04x want %04x\n", f, km::bf16_bits_rne(f),
                             bf16_reference(f));
        }
    };
    for (int i = 0; i < 200000; i++) check(bits_float(static_cast<uint32_t>(rng())));  // every exponent, NaNs too
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int i = 0; i < 200000; i++) check(d(rng));
    // ties: exactly half an ulp, with even and odd kept mantissas
    for (uint32_t hi : {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u, 0x7f7fu, 0x0001u, 0x0080u}) {
        check(bits_float((hi << 16) | 0x8000u));
        check(bits_float((hi << 16) | 0x7fffu));
        check(bits_float((hi << 16) | 0x8001u));
    }
    for (float f : {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()})
        check(f);
    EXPECT_EQ(mismatches, 0);
    EXPECT(std::isnan(km::bf16_bits_to_float(km::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_EQ(km::bf16_bits_rne(1.0f), uint16_t{0x3f80});
    EXPECT_EQ(km::bf16_bits_rne(bits_float(0x3f808000u)), uint16_t{0x3f80});  // tie, even kept
    EXPECT_EQ(km::bf16_bits_rne(bits_float(0x3f818000u)), uint16_t{0x3f82});  // tie, odd rounds up
    EXPECT_NEAR(km::round_bf16(3.14159265f), 3.140625, 0.0);
}

TEST(bf16_stochastic_rounding_bounds_and_bias) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 10.0f);
    for (int i = 0; i < 20000; i++) {
        const float f = d(rng);
        const uint32_t u = float_bits(f);
        const uint16_t down = static_cast<uint16_t>(u >> 16), up = static_cast<uint16_t>(down + 1);
        const uint16_t r = km::bf16_bits_stochastic(f, static_cast<uint32_t>(rng()));
        EXPECT(r == down || r == up);
        // bounds: the result brackets f between the two neighbours
        const float rf = km::bf16_bits_to_float(r);
        EXPECT(std::fabs(rf - f) <= std::fabs(km::bf16_bits_to_float(up) - km::bf16_bits_to_float(down)));
        // threshold extremes: random 0xffff never rounds up, random 0 rounds up whenever bits are dropped
        EXPECT_EQ(km::bf16_bits_stochastic(f, 0xffffu), down);
        EXPECT_EQ(km::bf16_bits_stochastic(f, 0u), (u & 0xffffu) ? up : down);
    }
    // exact bf16 values never change
    for (float f : {1.0f, -2.5f, 0.0f, 1024.0f}) EXPECT_EQ(km::bf16_bits_stochastic(f, 12345u), km::bf16_bits_rne(f));
    // unbiased: the mean of many roundings of 1 + 0.3 ulp is about 1 + 0.3 ulp
    const float ulp = km::bf16_bits_to_float(0x3f81) - 1.0f;
    const float x = 1.0f + 0.3f * ulp;
    double mean = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) mean += km::bf16_bits_to_float(km::bf16_bits_stochastic(x, km::element_noise(i, 42)));
    mean /= n;
    EXPECT_NEAR((mean - 1.0) / ulp, 0.3, 0.01);
    // finite values never round up into infinity; inf and NaN pass through
    EXPECT_EQ(km::bf16_bits_stochastic(std::numeric_limits<float>::max(), 0u), uint16_t{0x7f7f});
    EXPECT_EQ(km::bf16_bits_stochastic(std::numeric_limits<float>::infinity(), 0u), uint16_t{0x7f80});
    EXPECT(std::isnan(km::bf16_bits_to_float(km::bf16_bits_stochastic(std::numeric_limits<float>::quiet_NaN(), 0u))));
}

TEST(element_noise_is_roughly_uniform_and_seeded) {
    std::vector<int> hist(16, 0);
    const int n = 1 << 16;
    for (int i = 0; i < n; i++) hist[(km::element_noise(i, 7) & 0xffff) >> 12]++;
    for (int c : hist) EXPECT(std::abs(c - n / 16) < n / 16 / 10);
    EXPECT(km::element_noise(5, 1) != km::element_noise(5, 2));
    EXPECT(km::element_noise(5, 1) == km::element_noise(5, 1));
    EXPECT(km::element_noise(5, 1) != km::element_noise(5 + (uint64_t(1) << 32), 1));
}

TEST(adamw_element_matches_literal_formula) {
    std::mt19937 rng(8);
    std::normal_distribution<float> d(0.0f, 1.0f);
    const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (bool decays : {true, false}) {
        float p = d(rng), m = 0, v = 0;
        double pd = p, md = 0, vd = 0;
        for (int t = 1; t <= 20; t++) {
            const float g = d(rng);
            const float scale = t % 3 == 0 ? 0.5f : 1.0f;
            const km::AdamWParams h = km::adamw_params(lr, b1, b2, eps, wd, decays, t, scale);
            p = km::adamw_update(p, g, m, v, h);
            // torch.optim.AdamW, written out
            const double gd = double(g) * scale;
            pd *= 1.0 - (decays ? double(lr) * wd : 0.0);
            md = b1 * md + (1 - double(b1)) * gd;
            vd = b2 * vd + (1 - double(b2)) * gd * gd;
            const double mhat = md / (1 - std::pow(double(b1), t));
            const double vhat = vd / (1 - std::pow(double(b2), t));
            pd -= lr * mhat / (std::sqrt(vhat) + eps);
            EXPECT_NEAR(p, pd, 1e-6 * (1 + std::fabs(pd)));
            EXPECT_NEAR(m, md, 1e-6);
            EXPECT_NEAR(v, vd, 1e-6);
        }
    }
}

TEST(adamw_element_agrees_with_cpu_optimizer) {
    // A tiny model layout; the kernel maths applied tensor by tensor must give what llmc::AdamW gives.
    ModelConfig mc;
    mc.max_seq_len = 4;
    mc.vocab_size = 10;
    mc.padded_vocab_size = 16;
    mc.num_layers = 1;
    mc.num_heads = 2;
    mc.channels = 8;
    const ParamLayout layout = ParamLayout::gpt2(mc);
    OptimizerConfig oc;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 1.0f;
    LocalTransport transport;
    AdamW cpu(oc, layout, transport);
    std::mt19937 rng(9);
    std::normal_distribution<float> d(0.0f, 0.5f);
    const size_t n = layout.num_params;
    std::vector<float> p_cpu(n), p_km(n), m(n, 0.0f), v(n, 0.0f);
    for (size_t i = 0; i < n; i++) p_cpu[i] = p_km[i] = d(rng);
    double max_diff = 0;
    for (int t = 1; t <= 5; t++) {
        std::vector<float> g(n);
        for (float& x : g) x = d(rng) * 0.2f;
        std::vector<float> g_cpu = g;
        const float lr = 1e-3f * t;
        const StepResult r = cpu.step(p_cpu, g_cpu, lr);
        // our path: norm of the raw gradient (double, any order), clip scale folded into the update
        double ss = 0;
        for (float x : g) ss += double(x) * x;
        const double norm = std::sqrt(ss);
        EXPECT_NEAR(norm, r.grad_norm, 1e-9 * norm);
        const float scale = km::clip_scale(norm, oc.grad_clip);
        for (const ParamTensor& tensor : layout.tensors) {
            const km::AdamWParams h = km::adamw_params(lr, oc.adamw.beta1, oc.adamw.beta2, oc.adamw.eps,
                                                       oc.weight_decay, decays(tensor, oc.decay_groups), t, scale);
            for (size_t i = tensor.offset; i < tensor.offset + tensor.numel; i++)
                p_km[i] = km::adamw_update(p_km[i], g[i], m[i], v[i], h);
        }
        for (size_t i = 0; i < n; i++) max_diff = std::max(max_diff, double(std::fabs(p_km[i] - p_cpu[i])));
    }
    // Same formula; only float contraction / clip-scale application order may differ.
    EXPECT(max_diff < 1e-6);
}

TEST(clip_scale_follows_torch_rule) {
    EXPECT_NEAR(km::clip_scale(0.5, 1.0f), 1.0, 0.0);
    EXPECT_NEAR(km::clip_scale(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7);
    EXPECT_NEAR(km::clip_scale(4.0, 0.0f), 1.0, 0.0);
    std::vector<float> g = {3.0f, 4.0f};
    const double norm = clip_grad_norm(g, 1.0f);
    EXPECT_NEAR(norm, 5.0, 1e-12);
    EXPECT_NEAR(g[0], 3.0f * km::clip_scale(5.0, 1.0f), 1e-7);
}

TEST(linear_layer_gemm_shapes_compute_the_row_major_products) {
    // The column-major problems matmul.cuh hands to cuBLASLt, evaluated by the contract's reference loops,
    // must equal the row-major products they stand for.
    std::mt19937 rng(10);
    const int N = 5, C = 6, OC = 7;
    auto inp = random_vector(rng, N * C, 1.0f), w = random_vector(rng, OC * C, 1.0f), dout = random_vector(rng, N * OC, 1.0f);
    auto dw0 = random_vector(rng, OC * C, 1.0f);
    std::vector<float> out(N * OC), dinp(N * C), dw = dw0;
    km::gemm_colmajor_ref(km::linear_forward_gemm(N, C, OC), w.data(), inp.data(), out.data(), false);
    km::gemm_colmajor_ref(km::linear_dinp_gemm(N, C, OC), w.data(), dout.data(), dinp.data(), false);
    km::gemm_colmajor_ref(km::linear_dweight_gemm(N, C, OC), inp.data(), dout.data(), dw.data(), true);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += double(inp[n * C + c]) * w[o * C + c];
            EXPECT_NEAR(out[n * OC + o], s, 1e-5);
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += double(dout[n * OC + o]) * w[o * C + c];
            EXPECT_NEAR(dinp[n * C + c], s, 1e-5);
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double s = dw0[o * C + c];
            for (int n = 0; n < N; n++) s += double(dout[n * OC + o]) * inp[n * C + c];
            EXPECT_NEAR(dw[o * C + c], s, 1e-5);
        }
}

TEST(attention_gemm_shapes_compute_the_per_head_products) {
    std::mt19937 rng(11);
    const int BNH = 3, T = 5, HS = 4;
    auto q = random_vector(rng, BNH * T * HS, 1.0f), k = random_vector(rng, BNH * T * HS, 1.0f);
    auto v = random_vector(rng, BNH * T * HS, 1.0f), dy = random_vector(rng, BNH * T * HS, 1.0f);
    auto att = random_vector(rng, BNH * T * T, 1.0f), dpre = random_vector(rng, BNH * T * T, 1.0f);
    std::vector<float> preatt(BNH * T * T), y(BNH * T * HS), datt(BNH * T * T), dv(BNH * T * HS), dq(BNH * T * HS),
        dk(BNH * T * HS);
    km::gemm_colmajor_ref(km::attention_preatt_gemm(BNH, T, HS), k.data(), q.data(), preatt.data(), false);
    km::gemm_colmajor_ref(km::attention_av_gemm(BNH, T, HS), v.data(), att.data(), y.data(), false);
    km::gemm_colmajor_ref(km::attention_datt_gemm(BNH, T, HS), v.data(), dy.data(), datt.data(), false);
    km::gemm_colmajor_ref(km::attention_dv_gemm(BNH, T, HS), dy.data(), att.data(), dv.data(), false);
    km::gemm_colmajor_ref(km::attention_dq_gemm(BNH, T, HS), k.data(), dpre.data(), dq.data(), false);
    km::gemm_colmajor_ref(km::attention_dk_gemm(BNH, T, HS), q.data(), dpre.data(), dk.data(), false);
    auto X = [&](const std::vector<float>& m, int b, int r, int c, int cols) { return double(m[(b * T + r) * cols + c]); };
    for (int b = 0; b < BNH; b++) {
        for (int t = 0; t < T; t++)
            for (int u = 0; u < T; u++) {
                double p = 0, da = 0;
                for (int h = 0; h < HS; h++) {
                    p += X(q, b, t, h, HS) * X(k, b, u, h, HS);
                    da += X(dy, b, t, h, HS) * X(v, b, u, h, HS);
                }
                EXPECT_NEAR(X(preatt, b, t, u, T), p, 1e-5);
                EXPECT_NEAR(X(datt, b, t, u, T), da, 1e-5);
            }
        for (int t = 0; t < T; t++)
            for (int h = 0; h < HS; h++) {
                double yy = 0, vv = 0, qq = 0, kk = 0;
                for (int u = 0; u < T; u++) {
                    yy += X(att, b, t, u, T) * X(v, b, u, h, HS);   // y[t]  = sum_u att[t][u] v[u]
                    vv += X(att, b, u, t, T) * X(dy, b, u, h, HS);  // dv[t] = sum_u att[u][t] dy[u]
                    qq += X(dpre, b, t, u, T) * X(k, b, u, h, HS);  // dq[t] = sum_u dpre[t][u] k[u]
                    kk += X(dpre, b, u, t, T) * X(q, b, u, h, HS);  // dk[t] = sum_u dpre[u][t] q[u]
                }
                EXPECT_NEAR(X(y, b, t, h, HS), yy, 1e-5);
                EXPECT_NEAR(X(dv, b, t, h, HS), vv, 1e-5);
                EXPECT_NEAR(X(dq, b, t, h, HS), qq, 1e-5);
                EXPECT_NEAR(X(dk, b, t, h, HS), kk, 1e-5);
            }
    }
}

TEST_MAIN()
