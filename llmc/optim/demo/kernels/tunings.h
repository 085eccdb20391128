// The DeMo kernels' launch configuration (the shared-memory carve-up of a launch) and the table of tunings of the
// 64 x 64 kernels that the trainer picks from and the kernel lab times. Plain C++: the config schema's checks and
// the host code read it without CUDA.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "llmc/optim/demo/chunk_math.h"

namespace demo {

// ---------------------------------------------------------------------------------------------------------
// Launch configuration: the shared-memory carve-up (offsets in 4-byte words, multiples of 4 so every region
// is 16-byte aligned), the same for every block of a launch (maxima over the plan's tensors).
struct SmemLayout {
    uint32_t P = 0, Q = 0, B = 0, C = 0, Lidx = 0, Lval = 0, masks = 0, segs = 0, scratch = 0, total = 0;
    uint32_t lcap = 0;  // list capacity (items)
    size_t bytes() const { return size_t(total) * 4; }
};

inline constexpr int kMaxPairsPerThread = 8;   // compress: row pairs (2 elements) owned per thread
inline constexpr int kMaxElemsPerThread = 16;  // keys / apply elements per thread
inline constexpr uint32_t kScratchWords = 36 + 12 + 4;  // block scan (33), top-k results (12), a broadcast float

struct KernelConfig {
    int threads = 256;
    SmemLayout compress, apply;                  // the 64 x 64 launch group (cm::launch_tables)
    SmemLayout compress_compact;                 // its fp32 compress in the least memory (compact_smem tunings)
    SmemLayout compress_general, apply_general;  // every other chunk shape
    int world = 1;
    bool vec4_io = true;  // every 64 x 64 tensor's offset and row length are multiples of 4 floats (lean_io)
    size_t max_bytes() const {
        return std::max({compress.bytes(), compress_compact.bytes(), apply.bytes(), compress_general.bytes(),
                         apply_general.bytes()});
    }
};

// Tunings of the 64 x 64 kernels. The trainer launches kDefaultTuning's compress (or kTensorLeanTuning,
// kDctMomentumTuning, kDctMomentumTensorTuning: --demo_dct, --demo_momentum_domain) and kLeanApplyTuning's apply;
// the kernel lab (dev/cuda/demo_compress.cu and demo_apply.cu) times every one, so one GPU run decides between
// them. The fp32 tunings give the same bits; the tensor-core and DCT-domain ones agree to rounding. The
// compress-only fields (refetch, warp_lookup, register_topk, prefetch_own) leave the apply kernel as the tuning
// without them (apply_tuning). The table keeps the kernels the trainer runs, their fallbacks, references and
// bit-for-bit twins, and the candidates; docs/benchmarks.md has the timings of the ones retired on 2026-11-27
// (each slower than a kept one in every format on an H100) under their old numbers.
struct KernelTuning {
    int min_blocks;        // __launch_bounds__ minimum blocks per SM: 4 caps registers at 64, 3 at 85
    int tile_j, tile_c;    // run_jobs register tile
    bool coarse_topk;      // compress: block_select_topk's histogram fast path (false: RadixSelect only)
    bool tensor_dct;       // compress and apply: the dense products on the tensor cores (3xTF32, see below)
    bool lean_io;          // compress: 16-byte loads and stores of the momentum and gradient from 4 per-thread
                           // offsets (lean_prologue / lean_feedback); apply: of the master weights and the floatX
                           // copy (lean_apply_update), and first senders found by their `touched` bit instead of
                           // zeroed sums and counts. Needs KernelConfig::vec4_io and aligned buffers.
    bool refetch;          // compress, with lean_io: the updated momentum goes to global memory at once and is read
                           // back (from L2) for the error feedback, instead of 16 registers held across the kernel
    bool compact_smem;     // compress, fp32: KernelConfig::compress_compact (no tensor-core padding, one copy of
                           // the folded basis: n1 = n2) and 5 blocks per SM (48 registers): 5 x 44.5 KB fit an
                           // H100's 228 KB at top-k <= 32, 40 warps per SM instead of 32
    bool dct_momentum;     // compress, with lean_io and refetch: the 64 x 64 chunks' momentum is kept in the DCT
                           // domain (M = C1 m C2^T, see "DCT-domain momentum" below): M = decay M + s DCT(g), top-k
                           // of |M|, then M[sent] -= alpha v; no decode and no dense error feedback. Same math as the
                           // reference up to rounding; the caller keeps M (cm::MomentumDomain::dct64). M is read
                           // after the DCT passes (holding it in registers across them was 1-2% slower)
    bool warp_lookup;      // compress: each warp finds the chunk's tensor with a ballot over the table (independent
                           // loads) instead of tensor_of_chunk's binary search (dependent loads)
    bool register_topk;    // compress, with lean_io and coarse_topk: register_topk (below) on the thread's 16
                           // coefficients in lean I/O's mapping, 4 runs of 4 instead of block_select_topk's 16 slots
                           // in index order: with dct_momentum those the momentum update left in registers (and the
                           // coarse bins cleared before its barrier), else read from E
    bool prefetch_own;     // compress, with dct_momentum: the block asks L2 for its own chunk's momentum as it starts,
                           // so the read after the DCT passes finds it there (no registers held, unlike a load)
    int basis_table;       // compress, with tensor_dct: the split fragments of the basis built by each block from the
                           // folded basis (0), or copied from the precomputed table at the head of the folded table
                           // (1: kernel_tables). Reading that table by the DCT passes themselves (no copy; also in a
                           // compact layout at 5 blocks per SM) timed the same or slower and was retired.
};
inline constexpr KernelTuning kTunings[] = {
    // blocks, tile, coarse, tensor, lean, refetch, compact, dct momentum, warp lookup, register top-k, prefetch own,
    // basis table
    {4, 8, 2, true, false, false, false, false, false, false, false, false, 0},   // 0: fp32 products and I/O as first written
    {4, 8, 2, true, false, true, false, false, false, false, false, false, 0},    // 1: 0 + lean I/O (the trainer's apply)
    {4, 8, 2, false, false, false, false, false, false, false, false, false, 0},  // 2: 0 with RadixSelect only
    {4, 8, 2, true, true, false, false, false, false, false, false, false, 0},    // 3: 0 with tensor-core products
    {4, 8, 2, true, true, true, true, false, false, false, false, false, 0},      // 4: 3 + lean I/O, momentum refetched
    {4, 8, 2, false, false, true, true, true, false, false, false, false, 0},     // 5: 2 + lean I/O, refetch, compact layout
    {4, 8, 2, true, false, true, true, true, true, true, true, true, 0},          // 6: 5 with register top-k, DCT domain
    {4, 8, 2, true, true, true, true, false, true, true, true, true, 0},          // 7: 4 + register top-k, DCT domain
    {4, 8, 2, true, false, true, true, false, false, true, true, false, 0},       // 8: 1 + refetch, register top-k (default)
    {4, 8, 2, true, true, true, true, false, false, true, true, false, 0},        // 9: 4 + register top-k
    {4, 8, 2, false, true, true, true, false, true, false, false, true, 0},       // 10: 7 with RadixSelect (its twin)
    {4, 8, 2, false, false, true, true, true, true, true, false, true, 0},        // 11: 6 with RadixSelect (its twin)
    // 7 with the basis fragments precomputed (tensor_basis_table); H100, 2026-11-27 (ninth session): 1.001 / 0.893 /
    // 0.898 ms against 7's 1.011 / 0.903 / 0.902 (read from L1 by the passes instead: 1.000 / 0.896 / 0.896, and in
    // a compact layout at 5 blocks per SM 1.009 / 0.899 / 0.898; both retired)
    {4, 8, 2, true, true, true, true, false, true, true, true, true, 1},           // 12: 7, basis fragments copied
};
inline constexpr int kNumTunings = 13;
inline constexpr int kExactTuning = 0;   // the fp32 kernels as first written: the reference the others are checked
                                         // against (and the fallback of tunings 1 and 8)
inline constexpr int kRadixTuning = 2;   // RadixSelect alone, same bits as 0 (the fallback of tuning 5)
inline constexpr int kTensorTuning = 3;  // the tensor-core compress (the fallback of tunings 4 and 9)
// The trainer's compress for each --demo_dct x --demo_momentum_domain (demo_cuda.cuh's KernelChoice): the fastest
// tuning of each kind in the kernel lab (d12, k = 32 / 5 / 3 with fp32 / bf16 + 12-bit / sign values; H100,
// 2026-11-27, third session, docs/benchmarks.md): 8 (1.581 / 1.211 / 1.181 ms, against 1.586 / 1.284 / 1.255
// for 5 and 1.802 / 1.419 / 1.380 for 0), 9 (1.536 / 1.204 / 1.192; 4: 1.657 / 1.340 / 1.327), 6 (1.097 / 0.991
// / 0.987) and 7 (1.025 / 0.907 / 0.907: 1,463 GB/s at k = 32, 1,647 at k = 5); since the ninth session (also
// 2026-11-27) 12 instead of 7, the same bits 1.0% faster at k = 32 and k = 5 (1.001 / 0.893 / 0.898 ms: 1,498
// GB/s at k = 32, 45% of the H100's HBM).
inline constexpr int kDefaultTuning = 8;             // fp32 DCTs, spatial momentum: bit-identical to the host reference
inline constexpr int kTensorLeanTuning = 9;          // tensor-core DCTs, spatial momentum
inline constexpr int kDctMomentumTuning = 6;         // fp32 DCTs, momentum in the DCT domain
inline constexpr int kDctMomentumTensorTuning = 12;  // tensor-core DCTs, momentum in the DCT domain
inline constexpr KernelTuning kGeneralTuning = {1, 4, 4, true, false, false, false, false, false, false, false, false, 0};  // any shape
inline const char* tuning_name(int t) {
    static const char* const names[kNumTunings] = {
        "64 regs, 8x2 tiles, histogram top-k",
        "lean I/O",
        "RadixSelect top-k only",
        "3xTF32 tensor cores",
        "tensor cores, lean I/O, momentum refetched",
        "RadixSelect, lean I/O, refetch, compact, 5 blocks/SM",
        "register top-k, compact, 5 blocks/SM, DCT-domain momentum",
        "tensor cores, register top-k, DCT-domain momentum",
        "register top-k, lean I/O, refetch",
        "tensor cores, register top-k, lean I/O, refetch",
        "tensor cores, RadixSelect, DCT-domain momentum",
        "RadixSelect, compact, 5 blocks/SM, DCT-domain momentum",
        "tensor cores, register top-k, DCT-domain momentum, basis fragments copied"};
    return names[t];
}
// The compress kernel's __launch_bounds__ minimum blocks per SM (the apply kernel's is min_blocks).
DEMO_HD constexpr int compress_min_blocks(const KernelTuning& t) {
    return t.compact_smem ? 5 : t.min_blocks;
}
// The tuning a launch runs instead of t when its buffers cannot take lean I/O's 16-byte accesses (a dct_momentum
// tuning has none: its momentum means something else; launch_compress refuses such buffers).
inline constexpr int without_lean_io(int t) {
    return !kTunings[t].lean_io || kTunings[t].dct_momentum ? t : kTunings[t].tensor_dct ? kTensorTuning
                                  : kTunings[t].coarse_topk  ? kExactTuning
                                                             : kRadixTuning;
}
// The apply kernel of tuning t: the first tuning's with the same apply fields (apply reads none of the
// compress-only ones), so no apply kernel is compiled twice.
inline constexpr int apply_tuning(int t) {
    for (int u = 0; u < t; u++) {
        const KernelTuning &a = kTunings[t], &b = kTunings[u];
        if (a.min_blocks == b.min_blocks && a.tile_j == b.tile_j && a.tile_c == b.tile_c &&
            a.tensor_dct == b.tensor_dct && a.lean_io == b.lean_io)
            return u;
    }
    return t;
}
// Whether tuning t's compress (is_exact_tuning) or apply (is_exact_apply) gives the host reference's bits: the
// tensor cores sum in their own order, and the DCT-domain momentum rounds differently (both agree to rounding).
inline constexpr bool is_exact_tuning(int t) { return !kTunings[t].tensor_dct && !kTunings[t].dct_momentum; }
inline constexpr bool is_exact_apply(int t) { return !kTunings[t].tensor_dct; }
// The fp32 apply with lean I/O: the trainer's apply (the exact apply's bits; it runs as kExactTuning's when the
// buffers do not fit 16-byte accesses), except when --demo_kernel_tuning picks a tuning without lean I/O.
inline constexpr int kLeanApplyTuning = 1;
static_assert(is_exact_tuning(kDefaultTuning) && kTunings[kDefaultTuning].lean_io &&
              without_lean_io(kDefaultTuning) == kExactTuning && is_exact_tuning(kRadixTuning));
static_assert(kTunings[kTensorLeanTuning].tensor_dct && !kTunings[kTensorLeanTuning].dct_momentum &&
              without_lean_io(kTensorLeanTuning) == kTensorTuning);
static_assert(kTunings[kDctMomentumTuning].dct_momentum && !kTunings[kDctMomentumTuning].tensor_dct &&
              kTunings[kDctMomentumTensorTuning].dct_momentum && kTunings[kDctMomentumTensorTuning].tensor_dct);
static_assert(kTunings[kLeanApplyTuning].lean_io && !kTunings[kLeanApplyTuning].tensor_dct &&
              apply_tuning(kLeanApplyTuning) == kLeanApplyTuning);
// --optimizer topk (no transform: the IDENTITY instantiations of the kernels) runs the default tuning's compress,
// whose lean I/O and register top-k need no DCT (its momentum refetch does not apply: E is the momentum), with the
// lean apply; each falls back to kExactTuning's without lean I/O.
inline constexpr int kIdentityTuning = kDefaultTuning;
static_assert(!kTunings[kIdentityTuning].tensor_dct && !kTunings[kIdentityTuning].dct_momentum &&
              kTunings[kIdentityTuning].lean_io && kTunings[kIdentityTuning].register_topk);
inline constexpr bool dct_momentum_tunings_refetch() {
    for (const KernelTuning& t : kTunings)
        if (t.dct_momentum && !(t.lean_io && t.refetch)) return false;
    return true;
}
static_assert(dct_momentum_tunings_refetch(), "a DCT-domain momentum tuning reads M after the DCT passes (refetch)");


// Calls f(std::integral_constant<int, T>{}) for every tuning T (the kernel lab's loop over instantiations).
template <class F, int... T>
void for_each_tuning(F&& f, std::integer_sequence<int, T...>) {
    (f(std::integral_constant<int, T>{}), ...);
}
template <class F>
void for_each_tuning(F&& f) {
    for_each_tuning(f, std::make_integer_sequence<int, kNumTunings>{});
}

}  // namespace demo
