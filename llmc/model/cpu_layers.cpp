// The CPU model's layers (see cpu_layers.h): forward/backward pairs in fp32. Every matmul is cblas_sgemm on a
// fixed slice of the output per OpenMP thread (never a split of the summed dimension, so results do not depend on
// timing). The other kernels are OpenMP loops in which each output element is written by one iteration, and every
// reduction across rows (bias, norm, embedding gradients) walks the rows in order for a block of channels, so
// thread scheduling cannot change a single bit. Sums that would be serial chains (dot products, softmax
// denominators) use fixed lane patterns so they vectorize without -ffast-math and stay reproducible.
#include "llmc/model/cpu_layers.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llmc/base/targets.h"

namespace llmc::cpu {

namespace {


constexpr float kLayerNormEps = 1e-5f;   // as torch.nn.LayerNorm and llm.c
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi), tanh approximation of GELU
constexpr float kGeluCubic = 0.044715f;
// Reductions over rows are done per block of this many channels: wide enough to vectorize, and C / 64 blocks
// keep both cores busy for every GPT-2 width.
constexpr size_t kChannelBlock = 64;


// Sum of x[0..n) in double, in 8 interleaved lanes combined in a fixed order: the compiler vectorizes it
// without -ffast-math and the result is the same on every run.
inline double lane_sum(const float* x, size_t n) {
    double lanes[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lanes[j] += x[i + j];
    for (; i < n; i++) lanes[i % 8] += x[i];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Sum of (x[i] - center)^2 in double, same lane scheme.
inline double lane_sum_sq_dev(const float* x, size_t n, float center) {
    double lanes[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const double d = static_cast<double>(x[i + j]) - center;
            lanes[j] += d * d;
        }
    for (; i < n; i++) {
        const double d = static_cast<double>(x[i]) - center;
        lanes[i % 8] += d * d;
    }
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Dot product in 16 float lanes combined pairwise in a fixed order: vectorizes without -ffast-math and is
// the same on every run (a plain running sum would be a serial dependency chain).
inline float dot_lanes(const float* a, const float* b, size_t n) {
    float lanes[16] = {};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) lanes[j] += a[i + j] * b[i + j];
    for (; i < n; i++) lanes[i % 16] += a[i] * b[i];
    for (size_t width = 8; width > 0; width /= 2)
        for (size_t j = 0; j < width; j++) lanes[j] += lanes[j + width];
    return lanes[0];
}

// Maximum of x[0..n), n > 0, in 16 lanes (max is exact, so only speed depends on the lane count).
inline float lane_max(const float* x, size_t n) {
    float lanes[16];
    for (float& lane : lanes) lane = x[0];
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) lanes[j] = lanes[j] > x[i + j] ? lanes[j] : x[i + j];
    float m = x[0];
    for (; i < n; i++) m = std::max(m, x[i]);
    for (float lane : lanes) m = std::max(m, lane);
    return m;
}

// exp(x) for x <= 0 (softmax arguments after subtracting the row max), written so the compiler vectorizes
// it: Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2, a degree-7 Taylor polynomial for exp(r)
// (relative error below 2e-7, about one float ulp), and 2^k built in the exponent bits. Arguments below -87
// give 0, where expf would give a denormal that is 0 for every purpose here.
inline float exp_nonpositive(float x) {
    x = std::max(x, -87.0f);
    const float k = std::nearbyint(x * 1.4426950408889634f);
    const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

// tanh via exp_nonpositive: tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|) <= 1. Absolute error ~1e-7,
// which is all GELU needs (it uses 1 + tanh and 1 - tanh^2); vectorizes where std::tanh would not.
inline float tanh_approx(float x) {
    const float e = exp_nonpositive(-2.0f * std::fabs(x));
    const float t = (1.0f - e) / (1.0f + e);
    return std::copysign(t, x);
}

}  // namespace

// ---- encoder: token + position embedding ----

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, size_t B, size_t T,
                     size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < B * T; row++) {
        const float* tok = wte + static_cast<size_t>(tokens[row]) * C;
        float* o = out + row * C;
        if (wpe == nullptr) {
            std::memcpy(o, tok, C * sizeof(float));
            continue;
        }
        const float* pos = wpe + (row % T) * C;
        for (size_t c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
}

// Several rows may share a token (and every batch row shares positions), so rows are accumulated in order
// for one channel block per iteration.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, size_t B, size_t T,
                      size_t C) {
    const size_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const size_t c0 = blk * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
        for (size_t row = 0; row < B * T; row++) {
            const float* d = dout + row * C;
            float* tok = dwte + static_cast<size_t>(tokens[row]) * C;
            for (size_t c = c0; c < c1; c++) tok[c] += d[c];
            if (dwpe == nullptr) continue;
            float* pos = dwpe + (row % T) * C;
            for (size_t c = c0; c < c1; c++) pos[c] += d[c];
        }
    }
}

// ---- LayerNorm ----

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, size_t N, size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* x = inp + row * C;
        const float m = static_cast<float>(lane_sum(x, C) / C);
        const float var = static_cast<float>(lane_sum_sq_dev(x, C, m) / C);
        const float s = 1.0f / std::sqrt(var + kLayerNormEps);
        float* o = out + row * C;
        if (weight != nullptr)
            for (size_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        else
            for (size_t c = 0; c < C; c++) o[c] = (x[c] - m) * s;
        mean[row] = m;
        rstd[row] = s;
    }
}

// dinp += d(LayerNorm)/d(inp) . dout; dweight, dbias += their gradients (rows summed in order per channel).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, size_t N, size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* d = dout + row * C;
        const float* x = inp + row * C;
        const float m = mean[row], s = rstd[row];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (size_t c = 0; c < C; c++) {
            const float dnorm = weight != nullptr ? weight[c] * d[c] : d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float* di = dinp + row * C;
        for (size_t c = 0; c < C; c++) {
            const float norm = (x[c] - m) * s;
            di[c] += ((weight != nullptr ? weight[c] * d[c] : d[c]) - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    if (dweight == nullptr) return;
    const size_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const size_t c0 = blk * kChannelBlock, width = std::min(C, c0 + kChannelBlock) - c0;
        float dw[kChannelBlock] = {}, db[kChannelBlock] = {};
        for (size_t row = 0; row < N; row++) {
            const float* d = dout + row * C + c0;
            const float* x = inp + row * C + c0;
            const float m = mean[row], s = rstd[row];
            for (size_t j = 0; j < width; j++) {
                dw[j] += (x[j] - m) * s * d[j];
                db[j] += d[j];
            }
        }
        for (size_t j = 0; j < width; j++) {
            dweight[c0 + j] += dw[j];
            dbias[c0 + j] += db[j];
        }
    }
}

// ---- matmuls (weights are PyTorch Linear layout: (out_features, in_features), row-major) ----

// C(M, N) = op(A) op(B) + beta C, row-major (op transposes when the flag is set). The larger output dimension
// is cut into one 16-aligned slice per OpenMP thread and each thread runs a single-threaded sgemm on its
// slice (see SingleThreadedBlas for why). K is never split and the slices depend only on the thread count,
// so a given thread count always gives the same bits.
void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
          size_t ldb, float beta, float* C, size_t ldc) {
    const CBLAS_TRANSPOSE op_a = trans_a ? CblasTrans : CblasNoTrans, op_b = trans_b ? CblasTrans : CblasNoTrans;
    const bool split_columns = N >= M;
    const size_t extent = split_columns ? N : M;
#pragma omp parallel
    {
        const size_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const size_t slice = ((extent + threads - 1) / threads + 15) / 16 * 16;
        const size_t begin = std::min(extent, thread * slice), end = std::min(extent, begin + slice);
        if (begin < end) {
            if (split_columns)
                cblas_sgemm(CblasRowMajor, op_a, op_b, int(M), int(end - begin), int(K), 1.0f, A, int(lda),
                            trans_b ? B + begin * ldb : B + begin, int(ldb), beta, C + begin, int(ldc));
            else
                cblas_sgemm(CblasRowMajor, op_a, op_b, int(end - begin), int(N), int(K), 1.0f,
                            trans_a ? A + begin : A + begin * lda, int(lda), B, int(ldb), beta, C + begin * ldc,
                            int(ldc));
        }
    }
}

// acc[c] += sum over rows of x[row, c], rows in order.
void add_column_sums(float* acc, const float* x, size_t N, size_t M) {
    const size_t blocks = (M + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const size_t c0 = blk * kChannelBlock, width = std::min(M, c0 + kChannelBlock) - c0;
        float sum[kChannelBlock] = {};
        for (size_t row = 0; row < N; row++) {
            const float* r = x + row * M + c0;
            for (size_t j = 0; j < width; j++) sum[j] += r[j];
        }
        for (size_t j = 0; j < width; j++) acc[c0 + j] += sum[j];
    }
}

// out(N, OC) = [residual(N, OC) +] inp(N, IC) @ weight(OC, IC)^T [+ bias]. The residual and bias are laid down
// first and the product accumulated onto them (beta = 1), saving a pass over the output.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, const float* residual,
                    size_t N, size_t IC, size_t OC) {
    float beta = 0.0f;
    if (bias != nullptr || residual != nullptr) {
#pragma omp parallel for schedule(static)
        for (size_t row = 0; row < N; row++) {
            float* o = out + row * OC;
            const float* r = residual ? residual + row * OC : nullptr;
            for (size_t c = 0; c < OC; c++) o[c] = (r ? r[c] : 0.0f) + (bias ? bias[c] : 0.0f);
        }
        beta = 1.0f;
    }
    gemm(false, true, N, OC, IC, inp, IC, weight, IC, beta, out, OC);
}

// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias += column sums of dout. Null skips a part.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IC, size_t OC) {
    if (dinp != nullptr) gemm(false, false, N, IC, OC, dout, OC, weight, IC, 0.0f, dinp, IC);
    if (dweight != nullptr) gemm(true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias != nullptr) add_column_sums(dbias, dout, N, OC);
}

// ---- causal self-attention (qkv rows hold q | k | v, each C wide, head h at columns h*hs..) ----

void attention_forward(float* out, float* att, const float* qkv, size_t B, size_t T, size_t C, size_t H) {
    const size_t hs = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // Later queries see more keys; dynamic scheduling balances that (each iteration writes only its own row).
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < H; h++) {
            for (size_t t = 0; t < T; t++) {
                const float* q = qkv + (b * T + t) * C3 + h * hs;
                float* row = att + ((b * H + h) * T + t) * T;
                float maxval = -INFINITY;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + (b * T + t2) * C3 + C + h * hs;
                    row[t2] = dot_lanes(q, k, hs) * scale;
                    maxval = std::max(maxval, row[t2]);
                }
                float sum = 0.0f;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    row[t2] = exp_nonpositive(row[t2] - maxval);
                    sum += row[t2];
                }
                const float inv_sum = 1.0f / sum;
                for (size_t t2 = 0; t2 <= t; t2++) row[t2] *= inv_sum;
                float* o = out + (b * T + t) * C + h * hs;
                for (size_t i = 0; i < hs; i++) o[i] = 0.0f;
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
                    const float a = row[t2];
                    for (size_t i = 0; i < hs; i++) o[i] += a * v[i];
                }
            }
        }
    }
}

// One query (q: C floats, heads side by side) against T cached keys and values ((T, C) rows each), for
// append(): attention_forward's arithmetic for the last row of a sequence. att holds one T-float row per head.
void attention_forward_cached(float* out, float* att, const float* q, const float* keys, const float* values,
                              size_t T, size_t C, size_t H) {
    const size_t hs = C / H;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
    for (size_t h = 0; h < H; h++) {
        float* row = att + h * T;
        float maxval = -INFINITY;
        for (size_t t2 = 0; t2 < T; t2++) {
            row[t2] = dot_lanes(q + h * hs, keys + t2 * C + h * hs, hs) * scale;
            maxval = std::max(maxval, row[t2]);
        }
        float sum = 0.0f;
        for (size_t t2 = 0; t2 < T; t2++) {
            row[t2] = exp_nonpositive(row[t2] - maxval);
            sum += row[t2];
        }
        const float inv_sum = 1.0f / sum;
        for (size_t t2 = 0; t2 < T; t2++) row[t2] *= inv_sum;
        float* o = out + h * hs;
        for (size_t i = 0; i < hs; i++) o[i] = 0.0f;
        for (size_t t2 = 0; t2 < T; t2++) {
            const float* v = values + t2 * C + h * hs;
            for (size_t i = 0; i < hs; i++) o[i] += row[t2] * v[i];
        }
    }
}

// dqkv = gradient of the attention output dout (N, C) w.r.t. qkv. One task per (batch, head): it owns that
// head's q/k/v columns of dqkv and walks the queries in order, so the key/value gradients that many queries
// add to are summed in a fixed order. datt_row is one T-float scratch row per task.
void attention_backward(float* dqkv, float* datt_row, const float* dout, const float* qkv, const float* att,
                        size_t B, size_t T, size_t C, size_t H) {
    const size_t hs = C / H, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    std::memset(dqkv, 0, B * T * C3 * sizeof(float));
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < H; h++) {
            float* datt = datt_row + (b * H + h) * T;
            for (size_t t = 0; t < T; t++) {
                const float* row = att + ((b * H + h) * T + t) * T;
                const float* d = dout + (b * T + t) * C + h * hs;
                const float* q = qkv + (b * T + t) * C3 + h * hs;
                float* dq = dqkv + (b * T + t) * C3 + h * hs;
                // through out = sum_t2 att[t2] v[t2]
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
                    float* dv = dqkv + (b * T + t2) * C3 + 2 * C + h * hs;
                    datt[t2] = dot_lanes(v, d, hs);
                    const float a = row[t2];
                    for (size_t i = 0; i < hs; i++) dv[i] += a * d[i];
                }
                // through the softmax: dpre = att * (datt - sum(att * datt))
                float weighted = 0.0f;
                for (size_t t2 = 0; t2 <= t; t2++) weighted += row[t2] * datt[t2];
                // through pre = scale * q . k
                for (size_t t2 = 0; t2 <= t; t2++) {
                    const float dpre = row[t2] * (datt[t2] - weighted) * scale;
                    const float* k = qkv + (b * T + t2) * C3 + C + h * hs;
                    float* dk = dqkv + (b * T + t2) * C3 + C + h * hs;
                    for (size_t i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
}

// ---- GELU (tanh approximation, as GPT-2 and torch's gelu(approximate='tanh')) ----

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_approx(kGeluScale * (x + kGeluCubic * x * x * x)));
    }
}

// d (N elements) *= GELU'(inp), in place.
void gelu_backward(float* d, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float th = tanh_approx(kGeluScale * (x + kGeluCubic * x * x * x));
        const float local = 0.5f * (1.0f + th) +
                            0.5f * x * (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
        d[i] *= local;
    }
}

// ---- classifier loss: softmax over the first V of Vp logits + cross-entropy ----

// Per row: logsumexp over the first V logits and the loss at the target (0 for kNoTarget). Two passes over a
// row (max, then exp-sum) while it sits in L2.
void crossentropy_forward(float* losses, float* logsumexp, const float* logits, const int* targets, size_t N,
                          size_t V, size_t Vp) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* l = logits + row * Vp;
        const float maxval = lane_max(l, V);
        float lanes[16] = {};
        size_t i = 0;
        for (; i + 16 <= V; i += 16)
            for (size_t j = 0; j < 16; j++) lanes[j] += exp_nonpositive(l[i + j] - maxval);
        double sum = 0.0;
        for (; i < V; i++) sum += exp_nonpositive(l[i] - maxval);
        for (float lane : lanes) sum += lane;
        logsumexp[row] = maxval + static_cast<float>(std::log(sum));
        losses[row] = targets[row] == kNoTarget ? 0.0f : logsumexp[row] - l[targets[row]];
    }
}

// The N losses summed in order (a row without a target adds its 0), over the `count` rows with one.
double mean_loss(const float* losses, size_t N, size_t count) {
    double total = 0.0;
    for (size_t row = 0; row < N; row++) total += losses[row];
    return mean_over_targets(total, count);
}

// dlogits = dloss * (softmax - onehot(target)) over the first V columns, 0 in the padding (padded logits
// take no part in the loss), and a row of zeros for kNoTarget. One pass per row.
void crossentropy_softmax_backward(float* dlogits, const float* logits, const float* logsumexp,
                                   const int* targets, float dloss, size_t N, size_t V, size_t Vp) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* l = logits + row * Vp;
        float* dl = dlogits + row * Vp;
        if (targets[row] == kNoTarget) {
            std::fill(dl, dl + Vp, 0.0f);
            continue;
        }
        const float lse = logsumexp[row];
        for (size_t i = 0; i < V; i++) dl[i] = exp_nonpositive(l[i] - lse) * dloss;
        for (size_t i = V; i < Vp; i++) dl[i] = 0.0f;
        dl[targets[row]] -= dloss;
    }
}

// ---- RMSNorm (with a weight, no bias) ----

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* x = inp + row * C;
        const float mean_sq = static_cast<float>(lane_sum_sq_dev(x, C, 0.0f) / C);
        const float s = 1.0f / std::sqrt(mean_sq + kLayerNormEps);
        float* o = out + row * C;
        for (size_t c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
        rstd[row] = s;
    }
}

// With y = x s and s = (mean x^2 + eps)^-1/2: dx = s (w d - y mean(w d y)); dweight += sum over rows of d y.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, size_t N, size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* d = dout + row * C;
        const float* x = inp + row * C;
        const float s = rstd[row];
        float dy_y_mean = 0.0f;
        for (size_t c = 0; c < C; c++) dy_y_mean += weight[c] * d[c] * x[c] * s;
        dy_y_mean /= C;
        float* di = dinp + row * C;
        for (size_t c = 0; c < C; c++) di[c] += (weight[c] * d[c] - x[c] * s * dy_y_mean) * s;
    }
    const size_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const size_t c0 = blk * kChannelBlock, width = std::min(C, c0 + kChannelBlock) - c0;
        float dw[kChannelBlock] = {};
        for (size_t row = 0; row < N; row++) {
            const float* d = dout + row * C + c0;
            const float* x = inp + row * C + c0;
            const float s = rstd[row];
            for (size_t j = 0; j < width; j++) dw[j] += x[j] * s * d[j];
        }
        for (size_t j = 0; j < width; j++) dweight[c0 + j] += dw[j];
    }
}

// ---- RoPE (GPT-NeoX rotate-half layout, on q and k of each qkv row) ----

namespace {

// Rotates the q and k halves of `rows` consecutive qkv rows at positions position0.. in place, by the table's
// angle (sign +1, the forward) or its negative (sign -1: the transpose, which the backward applies to dq, dk).
void rope_rotate(float* qkv, const float* table, size_t rows, size_t T, size_t position0, size_t C, size_t H,
                 float sign) {
    const size_t hs = C / H, half = hs / 2;
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < rows; row++) {
        const float* angles = table + (position0 + row % T) * half * 2;
        for (size_t part = 0; part < 2; part++) {  // q, then k
            for (size_t h = 0; h < H; h++) {
                float* x = qkv + row * 3 * C + part * C + h * hs;
                for (size_t i = 0; i < half; i++) {
                    const float cos = angles[2 * i], sin = sign * angles[2 * i + 1];
                    const float x1 = x[i], x2 = x[i + half];
                    x[i] = x1 * cos - x2 * sin;
                    x[i + half] = x2 * cos + x1 * sin;
                }
            }
        }
    }
}

}  // namespace

void rope_forward(float* qkv, const float* table, size_t B, size_t T, size_t C, size_t H, size_t position0) {
    rope_rotate(qkv, table, B * T, T, position0, C, H, 1.0f);
}

void rope_backward(float* dqkv, const float* table, size_t B, size_t T, size_t C, size_t H) {
    rope_rotate(dqkv, table, B * T, T, 0, C, H, -1.0f);
}

// ---- SwiGLU (rows of inp: x, then gate, each `width` wide) ----

namespace {

// sigmoid(g) from exp of a non-positive argument, so it vectorizes and never overflows.
inline float sigmoid(float g) {
    const float e = exp_nonpositive(-std::fabs(g));
    return g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

}  // namespace

void swiglu_forward(float* out, const float* inp, size_t N, size_t width) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* x = inp + row * 2 * width;
        const float* gate = x + width;
        float* o = out + row * width;
        for (size_t i = 0; i < width; i++) o[i] = x[i] * gate[i] * sigmoid(gate[i]);
    }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, size_t N, size_t width) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* x = inp + row * 2 * width;
        const float* gate = x + width;
        const float* d = dout + row * width;
        float* dx = dinp + row * 2 * width;
        float* dgate = dx + width;
        for (size_t i = 0; i < width; i++) {
            const float g = gate[i], sg = sigmoid(g);
            dx[i] = d[i] * g * sg;
            dgate[i] = d[i] * x[i] * sg * (1.0f + g * (1.0f - sg));
        }
    }
}

}  // namespace llmc::cpu
