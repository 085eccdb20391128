// GELU (tanh approximation) for the MLP: forward out = gelu(inp), backward in place dinout *= gelu'(inp).
// The maths is km::gelu_forward / km::gelu_derivative (kernel_math.h, unit-tested on the CPU); these kernels
// only add 128-bit vector loads when the pointers and size allow it, and a scalar path otherwise.
// The forward can also run fused into the fc matmul as a cuBLASLt epilogue (matmul.cuh); the backward always
// runs here, reading the pre-GELU activations the forward kept.
#pragma once
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

template <bool kVector>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    if constexpr (kVector) {
        for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * x128::size; i < n; i += stride * x128::size) {
            const x128 x = load128(inp + i);
            x128 y;
#pragma unroll
            for (int k = 0; k < x128::size; k++) y.v[k] = from_float<floatX>(km::gelu_forward(x.f(k)));
            store128(out + i, y);
        }
    } else {
        for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride)
            out[i] = from_float<floatX>(km::gelu_forward(to_float(inp[i])));
    }
}

template <bool kVector>
__global__ void gelu_backward_inplace_kernel(floatX* dinout, const floatX* inp, size_t n) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    if constexpr (kVector) {
        for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * x128::size; i < n; i += stride * x128::size) {
            const x128 x = load128(inp + i);
            x128 d = load128(dinout + i);
#pragma unroll
            for (int k = 0; k < x128::size; k++) d.v[k] = from_float<floatX>(d.f(k) * km::gelu_derivative(x.f(k)));
            store128(dinout + i, d);
        }
    } else {
        for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride)
            dinout[i] = from_float<floatX>(to_float(dinout[i]) * km::gelu_derivative(to_float(inp[i])));
    }
}

// out = gelu(inp), n elements (out may equal inp).
inline void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    constexpr int block = 256;
    if (n % x128::size == 0 && aligned16(out) && aligned16(inp)) {
        LLMC_LAUNCH(grid_stride_blocks(n / x128::size, block), block, 0, stream, gelu_forward_kernel<true>)(
            out, inp, n);
    } else {
        LLMC_LAUNCH(grid_stride_blocks(n, block), block, 0, stream, gelu_forward_kernel<false>)(out, inp, n);
    }
    CUDA_CHECK_LAUNCH();
}

// dinout = dinout * gelu'(inp): turns d(gelu output) into d(gelu input).
inline void gelu_backward_inplace(floatX* dinout, const floatX* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    constexpr int block = 256;
    if (n % x128::size == 0 && aligned16(dinout) && aligned16(inp)) {
        LLMC_LAUNCH(grid_stride_blocks(n / x128::size, block), block, 0, stream, gelu_backward_inplace_kernel<true>)(
            dinout, inp, n);
    } else {
        LLMC_LAUNCH(grid_stride_blocks(n, block), block, 0, stream, gelu_backward_inplace_kernel<false>)(
            dinout, inp, n);
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
