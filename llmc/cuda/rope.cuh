// Rotary position embedding (RoPE) for OLMo, in place on the q and k parts of the qkv projection's output
// (B, T, 3C): each row is q | k | v, C wide each, head h at columns h*hs .. h*hs + hs - 1 (hs = C / NH, even).
// GPT-NeoX "rotate half" layout, as OLMo uses: element i < hs/2 of a head pairs with element i + hs/2, and the
// pair turns by the angle t * theta^(-2i/hs) at position t. v is untouched.
//  - rope_forward: q, k <- rotated q, k (before either attention: the flash kernels and the matmul attention's
//    permute both read the rotated qkv, and the backward's attention kernels see the same rotated values).
//  - rope_backward: dq, dk of dqkv <- the gradient of the unrotated q, k (the rotation's transpose), after the
//    attention backward wrote dqkv.
// The angles come from the table of llmc/base/rope_table.h (built once on the host in double, uploaded once),
// so the CPU model rotates by the same floats; the per-pair arithmetic is km::rope_rotate(_backward).
// A standalone pass rather than a fusion into the matmul attention's permute: the flash path reads qkv directly
// and needs it anyway, and the pass moves 2/3 of what that permute moves (q and k read and written once), a
// small cost beside the attention's T x T products.
#pragma once
#include "llmc/cuda/cuda_common.cuh"

namespace llmc {

inline constexpr int kRopeBlock = 256;

// One thread turns VEC consecutive pairs of one head of q or k of one token: elements i .. i + VEC - 1 and
// i + hs/2 .. i + hs/2 + VEC - 1, each read and written by this thread only (so in place is safe). VEC =
// x128::size: two 128-bit loads of qkv and VEC float2 pairs of the table as 128-bit loads; needs hs/2 % VEC == 0
// and 16-byte aligned qkv and table. VEC = 1: any even hs.
template <bool kBackward, int VEC>
__global__ void rope_kernel(floatX* qkv, const float* table, int B, int T, int C, int NH) {
    const size_t chunks_per_token = size_t(C) / VEC;  // the q and k parts hold C / 2 pairs each
    const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (idx >= size_t(B) * T * chunks_per_token) return;
    const size_t token = idx / chunks_per_token;
    const int pair = int(idx % chunks_per_token) * VEC;  // 0 .. C - 1 over q's pairs, then k's
    const int hs = C / NH, half = hs / 2;
    const int part = pair / (C / 2), in_part = pair % (C / 2);
    const int head = in_part / half, i = in_part % half;
    const int t = int(token % size_t(T));
    floatX* x1 = qkv + token * 3 * size_t(C) + size_t(part) * C + size_t(head) * hs + i;
    floatX* x2 = x1 + half;
    const float* cs = table + 2 * (size_t(t) * half + i);  // VEC {cos, sin} pairs
    auto turn = [](float a, float b, float c, float s, float& oa, float& ob) {
        if constexpr (kBackward) km::rope_rotate_backward(a, b, c, s, oa, ob);
        else km::rope_rotate(a, b, c, s, oa, ob);
    };
    if constexpr (VEC == 1) {
        float o1, o2;
        turn(to_float(*x1), to_float(*x2), cs[0], cs[1], o1, o2);
        *x1 = from_float<floatX>(o1);
        *x2 = from_float<floatX>(o2);
    } else {
        static_assert(VEC == x128::size, "scalar or 128-bit");
        float csv[2 * VEC];
#pragma unroll
        for (int k = 0; k < 2 * VEC; k += 4) {
            LLMC_REQUIRE_ALIGNED(cs + k, 16);
            const float4 f = *reinterpret_cast<const float4*>(cs + k);
            csv[k] = f.x, csv[k + 1] = f.y, csv[k + 2] = f.z, csv[k + 3] = f.w;
        }
        const x128 a = load128(x1), b = load128(x2);
        x128 oa, ob;
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float o1, o2;
            turn(a.f(k), b.f(k), csv[2 * k], csv[2 * k + 1], o1, o2);
            oa.v[k] = from_float<floatX>(o1);
            ob.v[k] = from_float<floatX>(o2);
        }
        store128(x1, oa);
        store128(x2, ob);
    }
}

template <bool kBackward>
inline void launch_rope(floatX* qkv, const float* table, int B, int T, int C, int NH, cudaStream_t stream) {
    LLMC_CHECK(NH > 0 && C % NH == 0 && (C / NH) % 2 == 0, "rope: channels must split into heads of even size");
    if (size_t(B) * T * C == 0) return;
    const int half = C / NH / 2;
    const bool vec = half % x128::size == 0 && aligned16(qkv) && aligned16(table);
    const int per_thread = vec ? x128::size : 1;
    const unsigned blocks = unsigned(ceil_div<size_t>(size_t(B) * T * C / per_thread, kRopeBlock));
    if (vec) LLMC_LAUNCH(blocks, kRopeBlock, 0, stream, rope_kernel<kBackward, x128::size>)(qkv, table, B, T, C, NH);
    else LLMC_LAUNCH(blocks, kRopeBlock, 0, stream, rope_kernel<kBackward, 1>)(qkv, table, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
}

// qkv (B, T, 3C): q and k rotated in place. table: rope_table(max_T >= T, C / NH, theta) on the device, (max_T,
// C / NH / 2) pairs {cos, sin}.
inline void rope_forward(floatX* qkv, const float* table, int B, int T, int C, int NH, cudaStream_t stream) {
    launch_rope<false>(qkv, table, B, T, C, NH, stream);
}

// dqkv (B, T, 3C): dq and dk turned back in place (the gradients of the unrotated q and k); dv untouched.
inline void rope_backward(floatX* dqkv, const float* table, int B, int T, int C, int NH, cudaStream_t stream) {
    launch_rope<true>(dqkv, table, B, T, C, NH, stream);
}

}  // namespace llmc
