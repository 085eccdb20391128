// The DeMo compress kernel: momentum update, 2-D DCT, top-k, quantization, packing into the bucket and error
// feedback, one thread block per chunk (see demo_kernels.cuh); its IDENTITY instantiations (--optimizer topk) skip
// the DCT and select among the momentum itself.
#pragma once
#include <cuda_runtime.h>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/kernels/block_topk.cuh"
#include "llmc/optim/demo/kernels/dct_products.cuh"
#include "llmc/optim/demo/kernels/tunings.h"

namespace demo {

// ---------------------------------------------------------------------------------------------------------
// cm::chunk_origin with a 32-bit division (a launch holds fewer than 2^31 chunks): the 64-bit one is a
// ~70-instruction subroutine that every thread of every block ran. Element (b, n) of the chunk is then at
// origin + b * cols + n with a 32-bit offset (make_kernel_config checks n1 * cols < 2^32 for every tensor).
__device__ __forceinline__ uint64_t block_chunk_origin(const cm::ChunkTensor& t, uint32_t c) {
    const uint32_t row = c / t.block_cols, col = c - row * t.block_cols;
    return t.offset + uint64_t(row) * t.n1 * t.cols + uint64_t(col) * t.n2;
}

// The tensor holding global chunk g (cm::tensor_of_chunk's answer), found by one warp at once: lane l tests
// tensors l, l + 32, ... (ascending chunk offsets), and the count of those starting at or before g, less one, is
// the index. One or two rounds of independent loads for a GPT-2's ~50 tensors instead of ~6 dependent ones. Every
// lane of a converged warp must call it; all get the same index.
__device__ __forceinline__ int warp_tensor_of_chunk(const cm::ChunkTensor* tensors, int count, uint64_t g) {
    const int lane = int(threadIdx.x & 31u);
    int starting = 0;
#pragma unroll 2
    for (int base = 0; base < count; base += 32) {
        const int t = base + lane;
        starting += __popc(__ballot_sync(0xffffffffu, t < count && tensors[t].chunk_offset <= g));
    }
    return starting - 1;
}

// ---------------------------------------------------------------------------------------------------------
struct CompressArgs {
    const cm::ChunkTensor* tensors;
    int num_tensors;
    const float* folded;   // folded bases table
    const float* natural;  // natural bases table
    float* momentum;
    const float* grads;
    uint8_t* bucket;       // header written, body zeroed
    cm::CompressParams p;
    SmemLayout L;
};

// Asks L2 for the 128-byte line at p (prefetch.global.L2); nothing on the host and in the emulator.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && !defined(LLMC_BLOCK_EMULATOR)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#else
    (void)p;
#endif
}

// ---- lean I/O of the 64 x 64 compress (tunings with lean_io) ----------------------------------------------
// Thread t owns columns 4 (t % 16) + [0, 4) of the row pairs (b, 63 - b) for b = t / 16 + 16 s (s = 0, 1): per
// pair one 16-byte load of momentum and one of gradient in each row, every offset one of the four below (the
// base kernel's scalar slots spend ~20 instructions of index and bounds arithmetic per element). own_top[4 s + j]
// and own_bot[4 s + j] hold the updated momentum of column 4 (t % 16) + j in rows b and 63 - b. The sums are the
// base kernel's, element by element, so the bits are too. Needs 16-byte aligned rows (KernelConfig::vec4_io).
struct LeanOffsets {
    uint32_t top[2], bot[2];  // element offsets of (b, 4 (t % 16)) and (63 - b, 4 (t % 16)), s = 0, 1
};
__device__ __forceinline__ LeanOffsets lean_offsets(uint32_t cols) {
    const uint32_t col = 4u * (threadIdx.x & 15u), b = threadIdx.x >> 4;
    LeanOffsets o;
    o.top[0] = b * cols + col;
    o.top[1] = o.top[0] + 16u * cols;
    o.bot[0] = (63u - b) * cols + col;
    o.bot[1] = o.bot[0] - 16u * cols;
    return o;
}
__device__ __forceinline__ void load4(float (&v)[4], const float* p) {
    LLMC_REQUIRE_ALIGNED(p, 16);
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load4_readonly(float (&v)[4], const float* p) {
    LLMC_REQUIRE_ALIGNED(p, 16);
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
    LLMC_REQUIRE_ALIGNED(p, 16);
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// The row fold of lean slot s: the sums of the thread's rows b and 63 - b (b = t / 16 + 16 s) into row b of FX
// (rows of ldx), their differences into row 32 + b.
__device__ __forceinline__ void lean_fold_rows(float* FX, int ldx, int s, const float (&top)[4], const float (&bot)[4]) {
    const int col = 4 * int(threadIdx.x & 15u), b = int(threadIdx.x >> 4) + 16 * s;
    float sum[4], dif[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        sum[j] = cm::add_rn(top[j], bot[j]);
        dif[j] = cm::sub_rn(top[j], bot[j]);
    }
    store4(FX + b * ldx + col, sum);
    store4(FX + (32 + b) * ldx + col, dif);
}

// Steps 1-2: momentum update and the row fold into FX (rows of ldx, a multiple of 4). REFETCH: the updated
// momentum is written back at once (lean_feedback reads it again) and own_* are left alone.
template <bool REFETCH>
__device__ __forceinline__ void lean_prologue(float* momentum, const float* grads, uint32_t cols,
                                              const cm::CompressParams& p, int ldx, float* FX,
                                              float (&own_top)[kMaxPairsPerThread],
                                              float (&own_bot)[kMaxPairsPerThread]) {
    const LeanOffsets o = lean_offsets(cols);
    float mt[2][4], gt[2][4], mb[2][4], gb[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {  // every load issued before the first use
        load4(mt[s], momentum + o.top[s]);
        load4_readonly(gt[s], grads + o.top[s]);
        load4(mb[s], momentum + o.bot[s]);
        load4_readonly(gb[s], grads + o.bot[s]);
    }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        float xt[4], xb[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            xt[j] = cm::momentum_update(mt[s][j], gt[s][j], p.clip, p.decay, p.grad_scale);
            xb[j] = cm::momentum_update(mb[s][j], gb[s][j], p.clip, p.decay, p.grad_scale);
            if constexpr (!REFETCH) {
                own_top[4 * s + j] = xt[j];
                own_bot[4 * s + j] = xb[j];
            }
        }
        if constexpr (REFETCH) {
            store4(momentum + o.top[s], xt);
            store4(momentum + o.bot[s], xb);
        }
        lean_fold_rows(FX, ldx, s, xt, xb);
    }
}

// Step 10: the error feedback from dec (rows of lde) and the one write of the momentum (REFETCH: the second,
// over the prologue's).
template <bool REFETCH>
__device__ __forceinline__ void lean_feedback(float* momentum, uint32_t cols, float alpha, const float* dec, int lde,
                                              const float (&own_top)[kMaxPairsPerThread],
                                              const float (&own_bot)[kMaxPairsPerThread]) {
    const LeanOffsets o = lean_offsets(cols);
    float xt[2][4], xb[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        if constexpr (REFETCH) {
            load4(xt[s], momentum + o.top[s]);
            load4(xb[s], momentum + o.bot[s]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                xt[s][j] = own_top[4 * s + j];
                xb[s][j] = own_bot[4 * s + j];
            }
        }
    }
    const int col = 4 * int(threadIdx.x & 15u), b0 = int(threadIdx.x >> 4);
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const int b = b0 + 16 * s, bb = 63 - b;
        float t[4], u[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            t[j] = cm::feedback(xt[s][j], dec[b * lde + col + j], alpha);
            u[j] = cm::feedback(xb[s][j], dec[bb * lde + col + j], alpha);
        }
        store4(momentum + o.top[s], t);
        store4(momentum + o.bot[s], u);
    }
}

// ---- DCT-domain momentum (tunings with dct_momentum) ------------------------------------------------------
// The chunk DCT is linear and orthonormal, so the reference step on the spatial momentum m (m = decay m + s g,
// E = C1 m C2^T, top-k of |E|, m -= alpha decode(sent)) is, on M = C1 m C2^T: M = decay M + s DCT(g), top-k of
// |M|, M[sent] -= alpha v. The same coefficients up to rounding, without the decode (an inverse DCT of the sent
// coefficients: segments, gathered basis rows and a product) and the dense error feedback. M of a 64 x 64 chunk
// sits where the chunk's m would, coefficient (k1, k2) at row k1, column k2; checkpoints record the domain
// (cm::MomentumDomain, cm::convert_momentum).
//
// Steps 1-2 on the gradient: its rows folded into FX (the same fold lean_prologue makes of the updated
// momentum); the momentum is read later, by lean_dct_momentum_update.
__device__ __forceinline__ void lean_prologue_dct(const float* grads, uint32_t cols, int ldx, float* FX) {
    const LeanOffsets o = lean_offsets(cols);
    float gt[2][4], gb[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        load4_readonly(gt[s], grads + o.top[s]);
        load4_readonly(gb[s], grads + o.bot[s]);
    }
#pragma unroll
    for (int s = 0; s < 2; s++) lean_fold_rows(FX, ldx, s, gt[s], gb[s]);
}
// After the DCT of the gradient (E, rows of lde): E = decay M + s E for the thread's coefficients, M read now; v
// gets them too (v[8 s + j]: row t / 16 + 16 s, v[8 s + 4 + j]: row 63 - t / 16 - 16 s; column 4 (t % 16) + j),
// for register_topk. No barrier inside.
__device__ __forceinline__ void lean_dct_momentum_update(const float* momentum, uint32_t cols,
                                                         const cm::CompressParams& p, float* E, int lde,
                                                         float (&v)[16]) {
    const LeanOffsets o = lean_offsets(cols);
    const int col = 4 * int(threadIdx.x & 15u), b0 = int(threadIdx.x >> 4);
#pragma unroll
    for (int s = 0; s < 2; s++) {
        float mt[4], mb[4];
        load4(mt, momentum + o.top[s]);
        load4(mb, momentum + o.bot[s]);
        float* et = E + (b0 + 16 * s) * lde + col;
        float* eb = E + (63 - b0 - 16 * s) * lde + col;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[8 * s + j] = et[j] = cm::momentum_update(mt[j], et[j], p.clip, p.decay, p.grad_scale);
            v[8 * s + 4 + j] = eb[j] = cm::momentum_update(mb[j], eb[j], p.clip, p.decay, p.grad_scale);
        }
    }
}

// ---- no transform (--optimizer topk: the IDENTITY instantiations) -------------------------------------------
// Steps 1-2 in lean I/O's mapping: the updated momentum of the thread's 16 elements straight into E (rows of lde),
// where a transform's coefficients would be. As with the DCT-domain momentum, E then takes the sent coefficients'
// feedback in place and is the one write of the momentum (lean_dct_feedback): no decode, no dense feedback. No
// barrier inside.
__device__ __forceinline__ void lean_identity_prologue(const float* momentum, const float* grads, uint32_t cols,
                                                       const cm::CompressParams& p, float* E, int lde) {
    const LeanOffsets o = lean_offsets(cols);
    const int col = 4 * int(threadIdx.x & 15u), b0 = int(threadIdx.x >> 4);
    float mt[2][4], gt[2][4], mb[2][4], gb[2][4];
#pragma unroll
    for (int s = 0; s < 2; s++) {  // every load issued before the first use
        load4(mt[s], momentum + o.top[s]);
        load4_readonly(gt[s], grads + o.top[s]);
        load4(mb[s], momentum + o.bot[s]);
        load4_readonly(gb[s], grads + o.bot[s]);
    }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        float* et = E + (b0 + 16 * s) * lde + col;
        float* eb = E + (63 - b0 - 16 * s) * lde + col;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            et[j] = cm::momentum_update(mt[s][j], gt[s][j], p.clip, p.decay, p.grad_scale);
            eb[j] = cm::momentum_update(mb[s][j], gb[s][j], p.clip, p.decay, p.grad_scale);
        }
    }
}

// register_topk's coarse histogram (cm::kCoarseBins words at `bins`, 16-byte aligned) zeroed by the block. No
// barrier inside.
template <int THREADS>
__device__ __forceinline__ void clear_coarse_bins(float* bins) {
    for (int b = threadIdx.x; b < cm::kCoarseBins / 4; b += THREADS)
        reinterpret_cast<float4*>(bins)[b] = float4{0.0f, 0.0f, 0.0f, 0.0f};  // zero bits
}

// The thread's 16 coefficients of E in lean I/O's mapping, as lean_dct_momentum_update leaves them in v.
__device__ __forceinline__ void lean_read_coefficients(const float* E, int lde, float (&v)[16]) {
    const int col = 4 * int(threadIdx.x & 15u), b0 = int(threadIdx.x >> 4);
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[8 * s + j] = E[(b0 + 16 * s) * lde + col + j];
            v[8 * s + 4 + j] = E[(63 - b0 - 16 * s) * lde + col + j];
        }
}

// Top-k of a 64 x 64 chunk's coefficients from registers in lean I/O's mapping (v, as lean_dct_momentum_update
// leaves them or lean_read_coefficients reads them), not from E in index order. The thread's 16 coefficients are
// 4 runs of 4 consecutive indices, run g = 2 s + h in row t / 16 + 16 s (h = 0) or 63 - t / 16 - 16 s (h = 1), so
// a warp's run g covers the row pair w + 8 s (h = 0) or 31 - w - 8 s (h = 1) of the 32 in the chunk, its lanes in
// index order (h = 0) or with their halves swapped (h = 1: lanes 16-31 hold the lower row). Steps: the coarse
// histogram and the largest key (bins cleared by the caller, before its barrier), then anchored_bin_search in every
// warp (no barrier, no serial warp); per row pair the count of keys above the bin B of the k-th largest (or in it,
// when it is taken whole) and the list of the candidates (keys in B); each candidate ranked by 8 threads at once (4
// when there are over 32), each against an eighth of the list: it is selected when the candidates above it plus
// those equal to it at lower indices number less than `need` (the reference's tie rule), and marked in a bit per
// index and its row pair's count; every warp scans the 32 counts (one per lane) and places its selected
// coefficients in index order into Lidx / Lval. 4 barriers (3 when B is taken whole), the last at the end; when B
// holds more than cm::kMaxTopkCandidates keys, block_select_topk's RadixSelect fallback on keys read from E.
// Starts after a barrier that ended the writes of E and the clearing of `coarse` (TopkShared's words as there).
template <int THREADS>
__device__ __forceinline__ void register_topk(const float (&v)[16], uint32_t k, const cm::ChunkDims& d, const float* E,
                                              const TopkShared& sh, uint32_t* Lidx, float* Lval) {
    static_assert(THREADS == 256, "lean I/O's mapping: 16 threads per row, 16 rows per 256 threads");
    constexpr uint32_t n = cm::kFixedChunk * cm::kFixedChunk;
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const uint32_t col = 4u * uint32_t(tid & 15), b0 = uint32_t(tid >> 4);
    auto index_of = [&](int q) {  // natural index of v[q]
        const int s = q >> 3, h = (q >> 2) & 1, j = q & 3;
        const uint32_t row = h == 0 ? b0 + 16u * uint32_t(s) : 63u - b0 - 16u * uint32_t(s);
        return row * cm::kFixedChunk + col + uint32_t(j);
    };
    auto pair_of = [&](int g) { return (g & 1) == 0 ? warp + 8 * (g >> 1) : 31 - warp - 8 * (g >> 1); };
    if (k >= n) {  // every coefficient, at its own index
#pragma unroll
        for (int q = 0; q < 16; q++) {
            Lidx[index_of(q)] = index_of(q);
            Lval[index_of(q)] = v[q];
        }
        __syncthreads();
        return;
    }
    uint32_t* res = sh.res;
    uint32_t largest = 0;
#pragma unroll
    for (int q = 0; q < 16; q++) {
        const uint32_t key = cm::magnitude_key(v[q]);
        atomicAdd(sh.coarse + cm::coarse_bin(key), 1u);
        largest = max(largest, key);
    }
    largest = __reduce_max_sync(0xffffffffu, largest);
    if (lane == 0) atomicMax(res + 7, largest);
    __syncthreads();
    const CoarseBin cb = anchored_bin_search(sh.coarse, int(cm::coarse_bin(res[7])), k);
    const uint32_t B = cb.bin, need = k - cb.above, C = cb.count;
    const bool whole_bin = C == need;
    if (!whole_bin && C > cm::kMaxTopkCandidates) {  // heavy ties or zeros: RadixSelect on keys in index order
        uint32_t keys[kMaxElemsPerThread];
#pragma unroll
        for (int r = 0; r < kMaxElemsPerThread; r++) {
            const uint32_t i = uint32_t(tid + r * THREADS);
            keys[r] = cm::magnitude_key(E[(i / cm::kFixedChunk) * uint32_t(d.lde) + i % cm::kFixedChunk]);
        }
        const cm::TopkRule rule = block_radix_select<THREADS>(keys, n, k, sh.small, res);
        block_place_topk<THREADS>(keys, n, rule, d, E, sh.small, Lidx, Lval);
        return;
    }
    uint32_t* counts = sh.small;          // 32 row pairs: keys above B (or in B when whole)
    uint32_t* ranked = sh.small + 32;     // 32 row pairs: selected candidates (zeroed)
    uint32_t* cand = sh.small + 64;       // (key, index) pairs
    uint32_t* chosen = sh.small + 64 + 2 * cm::kMaxTopkCandidates;  // a bit per index: the selected candidates
    static_assert(64 + 2 * cm::kMaxTopkCandidates + 128 <= 2 * THREADS, "within the zeroed histogram words");
    uint32_t sel = 0, mine = 0;           // bit q: v[q] selected / a candidate
#pragma unroll
    for (int g = 0; g < 4; g++) {
        uint32_t above = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int q = 4 * g + j;
            const uint32_t bin = cm::coarse_bin(cm::magnitude_key(v[q]));
            if (bin > B || (whole_bin && bin == B)) {
                sel |= 1u << q;
                above++;
            } else if (bin == B) {
                mine |= 1u << q;
                const uint32_t slot = atomicAdd(res + 6, 1u);
                cand[2 * slot] = cm::magnitude_key(v[q]);
                cand[2 * slot + 1] = index_of(q);
            }
        }
        above = __reduce_add_sync(0xffffffffu, above);
        if (lane == 0) counts[pair_of(g)] = above;
    }
    __syncthreads();
    if (!whole_bin) {
        // candidate j = tid / L ranked by L consecutive lanes, lane r of them against candidates r, r + L, ...
        const uint32_t L = C <= 32 ? 8u : 4u, j = uint32_t(tid) / L, r = uint32_t(tid) % L;
        uint32_t before = 0;
        uint32_t key = 0, i = 0;
        if (j < C) {
            key = cand[2 * j];
            i = cand[2 * j + 1];
            for (uint32_t c = r; c < C; c += L) {
                const uint32_t kc = cand[2 * c], ic = cand[2 * c + 1];
                before += kc > key || (kc == key && ic < i);
            }
        }
        for (uint32_t o = 1; o < L; o <<= 1) before += __shfl_xor_sync(0xffffffffu, before, int(o));
        if (j < C && r == 0 && before < need) {
            atomicOr(chosen + (i >> 5), 1u << (i & 31u));
            atomicAdd(ranked + i / (2u * cm::kFixedChunk), 1u);
        }
        __syncthreads();
        for (uint32_t m = mine; m != 0u; m &= m - 1u) {
            const int q = __ffs(int(m)) - 1;
            const uint32_t iq = index_of(q);
            if ((chosen[iq >> 5] >> (iq & 31u)) & 1u) sel |= 1u << q;
        }
    }
    const uint32_t total = counts[lane] + ranked[lane];
    uint32_t incl = total;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    const uint32_t start = incl - total;  // lane p: selected coefficients in row pairs before p
    const uint32_t lower = (1u << lane) - 1u, swapped = (1u << (lane ^ 16)) - 1u;
    const uint32_t lower_h1 = (swapped << 16) | (swapped >> 16);  // lanes ahead in index order when h = 1
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const uint32_t bits = (sel >> (4 * g)) & 15u, cnt = uint32_t(__popc(bits));
        const uint32_t ahead = (g & 1) == 0 ? lower : lower_h1;
        const uint32_t b_0 = __ballot_sync(0xffffffffu, cnt & 1u), b_1 = __ballot_sync(0xffffffffu, cnt & 2u),
                       b_2 = __ballot_sync(0xffffffffu, cnt & 4u);
        uint32_t pos = __shfl_sync(0xffffffffu, start, pair_of(g)) + uint32_t(__popc(b_0 & ahead)) +
                       2u * uint32_t(__popc(b_1 & ahead)) + 4u * uint32_t(__popc(b_2 & ahead));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (bits & (1u << j)) {
                Lidx[pos] = index_of(4 * g + j);
                Lval[pos] = v[4 * g + j];
                pos++;
            }
        }
    }
    __syncthreads();
}
// The sent coefficients' feedback in place (Lidx/Lval[0, k): indices and dequantized values), a barrier, then the
// one write of the thread's coefficients. Starts after a barrier that ended every read of E and Lval's writes.
template <int THREADS>
__device__ __forceinline__ void lean_dct_feedback(float* momentum, uint32_t cols, float alpha, float* E, int lde,
                                                  const uint32_t* Lidx, const float* Lval, uint32_t k) {
    for (uint32_t j = threadIdx.x; j < k; j += THREADS) {  // indices of a chunk are distinct: no two threads meet
        const uint32_t i = Lidx[j];
        float& e = E[(i / uint32_t(cm::kFixedChunk)) * uint32_t(lde) + i % uint32_t(cm::kFixedChunk)];
        e = cm::feedback(e, Lval[j], alpha);
    }
    __syncthreads();
    const LeanOffsets o = lean_offsets(cols);
    const int col = 4 * int(threadIdx.x & 15u), b0 = int(threadIdx.x >> 4);
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const float* et = E + (b0 + 16 * s) * lde + col;
        const float* eb = E + (63 - b0 - 16 * s) * lde + col;
        const float t[4] = {et[0], et[1], et[2], et[3]}, u[4] = {eb[0], eb[1], eb[2], eb[3]};
        store4(momentum + o.top[s], t);
        store4(momentum + o.bot[s], u);
    }
}

// Apply's last step with lean I/O: thread t owns columns 4 (t % 16) + [0, 4) of rows t / 16 + 16 s (s < 4) of
// the chunk at `origin`; 16-byte loads and stores of the master weights, the floatX copy as one 8-byte (bf16)
// or 16-byte (fp32) store per row. Same per-element arithmetic and rounding as the base kernel.
template <bool STOCHASTIC>
__device__ __forceinline__ void store_floatx4(llmc::floatX* dst, const float (&p)[4], uint64_t index, uint32_t seed) {
    if constexpr (llmc::kFloatXIsFloat) {
        store4(reinterpret_cast<float*>(dst), p);
    } else {
        uint16_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = STOCHASTIC ? llmc::km::bf16_bits_stochastic(p[j], llmc::km::element_noise(index + j, seed))
                              : llmc::km::bf16_bits_rne(p[j]);
        LLMC_REQUIRE_ALIGNED(dst, 8);
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
    }
}
// STOCHASTIC as a template parameter: the caller branches once, not per element.
template <bool STOCHASTIC>
__device__ __forceinline__ void lean_apply_update(float* master, llmc::floatX* params, uint64_t origin, uint32_t cols,
                                                  const float* dec, int lde, const cm::ApplyParams& ap, bool decays,
                                                  uint32_t seed) {
    const uint32_t col = 4u * (threadIdx.x & 15u), b0 = threadIdx.x >> 4;
    float m[4][4];
#pragma unroll
    for (int s = 0; s < 4; s++) load4(m[s], master + origin + ((b0 + 16u * s) * cols + col));
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint32_t b = b0 + 16u * s, off = b * cols + col;
        float p[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            p[j] = cm::sign_update(m[s][j], dec[b * lde + col + j], ap.lr, ap.wd_factor, decays, ap.decay_after,
                                   ap.use_sign);
        if (!ap.keep_master) store4(master + origin + off, p);
        if (!ap.keep_params) store_floatx4<STOCHASTIC>(params + origin + off, p, origin + off, seed);
    }
}

// FIXED = 64: every chunk of the launch is 64 x 64 and every size below is a compile-time constant (divisions
// become shifts, loops unroll); FIXED = 0: any chunk shape, sizes read from the tensor table. TUNE picks the
// 64 x 64 kernel's tuning (kTunings): tuning 0 holds it to 64 registers so 4 blocks share an SM (53 KB of
// shared memory each; ptxas spills ~14 floats to L1).
// IDENTITY (--optimizer topk, cm::PlanTables::identity): no transform. The updated momentum goes straight into E
// (steps 3-5 skipped, no bases read), the top-k, quantization and packing are the same code, and the decode puts
// the sent values at their indices (identity_decode; with lean I/O, lean_dct_feedback's sparse feedback in place).
// The compress parameters with `clip` read from the device when the caller left it there
// (cm::CompressParams::clip_device): every thread reads the same 4 bytes.
__device__ __forceinline__ cm::CompressParams with_device_clip(cm::CompressParams p) {
    if (p.clip_device) p.clip = *p.clip_device;
    return p;
}

template <int THREADS, int FIXED, int TUNE = 0, bool IDENTITY = false>
__global__ void __launch_bounds__(THREADS, FIXED ? compress_min_blocks(kTunings[TUNE]) : 1)
    demo_compress_kernel(const CompressArgs a) {
    static_assert(FIXED == 0 || FIXED * FIXED <= kMaxElemsPerThread * THREADS, "fixed chunk too large");
    constexpr KernelTuning kTune = FIXED ? kTunings[TUNE] : kGeneralTuning;
    constexpr int kTileJ = kTune.tile_j, kTileC = kTune.tile_c;
    constexpr bool kTensor = FIXED == int(cm::kFixedChunk) && kTune.tensor_dct;
    constexpr bool kLean = FIXED == int(cm::kFixedChunk) && kTune.lean_io;
    constexpr bool kRefetch = kLean && kTune.refetch;
    constexpr bool kDctMomentum = kLean && kTune.dct_momentum;
    static_assert(!IDENTITY || (!kTune.tensor_dct && !kTune.dct_momentum), "no transform: no DCTs, no DCT domain");
    static_assert(!kTune.dct_momentum || kTune.lean_io, "the DCT-domain momentum uses lean I/O's mapping");
    static_assert(!kTensor || THREADS == 256, "the tensor-core path takes 8 warps");
    static_assert(!kLean || THREADS == 256, "lean I/O: 16 threads per 64-column row, 16 rows per 256 threads");
    static_assert(!kTune.refetch || kTune.lean_io, "refetch is a variant of lean I/O");
    constexpr bool kCompact = FIXED == int(cm::kFixedChunk) && kTune.compact_smem;
    static_assert(!kCompact || !kTensor, "the compact layout has no room for the tensor cores' padded rows");
    LLMC_DYNAMIC_SHARED(float4, smem4);
    float* sm = reinterpret_cast<float*>(smem4);
    const int tid = threadIdx.x;
    const cm::CompressParams p = with_device_clip(a.p);
    const uint64_t gchunk = blockIdx.x;
    const cm::ChunkTensor ct = a.tensors[kTune.warp_lookup ? warp_tensor_of_chunk(a.tensors, a.num_tensors, gchunk)
                                                           : cm::tensor_of_chunk(a.tensors, a.num_tensors, gchunk)];
    const uint64_t c = gchunk - ct.chunk_offset;
    const cm::ChunkDims d = kTensor ? tensor_core_dims()
                            : FIXED ? cm::make_dims(FIXED, FIXED)
                                    : cm::make_dims(int(ct.n1), int(ct.n2));
    const uint64_t origin = block_chunk_origin(ct, uint32_t(c));
    const uint64_t cols = ct.cols;
    if constexpr (kDctMomentum && kTune.prefetch_own) {
        // this chunk's 64 rows x 256 bytes of momentum, read after the DCT passes: one 128-byte line per thread
        static_assert(FIXED * FIXED * 4 / 128 <= THREADS, "one line per thread");
        if (tid < FIXED * FIXED * 4 / 128)
            prefetch_l2(a.momentum + origin + (uint32_t(tid >> 1) * uint32_t(cols) + 32u * uint32_t(tid & 1)));
    }
    float* P = sm + a.L.P;
    float* Q = sm + a.L.Q;
    float* B = sm + a.L.B;
    uint32_t* Lidx = reinterpret_cast<uint32_t*>(sm + a.L.Lidx);
    float* Lval = sm + a.L.Lval;
    uint32_t* hist = reinterpret_cast<uint32_t*>(sm + a.L.masks);  // radix histograms, then the placement table
    int* segs = reinterpret_cast<int*>(sm + a.L.segs);
    uint32_t* scan = reinterpret_cast<uint32_t*>(sm + a.L.scratch);
    uint32_t* res = scan + 36;
    float* misc = reinterpret_cast<float*>(scan + 48);

    // folded bases -> shared (float4: table offsets and sizes are multiples of 4), or the tensor cores' split
    // fragments of them; histograms cleared
    const int f1 = cm::folded_basis_floats(d.n1), f2 = cm::folded_basis_floats(d.n2);
    float* fold1 = B;
    float* fold2 = kCompact ? fold1 : B + f1;  // compact: n1 = n2, so the two bases are one (ct.fold1 == ct.fold2)
    const float4* basis = reinterpret_cast<const float4*>(B);
    if constexpr (IDENTITY) {
        // no transform: no bases to copy
    } else if constexpr (kTensor) {
        LLMC_REQUIRE_ALIGNED(B, 16);
        LLMC_REQUIRE_ALIGNED(a.folded, 16);
        if constexpr (kTune.basis_table == 1)
            copy_tensor_basis(reinterpret_cast<const float4*>(a.folded), reinterpret_cast<float4*>(B));
        else
            build_tensor_basis(a.folded + ct.fold1, reinterpret_cast<float4*>(B));
    } else {
        const float4* s1 = reinterpret_cast<const float4*>(a.folded + ct.fold1);
        const float4* s2 = reinterpret_cast<const float4*>(a.folded + ct.fold2);
        LLMC_REQUIRE_ALIGNED(s1, 16);
        LLMC_REQUIRE_ALIGNED(s2, 16);
        LLMC_REQUIRE_ALIGNED(fold1, 16);
        LLMC_REQUIRE_ALIGNED(fold2, 16);
        for (int i = tid; i < f1 / 4; i += THREADS) reinterpret_cast<float4*>(fold1)[i] = s1[i];
        if constexpr (!kCompact)
            for (int i = tid; i < f2 / 4; i += THREADS) reinterpret_cast<float4*>(fold2)[i] = s2[i];
    }
    hist[tid] = 0u;
    hist[THREADS + tid] = 0u;
    if (tid < 12) res[tid] = 0u;

    // 1-2: read momentum and gradient once; momentum update; fold rows into FX (P). Thread owns the row pairs
    // (b, n), (n1-1-b, n) of slots q = tid + r * THREADS (consecutive lanes: consecutive columns).
    const int npairs = d.he1 * d.n2;
    float own_top[kMaxPairsPerThread], own_bot[kMaxPairsPerThread];
    float* const momentum = a.momentum + origin;
    const float* const grads = a.grads + origin;
    const uint32_t cols32 = uint32_t(cols);
    if constexpr (kDctMomentum) {
        lean_prologue_dct(grads, cols32, d.ldx, P);
    } else if constexpr (IDENTITY && kLean) {
        lean_identity_prologue(momentum, grads, cols32, p, Q, d.lde);
    } else if constexpr (kLean) {
        lean_prologue<kRefetch>(momentum, grads, cols32, p, d.ldx, P, own_top, own_bot);
    } else {
        float m_top[kMaxPairsPerThread], g_top[kMaxPairsPerThread], m_bot[kMaxPairsPerThread], g_bot[kMaxPairsPerThread];
#pragma unroll
        for (int r = 0; r < kMaxPairsPerThread; r++) {
            const int q = tid + r * THREADS;
            m_top[r] = g_top[r] = m_bot[r] = g_bot[r] = 0.0f;
            if (q < npairs) {
                const int b = q / d.n2, n = q - b * d.n2, bb = d.n1 - 1 - b;
                const uint32_t i1 = uint32_t(b) * cols32 + uint32_t(n), i2 = uint32_t(bb) * cols32 + uint32_t(n);
                m_top[r] = momentum[i1];
                g_top[r] = __ldg(grads + i1);
                if (bb != b) {
                    m_bot[r] = momentum[i2];
                    g_bot[r] = __ldg(grads + i2);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < kMaxPairsPerThread; r++) {
            const int q = tid + r * THREADS;
            own_top[r] = own_bot[r] = 0.0f;
            if (q < npairs) {
                const int b = q / d.n2, n = q - b * d.n2, bb = d.n1 - 1 - b;
                const float x1 = cm::momentum_update(m_top[r], g_top[r], p.clip, p.decay, p.grad_scale);
                own_top[r] = x1;
                if (bb != b) {
                    const float x2 = cm::momentum_update(m_bot[r], g_bot[r], p.clip, p.decay, p.grad_scale);
                    own_bot[r] = x2;
                    if constexpr (IDENTITY) {  // no transform: the momentum is E
                        Q[b * d.lde + n] = x1;
                        Q[bb * d.lde + n] = x2;
                    } else {
                        P[b * d.ldx + n] = cm::add_rn(x1, x2);
                        P[(d.he1 + b) * d.ldx + n] = cm::sub_rn(x1, x2);
                    }
                } else if constexpr (IDENTITY) {
                    Q[b * d.lde + n] = x1;
                } else {
                    P[b * d.ldx + n] = x1;
                }
            }
        }
    }
    __syncthreads();

    if constexpr (!IDENTITY) {  // steps 3-5: the DCT
        // 3: pass 1 (along rows): FX (P) -> Z (Q)
        if constexpr (kTensor)
            tensor_dct_pass(basis, P, d.he1 * d.ldx, d.ldx, 1, Q, d.ldz, 2 * d.ldz, 1);
        else
            run_jobs<THREADS, kTileJ, kTileC>(cm::pass1_job(d, fold1, P, Q, 0), cm::pass1_job(d, fold1, P, Q, 1), 2);
        __syncthreads();
        // 4: fold columns: Z (Q) -> FZ (P)
        for (int q = tid; q < d.n1 * d.he2; q += THREADS) {
            const int j = q / d.he2, r = q - j * d.he2;
            const float* zr = Q + j * d.ldz;
            P[j * d.ldf + r] = cm::fold_even(zr, 1, d.n2, r);
            if (r < d.ho2) P[j * d.ldf + d.he2 + r] = cm::fold_odd(zr, 1, d.n2, r);
        }
        __syncthreads();
        // 5: pass 2 (along columns): FZ (P) -> E (Q)
        if constexpr (kTensor)
            tensor_dct_pass(basis, P, d.he2, 1, d.ldf, Q, 1, 2, d.lde);
        else
            run_jobs<THREADS, kTileJ, kTileC>(cm::pass2_job(d, fold2, P, Q, 0), cm::pass2_job(d, fold2, P, Q, 1), 2);
        __syncthreads();
    }
    // the anchored top-k's coarse bins (in P, free since pass 2) are cleared before the momentum update's barrier
    constexpr bool kRegisterTopk = kLean && kTune.register_topk;
    constexpr bool kZeroedBins = kDctMomentum && kRegisterTopk;
    static_assert(!kTune.register_topk || (kTune.lean_io && kTune.coarse_topk), "register_topk takes lean I/O's mapping");
    const uint32_t k = ct.k;
    const TopkShared topk_shared{reinterpret_cast<uint32_t*>(P), hist, res};
    if constexpr (kDctMomentum) {  // E holds DCT(g): the momentum update in the DCT domain
        float v[16];
        lean_dct_momentum_update(momentum, cols32, p, Q, d.lde, v);
        if constexpr (kZeroedBins) clear_coarse_bins<THREADS>(P);
        __syncthreads();
        if constexpr (kRegisterTopk) register_topk<THREADS>(v, k, d, Q, topk_shared, Lidx, Lval);
    } else if constexpr (kRegisterTopk) {  // the coarse bins (in P, free since pass 2) cleared before one more barrier
        float v[16];
        lean_read_coefficients(Q, d.lde, v);
        clear_coarse_bins<THREADS>(P);
        __syncthreads();
        register_topk<THREADS>(v, k, d, Q, topk_shared, Lidx, Lval);
    }

    // 6: top-k (radix select), placed in index order into the list. Keys of natural indices tid + r * THREADS.
    if constexpr (!kRegisterTopk) {
        const uint32_t n = uint32_t(d.elems);
        uint32_t keys[kMaxElemsPerThread];
#pragma unroll
        for (int r = 0; r < kMaxElemsPerThread; r++) {
            const uint32_t i = uint32_t(tid + r * THREADS);
            keys[r] = i < n ? cm::magnitude_key(Q[(i / uint32_t(d.n2)) * d.lde + i % uint32_t(d.n2)]) : 0u;
        }
        block_select_topk<THREADS, kTune.coarse_topk>(
            keys, n, k, d, Q, topk_shared, Lidx, Lval);
    }

    // 7-8: quantize and pack
    float scale = 0.0f;
    if (p.values == cm::kValuesSign) {
        if (tid == 0) misc[0] = cm::sign_scale(Lval, int(k));
        __syncthreads();
        scale = misc[0];
    }
    {
        const AtomicOrWord or_word;
        uint8_t* values = a.bucket + ct.values_off;
        uint8_t* indices = a.bucket + ct.indices_off;
        for (uint32_t j = tid; j < k; j += THREADS) {
            const float dq = cm::dequantize(p.values, Lval[j], scale);
            Lval[j] = dq;
            const uint64_t item = c * k + j;
            if (p.values == cm::kValuesSign) cm::put_sign_bit(values, item, dq, or_word);
            else cm::put_value(values, p.values, item, dq);
            cm::put_index(indices, p.indices, int(ct.index_bytes), item, Lidx[j], or_word);
        }
        if (p.values == cm::kValuesSign && tid == 0)
            cm::store_u32(a.bucket + ct.scales_off + 4 * c, llmc::km::float_to_bits(scale));
    }
    __syncthreads();
    // 9-10 where E is the momentum (the DCT domain; no transform with lean I/O): the sent coefficients' feedback in
    // place, the one write
    if constexpr (kDctMomentum || (IDENTITY && kLean)) {
        lean_dct_feedback<THREADS>(momentum, cols32, p.alpha, Q, d.lde, Lidx, Lval, k);
        return;
    }

    // 9: decode what was sent (T in P, gathered C1 rows in B, dec in Q; no transform: the values at their indices)
    if constexpr (IDENTITY)
        identity_decode<THREADS>(d, Lidx, Lval, int(k), Q);
    else
        decode_list<THREADS, kTileJ, kTileC, kTensor>(d, a.natural + ct.nat1, a.natural + ct.nat2, Lidx, Lval, int(k),
                                                       P, B, Q, segs, scan);

    // 10: error feedback, the one write of the momentum
    if constexpr (kLean) {
        lean_feedback<kRefetch>(momentum, cols32, p.alpha, Q, d.lde, own_top, own_bot);
    } else {
#pragma unroll
        for (int r = 0; r < kMaxPairsPerThread; r++) {
            const int q = tid + r * THREADS;
            if (q < npairs) {
                const int b = q / d.n2, nn = q - b * d.n2, bb = d.n1 - 1 - b;
                momentum[uint32_t(b) * cols32 + uint32_t(nn)] = cm::feedback(own_top[r], Q[b * d.lde + nn], p.alpha);
                if (bb != b)
                    momentum[uint32_t(bb) * cols32 + uint32_t(nn)] =
                        cm::feedback(own_bot[r], Q[bb * d.lde + nn], p.alpha);
            }
        }
    }
}

}  // namespace demo
