// The per-chunk math of DeMo as the CUDA kernels (demo/demo_kernels.cuh) compute it, written once as
// __host__ __device__ functions so the same code runs on the CPU in tests. g++ compiles this header without
// any CUDA header; nvcc compiles the same functions for the device.
//
// It defines the CANONICAL computation: a fixed sequence of fp32 operations per output value (explicit fmaf
// chains in ascending order, no compiler contraction: mul/add/sub/div go through *_rn helpers), so the GPU
// kernels and the host reference below produce bit-identical momentum, buckets and parameters (except for
// denormals, which the device flushes under --use_fast_math). The CPU DemoOptimizer (demo_optimizer.cpp)
// computes the same mathematics with other summation orders (OpenBLAS sgemm, sparse decode grouped by rows or
// columns, and GCC contracting a*b+c), so it agrees with the canonical values to float rounding only:
// test/test_demo_chunk_math.cpp measures that agreement.
//
// One chunk X (n1 x n2, row-major, flat index b*n2 + d) of one tensor, step by step:
//  1. momentum   x = fmaf(decay, delta, gs * (g * clip))   (gs = lr, or 1 - decay for EMA momentum)
//  2. fold rows  FX: even rows r < he1 = ceil(n1/2): X[r] + X[n1-1-r] (the middle row of an odd n1 alone);
//                odd rows r < ho1 = floor(n1/2): X[r] - X[n1-1-r]        (DCT-II symmetry C[k][N-1-n] = (-1)^k C[k][n])
//  3. pass 1     Z[2j'+p][n] = sum_{r < K_p} C1[2j'+p][r] * FX_p[r][n]  (K_0 = he1, K_1 = ho1; fmaf, r ascending)
//  4. fold cols  FZ: the same fold of every row of Z along n (he2, ho2)
//  5. pass 2     E[j][2k'+p] = sum_{r < K_p} C2[2k'+p][r] * FZ_p[j][r]    -> E = C1 X C2^T
//  6. top-k      the k largest |E| (key = fp32 bits of |E|), ties to the lower flat index; found by a binary
//                search over keys with block-wide counts, output in ascending index order
//  7. quantize   fp32: as is | bf16: round to nearest even | sign: scale = mean |v| (double, index order),
//                value = +-scale (+scale for v >= 0, all 0 when scale is 0)
//  8. pack       into the bucket at codec.h's offsets (bit-packed parts OR-ed into a zeroed bucket)
//  9. decode     T[s][n] = sum over the selected (b_s, d) of row b_s (ascending d): v * C2[d][n];
//                dec[m][n] = sum_s C1[b_s][m] * T[s][n] (rows b_s ascending)  -> dec = C1^T S C2
// 10. feedback   delta = fmaf(-alpha, dec, x)
// Apply (every rank's bucket): per coefficient the sum over ranks in rank order divided by the number of ranks
// that sent it, then step 9 on the ascending list of coefficients anyone sent, then
//    p = p * (1 - lr * wd) (decayed tensors only), p = p - lr * sign(dec)   (sign(0) = 0).
// The basis values are the CPU's (demo::dct_basis: computed in double, rounded once to fp32).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmc/kernel_math.h"

#ifdef __CUDACC__
#define DEMO_HD __host__ __device__ __forceinline__
#else
#define DEMO_HD inline
#endif

namespace demo::cm {

// Wire ids (codec.h header bytes 6 and 7).
inline constexpr int kValuesFp32 = 0, kValuesBf16 = 1, kValuesSign = 2;
inline constexpr int kIndicesSmallest = 0, kIndicesPacked12 = 1;

// ---------------------------------------------------------------------------------------------------------
// Rounded arithmetic that no compiler fuses into an FMA (nvcc contracts a*b+c under --use_fast_math, and g++
// contracts across statements with -march=native): the device intrinsics, and on the host a volatile store.
DEMO_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}
DEMO_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}
DEMO_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    volatile float r = a - b;
    return r;
#endif
}
DEMO_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);  // --use_fast_math makes '/' approximate
#else
    volatile float r = a / b;
    return r;
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Elementwise steps.
// Step 1: the momentum update of one element (clip = gradient clipping scale, 1 when not clipping).
DEMO_HD float momentum_update(float delta, float grad, float clip, float decay, float grad_scale) {
    return fmaf(decay, delta, mul_rn(grad_scale, mul_rn(grad, clip)));
}
// Step 10: error feedback.
DEMO_HD float feedback(float x, float dec, float alpha) { return fmaf(-alpha, dec, x); }
// sign(v) with sign(0) = 0 (and NaN -> 0).
DEMO_HD float sign_of(float v) { return static_cast<float>((v > 0.0f) - (v < 0.0f)); }
// The apply-side update of one master weight: decay, then the signed step (the reference's order), or with
// decay_after the step, then the decay (--demo_delay 1, whose CPU optimizer applies the pending round before
// this step's compress decays the weights).
DEMO_HD float sign_update(float p, float dec, float lr, float wd_factor, bool decays, bool decay_after = false) {
    if (decays && !decay_after) p = mul_rn(p, wd_factor);
    p = sub_rn(p, mul_rn(lr, sign_of(dec)));
    return decays && decay_after ? mul_rn(p, wd_factor) : p;
}

// ---------------------------------------------------------------------------------------------------------
// Chunk geometry and the leading dimensions of the per-chunk buffers (shared memory on the GPU).
DEMO_HD int ceil4(int v) { return (v + 3) & ~3; }

struct ChunkDims {
    int n1, n2;
    int he1, ho1, he2, ho2;  // folded sizes: ceil(n / 2) even positions, floor(n / 2) odd ones
    int ldb1, ldb2;          // row length of the folded bases: ceil4(he)
    int ldx;                 // FX rows (n2)
    int ldz;                 // Z rows (n2)
    int ldf;                 // FZ rows: odd (n2 | 1), so pass 2's strided reads hit distinct banks
    int lde;                 // E and dec rows: odd (n2 | 1), so pass 2's strided writes do too
    int ldt;                 // T rows (n2)
    int ldas;                // rows of the gathered C1 rows: ceil4(n1) (16-byte aligned rows)
    int elems;               // n1 * n2
};

DEMO_HD ChunkDims make_dims(int n1, int n2) {
    ChunkDims d;
    d.n1 = n1;
    d.n2 = n2;
    d.he1 = (n1 + 1) / 2;
    d.ho1 = n1 / 2;
    d.he2 = (n2 + 1) / 2;
    d.ho2 = n2 / 2;
    d.ldb1 = ceil4(d.he1);
    d.ldb2 = ceil4(d.he2);
    d.ldx = n2;
    d.ldz = n2;
    d.ldf = n2 | 1;
    d.lde = n2 | 1;
    d.ldt = n2;
    d.ldas = ceil4(n1);
    d.elems = n1 * n2;
    return d;
}

// Floats of the folded basis of size n (even block of he rows, odd block of ho rows, rows of ceil4(he)).
DEMO_HD int folded_basis_floats(int n) { return n * ceil4((n + 1) / 2); }

// One folded entry (step 2 / step 4): position r < he is the even fold, he + r the odd fold, of a line
// `x` of length n with stride `stride`.
DEMO_HD float fold_even(const float* x, int stride, int n, int r) {
    const int m = n - 1 - r;
    return m == r ? x[r * stride] : add_rn(x[r * stride], x[m * stride]);
}
DEMO_HD float fold_odd(const float* x, int stride, int n, int r) {
    return sub_rn(x[r * stride], x[(n - 1 - r) * stride]);
}

// ---------------------------------------------------------------------------------------------------------
// The one dense product of the kernels (steps 3, 5 and 9): Out(j, c) = sum_{r < K} A[r*lda + j] * In[r*irs + c*ics]
// for j < J, c < C, accumulated as acc = fmaf(A, In, acc) from +0 in ascending r. Written to
// out[j*ors + c*ocs]. The kernels cut it into register tiles; every output element sees the same chain.
struct MatmulJob {
    const float* A;
    int lda;
    const float* In;
    int irs, ics;
    int K, J, C;
    float* out;
    int ors, ocs;
};

// Steps 3, 5, 9 as jobs over buffers laid out as ChunkDims says. fold1/fold2: folded bases; parity p.
DEMO_HD MatmulJob pass1_job(const ChunkDims& d, const float* fold1, const float* FX, float* Z, int p) {
    MatmulJob j;
    j.A = fold1 + (p ? d.he1 * d.ldb1 : 0);
    j.lda = d.ldb1;
    j.In = FX + (p ? d.he1 * d.ldx : 0);
    j.irs = d.ldx;
    j.ics = 1;
    j.K = p ? d.ho1 : d.he1;
    j.J = j.K;
    j.C = d.n2;
    j.out = Z + p * d.ldz;
    j.ors = 2 * d.ldz;
    j.ocs = 1;
    return j;
}
DEMO_HD MatmulJob pass2_job(const ChunkDims& d, const float* fold2, const float* FZ, float* E, int p) {
    MatmulJob j;
    j.A = fold2 + (p ? d.he2 * d.ldb2 : 0);
    j.lda = d.ldb2;
    j.In = FZ + (p ? d.he2 : 0);
    j.irs = 1;
    j.ics = d.ldf;
    j.K = p ? d.ho2 : d.he2;
    j.J = j.K;
    j.C = d.n1;
    j.out = E + p;
    j.ors = 2;
    j.ocs = d.lde;
    return j;
}
// dec(m, n) = sum_{s < R} AS[s][m] * T[s][n], AS[s] = row b_s of the natural C1, T from decode_row_value.
DEMO_HD MatmulJob decode_job(const ChunkDims& d, const float* AS, const float* T, int R, float* dec) {
    MatmulJob j;
    j.A = AS;
    j.lda = d.ldas;
    j.In = T;
    j.irs = d.ldt;
    j.ics = 1;
    j.K = R;
    j.J = d.n1;
    j.C = d.n2;
    j.out = dec;
    j.ors = d.lde;
    j.ocs = 1;
    return j;
}

// A TJ x TC register tile of a job: rows j0..j0+TJ-1 (A already offset by j0: `a` = A + j0), columns whose
// offsets c*ics are in `cofs`. The device loads the TJ values of A as TJ / 4 float4 (lda and j0 multiples of
// 4, A 16-byte aligned).
template <int TJ, int TC>
DEMO_HD void mm_tile(const float* a, int lda, const float* in, int irs, const int (&cofs)[TC], int K,
                     float (&acc)[TJ][TC]) {
#ifdef __CUDA_ARCH__
#pragma unroll 4
#endif
    for (int r = 0; r < K; r++) {
        float av[TJ];
#ifdef __CUDA_ARCH__
        if constexpr (TJ % 4 == 0) {
#pragma unroll
            for (int q = 0; q < TJ; q += 4) {
                const float4 v = *reinterpret_cast<const float4*>(a + r * lda + q);
                av[q] = v.x;
                av[q + 1] = v.y;
                av[q + 2] = v.z;
                av[q + 3] = v.w;
            }
        } else
#endif
        {
            for (int q = 0; q < TJ; q++) av[q] = a[r * lda + q];
        }
        const float* row = in + r * irs;
        float xv[TC];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
        for (int b = 0; b < TC; b++) xv[b] = row[cofs[b]];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
        for (int q = 0; q < TJ; q++) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
            for (int b = 0; b < TC; b++) acc[q][b] = fmaf(av[q], xv[b], acc[q][b]);
        }
    }
}

// One element of T (step 9): the selected coefficients e in [e0, e1) of one row (ascending index), value
// val[e] at column idx[e] % n2, times the natural basis C2 (n2 x n2).
DEMO_HD float decode_row_value(const uint32_t* idx, const float* val, int e0, int e1, const float* c2, int n2,
                               int n) {
    float acc = 0.0f;
    for (int e = e0; e < e1; e++) acc = fmaf(val[e], c2[(idx[e] % static_cast<uint32_t>(n2)) * n2 + n], acc);
    return acc;
}

// ---------------------------------------------------------------------------------------------------------
// Step 6: top-k. Keys order like |v| (fp32 bits without the sign; NaN above inf, as the CPU's select_topk).
DEMO_HD uint32_t magnitude_key(float v) { return llmc::km::float_to_bits(v) & 0x7fffffffu; }

// Binary search for the selection threshold. Invariant: count(key >= lo) = c_lo >= k > count(key >= hi) = c_hi.
// Each step needs one count of keys >= mid over the chunk (a block-wide reduction on the GPU). It stops when a
// threshold selects exactly k, or when lo and hi are adjacent (then key == lo are ties).
struct TopkSearch {
    uint32_t lo, hi, c_lo, c_hi;
};
DEMO_HD TopkSearch topk_search_init(uint32_t max_key, uint32_t n) { return TopkSearch{0u, max_key + 1u, n, 0u}; }
DEMO_HD bool topk_search_active(const TopkSearch& s, uint32_t k) { return s.c_lo != k && s.hi - s.lo > 1u; }
DEMO_HD uint32_t topk_search_mid(const TopkSearch& s) { return s.lo + (s.hi - s.lo) / 2u; }
DEMO_HD void topk_search_update(TopkSearch& s, uint32_t mid, uint32_t count, uint32_t k) {
    if (count >= k) {
        s.lo = mid;
        s.c_lo = count;
    } else {
        s.hi = mid;
        s.c_hi = count;
    }
}

// The selection rule the search ends with: every key >= above is selected ("greater"); when ties, the first
// `need` keys == tie_key in index order are selected too.
struct TopkRule {
    uint32_t above;
    uint32_t tie_key;
    uint32_t need;
    bool ties;
};
DEMO_HD TopkRule topk_rule(const TopkSearch& s, uint32_t k) {
    TopkRule r;
    if (s.c_lo == k) {
        r.above = s.lo;
        r.tie_key = 0;
        r.need = 0;
        r.ties = false;
    } else {  // hi == lo + 1: count(key > lo) = c_hi < k < count(key >= lo)
        r.above = s.hi;
        r.tie_key = s.lo;
        r.need = k - s.c_hi;
        r.ties = true;
    }
    return r;
}
DEMO_HD bool topk_greater(const TopkRule& r, uint32_t key) { return key >= r.above; }
DEMO_HD bool topk_tie(const TopkRule& r, uint32_t key) { return r.ties && key == r.tie_key; }

// Radix select: the GPU kernels' way to the same selection (at most 4 block-wide rounds instead of ~31). Keys
// are split into 8-bit digits, most significant first (shift 24, 16, 8, 0). A round histograms the digit of
// the keys that carry the prefix fixed so far; the digit holding the `need`-th largest of them is appended to
// the prefix. The search ends as soon as the keys >= prefix number exactly k (no ties), or after the last
// digit with the prefix as the tie key. The selected SET equals the binary search's (the top-k is unique
// with ties to the lower index), which test_demo_chunk_math checks and the host reference relies on.
struct RadixSelect {
    uint32_t prefix;  // digits fixed so far
    uint32_t need;    // keys still to select among those carrying the prefix
    int shift;        // the next round histograms (key >> shift) & 255
    bool done;
    TopkRule rule;    // valid once done
};
// n keys (all valid), k to select.
DEMO_HD RadixSelect radix_select_init(uint32_t n, uint32_t k) {
    RadixSelect s;
    s.prefix = 0;
    s.need = k;
    s.shift = 24;
    s.done = k >= n || k == 0;
    s.rule.above = k == 0 ? 0x80000000u : 0u;  // k == 0: no key (<= 0x7fffffff) qualifies; k >= n: every key
    s.rule.tie_key = 0;
    s.rule.need = 0;
    s.rule.ties = false;
    return s;
}
// Whether `key` takes part in the current round, and its digit there.
DEMO_HD bool radix_counts(const RadixSelect& s, uint32_t key) { return ((key >> s.shift) >> 8) == s.prefix; }
DEMO_HD uint32_t radix_digit(const RadixSelect& s, uint32_t key) { return (key >> s.shift) & 255u; }
// The bin holding the need-th largest key: the largest D with above(D) < need, above(D) = sum of hist[d] over
// d > D, for a histogram of `bins` counts; returns D and sets *above (the GPU picks the same D with a
// warp-wide suffix scan). A RadixSelect round picks its digit over 256 bins.
DEMO_HD uint32_t pick_bin(const uint32_t* hist, int bins, uint32_t need, uint32_t* above) {
    uint32_t acc = 0;
    for (int d = bins - 1; d > 0; d--) {
        if (acc + hist[d] >= need) {
            *above = acc;
            return uint32_t(d);
        }
        acc += hist[d];
    }
    *above = acc;
    return 0u;
}

// The kernels' fast path to the same rule: one histogram of the top 11 bits of every key (exponent and 3
// mantissa bits: bins 1/16 to 1/8 of a binade wide), the bin B holding the k-th largest key, then an exact
// selection among the few keys in B (the candidates). Keys above B are selected; when B holds more than
// kMaxTopkCandidates keys (heavy ties, zeros) the kernels fall back to RadixSelect.
inline constexpr int kCoarseBits = 11, kCoarseBins = 1 << kCoarseBits;
inline constexpr uint32_t kMaxTopkCandidates = 64;
DEMO_HD uint32_t coarse_bin(uint32_t key) { return key >> (31 - kCoarseBits); }
// The rule once the need-th largest candidate is known: key v, g candidates above it, t equal to it (itself
// included); `need` = k minus the keys in bins above B.
DEMO_HD TopkRule topk_rule_at(uint32_t v, uint32_t g, uint32_t t, uint32_t need) {
    TopkRule r;
    if (g + t == need) {  // keys >= v number exactly k
        r.above = v;
        r.tie_key = 0;
        r.need = 0;
        r.ties = false;
    } else {
        r.above = v + 1u;
        r.tie_key = v;
        r.need = need - g;
        r.ties = true;
    }
    return r;
}
// Candidate j is the need-th largest (with multiplicity) when g_j < need <= g_j + t_j, g_j / t_j its counts of
// candidates above / equal; every candidate with that key qualifies.
DEMO_HD bool is_rank_holder(uint32_t g, uint32_t t, uint32_t need) { return g < need && need <= g + t; }

// Ends a round: digit D was picked with `above` keys above it and `in_digit` keys on it.
DEMO_HD void radix_select_step(RadixSelect& s, uint32_t digit, uint32_t above, uint32_t in_digit) {
    s.need -= above;
    s.prefix = (s.prefix << 8) | digit;
    if (in_digit == s.need) {  // keys >= prefix << shift number exactly k
        s.done = true;
        s.rule.above = s.prefix << s.shift;
    } else if (s.shift == 0) {  // the prefix is a whole key: count(key > prefix) = k - need < k < count(key >= prefix)
        s.done = true;
        s.rule.above = s.prefix + 1u;
        s.rule.tie_key = s.prefix;
        s.rule.need = s.need;
        s.rule.ties = true;
    } else {
        s.shift -= 8;
    }
}

// ---------------------------------------------------------------------------------------------------------
// Step 7: value quantization, exactly as demo::quantize_chunk (codec.cpp).
DEMO_HD float sign_scale(const float* vals, int k) {
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += fabs(static_cast<double>(vals[j]));
    return static_cast<float>(sum / static_cast<double>(k));
}
DEMO_HD float dequantize(int values, float v, float scale) {
    if (values == kValuesBf16) return llmc::km::round_bf16(v);
    if (values == kValuesSign) return scale == 0.0f ? 0.0f : (v < 0.0f ? -scale : scale);
    return v;
}

// ---------------------------------------------------------------------------------------------------------
// Step 8: the wire. One tensor section of a bucket (byte offsets from the bucket start, codec.h layout).
// Item s = chunk * k + j of the tensor. Bit-packed parts are 32-bit little-endian words (every part starts
// 4-byte aligned): stream bit b is bit b % 32 of word b / 32. `or_word(uint8_t* word, bits)` ORs bits into the
// 4-byte word at `word`: a read-modify-write on the host, atomicOr on the device (neighbouring chunks share
// words). Aligned loads and stores: direct on the device, memcpy on the host (no aliasing questions).
DEMO_HD uint32_t load_u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint32_t*>(p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}
DEMO_HD uint16_t load_u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint16_t*>(p);
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}
DEMO_HD void store_u32(uint8_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint32_t*>(p) = v;
#else
    memcpy(p, &v, 4);
#endif
}
DEMO_HD void store_u16(uint8_t* p, uint16_t v) {
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint16_t*>(p) = v;
#else
    memcpy(p, &v, 2);
#endif
}

// or_word for single-threaded host code.
struct PlainOrWord {
    DEMO_HD void operator()(uint8_t* w, uint32_t bits) const { store_u32(w, load_u32(w) | bits); }
};

// fp32 / bf16 value of item s (dq: the dequantized value, for bf16 already a bf16 number).
DEMO_HD void put_value(uint8_t* values, int encoding, uint64_t s, float dq) {
    if (encoding == kValuesFp32) store_u32(values + 4 * s, llmc::km::float_to_bits(dq));
    else if (encoding == kValuesBf16) store_u16(values + 2 * s, static_cast<uint16_t>(llmc::km::float_to_bits(dq) >> 16));
}
template <typename OrWord>
DEMO_HD void put_sign_bit(uint8_t* values, uint64_t s, float dq, OrWord or_word) {
    if (dq < 0.0f) or_word(values + 4 * (s >> 5), 1u << (s & 31));
}
template <typename OrWord>
DEMO_HD void put_index(uint8_t* indices, int encoding, int index_bytes, uint64_t s, uint32_t idx, OrWord or_word) {
    if (encoding == kIndicesPacked12) {
        const uint64_t bit = 12 * s;
        uint8_t* w = indices + 4 * (bit >> 5);
        const uint32_t shift = static_cast<uint32_t>(bit & 31), v = idx & 0xfffu;
        or_word(w, v << shift);
        if (shift > 20) or_word(w + 4, v >> (32 - shift));
    } else if (index_bytes == 1) {
        indices[s] = static_cast<uint8_t>(idx);
    } else if (index_bytes == 2) {
        store_u16(indices + 2 * s, static_cast<uint16_t>(idx));
    } else {
        store_u32(indices + 4 * s, idx);
    }
}
DEMO_HD uint32_t get_index(const uint8_t* indices, int encoding, int index_bytes, uint64_t s) {
    if (encoding == kIndicesPacked12) {
        const uint64_t bit = 12 * s;
        const uint8_t* w = indices + 4 * (bit >> 5);
        const uint32_t shift = static_cast<uint32_t>(bit & 31);
        uint32_t v = load_u32(w) >> shift;
        if (shift > 20) v |= load_u32(w + 4) << (32 - shift);
        return v & 0xfffu;
    }
    if (index_bytes == 1) return indices[s];
    if (index_bytes == 2) return load_u16(indices + 2 * s);
    return load_u32(indices + 4 * s);
}
// The value a receiver decodes for item s (sign: `scale` is its chunk's scale).
DEMO_HD float get_value(const uint8_t* values, int encoding, uint64_t s, float scale) {
    if (encoding == kValuesFp32) return llmc::km::bits_to_float(load_u32(values + 4 * s));
    if (encoding == kValuesBf16) return llmc::km::bf16_bits_to_float(load_u16(values + 2 * s));
    const bool negative = (load_u32(values + 4 * (s >> 5)) >> (s & 31)) & 1u;
    return scale == 0.0f ? 0.0f : (negative ? -scale : scale);
}

// ---------------------------------------------------------------------------------------------------------
// What a kernel needs to know about one tensor (an array of these lives on the device).
struct ChunkTensor {
    uint64_t offset;        // first element in the flat parameter / momentum buffer
    uint64_t chunk_offset;  // global index of the tensor's first chunk
    uint64_t scales_off, values_off, indices_off;  // byte offsets of its bucket parts
    uint32_t cols, n1, n2, block_cols, k, index_bytes;
    uint32_t fold1, fold2;  // float offsets of the folded bases of n1, n2 in the folded table
    uint32_t nat1, nat2;    // float offsets of the natural bases (n x n, row-major C[k][n]) in the natural table
    uint32_t decays;        // weight decay applies to this tensor
    uint32_t pad_;
};

// Flat index of element (0, 0) of chunk c.
DEMO_HD uint64_t chunk_origin(const ChunkTensor& t, uint64_t c) {
    return t.offset + (c / t.block_cols) * t.n1 * uint64_t(t.cols) + (c % t.block_cols) * t.n2;
}

// The tensor holding global chunk g: the last tensor whose chunk_offset <= g (binary search).
DEMO_HD int tensor_of_chunk(const ChunkTensor* tensors, int count, uint64_t g) {
    int lo = 0, hi = count;  // tensors[lo].chunk_offset <= g < tensors[hi].chunk_offset
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tensors[mid].chunk_offset <= g) lo = mid;
        else hi = mid;
    }
    return lo;
}

// Scalars of one compress / apply launch.
struct CompressParams {
    float clip;        // gradient clipping scale (1: none)
    float decay;       // momentum decay
    float grad_scale;  // lr (lr-scaled momentum) or 1 - decay (EMA)
    float alpha;       // error feedback strength
    int values;        // kValues*
    int indices;       // kIndices*
    // The CUDA compress kernel only (demo_cuda.cuh): when set, `clip` on the device (llmc::global_norm_for_clip_async),
    // which the kernel reads instead, so the host does not wait to read the norm first. The host reference reads
    // `clip`.
    const float* clip_device = nullptr;
};
struct ApplyParams {
    float lr;
    float wd_factor;  // 1 - lr * weight_decay (double, rounded once)
    bool apply_wd;    // weight_decay != 0
    int values, indices;
    int world;
    uint64_t bucket_bytes;  // every rank's bucket has this size (checked on the host)
    // The CUDA apply kernel only (eager delayed updates, demo_cuda.cuh): the master weights are read, not
    // written, and the floatX copy gets the updated values. The host reference (apply_plan_host) has no floatX
    // copy and always updates `master`: a checker applies it to a copy of the master weights.
    bool keep_master = false;
    // --demo_delay 1 (demo_cuda.cuh): the decay after the update (sign_update), with wd_factor of this step's lr
    // while lr is the pending round's; and (CUDA only, eager updates) the floatX copy left unwritten.
    bool decay_after = false;
    bool keep_params = false;
};

// Apply-side error flags (a corrupt bucket); the first rank with an error is reported.
inline constexpr uint32_t kErrIndexRange = 1u, kErrNotAscending = 2u;

}  // namespace demo::cm

// =========================================================================================================
// Host side: tables for the kernels, validation with the CPU optimizer's messages, the state blob, and the
// sequential host reference of the kernels (what the tests and the GPU checkers compare against).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "demo/chunk_plan.h"
#include "demo/codec.h"
#include "demo/dct.h"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/gpt2_layout.h"
#include "llmc/optimizer.h"

namespace demo::cm {

// Same checks and messages as the CPU DemoOptimizer's constructor (test_demo_chunk_math compares them), each
// naming its key as `sources` does (by default: the flag; validate_config passes the parser's).
inline void validate_options(const llmc::OptimizerConfig& c, const llmc::ConfigSources& sources = {}) {
    const llmc::DemoConfig& d = c.demo;
    const auto check = [&](bool ok, const char* key, const char* range, const std::string& value) {
        LLMC_CHECK(ok, sources.name(key) + " must be " + range + " (got " + value + ")");
    };
    check(d.topk >= 1, "demo_topk", ">= 1", std::to_string(d.topk));
    check(d.chunk >= 1, "demo_chunk", ">= 1", std::to_string(d.chunk));
    // A chunk side n holds n x n DCT basis floats per distinct side (4 GB at n = 32768): far above any useful chunk
    check(d.chunk <= 4096, "demo_chunk", "<= 4096", std::to_string(d.chunk));
    check(d.decay >= 0.0f && d.decay < 1.0f, "demo_decay", "in [0, 1)", llmc::format_float(d.decay));
    check(d.feedback_alpha > 0.0f && d.feedback_alpha <= 1.0f, "demo_alpha", "in (0, 1]",
          llmc::format_float(d.feedback_alpha));
    check(c.weight_decay >= 0.0f, "weight_decay", ">= 0", llmc::format_float(c.weight_decay));
    check(d.delay == 0 || d.delay == 1, "demo_delay", "0 or 1", std::to_string(d.delay));
}

// The plan the CPU optimizer builds for a layout, and its per-tensor weight-decay flags.
inline ModelPlan plan_for_layout(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout,
                                 std::vector<uint8_t>* decays = nullptr) {
    std::vector<std::vector<size_t>> shapes;
    std::vector<size_t> offsets;
    if (decays) decays->clear();
    for (const llmc::ParamTensor& t : layout.tensors) {
        shapes.push_back(t.shape);
        offsets.push_back(t.offset);
        if (decays) decays->push_back(llmc::decays(t, config.decay_groups) ? 1 : 0);
    }
    ModelPlan plan = plan_model(shapes, static_cast<size_t>(config.demo.chunk),
                                static_cast<size_t>(config.demo.topk), offsets);
    LLMC_CHECK(plan.num_params == layout.num_params, "DeMo: the layout's tensors do not cover its parameters");
    return plan;
}

// Natural and folded bases of every size a plan uses, back to back (offsets in floats, multiples of 4).
struct BasisTables {
    std::vector<float> natural, folded;
    std::vector<uint32_t> nat_off, fold_off;  // by size n; UINT32_MAX where unused
};

inline std::vector<float> folded_basis(size_t n) {
    const std::vector<float> c = dct_basis(n);
    const int N = static_cast<int>(n), he = (N + 1) / 2, ho = N / 2, ld = ceil4(he);
    std::vector<float> f(static_cast<size_t>(folded_basis_floats(N)), 0.0f);
    for (int r = 0; r < he; r++)
        for (int j = 0; j < he; j++) f[size_t(r) * ld + j] = c[size_t(2 * j) * n + r];
    for (int r = 0; r < ho; r++)
        for (int j = 0; j < ho; j++) f[size_t(he + r) * ld + j] = c[size_t(2 * j + 1) * n + r];
    return f;
}

inline BasisTables build_basis_tables(const ModelPlan& plan) {
    BasisTables b;
    b.nat_off.assign(plan.max_n + 1, UINT32_MAX);
    b.fold_off.assign(plan.max_n + 1, UINT32_MAX);
    auto add = [&b](size_t n) {
        if (b.nat_off[n] != UINT32_MAX) return;
        const std::vector<float> nat = dct_basis(n), fold = folded_basis(n);
        b.nat_off[n] = static_cast<uint32_t>(b.natural.size());
        b.natural.insert(b.natural.end(), nat.begin(), nat.end());
        b.natural.resize(static_cast<size_t>(ceil4(static_cast<int>(b.natural.size()))), 0.0f);
        b.fold_off[n] = static_cast<uint32_t>(b.folded.size());
        b.folded.insert(b.folded.end(), fold.begin(), fold.end());
    };
    for (const TensorPlan& t : plan.tensors) {
        add(t.n1);
        add(t.n2);
    }
    return b;
}

// Byte offsets of one tensor's bucket parts (codec.h): [scales (sign only)] values indices.
struct SectionOffsets {
    size_t scales = 0, values = 0, indices = 0, end = 0;
};
inline std::vector<SectionOffsets> section_offsets(const ModelPlan& plan, WireFormat format) {
    std::vector<SectionOffsets> out(plan.tensors.size());
    size_t pos = kBucketHeaderBytes;
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        SectionOffsets& s = out[t];
        s.scales = pos;
        s.values = pos + (format.values == llmc::DemoValueEncoding::sign ? round_up4(tp.num_chunks * 4) : 0);
        s.indices = pos + value_part_bytes(tp, format.values);
        s.end = s.indices + index_part_bytes(tp, format.indices);
        pos = s.end;
    }
    return out;
}

// The 32 header bytes of every bucket of this plan and format (codec.h).
inline std::array<std::byte, kBucketHeaderBytes> bucket_header(const ModelPlan& plan, WireFormat format) {
    std::array<std::byte, kBucketHeaderBytes> h{};
    auto put = [&h](size_t off, auto v) { std::memcpy(h.data() + off, &v, sizeof(v)); };
    put(0, kBucketMagic);
    put(4, kBucketVersion);
    put(6, static_cast<uint8_t>(format.values));
    put(7, static_cast<uint8_t>(format.indices));
    put(8, static_cast<uint32_t>(plan.tensors.size()));
    put(12, uint32_t{0});
    put(16, static_cast<uint64_t>(plan.total_chunks));
    put(24, plan.fingerprint());
    return h;
}

// decode_bucket's header and size checks, with its messages, for a bucket the host only sees the first 32
// bytes of (the rest stays on the GPU).
inline void check_bucket_header(const ModelPlan& plan, WireFormat format, std::span<const std::byte> header,
                                size_t size, const std::string& who) {
    check_wire_format(plan, format);
    LLMC_CHECK(size >= kBucketHeaderBytes && header.size() >= kBucketHeaderBytes,
               who + ": " + std::to_string(size) + " bytes, shorter than the DeMo bucket header");
    auto load = [&header](size_t off, auto v) {
        std::memcpy(&v, header.data() + off, sizeof(v));
        return v;
    };
    LLMC_CHECK(load(0, uint32_t{}) == kBucketMagic, who + ": not a DeMo bucket (bad magic)");
    const uint16_t version = load(4, uint16_t{});
    LLMC_CHECK(version == kBucketVersion, who + ": DeMo bucket version " + std::to_string(version) +
                                              ", this build reads version " + std::to_string(kBucketVersion));
    const uint8_t vid = load(6, uint8_t{}), iid = load(7, uint8_t{});
    LLMC_CHECK(vid == static_cast<uint8_t>(format.values),
               who + ": value encoding id " + std::to_string(vid) + " but this rank uses " +
                   value_encoding_name(format.values) + " (--demo_values differs between ranks)");
    LLMC_CHECK(iid == static_cast<uint8_t>(format.indices),
               who + ": index encoding id " + std::to_string(iid) + " but this rank uses " +
                   index_encoding_name(format.indices) + " (--demo_indices differs between ranks)");
    const uint32_t ntensors = load(8, uint32_t{});
    const uint64_t nchunks = load(16, uint64_t{});
    LLMC_CHECK(ntensors == plan.tensors.size() && nchunks == plan.total_chunks,
               who + ": " + std::to_string(ntensors) + " tensors / " + std::to_string(nchunks) +
                   " chunks, this rank's plan has " + std::to_string(plan.tensors.size()) + " / " +
                   std::to_string(plan.total_chunks) + " (model or --demo_chunk differs between ranks)");
    LLMC_CHECK(load(24, uint64_t{}) == plan.fingerprint(),
               who + ": chunk plan fingerprint differs from this rank's (model shape, --demo_chunk or "
                     "--demo_topk differs between ranks)");
    const size_t total = bucket_bytes(plan, format);
    LLMC_CHECK(size == total, who + ": " + std::to_string(size) + " bytes, expected " + std::to_string(total) +
                                  " for this rank's plan and encoding");
}

// The chunk size of the CUDA kernels' fixed launch group (launch_tables below).
inline constexpr uint32_t kFixedChunk = 64;

// Where the momentum of the chunks of the CUDA kernels' 64 x 64 launch group (launch_tables: n1 = n2 = 64 and
// no chunk larger than 64) lives: as the reference keeps it, or in the DCT domain, M = C1 m C2^T (the
// dct_momentum tunings of demo_kernels.cuh). Every other chunk is always spatial.
enum class MomentumDomain : uint32_t { spatial = 0, dct64 = 1 };

// Those chunks of `m` from one domain to the other, M = C1 m C2^T or m = C1^T M C2, by the CPU module's block DCT
// (demo::encode_blocks / decode_blocks, fp32 sgemm: within ~3e-7 of the chunk maximum of exact); nothing when
// from == to. Checkpoints, the tests and the kernel lab use it.
inline void convert_momentum(const ModelPlan& plan, std::span<float> m, MomentumDomain from, MomentumDomain to) {
    if (from == to || plan.max_n > kFixedChunk) return;
    DctBases bases;
    bases.ensure(kFixedChunk);
    BlockScratch scratch;
    std::vector<float> out;
    for (const TensorPlan& tp : plan.tensors) {
        if (tp.n1 != kFixedChunk || tp.n2 != kFixedChunk || tp.num_chunks == 0) continue;
        float* x = m.data() + tp.offset;
        out.resize(tp.numel());
        if (to == MomentumDomain::dct64) encode_blocks(x, out.data(), tp.rows, tp.cols, kFixedChunk, kFixedChunk, bases, scratch);
        else decode_blocks(x, out.data(), tp.rows, tp.cols, kFixedChunk, kFixedChunk, bases, scratch);
        std::copy(out.begin(), out.end(), x);
    }
}

// The DemoOptimizer state blob (demo_optimizer.cpp save_state / load_state, CudaDemo's), byte for byte. Version 2
// adds the momentum's domain (version 1 blobs, always spatial, are still read), so a CUDA run keeping it in the
// DCT domain saves it exactly and resumes bit for bit, while read_state hands every reader its own domain.
// Version 3 adds the pending round (a flag, then its lr and bucket when present).
inline constexpr uint32_t kStateVersion = 3;
inline void write_state(llmc::ByteWriter& out, const ModelPlan& plan, std::span<const float> momentum,
                        MomentumDomain domain = MomentumDomain::spatial, const PendingRound& pending = {}) {
    // one allocation for the blob (momentum: 0.5 GB on GPT-2 124M), not a doubling copy after copy
    out.reserve(out.bytes().size() + 256 + momentum.size_bytes() + pending.bucket.size());
    out.put_string("demo");
    out.put<uint32_t>(kStateVersion);
    out.put<uint64_t>(plan.tensors.size());
    out.put<uint64_t>(momentum.size());
    out.put<uint64_t>(plan.chunk);
    out.put<uint64_t>(plan.topk);
    out.put<uint64_t>(plan.fingerprint());
    out.put<uint32_t>(static_cast<uint32_t>(domain));
    out.put_array(momentum);
    out.put<uint8_t>(pending.present ? 1 : 0);
    if (pending.present) {
        out.put<float>(pending.lr);
        out.put_array(std::span<const std::byte>(pending.bucket));
    }
}
// Reads a blob into `momentum`, converted to `want` when it was saved in the other domain, and the pending
// round (none before version 3). A pending round is refused unless `delayed` (--demo_delay 1) and must hold a
// bucket of `bucket_bytes`. `momentum` is a std::vector<float> or an llmc::LargeVector<float>.
template <class FloatVector>
void read_state(llmc::ByteReader& in, const ModelPlan& plan, FloatVector& momentum, MomentumDomain want,
                PendingRound& pending, bool delayed, size_t bucket_bytes) {
    const std::string& src = in.source();
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "demo", src + ": optimizer state is for '" + name + "', not 'demo'");
    const uint32_t version = in.get<uint32_t>("DeMo state version");
    LLMC_CHECK(version >= 1 && version <= kStateVersion, src + ": DeMo state version " + std::to_string(version) +
                                                             ", this build reads versions 1 to " +
                                                             std::to_string(kStateVersion));
    const uint64_t tensors = in.get<uint64_t>("tensor count");
    const uint64_t numel = in.get<uint64_t>("parameter count");
    LLMC_CHECK(tensors == plan.tensors.size() && numel == plan.num_params,
               src + ": DeMo state is for " + std::to_string(tensors) + " tensors / " + std::to_string(numel) +
                   " parameters, this model has " + std::to_string(plan.tensors.size()) + " / " +
                   std::to_string(plan.num_params));
    const uint64_t chunk = in.get<uint64_t>("chunk");
    LLMC_CHECK(chunk == plan.chunk, src + ": DeMo state was saved with --demo_chunk " + std::to_string(chunk) +
                                        ", this run uses " + std::to_string(plan.chunk));
    const uint64_t topk = in.get<uint64_t>("topk");
    LLMC_CHECK(topk == plan.topk, src + ": DeMo state was saved with --demo_topk " + std::to_string(topk) +
                                      ", this run uses " + std::to_string(plan.topk));
    const uint64_t fingerprint = in.get<uint64_t>("plan fingerprint");
    LLMC_CHECK(fingerprint == plan.fingerprint(),
               src + ": DeMo state was saved for tensors of other shapes (chunk plan differs)");
    const uint32_t domain = version >= 2 ? in.get<uint32_t>("momentum domain") : 0u;
    LLMC_CHECK(domain <= 1u, src + ": DeMo state has momentum domain " + std::to_string(domain) + " (0 or 1 expected)");
    FloatVector m(plan.num_params);
    in.get_array(std::span<float>(m), "DeMo momentum");
    PendingRound p;
    if (version >= 3) {
        const uint8_t present = in.get<uint8_t>("pending round flag");
        LLMC_CHECK(present <= 1u, src + ": corrupt or truncated (pending round flag " + std::to_string(present) + ")");
        p.present = present == 1;
    }
    if (p.present) {
        LLMC_CHECK(delayed, src + ": DeMo state holds an update not yet applied (saved with --demo_delay 1); resume "
                                  "with --demo_delay 1");
        p.lr = in.get<float>("pending round lr");
        p.bucket.resize(bucket_bytes);
        in.get_array(std::span<std::byte>(p.bucket), "pending DeMo bucket");
    }
    convert_momentum(plan, m, static_cast<MomentumDomain>(domain), want);
    momentum = std::move(m);
    pending = std::move(p);
}
// The momentum alone (a blob with a pending round is refused).
template <class FloatVector>
void read_state(llmc::ByteReader& in, const ModelPlan& plan, FloatVector& momentum,
                MomentumDomain want = MomentumDomain::spatial) {
    PendingRound none;
    read_state(in, plan, momentum, want, none, false, 0);
}

// Everything the kernels (and the host reference) read about a plan.
struct PlanTables {
    ModelPlan plan;
    WireFormat format;
    std::vector<ChunkTensor> tensors;
    BasisTables bases;
    std::vector<SectionOffsets> sections;
    size_t bucket_bytes = 0;
    std::array<std::byte, kBucketHeaderBytes> header{};
};

inline PlanTables make_plan_tables(const ModelPlan& plan, WireFormat format, const std::vector<uint8_t>& decays) {
    LLMC_CHECK(decays.size() == plan.tensors.size(), "DeMo plan tables: one decay flag per tensor needed");
    check_wire_format(plan, format);
    PlanTables pt;
    pt.plan = plan;
    pt.format = format;
    pt.bases = build_basis_tables(plan);
    pt.sections = section_offsets(plan, format);
    pt.bucket_bytes = bucket_bytes(plan, format);
    pt.header = bucket_header(plan, format);
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        LLMC_CHECK(tp.cols <= UINT32_MAX && tp.chunk_elems <= (size_t{1} << 30),
                   "DeMo: tensor too large for the chunk kernels");
        ChunkTensor c{};
        c.offset = tp.offset;
        c.chunk_offset = tp.chunk_offset;
        c.scales_off = pt.sections[t].scales;
        c.values_off = pt.sections[t].values;
        c.indices_off = pt.sections[t].indices;
        c.cols = static_cast<uint32_t>(tp.cols);
        c.n1 = static_cast<uint32_t>(tp.n1);
        c.n2 = static_cast<uint32_t>(tp.n2);
        c.block_cols = static_cast<uint32_t>(tp.block_cols);
        c.k = static_cast<uint32_t>(tp.k);
        c.index_bytes = static_cast<uint32_t>(tp.index_bytes);
        c.fold1 = pt.bases.fold_off[tp.n1];
        c.fold2 = pt.bases.fold_off[tp.n2];
        c.nat1 = pt.bases.nat_off[tp.n1];
        c.nat2 = pt.bases.nat_off[tp.n2];
        c.decays = decays[t];
        pt.tensors.push_back(c);
    }
    return pt;
}

// The tables of a model's DeMo plan under `cfg` (plan_for_layout, then make_plan_tables).
inline PlanTables plan_tables(const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout) {
    std::vector<uint8_t> decays;
    const ModelPlan plan = plan_for_layout(cfg, layout, &decays);
    return make_plan_tables(plan, WireFormat{cfg.demo.values, cfg.demo.indices}, decays);
}

// A DeMo OptimizerConfig with the given wire and momentum options, weight decay 0.1 and clipping at 1: how the
// tests and GPU checkers write their cases.
inline llmc::OptimizerConfig demo_config(llmc::DemoValueEncoding values, llmc::DemoIndexEncoding indices,
                                         llmc::DemoMomentum momentum = llmc::DemoMomentum::lr_scaled,
                                         float alpha = 1.0f, int topk = 32, int chunk = 64, float weight_decay = 0.1f) {
    llmc::OptimizerConfig c;
    c.weight_decay = weight_decay;
    c.grad_clip = 1.0f;
    c.demo.values = values;
    c.demo.indices = indices;
    c.demo.momentum = momentum;
    c.demo.feedback_alpha = alpha;
    c.demo.topk = topk;
    c.demo.chunk = chunk;
    return c;
}

// The tensor table as the kernels get it, in two launch groups: tensors with 64 x 64 chunks first (when the
// plan's chunks are all at most 64 x 64 they get a kernel compiled with every chunk size a constant), then every
// other shape (the kernel for any shape). chunk_offset counts from the start of the tensor's group, so a
// group's launch has one block per chunk of its tensors. Offsets into the buckets and tables are unchanged.
struct LaunchTables {
    std::vector<ChunkTensor> tensors;  // the fixed group, then the general one
    int fixed_tensors = 0;
    uint64_t fixed_chunks = 0, general_chunks = 0;
};
inline LaunchTables launch_tables(const PlanTables& pt) {
    const bool fixed_kernel = pt.plan.max_n <= kFixedChunk;  // same condition as the 256-thread kernels
    LaunchTables lt;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t next = 0;
        for (size_t t = 0; t < pt.tensors.size(); t++) {
            const ChunkTensor& ct = pt.tensors[t];
            const bool fixed = fixed_kernel && ct.n1 == kFixedChunk && ct.n2 == kFixedChunk;
            if (fixed != (pass == 0) || pt.plan.tensors[t].num_chunks == 0) continue;
            ChunkTensor g = ct;
            g.chunk_offset = next;
            lt.tensors.push_back(g);
            next += pt.plan.tensors[t].num_chunks;
        }
        if (pass == 0) {
            lt.fixed_chunks = next;
            lt.fixed_tensors = static_cast<int>(lt.tensors.size());
        } else {
            lt.general_chunks = next;
        }
    }
    return lt;
}

inline int value_id(llmc::DemoValueEncoding e) { return static_cast<int>(e); }
inline int index_id(llmc::DemoIndexEncoding e) { return static_cast<int>(e); }

// ---- host reference: the canonical computation, one chunk at a time ------------------------------------
// Per-thread scratch, laid out as the kernels' shared memory is (same leading dimensions).
struct ChunkScratch {
    std::vector<float> x, fx, z, fz, e, t, as, dec, vals;
    std::vector<uint32_t> keys, idx;
    std::vector<int> seg_start, seg_row;
    std::vector<float> sum;
    std::vector<uint32_t> cnt;
};

// The jobs run as plain loops (any tiling gives the same values: every element's fmaf chain is the same).
inline void run_job_host(const MatmulJob& jb) {
    for (int j = 0; j < jb.J; j++)
        for (int c = 0; c < jb.C; c++) {
            float acc[1][1] = {{0.0f}};
            const int cofs[1] = {c * jb.ics};
            mm_tile<1, 1>(jb.A + j, jb.lda, jb.In, jb.irs, cofs, jb.K, acc);
            jb.out[j * jb.ors + c * jb.ocs] = acc[0][0];
        }
}

// Step 9 on an ascending list: dec (n1 x lde) = C1^T S C2.
inline void decode_list_host(const ChunkDims& d, const float* c1, const float* c2, const uint32_t* idx,
                             const float* val, int count, float* dec, ChunkScratch& s) {
    s.seg_start.clear();
    s.seg_row.clear();
    for (int e = 0; e < count; e++) {
        const int row = static_cast<int>(idx[e] / static_cast<uint32_t>(d.n2));
        if (e == 0 || row != s.seg_row.back()) {
            s.seg_start.push_back(e);
            s.seg_row.push_back(row);
        }
    }
    const int R = static_cast<int>(s.seg_row.size());
    s.seg_start.push_back(count);
    s.t.assign(size_t(std::max(R, 1)) * d.ldt, 0.0f);
    s.as.assign(size_t(std::max(R, 1)) * d.ldas, 0.0f);
    for (int r = 0; r < R; r++) {
        for (int n = 0; n < d.n2; n++)
            s.t[size_t(r) * d.ldt + n] = decode_row_value(idx, val, s.seg_start[r], s.seg_start[r + 1], c2, d.n2, n);
        for (int m = 0; m < d.n1; m++) s.as[size_t(r) * d.ldas + m] = c1[size_t(s.seg_row[r]) * d.n1 + m];
    }
    run_job_host(decode_job(d, s.as.data(), s.t.data(), R, dec));
}

// Steps 1-10 for chunk c of tensor `ct`: updates delta (the whole flat momentum buffer) and writes the items
// into `bucket` (the whole bucket; bit-packed parts must start zeroed).
inline void compress_chunk_host(const PlanTables& pt, const ChunkTensor& ct, uint64_t c, float* delta,
                                const float* grads, const CompressParams& cp, uint8_t* bucket, ChunkScratch& s) {
    const ChunkDims d = make_dims(static_cast<int>(ct.n1), static_cast<int>(ct.n2));
    const uint64_t origin = chunk_origin(ct, c);
    const float* fold1 = pt.bases.folded.data() + ct.fold1;
    const float* fold2 = pt.bases.folded.data() + ct.fold2;
    // 1-2: momentum, fold rows
    s.x.assign(size_t(d.elems), 0.0f);
    for (int b = 0; b < d.n1; b++)
        for (int n = 0; n < d.n2; n++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + n;
            s.x[size_t(b) * d.n2 + n] = momentum_update(delta[g], grads[g], cp.clip, cp.decay, cp.grad_scale);
        }
    s.fx.assign(size_t(d.n1) * d.ldx, 0.0f);
    for (int n = 0; n < d.n2; n++) {
        for (int r = 0; r < d.he1; r++) s.fx[size_t(r) * d.ldx + n] = fold_even(s.x.data() + n, d.n2, d.n1, r);
        for (int r = 0; r < d.ho1; r++)
            s.fx[size_t(d.he1 + r) * d.ldx + n] = fold_odd(s.x.data() + n, d.n2, d.n1, r);
    }
    // 3: pass 1
    s.z.assign(size_t(d.n1) * d.ldz, 0.0f);
    for (int p = 0; p < 2; p++) run_job_host(pass1_job(d, fold1, s.fx.data(), s.z.data(), p));
    // 4: fold columns
    s.fz.assign(size_t(d.n1) * d.ldf, 0.0f);
    for (int j = 0; j < d.n1; j++) {
        const float* zr = s.z.data() + size_t(j) * d.ldz;
        for (int r = 0; r < d.he2; r++) s.fz[size_t(j) * d.ldf + r] = fold_even(zr, 1, d.n2, r);
        for (int r = 0; r < d.ho2; r++) s.fz[size_t(j) * d.ldf + d.he2 + r] = fold_odd(zr, 1, d.n2, r);
    }
    // 5: pass 2
    s.e.assign(size_t(d.n1) * d.lde, 0.0f);
    for (int p = 0; p < 2; p++) run_job_host(pass2_job(d, fold2, s.fz.data(), s.e.data(), p));
    // 6: top-k
    const uint32_t n = static_cast<uint32_t>(d.elems), k = ct.k;
    s.keys.resize(n);
    uint32_t max_key = 0;
    for (uint32_t i = 0; i < n; i++) {
        s.keys[i] = magnitude_key(s.e[size_t(i / ct.n2) * d.lde + i % ct.n2]);
        max_key = std::max(max_key, s.keys[i]);
    }
    TopkSearch search = topk_search_init(max_key, n);
    while (topk_search_active(search, k)) {
        const uint32_t mid = topk_search_mid(search);
        uint32_t count = 0;
        for (uint32_t i = 0; i < n; i++) count += s.keys[i] >= mid ? 1u : 0u;
        topk_search_update(search, mid, count, k);
    }
    const TopkRule rule = topk_rule(search, k);
    s.idx.assign(k, 0);
    s.vals.assign(k, 0.0f);
    uint32_t greater_before = 0, ties_before = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t key = s.keys[i];
        int pos = -1;
        if (topk_greater(rule, key)) {
            pos = static_cast<int>(greater_before + std::min(ties_before, rule.need));
            greater_before++;
        } else if (topk_tie(rule, key)) {
            if (ties_before < rule.need) pos = static_cast<int>(greater_before + ties_before);
            ties_before++;
        }
        if (pos >= 0) {
            s.idx[size_t(pos)] = i;
            s.vals[size_t(pos)] = s.e[size_t(i / ct.n2) * d.lde + i % ct.n2];
        }
    }
    // 7: quantize
    const float scale = cp.values == kValuesSign ? sign_scale(s.vals.data(), static_cast<int>(k)) : 0.0f;
    for (uint32_t j = 0; j < k; j++) s.vals[j] = dequantize(cp.values, s.vals[j], scale);
    // 8: pack
    const PlainOrWord or_word;
    uint8_t* values = bucket + ct.values_off;
    uint8_t* indices = bucket + ct.indices_off;
    if (cp.values == kValuesSign) store_u32(bucket + ct.scales_off + 4 * c, llmc::km::float_to_bits(scale));
    for (uint32_t j = 0; j < k; j++) {
        const uint64_t item = c * k + j;
        if (cp.values == kValuesSign) put_sign_bit(values, item, s.vals[j], or_word);
        else put_value(values, cp.values, item, s.vals[j]);
        put_index(indices, cp.indices, static_cast<int>(ct.index_bytes), item, s.idx[j], or_word);
    }
    // 9-10: decode what was sent, error feedback
    s.dec.assign(size_t(d.n1) * d.lde, 0.0f);
    decode_list_host(d, pt.bases.natural.data() + ct.nat1, pt.bases.natural.data() + ct.nat2, s.idx.data(),
                     s.vals.data(), static_cast<int>(k), s.dec.data(), s);
    for (int b = 0; b < d.n1; b++)
        for (int nn = 0; nn < d.n2; nn++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + nn;
            delta[g] = feedback(s.x[size_t(b) * d.n2 + nn], s.dec[size_t(b) * d.lde + nn], cp.alpha);
        }
}

// Apply for chunk c of tensor `ct` on the fp32 master weights; `buckets` holds ap.world buckets of
// ap.bucket_bytes back to back. Returns kErr* flags (0: fine).
inline uint32_t apply_chunk_host(const PlanTables& pt, const ChunkTensor& ct, uint64_t c, const uint8_t* buckets,
                                 float* master, const ApplyParams& ap, ChunkScratch& s) {
    const ChunkDims d = make_dims(static_cast<int>(ct.n1), static_cast<int>(ct.n2));
    const uint32_t n = static_cast<uint32_t>(d.elems), k = ct.k;
    s.sum.assign(n, 0.0f);
    s.cnt.assign(n, 0);
    uint32_t err = 0;
    for (int r = 0; r < ap.world; r++) {  // rank order: a fixed summation order
        const uint8_t* b = buckets + uint64_t(r) * ap.bucket_bytes;
        const float scale =
            ap.values == kValuesSign ? llmc::km::bits_to_float(load_u32(b + ct.scales_off + 4 * c)) : 0.0f;
        uint32_t prev = 0;
        for (uint32_t j = 0; j < k; j++) {
            const uint64_t item = c * k + j;
            const uint32_t i = get_index(b + ct.indices_off, ap.indices, static_cast<int>(ct.index_bytes), item);
            const float v = get_value(b + ct.values_off, ap.values, item, scale);
            const uint32_t before = prev;  // the previous item's index as sent
            prev = i;
            if (i >= n) {
                err |= kErrIndexRange;
                continue;
            }
            if (j > 0 && i <= before) {  // duplicates would make the sum depend on the thread schedule
                err |= kErrNotAscending;
                continue;
            }
            s.sum[i] = s.cnt[i] == 0 ? v : add_rn(s.sum[i], v);
            s.cnt[i]++;
        }
    }
    s.idx.clear();
    s.vals.clear();
    for (uint32_t i = 0; i < n; i++)
        if (s.cnt[i]) {
            s.idx.push_back(i);
            s.vals.push_back(div_rn(s.sum[i], static_cast<float>(s.cnt[i])));
        }
    s.dec.assign(size_t(d.n1) * d.lde, 0.0f);
    decode_list_host(d, pt.bases.natural.data() + ct.nat1, pt.bases.natural.data() + ct.nat2, s.idx.data(),
                     s.vals.data(), static_cast<int>(s.idx.size()), s.dec.data(), s);
    const uint64_t origin = chunk_origin(ct, c);
    for (int b = 0; b < d.n1; b++)
        for (int nn = 0; nn < d.n2; nn++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + nn;
            master[g] = sign_update(master[g], s.dec[size_t(b) * d.lde + nn], ap.lr, ap.wd_factor,
                                    ap.apply_wd && ct.decays, ap.decay_after);
        }
    return err;
}

// Whole-plan drivers (chunks in parallel; each chunk's result does not depend on the thread count).
inline void compress_plan_host(const PlanTables& pt, float* delta, const float* grads, const CompressParams& cp,
                               std::vector<std::byte>& bucket) {
    bucket.assign(pt.bucket_bytes, std::byte{0});
    std::memcpy(bucket.data(), pt.header.data(), kBucketHeaderBytes);
    uint8_t* b = reinterpret_cast<uint8_t*>(bucket.data());
    // Chunks OR bits into words shared with their neighbours: a thread takes runs of 32 chunks of one tensor
    // (32 * k sign bits and 32 * 12 * k index bits are whole words), so two threads never share a word.
    std::vector<std::pair<size_t, uint64_t>> runs;
    for (size_t t = 0; t < pt.tensors.size(); t++)
        for (uint64_t c = 0; c < pt.plan.tensors[t].num_chunks; c += 32) runs.emplace_back(t, c);
#pragma omp parallel
    {
        ChunkScratch s;
#pragma omp for schedule(dynamic, 1)
        for (size_t r = 0; r < runs.size(); r++) {
            const ChunkTensor& ct = pt.tensors[runs[r].first];
            const uint64_t end = std::min<uint64_t>(pt.plan.tensors[runs[r].first].num_chunks, runs[r].second + 32);
            for (uint64_t c = runs[r].second; c < end; c++) compress_chunk_host(pt, ct, c, delta, grads, cp, b, s);
        }
    }
}

inline uint32_t apply_plan_host(const PlanTables& pt, const std::byte* buckets, float* master, const ApplyParams& ap) {
    const int64_t total = static_cast<int64_t>(pt.plan.total_chunks);
    const int ntensors = static_cast<int>(pt.tensors.size());
    uint32_t err = 0;
#pragma omp parallel reduction(| : err)
    {
        ChunkScratch s;
#pragma omp for schedule(dynamic, 8)
        for (int64_t g = 0; g < total; g++) {
            const ChunkTensor& ct = pt.tensors[size_t(tensor_of_chunk(pt.tensors.data(), ntensors, uint64_t(g)))];
            err |= apply_chunk_host(pt, ct, uint64_t(g) - ct.chunk_offset, reinterpret_cast<const uint8_t*>(buckets),
                                    master, ap, s);
        }
    }
    return err;
}

// The launch scalars the CPU optimizer would use for this config and lr (factors formed in double, as there).
inline CompressParams compress_params(const llmc::OptimizerConfig& cfg, float lr, float clip) {
    CompressParams p;
    p.clip = clip;
    p.decay = cfg.demo.decay;
    p.grad_scale = cfg.demo.momentum == llmc::DemoMomentum::ema
                       ? static_cast<float>(1.0 - static_cast<double>(cfg.demo.decay))
                       : lr;
    p.alpha = cfg.demo.feedback_alpha;
    p.values = value_id(cfg.demo.values);
    p.indices = index_id(cfg.demo.indices);
    return p;
}
inline ApplyParams apply_params(const llmc::OptimizerConfig& cfg, float lr, int world, size_t bucket_bytes) {
    ApplyParams p;
    p.lr = lr;
    p.wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay);
    p.apply_wd = cfg.weight_decay != 0.0f;
    p.values = value_id(cfg.demo.values);
    p.indices = index_id(cfg.demo.indices);
    p.world = world;
    p.bucket_bytes = bucket_bytes;
    return p;
}

// ---- agreement with the CPU DemoOptimizer (tests and GPU checkers) -------------------------------------
// The canonical computation and the CPU optimizer sum in different orders, so they agree to float rounding:
//  - the selected index SETS are equal except in chunks where the k-th and (k+1)-th largest |E| are within
//    rounding of each other (near ties, checked with an fp64 recomputation of E);
//  - values agree to a small tolerance relative to the chunk's largest |E| (bf16 may differ by one bf16 ulp
//    where the fp32 value sits on a rounding boundary; sign bits are equal);
//  - momentum agrees to a tolerance relative to the chunk's largest momentum (chunks with other sets excluded);
//  - after apply, parameters are bit-equal except where the decoded update is within rounding of 0 (its sign
//    differs), checked against an fp64 decode.
struct CompressAgreement {
    size_t chunks = 0, set_mismatch = 0, set_mismatch_not_tie = 0;
    size_t items = 0, bf16_ulp_diffs = 0, sign_bit_diffs = 0;
    double max_value_err = 0.0;     // |mine - cpu| / max |value| of the chunk
    double max_scale_err = 0.0;     // sign: relative
    double max_momentum_err = 0.0;  // |mine - cpu| / max |momentum input x| of the chunk, beyond what bf16 1-ulp
                                    // value differences explain
    bool header_equal = false, reencode_equal = false;

    bool ok(double value_tol, double momentum_tol) const {
        return header_equal && reencode_equal && set_mismatch_not_tie == 0 && sign_bit_diffs == 0 &&
               max_value_err <= value_tol && max_scale_err <= value_tol && max_momentum_err <= momentum_tol &&
               bf16_ulp_diffs <= items / 1000 + 2;
    }
    std::string describe() const {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%zu chunks: index sets differ in %zu (%zu not near ties); %zu items: max value err %.2e "
                      "(rel. to chunk max), bf16 1-ulp diffs %zu, sign-bit diffs %zu, max scale err %.2e; "
                      "max momentum err %.2e (rel. to chunk max); header %s, re-encode %s",
                      chunks, set_mismatch, set_mismatch_not_tie, items, max_value_err, bf16_ulp_diffs,
                      sign_bit_diffs, max_scale_err, max_momentum_err, header_equal ? "equal" : "DIFFERS",
                      reencode_equal ? "identical" : "DIFFERS");
        return buf;
    }
};

// E = C1 X C2^T of one chunk in fp64, X the momentum update of `delta_in` / `grads` (in double).
inline std::vector<double> encode_chunk_f64(const ChunkTensor& ct, uint64_t c, const float* delta_in,
                                            const float* grads, const CompressParams& cp) {
    const size_t n1 = ct.n1, n2 = ct.n2;
    const std::vector<double> c1 = dct_basis_f64(n1), c2 = dct_basis_f64(n2);
    const uint64_t origin = chunk_origin(ct, c);
    std::vector<double> x(n1 * n2), y(n1 * n2, 0.0), e(n1 * n2, 0.0);
    for (size_t b = 0; b < n1; b++)
        for (size_t n = 0; n < n2; n++) {
            const uint64_t g = origin + b * ct.cols + n;
            x[b * n2 + n] = double(cp.decay) * delta_in[g] + double(cp.grad_scale) * (double(grads[g]) * cp.clip);
        }
    for (size_t b = 0; b < n1; b++)
        for (size_t k = 0; k < n2; k++)
            for (size_t n = 0; n < n2; n++) y[b * n2 + k] += x[b * n2 + n] * c2[k * n2 + n];
    for (size_t j = 0; j < n1; j++)
        for (size_t b = 0; b < n1; b++)
            for (size_t k = 0; k < n2; k++) e[j * n2 + k] += c1[j * n1 + b] * y[b * n2 + k];
    return e;
}

// mine/cpu: buckets and momentum after compress from the same input momentum `delta_in` and gradient.
inline CompressAgreement compare_compress(const PlanTables& pt, std::span<const std::byte> mine,
                                          std::span<const std::byte> cpu, std::span<const float> momentum_mine,
                                          std::span<const float> momentum_cpu, std::span<const float> delta_in,
                                          std::span<const float> grads, const CompressParams& cp) {
    CompressAgreement a;
    a.chunks = pt.plan.total_chunks;
    a.header_equal = mine.size() >= kBucketHeaderBytes && cpu.size() >= kBucketHeaderBytes &&
                     std::memcmp(mine.data(), cpu.data(), kBucketHeaderBytes) == 0 &&
                     std::memcmp(mine.data(), pt.header.data(), kBucketHeaderBytes) == 0;
    Selection sm, sc;
    decode_bucket(pt.plan, pt.format, mine, sm, "canonical bucket");
    decode_bucket(pt.plan, pt.format, cpu, sc, "CPU bucket");
    std::vector<std::byte> again;
    encode_bucket(pt.plan, pt.format, sm, again);
    a.reencode_equal = again.size() == mine.size() && std::memcmp(again.data(), mine.data(), mine.size()) == 0;
    const bool bf16 = pt.format.values == llmc::DemoValueEncoding::bf16;
    const bool sign = pt.format.values == llmc::DemoValueEncoding::sign;
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const ChunkTensor& ct = pt.tensors[t];
        const TensorPlan& tp = pt.plan.tensors[t];
        for (uint64_t c = 0; c < tp.num_chunks; c++) {
            const size_t s0 = tp.select_offset + c * tp.k;
            bool same = true;
            for (size_t j = 0; j < tp.k; j++) same = same && sm.indices[s0 + j] == sc.indices[s0 + j];
            const uint64_t origin = chunk_origin(ct, c);
            if (!same) {
                a.set_mismatch++;
                // Near tie: every index in one set but not the other has |E| (fp64) within 1e-5 of the chunk
                // maximum from the k-th largest |E|.
                const std::vector<double> e = encode_chunk_f64(ct, c, delta_in.data(), grads.data(), cp);
                std::vector<double> mags(e.size());
                double emax = 0.0;
                for (size_t i = 0; i < e.size(); i++) emax = std::max(emax, mags[i] = std::fabs(e[i]));
                std::vector<double> sorted = mags;
                std::nth_element(sorted.begin(), sorted.begin() + long(tp.k - 1), sorted.end(), std::greater<>());
                const double kth = sorted[tp.k - 1];
                std::vector<uint32_t> im(sm.indices.begin() + long(s0), sm.indices.begin() + long(s0 + tp.k));
                std::vector<uint32_t> ic(sc.indices.begin() + long(s0), sc.indices.begin() + long(s0 + tp.k));
                std::vector<uint32_t> diff;
                std::set_symmetric_difference(im.begin(), im.end(), ic.begin(), ic.end(), std::back_inserter(diff));
                bool tie = true;
                for (uint32_t i : diff) tie = tie && std::fabs(mags[i] - kth) <= 1e-5 * emax + 1e-30;
                if (!tie) a.set_mismatch_not_tie++;
                continue;
            }
            double vmax = 0.0;
            for (size_t j = 0; j < tp.k; j++) vmax = std::max(vmax, std::fabs(double(sc.values[s0 + j])));
            // A bf16 value one ulp apart is subtracted from the momentum too: alpha * |dv| times the largest
            // entry of the 2-D basis (sqrt(2/n1) * sqrt(2/n2)) bounds what that moves any momentum element.
            double flip_allowance = 0.0;
            auto basis_peak = [](uint32_t n) { return n == 1 ? 1.0 : std::sqrt(2.0 / n); };
            const double basis_max = basis_peak(ct.n1) * basis_peak(ct.n2);
            for (size_t j = 0; j < tp.k; j++) {
                a.items++;
                const float vm = sm.values[s0 + j], vc = sc.values[s0 + j];
                if (sign) {
                    a.sign_bit_diffs += (vm < 0.0f) != (vc < 0.0f) ? 1 : 0;
                    continue;
                }
                const double err = std::fabs(double(vm) - vc) / (vmax > 0 ? vmax : 1.0);
                if (bf16 && vm != vc) {
                    // one bf16 ulp apart: a rounding boundary between two fp32 values within tolerance
                    const uint32_t bm = llmc::km::float_to_bits(vm) >> 16, bc = llmc::km::float_to_bits(vc) >> 16;
                    if (bm + 1 == bc || bc + 1 == bm) {
                        a.bf16_ulp_diffs++;
                        flip_allowance += double(cp.alpha) * std::fabs(double(vm) - vc) * basis_max;
                        continue;
                    }
                }
                a.max_value_err = std::max(a.max_value_err, err);
            }
            if (sign) {
                const double scm = sm.scales[tp.chunk_offset + c], scc = sc.scales[tp.chunk_offset + c];
                a.max_scale_err = std::max(a.max_scale_err, std::fabs(scm - scc) / (std::fabs(scc) > 0 ? std::fabs(scc) : 1.0));
            }
            // momentum of the chunk, relative to the largest |x| (momentum before feedback, fp64)
            double xmax = 0.0, err = 0.0;
            for (uint32_t b = 0; b < ct.n1; b++)
                for (uint32_t n = 0; n < ct.n2; n++) {
                    const uint64_t g = origin + uint64_t(b) * ct.cols + n;
                    const double x = double(cp.decay) * delta_in[g] + double(cp.grad_scale) * (double(grads[g]) * cp.clip);
                    xmax = std::max(xmax, std::fabs(x));
                    err = std::max(err, std::fabs(double(momentum_mine[g]) - momentum_cpu[g]));
                }
            a.max_momentum_err = std::max(a.max_momentum_err, std::max(0.0, err - flip_allowance) / (xmax > 0 ? xmax : 1.0));
        }
    }
    return a;
}

struct ApplyAgreement {
    size_t elements = 0, differ = 0, differ_not_near_zero = 0;
    bool ok() const { return differ_not_near_zero == 0 && differ <= elements / 1000 + 2; }
    std::string describe() const {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%zu parameters: %zu differ (sign of a decoded value within rounding of 0: %zu; not: %zu)",
                      elements, differ, differ - differ_not_near_zero, differ_not_near_zero);
        return buf;
    }
};

// mine/cpu: master weights after apply of the same `world` buckets (back to back in `buckets`).
inline ApplyAgreement compare_apply(const PlanTables& pt, std::span<const std::byte> buckets, int world,
                                    std::span<const float> mine, std::span<const float> cpu) {
    ApplyAgreement a;
    a.elements = pt.plan.num_params;
    std::vector<Selection> sel(static_cast<size_t>(world));
    for (int r = 0; r < world; r++)
        decode_bucket(pt.plan, pt.format, buckets.subspan(size_t(r) * pt.bucket_bytes, pt.bucket_bytes), sel[size_t(r)],
                      "bucket " + std::to_string(r));
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const ChunkTensor& ct = pt.tensors[t];
        const TensorPlan& tp = pt.plan.tensors[t];
        for (uint64_t c = 0; c < tp.num_chunks; c++) {
            const uint64_t origin = chunk_origin(ct, c);
            std::vector<uint64_t> bad;
            for (uint32_t b = 0; b < ct.n1; b++)
                for (uint32_t n = 0; n < ct.n2; n++) {
                    const uint64_t g = origin + uint64_t(b) * ct.cols + n;
                    if (llmc::km::float_to_bits(mine[g]) != llmc::km::float_to_bits(cpu[g])) bad.push_back(uint64_t(b) * ct.n2 + n);
                }
            if (bad.empty()) continue;
            a.differ += bad.size();
            // fp64 decode of the scatter-mean of this chunk
            const size_t n1 = ct.n1, n2 = ct.n2, ne = n1 * n2;
            std::vector<double> sum(ne, 0.0), g(ne, 0.0), y(ne, 0.0), x(ne, 0.0);
            std::vector<int> cnt(ne, 0);
            for (int r = 0; r < world; r++)
                for (size_t j = 0; j < tp.k; j++) {
                    const size_t s = tp.select_offset + c * tp.k + j;
                    sum[sel[size_t(r)].indices[s]] += sel[size_t(r)].values[s];
                    cnt[sel[size_t(r)].indices[s]]++;
                }
            for (size_t i = 0; i < ne; i++) g[i] = cnt[i] ? sum[i] / cnt[i] : 0.0;
            const std::vector<double> c1 = dct_basis_f64(n1), c2 = dct_basis_f64(n2);
            for (size_t b = 0; b < n1; b++)
                for (size_t n = 0; n < n2; n++)
                    for (size_t d = 0; d < n2; d++) y[b * n2 + n] += g[b * n2 + d] * c2[d * n2 + n];
            double xmax = 0.0;
            for (size_t m = 0; m < n1; m++)
                for (size_t n = 0; n < n2; n++) {
                    for (size_t b = 0; b < n1; b++) x[m * n2 + n] += c1[b * n1 + m] * y[b * n2 + n];
                    xmax = std::max(xmax, std::fabs(x[m * n2 + n]));
                }
            for (uint64_t i : bad)
                if (!(std::fabs(x[i]) <= 1e-5 * xmax)) a.differ_not_near_zero++;
        }
    }
    return a;
}

}  // namespace demo::cm
