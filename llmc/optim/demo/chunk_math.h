// The per-chunk math of DeMo as the CUDA kernels (llmc/optim/demo/demo_kernels.cuh) compute it, written once as
// __host__ __device__ functions so the same code runs on the CPU in tests. g++ compiles this header without
// any CUDA header; nvcc compiles the same functions for the device.
//
// It defines the CANONICAL computation: a fixed sequence of fp32 operations per output value (explicit fmaf
// chains in ascending order, no compiler contraction: mul/add/sub/div go through *_rn helpers), so the GPU
// kernels and the host reference (test/support/demo_host_reference.h) produce bit-identical momentum, buckets and parameters (except for
// denormals, which the device flushes under --use_fast_math). The CPU DemoOptimizer (demo_optimizer.cpp)
// computes the same mathematics with other summation orders (OpenBLAS sgemm, sparse decode grouped by rows or
// columns, and GCC contracting a*b+c), so it agrees with the canonical values to float rounding only:
// test/unit/test_demo_chunk_math.cpp measures that agreement.
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
//    p = p * (1 - lr * wd) (decayed tensors only), p = p - lr * sign(dec)   (sign(0) = 0; --demo_sign false: lr * dec).
// The basis values are the CPU's (demo::dct_basis: computed in double, rounded once to fp32).
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmc/base/kernel_math.h"

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
// this step's compress decays the weights). With use_sign false (--demo_sign false) the step is lr * dec itself.
DEMO_HD float sign_update(float p, float dec, float lr, float wd_factor, bool decays, bool decay_after = false,
                          bool use_sign = true) {
    if (decays && !decay_after) p = mul_rn(p, wd_factor);
    p = sub_rn(p, mul_rn(lr, use_sign ? sign_of(dec) : dec));
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
    bool use_sign = true;  // --demo_sign: p -= lr * sign(dec), or (false) lr * dec
};

// Apply-side error flags (a corrupt bucket); the first rank with an error is reported.
inline constexpr uint32_t kErrIndexRange = 1u, kErrNotAscending = 2u;

// The chunk size of the CUDA kernels' fixed launch group (plan_tables.h: launch_tables).
inline constexpr uint32_t kFixedChunk = 64;

}  // namespace demo::cm
