// Deterministic global L2 norm of the fp32 gradient buffer (for clipping and the metrics). A fixed grid of
// kNormBlocks x kNormThreads threads (independent of the GPU model) accumulates squares in a grid-stride loop;
// each block reduces its threads in a fixed tree and writes one partial; a single block then sums the partials
// in double, again in a fixed tree. No atomics: the same gradient gives the same norm bit for bit on any GPU.
#pragma once
#include <cmath>
#include <vector>

#include "llmc/cuda_common.cuh"

namespace llmc {

inline constexpr int kNormBlocks = 1024;
inline constexpr int kNormThreads = 512;

__global__ void norm_squared_partial_kernel(float* partials, const float* g, size_t n) {
    __shared__ float shared[kWarpSize];
    float acc = 0.0f;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        acc += g[i] * g[i];
    const float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void norm_squared_final_kernel(double* out, const float* partials, int count) {
    __shared__ double shared[kWarpSize];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += static_cast<double>(partials[i]);
    const double total = block_sum(acc, shared);
    if (threadIdx.x == 0) {
        LLMC_REQUIRE_ALIGNED(out, sizeof(double));
        out[0] = total;
    }
}

// Scratch for global_norm_squared: kNormBlocks floats + one double (as floats, 8-byte aligned).
inline constexpr size_t kNormScratchFloats = kNormBlocks + 2;

// Enqueues the sum of squares of g[0..n) into *out_device (a double inside `scratch`, returned).
inline double* global_norm_squared_async(float* scratch, const float* g, size_t n, cudaStream_t stream) {
    double* out = reinterpret_cast<double*>(scratch + kNormBlocks);  // kNormBlocks is even: 8-byte aligned
    LLMC_LAUNCH(kNormBlocks, kNormThreads, 0, stream, norm_squared_partial_kernel)(scratch, g, n);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(1, 1024, 0, stream, norm_squared_final_kernel)(out, scratch, kNormBlocks);
    CUDA_CHECK_LAUNCH();
    return out;
}

// The L2 norm of g (synchronizes the stream to read it back).
inline double global_norm(float* scratch, const float* g, size_t n, cudaStream_t stream) {
    const double* out = global_norm_squared_async(scratch, g, n, stream);
    double host = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof(double), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return std::sqrt(host);
}

// CPU mirror of the exact reduction order (for the checker): same grid, same per-thread order; the block and
// final trees are reproduced by the same butterfly pattern.
inline double global_norm_squared_host_mirror(const float* g, size_t n) {
    const size_t threads = size_t(kNormBlocks) * kNormThreads;
    std::vector<float> partials(kNormBlocks);
    for (int b = 0; b < kNormBlocks; b++) {
        std::vector<float> t(kNormThreads, 0.0f);
        for (int x = 0; x < kNormThreads; x++) {
            float acc = 0.0f;
            for (size_t i = size_t(b) * kNormThreads + x; i < n; i += threads) acc = std::fma(g[i], g[i], acc);  // nvcc contracts to FMA
            t[x] = acc;
        }
        // warp butterflies (xor 16..1): every lane ends with the same sum; lane 0's value in xor order
        std::vector<float> warp_totals(kNormThreads / kWarpSize);
        for (int w = 0; w < kNormThreads / kWarpSize; w++) {
            float lanes[kWarpSize];
            for (int l = 0; l < kWarpSize; l++) lanes[l] = t[w * kWarpSize + l];
            for (int off = 16; off > 0; off >>= 1) {
                float next[kWarpSize];
                for (int l = 0; l < kWarpSize; l++) next[l] = lanes[l] + lanes[l ^ off];
                for (int l = 0; l < kWarpSize; l++) lanes[l] = next[l];
            }
            warp_totals[w] = lanes[0];
        }
        float lanes[kWarpSize];
        for (int l = 0; l < kWarpSize; l++) lanes[l] = l < kNormThreads / kWarpSize ? warp_totals[l] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) {
            float next[kWarpSize];
            for (int l = 0; l < kWarpSize; l++) next[l] = lanes[l] + lanes[l ^ off];
            for (int l = 0; l < kWarpSize; l++) lanes[l] = next[l];
        }
        partials[b] = lanes[0];
    }
    double t[1024];
    for (int x = 0; x < 1024; x++) t[x] = x < kNormBlocks ? static_cast<double>(partials[x]) : 0.0;
    double warp_totals[32];
    for (int w = 0; w < 32; w++) {
        double lanes[kWarpSize];
        for (int l = 0; l < kWarpSize; l++) lanes[l] = t[w * kWarpSize + l];
        for (int off = 16; off > 0; off >>= 1) {
            double next[kWarpSize];
            for (int l = 0; l < kWarpSize; l++) next[l] = lanes[l] + lanes[l ^ off];
            for (int l = 0; l < kWarpSize; l++) lanes[l] = next[l];
        }
        warp_totals[w] = lanes[0];
    }
    double lanes[kWarpSize];
    for (int l = 0; l < kWarpSize; l++) lanes[l] = warp_totals[l];
    for (int off = 16; off > 0; off >>= 1) {
        double next[kWarpSize];
        for (int l = 0; l < kWarpSize; l++) next[l] = lanes[l] + lanes[l ^ off];
        for (int l = 0; l < kWarpSize; l++) lanes[l] = next[l];
    }
    return lanes[0];
}

}  // namespace llmc
