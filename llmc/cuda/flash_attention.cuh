// Flash attention (bf16 build, head size 64): causal multi-head attention computed tile by tile on the tensor
// cores (mma.sync m16n8k16, bf16 inputs, fp32 accumulation) with an online softmax, so the B x NH x T x T
// score and probability matrices of llmc/cuda/attention.cuh are never written to memory (400 MB per layer for
// GPT-2 124M at B=16, T=1024: 4.8 GB of activations and the softmax and permute traffic of every step).
//
//   forward:  reads q, k, v straight from the qkv projection (B, T, 3, NH, 64), writes y (B, T, NH*64) and the
//             per-row log-sum-exp (B, NH, T) fp32 that the backward needs (base 2, softmax scale folded in).
//   backward: delta = rowsum(dy * y) per (b, h, t); then one kernel per key tile recomputes the probabilities
//             from q, k and the log-sum-exp for every query tile at or below the diagonal, accumulates dK and
//             dV in registers (written straight into dqkv (B, T, 3C)) and writes the tile pair's share of dQ,
//             dS K (64 x 64 fp32), to a scratch slot of its own; a last kernel sums each query row's shares in
//             key-tile order into dqkv. 5 tile products per tile pair, as FlashAttention-2 with an atomic dQ, but
//             no atomics: every output element has one owner and one summation order, so gradients are
//             bit-identical from run to run. The scratch is 16 KB per tile pair (428 MB for GPT-2 124M at B=16,
//             T=1024), written once and read once: ~0.3 ms of HBM traffic where recomputing S and dP per query
//             tile (the other deterministic way) costs two more tile products per pair. FlashDq::SharesBf16
//             (opt-in) keeps the shares in bf16: half the scratch and its traffic, the same order, so the same
//             determinism, with each share rounded to bf16 before the sum. FlashDq::Atomic
//             (opt-in, below) is FlashAttention-2's: the key tiles add their shares into one fp32 accumulator
//             per query tile with atomic adds, the last warp to add a query tile's rows converting them; no
//             scratch slots and no last kernel, but its sums' order, so its bits, vary from run to run.
//             FlashDq::SharesLast (opt-in) keeps the shares and their bits but has no last kernel: the last
//             warp to write a query tile's share sums that tile's slots in order, soon after they were written.
//
// A block owns a 64-row tile, 4 warps of 16 rows (the forward's RT = 2, 2 warps of 32 rows that share every K / V
// fragment read from shared memory, halves the ldmatrix traffic per mma but ran 10-12% slower on an H100; it is
// kept for timing against the default; so is QT = 2, a forward block of 128 queries in 8 warps, which stages each
// K / V tile once for twice the queries). Each warp takes its own operand fragments (the forward's queries once,
// the backward's keys and values from their staged tiles at each use, so they hold no registers across the
// loop) and walks the other operand in 64-row tiles staged in shared memory by cp.async, double-buffered so the
// next tile loads while the tensor cores work on the current one. 4 forward blocks per SM (register cap 128
// for the 4-warp one, which spills 12 bytes there, outside its loop), 3 backward blocks on Hopper
// (kBackwardMinBlocks). Staged rows
// are padded to 72 bf16 (144 bytes): the 8 row addresses of each ldmatrix phase fall in 8 different 4-bank
// groups. Tiles are kept row-major as in global memory; operands needed transposed (V in P V, dO in dV, Q in
// dK, K in dQ) are read with ldmatrix.trans. Tiles below the diagonal are full; the diagonal tile masks
// key > query. Heavy tiles (most work under the causal mask) are launched first. In the backward a warp holds
// dS^T for its own 16 keys only, while dQ = dS K sums over all 64 keys of the tile, so dS goes through shared
// memory (as bf16, the precision the tensor cores take anyway) and each warp then owns 16 queries of the share.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), g = lane / 4,
// t = lane % 4: A (16 x 16, row-major) a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
// a[3] = (g+8, 2t+8..); B (16 x 8) b0 = rows 2t..2t+1 of column g, b1 = rows 2t+8..; C/D (16 x 8, fp32)
// c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..). So the accumulators of two adjacent 8-column tiles are, once
// rounded to bf16, exactly the A fragment of the next product (P V, dS K...) with no data movement.
// emu/block_emulator.h emulates mma.sync and ldmatrix from those tables, and test/emulated/test_flash_attention_emu.cpp
// checks these kernels against a double-precision reference on the CPU; dev/cuda/attention.cu times them on a
// GPU against the matmul attention.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "llmc/cuda/cuda_common.cuh"

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
// The forward's blocks own QT 64-query tiles (kForwardQueryTiles) and their warps RT row tiles of 16 queries each
// (kForwardRowTiles): QT * 4 / RT warps. RT = 1 (4 warps per tile) ran 10-12% faster than 2 on an H100 at GPT-2
// 124M's shapes (dev/cuda/attention.cu). QT = 2 (FlashAttention-2's 128-query blocks) stages each K / V tile
// once for 128 queries instead of 64, half the staging traffic; every (RT, QT) gives the same bits, and QT = 2
// is not yet timed.
inline constexpr int kForwardRowTiles = 1;
inline constexpr int kForwardQueryTiles = 1;
__host__ __device__ constexpr int forward_threads(int row_tiles, int query_tiles = 1) {
    return query_tiles * kThreads / row_tiles;
}
// forward: QT Q tiles + 2 x (K, V); backward: K, V, dS + 2 x (Q, dO) + 2 x (lse, delta)
__host__ __device__ constexpr size_t forward_smem(int query_tiles) {
    return size_t(query_tiles + 4) * kTileElems * sizeof(bf16);
}
inline constexpr size_t kBackwardSmem = 7 * kTileElems * sizeof(bf16) + 4 * kTile * sizeof(float);
// Backward blocks per SM the register allocation is held to: on Hopper 3 (12 warps; 168 registers, no spills
// in the shares kernels, 8-12 bytes in the last-summed and atomic ones; three 65.5 KB blocks fit its 228 KB),
// where 2 let ptxas take 239 and left 8 warps per SM to hide the mma.sync chains; an A100's 164 KB holds only 2
// blocks.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr int kBackwardMinBlocks = 2;
#else
inline constexpr int kBackwardMinBlocks = 3;
#endif

// The backward's dQ shares: one 64 x 64 fp32 slot per (batch, head) and tile pair (query tile qt, key tile
// kt <= qt), the pairs of a head numbered row by row of the lower triangle.
__host__ __device__ inline size_t tile_pair(int qt, int kt) { return size_t(qt) * (qt + 1) / 2 + size_t(kt); }
__host__ __device__ inline size_t tile_pairs(int T) {
    const int tiles = (T + kTile - 1) / kTile;
    return tile_pair(tiles, 0);
}
inline constexpr size_t kShareFloats = size_t(kTile) * kHeadSize;

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

// cp_async, cp_async_commit, cp_async_wait: llmc/cuda/cuda_common.cuh.

// Rows [row0, row0 + 64) of a strided row-major tensor into a staged tile (asynchronously; rows at or past T
// become zeros), by the block's THREADS threads (its whole size), each copying the same 16-byte column of rows
// 64 * 8 / THREADS apart: a loop of known trip count, so the addresses are one base plus constant steps.
template <int THREADS = kThreads>
__device__ __forceinline__ void stage_tile(bf16* s, const bf16* src, size_t stride, int row0, int T) {
    constexpr int kChunks = kHeadSize / 8;  // 16-byte chunks per row
    constexpr int kRowStep = THREADS / kChunks;
    static_assert(THREADS % kChunks == 0 && kTile % kRowStep == 0, "every thread stages the same chunks");
    const int r0 = int(threadIdx.x) / kChunks, c = (int(threadIdx.x) % kChunks) * 8;
#pragma unroll
    for (int j = 0; j < kTile / kRowStep; j++) {
        const int r = r0 + j * kRowStep;
        const bool live = row0 + r < T;
        cp_async<16>(s + r * kPitch + c, src + size_t(live ? row0 + r : 0) * stride + c, live);
    }
}
// 64 consecutive floats from src[row0..] (zeros at or past T), asynchronously, by the first 64 threads.
__device__ __forceinline__ void stage_row_floats(float* s, const float* src, int row0, int T) {
    static_assert(kThreads >= kTile, "one float per thread");
    const int i = int(threadIdx.x);
    if (i < kTile) {
        const bool live = row0 + i < T;
        cp_async<4>(s + i, src + (live ? row0 + i : 0), live);
    }
}

// A fragment of the 16 x 16 block at (row r0, column k0) of a staged tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int r0, int k0, int lane) {
    ldmatrix_x4<false>(a, s + (r0 + (lane & 15)) * kPitch + k0 + (lane >> 4) * 8);
}
// acc (RT x 16 x 64) += A (RT row tiles of 16 x 64, over kKT k-steps) * B, B[k][n] = s[n][k]: B's columns are the
// staged rows (S = Q K^T with K staged, and the like). One ldmatrix gives b0, b1 of two adjacent 8-column tiles,
// used by all RT row tiles (RT = 2 halves the shared-memory reads per mma).
template <int RT>
__device__ __forceinline__ void warp_product(float (&acc)[RT][kNT][4], const uint32_t (&a)[RT][kKT][4], const bf16* s,
                                             int lane) {
    const bf16* base = s + ((lane & 7) + (lane >> 4) * 8) * kPitch + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < kNT / 2; np++)
#pragma unroll
        for (int kk = 0; kk < kKT; kk++) {
            uint32_t b[4];
            ldmatrix_x4<false>(b, base + np * 16 * kPitch + kk * 16);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                mma_16816(acc[rt][2 * np], a[rt][kk], b[0], b[1]);
                mma_16816(acc[rt][2 * np + 1], a[rt][kk], b[2], b[3]);
            }
        }
}
// One row tile (the backward's products).
__device__ __forceinline__ void warp_product(float (&acc)[kNT][4], const uint32_t (&a)[kKT][4], const bf16* s,
                                             int lane) {
    warp_product<1>(reinterpret_cast<float(&)[1][kNT][4]>(acc), reinterpret_cast<const uint32_t(&)[1][kKT][4]>(a), s,
                    lane);
}
// A fragment of the 16 x 16 block at (row r0, column k0) of the TRANSPOSE of a staged tile, A[r][c] =
// s[k0 + c][r0 + r] (dS from the dS^T tile): the four 8 x 8 matrices are read by ldmatrix.trans, rows k0 + 0..7
// and k0 + 8..15 of the staged tile at columns r0 and r0 + 8.
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* s, int r0, int k0, int lane) {
    ldmatrix_x4<true>(a, s + (k0 + (lane & 7) + (lane >> 4) * 8) * kPitch + r0 + ((lane >> 3) & 1) * 8);
}
// acc (16 x 64) += P (16 x 64, fp32 accumulator tiles rounded to bf16) * B, B[k][n] = s[k][n]: B's rows are the
// staged rows (O += P V with V staged, and the like), read transposed by ldmatrix.trans.
// (RT row tiles at once, sharing each B fragment, as warp_product.)
template <int RT>
__device__ __forceinline__ void warp_product_acc(float (&acc)[RT][kNT][4], const float (&p)[RT][kNT][4], const bf16* s,
                                                 int lane) {
    const bf16* base = s + (lane & 15) * kPitch + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; kk++) {
        uint32_t a[RT][4];
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            a[rt][0] = pack_bf16x2(p[rt][2 * kk][0], p[rt][2 * kk][1]);
            a[rt][1] = pack_bf16x2(p[rt][2 * kk][2], p[rt][2 * kk][3]);
            a[rt][2] = pack_bf16x2(p[rt][2 * kk + 1][0], p[rt][2 * kk + 1][1]);
            a[rt][3] = pack_bf16x2(p[rt][2 * kk + 1][2], p[rt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; np++) {
            uint32_t b[4];
            ldmatrix_x4<true>(b, base + kk * 16 * kPitch + np * 16);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                mma_16816(acc[rt][2 * np], a[rt], b[0], b[1]);
                mma_16816(acc[rt][2 * np + 1], a[rt], b[2], b[3]);
            }
        }
    }
}
__device__ __forceinline__ void warp_product_acc(float (&acc)[kNT][4], const float (&p)[kNT][4], const bf16* s,
                                                 int lane) {
    warp_product_acc<1>(reinterpret_cast<float(&)[1][kNT][4]>(acc), reinterpret_cast<const float(&)[1][kNT][4]>(p), s,
                        lane);
}

// The rows of the (batch, head) of this block (blockIdx.y = b * NH + h): q, k, v in the qkv tensor (row stride
// 3C), row 0 of the head in (B, T, C) tensors (y, dy) and in (B * NH, T) ones (lse, delta).
struct Head {
    int C;
    size_t stride;
    const bf16 *q, *k, *v;
    size_t y_offset, row_offset;
};
__device__ __forceinline__ Head head_of_block(const bf16* qkv, int T, int NH, int bh = int(blockIdx.y)) {
    const int b = bh / NH, h = bh % NH;
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

// ---- how the backward sums dQ ---------------------------------------------------------------------------------
// How the backward sums each query tile's dQ over its key tiles (flash_attention_backward):
//   Shares:  every tile pair writes its share (64 x 64 fp32) to a slot of its own and a second kernel sums the
//            slots of each query tile in key-tile order (16 KB written and read back through HBM per pair). One
//            owner and one summation order per element: every run gives the same bits.
//   SharesBf16: the shares stored in bf16 (8 KB per pair, half the traffic through HBM) and summed in fp32 in the
//            same order: deterministic as Shares, each share rounded once more (relative 2^-9, the rounding dS
//            already has before dS K), so dQ is a little less precise than with fp32 shares.
//   Atomic:  the key tiles of a head add their shares into one fp32 accumulator per query tile with atomic adds
//            in whatever order they arrive (no waits; the accumulators of the heads in flight, 256 KB each at
//            T = 1024, stay in L2), and per (query tile, warp) a count of the contributions made: the warp that
//            brings it to qt + 1 (key tiles 0 .. qt) writes the scaled bf16 result into dqkv, as the last block
//            of CUDA's threadFenceReduction sample does (a fence between the adds and the count, and between the
//            count and the reads). Accumulators and counts are zeroed before every launch. The order of the
//            sums, so their bits, varies from run to run (within fp32 rounding of the shares' sum).
//   SharesLast: the shares written as by Shares, and per (query tile, warp) a count of the shares written, as
//            Atomic counts its adds: the warp that brings it to qt + 1 sums that query tile's slots in key-tile
//            order and writes the result, so no second kernel reads the 428 MB back through HBM (the slots of
//            the heads in flight, 2.2 MB each at T = 1024, are read soon after they were written, while many may
//            still be in L2). The same owner, order and arithmetic per element as Shares' sum kernel: the same
//            bits.
// (A third way, the key tiles adding in a fixed order, each warp waiting for its turn, was deterministic but
// 13.6% slower than the shares on an H100 and was retired; docs/benchmarks.md, ninth session.)
enum class FlashDq { Shares, SharesBf16, Atomic, SharesLast };

// Atomic's and SharesLast's contribution counts: one per (batch x head, query tile, warp). Zeroed before every
// launch.
__host__ __device__ inline size_t dq_count_words(int BNH, int T) {
    return size_t(BNH) * ((T + kTile - 1) / kTile) * kWarps;
}

// Atomic: adds v to the accumulator pair at dst in L2 (one 8-byte vector reduction on Hopper).
__device__ __forceinline__ void atomic_add_pair(float2* dst, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(dst, v);
#else
    atomicAdd(&dst->x, v.x);
    atomicAdd(&dst->y, v.y);
#endif
}

// ---- kernels ---------------------------------------------------------------------------------------------------
// grid (blocks of QT query tiles, B * NH), forward_threads(RT, QT) threads, forward_smem(QT) bytes. out (B, T,
// NH * 64); lse (B * NH, T) holds max + log2(sum) of the base-2 logits x = q.k * scale * log2(e). Warp w owns RT
// row tiles of 16 queries, rows q0 + 16 RT w .. + 16 RT - 1: RT = 1 (kForwardRowTiles) is 4 warps per 64-query
// tile, RT = 2 2 warps that each reuse every K / V fragment they read from shared memory for two row tiles. Each
// warp walks key tiles 0 .. its own 64-query tile, masking in that last one, whatever QT: the same products in the
// same order per row, so the same bits; with QT = 2 the first tile's warps sit out the block's last key tile.
template <int RT, int QT = 1>
__global__ void __launch_bounds__(forward_threads(RT, QT), 4 / QT)
    flash_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale_log2) {
    static_assert(QT == 1 || QT == 2, "64 or 128 queries per block");
    constexpr int THREADS = forward_threads(RT, QT);
    LLMC_DYNAMIC_SHARED(float4, flash_smem);
    // QT sQ tiles, then two buffers of (K, V) tiles (buffer index arithmetic, not pointer arrays: those go to
    // local memory)
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem);
    auto sK = [&](int buf) { return sQ + (QT + 2 * buf) * kTileElems; };
    auto sV = [&](int buf) { return sQ + (QT + 1 + 2 * buf) * kTileElems; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int qblock = int(gridDim.x) - 1 - int(blockIdx.x);
    const Head hd = head_of_block(qkv, T, NH);
    const int q0 = qblock * QT * kTile;
    // this warp's 64-query tile and the block's last key tile (QT = 1: the block's tile, written so that the
    // compiler sees it)
    const int qtile = QT == 1 ? qblock : (q0 + warp * RT * 16) / kTile;
    const int last_kt = QT == 1 ? qblock : min(qblock * QT + QT - 1, (T - 1) / kTile);
    int row[RT][2];  // this thread's two rows of each of its row tiles
#pragma unroll
    for (int rt = 0; rt < RT; rt++) {
        row[rt][0] = q0 + (warp * RT + rt) * 16 + lane / 4;
        row[rt][1] = row[rt][0] + 8;
    }

#pragma unroll
    for (int j = 0; j < QT; j++) stage_tile<THREADS>(sQ + j * kTileElems, hd.q, hd.stride, q0 + j * kTile, T);
    stage_tile<THREADS>(sK(0), hd.k, hd.stride, 0, T);
    stage_tile<THREADS>(sV(0), hd.v, hd.stride, 0, T);
    cp_async_commit();
    uint32_t qa[RT][kKT][4];
    float o[RT][kNT][4] = {};
    float m[RT][2], l[RT][2];  // l: this thread's share of the row sums
#pragma unroll
    for (int rt = 0; rt < RT; rt++) m[rt][0] = m[rt][1] = -INFINITY, l[rt][0] = l[rt][1] = 0.0f;
    for (int kt = 0; kt <= last_kt; kt++) {
        const int buf = kt & 1;
        current_tile_ready(kt < last_kt, [&] {
            stage_tile<THREADS>(sK(buf ^ 1), hd.k, hd.stride, (kt + 1) * kTile, T);
            stage_tile<THREADS>(sV(buf ^ 1), hd.v, hd.stride, (kt + 1) * kTile, T);
        });
        if (kt == 0)
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int kk = 0; kk < kKT; kk++) load_a(qa[rt][kk], sQ, (warp * RT + rt) * 16, kk * 16, lane);
        if (QT == 1 || kt <= qtile) {  // QT = 2: the block's last key tile lies above its first tile's queries
            float s[RT][kNT][4] = {};
            warp_product<RT>(s, qa, sK(buf), lane);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                float mx[2] = {m[rt][0], m[rt][1]};
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int key = kt * kTile + nt * 8 + 2 * t + (i & 1);
                        const float x = kt == qtile && key > row[rt][i / 2] ? -INFINITY : s[rt][nt][i] * scale_log2;
                        s[rt][nt][i] = x;
                        mx[i / 2] = fmaxf(mx[i / 2], x);
                    }
                float alpha[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {  // key kt * 64 <= every row of the tile, so the new max is finite
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    alpha[r] = exp2f(m[rt][r] - mx[r]);
                    m[rt][r] = mx[r];
                    l[rt][r] *= alpha[r];
                }
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float p = exp2f(s[rt][nt][i] - m[rt][i / 2]);
                        s[rt][nt][i] = p;
                        l[rt][i / 2] += p;
                        o[rt][nt][i] *= alpha[i / 2];
                    }
            }
            warp_product_acc<RT>(o, s, sV(buf), lane);
        }
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
    bf16* y = out + hd.y_offset;
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = l[rt][r];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (row[rt][r] >= T) continue;
            const float inv = 1.0f / sum;
#pragma unroll
            for (int nt = 0; nt < kNT; nt++)
                store_bf16x2(y + size_t(row[rt][r]) * hd.C + nt * 8 + 2 * t,
                             pack_bf16x2(o[rt][nt][2 * r] * inv, o[rt][nt][2 * r + 1] * inv));
            if (t == 0) lse[hd.row_offset + row[rt][r]] = m[rt][r] + log2f(sum);
        }
}

// delta (B * NH, T) = rowsum(dy * y) per head, fp32. 8 threads per (b, t, h) row of 64, each 16 bytes of dy and
// of y, in memory order (h fastest), so a warp reads 512 contiguous bytes of each (a thread per row read 16
// bytes from every 1,536-byte row: half of each sector); the 8 partial sums are added by a fixed butterfly.
// grid flash_delta_blocks(rows), kDeltaThreads threads.
inline constexpr int kDeltaThreads = 256;
inline constexpr int kDeltaPieces = kHeadSize / 8;  // threads per row
__host__ __device__ inline unsigned flash_delta_blocks(size_t rows) {
    return unsigned((rows * kDeltaPieces + kDeltaThreads - 1) / kDeltaThreads);
}
__global__ void flash_attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH) {
    const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t row = idx / kDeltaPieces;  // (b * T + t) * NH + h
    const int piece = int(idx % kDeltaPieces);
    const bool live = row < size_t(B) * T * NH;  // whole 8-thread groups are live or not: the shuffles stay full
    float sum = 0.0f;
    if (live) {
        uint32_t d4[4], o4[4];
        load_bf16x8(d4, dout + row * kHeadSize + piece * 8);
        load_bf16x8(o4, out + row * kHeadSize + piece * 8);
#pragma unroll
        for (int j = 0; j < 4; j++) sum += bf16_lo(d4[j]) * bf16_lo(o4[j]) + bf16_hi(d4[j]) * bf16_hi(o4[j]);
    }
#pragma unroll
    for (int m = 1; m < kDeltaPieces; m *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (!live || piece != 0) return;
    const int h = int(row % NH);
    const size_t bt = row / NH;
    const int t = int(bt % T), b = int(bt / T);
    delta[(size_t(b) * NH + h) * T + t] = sum;
}

// Atomic's and SharesLast's count: adds this warp's contribution to its rows of query tile qt and says whether it
// was the last of the qt + 1 (key tiles 0 .. qt), as the last block of CUDA's threadFenceReduction sample does:
// every lane's writes (adds) fenced before lane 0's count, with a warp barrier between; lane 0's fence after the
// count, and a warp barrier, before any lane reads what the others wrote. Those reads must bypass L1 (__ldcg).
__device__ __forceinline__ bool last_to_count(unsigned* count, int qt, int lane) {
    __threadfence();
    __syncwarp();
    unsigned before = 0;
    if (lane == 0) {
        before = atomicAdd(count, 1u);
        __threadfence();
    }
    __syncwarp();
    return __shfl_sync(0xffffffffu, before, 0) == unsigned(qt);
}

// SharesLast's sum: rows q0 .. q0 + 15 of a query tile's dQ = scale * (the sum of `shares` consecutive 64 x 64
// fp32 slots' rows, starting at `first`, in slot order) into dq (bf16, row stride `stride`; rows at or past T are
// not written), by one warp. Per element the arithmetic of flash_attention_dq_reduce_kernel (0 + s_0 + s_1 ...,
// then times scale, rounded once), so the same bits. The slots were written by other blocks: read from L2
// (__ldcg), after the caller's fence. Each lane owns 4 columns of 8 of the 16 rows, kRowsPerPass rows per pass,
// with kSlotsAtOnce slots' loads in flight: 8 x 2, 16 loads of 16 bytes in flight per lane, the fewest L2 round
// trips; in the kernel's 168 registers (sm_90) it costs one 4-byte spill and reload per query tile
// (dev/cuda/sass_static.sh --flash; 2 x 4 spills only outside the loop, with about 3x the round trips).
__device__ __forceinline__ void sum_shares_last(bf16* dq, size_t stride, const float* first, int shares, int q0,
                                                int T, float scale, int lane) {
    constexpr int kRowsPerPass = 8, kSlotsAtOnce = 2;
    const int col = (lane % 16) * 4;  // rows 2 i + lane / 16, i = pass * kRowsPerPass .. + kRowsPerPass - 1
    auto add = [](float4& a, const float4 b) { a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w; };
#pragma unroll
    for (int pass = 0; pass < 8 / kRowsPerPass; pass++) {
        float4 sum[kRowsPerPass];
#pragma unroll
        for (int i = 0; i < kRowsPerPass; i++) sum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float* lane_first = first + size_t(2 * pass * kRowsPerPass + lane / 16) * kHeadSize + col;
        auto load = [&](int slot, int i) {
            return __ldcg(reinterpret_cast<const float4*>(lane_first + slot * kShareFloats + 2 * i * kHeadSize));
        };
        int s = 0;
        for (; s + kSlotsAtOnce <= shares; s += kSlotsAtOnce) {
            float4 v[kSlotsAtOnce][kRowsPerPass];
#pragma unroll
            for (int j = 0; j < kSlotsAtOnce; j++)
#pragma unroll
                for (int i = 0; i < kRowsPerPass; i++) v[j][i] = load(s + j, i);
#pragma unroll
            for (int j = 0; j < kSlotsAtOnce; j++)
#pragma unroll
                for (int i = 0; i < kRowsPerPass; i++) add(sum[i], v[j][i]);
        }
        for (; s < shares; s++)
#pragma unroll
            for (int i = 0; i < kRowsPerPass; i++) add(sum[i], load(s, i));
#pragma unroll
        for (int i = 0; i < kRowsPerPass; i++) {
            const int q = q0 + 2 * (pass * kRowsPerPass + i) + lane / 16;
            if (q >= T) continue;
            bf16* dst = dq + size_t(q) * stride + col;
            LLMC_REQUIRE_ALIGNED(dst, 8);
            *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16x2(sum[i].x * scale, sum[i].y * scale),
                                                        pack_bf16x2(sum[i].z * scale, sum[i].w * scale));
        }
    }
}

// grid (key tiles, B * NH), kThreads threads, kBackwardSmem bytes. Warp w owns keys k0 + 16 w .. + 15 and works
// on transposed products (rows are keys): S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
// dK += dS^T Q; then, with dS^T staged in shared memory, warp w computes rows 16 w .. + 15 of the pair's dQ share
// dS K: DQ = Shares writes it to the pair's slot of dq_scratch (SharesBf16: rounded to bf16, slots of 64 x 64 bf16;
// SharesLast: as Shares, then counted in dq_count (dq_count_words, zeroed), the last warp to write its rows' share
// summing them over the query tile's slots into dqkv's q part, sum_shares_last); DQ = Atomic adds it to the
// query tile's accumulator in dq_scratch (B * NH, query tiles, 64 x 64 fp32, zeroed) and counts the addition in
// dq_count, the last warp to add converting the rows into dqkv's q part. At the end dK * scale and dV go to
// dqkv's k and v parts.
template <FlashDq DQ>
__global__ void __launch_bounds__(kThreads, kBackwardMinBlocks) flash_attention_backward_kv_kernel(bf16* dqkv, float* dq_scratch,
                                                                                 unsigned* dq_count, const bf16* qkv,
                                                                                 const bf16* dout, const float* lse,
                                                                                 const float* delta, int T, int NH,
                                                                                 float scale_log2, float scale) {
    LLMC_DYNAMIC_SHARED(float4, flash_smem);
    // sK, sV, sdS, then two buffers of (Q, dO) tiles, then two of (lse, delta) rows
    bf16* sK = reinterpret_cast<bf16*>(flash_smem);
    bf16* sV = sK + kTileElems;
    bf16* sdS = sK + 2 * kTileElems;
    auto sQ = [&](int buf) { return sK + (3 + 2 * buf) * kTileElems; };
    auto sdO = [&](int buf) { return sK + (4 + 2 * buf) * kTileElems; };
    float* rows = reinterpret_cast<float*>(sK + 7 * kTileElems);
    auto sL = [&](int buf) { return rows + 2 * buf * kTile; };
    auto sD = [&](int buf) { return rows + (2 * buf + 1) * kTile; };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int tiles = (T + kTile - 1) / kTile;
    const int ktile = blockIdx.x, bh = blockIdx.y;  // low key tiles see the most query tiles: first
    const Head hd = head_of_block(qkv, T, NH, bh);
    const bf16* dy = dout + hd.y_offset;
    const int k0 = ktile * kTile;
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

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
    float dk[kNT][4] = {}, dv[kNT][4] = {};
    for (int qt = ktile; qt < tiles; qt++) {
        const int buf = (qt - ktile) & 1, q0 = qt * kTile;
        current_tile_ready(qt + 1 < tiles, [&] { stage_query_tile(qt + 1, buf ^ 1); });
        uint32_t ka[kKT][4];
#pragma unroll
        for (int kk = 0; kk < kKT; kk++) load_a(ka[kk], sK, warp * 16, kk * 16, lane);
        float p[kNT][4] = {};
        const float* L = sL(buf);
        const float* D = sD(buf);
        warp_product(p, ka, sQ(buf), lane);
        // Below the diagonal, with every query of the tile before T, no element is masked: that case (every query
        // tile of a block but its first, when T is a multiple of 64) runs without the per-element tests. Each
        // lane's columns come in pairs (2t, 2t + 1): one 8-byte read of L and of D per pair.
        if (qt != ktile && q0 + kTile <= T) {
#pragma unroll
            for (int nt = 0; nt < kNT; nt++) {
                const float2 l2 = *reinterpret_cast<const float2*>(L + nt * 8 + 2 * t);
#pragma unroll
                for (int i = 0; i < 4; i++) p[nt][i] = exp2f(p[nt][i] * scale_log2 - ((i & 1) ? l2.y : l2.x));
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < kNT; nt++) {
                const float2 l2 = *reinterpret_cast<const float2*>(L + nt * 8 + 2 * t);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int c = nt * 8 + 2 * t + (i & 1);
                    const bool masked = (qt == ktile && key[i / 2] > q0 + c) || q0 + c >= T;
                    p[nt][i] = masked ? 0.0f : exp2f(p[nt][i] * scale_log2 - ((i & 1) ? l2.y : l2.x));
                }
            }
        }
        warp_product_acc(dv, p, sdO(buf), lane);
        float ds[kNT][4] = {};
        uint32_t va[kKT][4];
#pragma unroll
        for (int kk = 0; kk < kKT; kk++) load_a(va[kk], sV, warp * 16, kk * 16, lane);
        warp_product(ds, va, sdO(buf), lane);
#pragma unroll
        for (int nt = 0; nt < kNT; nt++) {
            const float2 d2 = *reinterpret_cast<const float2*>(D + nt * 8 + 2 * t);
#pragma unroll
            for (int i = 0; i < 4; i++) ds[nt][i] = p[nt][i] * (ds[nt][i] - ((i & 1) ? d2.y : d2.x));
        }
        warp_product_acc(dk, ds, sQ(buf), lane);

        // the pair's dQ share: dS^T (bf16) to shared memory, then rows 16 w .. + 15 of dS K, in two halves of
        // 32 columns (16 accumulators live instead of 32)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8 * r) * kPitch + nt * 8 + 2 * t) =
                    pack_bf16x2(ds[nt][2 * r], ds[nt][2 * r + 1]);
        __syncthreads();
        const bf16* kbase = sK + (lane & 15) * kPitch + (lane >> 4) * 8;
        const size_t slot = DQ != FlashDq::Atomic ? size_t(bh) * tile_pairs(T) + tile_pair(qt, ktile)
                                                  : size_t(bh) * tiles + qt;  // Atomic: the query tile's
        using Share = std::conditional_t<DQ == FlashDq::SharesBf16, bf16, float>;
        Share* rows16 = reinterpret_cast<Share*>(dq_scratch) + slot * kShareFloats + size_t(warp) * 16 * kHeadSize;
        unsigned* count = DQ == FlashDq::Atomic       ? dq_count + slot * kWarps + warp
                          : DQ == FlashDq::SharesLast ? dq_count + (size_t(bh) * tiles + qt) * kWarps + warp
                                                      : nullptr;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float acc[kNT / 2][4] = {};
#pragma unroll
            for (int kk = 0; kk < kTile / 16; kk++) {
                uint32_t a[4];
                load_a_trans(a, sdS, warp * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < kNT / 4; np++) {
                    uint32_t b[4];
                    ldmatrix_x4<true>(b, kbase + kk * 16 * kPitch + (half * 2 + np) * 16);
                    mma_16816(acc[2 * np], a, b[0], b[1]);
                    mma_16816(acc[2 * np + 1], a, b[2], b[3]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < kNT / 2; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    Share* dst = rows16 + (g + 8 * r) * kHeadSize + half * 32 + nt * 8 + 2 * t;
                    if constexpr (DQ == FlashDq::SharesBf16) {
                        store_bf16x2(dst, pack_bf16x2(acc[nt][2 * r], acc[nt][2 * r + 1]));
                    } else {
                        LLMC_REQUIRE_ALIGNED(dst, 8);
                        const float2 v = make_float2(acc[nt][2 * r], acc[nt][2 * r + 1]);
                        if constexpr (DQ == FlashDq::Atomic) atomic_add_pair(reinterpret_cast<float2*>(dst), v);
                        else *reinterpret_cast<float2*>(dst) = v;
                    }
                }
        }
        if constexpr (DQ == FlashDq::Atomic) {
            if (last_to_count(count, qt, lane)) {  // key tiles 0 .. qt have all added
#pragma unroll
                for (int c = 0; c < kHeadSize / 8; c++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int col = c * 8 + 2 * t, q = q0 + warp * 16 + g + 8 * r;
                        const float2 sum =
                            __ldcg(reinterpret_cast<const float2*>(rows16 + (g + 8 * r) * kHeadSize + col));
                        if (q < T)
                            store_bf16x2(dqkv + (hd.q - qkv) + size_t(q) * hd.stride + col,
                                         pack_bf16x2(sum.x * scale, sum.y * scale));
                    }
            }
        }
        if constexpr (DQ == FlashDq::SharesLast) {
            if (last_to_count(count, qt, lane)) {  // key tiles 0 .. qt have all written
                const float* first = dq_scratch + (size_t(bh) * tile_pairs(T) + tile_pair(qt, 0)) * kShareFloats +
                                     size_t(warp) * 16 * kHeadSize;
                sum_shares_last(dqkv + (hd.q - qkv), hd.stride, first, qt + 1, q0 + warp * 16, T, scale, lane);
            }
        }
        // No barrier here: what the next iteration overwrites before its own top barrier, the (Q, dO, lse, delta)
        // buffer of this tile, was last read before the barrier above, and sdS is rewritten only after the next
        // top barrier, which every warp reaches only once done with this share.
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

// Eight consecutive values of a dQ share, widened to fp32 (Share: float, or bf16 for FlashDq::SharesBf16).
__device__ __forceinline__ void load_share8(float (&v)[8], const float* share) {
    LLMC_REQUIRE_ALIGNED(share, 16);
    const float4 lo = reinterpret_cast<const float4*>(share)[0], hi = reinterpret_cast<const float4*>(share)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}
__device__ __forceinline__ void load_share8(float (&v)[8], const bf16* share) {
    LLMC_REQUIRE_ALIGNED(share, 16);
    uint32_t pairs[4];
    load_bf16x8(pairs, share);
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = bf16_lo(pairs[i]), v[2 * i + 1] = bf16_hi(pairs[i]);
}

// dQ = scale * (sum of the dQ shares of key tiles 0 .. qt, in that order) into dqkv's q part. One thread per
// (b, h, t) and 8 of the 64 dimensions: consecutive threads read consecutive pieces of a share row. Share: float
// (FlashDq::Shares) or bf16 (SharesBf16), summed in fp32 either way.
template <typename Share>
__global__ void flash_attention_dq_reduce_kernel(bf16* dqkv, const Share* dq_share, int B, int T, int NH, float scale) {
    const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    constexpr int kPieces = kHeadSize / 8;
    if (idx >= size_t(B) * NH * T * kPieces) return;
    const int piece = int(idx % kPieces);
    const size_t row = idx / kPieces;
    const int tq = int(row % T);
    const size_t bh = row / T;
    const int b = int(bh / NH), h = int(bh % NH), qt = tq / kTile;
    const Share* share = dq_share + (bh * tile_pairs(T) + tile_pair(qt, 0)) * kShareFloats +
                         size_t(tq % kTile) * kHeadSize + piece * 8;
    float sum[8] = {};
    for (int kt = 0; kt <= qt; kt++, share += kShareFloats) {  // the pairs (qt, 0..qt) are consecutive
        float v[8];
        load_share8(v, share);
#pragma unroll
        for (int i = 0; i < 8; i++) sum[i] += v[i];
    }
    const int C = NH * kHeadSize;
    bf16* dst = dqkv + (size_t(b) * T + tq) * 3 * C + size_t(h) * kHeadSize + piece * 8;
    LLMC_REQUIRE_ALIGNED(dst, 16);
    const uint4 packed{pack_bf16x2(sum[0] * scale, sum[1] * scale), pack_bf16x2(sum[2] * scale, sum[3] * scale),
                       pack_bf16x2(sum[4] * scale, sum[5] * scale), pack_bf16x2(sum[6] * scale, sum[7] * scale)};
    *reinterpret_cast<uint4*>(dst) = packed;
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
// The backward's scratch, in floats from its start: delta (B, NH, T) at 0, then, 16-byte aligned, the dQ shares
// (flash::tile_pair; SharesBf16: bf16, half the floats) or the atomic dQ's accumulators (B * NH, query tiles,
// 64 x 64) at `dq`, then Atomic's and SharesLast's contribution counts (dq_count_words) at `count`; `floats` in
// all.
struct FlashBackwardScratchLayout {
    size_t dq, count, floats;
};
inline FlashBackwardScratchLayout flash_backward_scratch_layout(int B, int T, int NH, flash::FlashDq dq) {
    const size_t delta = (flash_attention_lse_floats(B, T, NH) + 3) / 4 * 4;
    if (dq != flash::FlashDq::Atomic) {
        const size_t share_floats = dq == flash::FlashDq::SharesBf16 ? flash::kShareFloats / 2 : flash::kShareFloats;
        const size_t end = delta + size_t(B) * NH * flash::tile_pairs(T) * share_floats;
        const size_t counts = dq == flash::FlashDq::SharesLast ? flash::dq_count_words(B * NH, T) : 0;
        return {delta, end, end + counts};
    }
    const size_t count = delta + size_t(B) * NH * ceil_div(T, flash::kTile) * flash::kShareFloats;
    return {delta, count, count + flash::dq_count_words(B * NH, T)};
}
inline size_t flash_attention_backward_scratch_floats(int B, int T, int NH, flash::FlashDq dq) {
    return flash_backward_scratch_layout(B, T, NH, dq).floats;
}

// out (B, T, C) <- causal attention of qkv (B, T, 3C; not modified); lse (B, NH, T) kept for the backward.
// RT: row tiles per warp, QT: 64-query tiles per block (flash::kForwardRowTiles, kForwardQueryTiles;
// dev/cuda/attention.cu times the four).
template <int RT = flash::kForwardRowTiles, int QT = flash::kForwardQueryTiles>
inline void flash_attention_forward(const CudaEnv& env, floatX* out, float* lse, const floatX* qkv, int B, int T,
                                    int C, int NH) {
    const std::string why = flash_attention_unsupported(C, NH);
    LLMC_CHECK(why.empty(), why);
    LLMC_CHECK(aligned16(out) && aligned16(qkv), "flash_attention_forward: buffers must be 16-byte aligned");
    const auto kernel = flash::flash_attention_forward_kernel<RT, QT>;
    constexpr size_t smem = flash::forward_smem(QT);
    if constexpr (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const dim3 grid(unsigned(ceil_div(T, QT * flash::kTile)), unsigned(B * NH));
    LLMC_LAUNCH(grid, flash::forward_threads(RT, QT), smem, env.stream, kernel)(
        reinterpret_cast<flash::bf16*>(out), lse, reinterpret_cast<const flash::bf16*>(qkv), T, NH,
        flash::softmax_scale_log2());
    CUDA_CHECK_LAUNCH();
}

// dqkv (B, T, 3C) <- gradient of the qkv input, given dout (B, T, C), the forward's out, qkv and lse.
// scratch: flash_attention_backward_scratch_floats(B, T, NH, dq) floats (16-byte aligned).
inline void flash_attention_backward(const CudaEnv& env, floatX* dqkv, float* scratch, const floatX* dout,
                                     const floatX* out, const floatX* qkv, const float* lse, int B, int T, int C,
                                     int NH, flash::FlashDq dq = flash::FlashDq::Shares) {
    const std::string why = flash_attention_unsupported(C, NH);
    LLMC_CHECK(why.empty(), why);
    LLMC_CHECK(aligned16(dqkv) && aligned16(dout) && aligned16(out) && aligned16(qkv) && aligned16(scratch),
               "flash_attention_backward: buffers must be 16-byte aligned");
    using flash::bf16;
    using flash::FlashDq;
    const size_t rows = flash_attention_lse_floats(B, T, NH);
    const FlashBackwardScratchLayout layout = flash_backward_scratch_layout(B, T, NH, dq);
    float* delta = scratch;
    float* dq_scratch = scratch + layout.dq;
    unsigned* dq_count = nullptr;
    if (dq == FlashDq::Atomic || dq == FlashDq::SharesLast) {
        dq_count = reinterpret_cast<unsigned*>(scratch + layout.count);
        // Atomic: accumulators and counts are one range; SharesLast: the counts only (its slots are all written)
        float* zero_from = dq == FlashDq::Atomic ? dq_scratch : scratch + layout.count;
        CUDA_CHECK(cudaMemsetAsync(zero_from, 0, (scratch + layout.floats - zero_from) * sizeof(float), env.stream));
    }
    LLMC_LAUNCH(flash::flash_delta_blocks(rows), flash::kDeltaThreads, 0, env.stream, flash::flash_attention_delta_kernel)(
        delta, reinterpret_cast<const bf16*>(dout), reinterpret_cast<const bf16*>(out), B, T, NH);
    CUDA_CHECK_LAUNCH();
    const dim3 grid(unsigned(ceil_div(T, flash::kTile)), unsigned(B * NH));
    auto launch_kv = [&](auto kernel) {
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(flash::kBackwardSmem)));
        LLMC_LAUNCH(grid, flash::kThreads, flash::kBackwardSmem, env.stream, kernel)(
            reinterpret_cast<bf16*>(dqkv), dq_scratch, dq_count, reinterpret_cast<const bf16*>(qkv),
            reinterpret_cast<const bf16*>(dout), lse, delta, T, NH, flash::softmax_scale_log2(), flash::softmax_scale());
        CUDA_CHECK_LAUNCH();
    };
    if (dq == FlashDq::Atomic) {
        launch_kv(flash::flash_attention_backward_kv_kernel<FlashDq::Atomic>);
        return;  // the last warp to add to each query tile's rows wrote them
    }
    if (dq == FlashDq::SharesLast) {
        launch_kv(flash::flash_attention_backward_kv_kernel<FlashDq::SharesLast>);
        return;  // the last warp to write each query tile's share summed them
    }
    const unsigned reduce_blocks = unsigned(ceil_div<size_t>(rows * (flash::kHeadSize / 8), 256));
    if (dq == FlashDq::SharesBf16) {
        launch_kv(flash::flash_attention_backward_kv_kernel<FlashDq::SharesBf16>);
        LLMC_LAUNCH(reduce_blocks, 256, 0, env.stream, flash::flash_attention_dq_reduce_kernel<bf16>)(
            reinterpret_cast<bf16*>(dqkv), reinterpret_cast<const bf16*>(dq_scratch), B, T, NH, flash::softmax_scale());
    } else {
        launch_kv(flash::flash_attention_backward_kv_kernel<FlashDq::Shares>);
        LLMC_LAUNCH(reduce_blocks, 256, 0, env.stream, flash::flash_attention_dq_reduce_kernel<float>)(
            reinterpret_cast<bf16*>(dqkv), dq_scratch, B, T, NH, flash::softmax_scale());
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
