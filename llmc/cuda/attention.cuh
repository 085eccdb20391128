// Causal multi-head self-attention, forward and backward, without cuDNN (as llm.c's cuBLAS path):
//   forward:  qkv (B,T,3,NH,HS) -> permute to q,k,v (B,NH,T,HS) -> preatt = k q^T per head (batched cuBLASLt)
//             -> att = causal softmax(preatt / sqrt(HS)) (one warp per row, online max/sum)
//             -> y = att v (batched cuBLASLt) -> unpermute to (B,T,NH*HS).
//   backward: the same steps in reverse; the softmax backward runs in place on datt.
// q,k,v (qkvr) and att are kept per layer for the backward. Masked entries (key > query) of att are written
// as exact zeros and their gradients as zeros, so the full-square batched matmuls stay causal.
// Per-element maths: km::softmax_stat_* (online softmax) and km::softmax_backward_element (kernel_math.h).
#pragma once
#include <cmath>
#include <initializer_list>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/matmul.cuh"

namespace llmc {

// The permutes move VEC consecutive head-dim elements per thread (VEC = x128::size when HS allows it and the
// buffers are 16-byte aligned, else 1): one 128-bit load and store instead of eight 16-bit ones.
template <int VEC>
struct alignas(VEC * sizeof(floatX)) FloatXVec {
    floatX v[VEC];
};
template <int VEC>
__device__ __forceinline__ void copy_vec(floatX* dst, const floatX* src) {
    LLMC_REQUIRE_ALIGNED(dst, sizeof(FloatXVec<VEC>));
    LLMC_REQUIRE_ALIGNED(src, sizeof(FloatXVec<VEC>));
    *reinterpret_cast<FloatXVec<VEC>*>(dst) = *reinterpret_cast<const FloatXVec<VEC>*>(src);
}

// Where element idx of a head-major tensor (B, NH, T, HS) sits in a token-major one whose tokens are `row`
// elements apart, head nh at nh * HS of its token: (B, T, NH, HS) for row = NH * HS, one of q, k, v in
// (B, T, 3, NH, HS) for row = 3 * NH * HS.
__device__ __forceinline__ size_t token_major_offset(size_t idx, int T, int NH, int HS, size_t row) {
    const size_t hs = idx % size_t(HS), t = (idx / HS) % size_t(T), nh = (idx / (size_t(HS) * T)) % size_t(NH);
    const size_t b = idx / (size_t(HS) * T * NH);
    return (b * T + t) * row + nh * HS + hs;
}

// inp (B, T, 3, NH, HS) -> q, k, v each (B, NH, T, HS)
template <int VEC>
__global__ void permute_qkv_kernel(floatX* q, floatX* k, floatX* v, const floatX* inp, int B, int T, int NH, int HS) {
    const size_t idx = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC;
    const size_t total = size_t(B) * NH * T * HS;
    if (idx >= total) return;
    const size_t C = size_t(NH) * HS;
    const size_t src = token_major_offset(idx, T, NH, HS, 3 * C);
    copy_vec<VEC>(q + idx, inp + src);
    copy_vec<VEC>(k + idx, inp + src + C);
    copy_vec<VEC>(v + idx, inp + src + 2 * C);
}

template <int VEC>
__global__ void permute_qkv_backward_kernel(floatX* dinp, const floatX* dq, const floatX* dk, const floatX* dv, int B,
                                            int T, int NH, int HS) {
    const size_t idx = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC;
    const size_t total = size_t(B) * NH * T * HS;
    if (idx >= total) return;
    const size_t C = size_t(NH) * HS;
    const size_t dst = token_major_offset(idx, T, NH, HS, 3 * C);
    copy_vec<VEC>(dinp + dst, dq + idx);
    copy_vec<VEC>(dinp + dst + C, dk + idx);
    copy_vec<VEC>(dinp + dst + 2 * C, dv + idx);
}

// inp (B, NH, T, HS) -> out (B, T, NH, HS)
template <int VEC>
__global__ void unpermute_kernel(floatX* out, const floatX* inp, int B, int T, int NH, int HS) {
    const size_t idx = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC;
    const size_t total = size_t(B) * NH * T * HS;
    if (idx >= total) return;
    copy_vec<VEC>(out + token_major_offset(idx, T, NH, HS, size_t(NH) * HS), inp + idx);
}

// dout (B, T, NH, HS) -> dinp (B, NH, T, HS)
template <int VEC>
__global__ void unpermute_backward_kernel(floatX* dinp, const floatX* dout, int B, int T, int NH, int HS) {
    const size_t idx = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * VEC;
    const size_t total = size_t(B) * NH * T * HS;
    if (idx >= total) return;
    copy_vec<VEC>(dinp + idx, dout + token_major_offset(idx, T, NH, HS, size_t(NH) * HS));
}

// One warp per row (b, nh, t) of preatt (rows = B*NH*T, row length T): att[j] = softmax_j(scale * preatt[j])
// over j <= t, 0 for j > t.
__global__ void causal_softmax_forward_kernel(floatX* att, const floatX* preatt, float scale, int rows, int T) {
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= rows) return;
    const int t = row % T;
    const floatX* x = preatt + size_t(row) * T;
    floatX* y = att + size_t(row) * T;
    km::SoftmaxStat s = km::softmax_stat_empty();
    for (int j = lane; j <= t; j += kWarpSize) s = km::softmax_stat_push(s, scale * to_float(x[j]));
    s = warp_softmax_merge(s);
    const float inv_sum = 1.0f / s.sum;
    for (int j = lane; j < T; j += kWarpSize)
        y[j] = from_float<floatX>(j <= t ? expf(scale * to_float(x[j]) - s.max) * inv_sum : 0.0f);
}

// In place: datt (rows of T) becomes d(preatt): scale * att * (datt - sum_j att_j datt_j) over j <= t, 0 above.
__global__ void causal_softmax_backward_inplace_kernel(floatX* datt, const floatX* att, float scale, int rows, int T) {
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= rows) return;
    const int t = row % T;
    floatX* d = datt + size_t(row) * T;
    const floatX* p = att + size_t(row) * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += kWarpSize) dot += to_float(p[j]) * to_float(d[j]);
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += kWarpSize)
        d[j] = from_float<floatX>(j <= t ? km::softmax_backward_element(to_float(p[j]), to_float(d[j]), dot, scale) : 0.0f);
}

// The two softmax kernels with 128-bit loads and stores: lane l handles elements [8 l, 8 l + 8) of every
// 256-element stretch of the row. Needs T % x128::size == 0 and 16-byte aligned rows.
__global__ void causal_softmax_forward_vec_kernel(floatX* att, const floatX* preatt, float scale, int rows, int T) {
    constexpr int V = x128::size;
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= rows) return;
    const int live = row % T + 1;  // keys 0..t
    const floatX* x = preatt + size_t(row) * T;
    floatX* y = att + size_t(row) * T;
    km::SoftmaxStat s = km::softmax_stat_empty();
    for (int j0 = lane * V; j0 < live; j0 += kWarpSize * V) {
        const x128 xv = load128(x + j0);
#pragma unroll
        for (int k = 0; k < V; k++)
            if (j0 + k < live) s = km::softmax_stat_push(s, scale * xv.f(k));
    }
    s = warp_softmax_merge(s);
    const float inv_sum = 1.0f / s.sum;
    for (int j0 = lane * V; j0 < T; j0 += kWarpSize * V) {
        x128 out;
        if (j0 < live) {
            const x128 xv = load128(x + j0);
#pragma unroll
            for (int k = 0; k < V; k++)
                out.v[k] = from_float<floatX>(j0 + k < live ? expf(scale * xv.f(k) - s.max) * inv_sum : 0.0f);
        } else {
#pragma unroll
            for (int k = 0; k < V; k++) out.v[k] = from_float<floatX>(0.0f);
        }
        store128(y + j0, out);
    }
}

__global__ void causal_softmax_backward_inplace_vec_kernel(floatX* datt, const floatX* att, float scale, int rows, int T) {
    constexpr int V = x128::size;
    const int lane = threadIdx.x % kWarpSize;
    const int row = blockIdx.x * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
    if (row >= rows) return;
    const int live = row % T + 1;
    floatX* d = datt + size_t(row) * T;
    const floatX* p = att + size_t(row) * T;
    float dot = 0.0f;
    for (int j0 = lane * V; j0 < live; j0 += kWarpSize * V) {
        const x128 pv = load128(p + j0), dv = load128(d + j0);
#pragma unroll
        for (int k = 0; k < V; k++)
            if (j0 + k < live) dot += pv.f(k) * dv.f(k);
    }
    dot = warp_sum(dot);
    for (int j0 = lane * V; j0 < T; j0 += kWarpSize * V) {
        x128 out;
        if (j0 < live) {
            const x128 pv = load128(p + j0), dv = load128(d + j0);
#pragma unroll
            for (int k = 0; k < V; k++)
                out.v[k] = from_float<floatX>(j0 + k < live ? km::softmax_backward_element(pv.f(k), dv.f(k), dot, scale) : 0.0f);
        } else {
#pragma unroll
            for (int k = 0; k < V; k++) out.v[k] = from_float<floatX>(0.0f);
        }
        store128(d + j0, out);
    }
}

inline constexpr int kAttentionBlock = 256;

// Launches a permute kernel with 128-bit copies when the head size and every buffer allow it.
template <typename Launch>
inline void launch_permute(size_t elems, int HS, std::initializer_list<const void*> buffers, cudaStream_t stream,
                           Launch launch) {
    bool vec = HS % x128::size == 0;
    for (const void* b : buffers) vec = vec && aligned16(b);
    const int per_thread = vec ? x128::size : 1;
    const unsigned blocks = unsigned(ceil_div<size_t>(elems / per_thread, kAttentionBlock));
    launch(vec, blocks, stream);
    CUDA_CHECK_LAUNCH();
}

inline size_t attention_scratch_elems(int B, int T, int NH) { return size_t(B) * NH * T * T; }

// out (B,T,C) <- attention of inp (B,T,3C, the qkv projection; CLOBBERED: reused as scratch).
// Keeps qkvr (3 x (B,NH,T,HS): q, k, v) and att (B,NH,T,T) for the backward. preatt: attention_scratch_elems.
inline void attention_forward(const CudaEnv& env, floatX* out, floatX* qkvr, floatX* att, floatX* preatt, floatX* inp,
                              int B, int T, int C, int NH) {
    LLMC_CHECK(C % NH == 0, "attention_forward: channels not divisible by heads");
    const int HS = C / NH;
    const size_t btc = size_t(B) * T * C;
    floatX* q = qkvr;
    floatX* k = qkvr + btc;
    floatX* v = qkvr + 2 * btc;
    launch_permute(btc, HS, {q, k, v, inp}, env.stream, [&](bool vec, unsigned blocks, cudaStream_t st) {
        if (vec) LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, permute_qkv_kernel<x128::size>)(
            q, k, v, inp, B, T, NH, HS);
        else LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, permute_qkv_kernel<1>)(q, k, v, inp, B, T, NH, HS);
    });
    const int BNH = B * NH;
    // preatt[b,h][t1][t2] = q[t1] . k[t2]  (row-major T x T per head)
    matmul_lt<floatX>(env, preatt, k, q, nullptr, km::attention_preatt_gemm(BNH, T, HS), false);
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const int rows = BNH * T;
    const int rows_per_block = kAttentionBlock / kWarpSize;
    const bool vec_rows = T % x128::size == 0 && aligned16(att) && aligned16(preatt);
    if (vec_rows)
        LLMC_LAUNCH(ceil_div(rows, rows_per_block), kAttentionBlock, 0, env.stream, causal_softmax_forward_vec_kernel)(
            att, preatt, scale, rows, T);
    else
        LLMC_LAUNCH(ceil_div(rows, rows_per_block), kAttentionBlock, 0, env.stream, causal_softmax_forward_kernel)(
            att, preatt, scale, rows, T);
    CUDA_CHECK_LAUNCH();
    // y[b,h] = att @ v  (T x HS), into the now-free inp buffer
    floatX* vaccum = inp;
    matmul_lt<floatX>(env, vaccum, v, att, nullptr, km::attention_av_gemm(BNH, T, HS), false);
    launch_permute(btc, HS, {out, vaccum}, env.stream, [&](bool vec, unsigned blocks, cudaStream_t st) {
        if (vec) LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, unpermute_kernel<x128::size>)(out, vaccum, B, T, NH, HS);
        else LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, unpermute_kernel<1>)(out, vaccum, B, T, NH, HS);
    });
}

// dinp (B,T,3C) <- gradient of the qkv input, given dout (B,T,C) and the forward's qkvr and att.
// Scratch: dqkvr (3*B*T*C), datt (attention_scratch_elems), dy (B*T*C).
inline void attention_backward(const CudaEnv& env, floatX* dinp, floatX* dqkvr, floatX* datt, floatX* dy,
                               const floatX* dout, const floatX* qkvr, const floatX* att, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const size_t btc = size_t(B) * T * C;
    const floatX* q = qkvr;
    const floatX* k = qkvr + btc;
    const floatX* v = qkvr + 2 * btc;
    floatX* dq = dqkvr;
    floatX* dk = dqkvr + btc;
    floatX* dv = dqkvr + 2 * btc;
    const int BNH = B * NH;
    launch_permute(btc, HS, {dy, dout}, env.stream, [&](bool vec, unsigned blocks, cudaStream_t st) {
        if (vec) LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, unpermute_backward_kernel<x128::size>)(
            dy, dout, B, T, NH, HS);
        else LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, unpermute_backward_kernel<1>)(dy, dout, B, T, NH, HS);
    });
    // datt[t][t2] = dy[t] . v[t2]
    matmul_lt<floatX>(env, datt, v, dy, nullptr, km::attention_datt_gemm(BNH, T, HS), false);
    // dv = att^T @ dy
    matmul_lt<floatX>(env, dv, dy, att, nullptr, km::attention_dv_gemm(BNH, T, HS), false);
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const int rows = BNH * T;
    const int rows_per_block = kAttentionBlock / kWarpSize;
    if (T % x128::size == 0 && aligned16(datt) && aligned16(att))
        LLMC_LAUNCH(ceil_div(rows, rows_per_block), kAttentionBlock, 0, env.stream,
                    causal_softmax_backward_inplace_vec_kernel)(datt, att, scale, rows, T);
    else
        LLMC_LAUNCH(ceil_div(rows, rows_per_block), kAttentionBlock, 0, env.stream,
                    causal_softmax_backward_inplace_kernel)(datt, att, scale, rows, T);
    CUDA_CHECK_LAUNCH();
    const floatX* dpreatt = datt;
    // dq = dpreatt @ k ; dk = dpreatt^T @ q
    matmul_lt<floatX>(env, dq, k, dpreatt, nullptr, km::attention_dq_gemm(BNH, T, HS), false);
    matmul_lt<floatX>(env, dk, q, dpreatt, nullptr, km::attention_dk_gemm(BNH, T, HS), false);
    launch_permute(btc, HS, {dinp, dq, dk, dv}, env.stream, [&](bool vec, unsigned blocks, cudaStream_t st) {
        if (vec) LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, permute_qkv_backward_kernel<x128::size>)(
            dinp, dq, dk, dv, B, T, NH, HS);
        else LLMC_LAUNCH(blocks, kAttentionBlock, 0, st, permute_qkv_backward_kernel<1>)(
            dinp, dq, dk, dv, B, T, NH, HS);
    });
}

}  // namespace llmc
