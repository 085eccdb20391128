// The classifier's softmax + cross-entropy loss + gradient, fused and in place (as llm.c): one block per row
// of logits (B*T rows of padded_vocab_size Vp). The block computes the online-softmax statistics (max and sum
// of exp) over the first V (= vocab_size) columns only, writes the row's loss, then overwrites the logits
// with dlogits = (softmax - onehot(target)) * dloss, and zeros for the padded columns [V, Vp), so the full
// (B*T, Vp) logits buffer never needs a separate gradient buffer. dloss = 1 / (B*T*grad_accum_steps) for a
// mean loss. Without write_dlogits (evaluation) the logits are left intact.
// Per-element maths: km::softmax_stat_* / crossentropy_loss / crossentropy_dlogit (kernel_math.h).
// Reductions run in a fixed order (per-thread strided pushes, warp butterflies, then warp 0 over the warps).
#pragma once
#include "llmc/cuda_common.cuh"

namespace llmc {

inline constexpr int kClassifierBlock = 1024;

template <bool kWriteGrad>
__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ float shared_max[kWarpSize], shared_sum[kWarpSize];
    __shared__ km::SoftmaxStat row_stat;
    const int row = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;
    floatX* x = logits + size_t(row) * Vp;

    km::SoftmaxStat s = km::softmax_stat_empty();
    for (int i = threadIdx.x; i < V; i += blockDim.x) s = km::softmax_stat_push(s, to_float(x[i]));
    s = warp_softmax_merge(s);
    if (lane == 0) {
        shared_max[warp] = s.max;
        shared_sum[warp] = s.sum;
    }
    __syncthreads();
    if (warp == 0) {
        km::SoftmaxStat w = lane < num_warps ? km::SoftmaxStat{shared_max[lane], shared_sum[lane]} : km::softmax_stat_empty();
        w = warp_softmax_merge(w);
        if (lane == 0) row_stat = w;
    }
    __syncthreads();
    const km::SoftmaxStat stat = row_stat;
    const int target = targets[row];
    const bool valid = target >= 0 && target < V;
    if (threadIdx.x == 0) losses[row] = valid ? km::crossentropy_loss(stat, to_float(x[target])) : NAN;
    if constexpr (kWriteGrad) {
        __syncthreads();  // x[target] is read above before anyone overwrites it
        for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
            const float d = i < V ? km::crossentropy_dlogit(to_float(x[i]), stat, i == target, dloss) : 0.0f;
            x[i] = from_float<floatX>(d);
        }
    }
}

#ifdef __CUDACC__  // launches compile with nvcc only (dev/cuda/block_emulator.h includes this header in g++)
// logits (N, Vp) -> losses (N); with write_dlogits the logits become d(loss)/d(logits) scaled by dloss.
// targets (N) on the device; an out-of-range target gives a NaN loss (and no one-hot term).
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                             bool write_dlogits, cudaStream_t stream) {
    if (N == 0) return;
    if (write_dlogits)
        fused_classifier_kernel<true><<<N, kClassifierBlock, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    else
        fused_classifier_kernel<false><<<N, kClassifierBlock, 0, stream>>>(logits, losses, targets, dloss, V, Vp);
    CUDA_CHECK_LAUNCH();
}

#endif  // __CUDACC__

}  // namespace llmc
