// The classifier's softmax + cross-entropy loss + gradient, fused and in place (as llm.c): one block per row
// of logits (B*T rows of padded_vocab_size Vp). The block computes the online-softmax statistics (max and sum
// of exp) over the first V (= vocab_size) columns only, writes the row's loss, then overwrites the logits
// with dlogits = (softmax - onehot(target)) * dloss, and zeros for the padded columns [V, Vp), so the full
// (B*T, Vp) logits buffer never needs a separate gradient buffer. dloss = 1 / (targets * grad_accum_steps) for
// a mean loss over the rows with a target. A row whose target is kNoTarget (llmc/base/targets.h) has no loss
// (0) and no gradient: the block writes its loss and, for training, a row of zeros, and skips the softmax.
// Without write_dlogits (evaluation) the logits are left intact.
// Per-element maths: km::softmax_stat_* / crossentropy_loss / crossentropy_dlogit (kernel_math.h).
// Reductions run in a fixed order (per-thread strided pushes, warp butterflies, then warp 0 over the warps).
// VEC: logits per load and store. 128-bit (x128::size) when Vp allows it (rows 16-byte aligned): a warp then
// moves 512 bytes per instruction instead of 64, and the row statistics take one rescale per VEC logits;
// the scalar path (VEC = 1) serves other widths. ncu on an H200 put the scalar kernel at 1.4 TB/s (2.3 ms
// of a 42 ms GPT-2 124M step at B=16), and on an H100 the 128-bit one at 2.41 TB/s (1.35 ms per step): its
// statistics loop has one load in flight per thread and ~14 instructions per logit (an online-softmax merge per
// chunk), and the gradient pass reads the row again (from L2).
// fused_classifier_staged_kernel (rows that fit twice in an SM's shared memory: fused_classifier_staged; GPT-2's
// 50,304 on Hopper) stages the row in shared memory instead, read from memory once by asynchronous copies (all of
// a thread's in flight at once, no registers held), and makes three passes over it there: the max, the sum of
// exp(x - max), then the loss and the gradient. Two blocks of 100 KB per SM at Vp = 50,304.
#pragma once
#include "llmc/base/targets.h"
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

inline constexpr int kClassifierBlock = 1024;

template <bool kWriteGrad, int VEC>
__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    static_assert(VEC == 1 || VEC == x128::size, "scalar or 128-bit");
    __shared__ float shared_max[kWarpSize], shared_sum[kWarpSize];
    __shared__ km::SoftmaxStat row_stat;
    const int row = blockIdx.x;
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;
    floatX* x = logits + size_t(row) * Vp;
    const int target = targets[row];
    if (target == kNoTarget) {  // the whole block leaves here, before any barrier
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if constexpr (kWriteGrad) {
            Packed128<floatX> zeros;
#pragma unroll
            for (int k = 0; k < x128::size; k++) zeros.v[k] = from_float<floatX>(0.0f);
            for (int i0 = threadIdx.x * VEC; i0 < Vp; i0 += blockDim.x * VEC) {
                if constexpr (VEC == 1) x[i0] = zeros.v[0];
                else store128(x + i0, zeros);
            }
        }
        return;
    }

    km::SoftmaxStat s = km::softmax_stat_empty();
    for (int i0 = threadIdx.x * VEC; i0 < V; i0 += blockDim.x * VEC) {
        if constexpr (VEC == 1) {
            s = km::softmax_stat_push(s, to_float(x[i0]));
        } else {  // i0 + VEC <= Vp (Vp % VEC == 0); columns from V on are padding
            const x128 v = load128(x + i0);
            km::SoftmaxStat chunk{v.f(0), 1.0f};  // i0 < V
#pragma unroll
            for (int k = 1; k < VEC; k++)
                if (i0 + k < V) chunk.max = fmaxf(chunk.max, v.f(k));
            chunk.sum = 0.0f;
#pragma unroll
            for (int k = 0; k < VEC; k++)
                if (i0 + k < V) chunk.sum += expf(v.f(k) - chunk.max);
            s = km::softmax_stat_merge(s, chunk);
        }
    }
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
    const bool valid = target >= 0 && target < V;
    if (threadIdx.x == 0) losses[row] = valid ? km::crossentropy_loss(stat, to_float(x[target])) : NAN;
    if constexpr (kWriteGrad) {
        __syncthreads();  // x[target] is read above before anyone overwrites it
        for (int i0 = threadIdx.x * VEC; i0 < Vp; i0 += blockDim.x * VEC) {
            if constexpr (VEC == 1) {
                const float d = i0 < V ? km::crossentropy_dlogit(to_float(x[i0]), stat, i0 == target, dloss) : 0.0f;
                x[i0] = from_float<floatX>(d);
            } else {
                const x128 v = load128(x + i0);
                x128 out;
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    const int i = i0 + k;
                    out.v[k] = from_float<floatX>(i < V ? km::crossentropy_dlogit(v.f(k), stat, i == target, dloss) : 0.0f);
                }
                store128(x + i0, out);
            }
        }
    }
}

// The largest row, in bytes, the staged kernel takes: two blocks' rows, with the 1 KB the GPU reserves per block
// and the reductions' words, fit in an SM's shared memory (sm_80: 164 KB; sm_90: 228 KB).
inline constexpr size_t kClassifierStagedMaxBytes = 80 * 1024;
inline constexpr size_t kClassifierStagedMaxBytesHopper = 110 * 1024;

// The staged kernel (see the top of the file): block = one row, kClassifierBlock threads, Vp * sizeof(floatX)
// bytes of dynamic shared memory (Vp % x128::size == 0, 16-byte aligned rows). The max and the sum are reduced in
// a fixed order (each thread's chunks in order, warp butterflies, warp 0 over the warps), so the results do not
// depend on thread timing.
template <bool kWriteGrad>
__global__ void __launch_bounds__(kClassifierBlock, 2)
    fused_classifier_staged_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    LLMC_DYNAMIC_SHARED(float4, classifier_smem);
    __shared__ float shared_red[kWarpSize];
    x128* srow = reinterpret_cast<x128*>(classifier_smem);
    constexpr int E = x128::size;
    const int stride = int(blockDim.x), row = blockIdx.x, chunks = Vp / E;
    floatX* x = logits + size_t(row) * Vp;
    const int target = targets[row];
    if (target == kNoTarget) {  // the whole block leaves here, before any copy or barrier
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if constexpr (kWriteGrad) {
            x128 zeros;
#pragma unroll
            for (int k = 0; k < E; k++) zeros.v[k] = from_float<floatX>(0.0f);
            for (int c = threadIdx.x; c < chunks; c += stride) store128(x + size_t(c) * E, zeros);
        }
        return;
    }

    // pass 1: the row into shared memory, every copy of the thread in flight at once (each thread then reads only
    // the chunks it copied, until thread 0 reads the target's logit after the reductions' barriers); the max
    for (int c = threadIdx.x; c < chunks; c += stride) cp_async<16>(srow + c, x + size_t(c) * E, true);
    cp_async_commit();
    cp_async_wait<0>();
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < chunks; c += stride) {
        const x128 v = srow[c];
#pragma unroll
        for (int k = 0; k < E; k++)
            if (c * E + k < V) mx = fmaxf(mx, v.f(k));
    }
    mx = block_max(mx, shared_red);
    // pass 2: the sum of exp(x - max)
    float sum = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += stride) {
        const x128 v = srow[c];
#pragma unroll
        for (int k = 0; k < E; k++)
            if (c * E + k < V) sum += expf(v.f(k) - mx);
    }
    const km::SoftmaxStat stat{mx, block_sum(sum, shared_red)};
    const bool valid = target >= 0 && target < V;
    if (threadIdx.x == 0)
        losses[row] = valid ? km::crossentropy_loss(stat, to_float(reinterpret_cast<const floatX*>(srow)[target])) : NAN;
    if constexpr (kWriteGrad) {  // pass 3: the gradient over the row (the padded columns: zeros)
        for (int c = threadIdx.x; c < chunks; c += stride) {
            const x128 v = srow[c];
            x128 out;
#pragma unroll
            for (int k = 0; k < E; k++) {
                const int i = c * E + k;
                out.v[k] = from_float<floatX>(i < V ? km::crossentropy_dlogit(v.f(k), stat, i == target, dloss) : 0.0f);
            }
            store128(x + size_t(c) * E, out);
        }
    }
}

// Logits per load of the kernel fused_classifier launches: x128::size when Vp and the buffer allow, else 1.
inline int fused_classifier_vec(const floatX* logits, int Vp) {
    return Vp % x128::size == 0 && aligned16(logits) ? x128::size : 1;
}

// Whether fused_classifier runs the staged kernel for rows of Vp logits on a GPU of compute capability `major`
// (128-bit rows that fit twice in its shared memory).
inline bool fused_classifier_staged(const floatX* logits, int Vp, int major) {
    return fused_classifier_vec(logits, Vp) > 1 &&
           size_t(Vp) * sizeof(floatX) <= (major >= 9 ? kClassifierStagedMaxBytesHopper : kClassifierStagedMaxBytes);
}

// logits (N, Vp) -> losses (N); with write_dlogits the logits become d(loss)/d(logits) scaled by dloss.
// targets (N) on the device; kNoTarget gives loss 0 and a zero gradient row, any other target outside [0, V) a
// NaN loss (and no one-hot term).
inline void fused_classifier(const CudaEnv& env, floatX* logits, float* losses, const int* targets, float dloss, int N,
                             int V, int Vp, bool write_dlogits) {
    if (N == 0) return;
    cudaStream_t stream = env.stream;
    const bool vec = fused_classifier_vec(logits, Vp) > 1;
    constexpr int kVec = x128::size;
    if (fused_classifier_staged(logits, Vp, env.props.major)) {
        const size_t smem = size_t(Vp) * sizeof(floatX);
        auto launch = [&](auto kernel) {  // two blocks per SM need most of its shared memory (the largest carveout)
            CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
            LLMC_LAUNCH(N, kClassifierBlock, smem, stream, kernel)(logits, losses, targets, dloss, V, Vp);
        };
        if (write_dlogits) launch(fused_classifier_staged_kernel<true>);
        else launch(fused_classifier_staged_kernel<false>);
    } else if (write_dlogits && vec)
        LLMC_LAUNCH(N, kClassifierBlock, 0, stream, fused_classifier_kernel<true, kVec>)(
            logits, losses, targets, dloss, V, Vp);
    else if (write_dlogits)
        LLMC_LAUNCH(N, kClassifierBlock, 0, stream, fused_classifier_kernel<true, 1>)(
            logits, losses, targets, dloss, V, Vp);
    else if (vec)
        LLMC_LAUNCH(N, kClassifierBlock, 0, stream, fused_classifier_kernel<false, kVec>)(
            logits, losses, targets, dloss, V, Vp);
    else
        LLMC_LAUNCH(N, kClassifierBlock, 0, stream, fused_classifier_kernel<false, 1>)(
            logits, losses, targets, dloss, V, Vp);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
