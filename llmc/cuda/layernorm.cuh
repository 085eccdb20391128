// LayerNorm over the channel dimension (torch semantics: biased variance, eps 1e-5), one warp per row.
//  - layernorm_forward: out = (x - mean) * rstd * w + b; keeps mean and rstd (fp32) for the backward. With
//    128-bit loads and the row in registers where C allows (layernorm_lane_vecs); ncu on an H200 put the
//    strided kernel, which reads the row three times 16 bits at a time, at 46 us per fused call (100 MB moved).
//  - fused_residual_layernorm_forward: residual = inp1 + inp2 (rounded to floatX, the value the next layer and
//    the backward see), then the LayerNorm of that residual, in one pass over memory (as llm.c).
//  - layernorm_backward: dinp += dx (accumulates into the residual-stream gradient), dweight += sum dout*norm,
//    dbias += sum dout. dinp per row by one warp; dweight/dbias by the deterministic column reduction of
//    cuda_common.cuh (no atomics), into fp32 gradients, its first stage fused into the dinp pass where the
//    128-bit kernel runs (one read of dout and inp instead of two); optionally also the column sums of the
//    updated dinp (the upstream projection's bias gradient) in the same pass.
// Per-element maths: km::layernorm_rstd / layernorm_apply / layernorm_dx (kernel_math.h, CPU-tested); the
// statistics are two-pass (mean, then sum of squared deviations) in fp32.
#pragma once
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

inline constexpr int kLayerNormBlock = 256;  // 8 rows (warps) per block

// The kernels' VECS for a row of C channels: x128 slices per lane with the row held in registers (1, 2, 3, 4
// or 8), or 0 for the scalar kernels (C not a multiple of x128::size, a buffer not 16-byte aligned, or C over
// 8 * 32 * x128::size).
inline int layernorm_lane_vecs(int C, bool aligned) {
    if (C % x128::size != 0 || !aligned) return 0;
    const int v = ceil_div(C, kWarpSize * x128::size);
    return v <= 4 ? v : v <= 8 ? 8 : 0;
}

// VECS = 0: strided over the row, re-reading it for each pass. VECS > 0: each lane loads its VECS x128 slices
// once (the residual sum computed and stored on the way) and keeps them in registers for the statistics and
// the output: one read and one write of the row, 128 bits at a time.
template <bool kResidual, int VECS>
__global__ void layernorm_forward_kernel(floatX* out, float* mean_out, float* rstd_out, floatX* residual,
                                         const floatX* inp1, const floatX* inp2, const floatX* weight,
                                         const floatX* bias, int N, int C) {
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    float mean, rstd;
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
            for (int k = 0; k < x128::size; k++) sum += xv[v].f(k);
        }
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
        rstd = km::layernorm_rstd(warp_sum(sq) / C);
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            const x128 w = load128(weight + c), b = load128(bias + c);
            x128 o;
#pragma unroll
            for (int k = 0; k < x128::size; k++)
                o.v[k] = from_float<floatX>(km::layernorm_apply(xv[v].f(k), mean, rstd, w.f(k), b.f(k)));
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
            sum += v;
        }
        mean = warp_sum(sum) / C;
        float sq = 0.0f;
        for (int c = lane; c < C; c += kWarpSize) {
            const float d = to_float(x[c]) - mean;
            sq += d * d;
        }
        rstd = km::layernorm_rstd(warp_sum(sq) / C);
        for (int c = lane; c < C; c += kWarpSize)
            out[base + c] = from_float<floatX>(
                km::layernorm_apply(to_float(x[c]), mean, rstd, to_float(weight[c]), to_float(bias[c])));
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

template <bool kResidual>
inline void launch_layernorm_forward(floatX* out, float* mean, float* rstd, floatX* residual, const floatX* inp1,
                                     const floatX* inp2, const floatX* weight, const floatX* bias, int N, int C,
                                     cudaStream_t stream) {
    if (N == 0) return;
    const unsigned blocks = unsigned(ceil_div(N, kLayerNormBlock / kWarpSize));
    const bool aligned = aligned16(out) && aligned16(inp1) && aligned16(weight) && aligned16(bias) &&
                         (!kResidual || (aligned16(residual) && aligned16(inp2)));
    auto launch = [&](auto kernel) {
        LLMC_LAUNCH(blocks, kLayerNormBlock, 0, stream, kernel)(
            out, mean, rstd, residual, inp1, inp2, weight, bias, N, C);
    };
    switch (layernorm_lane_vecs(C, aligned)) {
        case 1: launch(layernorm_forward_kernel<kResidual, 1>); break;
        case 2: launch(layernorm_forward_kernel<kResidual, 2>); break;
        case 3: launch(layernorm_forward_kernel<kResidual, 3>); break;
        case 4: launch(layernorm_forward_kernel<kResidual, 4>); break;
        case 8: launch(layernorm_forward_kernel<kResidual, 8>); break;
        default: launch(layernorm_forward_kernel<kResidual, 0>); break;
    }
    CUDA_CHECK_LAUNCH();
}

// out (N,C) = layernorm(inp); mean, rstd (N) may be nullptr (inference).
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    launch_layernorm_forward<false>(out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C, stream);
}

// residual (N,C) = inp1 + inp2; out = layernorm(residual). residual must not alias inp1/inp2.
inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* inp1, const floatX* inp2, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    launch_layernorm_forward<true>(out, mean, rstd, residual, inp1, inp2, weight, bias, N, C, stream);
}

// Elementwise residual add (no LayerNorm): out = a + b.
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<floatX>(to_float(a[i]) + to_float(b[i]));
}

inline void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    LLMC_LAUNCH(grid_stride_blocks(n, 256), 256, 0, stream, residual_forward_kernel)(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* weight, const float* mean, const float* rstd, int N,
                                               int C) {
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    const float m = mean[row], r = rstd[row];
    float s_dnorm = 0.0f, s_dnorm_norm = 0.0f;
    for (int c = lane; c < C; c += kWarpSize) {
        const float norm = (to_float(inp[base + c]) - m) * r;
        const float dnorm = to_float(weight[c]) * to_float(dout[base + c]);
        s_dnorm += dnorm;
        s_dnorm_norm += dnorm * norm;
    }
    const float dnorm_mean = warp_sum(s_dnorm) / C;
    const float dnorm_norm_mean = warp_sum(s_dnorm_norm) / C;
    for (int c = lane; c < C; c += kWarpSize) {
        const float norm = (to_float(inp[base + c]) - m) * r;
        const float dnorm = to_float(weight[c]) * to_float(dout[base + c]);
        const float dx = km::layernorm_dx(dnorm, norm, dnorm_mean, dnorm_norm_mean, r);
        dinp[base + c] = from_float<floatX>(to_float(dinp[base + c]) + dx);
    }
}

// The whole backward with 128-bit loads, in one pass over memory: a block owns one split of
// kColumnReduceRowsPerSplit rows (the column reduction's), warp w its rows r0 + w, r0 + w + 8, ... (the
// reduction's thread row y = w). Per row, each lane keeps its VECS x128 slices of inp and dout in registers
// between the two passes of the row sums, adds dx into dinp, and accumulates its columns' dweight and dbias
// terms, and with NV = 3 the updated dinp values too (the bias gradient of the linear layer whose output this
// residual gradient is); the 8 warps' sums then go through shared memory in warp order into `partial` (split,
// NV, C), which column_reduce_finish adds to the gradients. The same additions in the same order as the dinp
// kernel followed by column_reduce with LayerNormParamGrad (and BiasGrad on dinp), without reading dout, inp
// and dinp again. Needs C % x128::size == 0, 16-byte aligned rows and C <= VECS * 32 * x128::size;
// layernorm_backward picks it when they hold. grid ceil(N / kColumnReduceRowsPerSplit), kLayerNormBlock threads.
template <int VECS, int NV>
__global__ void __launch_bounds__(kLayerNormBlock) layernorm_backward_kernel(floatX* dinp, float* partial,
                                                                            const floatX* dout, const floatX* inp,
                                                                            const floatX* weight, const float* mean,
                                                                            const float* rstd, int N, int C) {
    static_assert(kLayerNormBlock / kWarpSize == kColumnReduceThreadsY, "one warp per row of the reduction's block");
    static_assert(NV == 2 || NV == 3, "dweight, dbias [, the column sums of dinp]");
    constexpr int kSliceCols = kWarpSize * x128::size;
    // Up to 4 slices per lane (3 with the third sum), every load of a row (inp, dout, weight, dinp) is issued
    // before the first use, so a row costs one memory round trip, and inp and dout stay in registers between
    // the passes. With 3 slices (C of 513 to 768, GPT-2 124M's; one block of 8 warps per SM at these register
    // counts), the weight is loaded once and the next row's loads are issued while the warp still works on the
    // row before (kPrefetch: 222 / 233 registers instead of 174 / 206, no spills), so the round trips overlap the
    // arithmetic, which the 8 warps otherwise do with the memory system idle; with fewer slices the extra
    // registers would cost a block per SM, with 4 they spill. Above 4 slices (C over 1,024 or 768), the sums take
    // so many registers that the second pass reads the row again (from L1, where the first pass left it) and
    // dinp and weight are loaded where used: 255 registers and spills otherwise.
    constexpr bool kLoadAllFirst = VECS <= (NV == 3 ? 3 : 4);
    constexpr bool kPrefetch = kLoadAllFirst && VECS == 3;
    __shared__ float sums[NV][VECS * kSliceCols];  // the block's rows' sums per column
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int r0 = blockIdx.x * kColumnReduceRowsPerSplit, r1 = min(N, r0 + kColumnReduceRowsPerSplit);
    float acc[NV][VECS][x128::size];  // dweight, dbias, dinp
#pragma unroll
    for (int n = 0; n < NV; n++)
#pragma unroll
        for (int v = 0; v < VECS; v++)
#pragma unroll
            for (int k = 0; k < x128::size; k++) acc[n][v][k] = 0.0f;
    constexpr int kHeld = kLoadAllFirst ? VECS : 1;  // slices held across the passes
    constexpr int kAhead = kPrefetch ? VECS : 1;     // kPrefetch: the next row's slices, loaded a row ahead
    x128 pw[kAhead] = {}, pi[kAhead] = {}, pd[kAhead] = {}, pg[kAhead] = {};  // and the weight, loaded once
    float pm = 0.0f, pr = 0.0f;
    auto prefetch_row = [&](int row) {
        if (row >= r1) return;
        const size_t base = size_t(row) * C;
        pm = mean[row];
        pr = rstd[row];
#pragma unroll
        for (int v = 0; v < kAhead; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c < C) {
                pi[v] = load128(inp + base + c);
                pd[v] = load128(dout + base + c);
                pg[v] = load128(dinp + base + c);
            }
        }
    };
    if constexpr (kPrefetch) {
#pragma unroll
        for (int v = 0; v < kAhead; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c < C) pw[v] = load128(weight + c);
        }
        prefetch_row(r0 + warp);
    }
    for (int i = 0; i < kColumnReduceRowsPerThread; i++) {
        const int row = r0 + warp + i * kColumnReduceThreadsY;
        if (row >= r1) break;
        const size_t base = size_t(row) * C;
        x128 xi[kHeld] = {}, xd[kHeld] = {}, xw[kHeld] = {}, xg[kHeld] = {};  // = {}: g++ cannot see c < C pairs them
        float m, r;
        if constexpr (kPrefetch) {
#pragma unroll
            for (int v = 0; v < kAhead; v++) xi[v] = pi[v], xd[v] = pd[v], xw[v] = pw[v], xg[v] = pg[v];
            m = pm;
            r = pr;
            prefetch_row(row + kColumnReduceThreadsY);
        } else {
            m = mean[row];
            r = rstd[row];
        }
        float s_dnorm = 0.0f, s_dnorm_norm = 0.0f;
        // the row's dnorm and dnorm * norm sums over one slice
        auto add_row_sums = [&](const x128& i, const x128& d, const x128& w) {
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                const float norm = (i.f(k) - m) * r;
                const float dnorm = w.f(k) * d.f(k);
                s_dnorm += dnorm;
                s_dnorm_norm += dnorm * norm;
            }
        };
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if constexpr (kPrefetch) {
                // the row's slices are in xi, xd, xw, xg already
            } else if constexpr (kLoadAllFirst) {
                if (c < C) {
                    xi[v] = load128(inp + base + c);
                    xd[v] = load128(dout + base + c);
                    xw[v] = load128(weight + c);
                    xg[v] = load128(dinp + base + c);
                }
            } else if (c < C) {
                add_row_sums(load128(inp + base + c), load128(dout + base + c), load128(weight + c));
            }
        }
        if constexpr (kLoadAllFirst)
#pragma unroll
            for (int v = 0; v < VECS; v++)
                if ((v * kWarpSize + lane) * x128::size < C) add_row_sums(xi[v], xd[v], xw[v]);
        const float dnorm_mean = warp_sum(s_dnorm) / C;
        const float dnorm_norm_mean = warp_sum(s_dnorm_norm) / C;
#pragma unroll
        for (int v = 0; v < VECS; v++) {
            const int c = (v * kWarpSize + lane) * x128::size;
            if (c >= C) continue;
            const int h = kLoadAllFirst ? v : 0;
            if constexpr (!kLoadAllFirst) {
                xi[h] = load128(inp + base + c);
                xd[h] = load128(dout + base + c);
                xw[h] = load128(weight + c);
                xg[h] = load128(dinp + base + c);
            }
            x128 out;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                const float norm = (xi[h].f(k) - m) * r;
                const float dnorm = xw[h].f(k) * xd[h].f(k);
                out.v[k] = from_float<floatX>(xg[h].f(k) + km::layernorm_dx(dnorm, norm, dnorm_mean, dnorm_norm_mean, r));
                const float d = xd[h].f(k);
                acc[0][v][k] += __fmul_rn(d, norm);  // LayerNormParamGrad's terms
                acc[1][v][k] += d;
                if constexpr (NV == 3) acc[2][v][k] += to_float(out.v[k]);  // BiasGrad's, on dinp
            }
            store128(dinp + base + c, out);
        }
    }
    // the warps' sums in warp order (s = 0 + w0 + w1 + ..., as column_reduce_stage1_kernel adds its rows y)
    for (int w = 0; w < kColumnReduceThreadsY; w++) {
        if (warp == w)
#pragma unroll
            for (int v = 0; v < VECS; v++) {
                const int c = (v * kWarpSize + lane) * x128::size;
                if (c >= C) continue;
#pragma unroll
                for (int n = 0; n < NV; n++)
#pragma unroll
                    for (int k = 0; k < x128::size; k++)
                        sums[n][c + k] = (w == 0 ? 0.0f : sums[n][c + k]) + acc[n][v][k];
            }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += kLayerNormBlock)
#pragma unroll
        for (int n = 0; n < NV; n++) partial[(size_t(blockIdx.x) * NV + n) * C + c] = sums[n][c];
}

// The dweight and dbias terms of one element. The product is rounded before it is added (__fmul_rn: never
// contracted into an FMA), so every kernel that sums these terms in the same order gets the same bits whatever
// the compiler fuses (layernorm_backward_kernel against the column reduction, 128-bit against scalar loads).
struct LayerNormParamGrad {
    const floatX* dout;
    const floatX* inp;
    const float* mean;
    const float* rstd;
    int C;
    template <int VEC>
    __device__ void load(int r, int c, float (&v)[2][VEC]) const {
        const size_t i = size_t(r) * C + c;
        const float m = mean[r], s = rstd[r];
        if constexpr (VEC == 1) {
            const float d = to_float(dout[i]);
            v[0][0] = __fmul_rn(d, (to_float(inp[i]) - m) * s);
            v[1][0] = d;
        } else {
            static_assert(VEC == x128::size, "scalar or 128-bit");
            const x128 d = load128(dout + i), x = load128(inp + i);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                v[0][j] = __fmul_rn(d.f(j), (x.f(j) - m) * s);
                v[1][j] = d.f(j);
            }
        }
    }
    bool aligned() const { return aligned16(dout) && aligned16(inp); }
};

inline size_t layernorm_backward_scratch_floats(int N, int C) { return column_reduce_scratch_floats(N, C, 3); }

// dinp (N,C) += dx; dweight, dbias (C, fp32) += parameter gradients; dinp_sum (C, fp32; skipped when nullptr) +=
// the column sums of the updated dinp, which are the bias gradient of the linear layer whose output feeds this
// residual stream (GPT-2's attproj and fcproj), so that layer's backward need not read dinp again for it. dinp
// must not alias dout. scratch: layernorm_backward_scratch_floats(N, C) floats. accumulate false: dweight, dbias
// and dinp_sum are written instead of added to (dinp is always added to).
inline void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream, float* dinp_sum = nullptr, bool accumulate = true) {
    if (N == 0) {  // no rows: the parameter gradients' sums are zero (stage 2 over no splits writes them)
        if (!accumulate) column_reduce_finish<3>(ColumnOutputs<3>{{dweight, dbias, dinp_sum}}, scratch, 0, C, stream, false);
        return;
    }
    const bool aligned = aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight);
    const int vecs = layernorm_lane_vecs(C, aligned);
    if (vecs == 0) {  // strided rows, then the column reductions reading dout, inp and dinp again
        const unsigned blocks = unsigned(ceil_div(N, kLayerNormBlock / kWarpSize));
        LLMC_LAUNCH(blocks, kLayerNormBlock, 0, stream, layernorm_backward_dinp_kernel)(dinp, dout, inp, weight, mean,
                                                                                        rstd, N, C);
        CUDA_CHECK_LAUNCH();
        column_reduce<2>(ColumnOutputs<2>{{dweight, dbias}}, scratch, N, C, LayerNormParamGrad{dout, inp, mean, rstd, C},
                         stream, accumulate);
        if (dinp_sum) column_reduce<1>(ColumnOutputs<1>{{dinp_sum}}, scratch, N, C, BiasGrad{dinp, C}, stream, accumulate);
        return;
    }
    const int splits = ceil_div(N, kColumnReduceRowsPerSplit);
    auto launch = [&](auto kernel) {
        LLMC_LAUNCH(unsigned(splits), kLayerNormBlock, 0, stream, kernel)(dinp, scratch, dout, inp, weight, mean, rstd,
                                                                          N, C);
    };
    auto launch_nv = [&]<int NV>() {
        switch (vecs) {
            case 1: launch(layernorm_backward_kernel<1, NV>); break;
            case 2: launch(layernorm_backward_kernel<2, NV>); break;
            case 3: launch(layernorm_backward_kernel<3, NV>); break;
            case 4: launch(layernorm_backward_kernel<4, NV>); break;
            default: launch(layernorm_backward_kernel<8, NV>); break;
        }
        CUDA_CHECK_LAUNCH();
    };
    if (dinp_sum) {
        launch_nv.template operator()<3>();
        column_reduce_finish<3>(ColumnOutputs<3>{{dweight, dbias, dinp_sum}}, scratch, splits, C, stream, accumulate);
    } else {
        launch_nv.template operator()<2>();
        column_reduce_finish<2>(ColumnOutputs<2>{{dweight, dbias}}, scratch, splits, C, stream, accumulate);
    }
}

}  // namespace llmc
