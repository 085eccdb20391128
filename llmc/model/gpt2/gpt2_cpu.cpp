// The CPU GPT-2 (see gpt2_cpu.h): forward/backward kernel pairs and their orchestration. Every matmul is
// cblas_sgemm on a fixed slice of the output per OpenMP thread (never a split of the summed dimension, so
// results do not depend on timing). The other kernels are OpenMP loops in which each output element is
// written by one iteration, and every reduction across rows (bias, LayerNorm, embedding gradients) walks the
// rows in order for a block of channels, so thread scheduling cannot change a single bit. Sums that would be
// serial chains (dot products, softmax denominators) use fixed lane patterns so they vectorize without
// -ffast-math and stay reproducible.
#include "llmc/model/gpt2/gpt2_cpu.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "llmc/base/error.h"
#include "llmc/base/rng.h"

namespace llmc {

namespace {

constexpr float kLayerNormEps = 1e-5f;   // as torch.nn.LayerNorm and llm.c
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi), tanh approximation of GELU
constexpr float kGeluCubic = 0.044715f;
// Reductions over rows are done per block of this many channels: wide enough to vectorize, and C / 64 blocks
// keep both cores busy for every GPT-2 width.
constexpr size_t kChannelBlock = 64;

// Rounds activation sub-buffers to whole cache lines so every tensor starts 64-byte aligned.
constexpr size_t round_up16(size_t n) { return (n + 15) / 16 * 16; }

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

// ---- encoder: token + position embedding ----

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, size_t B, size_t T,
                     size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < B * T; row++) {
        const float* tok = wte + static_cast<size_t>(tokens[row]) * C;
        const float* pos = wpe + (row % T) * C;
        float* o = out + row * C;
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
            float* pos = dwpe + (row % T) * C;
            for (size_t c = c0; c < c1; c++) {
                tok[c] += d[c];
                pos[c] += d[c];
            }
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
        for (size_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
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
            const float dnorm = weight[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float* di = dinp + row * C;
        for (size_t c = 0; c < C; c++) {
            const float norm = (x[c] - m) * s;
            di[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
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

// OpenBLAS (Debian's default build) keeps its own pthread pool, whose idle workers spin and yield for a while
// after each call, while OpenMP's idle workers spin after each parallel loop: alternating the two, as a
// forward pass does hundreds of times, makes them fight over the same cores (measured: up to 2x slower). So
// forward/backward run OpenBLAS single-threaded inside OpenMP's own threads (gemm below) and put the
// library's thread count back when they return.
class SingleThreadedBlas {
public:
    SingleThreadedBlas() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
    ~SingleThreadedBlas() { openblas_set_num_threads(saved_); }
    SingleThreadedBlas(const SingleThreadedBlas&) = delete;
    SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

private:
    int saved_;
};

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

// Per row: logsumexp over the first V logits and the loss at the target. Two passes over a row (max, then
// exp-sum) while it sits in L2.
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
        losses[row] = logsumexp[row] - l[targets[row]];
    }
}

// The mean of the N losses, summed in order.
double mean_loss(const float* losses, size_t N) {
    double total = 0.0;
    for (size_t row = 0; row < N; row++) total += losses[row];
    return total / static_cast<double>(N);
}

// dlogits = dloss * (softmax - onehot(target)) over the first V columns, 0 in the padding (padded logits
// take no part in the loss). One pass per row.
void crossentropy_softmax_backward(float* dlogits, const float* logits, const float* logsumexp,
                                   const int* targets, float dloss, size_t N, size_t V, size_t Vp) {
#pragma omp parallel for schedule(static)
    for (size_t row = 0; row < N; row++) {
        const float* l = logits + row * Vp;
        float* dl = dlogits + row * Vp;
        const float lse = logsumexp[row];
        for (size_t i = 0; i < V; i++) dl[i] = exp_nonpositive(l[i] - lse) * dloss;
        for (size_t i = V; i < Vp; i++) dl[i] = 0.0f;
        dl[targets[row]] -= dloss;
    }
}

uint64_t mix64(uint64_t z) {  // splitmix64 finalizer: decorrelates seeds built from small integers
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

GPT2Cpu::GPT2Cpu(const ModelConfig& config, ModelUse use)
    : config_(config), use_(use), layout_(ParamLayout::gpt2(config)), params_(layout_.num_params, 0.0f),
      grads_(use == ModelUse::training ? layout_.num_params : 0, 0.0f) {
    weights_ = point_weights(layout_, params_.data());
    if (use == ModelUse::training) weight_grads_ = point_weights(layout_, grads_.data());
}

GPT2Cpu::Weights GPT2Cpu::point_weights(const ParamLayout& layout, float* base) {
    auto at = [&](ParamKind kind) { return base + layout.kind_offset[static_cast<int>(kind)]; };
    return Weights{at(ParamKind::wte),      at(ParamKind::wpe),      at(ParamKind::ln1w),    at(ParamKind::ln1b),
                   at(ParamKind::qkvw),     at(ParamKind::qkvb),     at(ParamKind::attprojw),
                   at(ParamKind::attprojb), at(ParamKind::ln2w),     at(ParamKind::ln2b),    at(ParamKind::fcw),
                   at(ParamKind::fcb),      at(ParamKind::fcprojw),  at(ParamKind::fcprojb), at(ParamKind::lnfw),
                   at(ParamKind::lnfb)};
}

void GPT2Cpu::init_random(uint64_t seed) {
    const double residual_std = 0.02 / std::sqrt(2.0 * config_.num_layers);
    const size_t padded_rows_start = static_cast<size_t>(config_.vocab_size) * config_.channels;
    constexpr size_t kBlock = size_t(1) << 16;
    struct Task { size_t tensor, begin, end; };
    std::vector<Task> tasks;
    for (size_t ti = 0; ti < layout_.tensors.size(); ti++)
        for (size_t begin = 0; begin < layout_.tensors[ti].numel; begin += kBlock)
            tasks.push_back({ti, begin, std::min(layout_.tensors[ti].numel, begin + kBlock)});
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t k = 0; k < tasks.size(); k++) {
        const Task& task = tasks[k];
        const ParamTensor& t = layout_.tensors[task.tensor];
        float* p = params_.data() + t.offset;
        const bool is_weight_like = t.is_matrix();  // wte, wpe and every Linear weight
        if (!is_weight_like) {
            const bool is_layernorm_weight = t.kind == ParamKind::ln1w || t.kind == ParamKind::ln2w ||
                                             t.kind == ParamKind::lnfw;
            std::fill(p + task.begin, p + task.end, is_layernorm_weight ? 1.0f : 0.0f);
            continue;
        }
        const double std_dev =
            (t.kind == ParamKind::attprojw || t.kind == ParamKind::fcprojw) ? residual_std : 0.02;
        Rng rng(mix64(seed ^ mix64((static_cast<uint64_t>(task.tensor) << 32) | (task.begin / kBlock))));
        for (size_t i = task.begin; i < task.end; i++) {
            const bool padded_row = t.kind == ParamKind::wte && i >= padded_rows_start;
            p[i] = padded_row ? 0.0f : static_cast<float>(std_dev * rng.normal());
        }
    }
}

void GPT2Cpu::zero_padded_vocab_rows(std::span<float> shared) {
    const size_t C = config_.channels;
    const size_t begin = static_cast<size_t>(config_.vocab_size) * C, end = static_cast<size_t>(config_.padded_vocab_size) * C;
    std::fill(weights_.wte + begin, weights_.wte + end, 0.0f);
    if (shared.empty() || shared.data() == params_.data()) return;
    LLMC_CHECK(shared.size() == params_.size(), "zero_padded_vocab_rows: shared weights of another layout");
    std::fill(shared.begin() + static_cast<std::ptrdiff_t>(layout_.kind_offset[int(ParamKind::wte)] + begin),
              shared.begin() + static_cast<std::ptrdiff_t>(layout_.kind_offset[int(ParamKind::wte)] + end), 0.0f);
}

void GPT2Cpu::zero_grad() {
    LLMC_CHECK(use_ == ModelUse::training, "GPT2Cpu::zero_grad: an inference model has no gradients");
    float* g = grads_.data();
    const size_t n = grads_.size();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] = 0.0f;
}

void GPT2Cpu::prepare_activations(int B, int T) {
    const size_t N = static_cast<size_t>(B) * T, L = kept_layers(), C = config_.channels,
                 H = config_.num_heads, Vp = config_.padded_vocab_size;
    const size_t att = static_cast<size_t>(B) * H * T * T;
    const size_t backward = use_ == ModelUse::training ? 1 : 0;  // an inference model's d* views are empty
    // Order and sizes of the views in Activations; laid out twice: once to count, once to point.
    float* Activations::*const members[] = {
        &Activations::encoded,  &Activations::ln1,       &Activations::ln1_mean,  &Activations::ln1_rstd,
        &Activations::qkv,      &Activations::att,       &Activations::atty,      &Activations::residual2,
        &Activations::ln2,      &Activations::ln2_mean,  &Activations::ln2_rstd,  &Activations::fch,
        &Activations::fch_gelu, &Activations::residual3, &Activations::lnf,       &Activations::lnf_mean,
        &Activations::lnf_rstd, &Activations::logits,    &Activations::last_logits, &Activations::logsumexp,
        &Activations::losses,   &Activations::dlogits,   &Activations::dresidual, &Activations::dln,
        &Activations::datty,    &Activations::dqkv,      &Activations::dfch,      &Activations::datt_row,
    };
    const size_t logit_rows = backward ? N : std::min(N, kClassifierRows);
    const size_t sizes[] = {
        N * C,  L * N * C, L * N,     L * N,     L * N * 3 * C, L * att,   L * N * C,
        L * N * C, L * N * C, L * N,  L * N,     L * N * 4 * C, L * N * 4 * C, L * N * C,
        N * C,  N,         N,         logit_rows * Vp, size_t(B) * Vp, N, N,     backward * N * Vp,
        backward * N * C, backward * N * C, backward * N * C, backward * N * 3 * C, backward * N * 4 * C,
        backward * B * H * T,
    };
    static_assert(std::size(members) == std::size(sizes));
    size_t total = 0;
    for (size_t s : sizes) total += round_up16(s);
    if (total > act_capacity_) {
        act_memory_.reset();  // free the old block before asking for the larger one
        float* block = static_cast<float*>(allocate_large(total * sizeof(float)));
        LLMC_CHECK(block != nullptr, "GPT2Cpu: cannot allocate " + std::to_string(total * sizeof(float) >> 20) +
                                         " MiB of activations for B=" + std::to_string(B) + " T=" +
                                         std::to_string(T));
        act_memory_.reset(block);
        act_capacity_ = total;
    }
    float* cursor = act_memory_.get();
    for (size_t i = 0; i < std::size(members); i++) {
        acts_.*members[i] = cursor;
        cursor += round_up16(sizes[i]);
    }
    batch_ = B;
    seq_len_ = T;
    num_tokens_ = N;
}

float GPT2Cpu::forward(const int* inputs, const int* targets, int B, int T) {
    return run_forward(inputs, targets, B, T, false);
}

float GPT2Cpu::run_forward(const int* inputs, const int* targets, int B, int T, bool fill_cache) {
    LLMC_CHECK(B > 0 && T > 0, "GPT2Cpu::forward: batch size and sequence length must be positive (B=" +
                                   std::to_string(B) + " T=" + std::to_string(T) + ")");
    LLMC_CHECK(T <= config_.max_seq_len, "GPT2Cpu::forward: sequence length T=" + std::to_string(T) +
                                             " exceeds the model's max_seq_len " +
                                             std::to_string(config_.max_seq_len));
    const size_t N = static_cast<size_t>(B) * T;
    const int V = config_.vocab_size;
    for (size_t i = 0; i < N; i++) {
        LLMC_CHECK(inputs[i] >= 0 && inputs[i] < V, "GPT2Cpu::forward: input token id " + std::to_string(inputs[i]) +
                                                        " at position " + std::to_string(i) +
                                                        " is outside the vocabulary [0, " + std::to_string(V) + ")");
        LLMC_CHECK(targets == nullptr || (targets[i] >= 0 && targets[i] < V),
                   "GPT2Cpu::forward: target token id " + std::to_string(targets[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
    prepare_activations(B, T);
    const SingleThreadedBlas single_threaded_blas;
    inputs_.assign(inputs, inputs + N);
    have_targets_ = targets != nullptr;
    if (have_targets_) targets_.assign(targets, targets + N);

    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 Vp = config_.padded_vocab_size;
    const Weights& w = weights_;
    const Activations& a = acts_;
    const size_t NC = N * C, att_per_layer = static_cast<size_t>(B) * H * T * T;

    // Layer l's activations go to slot s: its own in a training model, the one slot in an inference model (the
    // residual3 a layer reads is overwritten only by that layer's last matmul, which no longer needs it).
    const size_t slots = kept_layers();
    encoder_forward(a.encoded, inputs_.data(), w.wte, w.wpe, B, T, C);
    for (size_t l = 0; l < L; l++) {
        const size_t s = l % slots;
        const float* residual = l == 0 ? a.encoded : a.residual3 + ((l - 1) % slots) * NC;
        float* ln1 = a.ln1 + s * NC;
        float* qkv = a.qkv + s * 3 * NC;
        float* atty = a.atty + s * NC;
        float* residual2 = a.residual2 + s * NC;
        float* ln2 = a.ln2 + s * NC;
        float* fch = a.fch + s * 4 * NC;
        float* fch_gelu = a.fch_gelu + s * 4 * NC;
        layernorm_forward(ln1, a.ln1_mean + s * N, a.ln1_rstd + s * N, residual, w.ln1w + l * C, w.ln1b + l * C,
                          N, C);
        matmul_forward(qkv, ln1, w.qkvw + l * 3 * C * C, w.qkvb + l * 3 * C, nullptr, N, C, 3 * C);
        if (fill_cache) cache_keys_values(l, qkv, N);
        attention_forward(atty, a.att + s * att_per_layer, qkv, B, T, C, H);
        matmul_forward(residual2, atty, w.attprojw + l * C * C, w.attprojb + l * C, residual, N, C, C);
        layernorm_forward(ln2, a.ln2_mean + s * N, a.ln2_rstd + s * N, residual2, w.ln2w + l * C, w.ln2b + l * C,
                          N, C);
        matmul_forward(fch, ln2, w.fcw + l * 4 * C * C, w.fcb + l * 4 * C, nullptr, N, C, 4 * C);
        gelu_forward(fch_gelu, fch, 4 * NC);
        matmul_forward(a.residual3 + s * NC, fch_gelu, w.fcprojw + l * 4 * C * C, w.fcprojb + l * C, residual2,
                       N, 4 * C, C);
    }
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + ((L - 1) % slots) * NC, w.lnfw, w.lnfb, N, C);
    // The classifier, kClassifierRows rows at a time: into their place in a training model's logits (the backward
    // reads them all), into the one block of an inference model's. Both cut the rows alike, so that their bits
    // agree: OpenBLAS rounds a row differently in matrices of different heights (it has kernels for small ones).
    const size_t block = std::min(N, kClassifierRows), Tn = size_t(T);
    for (size_t r0 = 0; r0 < N; r0 += block) {
        const size_t rows = std::min(block, N - r0);
        float* logits = use_ == ModelUse::training ? a.logits + r0 * Vp : a.logits;
        matmul_forward(logits, a.lnf + r0 * C, w.wte, nullptr, nullptr, rows, C, Vp);
        if (have_targets_)
            crossentropy_forward(a.losses + r0, a.logsumexp + r0, logits, targets_.data() + r0, rows,
                                 config_.vocab_size, Vp);
        for (size_t b = r0 / Tn; b < size_t(B) && b * Tn + Tn - 1 < r0 + rows; b++)
            std::memcpy(a.last_logits + b * Vp, logits + (b * Tn + Tn - 1 - r0) * Vp, Vp * sizeof(float));
    }
    return have_targets_ ? static_cast<float>(mean_loss(a.losses, N)) : 0.0f;
}

void GPT2Cpu::prepare_token_cache() {
    if (cache_memory_) return;
    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 T = config_.max_seq_len, Vp = config_.padded_vocab_size;
    float* TokenCache::*const members[] = {
        &TokenCache::keys, &TokenCache::values,  &TokenCache::x,        &TokenCache::residual2, &TokenCache::ln,
        &TokenCache::ln_mean, &TokenCache::ln_rstd, &TokenCache::qkv,   &TokenCache::atty,      &TokenCache::fch,
        &TokenCache::fch_gelu, &TokenCache::att,   &TokenCache::logits,
    };
    const size_t sizes[] = {L * T * C, L * T * C, C, C, C, 1, 1, 3 * C, C, 4 * C, 4 * C, H * T, Vp};
    static_assert(std::size(members) == std::size(sizes));
    size_t total = 0;
    for (size_t n : sizes) total += round_up16(n);
    float* block = static_cast<float*>(allocate_large(total * sizeof(float)));
    LLMC_CHECK(block != nullptr, "GPT2Cpu: cannot allocate " + std::to_string(total * sizeof(float) >> 20) +
                                     " MiB for the key/value cache");
    cache_memory_.reset(block);
    for (size_t i = 0; i < std::size(members); i++) {
        cache_.*members[i] = block;
        block += round_up16(sizes[i]);
    }
}

std::span<const float> GPT2Cpu::start_sequence(std::span<const int> tokens) {
    LLMC_CHECK(!tokens.empty(), "GPT2Cpu::start_sequence: no tokens");
    const int T = static_cast<int>(tokens.size());
    prepare_token_cache();
    cached_tokens_ = 0;  // until the forward has filled the cache
    run_forward(tokens.data(), nullptr, 1, T, true);  // checks T and the token ids
    cached_tokens_ = T;
    return last_logits();
}

void GPT2Cpu::cache_keys_values(size_t layer, const float* qkv, size_t tokens) {
    const size_t C = config_.channels, max_T = config_.max_seq_len;
    for (size_t t = 0; t < tokens; t++) {
        const float* qkv_row = qkv + t * 3 * C;
        std::memcpy(cache_.keys + (layer * max_T + t) * C, qkv_row + C, C * sizeof(float));
        std::memcpy(cache_.values + (layer * max_T + t) * C, qkv_row + 2 * C, C * sizeof(float));
    }
}

std::span<const float> GPT2Cpu::continue_sequence(std::span<const int> context, int window) {
    LLMC_CHECK(window >= 1 && window <= config_.max_seq_len && !context.empty(),
               "GPT2Cpu::continue_sequence: no context, or window " + std::to_string(window) +
                   " outside [1, max_seq_len]");
    if (cached_tokens_ < window) return append(context.back());
    return start_sequence(context.last(std::min(context.size(), static_cast<size_t>(window))));
}

void GPT2Cpu::truncate_sequence(int n) {
    LLMC_CHECK(n >= 1 && n <= cached_tokens_, "GPT2Cpu::truncate_sequence: " + std::to_string(n) +
                                                  " is not in [1, " + std::to_string(cached_tokens_) + "]");
    cached_tokens_ = n;
}

std::span<const float> GPT2Cpu::append(int token) {
    LLMC_CHECK(cached_tokens_ > 0, "GPT2Cpu::append: needs a start_sequence() first");
    LLMC_CHECK(cached_tokens_ < config_.max_seq_len, "GPT2Cpu::append: the sequence already holds max_seq_len " +
                                                         std::to_string(config_.max_seq_len) + " tokens");
    LLMC_CHECK(token >= 0 && token < config_.vocab_size,
               "GPT2Cpu::append: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                   std::to_string(config_.vocab_size) + ")");
    const SingleThreadedBlas single_threaded_blas;
    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 max_T = config_.max_seq_len, Vp = config_.padded_vocab_size, position = cached_tokens_;
    const Weights& w = weights_;
    const TokenCache& c = cache_;
    encoder_forward(c.x, &token, w.wte, w.wpe + position * C, 1, 1, C);
    for (size_t l = 0; l < L; l++) {
        float* keys = c.keys + l * max_T * C;
        float* values = c.values + l * max_T * C;
        layernorm_forward(c.ln, c.ln_mean, c.ln_rstd, c.x, w.ln1w + l * C, w.ln1b + l * C, 1, C);
        matmul_forward(c.qkv, c.ln, w.qkvw + l * 3 * C * C, w.qkvb + l * 3 * C, nullptr, 1, C, 3 * C);
        std::memcpy(keys + position * C, c.qkv + C, C * sizeof(float));
        std::memcpy(values + position * C, c.qkv + 2 * C, C * sizeof(float));
        attention_forward_cached(c.atty, c.att, c.qkv, keys, values, position + 1, C, H);
        matmul_forward(c.residual2, c.atty, w.attprojw + l * C * C, w.attprojb + l * C, c.x, 1, C, C);
        layernorm_forward(c.ln, c.ln_mean, c.ln_rstd, c.residual2, w.ln2w + l * C, w.ln2b + l * C, 1, C);
        matmul_forward(c.fch, c.ln, w.fcw + l * 4 * C * C, w.fcb + l * 4 * C, nullptr, 1, C, 4 * C);
        gelu_forward(c.fch_gelu, c.fch, 4 * C);
        matmul_forward(c.x, c.fch_gelu, w.fcprojw + l * 4 * C * C, w.fcprojb + l * C, c.residual2, 1, 4 * C, C);
    }
    layernorm_forward(c.ln, c.ln_mean, c.ln_rstd, c.x, w.lnfw, w.lnfb, 1, C);
    matmul_forward(c.logits, c.ln, w.wte, nullptr, nullptr, 1, C, Vp);
    cached_tokens_++;
    return {c.logits, Vp};
}

void GPT2Cpu::backward(float loss_scale, const GradsFinal& on_final, std::span<const ParamRange> wte_early) {
    LLMC_CHECK(use_ == ModelUse::training, "GPT2Cpu::backward: an inference model has no gradients");
    LLMC_CHECK(have_targets_, "GPT2Cpu::backward: needs a preceding forward() with targets");
    const size_t B = batch_, T = seq_len_, N = num_tokens_, L = config_.num_layers, C = config_.channels,
                 H = config_.num_heads, V = config_.vocab_size, Vp = config_.padded_vocab_size;
    const size_t NC = N * C, att_per_layer = B * H * T * T;
    const Weights& w = weights_;
    const Weights& g = weight_grads_;
    const Activations& a = acts_;
    const SingleThreadedBlas single_threaded_blas;

    const float dloss = loss_scale / static_cast<float>(N);
    crossentropy_softmax_backward(a.dlogits, a.logits, a.logsumexp, targets_.data(), dloss, N, V, Vp);
    // The classifier's weight gradient before its input gradient, so that the early wte rows travel during the
    // input gradient's product too.
    matmul_backward(nullptr, g.wte, nullptr, a.dlogits, a.lnf, w.wte, N, C, Vp);
    if (on_final && !wte_early.empty()) {
        LLMC_CHECK(layout_.wte_rows_untouched(wte_early, inputs_),
                   "GPT2Cpu::backward: an early wte range holds a row this batch's input tokens use");
        on_final(wte_early);
    }
    matmul_backward(a.dln, nullptr, nullptr, a.dlogits, a.lnf, w.wte, N, C, Vp);
    std::memset(a.dresidual, 0, NC * sizeof(float));
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, a.dln, a.residual3 + (L - 1) * NC, w.lnfw, a.lnf_mean,
                       a.lnf_rstd, N, C);

    // dresidual holds the gradient of this layer's output; each sub-block adds its input gradient to it.
    for (size_t l = L; l-- > 0;) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
        matmul_backward(a.dfch, g.fcprojw + l * 4 * C * C, g.fcprojb + l * C, a.dresidual, a.fch_gelu + l * 4 * NC,
                        w.fcprojw + l * 4 * C * C, N, 4 * C, C);
        gelu_backward(a.dfch, a.fch + l * 4 * NC, 4 * NC);
        matmul_backward(a.dln, g.fcw + l * 4 * C * C, g.fcb + l * 4 * C, a.dfch, a.ln2 + l * NC,
                        w.fcw + l * 4 * C * C, N, C, 4 * C);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, a.dln, a.residual2 + l * NC,
                           w.ln2w + l * C, a.ln2_mean + l * N, a.ln2_rstd + l * N, N, C);
        matmul_backward(a.datty, g.attprojw + l * C * C, g.attprojb + l * C, a.dresidual, a.atty + l * NC,
                        w.attprojw + l * C * C, N, C, C);
        attention_backward(a.dqkv, a.datt_row, a.datty, a.qkv + l * 3 * NC, a.att + l * att_per_layer, B, T, C, H);
        matmul_backward(a.dln, g.qkvw + l * 3 * C * C, g.qkvb + l * 3 * C, a.dqkv, a.ln1 + l * NC,
                        w.qkvw + l * 3 * C * C, N, C, 3 * C);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, a.dln, residual, w.ln1w + l * C,
                           a.ln1_mean + l * N, a.ln1_rstd + l * N, N, C);
        if (on_final) on_final(layout_.backward_ranges_of_layer(static_cast<int>(l)));
    }
    encoder_backward(g.wte, g.wpe, a.dresidual, inputs_.data(), B, T, C);
    if (on_final) on_final(layout_.backward_ranges_of_embeddings(wte_early));
}

}  // namespace llmc
