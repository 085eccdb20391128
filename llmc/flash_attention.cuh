// Flash attention (bf16 build, head size 64): causal multi-head attention computed tile by tile on the tensor
// cores (mma.sync m16n8k16, bf16 inputs, fp32 accumulation) with an online softmax, so the B x NH x T x T
// score and probability matrices of llmc/attention.cuh are never written to memory (400 MB per layer for
// GPT-2 124M at B=16, T=1024: 4.8 GB of activations and the softmax and permute traffic of every step).
//
//   forward:  reads q, k, v straight from the qkv projection (B, T, 3, NH, 64), writes y (B, T, NH*64) and the
//             per-row log-sum-exp (B, NH, T) fp32 that the backward needs (base 2, softmax scale folded in).
//   backward: delta = rowsum(dy * y) per (b, h, t), then two kernels that recompute the probabilities from q, k
//             and the log-sum-exp: one per key tile accumulates dK and dV over the query tiles at or below the
//             diagonal, one per query tile accumulates dQ over the key tiles. Both write straight into dqkv
//             (B, T, 3C). No atomics: every output element has one owner, so gradients are bit-identical from
//             run to run (the price: the dQ kernel recomputes S and dP, 7 tile products per tile pair where an
//             atomic dQ would need 5).
//
// Blocks are 4 warps; each warp owns 16 rows of the block's 64-row tile (its operand fragments stay in
// registers) and walks the other operand in 64-row tiles staged in shared memory by cp.async, double-buffered
// so the next tile loads while the tensor cores work on the current one. Registers are capped for 4, 2 and 3
// resident blocks per SM (forward, dK/dV, dQ; ptxas spills 32 bytes in the forward at that cap). Staged rows
// are padded to 72 bf16 (144 bytes): the 8 row addresses of each ldmatrix phase fall in 8 different 4-bank
// groups. Tiles are kept row-major as in global memory; operands needed transposed (V in P V, dO in dV, Q in
// dK, K in dQ) are read with ldmatrix.trans. Tiles below the diagonal are full; the diagonal tile masks
// key > query. Heavy tiles (most work under the causal mask) are launched first.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), g = lane / 4,
// t = lane % 4: A (16 x 16, row-major) a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
// a[3] = (g+8, 2t+8..); B (16 x 8) b0 = rows 2t..2t+1 of column g, b1 = rows 2t+8..; C/D (16 x 8, fp32)
// c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..). So the accumulators of two adjacent 8-column tiles are, once
// rounded to bf16, exactly the A fragment of the next product (P V, dS K...) with no data movement.
// dev/cuda/block_emulator.h emulates mma.sync and ldmatrix from those tables, and test/emu_flash_attention.cpp
// checks these kernels against a double-precision reference on the CPU; dev/cuda/attention.cu times them on a
// GPU against the matmul attention.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "llmc/cuda_common.cuh"

namespace llmc {
namespace flash {

using bf16 = __nv_bfloat16;

inline constexpr int kHeadSize = 64;
inline constexpr int kTile = 64;                   // rows of a tile (queries or keys)
inline constexpr int kWarps = 4;                   // 16 rows of the block's own tile per warp
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kPitch = kHeadSize + 8;       // bf16 per staged row
inline constexpr int kTileElems = kTile * kPitch;  // bf16 per staged tile
inline constexpr int kNT = kTile / 8;              // 8-column accumulator tiles across a 64-wide product
inline constexpr int kKT = kHeadSize / 16;         // 16-deep k steps across the head dim
static_assert(kTile == kHeadSize, "the products below use one tile width for keys, queries and the head dim");
// forward: Q + 2 x (K, V); backward K/V: K, V + 2 x (Q, dO) + 2 x (lse, delta); backward Q: Q, dO + 2 x (K, V)
inline constexpr size_t kForwardSmem = 5 * kTileElems * sizeof(bf16);
inline constexpr size_t kBackwardKVSmem = 6 * kTileElems * sizeof(bf16) + 4 * kTile * sizeof(float);
inline constexpr size_t kBackwardQSmem = 6 * kTileElems * sizeof(bf16);

// ---- warp-level building blocks ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof(u));
    return u;
}
// The bf16 in the low / high half of a 32-bit word, widened to fp32 (exact).
__device__ __forceinline__ float bf16_lo(uint32_t w) {
    const uint32_t bits = w << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
    const uint32_t bits = w & 0xffff0000u;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

// Two bf16 (a packed pair) to global memory as one 32-bit store.
__device__ __forceinline__ void store_bf16x2(bf16* dst, uint32_t pair) {
    LLMC_REQUIRE_ALIGNED(dst, 4);
    *reinterpret_cast<uint32_t*>(dst) = pair;
}
// Eight bf16 as four packed pairs, one 128-bit load.
__device__ __forceinline__ void load_bf16x8(uint32_t (&pairs)[4], const bf16* src) {
    LLMC_REQUIRE_ALIGNED(src, 16);
    const int4 v = *reinterpret_cast<const int4*>(src);
    pairs[0] = uint32_t(v.x), pairs[1] = uint32_t(v.y), pairs[2] = uint32_t(v.z), pairs[3] = uint32_t(v.w);
}

// d += a * b for one 16 x 8 x 16 tile (bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::mma_bf16_m16n8k16(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8 x 8 bf16 matrices from shared memory; `row` is this lane's row address (lanes 8i..8i+7: matrix i).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::ldmatrix_x4(r, row, TRANS);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

// Asynchronous global -> shared copies of BYTES (4 or 16), zero-filled when !valid (the source is not read).
// The emulator performs them only at the issuing thread's wait (dev/cuda/block_emulator.h).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async(dst, src, BYTES, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(BYTES),
                     "r"(valid ? BYTES : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async_wait(PENDING);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
#endif
}

// Rows [row0, row0 + 64) of a strided row-major tensor into a staged tile (asynchronously; rows at or past T
// become zeros).
__device__ __forceinline__ void stage_tile(bf16* s, const bf16* src, size_t stride, int row0, int T) {
    constexpr int kChunks = kHeadSize / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        const bool live = row0 + r < T;
        cp_async<16>(s + r * kPitch + c, src + size_t(live ? row0 + r : 0) * stride + c, live);
    }
}
// 64 consecutive floats from src[row0..] (zeros at or past T), asynchronously.
__device__ __forceinline__ void stage_row_floats(float* s, const float* src, int row0, int T) {
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
        const bool live = row0 + i < T;
        cp_async<4>(s + i, src + (live ? row0 + i : 0), live);
    }
}

// A fragment of the 16 x 16 block at (row r0, column k0) of a staged tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int r0, int k0, int lane) {
    ldmatrix_x4<false>(a, s + (r0 + (lane & 15)) * kPitch + k0 + (lane >> 4) * 8);
}
// acc (16 x 64) += A (16 x 64 over kKT k-steps) * B, B[k][n] = s[n][k]: B's columns are the staged rows
// (S = Q K^T with K staged, and the like). One ldmatrix gives b0, b1 of two adjacent 8-column tiles.
__device__ __forceinline__ void warp_product(float (&acc)[kNT][4], const uint32_t (&a)[kKT][4], const bf16* s,
                                             int lane) {
    const bf16* base = s + ((lane & 7) + (lane >> 4) * 8) * kPitch + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < kNT / 2; np++)
#pragma unroll
        for (int kk = 0; kk < kKT; kk++) {
            uint32_t b[4];
            ldmatrix_x4<false>(b, base + np * 16 * kPitch + kk * 16);
            mma_16816(acc[2 * np], a[kk], b[0], b[1]);
            mma_16816(acc[2 * np + 1], a[kk], b[2], b[3]);
        }
}
// acc (16 x 64) += P (16 x 64, fp32 accumulator tiles rounded to bf16) * B, B[k][n] = s[k][n]: B's rows are the
// staged rows (O += P V with V staged, and the like), read transposed by ldmatrix.trans.
__device__ __forceinline__ void warp_product_acc(float (&acc)[kNT][4], const float (&p)[kNT][4], const bf16* s,
                                                 int lane) {
    const bf16* base = s + (lane & 15) * kPitch + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; kk++) {
        uint32_t a[4];
        a[0] = pack_bf16x2(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack_bf16x2(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < kNT / 2; np++) {
            uint32_t b[4];
            ldmatrix_x4<true>(b, base + kk * 16 * kPitch + np * 16);
            mma_16816(acc[2 * np], a, b[0], b[1]);
            mma_16816(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// The rows of the (batch, head) of this block (blockIdx.y = b * NH + h): q, k, v in the qkv tensor (row stride
// 3C), row 0 of the head in (B, T, C) tensors (y, dy) and in (B * NH, T) ones (lse, delta).
struct Head {
    int C;
    size_t stride;
    const bf16 *q, *k, *v;
    size_t y_offset, row_offset;
};
__device__ __forceinline__ Head head_of_block(const bf16* qkv, int T, int NH) {
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    Head hd;
    hd.C = NH * kHeadSize;
    hd.stride = 3 * size_t(hd.C);
    hd.q = qkv + size_t(b) * T * hd.stride + size_t(h) * kHeadSize;
    hd.k = hd.q + hd.C;
    hd.v = hd.q + 2 * hd.C;
    hd.y_offset = size_t(b) * T * hd.C + size_t(h) * kHeadSize;
    hd.row_offset = size_t(bh) * T;
    return hd;
}

// Top of each step over the streamed tiles: starts copying the next tile into the other buffer (when `more`;
// that buffer was freed by the barrier that ended the previous step), waits for the current one, and makes it
// visible to the whole block.
template <class StageNext>
__device__ __forceinline__ void current_tile_ready(bool more, StageNext stage_next) {
    if (more) {
        stage_next();
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// ---- kernels ---------------------------------------------------------------------------------------------------
// grid (query tiles, B * NH), kThreads threads, kForwardSmem bytes. out (B, T, NH * 64); lse (B * NH, T) holds
// max + log2(sum) of the base-2 logits x = q.k * scale * log2(e).
__global__ void __launch_bounds__(kThreads, 4) flash_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv,
                                                                          int T, int NH, float scale_log2) {
    LLMC_DYNAMIC_SHARED(float4, flash_smem);
    // sQ, then two buffers of (K, V) tiles (buffer index arithmetic, not pointer arrays: those go to local memory)
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem);
    auto sK = [&](int buf) { return sQ + (1 + 2 * buf) * kTileElems; };
    auto sV = [&](int buf) { return sQ + (2 + 2 * buf) * kTileElems; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int qtile = int(gridDim.x) - 1 - int(blockIdx.x);
    const Head hd = head_of_block(qkv, T, NH);
    const int q0 = qtile * kTile;
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};

    stage_tile(sQ, hd.q, hd.stride, q0, T);
    stage_tile(sK(0), hd.k, hd.stride, 0, T);
    stage_tile(sV(0), hd.v, hd.stride, 0, T);
    cp_async_commit();
    uint32_t qa[kKT][4];
    float o[kNT][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's share of the row sums
    for (int kt = 0; kt <= qtile; kt++) {
        const int buf = kt & 1;
        current_tile_ready(kt < qtile, [&] {
            stage_tile(sK(buf ^ 1), hd.k, hd.stride, (kt + 1) * kTile, T);
            stage_tile(sV(buf ^ 1), hd.v, hd.stride, (kt + 1) * kTile, T);
        });
        if (kt == 0)
#pragma unroll
            for (int kk = 0; kk < kKT; kk++) load_a(qa[kk], sQ, warp * 16, kk * 16, lane);
        float s[kNT][4] = {};
        warp_product(s, qa, sK(buf), lane);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = kt * kTile + nt * 8 + 2 * t + (i & 1);
                const float x = kt == qtile && key > row[i / 2] ? -INFINITY : s[nt][i] * scale_log2;
                s[nt][i] = x;
                mx[i / 2] = fmaxf(mx[i / 2], x);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {  // key kt * 64 <= every row of the tile, so the new max is finite
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            alpha[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = exp2f(s[nt][i] - m[i / 2]);
                s[nt][i] = p;
                l[i / 2] += p;
                o[nt][i] *= alpha[i / 2];
            }
        warp_product_acc(o, s, sV(buf), lane);
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
    bf16* y = out + hd.y_offset;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (row[r] >= T) continue;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
            store_bf16x2(y + size_t(row[r]) * hd.C + nt * 8 + 2 * t, pack_bf16x2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv));
        if (t == 0) lse[hd.row_offset + row[r]] = m[r] + log2f(l[r]);
    }
}

// delta (B * NH, T) = rowsum(dy * y) per head, fp32. One thread per (b, h, t).
__global__ void flash_attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH) {
    const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (idx >= size_t(B) * NH * T) return;
    const int t = int(idx % T);
    const size_t bh = idx / T;
    const int h = int(bh % NH), b = int(bh / NH);
    const size_t off = (size_t(b) * T + t) * NH * kHeadSize + size_t(h) * kHeadSize;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kHeadSize; c += 8) {
        uint32_t d4[4], o4[4];
        load_bf16x8(d4, dout + off + c);
        load_bf16x8(o4, out + off + c);
#pragma unroll
        for (int j = 0; j < 4; j++) sum += bf16_lo(d4[j]) * bf16_lo(o4[j]) + bf16_hi(d4[j]) * bf16_hi(o4[j]);
    }
    delta[idx] = sum;
}

// grid (key tiles, B * NH), kThreads threads, kBackwardKVSmem bytes. Warp w owns keys k0 + 16 w .. + 15 and works
// on transposed products (rows are keys): S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
// dK += dS^T Q; then dK * scale and dV go to dqkv's k and v parts.
__global__ void __launch_bounds__(kThreads) flash_attention_backward_kv_kernel(bf16* dqkv, const bf16* qkv,
                                                                              const bf16* dout, const float* lse,
                                                                              const float* delta, int T, int NH,
                                                                              float scale_log2, float scale) {
    LLMC_DYNAMIC_SHARED(float4, flash_smem);
    // sK, sV, then two buffers of (Q, dO) tiles, then two of (lse, delta) rows
    bf16* sK = reinterpret_cast<bf16*>(flash_smem);
    bf16* sV = sK + kTileElems;
    auto sQ = [&](int buf) { return sK + (2 + 2 * buf) * kTileElems; };
    auto sdO = [&](int buf) { return sK + (3 + 2 * buf) * kTileElems; };
    float* rows = reinterpret_cast<float*>(sK + 6 * kTileElems);
    auto sL = [&](int buf) { return rows + 2 * buf * kTile; };
    auto sD = [&](int buf) { return rows + (2 * buf + 1) * kTile; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int ktile = blockIdx.x;  // low key tiles see the most query tiles: first
    const Head hd = head_of_block(qkv, T, NH);
    const bf16* dy = dout + hd.y_offset;
    const int k0 = ktile * kTile;
    const int key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
    const int tiles = (T + kTile - 1) / kTile;

    stage_tile(sK, hd.k, hd.stride, k0, T);
    stage_tile(sV, hd.v, hd.stride, k0, T);
    auto stage_query_tile = [&](int qt, int buf) {
        stage_tile(sQ(buf), hd.q, hd.stride, qt * kTile, T);
        stage_tile(sdO(buf), dy, hd.C, qt * kTile, T);
        stage_row_floats(sL(buf), lse + hd.row_offset, qt * kTile, T);
        stage_row_floats(sD(buf), delta + hd.row_offset, qt * kTile, T);
    };
    stage_query_tile(ktile, 0);
    cp_async_commit();
    uint32_t ka[kKT][4], va[kKT][4];
    float dk[kNT][4] = {}, dv[kNT][4] = {};
    for (int qt = ktile; qt < tiles; qt++) {
        const int buf = (qt - ktile) & 1, q0 = qt * kTile;
        current_tile_ready(qt + 1 < tiles, [&] { stage_query_tile(qt + 1, buf ^ 1); });
        if (qt == ktile)
#pragma unroll
            for (int kk = 0; kk < kKT; kk++) {
                load_a(ka[kk], sK, warp * 16, kk * 16, lane);
                load_a(va[kk], sV, warp * 16, kk * 16, lane);
            }
        float p[kNT][4] = {};
        const float* L = sL(buf);
        const float* D = sD(buf);
        warp_product(p, ka, sQ(buf), lane);
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = nt * 8 + 2 * t + (i & 1);
                const bool masked = (qt == ktile && key[i / 2] > q0 + c) || q0 + c >= T;
                p[nt][i] = masked ? 0.0f : exp2f(p[nt][i] * scale_log2 - L[c]);
            }
        warp_product_acc(dv, p, sdO(buf), lane);
        float ds[kNT][4] = {};
        warp_product(ds, va, sdO(buf), lane);
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) ds[nt][i] = p[nt][i] * (ds[nt][i] - D[nt * 8 + 2 * t + (i & 1)]);
        warp_product_acc(dk, ds, sQ(buf), lane);
        __syncthreads();
    }
    bf16* dkey = dqkv + (hd.k - qkv);  // dqkv has qkv's layout
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= T) continue;
#pragma unroll
        for (int nt = 0; nt < kNT; nt++) {
            bf16* dst = dkey + size_t(key[r]) * hd.stride + nt * 8 + 2 * t;
            store_bf16x2(dst, pack_bf16x2(dk[nt][2 * r] * scale, dk[nt][2 * r + 1] * scale));
            store_bf16x2(dst + hd.C, pack_bf16x2(dv[nt][2 * r], dv[nt][2 * r + 1]));
        }
    }
}

// grid (query tiles, B * NH), kThreads threads, kBackwardQSmem bytes. Warp w owns queries q0 + 16 w .. + 15:
// S = Q K^T, P, dP = dO V^T, dS = P (dP - delta), dQ += dS K; dQ * scale goes to dqkv's q part.
__global__ void __launch_bounds__(kThreads, 3) flash_attention_backward_q_kernel(bf16* dqkv, const bf16* qkv,
                                                                             const bf16* dout, const float* lse,
                                                                             const float* delta, int T, int NH,
                                                                             float scale_log2, float scale) {
    LLMC_DYNAMIC_SHARED(float4, flash_smem);
    // sQ, sdO, then two buffers of (K, V) tiles
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem);
    bf16* sdO = sQ + kTileElems;
    auto sK = [&](int buf) { return sQ + (2 + 2 * buf) * kTileElems; };
    auto sV = [&](int buf) { return sQ + (3 + 2 * buf) * kTileElems; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int qtile = int(gridDim.x) - 1 - int(blockIdx.x);
    const Head hd = head_of_block(qkv, T, NH);
    const bf16* dy = dout + hd.y_offset;
    const int q0 = qtile * kTile;
    const int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
    float L[2], D[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        L[r] = row[r] < T ? lse[hd.row_offset + row[r]] : INFINITY;  // exp2(x - inf) = 0: no probability
        D[r] = row[r] < T ? delta[hd.row_offset + row[r]] : 0.0f;
    }

    stage_tile(sQ, hd.q, hd.stride, q0, T);
    stage_tile(sdO, dy, hd.C, q0, T);
    stage_tile(sK(0), hd.k, hd.stride, 0, T);
    stage_tile(sV(0), hd.v, hd.stride, 0, T);
    cp_async_commit();
    uint32_t qa[kKT][4], da[kKT][4];
    float dq[kNT][4] = {};
    for (int kt = 0; kt <= qtile; kt++) {
        const int buf = kt & 1;
        current_tile_ready(kt < qtile, [&] {
            stage_tile(sK(buf ^ 1), hd.k, hd.stride, (kt + 1) * kTile, T);
            stage_tile(sV(buf ^ 1), hd.v, hd.stride, (kt + 1) * kTile, T);
        });
        if (kt == 0)
#pragma unroll
            for (int kk = 0; kk < kKT; kk++) {
                load_a(qa[kk], sQ, warp * 16, kk * 16, lane);
                load_a(da[kk], sdO, warp * 16, kk * 16, lane);
            }
        float p[kNT][4] = {};
        warp_product(p, qa, sK(buf), lane);
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = kt * kTile + nt * 8 + 2 * t + (i & 1);
                const float x = exp2f(p[nt][i] * scale_log2 - L[i / 2]);
                p[nt][i] = kt == qtile && key > row[i / 2] ? 0.0f : x;
            }
        float ds[kNT][4] = {};
        warp_product(ds, da, sV(buf), lane);
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) ds[nt][i] = p[nt][i] * (ds[nt][i] - D[i / 2]);
        warp_product_acc(dq, ds, sK(buf), lane);
        __syncthreads();
    }
    bf16* dquery = dqkv + (hd.q - qkv);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= T) continue;
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
            store_bf16x2(dquery + size_t(row[r]) * hd.stride + nt * 8 + 2 * t,
                         pack_bf16x2(dq[nt][2 * r] * scale, dq[nt][2 * r + 1] * scale));
    }
}

// 1/sqrt(64) and its base-2 form (the kernels use exp2f: logits are scaled by log2(e) once).
inline float softmax_scale() { return 1.0f / std::sqrt(float(kHeadSize)); }
inline float softmax_scale_log2() { return softmax_scale() * 1.4426950408889634f; }

}  // namespace flash

// Why flash attention cannot run for a model and build, or "" when it can.
inline std::string flash_attention_unsupported(int C, int NH) {
    if (kFloatXIsFloat) return "flash attention needs the bf16 build (this is the fp32 build)";
    if (NH <= 0 || C % NH != 0 || C / NH != flash::kHeadSize)
        return "flash attention needs head size " + std::to_string(flash::kHeadSize) + " (channels / heads); got " +
               std::to_string(NH > 0 ? C / NH : 0);
    return "";
}
inline size_t flash_attention_lse_floats(int B, int T, int NH) { return size_t(B) * NH * T; }

#ifdef __CUDACC__  // launches compile with nvcc only
// out (B, T, C) <- causal attention of qkv (B, T, 3C; not modified); lse (B, NH, T) kept for the backward.
inline void flash_attention_forward(const CudaEnv& env, floatX* out, float* lse, const floatX* qkv, int B, int T,
                                    int C, int NH) {
    const std::string why = flash_attention_unsupported(C, NH);
    LLMC_CHECK(why.empty(), why);
    LLMC_CHECK(aligned16(out) && aligned16(qkv), "flash_attention_forward: buffers must be 16-byte aligned");
    const dim3 grid(unsigned(ceil_div(T, flash::kTile)), unsigned(B * NH));
    flash::flash_attention_forward_kernel<<<grid, flash::kThreads, flash::kForwardSmem, env.stream>>>(
        reinterpret_cast<flash::bf16*>(out), lse, reinterpret_cast<const flash::bf16*>(qkv), T, NH,
        flash::softmax_scale_log2());
    CUDA_CHECK_LAUNCH();
}

// dqkv (B, T, 3C) <- gradient of the qkv input, given dout (B, T, C), the forward's out, qkv and lse.
// delta: flash_attention_lse_floats scratch.
inline void flash_attention_backward(const CudaEnv& env, floatX* dqkv, float* delta, const floatX* dout,
                                     const floatX* out, const floatX* qkv, const float* lse, int B, int T, int C,
                                     int NH) {
    const std::string why = flash_attention_unsupported(C, NH);
    LLMC_CHECK(why.empty(), why);
    LLMC_CHECK(aligned16(dqkv) && aligned16(dout) && aligned16(out) && aligned16(qkv),
               "flash_attention_backward: buffers must be 16-byte aligned");
    using flash::bf16;
    const size_t rows = flash_attention_lse_floats(B, T, NH);
    flash::flash_attention_delta_kernel<<<unsigned(ceil_div<size_t>(rows, 256)), 256, 0, env.stream>>>(
        delta, reinterpret_cast<const bf16*>(dout), reinterpret_cast<const bf16*>(out), B, T, NH);
    CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned(ceil_div(T, flash::kTile)), unsigned(B * NH));
    CUDA_CHECK(cudaFuncSetAttribute(flash::flash_attention_backward_kv_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(flash::kBackwardKVSmem)));
    flash::flash_attention_backward_kv_kernel<<<grid, flash::kThreads, flash::kBackwardKVSmem, env.stream>>>(
        reinterpret_cast<bf16*>(dqkv), reinterpret_cast<const bf16*>(qkv), reinterpret_cast<const bf16*>(dout), lse,
        delta, T, NH, flash::softmax_scale_log2(), flash::softmax_scale());
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaFuncSetAttribute(flash::flash_attention_backward_q_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(flash::kBackwardQSmem)));
    flash::flash_attention_backward_q_kernel<<<grid, flash::kThreads, flash::kBackwardQSmem, env.stream>>>(
        reinterpret_cast<bf16*>(dqkv), reinterpret_cast<const bf16*>(qkv), reinterpret_cast<const bf16*>(dout), lse,
        delta, T, NH, flash::softmax_scale_log2(), flash::softmax_scale());
    CUDA_CHECK_LAUNCH();
}
#endif  // __CUDACC__

}  // namespace llmc
