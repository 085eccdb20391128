// Block-level pieces of the DeMo compress kernel: the bucket's atomic OR words, the block scan, and the per-chunk
// top-k by |E| (a histogram of the top 11 key bits, then an exact ranking in the k-th largest's bin; RadixSelect
// when ties crowd it) with the selection placed in index order.
#pragma once
#include <cuda_runtime.h>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/kernels/tunings.h"

namespace demo {

// ---------------------------------------------------------------------------------------------------------
// Block-level helpers (THREADS a multiple of 32, at most 1024).
struct AtomicOrWord {
    __host__ __device__ void operator()(uint8_t* w, uint32_t bits) const {
        LLMC_REQUIRE_ALIGNED(w, 4);  // atomicOr on the GPU
#ifdef __CUDA_ARCH__
        atomicOr(reinterpret_cast<unsigned int*>(w), bits);
#else
        cm::store_u32(w, cm::load_u32(w) | bits);
#endif
    }
};

// Exclusive prefix sum over the block in thread order; *total gets the sum. `scan` holds 33 words.
template <int THREADS>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* scan, uint32_t* total) {
    constexpr int kWarps = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) scan[warp] = x;
    __syncthreads();
    if (warp == 0) {
        const uint32_t w = lane < kWarps ? scan[lane] : 0u;
        uint32_t inc = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (lane < kWarps) scan[lane] = inc - w;
        if (lane == 31) scan[32] = inc;
    }
    __syncthreads();
    const uint32_t r = scan[warp] + x - v;
    *total = scan[32];
    __syncthreads();  // scan[] may be reused right away
    return r;
}

// Top-k of the block's keys (slot r of thread t holds the key of natural index t + r * THREADS; indices >= n
// are not keys) by cm::RadixSelect: per round one shared-memory histogram (atomics), then warp 0 finds the
// digit with a suffix scan over the 256 bins (lane l holds digits 255 - 8 l down to 248 - 8 l). `hist` holds
// 512 zeroed words (two histograms used alternately: warp 0 clears the next round's), `res` 3 words. Two
// barriers per round, at most 4 rounds; every thread returns the same rule.
template <int THREADS>
__device__ __forceinline__ cm::TopkRule block_radix_select(const uint32_t (&keys)[kMaxElemsPerThread], uint32_t n,
                                                           uint32_t k, uint32_t* hist, uint32_t* res) {
    cm::RadixSelect s = cm::radix_select_init(n, k);
    for (int round = 0; !s.done; round++) {
        uint32_t* h = hist + 256 * (round & 1);
#pragma unroll
        for (int r = 0; r < kMaxElemsPerThread; r++) {
            const uint32_t i = threadIdx.x + uint32_t(r * THREADS);
            if (i < n && cm::radix_counts(s, keys[r])) atomicAdd(h + cm::radix_digit(s, keys[r]), 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            uint32_t c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = h[255 - 8 * lane - j];
                sum += c[j];
            }
            uint32_t incl = sum;  // keys on the digits of lanes 0..lane (all above the next lane's)
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            uint32_t above = incl - sum;
            if (above < s.need && s.need <= incl) {  // the need-th largest key is on one of this lane's digits
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (above + c[j] >= s.need) {
                        res[0] = uint32_t(255 - 8 * lane - j);
                        res[1] = above;
                        res[2] = c[j];
                        break;
                    }
                    above += c[j];
                }
            }
            uint32_t* next = hist + 256 * ((round + 1) & 1);  // last read by this warp a round ago
#pragma unroll
            for (int j = 0; j < 8; j++) next[8 * lane + j] = 0u;
        }
        __syncthreads();
        cm::radix_select_step(s, res[0], res[1], res[2]);
    }
    return s.rule;
}

// Placement of the selection in index order. The table holds, per (slot r, warp) in index order (natural index
// = r * THREADS + warp * 32 + lane), the counts of selected keys: greater in the low 16 bits, ties in the high
// 16. Warp 0 turns it into exclusive prefix sums (a warp-wide call: warp 0 only); then every thread places
// its selected keys: Lidx/Lval[pos] for pos < k, the values read from E (`e`, rows of d.lde).
template <int THREADS>
inline constexpr int kTableEntries = kMaxElemsPerThread * (THREADS / 32);

template <int THREADS>
__device__ __forceinline__ void warp_scan_table(uint32_t* table, uint32_t n) {
    constexpr int kWarps = THREADS / 32, kPerLane = kTableEntries<THREADS> / 32;
    static_assert(kTableEntries<THREADS> % 32 == 0, "table entries must split evenly over a warp");
    const int lane = threadIdx.x & 31;
    uint32_t v[kPerLane], sum = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        const int entry = kPerLane * lane + j;  // entries of slots without indices were never written
        v[j] = uint32_t((entry / kWarps) * THREADS) < n ? table[entry] : 0u;
        sum += v[j];
    }
    uint32_t incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    uint32_t run = incl - sum;
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        table[kPerLane * lane + j] = run;
        run += v[j];
    }
}

template <int THREADS>
__device__ __forceinline__ void place_from_table(const uint32_t (&keys)[kMaxElemsPerThread], uint32_t n,
                                                 const cm::TopkRule& rule, const cm::ChunkDims& d, const float* e,
                                                 const uint32_t* table, uint32_t* Lidx, float* Lval) {
    constexpr int kWarps = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t lower = (1u << lane) - 1u;
#pragma unroll
    for (int r = 0; r < kMaxElemsPerThread; r++) {
        if (uint32_t(r * THREADS) >= n) break;
        const uint32_t i = threadIdx.x + uint32_t(r * THREADS);
        const bool greater = i < n && cm::topk_greater(rule, keys[r]);
        const bool tie = i < n && !greater && cm::topk_tie(rule, keys[r]);
        const uint32_t g = __ballot_sync(0xffffffffu, greater);
        const uint32_t t = __ballot_sync(0xffffffffu, tie);
        if (!greater && !tie) continue;
        const uint32_t before = table[r * kWarps + warp];
        const uint32_t gb = (before & 0xffffu) + uint32_t(__popc(g & lower));
        const uint32_t tb = (before >> 16) + uint32_t(__popc(t & lower));
        int pos = -1;
        if (greater) pos = int(gb + min(tb, rule.need));
        else if (tb < rule.need) pos = int(gb + tb);
        if (pos >= 0) {
            Lidx[pos] = i;
            Lval[pos] = e[(i / uint32_t(d.n2)) * d.lde + i % uint32_t(d.n2)];
        }
    }
}

// The general placement: counts by ballots, scan, place. Starts after a barrier that ended every read of
// `table`; ends with a barrier.
template <int THREADS>
__device__ __forceinline__ void block_place_topk(const uint32_t (&keys)[kMaxElemsPerThread], uint32_t n,
                                                 const cm::TopkRule& rule, const cm::ChunkDims& d, const float* e,
                                                 uint32_t* table, uint32_t* Lidx, float* Lval) {
    constexpr int kWarps = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < kMaxElemsPerThread; r++) {
        if (uint32_t(r * THREADS) >= n) break;
        const uint32_t i = threadIdx.x + uint32_t(r * THREADS);
        const uint32_t g = __ballot_sync(0xffffffffu, i < n && cm::topk_greater(rule, keys[r]));
        const uint32_t t = __ballot_sync(0xffffffffu, i < n && cm::topk_tie(rule, keys[r]));
        if (lane == 0) table[r * kWarps + warp] = uint32_t(__popc(g)) | (uint32_t(__popc(t)) << 16);
    }
    __syncthreads();
    if (warp == 0) warp_scan_table<THREADS>(table, n);
    __syncthreads();
    place_from_table<THREADS>(keys, n, rule, d, e, table, Lidx, Lval);
    __syncthreads();
}

// The coarse bin of the k-th largest key, found by one warp alone: lane l sums bins top - 2l and top - 2l - 1
// of a 64-bin window that starts at `top` (the bin of the largest key: nothing above it) and moves down until
// the keys counted reach k (k <= the number of keys). Every lane returns the bin, the keys in higher bins and
// the bin's count. Uniform in the warp; no barrier.
struct CoarseBin {
    uint32_t bin, above, count;
};
__device__ __forceinline__ CoarseBin anchored_bin_search(const uint32_t* coarse, int top, uint32_t k) {
    const int lane = int(threadIdx.x & 31u);
    uint32_t base = 0;  // keys in the windows above this one
    for (;; top -= 64) {
        const int b0 = top - 2 * lane, b1 = b0 - 1;
        const uint32_t h0 = b0 >= 0 ? coarse[b0] : 0u, h1 = b1 >= 0 ? coarse[b1] : 0u;
        uint32_t pin = h0 + h1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, pin, o);
            if (lane >= o) pin += y;
        }
        const uint32_t total = __shfl_sync(0xffffffffu, pin, 31);
        if (base + total >= k) {
            const uint32_t a0 = base + pin - h0 - h1;  // keys above bin b0
            const bool in0 = a0 < k && k <= a0 + h0;
            const bool in1 = !in0 && a0 + h0 < k && k <= a0 + h0 + h1;
            const int L = __ffs(int(__ballot_sync(0xffffffffu, in0 || in1))) - 1;
            const uint32_t bin = uint32_t(in0 ? b0 : b1), above = in0 ? a0 : a0 + h0, count = in0 ? h0 : h1;
            return CoarseBin{__shfl_sync(0xffffffffu, bin, L), __shfl_sync(0xffffffffu, above, L),
                             __shfl_sync(0xffffffffu, count, L)};
        }
        base += total;
    }
}

// Shared words of block_select_topk (and register_topk) beyond the chunk buffers.
struct TopkShared {
    uint32_t* coarse;  // cm::kCoarseBins words (any contents: zeroed here; register_topk: zeroed by the caller)
    uint32_t* small;   // zeroed: the placement table, then 2 * cm::kMaxTopkCandidates words of candidates;
                       // RadixSelect's two histograms (512 words) on the fallback path
    uint32_t* res;     // 12 words, res[6] zeroed (the candidate count), res[7] zeroed (register_topk: the largest key)
};

// Step 6 whole: the top-k of the block's keys placed in index order into Lidx/Lval (k entries). Fast path
// (cm::coarse_bin): one histogram of the top 11 bits of every key, warp 0 finds the bin B of the k-th largest
// (a REDUX per 64-bin group, then a scan inside the group); keys above B are selected and counted into the
// placement table by ballots while the keys in B (the candidates, at most cm::kMaxTopkCandidates) are
// listed; warp 0 ranks the candidates against each other, adds theirs to the table and scans it; every thread
// places its keys. 6 barriers. When B holds more candidates (heavy ties or zeros) or k >= n: RadixSelect and
// the general placement. Starts after a barrier that ended the writes of E and every use of `coarse`; ends
// with a barrier.
template <int THREADS, bool COARSE = true>
__device__ __forceinline__ void block_select_topk(const uint32_t (&keys)[kMaxElemsPerThread], uint32_t n, uint32_t k,
                                                  const cm::ChunkDims& d, const float* e, const TopkShared& sh,
                                                  uint32_t* Lidx, float* Lval) {
    constexpr int kWarps = THREADS / 32, kBins = cm::kCoarseBins, kGroup = kBins / 32;
    static_assert(kGroup == 64, "the bin search below gives each lane two bins of a 64-bin group");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t* table = sh.small;
    uint32_t* cand = sh.small + kTableEntries<THREADS>;  // (key, index) pairs
    uint32_t* res = sh.res;
    if (COARSE && k < n) {
        for (int b = tid; b < kBins; b += THREADS) sh.coarse[b] = 0u;
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kMaxElemsPerThread; r++) {
            const uint32_t i = uint32_t(tid + r * THREADS);
            if (i < n) atomicAdd(sh.coarse + cm::coarse_bin(keys[r]), 1u);
        }
        __syncthreads();
        if (warp == 0) {
            // group g = bins [kBins - 64 (g + 1), kBins - 64 g): group sums in descending order, lane g holds S_g
            uint32_t S = 0;
            for (int g = 0; g < 32; g++) {
                const int lo = kBins - kGroup * (g + 1);
                const uint32_t tot = __reduce_add_sync(0xffffffffu, sh.coarse[lo + lane] + sh.coarse[lo + 32 + lane]);
                if (lane == g) S = tot;
            }
            uint32_t incl = S;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            const uint32_t cross = __ballot_sync(0xffffffffu, incl - S < k && k <= incl);
            const int G = __ffs(int(cross)) - 1;  // one lane: the counts reach k inside its group
            const uint32_t group_above = __shfl_sync(0xffffffffu, incl - S, G);
            // inside group G, bins descending from top: lane l holds top - 2l and top - 2l - 1
            const int top = kBins - 1 - kGroup * G;
            const uint32_t h0 = sh.coarse[top - 2 * lane], h1 = sh.coarse[top - 2 * lane - 1];
            uint32_t pin = h0 + h1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t y = __shfl_up_sync(0xffffffffu, pin, o);
                if (lane >= o) pin += y;
            }
            const uint32_t above = group_above + pin - h0 - h1;
            if (above < k && k <= above + h0) {
                res[3] = uint32_t(top - 2 * lane);
                res[4] = above;
                res[5] = h0;
            } else if (above + h0 < k && k <= above + h0 + h1) {
                res[3] = uint32_t(top - 2 * lane - 1);
                res[4] = above + h0;
                res[5] = h1;
            }
        }
        __syncthreads();
        const uint32_t B = res[3], need = k - res[4], C = res[5];
        const bool whole_bin = C == need;  // every key of B is selected
        if (whole_bin || C <= cm::kMaxTopkCandidates) {
#pragma unroll
            for (int r = 0; r < kMaxElemsPerThread; r++) {
                if (uint32_t(r * THREADS) >= n) break;
                const uint32_t i = uint32_t(tid + r * THREADS);
                const uint32_t bin = cm::coarse_bin(keys[r]);
                const uint32_t g = __ballot_sync(0xffffffffu, i < n && (bin > B || (whole_bin && bin == B)));
                if (lane == 0) table[r * kWarps + warp] = uint32_t(__popc(g));
                if (i < n && !whole_bin && bin == B) {
                    const uint32_t slot = atomicAdd(res + 6, 1u);
                    cand[2 * slot] = keys[r];
                    cand[2 * slot + 1] = i;
                }
            }
            __syncthreads();
            if (warp == 0) {
                cm::TopkRule rule;
                if (whole_bin) {
                    rule = cm::topk_rule_at(B << (31 - cm::kCoarseBits), 0u, need, need);
                } else {
                    // lane owns candidates lane and lane + 32: counts of candidates above and equal
                    uint32_t g0 = 0, t0 = 0, g1 = 0, t1 = 0;
                    const uint32_t c0 = lane < int(C) ? cand[2 * lane] : 0u;
                    const uint32_t c1 = lane + 32 < int(C) ? cand[2 * (lane + 32)] : 0u;
                    for (uint32_t j = 0; j < C; j++) {
                        const uint32_t kj = cand[2 * j];
                        g0 += kj > c0;
                        t0 += kj == c0;
                        g1 += kj > c1;
                        t1 += kj == c1;
                    }
                    const bool hold0 = lane < int(C) && cm::is_rank_holder(g0, t0, need);
                    const bool hold1 = lane + 32 < int(C) && cm::is_rank_holder(g1, t1, need);
                    const int H = __ffs(int(__ballot_sync(0xffffffffu, hold0 || hold1))) - 1;
                    const uint32_t v = __shfl_sync(0xffffffffu, hold0 ? c0 : c1, H);
                    const uint32_t gv = __shfl_sync(0xffffffffu, hold0 ? g0 : g1, H);
                    const uint32_t tv = __shfl_sync(0xffffffffu, hold0 ? t0 : t1, H);
                    rule = cm::topk_rule_at(v, gv, tv, need);
                    for (uint32_t j = uint32_t(lane); j < C; j += 32) {  // the candidates' part of the table
                        const uint32_t key = cand[2 * j], i = cand[2 * j + 1];
                        const uint32_t entry = (i / THREADS) * kWarps + (i % THREADS) / 32;
                        if (cm::topk_greater(rule, key)) atomicAdd(table + entry, 1u);
                        else if (cm::topk_tie(rule, key)) atomicAdd(table + entry, 1u << 16);
                    }
                    __syncwarp();
                }
                warp_scan_table<THREADS>(table, n);
                if (lane == 0) {
                    res[8] = rule.above;
                    res[9] = rule.tie_key;
                    res[10] = rule.need;
                    res[11] = rule.ties ? 1u : 0u;
                }
            }
            __syncthreads();
            const cm::TopkRule rule{res[8], res[9], res[10], res[11] != 0u};
            place_from_table<THREADS>(keys, n, rule, d, e, table, Lidx, Lval);
            __syncthreads();
            return;
        }
    }
    const cm::TopkRule rule = block_radix_select<THREADS>(keys, n, k, sh.small, res);
    block_place_topk<THREADS>(keys, n, rule, d, e, sh.small, Lidx, Lval);
}

// Runs one or two cm::MatmulJobs with TJ x TC register tiles (see the file comment): TJ consecutive output
// rows (A read as TJ / 4 float4, the same for all lanes of a tile row) by TC columns 64 / TC apart (64 / TC
// consecutive lanes read consecutive columns). 4 x 4 in general; 8 x 2 for 64 x 64 chunks, where every
// tile is full (J is a multiple of 8): per 16 multiply-adds a warp then reads 4 shared-memory wavefronts
// instead of 5. No barrier inside.

}  // namespace demo
