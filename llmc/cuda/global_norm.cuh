// Deterministic global L2 norm of the fp32 gradient buffer (for clipping and the metrics). A fixed grid of
// kNormBlocks x kNormThreads threads (independent of the GPU model) accumulates squares in a grid-stride loop;
// each block reduces its threads in a fixed tree and writes one partial; a single block then sums the partials
// in double, again in a fixed tree. No atomics: the same gradient gives the same norm bit for bit on any GPU.
#pragma once
#include <cmath>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"

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

// clip (when given): the clip coefficient km::clip_scale(sqrt(sum), max_norm) as well, computed once here with
// the host's formula (the same bits), for the optimizers' kernels to read.
__global__ void norm_squared_final_kernel(double* out, const float* partials, int count, float* clip = nullptr,
                                          float max_norm = 0.0f) {
    __shared__ double shared[kWarpSize];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += static_cast<double>(partials[i]);
    const double total = block_sum(acc, shared);
    if (threadIdx.x == 0) {
        LLMC_REQUIRE_ALIGNED(out, sizeof(double));
        out[0] = total;
        if (clip) *clip = km::clip_scale_of_squares(total, max_norm);
    }
}

// Scratch for the norm: kNormBlocks floats of partials, the double sum (as two floats, 8-byte aligned), the clip
// coefficient, one float of padding.
inline constexpr size_t kNormScratchFloats = kNormBlocks + 4;

// The norm's two kernels into `scratch`; with `clip`, its coefficient too.
inline double* launch_global_norm(float* scratch, const float* g, size_t n, float* clip, float max_norm,
                                  cudaStream_t stream) {
    double* out = reinterpret_cast<double*>(scratch + kNormBlocks);  // kNormBlocks is even: 8-byte aligned
    LLMC_LAUNCH(kNormBlocks, kNormThreads, 0, stream, norm_squared_partial_kernel)(scratch, g, n);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(1, 1024, 0, stream, norm_squared_final_kernel)(out, scratch, kNormBlocks, clip, max_norm);
    CUDA_CHECK_LAUNCH();
    return out;
}

// Enqueues the sum of squares of g[0..n) into *out_device (a double inside `scratch`, returned).
inline double* global_norm_squared_async(float* scratch, const float* g, size_t n, cudaStream_t stream) {
    return launch_global_norm(scratch, g, n, nullptr, 0.0f, stream);
}

// The norm of a gradient about to be clipped, left on the device: its sum of squares and the clip coefficient
// for max_norm (1 when max_norm <= 0 or the norm is below it), both inside `scratch`. The optimizers' kernels read
// the coefficient, so the host never waits for the norm; it reads the sum back later, for the metrics.
struct DeviceNorm {
    const double* sum_of_squares;
    const float* clip;
};
inline DeviceNorm global_norm_for_clip_async(float* scratch, const float* g, size_t n, float max_norm,
                                             cudaStream_t stream) {
    float* clip = scratch + kNormBlocks + 2;
    return {launch_global_norm(scratch, g, n, clip, max_norm, stream), clip};
}

// The CUDA optimizers' norm for the clip, queued without a host wait: global_norm_for_clip_async, its sum read
// back into pinned memory behind it, and two events timing it. queue() returns the clip coefficient on the
// device for the update's kernels; read() gives the host the norm and its GPU seconds once the stream got past
// it (it waits for that, which costs nothing after the caller's own wait).
class QueuedClipNorm {
public:
    QueuedClipNorm() = default;
    QueuedClipNorm(const QueuedClipNorm&) = delete;
    QueuedClipNorm& operator=(const QueuedClipNorm&) = delete;

    const float* queue(float* scratch, const float* g, size_t n, float max_norm, cudaStream_t stream) {
        start_.record(stream);
        const DeviceNorm norm = global_norm_for_clip_async(scratch, g, n, max_norm, stream);
        CUDA_CHECK(cudaMemcpyAsync(sum_readback_.data(), norm.sum_of_squares, sizeof(double), cudaMemcpyDeviceToHost,
                                   stream));
        end_.record(stream);
        return norm.clip;
    }
    // The last queue()'s norm (before clipping) and the GPU seconds of its kernels.
    void read(double& norm, double& seconds) {
        end_.synchronize();
        norm = std::sqrt(sum_readback_.data()[0]);
        seconds = end_.ms_since(start_) * 1e-3;
    }

private:
    PinnedHostBuffer<double> sum_readback_{1};
    TimedCudaEvent start_, end_;
};

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
