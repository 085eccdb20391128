// Double-precision host references for OLMo's CUDA kernels (llmc/cuda/rope.cuh, swiglu.cuh, norms.cuh), written
// from the formulas and not from the kernels or kernel_math.h: plain loops, every intermediate in double, the
// rotary angles computed here rather than read from the shared table. The emulated-device test
// (test/emulated/test_olmo_kernels_emu.cpp) and the GPU checkers (dev/cuda/rope.cu, swiglu.cu, norms.cu) compare
// the kernels with them.
#pragma once
#include <cmath>
#include <vector>

namespace olmo_ref {

// RoPE on qkv (B, T, 3C), NeoX "rotate half" layout, v copied. backward: the transposed rotation on dqkv.
inline std::vector<double> rope(const std::vector<float>& qkv, int B, int T, int C, int NH, double theta,
                                bool backward = false) {
    std::vector<double> out(qkv.begin(), qkv.end());
    const int hs = C / NH, half = hs / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int part = 0; part < 2; part++)
                for (int h = 0; h < NH; h++)
                    for (int i = 0; i < half; i++) {
                        const double angle = t * std::pow(theta, -2.0 * i / hs);
                        const double c = std::cos(angle), s = backward ? -std::sin(angle) : std::sin(angle);
                        const size_t at = (size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * hs + i;
                        const double x1 = qkv[at], x2 = qkv[at + half];
                        out[at] = x1 * c - x2 * s;
                        out[at + half] = x2 * c + x1 * s;
                    }
    return out;
}

inline double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// fch (N, 2H) = [x | gate] -> out (N, H) = gate * sigmoid(gate) * x
inline std::vector<double> swiglu_forward(const std::vector<float>& fch, int N, int H) {
    std::vector<double> out(size_t(N) * H);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            const double x = fch[size_t(n) * 2 * H + j], g = fch[size_t(n) * 2 * H + H + j];
            out[size_t(n) * H + j] = g * sigmoid(g) * x;
        }
    return out;
}

// dfch (N, 2H) from dout (N, H): d/dx = dout silu(g); d/dg = dout x (sigmoid(g) + g sigmoid(g) (1 - sigmoid(g)))
inline std::vector<double> swiglu_backward(const std::vector<float>& dout, const std::vector<float>& fch, int N, int H) {
    std::vector<double> dfch(size_t(N) * 2 * H);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            const size_t at = size_t(n) * 2 * H + j;
            const double x = fch[at], g = fch[at + H], d = dout[size_t(n) * H + j], s = sigmoid(g);
            dfch[at] = d * g * s;
            dfch[at + H] = d * x * (s + g * s * (1.0 - s));
        }
    return dfch;
}

struct NormForward {
    std::vector<double> out, mean, rstd;  // mean: LayerNorm only
};

// rms false: LayerNorm without affine parameters, (x - mean) / sqrt(var + eps). rms true: RMSNorm,
// x / sqrt(mean(x^2) + eps) * w.
inline NormForward norm_forward(const std::vector<float>& x, const std::vector<float>& w, int N, int C, bool rms,
                                double eps = 1e-5) {
    NormForward r{std::vector<double>(size_t(N) * C), std::vector<double>(N), std::vector<double>(N)};
    for (int n = 0; n < N; n++) {
        const float* row = &x[size_t(n) * C];
        double mean = 0.0, sq = 0.0;
        if (!rms) {
            for (int c = 0; c < C; c++) mean += row[c];
            mean /= C;
        }
        for (int c = 0; c < C; c++) sq += (row[c] - mean) * (row[c] - mean);
        const double rstd = 1.0 / std::sqrt(sq / C + eps);
        for (int c = 0; c < C; c++) r.out[size_t(n) * C + c] = (row[c] - mean) * rstd * (rms ? double(w[c]) : 1.0);
        r.mean[n] = mean;
        r.rstd[n] = rstd;
    }
    return r;
}

struct NormBackward {
    std::vector<double> dinp, dweight;  // dinp: dinp0 + dx; dweight: dweight0 + sum (RMSNorm only)
};

// The gradient through the norm by its Jacobian written out: y_i = (x_i - mu) r w_i with r = (var + eps)^(-1/2)
// (mu = 0 and var = mean(x^2) for RMSNorm, w = 1 for the LayerNorm), so
// dx_j = r (g_j - mean(g) - n_j mean(g n)) with g = w dout, n = (x - mu) r; RMSNorm has no mean(g) term.
inline NormBackward norm_backward(const std::vector<float>& dinp0, const std::vector<float>& dout,
                                  const std::vector<float>& x, const std::vector<float>& w,
                                  const std::vector<float>& dweight0, int N, int C, bool rms, double eps = 1e-5) {
    NormBackward r{std::vector<double>(dinp0.begin(), dinp0.end()),
                   std::vector<double>(dweight0.begin(), dweight0.end())};
    const NormForward f = norm_forward(x, w, N, C, rms, eps);
    for (int n = 0; n < N; n++) {
        const size_t o = size_t(n) * C;
        double g_mean = 0.0, gn_mean = 0.0;
        for (int c = 0; c < C; c++) {
            const double g = (rms ? double(w[c]) : 1.0) * dout[o + c], nrm = (x[o + c] - f.mean[n]) * f.rstd[n];
            g_mean += g / C;
            gn_mean += g * nrm / C;
        }
        for (int c = 0; c < C; c++) {
            const double g = (rms ? double(w[c]) : 1.0) * dout[o + c], nrm = (x[o + c] - f.mean[n]) * f.rstd[n];
            r.dinp[o + c] += f.rstd[n] * (g - (rms ? 0.0 : g_mean) - nrm * gn_mean);
            if (rms) r.dweight[c] += double(dout[o + c]) * nrm;
        }
    }
    return r;
}

}  // namespace olmo_ref
