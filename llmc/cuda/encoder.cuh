// Token + position embedding. Forward: out[b,t,:] = wte[token[b,t],:] + wpe[t,:], or the token embedding alone
// for a model without learned positions (OLMo: wpe null; its positions are RoPE's, in the attention).
// Backward (deterministic, as llm.c): no atomics on wte rows. The host sorts the batch's positions into one
// bucket per distinct token (EncoderBackwardPlan, built from the host copy of the inputs, in ascending
// position order); a thread then owns (bucket, channels) and sums dout over that bucket's positions in order,
// adding the total into dwte[token]. dwpe[t] sums over the batch index in order. So the gradient is the same
// bit for bit on every run. Gradients are fp32 (the optimizers and the all-reduce work in fp32).
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

// kPositions false: wpe is null and out is the wte row itself.
template <bool kVector, bool kPositions = true>
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T,
                                       int C) {
    const int step = kVector ? x128::size : 1;
    const size_t idx = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * step;
    const size_t total = size_t(B) * T * C;
    if (idx >= total) return;
    const size_t bt = idx / C;
    const int c = static_cast<int>(idx % C);
    const int t = static_cast<int>(bt % T);
    const int token = inp[bt];
    const floatX* wte_row = wte + size_t(token) * C;
    const floatX* wpe_row = kPositions ? wpe + size_t(t) * C : nullptr;
    if constexpr (!kPositions && kVector) {
        store128(out + idx, load128(wte_row + c));
    } else if constexpr (!kPositions) {
        out[idx] = wte_row[c];
    } else if constexpr (kVector) {
        const x128 a = load128(wte_row + c), p = load128(wpe_row + c);
        x128 o;
#pragma unroll
        for (int k = 0; k < x128::size; k++) o.v[k] = from_float<floatX>(a.f(k) + p.f(k));
        store128(out + idx, o);
    } else {
        out[idx] = from_float<floatX>(to_float(wte_row[c]) + to_float(wpe_row[c]));
    }
}

// out (B,T,C) = wte[inp] + wpe[0..T), inp (B,T) token ids on the device; wpe null: out = wte[inp].
inline void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            cudaStream_t stream) {
    const size_t total = size_t(B) * T * C;
    if (total == 0) return;
    constexpr int block = 256;
    const bool vector = C % x128::size == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    const size_t threads = vector ? total / x128::size : total;
    const unsigned blocks = unsigned(ceil_div<size_t>(threads, block));
    if (wpe && vector)
        LLMC_LAUNCH(blocks, block, 0, stream, encoder_forward_kernel<true>)(out, inp, wte, wpe, B, T, C);
    else if (wpe)
        LLMC_LAUNCH(blocks, block, 0, stream, encoder_forward_kernel<false>)(out, inp, wte, wpe, B, T, C);
    else if (vector)
        LLMC_LAUNCH(blocks, block, 0, stream, encoder_forward_kernel<true, false>)(out, inp, wte, wpe, B, T, C);
    else
        LLMC_LAUNCH(blocks, block, 0, stream, encoder_forward_kernel<false, false>)(out, inp, wte, wpe, B, T, C);
    CUDA_CHECK_LAUNCH();
}

// Host-built schedule for the wte gradient: positions grouped by token. Device layout (ints):
// [bucket_token x nb][bucket_start x (nb+1)][positions x BT].
struct EncoderBackwardPlan {
    int num_buckets = 0;
    int num_positions = 0;
    std::vector<int> packed;

    static size_t device_ints(int BT) { return 3 * size_t(BT) + 1; }

    void build(const int* tokens, int BT) {
        std::vector<int> order(BT);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
        std::vector<int> bucket_token, bucket_start;
        for (int i = 0; i < BT; i++) {
            if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) {
                bucket_token.push_back(tokens[order[i]]);
                bucket_start.push_back(i);
            }
        }
        bucket_start.push_back(BT);
        num_buckets = static_cast<int>(bucket_token.size());
        num_positions = BT;
        packed.clear();
        packed.insert(packed.end(), bucket_token.begin(), bucket_token.end());
        packed.insert(packed.end(), bucket_start.begin(), bucket_start.end());
        packed.insert(packed.end(), order.begin(), order.end());
    }
    // Copies the plan into `device` (device_ints(BT) ints) through a pinned staging buffer (asynchronous).
    void upload(int* device, PinnedUpload<int>& staging, cudaStream_t stream) const {
        staging.upload(device, packed.data(), packed.size(), stream);
    }
};

inline constexpr int kEncoderBwdBlock = 128;

// grid (num_buckets, channel blocks); each thread owns kPer consecutive channels of one bucket.
template <int kPer>
__global__ void encoder_backward_wte_kernel(float* dwte, const int* plan, int num_buckets, const floatX* dout, int C) {
    const int bucket = blockIdx.x;
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * kPer;
    if (c0 >= C) return;
    const int* bucket_token = plan;
    const int* bucket_start = plan + num_buckets;
    const int* positions = plan + 2 * num_buckets + 1;
    const int token = bucket_token[bucket];
    float acc[kPer];
#pragma unroll
    for (int k = 0; k < kPer; k++) acc[k] = 0.0f;
    for (int i = bucket_start[bucket]; i < bucket_start[bucket + 1]; i++) {
        const floatX* row = dout + size_t(positions[i]) * C + c0;
        if constexpr (kPer == x128::size) {
            const x128 d = load128(row);
#pragma unroll
            for (int k = 0; k < kPer; k++) acc[k] += d.f(k);
        } else {
#pragma unroll
            for (int k = 0; k < kPer; k++) acc[k] += to_float(row[k]);
        }
    }
    float* out = dwte + size_t(token) * C + c0;
#pragma unroll
    for (int k = 0; k < kPer; k++) out[k] += acc[k];
}

// accumulate: dwpe += the sums, else dwpe = them.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C, bool accumulate) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;  // t * C + c
    if (idx >= T * C) return;
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += to_float(dout[size_t(b) * T * C + idx]);
    dwpe[idx] = accumulate ? dwpe[idx] + acc : acc;
}

// dwte += scatter of dout by token (using `plan`, already uploaded to `plan_device`), dwpe += sum over b of dout
// (accumulate false: dwpe's first T rows = the sums; its later rows, positions this batch does not reach, are the
// caller's; dwte is always added to: the tied classifier writes it first). dwpe null: no positions (OLMo).
inline void encoder_backward(float* dwte, float* dwpe, const floatX* dout, const EncoderBackwardPlan& plan,
                             const int* plan_device, int B, int T, int C, cudaStream_t stream, bool accumulate = true) {
    LLMC_CHECK(plan.num_positions == B * T, "encoder_backward: the plan was built for another batch shape");
    if (plan.num_buckets > 0) {
        if (C % x128::size == 0 && aligned16(dout)) {
            const dim3 grid(plan.num_buckets, ceil_div(C / x128::size, kEncoderBwdBlock));
            LLMC_LAUNCH(grid, kEncoderBwdBlock, 0, stream, encoder_backward_wte_kernel<x128::size>)(
                dwte, plan_device, plan.num_buckets, dout, C);
        } else {
            const dim3 grid(plan.num_buckets, ceil_div(C, kEncoderBwdBlock));
            LLMC_LAUNCH(grid, kEncoderBwdBlock, 0, stream, encoder_backward_wte_kernel<1>)(
                dwte, plan_device, plan.num_buckets, dout, C);
        }
        CUDA_CHECK_LAUNCH();
    }
    if (!dwpe) return;
    LLMC_LAUNCH(ceil_div(T * C, 256), 256, 0, stream, encoder_backward_wpe_kernel)(dwpe, dout, B, T, C, accumulate);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
