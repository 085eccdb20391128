// The per-element maths of the CUDA kernels, in one header that compiles both under nvcc (where every function
// is __host__ __device__) and under plain g++ without any CUDA header (test/unit/test_cuda_host_math.cpp checks it
// on the CPU). The kernels in llmc/*.cuh call these functions for the arithmetic and only add the parallel
// structure (threads, warps, reductions) around them, so a kernel is correct when its indexing is correct.
// The checkers in dev/cuda/ use the row-level references at the end of this file as their CPU ground truth.
//
// Contents: tanh-GELU and its derivative; LayerNorm pieces; online-softmax statistics and their merge;
// cross-entropy gradient; causal-softmax backward element; fp32 -> bf16 rounding (nearest-even and
// stochastic, on raw bits so host and device agree bit for bit); a counter-based hash for the stochastic
// rounding noise; the AdamW element update in torch.optim.AdamW's arithmetic order (as llmc/optim/adamw/adamw.cpp);
// OLMo's pieces: RMSNorm, SwiGLU and the rotary embedding's rotation of one pair (its cos/sin table is built by
// llmc/base/rope_table.h).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define LLMC_HD __host__ __device__ __forceinline__
#else
#define LLMC_HD inline
#endif

namespace llmc::km {

// ---------------------------------------------------------------------------------------------------------
// Bit casts usable on both sides.
LLMC_HD uint32_t float_to_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

LLMC_HD float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

// ---------------------------------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2, PyTorch approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

LLMC_HD float gelu_forward(float x) {
    const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

// d gelu / dx
LLMC_HD float gelu_derivative(float x) {
    const float inner = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = tanhf(inner);
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm (biased variance, eps 1e-5 as torch.nn.LayerNorm).
inline constexpr float kLayerNormEps = 1e-5f;

LLMC_HD float layernorm_rstd(float variance) { return 1.0f / sqrtf(variance + kLayerNormEps); }

LLMC_HD float layernorm_apply(float x, float mean, float rstd, float weight, float bias) {
    return (x - mean) * rstd * weight + bias;
}

// Gradient of one input element, given the row statistics of the backward pass:
//   dnorm_i = w_i * dout_i, norm_i = (x_i - mean) * rstd,
//   dnorm_mean = mean_i(dnorm_i), dnorm_norm_mean = mean_i(dnorm_i * norm_i)
//   dx_i = (dnorm_i - dnorm_mean - norm_i * dnorm_norm_mean) * rstd
LLMC_HD float layernorm_dx(float dnorm, float norm, float dnorm_mean, float dnorm_norm_mean, float rstd) {
    return (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
}

// ---------------------------------------------------------------------------------------------------------
// OLMo's norms, activation and rotary embedding, shared by llmc/cuda/norms.cuh, swiglu.cuh, rope.cuh and the CPU
// model, so both compute the same formulas in the same order.

// 1 / sqrt(mean_square + eps): LayerNorm's rstd from the variance, RMSNorm's from the mean of x^2. OLMo's
// default eps for both is 1e-5 (the kernels take it as a parameter, as some OLMo configurations use 1e-6).
inline constexpr float kRmsNormEps = 1e-5f;
LLMC_HD float norm_rstd(float mean_square, float eps) { return 1.0f / sqrtf(mean_square + eps); }

// RMSNorm (weight, no bias): y_i = x_i * rstd * w_i. Its input gradient, with norm_i = x_i * rstd,
// dnorm_i = w_i * dout_i and dnorm_norm_mean = mean_i(dnorm_i * norm_i):
//   dx_i = (dnorm_i - norm_i * dnorm_norm_mean) * rstd
// (LayerNorm's layernorm_dx without the mean term, since RMSNorm subtracts no mean).
LLMC_HD float rmsnorm_dx(float dnorm, float norm, float dnorm_norm_mean, float rstd) {
    return (dnorm - norm * dnorm_norm_mean) * rstd;
}

// SwiGLU: out = silu(gate) * x, silu(g) = g * sigmoid(g). Its gradients:
//   dx = dout * silu(g),  dgate = dout * x * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// expf(-g) overflows to inf for g < -88 and sigmoid then is exactly 0, the right limit, so no clamp is needed.
LLMC_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
LLMC_HD float swiglu_forward(float x, float gate) { return gate * sigmoid(gate) * x; }
LLMC_HD void swiglu_backward(float dout, float x, float gate, float& dx, float& dgate) {
    const float s = sigmoid(gate);
    dx = dout * (gate * s);
    dgate = dout * x * s * (1.0f + gate * (1.0f - s));
}

// Rotary embedding, GPT-NeoX "rotate half" layout: the pair (x1, x2) = (x[i], x[i + hs/2]) of a head turned by
// the angle whose cos c and sin s the table holds for this position and i. The backward turns the gradient
// pair back by the same angle (the transpose of a rotation is the rotation by minus the angle).
LLMC_HD void rope_rotate(float x1, float x2, float c, float s, float& out1, float& out2) {
    out1 = x1 * c - x2 * s;
    out2 = x2 * c + x1 * s;
}
LLMC_HD void rope_rotate_backward(float g1, float g2, float c, float s, float& d1, float& d2) {
    d1 = g1 * c + g2 * s;
    d2 = g2 * c - g1 * s;
}

// ---------------------------------------------------------------------------------------------------------
// Online softmax: the pair (max, sum of exp(x - max)) over a set of values. Empty set: {-inf, 0}.
// Two sets merge associatively (up to rounding), so threads, warps and blocks can combine in any fixed tree.
struct SoftmaxStat {
    float max;
    float sum;
};

LLMC_HD SoftmaxStat softmax_stat_empty() { return SoftmaxStat{-INFINITY, 0.0f}; }

LLMC_HD SoftmaxStat softmax_stat_merge(SoftmaxStat a, SoftmaxStat b) {
    const float m = fmaxf(a.max, b.max);
    // An empty side contributes nothing (and must not produce exp(-inf - -inf) = NaN).
    const float sa = a.sum == 0.0f ? 0.0f : a.sum * expf(a.max - m);
    const float sb = b.sum == 0.0f ? 0.0f : b.sum * expf(b.max - m);
    return SoftmaxStat{m, sa + sb};
}

LLMC_HD SoftmaxStat softmax_stat_push(SoftmaxStat s, float x) {
    if (x > s.max) return SoftmaxStat{x, s.sum * expf(s.max - x) + 1.0f};  // s.sum == 0 when s.max == -inf
    return SoftmaxStat{s.max, s.sum + expf(x - s.max)};
}

// Cross-entropy of a row with statistics s: logsumexp - x_target.
LLMC_HD float crossentropy_loss(SoftmaxStat s, float x_target) { return logf(s.sum) + s.max - x_target; }

// d loss / d logit_i, for loss = dloss * CE (dloss = 1 / number of rows averaged over).
LLMC_HD float crossentropy_dlogit(float x, SoftmaxStat s, bool is_target, float dloss) {
    const float prob = expf(x - s.max) / s.sum;
    return (prob - (is_target ? 1.0f : 0.0f)) * dloss;
}

// Softmax backward for one element of a row: p = softmax(scale * z), dp given, dot = sum_j p_j dp_j:
//   dz_i = scale * p_i * (dp_i - dot)
LLMC_HD float softmax_backward_element(float p, float dp, float dot, float scale) { return scale * p * (dp - dot); }

// ---------------------------------------------------------------------------------------------------------
// bf16 = the top 16 bits of an fp32. Round to nearest, ties to even; NaN stays a (quiet) NaN.
LLMC_HD uint16_t bf16_bits_rne(float f) {
    uint32_t u = float_to_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

LLMC_HD float bf16_bits_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

LLMC_HD float round_bf16(float f) { return bf16_bits_to_float(bf16_bits_rne(f)); }

// Stochastic rounding: rounds |f| up to the next bf16 with probability (dropped low 16 bits) / 2^16, else
// truncates, so the expected result is f exactly. `random` supplies the 16 random bits (its low half). Inf and
// NaN round to nearest; a finite value never rounds up into infinity.
LLMC_HD uint16_t bf16_bits_stochastic(float f, uint32_t random) {
    const uint32_t u = float_to_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return bf16_bits_rne(f);
    const uint32_t low = u & 0xffffu;
    const uint32_t threshold = random & 0xffffu;
    uint32_t r = u >> 16;
    if (low > threshold) {
        const uint32_t up = r + 1;
        if ((up & 0x7f80u) != 0x7f80u) r = up;  // stay finite
    }
    return static_cast<uint16_t>(r);
}

// SquirrelNoise5 (Squirrel Eiserloh), the hash llm.c uses for stochastic rounding: a counter-based generator,
// so element i of a tensor gets the same noise whatever the launch configuration.
LLMC_HD uint32_t squirrel_noise5(uint32_t position, uint32_t seed) {
    constexpr uint32_t kBitNoise1 = 0xd2a80a3fu;
    constexpr uint32_t kBitNoise2 = 0xa884f197u;
    constexpr uint32_t kBitNoise3 = 0x6C736F4Bu;
    constexpr uint32_t kBitNoise4 = 0xB79F3ABBu;
    constexpr uint32_t kBitNoise5 = 0x1b56c4f5u;
    uint32_t bits = position;
    bits *= kBitNoise1;
    bits += seed;
    bits ^= (bits >> 9);
    bits += kBitNoise2;
    bits ^= (bits >> 11);
    bits *= kBitNoise3;
    bits ^= (bits >> 13);
    bits += kBitNoise4;
    bits ^= (bits >> 15);
    bits *= kBitNoise5;
    bits ^= (bits >> 17);
    return bits;
}

// Noise for a 64-bit element index.
LLMC_HD uint32_t element_noise(uint64_t index, uint32_t seed) {
    const uint32_t lo = static_cast<uint32_t>(index);
    const uint32_t hi = static_cast<uint32_t>(index >> 32);
    return squirrel_noise5(lo + 198491317u * hi, seed);
}

// ---------------------------------------------------------------------------------------------------------
// AdamW, one element, in torch.optim.AdamW's order (and llmc/optim/adamw/adamw.cpp's): decoupled decay first, then the
// moments, then p -= step_size * m / (sqrt(v) / sqrt(bc2) + eps) with step_size = lr / bc1.
// The gradient is multiplied by grad_scale first (gradient clipping folded into the update).
struct AdamWParams {
    float lr;
    float beta1, beta2, eps;
    float decay_factor;   // 1 - lr * weight_decay for decayed tensors, 1 otherwise
    float step_size;      // lr / (1 - beta1^t)
    float inv_sqrt_bc2;   // 1 / sqrt(1 - beta2^t)
    float grad_scale;     // clip coefficient (1 when not clipping)
};

// Updates m and v in place and returns the new parameter.
LLMC_HD float adamw_update(float param, float grad, float& m, float& v, const AdamWParams& h) {
    const float g = grad * h.grad_scale;
    float p = param * h.decay_factor;
    m = h.beta1 * m + (1.0f - h.beta1) * g;
    v = h.beta2 * v + (1.0f - h.beta2) * g * g;
    const float denom = sqrtf(v) * h.inv_sqrt_bc2 + h.eps;
    p -= h.step_size * (m / denom);
    return p;
}

// Host-side construction of the per-step constants (t = 1-based step count), in double as adamw.cpp does.
inline AdamWParams adamw_params(float lr, float beta1, float beta2, float eps, float weight_decay, bool decays,
                                long long t, float grad_scale) {
    const double bc1 = 1.0 - pow(static_cast<double>(beta1), static_cast<double>(t));
    const double bc2 = 1.0 - pow(static_cast<double>(beta2), static_cast<double>(t));
    AdamWParams h;
    h.lr = lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.decay_factor = decays ? 1.0f - lr * weight_decay : 1.0f;
    h.step_size = static_cast<float>(lr / bc1);
    h.inv_sqrt_bc2 = static_cast<float>(1.0 / sqrt(bc2));
    h.grad_scale = grad_scale;
    return h;
}

// Clip coefficient with torch.nn.utils.clip_grad_norm_'s rule (as llmc::clip_grad_norm). The CUDA optimizers
// take it on the device from the norm's square (clip_scale_of_squares), with the host's bits.
LLMC_HD float clip_scale(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    const double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}
LLMC_HD float clip_scale_of_squares(double sum_of_squares, float max_norm) {
    return clip_scale(sqrt(sum_of_squares), max_norm);  // IEEE sqrt: the host's std::sqrt, bit for bit
}

// ---------------------------------------------------------------------------------------------------------
// The GEMMs of the linear layers and of attention, as cuBLAS(Lt) sees them. cuBLAS is column-major; our tensors
// are row-major (PyTorch), and a row-major R x C matrix is a column-major C x R one. Each function below states
// one product in row-major terms and returns the column-major problem that computes it, so the transposes and
// strides live in one place that the host test checks against plain loops (gemm_colmajor_ref):
//   D (m x n, ld m) = op(A) op(B), A stored (k x m, ld k) when ta else (m x k, ld m),
//   B stored (n x k, ld n) when tb else (k x n, ld k); `batch` problems at element strides sa, sb, sd.
struct GemmShape {
    int m, n, k;
    bool ta, tb;
    int batch;
    long long sa, sb, sd;
};

// out (N,OC) = inp (N,C) @ W^T, W (OC,C):  A = W, B = inp, D = out
inline GemmShape linear_forward_gemm(int N, int C, int OC) { return {OC, N, C, true, false, 1, 0, 0, 0}; }
// dinp (N,C) = dout (N,OC) @ W:  A = W, B = dout, D = dinp
inline GemmShape linear_dinp_gemm(int N, int C, int OC) { return {C, N, OC, false, false, 1, 0, 0, 0}; }
// dW (OC,C) = dout^T @ inp:  A = inp, B = dout, D = dW
inline GemmShape linear_dweight_gemm(int N, int C, int OC) { return {C, OC, N, false, true, 1, 0, 0, 0}; }
// Per head (BNH of them), q, k, v, y, dy (T,HS) and att, preatt (T,T), all row-major:
// preatt = q @ k^T:  A = k, B = q
inline GemmShape attention_preatt_gemm(int BNH, int T, int HS) {
    return {T, T, HS, true, false, BNH, (long long)T * HS, (long long)T * HS, (long long)T * T};
}
// y = att @ v:  A = v, B = att
inline GemmShape attention_av_gemm(int BNH, int T, int HS) {
    return {HS, T, T, false, false, BNH, (long long)T * HS, (long long)T * T, (long long)T * HS};
}
// datt = dy @ v^T:  A = v, B = dy
inline GemmShape attention_datt_gemm(int BNH, int T, int HS) {
    return {T, T, HS, true, false, BNH, (long long)T * HS, (long long)T * HS, (long long)T * T};
}
// dv = att^T @ dy:  A = dy, B = att
inline GemmShape attention_dv_gemm(int BNH, int T, int HS) {
    return {HS, T, T, false, true, BNH, (long long)T * HS, (long long)T * T, (long long)T * HS};
}
// dq = dpreatt @ k:  A = k, B = dpreatt
inline GemmShape attention_dq_gemm(int BNH, int T, int HS) {
    return {HS, T, T, false, false, BNH, (long long)T * HS, (long long)T * T, (long long)T * HS};
}
// dk = dpreatt^T @ q:  A = q, B = dpreatt
inline GemmShape attention_dk_gemm(int BNH, int T, int HS) {
    return {HS, T, T, false, true, BNH, (long long)T * HS, (long long)T * T, (long long)T * HS};
}

// The column-major GEMM contract above, in plain loops (host reference for the test).
inline void gemm_colmajor_ref(const GemmShape& g, const float* A, const float* B, float* D, bool accumulate) {
    for (int batch = 0; batch < g.batch; batch++) {
        const float* a = A + batch * g.sa;
        const float* b = B + batch * g.sb;
        float* d = D + batch * g.sd;
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                double s = accumulate ? d[i + size_t(j) * g.m] : 0.0;
                for (int p = 0; p < g.k; p++) {
                    const float av = g.ta ? a[p + size_t(i) * g.k] : a[i + size_t(p) * g.m];
                    const float bv = g.tb ? b[j + size_t(p) * g.n] : b[p + size_t(j) * g.k];
                    s += double(av) * bv;
                }
                d[i + size_t(j) * g.m] = static_cast<float>(s);
            }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Row-level CPU references (plain loops, float accumulation in double) used by the dev/cuda checkers and the
// host test. Not used by kernels.

// out = layernorm(x) over C; writes mean and rstd.
inline void layernorm_row_forward_ref(const float* x, const float* w, const float* b, float* out, int C,
                                      float* mean_out, float* rstd_out) {
    double sum = 0.0;
    for (int i = 0; i < C; i++) sum += x[i];
    const float mean = static_cast<float>(sum / C);
    double var = 0.0;
    for (int i = 0; i < C; i++) var += (double(x[i]) - mean) * (double(x[i]) - mean);
    const float rstd = layernorm_rstd(static_cast<float>(var / C));
    for (int i = 0; i < C; i++) out[i] = layernorm_apply(x[i], mean, rstd, w[i], b[i]);
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

// Accumulates (+=) the gradients of one row into dx, dw, db.
inline void layernorm_row_backward_ref(const float* dout, const float* x, const float* w, float mean, float rstd,
                                       float* dx, float* dw, float* db, int C) {
    double dnorm_sum = 0.0, dnorm_norm_sum = 0.0;
    for (int i = 0; i < C; i++) {
        const float norm = (x[i] - mean) * rstd;
        const float dnorm = w[i] * dout[i];
        dnorm_sum += dnorm;
        dnorm_norm_sum += double(dnorm) * norm;
    }
    const float dnorm_mean = static_cast<float>(dnorm_sum / C);
    const float dnorm_norm_mean = static_cast<float>(dnorm_norm_sum / C);
    for (int i = 0; i < C; i++) {
        const float norm = (x[i] - mean) * rstd;
        const float dnorm = w[i] * dout[i];
        if (dx) dx[i] += layernorm_dx(dnorm, norm, dnorm_mean, dnorm_norm_mean, rstd);
        if (dw) dw[i] += dout[i] * norm;
        if (db) db[i] += dout[i];
    }
}

}  // namespace llmc::km
