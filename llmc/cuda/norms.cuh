// OLMo's two norms over the channel dimension, one warp per row, in a file of their own so that GPT-2's
// layernorm.cuh keeps its tuned kernels unchanged:
//  - LayerNorm without affine parameters (OLMo-1's "non-parametric" LayerNorm): out = (x - mean) * rstd, biased
//    variance, keeps mean and rstd (fp32) for the backward.
//  - RMSNorm with a weight and no bias (OLMo-2): out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); keeps rstd.
// Both have the fused-residual forward of layernorm.cuh (residual = inp1 + inp2 rounded to floatX, then the
// norm of that residual, in one pass), and backwards that ADD dx into dinp, as layernorm_backward does (dinp is
// the residual stream's gradient, which the skip connection already holds). RMSNorm's dweight (fp32) is a
// deterministic column reduction (cuda_common.cuh's machinery; no atomics), written or added to (accumulate).
// The row statistics are two-pass for LayerNorm (mean, then squared deviations) and one-pass for RMSNorm, in
// fp32; the per-element maths is km::norm_rstd / layernorm_dx / rmsnorm_dx (kernel_math.h, shared with the CPU).
#pragma once
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

// The kernels' template switch (not model_config.h's NormKind, whose layernorm is GPT-2's affine one too).
enum class NormKernel { LayerNorm, RmsNorm };  // LayerNorm: no weight, no bias

inline constexpr int kNormBlock = 256;  // 8 rows (warps) per block; the backward's 8 warps are the reduction's rows
static_assert(kNormBlock / kWarpSize == kColumnReduceThreadsY, "one warp per row of the column reduction's block");

// x128 slices per lane with the row held in registers (1, 2, 3, 4, 8 or 16; OLMo-7B's C = 4096 in bf16 takes 16),
// or 0 for the scalar, strided kernels (C not a multiple of x128::size, a buffer not 16-byte aligned, or C over
// 16 * 32 * x128::size).
inline int norm_lane_vecs(int C, bool aligned) {
    if (C % x128::size != 0 || !aligned) return 0;
    const int v = ceil_div(C, kWarpSize * x128::size);
    return v <= 4 ? v : v <= 8 ? 8 : v <= 16 ? 16 : 0;
}

// The backward's weight-gradient partials fused into its dinp pass up to 8 slices per lane; above that their
// accumulators would spill, and the column reduction reads dout and inp again instead.
inline constexpr int kNormFusedPartialsMaxVecs = 8;

template <NormKernel kKind>
__device__ __forceinline__ float norm_apply(float x, float mean, float rstd, float w) {
    if constexpr (kKind == NormKernel::LayerNorm) return (x - mean) * rstd;
    else return x * rstd * w;
}

// VECS = 0: strided over the row, re-reading it for each pass. VECS > 0: each lane loads its VECS x128 slices
// once (the residual sum computed and stored on the way) and keeps them in registers for the statistics and the
// output. mean_out (LayerNorm only) and rstd_out may be nullptr.
template <NormKernel kKind, bool kResidual, int VECS>
__global__ void __launch_bounds__(kNormBlock) norm_forward_kernel(floatX* out, float* mean_out, float* rstd_out,
                                                                  floatX* residual, const floatX* inp1,
                                                                  const floatX* inp2, const floatX* weight, int N,
                                                                  int C, float eps) {
    constexpr bool kLayerNorm = kKind == NormKernel::LayerNorm;
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    float mean = 0.0f, rstd;
    if constexpr (VECS > 0) {
        x128 xv[VECS];
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            if constexpr (kResidual) {
                const x128 a = load128(inp1 + base + c), b = load128(inp2 + base + c);
#pragma unroll
                for (int k = 0; k < x128::size; k++) xv[v].v[k] = from_float<floatX>(a.f(k) + b.f(k));
                store128(residual + base + c, xv[v]);
            } else {
                xv[v] = load128(inp1 + base + c);
            }
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum += kLayerNorm ? xv[v].f(k) : xv[v].f(k) * xv[v].f(k);
        }
        if constexpr (kLayerNorm) {
            mean = warp_sum(sum) / C;
            float sq = 0.0f;
#pragma unroll
            for (int v = 0; v < VECS; v++) {
                if ((v * kWarpSize + lane) * x128::size >= C) continue;
#pragma unroll
                for (int k = 0; k < x128::size; k++) {
                    const float d = xv[v].f(k) - mean;
                    sq += d * d;
                }
            }
            rstd = km::norm_rstd(warp_sum(sq) / C, eps);
        } else {
            rstd = km::norm_rstd(warp_sum(sum) / C, eps);
        }
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            x128 w{};
            if constexpr (!kLayerNorm) w = load128(weight + c);
            x128 o;
#pragma unroll
            for (int k = 0; k < x128::size; k++)
                o.v[k] = from_float<floatX>(norm_apply<kKind>(xv[v].f(k), mean, rstd, kLayerNorm ? 1.0f : w.f(k)));
            store128(out + base + c, o);
        }
    } else {
        // x: the row being normalized (the residual sum when fused; each lane re-reads only what it wrote itself)
        const floatX* x = kResidual ? residual + base : inp1 + base;
        float sum = 0.0f;
        for (int c = lane; c < C; c += kWarpSize) {
            float v;
            if constexpr (kResidual) {
                const floatX r = from_float<floatX>(to_float(inp1[base + c]) + to_float(inp2[base + c]));
                residual[base + c] = r;
                v = to_float(r);
            } else {
                v = to_float(x[c]);
            }
            sum += kLayerNorm ? v : v * v;
        }
        if constexpr (kLayerNorm) {
            mean = warp_sum(sum) / C;
            float sq = 0.0f;
            for (int c = lane; c < C; c += kWarpSize) {
                const float d = to_float(x[c]) - mean;
                sq += d * d;
            }
            rstd = km::norm_rstd(warp_sum(sq) / C, eps);
        } else {
            rstd = km::norm_rstd(warp_sum(sum) / C, eps);
        }
        for (int c = lane; c < C; c += kWarpSize)
            out[base + c] = from_float<floatX>(
                norm_apply<kKind>(to_float(x[c]), mean, rstd, kLayerNorm ? 1.0f : to_float(weight[c])));
    }
    if (lane == 0) {
        if (kLayerNorm && mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

template <NormKernel kKind, bool kResidual>
inline void launch_norm_forward(floatX* out, float* mean, float* rstd, floatX* residual, const floatX* inp1,
                                const floatX* inp2, const floatX* weight, int N, int C, float eps, cudaStream_t stream) {
    if (N == 0) return;
    const unsigned blocks = unsigned(ceil_div(N, kNormBlock / kWarpSize));
    const bool aligned = aligned16(out) && aligned16(inp1) && (kKind == NormKernel::LayerNorm || aligned16(weight)) &&
                         (!kResidual || (aligned16(residual) && aligned16(inp2)));
    auto launch = [&](auto kernel) {
        LLMC_LAUNCH(blocks, kNormBlock, 0, stream, kernel)(out, mean, rstd, residual, inp1, inp2, weight, N, C, eps);
    };
    switch (norm_lane_vecs(C, aligned)) {
        case 1: launch(norm_forward_kernel<kKind, kResidual, 1>); break;
        case 2: launch(norm_forward_kernel<kKind, kResidual, 2>); break;
        case 3: launch(norm_forward_kernel<kKind, kResidual, 3>); break;
        case 4: launch(norm_forward_kernel<kKind, kResidual, 4>); break;
        case 8: launch(norm_forward_kernel<kKind, kResidual, 8>); break;
        case 16: launch(norm_forward_kernel<kKind, kResidual, 16>); break;
        default: launch(norm_forward_kernel<kKind, kResidual, 0>); break;
    }
    CUDA_CHECK_LAUNCH();
}

// The row sums of the backward and dx of one element: norm = (x - mean) * rstd and dnorm = dout (LayerNorm), or
// norm = x * rstd and dnorm = w * dout (RMSNorm).
template <NormKernel kKind>
struct NormRowGrad {
    float mean, rstd;
    __device__ float norm(float x) const {
        if constexpr (kKind == NormKernel::LayerNorm) return (x - mean) * rstd;
        else return x * rstd;
    }
    __device__ static float dnorm(float d, float w) {
        if constexpr (kKind == NormKernel::LayerNorm) return d;
        else return w * d;
    }
    __device__ float dx(float dn, float n, float dnorm_mean, float dnorm_norm_mean) const {
        if constexpr (kKind == NormKernel::LayerNorm) return km::layernorm_dx(dn, n, dnorm_mean, dnorm_norm_mean, rstd);
        else return km::rmsnorm_dx(dn, n, dnorm_norm_mean, rstd);
    }
};

// dinp += dx, strided over each row (any C, any alignment). grid ceil(N / 8), kNormBlock threads.
template <NormKernel kKind>
__global__ void norm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp, const floatX* weight,
                                          const float* mean, const float* rstd, int N, int C) {
    constexpr bool kLayerNorm = kKind == NormKernel::LayerNorm;
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    const NormRowGrad<kKind> g{kLayerNorm ? mean[row] : 0.0f, rstd[row]};
    float s_dnorm = 0.0f, s_dnorm_norm = 0.0f;
    for (int c = lane; c < C; c += kWarpSize) {
        const float dn = g.dnorm(to_float(dout[base + c]), kLayerNorm ? 1.0f : to_float(weight[c]));
        s_dnorm += dn;
        s_dnorm_norm += dn * g.norm(to_float(inp[base + c]));
    }
    const float dnorm_mean = warp_sum(s_dnorm) / C, dnorm_norm_mean = warp_sum(s_dnorm_norm) / C;
    for (int c = lane; c < C; c += kWarpSize) {
        const float dn = g.dnorm(to_float(dout[base + c]), kLayerNorm ? 1.0f : to_float(weight[c]));
        const float dx = g.dx(dn, g.norm(to_float(inp[base + c])), dnorm_mean, dnorm_norm_mean);
        dinp[base + c] = from_float<floatX>(to_float(dinp[base + c]) + dx);
    }
}

// dinp += dx with 128-bit loads. With kPartials (RMSNorm, VECS <= kNormFusedPartialsMaxVecs) a block owns one
// split of kColumnReduceRowsPerSplit rows (the column reduction's), warp w its rows r0 + w, r0 + w + 8, ... (the
// reduction's thread row y = w), and each lane also sums its columns' dweight terms dout * norm over its rows;
// the 8 warps' sums go through shared memory in warp order into `partial` (split, C): the same additions in the
// same order as column_reduce_stage1_kernel with RmsNormWeightGrad, so column_reduce_finish then gives the bits
// of the unfused path without reading dout and inp again. Without partials a block takes 8 rows, one per warp
// (8 times the blocks: more warps in flight). Up to 4 slices a lane keeps inp and dout in registers between the
// row-sum pass and the dx pass; above that it reads them again (from L1).
__host__ __device__ constexpr int norm_backward_rows_per_block(bool partials) {
    return partials ? kColumnReduceRowsPerSplit : kNormBlock / kWarpSize;
}
template <NormKernel kKind, int VECS, bool kPartials>
__global__ void __launch_bounds__(kNormBlock) norm_backward_kernel(floatX* dinp, float* partial, const floatX* dout,
                                                                   const floatX* inp, const floatX* weight,
                                                                   const float* mean, const float* rstd, int N, int C) {
    constexpr bool kLayerNorm = kKind == NormKernel::LayerNorm;
    static_assert(!(kPartials && kLayerNorm), "the affine-free LayerNorm has no parameter gradient");
    constexpr bool kHold = VECS <= 4;
    constexpr int kHeld = kHold ? VECS : 1;
    constexpr int kAcc = kPartials ? VECS : 1;
    __shared__ float sums[kPartials ? VECS * kWarpSize * x128::size : 1];
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    constexpr int kRows = norm_backward_rows_per_block(kPartials);
    const int r0 = blockIdx.x * kRows, r1 = min(N, r0 + kRows);
    float acc[kAcc][x128::size];
#pragma unroll
    for (int v = 0; v < kAcc; v++)
#pragma unroll
        for (int k = 0; k < x128::size; k++) acc[v][k] = 0.0f;
    for (int i = 0; i < kRows / kColumnReduceThreadsY; i++) {
        const int row = r0 + warp + i * kColumnReduceThreadsY;
        if (row >= r1) break;
        const size_t base = size_t(row) * C;
        const NormRowGrad<kKind> g{kLayerNorm ? mean[row] : 0.0f, rstd[row]};
        x128 xi[kHeld] = {}, xd[kHeld] = {};
        float s_dnorm = 0.0f, s_dnorm_norm = 0.0f;
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            const int h = kHold ? v : 0;
            xi[h] = load128(inp + base + c);
            xd[h] = load128(dout + base + c);
            x128 w{};
            if constexpr (!kLayerNorm) w = load128(weight + c);
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                const float dn = g.dnorm(xd[h].f(k), kLayerNorm ? 1.0f : w.f(k));
                s_dnorm += dn;
                s_dnorm_norm += dn * g.norm(xi[h].f(k));
            }
        }
        const float dnorm_mean = warp_sum(s_dnorm) / C, dnorm_norm_mean = warp_sum(s_dnorm_norm) / C;
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            const int h = kHold ? v : 0;
            if constexpr (!kHold) {
                xi[h] = load128(inp + base + c);
                xd[h] = load128(dout + base + c);
            }
            x128 w{};
            if constexpr (!kLayerNorm) w = load128(weight + c);
            const x128 old = load128(dinp + base + c);
            x128 o;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                const float d = xd[h].f(k), n = g.norm(xi[h].f(k));
                const float dn = g.dnorm(d, kLayerNorm ? 1.0f : w.f(k));
                o.v[k] = from_float<floatX>(old.f(k) + g.dx(dn, n, dnorm_mean, dnorm_norm_mean));
                if constexpr (kPartials) acc[v][k] += __fmul_rn(d, n);  // RmsNormWeightGrad's term
            }
            store128(dinp + base + c, o);
        }
    }
    if constexpr (kPartials) {
        // the warps' sums in warp order (s = 0 + w0 + w1 + ..., as column_reduce_stage1_kernel adds its rows y)
        for (int w = 0; w < kColumnReduceThreadsY; w++) {
            if (warp == w)
#pragma unroll
                for (int v = 0; v < VECS; v++) {
                    const int c = (v * kWarpSize + lane) * x128::size;
                    if (c >= C) continue;
#pragma unroll
                    for (int k = 0; k < x128::size; k++) sums[c + k] = (w == 0 ? 0.0f : sums[c + k]) + acc[v][k];
                }
            __syncthreads();
        }
        for (int c = threadIdx.x; c < C; c += kNormBlock) partial[size_t(blockIdx.x) * C + c] = sums[c];
    }
}

// RMSNorm's dweight term of one element, dout * (x * rstd), for column_reduce. The product is rounded before it
// is added (__fmul_rn: never contracted into an FMA), so the fused partials and this functor give the same bits.
struct RmsNormWeightGrad {
    const floatX* dout;
    const floatX* inp;
    const float* rstd;
    int C;
    template <int VEC>
    __device__ void load(int r, int c, float (&v)[1][VEC]) const {
        const size_t i = size_t(r) * C + c;
        const float s = rstd[r];
        if constexpr (VEC == 1) {
            v[0][0] = __fmul_rn(to_float(dout[i]), to_float(inp[i]) * s);
        } else {
            static_assert(VEC == x128::size, "scalar or 128-bit");
            const x128 d = load128(dout + i), x = load128(inp + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) v[0][j] = __fmul_rn(d.f(j), x.f(j) * s);
        }
    }
    bool aligned() const { return aligned16(dout) && aligned16(inp); }
};

// dinp += dx for either norm; with dweight (RMSNorm) also its column sums, written or added (accumulate).
template <NormKernel kKind>
inline void launch_norm_backward(floatX* dinp, float* dweight, float* scratch, const floatX* dout, const floatX* inp,
                                 const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                 cudaStream_t stream, bool accumulate) {
    constexpr bool kRms = kKind == NormKernel::RmsNorm;
    if (N == 0) {  // no rows: dweight's sums are zero (stage 2 over no splits writes them)
        if (kRms && !accumulate && C > 0)
            column_reduce_finish<1>(ColumnOutputs<1>{{dweight}}, scratch, 0, C, stream, false);
        return;
    }
    const bool aligned = aligned16(dinp) && aligned16(dout) && aligned16(inp) && (!kRms || aligned16(weight));
    const int vecs = norm_lane_vecs(C, aligned);
    const bool fused = kRms && vecs > 0 && vecs <= kNormFusedPartialsMaxVecs;
    const int splits = ceil_div(N, kColumnReduceRowsPerSplit);
    if (vecs == 0) {
        const unsigned blocks = unsigned(ceil_div(N, kNormBlock / kWarpSize));
        LLMC_LAUNCH(blocks, kNormBlock, 0, stream, norm_backward_dinp_kernel<kKind>)(dinp, dout, inp, weight, mean,
                                                                                     rstd, N, C);
    } else {
        const unsigned blocks = unsigned(ceil_div(N, norm_backward_rows_per_block(fused)));
        auto launch = [&](auto kernel) {
            LLMC_LAUNCH(blocks, kNormBlock, 0, stream, kernel)(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
        };
        auto launch_vecs = [&]<bool kPartials>() {
            switch (vecs) {
                case 1: launch(norm_backward_kernel<kKind, 1, kPartials>); break;
                case 2: launch(norm_backward_kernel<kKind, 2, kPartials>); break;
                case 3: launch(norm_backward_kernel<kKind, 3, kPartials>); break;
                case 4: launch(norm_backward_kernel<kKind, 4, kPartials>); break;
                case 8: launch(norm_backward_kernel<kKind, 8, kPartials>); break;
                default: launch(norm_backward_kernel<kKind, 16, false>); break;
            }
        };
        if constexpr (kRms) {
            if (fused) launch_vecs.template operator()<true>();
            else launch_vecs.template operator()<false>();
        } else {
            launch_vecs.template operator()<false>();
        }
    }
    CUDA_CHECK_LAUNCH();
    if constexpr (kRms) {
        if (fused) column_reduce_finish<1>(ColumnOutputs<1>{{dweight}}, scratch, splits, C, stream, accumulate);
        else column_reduce<1>(ColumnOutputs<1>{{dweight}}, scratch, N, C, RmsNormWeightGrad{dout, inp, rstd, C}, stream,
                              accumulate);
    }
}

// ---- LayerNorm without weight and bias ----------------------------------------------------------------------

// out (N, C) = (inp - mean) * rstd per row; mean, rstd (N, fp32) may be nullptr (inference).
inline void layernorm_noaffine_forward(floatX* out, float* mean, float* rstd, const floatX* inp, int N, int C,
                                       cudaStream_t stream, float eps = km::kLayerNormEps) {
    launch_norm_forward<NormKernel::LayerNorm, false>(out, mean, rstd, nullptr, inp, nullptr, nullptr, N, C, eps, stream);
}

// residual (N, C) = inp1 + inp2 (rounded to floatX); out = the affine-free LayerNorm of residual. residual must
// not alias inp1 or inp2.
inline void fused_residual_layernorm_noaffine_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                                      const floatX* inp1, const floatX* inp2, int N, int C,
                                                      cudaStream_t stream, float eps = km::kLayerNormEps) {
    launch_norm_forward<NormKernel::LayerNorm, true>(out, mean, rstd, residual, inp1, inp2, nullptr, N, C, eps, stream);
}

// dinp (N, C) += dx, given dout, the forward's input and its mean and rstd. dinp must not alias dout or inp.
inline void layernorm_noaffine_backward(floatX* dinp, const floatX* dout, const floatX* inp, const float* mean,
                                        const float* rstd, int N, int C, cudaStream_t stream) {
    launch_norm_backward<NormKernel::LayerNorm>(dinp, nullptr, nullptr, dout, inp, nullptr, mean, rstd, N, C, stream, true);
}

// ---- RMSNorm with a weight ----------------------------------------------------------------------------------

// out (N, C) = inp * rstd * weight per row; rstd (N, fp32) may be nullptr (inference).
inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                            cudaStream_t stream, float eps = km::kRmsNormEps) {
    launch_norm_forward<NormKernel::RmsNorm, false>(out, nullptr, rstd, nullptr, inp, nullptr, weight, N, C, eps, stream);
}

// residual (N, C) = inp1 + inp2 (rounded to floatX); out = RMSNorm of residual. residual must not alias inp1/inp2.
inline void fused_residual_rmsnorm_forward(floatX* residual, floatX* out, float* rstd, const floatX* inp1,
                                           const floatX* inp2, const floatX* weight, int N, int C, cudaStream_t stream,
                                           float eps = km::kRmsNormEps) {
    launch_norm_forward<NormKernel::RmsNorm, true>(out, nullptr, rstd, residual, inp1, inp2, weight, N, C, eps, stream);
}

inline size_t rmsnorm_backward_scratch_floats(int N, int C) { return column_reduce_scratch_floats(N, C, 1); }

// dinp (N, C) += dx; dweight (C, fp32) += (accumulate) or = (!accumulate) sum over rows of dout * inp * rstd.
// scratch: rmsnorm_backward_scratch_floats(N, C) floats. dinp must not alias dout or inp.
inline void rmsnorm_backward(floatX* dinp, float* dweight, float* scratch, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream,
                             bool accumulate = true) {
    launch_norm_backward<NormKernel::RmsNorm>(dinp, dweight, scratch, dout, inp, weight, nullptr, rstd, N, C, stream,
                                            accumulate);
}

}  // namespace llmc
