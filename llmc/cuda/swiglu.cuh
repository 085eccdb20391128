// SwiGLU for OLMo's MLP: the fc projection writes fch (N, 2H) per row as [x (H) | gate (H)] (x first), and
//  - swiglu_forward: out (N, H) = silu(gate) * x;
//  - swiglu_backward: from dout (N, H), dfch (N, 2H) = [dout * silu(gate) | dout * x * silu'(gate)], written (not
//    added to: fch's gradient has no other source). dfch may be fch itself: each thread reads its x and gate
//    before it writes their gradients, and fch is not needed after the backward (the fc weight gradient uses
//    the fc input), so the model can reuse its buffer.
// The maths is km::swiglu_forward / km::swiglu_backward (kernel_math.h, shared with the CPU model); these kernels
// add 128-bit loads when H and the pointers allow it, and a scalar path otherwise.
#pragma once
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

inline constexpr int kSwigluBlock = 256;

// Element j (of N * H) of the output is row j / H, column j % H; its x and gate sit at that row's column c and
// H + c of fch. kVector: VEC = x128::size consecutive columns per thread (H % VEC == 0, so they share a row).
template <bool kVector>
__global__ void swiglu_forward_kernel(floatX* out, const floatX* fch, size_t n, int H) {
    constexpr int VEC = kVector ? x128::size : 1;
    const size_t stride = size_t(gridDim.x) * blockDim.x * VEC;
    for (size_t j = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC; j < n; j += stride) {
        const size_t row = j / H, col = j % H;
        const floatX* x = fch + row * 2 * H + col;
        if constexpr (kVector) {
            const x128 xv = load128(x), gv = load128(x + H);
            x128 o;
#pragma unroll
            for (int k = 0; k < VEC; k++) o.v[k] = from_float<floatX>(km::swiglu_forward(xv.f(k), gv.f(k)));
            store128(out + j, o);
        } else {
            out[j] = from_float<floatX>(km::swiglu_forward(to_float(x[0]), to_float(x[H])));
        }
    }
}

template <bool kVector>
__global__ void swiglu_backward_kernel(floatX* dfch, const floatX* dout, const floatX* fch, size_t n, int H) {
    constexpr int VEC = kVector ? x128::size : 1;
    const size_t stride = size_t(gridDim.x) * blockDim.x * VEC;
    for (size_t j = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC; j < n; j += stride) {
        const size_t row = j / H, col = j % H, at = row * 2 * H + col;
        if constexpr (kVector) {
            const x128 xv = load128(fch + at), gv = load128(fch + at + H), dv = load128(dout + j);
            x128 dx, dg;
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float a, b;
                km::swiglu_backward(dv.f(k), xv.f(k), gv.f(k), a, b);
                dx.v[k] = from_float<floatX>(a);
                dg.v[k] = from_float<floatX>(b);
            }
            store128(dfch + at, dx);
            store128(dfch + at + H, dg);
        } else {
            float a, b;
            km::swiglu_backward(to_float(dout[j]), to_float(fch[at]), to_float(fch[at + H]), a, b);
            dfch[at] = from_float<floatX>(a);
            dfch[at + H] = from_float<floatX>(b);
        }
    }
}

inline bool swiglu_vector_path(int H, const void* a, const void* b, const void* c) {
    return H % x128::size == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

// out (N, H) = silu(fch[:, H:]) * fch[:, :H]; fch (N, 2H). out must not overlap fch.
inline void swiglu_forward(floatX* out, const floatX* fch, int N, int H, cudaStream_t stream) {
    const size_t n = size_t(N) * H;
    if (n == 0) return;
    if (swiglu_vector_path(H, out, fch, fch)) {
        LLMC_LAUNCH(grid_stride_blocks(n / x128::size, kSwigluBlock), kSwigluBlock, 0, stream,
                    swiglu_forward_kernel<true>)(out, fch, n, H);
    } else {
        LLMC_LAUNCH(grid_stride_blocks(n, kSwigluBlock), kSwigluBlock, 0, stream, swiglu_forward_kernel<false>)(
            out, fch, n, H);
    }
    CUDA_CHECK_LAUNCH();
}

// dfch (N, 2H) = the gradients of x and gate, from dout (N, H) and the forward's fch. dfch may equal fch (in
// place); dout must not overlap either.
inline void swiglu_backward(floatX* dfch, const floatX* dout, const floatX* fch, int N, int H, cudaStream_t stream) {
    const size_t n = size_t(N) * H;
    if (n == 0) return;
    if (swiglu_vector_path(H, dfch, dout, fch)) {
        LLMC_LAUNCH(grid_stride_blocks(n / x128::size, kSwigluBlock), kSwigluBlock, 0, stream,
                    swiglu_backward_kernel<true>)(dfch, dout, fch, n, H);
    } else {
        LLMC_LAUNCH(grid_stride_blocks(n, kSwigluBlock), kSwigluBlock, 0, stream, swiglu_backward_kernel<false>)(
            dfch, dout, fch, n, H);
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
