// The CUDA kernels of DeMo: one thread block per chunk, everything of a chunk in shared memory, the math from
// demo/demo_chunk_math.h (the same functions the host reference and test_demo_chunk_math run, so the fp32
// kernels' output is bit-identical to demo::cm::compress_plan_host / apply_plan_host apart from denormals, which
// --use_fast_math flushes to zero). test/emu_demo_kernels.cpp runs these kernels on the CPU
// (dev/cuda/block_emulator.h) against that reference in every `make test`; dev/cuda/demo_*.cu do it on a GPU.
//
//  - demo_compress_kernel: reads the chunk's momentum and fp32 gradient once (each thread keeps the updated
//    momentum of its elements in registers), momentum update (clip scale, lr-scaled or EMA), 2-D DCT-II as
//    two folded passes (the DCT-II symmetry halves the multiply-adds) over shared memory with the bases in
//    shared memory, top-k by |E| (ties to the lower index; block_select_topk: one shared-memory histogram of
//    the top 11 bits of |E|'s fp32 bits, then an exact ranking among the few keys of the k-th largest's bin;
//    cm::RadixSelect, at most 4 histogram rounds over 8-bit digits, when that bin is crowded by ties; the 64 x 64
//    tunings with register_topk apply the same rule to the coefficients each thread holds in registers),
//    placement of the selection in index order (warp ballots and one scan of per-warp counts), value
//    quantization (fp32 / bf16 RNE / sign with the per-chunk
//    mean |v| summed in double in index order), packing into the bucket at codec.h's offsets (bit-packed
//    parts with atomicOr into a zeroed bucket; the host writes the 32-byte header once), sparse decode of the
//    transmitted (dequantized) values and the error feedback, and ONE write of the momentum. Top-k,
//    quantization and packing are fused in this kernel: StepTimings::topk is reported as 0 and everything is
//    in StepTimings::transform.
//  - demo_apply_kernel: reads every rank's items of the chunk (W x k), scatter-mean per coefficient (ranks
//    summed in rank order), inverse DCT of the ascending list of sent coefficients, sign, decoupled weight
//    decay and p -= lr * sign on the fp32 master weights, and the floatX copy (nearest or stochastic
//    rounding as CudaAdamW). Out-of-range or non-ascending indices (a corrupt bucket) set an error flag the
//    host turns into an llmc::Error. With ApplyParams::keep_master the master weights are only read and the
//    floatX copy gets the update (eager delayed updates: one rank's own bucket, world 1, no weight decay);
//    with decay_after the decay follows the update (--demo_delay 1's order), with keep_params the floatX copy
//    is left alone (eager updates rewrite it from the own share).
// Both come in two instantiations per launch (cm::launch_tables): FIXED = 64 for the tensors with 64 x 64
// chunks (every GPT-2 matrix; all sizes compile-time constants) and FIXED = 0 for any other shape, each group
// with its own shared-memory layout. The 64 x 64 kernels also come in tunings (kTunings); those with tensor_dct
// run the dense products on the tensor cores (3xTF32, see "The tensor-core path" below; LLMC_DEMO_DCT=tensor
// picks them in the trainer), agreeing with the host reference to rounding instead of bit for bit.
//
// Work split of the dense products (cm::MatmulJob): a thread computes a 4 x 4 register tile, 4 consecutive
// output rows (A read as one float4, the same for the 16 lanes of a half warp) by 4 columns 16 apart (16
// consecutive lanes read consecutive columns: no bank conflicts); 8 x 2 tiles for 64 x 64 chunks (run_jobs).
// Chunks up to 64 x 64 use 256 threads,
// up to 128 x 128 1024 threads (every thread owns at most 8 row pairs / 16 elements of the chunk). A chunk and
// its scratch live in shared memory: 96 x 96 fits an H100 (227 KiB per block), 128 x 128 (~262 KiB) does not
// and is refused at setup by prepare_kernels with a message naming --demo_chunk.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>

#include "demo/demo_chunk_math.h"
#include "llmc/cuda_common.cuh"

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
// kDctMomentumTuning, kDctMomentumTensorTuning: LLMC_DEMO_DCT, LLMC_DEMO_MOMENTUM) and kLeanApplyTuning's apply;
// the kernel lab (dev/cuda/demo_compress.cu and demo_apply.cu) times every one, so one GPU run decides between
// them. The fp32 tunings give the same bits; the tensor-core and DCT-domain ones agree to rounding. The
// compress-only fields (refetch, warp_lookup, register_topk, prefetch_own) leave the apply kernel as the tuning
// without them (apply_tuning). The table keeps the kernels the trainer runs, their fallbacks, references and
// bit-for-bit twins, and the candidates; dev/bench/README.md has the timings of the ones retired on 2026-11-27
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
// The trainer's compress for each LLMC_DEMO_DCT x LLMC_DEMO_MOMENTUM (demo_cuda.cuh's KernelChoice): the fastest
// tuning of each kind in the kernel lab (d12, k = 32 / 5 / 3 with fp32 / bf16 + 12-bit / sign values; H100,
// 2026-11-27, third session, dev/bench/README.md): 8 (1.581 / 1.211 / 1.181 ms, against 1.586 / 1.284 / 1.255
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
__host__ __device__ inline constexpr int compress_min_blocks(const KernelTuning& t) {
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
// buffers do not fit 16-byte accesses), except when LLMC_DEMO_TUNING picks a tuning without lean I/O.
inline constexpr int kLeanApplyTuning = 1;
static_assert(is_exact_tuning(kDefaultTuning) && kTunings[kDefaultTuning].lean_io &&
              without_lean_io(kDefaultTuning) == kExactTuning && is_exact_tuning(kRadixTuning));
static_assert(kTunings[kTensorLeanTuning].tensor_dct && !kTunings[kTensorLeanTuning].dct_momentum &&
              without_lean_io(kTensorLeanTuning) == kTensorTuning);
static_assert(kTunings[kDctMomentumTuning].dct_momentum && !kTunings[kDctMomentumTuning].tensor_dct &&
              kTunings[kDctMomentumTensorTuning].dct_momentum && kTunings[kDctMomentumTensorTuning].tensor_dct);
static_assert(kTunings[kLeanApplyTuning].lean_io && !kTunings[kLeanApplyTuning].tensor_dct &&
              apply_tuning(kLeanApplyTuning) == kLeanApplyTuning);
inline constexpr bool dct_momentum_tunings_refetch() {
    for (const KernelTuning& t : kTunings)
        if (t.dct_momentum && !(t.lean_io && t.refetch)) return false;
    return true;
}
static_assert(dct_momentum_tunings_refetch(), "a DCT-domain momentum tuning reads M after the DCT passes (refetch)");

// ---------------------------------------------------------------------------------------------------------
// The tensor-core path of the 64 x 64 kernels (tunings with tensor_dct; apply uses it for its decode). The
// dense products of a chunk (the two folded DCT passes: 32 x 32 bases times 32 x 64 halves, and the decode
// C1^T S C2 over the R rows that hold a sent coefficient) run as mma.sync m16n8k8 TF32 with fp32
// accumulation, each operand split into a TF32 high part and the fp32 remainder and the product taken as
// hi*hi + hi*lo + lo*hi ("3xTF32"): close to fp32's accuracy (the dropped lo*lo term and lo's truncation
// are at most ~2^-20 of the product; measured on d12 shapes: values within 2e-6 of the chunk maximum of the
// host reference). The tensor cores sum in their own order, so this path is not bit-identical to
// cm::compress_plan_host: tests hold it to cm::compare_compress's tolerances (values and momentum within 2e-5
// of the chunk maximum, index sets equal except near ties), as the GPU is held to the CPU optimizer. The
// buffers keep the fp32 path's layout with wider rows, chosen so every fragment load hits 32 distinct
// banks (row strides of 8 or 4 mod 32 words).
__host__ __device__ inline cm::ChunkDims tensor_core_dims() {
    cm::ChunkDims d = cm::make_dims(cm::kFixedChunk, cm::kFixedChunk);
    d.ldx = 72;  // FX: pass 1 reads B fragments down rows (8 t + g distinct)
    d.ldz = 68;  // Z: pass 1's stores
    d.ldf = 68;  // FZ: pass 2 reads B fragments along rows (4 g + t distinct)
    d.ldt = 72;  // T and the gathered C1 rows: the decode's fragments
    d.ldas = 72;
    return d;
}
inline constexpr int kTensorBasisFloats = 2 * 2 * 4 * 32 * 8;  // parity x row block x k-step x lane x (4 hi + 4 lo)

// x = hi + lo: hi is x with its low 13 mantissa bits cleared (a TF32 value), lo = x - hi exactly (fp32). The
// tensor cores read lo's top 10 mantissa bits (they ignore the low 13), so lo * b is lo truncated to TF32 times
// b: a relative error of 2^-11 in a term that is itself 2^-11 of x. Two instructions per value; the first
// version rounded both parts with cvt.rna.tf32.f32 and issued each tile's three MMAs back to back: with this
// split and mma_3xtf32's order the kernel went from 1.99 to 1.63 ms (ncu, d12, H100).
__host__ __device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
    hi = llmc::km::float_to_bits(x) & 0xffffe000u;
    lo = llmc::km::float_to_bits(x - llmc::km::bits_to_float(hi));
}
// d += A B for one 16 x 8 x 8 tile: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (fragments as the PTX
// ISA lays them out; g = lane / 4, t = lane % 4: a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4];
// b = B[t][g], B[t+4][g]; d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]).
__device__ __forceinline__ void mma_tf32_16x8x8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::mma_tf32_m16n8k8(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// d[nt] += A B[nt] for NT tiles sharing A, both operands split: the small terms first, then hi * hi. Each round
// issues the NT independent tiles back to back, so a warp never waits on the accumulator it just wrote.
template <int NT>
__device__ __forceinline__ void mma_3xtf32(float (&d)[NT][4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                           const uint32_t (&b_hi)[NT][2], const uint32_t (&b_lo)[NT][2]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mma_tf32_16x8x8(d[nt], a_lo, b_hi[nt][0], b_hi[nt][1]);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mma_tf32_16x8x8(d[nt], a_hi, b_lo[nt][0], b_lo[nt][1]);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) mma_tf32_16x8x8(d[nt], a_hi, b_hi[nt][0], b_hi[nt][1]);
}

// Calls f(std::integral_constant<int, T>{}) for every tuning T (the kernel lab's loop over instantiations).
template <class F, int... T>
void for_each_tuning(F&& f, std::integer_sequence<int, T...>) {
    (f(std::integral_constant<int, T>{}), ...);
}
template <class F>
void for_each_tuning(F&& f) {
    for_each_tuning(f, std::make_integer_sequence<int, kNumTunings>{});
}

inline uint32_t words4(size_t v) { return static_cast<uint32_t>((v + 3) & ~size_t{3}); }

// The shared-memory layouts of one launch group: maxima over its tensors (`in_group` picks them); `compact`
// (non-null) for the 64 x 64 group, whose tensor-core tunings take wider rows (tensor_core_dims): it gets the fp32
// compress layout without them and with one copy of the folded basis (n1 = n2 = 64), for compact_smem tunings.
template <class InGroup>
void carve_layouts(const cm::PlanTables& pt, int world, size_t T, InGroup in_group, SmemLayout& compress,
                   SmemLayout& apply, SmemLayout* compact) {
    const bool fixed = compact != nullptr;
    size_t cP = 0, cQ = 0, cB = 0, cL = 0, aP = 0, aQ = 0, aB = 0, aC = 0, aL = 0, segs = 0;
    size_t kP = 0, kQ = 0, kB = 0;  // the compact layout's
    for (const cm::ChunkTensor& ct : pt.tensors) {
        if (!in_group(ct)) continue;
        LLMC_CHECK(uint64_t(ct.n1) * ct.cols < (uint64_t{1} << 32),
                   "DeMo: a row of chunks of " + std::to_string(ct.n1) + " x " + std::to_string(ct.cols) +
                       " elements is more than the CUDA kernels' 32-bit offsets hold");
        const cm::ChunkDims d = cm::make_dims(int(ct.n1), int(ct.n2));
        LLMC_CHECK(size_t(d.he1) * d.n2 <= kMaxPairsPerThread * T && size_t(d.elems) <= kMaxElemsPerThread * T,
                   "DeMo: chunk " + std::to_string(d.n1) + "x" + std::to_string(d.n2) + " too large for the kernels");
        const size_t R = std::min<size_t>(ct.k, ct.n1);
        cP = std::max({cP, size_t(d.n1) * d.ldx, size_t(d.n1) * d.ldf, R * d.ldt, size_t(cm::kCoarseBins)});
        cQ = std::max({cQ, size_t(d.n1) * d.ldz, size_t(d.n1) * d.lde});
        cB = std::max({cB, size_t(cm::folded_basis_floats(d.n1) + cm::folded_basis_floats(d.n2)), R * d.ldas});
        kP = std::max({kP, size_t(d.n1) * d.ldx, size_t(d.n1) * d.ldf, R * d.ldt, size_t(cm::kCoarseBins)});
        kQ = std::max({kQ, size_t(d.n1) * d.ldz, size_t(d.n1) * d.lde});
        kB = std::max({kB, size_t(cm::folded_basis_floats(d.n1)), R * d.ldas});
        cL = std::max<size_t>(cL, ct.k);
        // apply decodes the union of every rank's coefficients: at most min(n1, world k) distinct rows
        const size_t R_apply = std::min<size_t>(d.n1, size_t(world) * ct.k);
        aP = std::max(aP, R_apply * d.ldt);
        aQ = std::max({aQ, size_t(d.elems), size_t(d.n1) * d.lde});
        aB = std::max(aB, R_apply * d.ldas);
        aC = std::max(aC, size_t(d.elems));
        aL = std::max<size_t>(aL, std::max<size_t>(ct.k, std::min<size_t>(size_t(world) * ct.k, size_t(d.elems))));
        segs = std::max(segs, size_t(2 * d.n1 + 1));
        if (fixed) {
            // the tensor-core tunings' wider rows, the split basis fragments and the decode rows padded to 8
            const cm::ChunkDims t = tensor_core_dims();
            const size_t Rp = (R + 7) & ~size_t{7}, Rp_apply = (R_apply + 7) & ~size_t{7};
            cP = std::max({cP, size_t(t.n1) * t.ldx, size_t(t.n1) * t.ldf, Rp * t.ldt});
            cQ = std::max({cQ, size_t(t.n1) * t.ldz, size_t(t.n1) * t.lde});
            cB = std::max({cB, size_t(kTensorBasisFloats), Rp * t.ldas});
            aP = std::max(aP, Rp_apply * t.ldt);
            aB = std::max(aB, Rp_apply * t.ldas);
        }
    }
    auto carve = [&](SmemLayout& L, size_t P, size_t Q, size_t B, size_t C, size_t Lc, size_t masks) {
        uint32_t off = 0;
        auto take = [&off](uint32_t& slot, size_t words) {
            slot = off;
            off += words4(words);
        };
        take(L.P, P);
        take(L.Q, Q);
        take(L.B, B);
        take(L.C, C);
        take(L.Lidx, Lc);
        take(L.Lval, Lc);
        take(L.masks, masks);
        take(L.segs, segs);
        take(L.scratch, kScratchWords);
        L.total = off;
        L.lcap = static_cast<uint32_t>(Lc);
    };
    carve(compress, cP, cQ, cB, 0, cL, 2 * T);
    carve(apply, aP, aQ, aB, aC, aL, T);
    if (compact) carve(*compact, kP, kQ, kB, 0, cL, 2 * T);
}

// One layout per launch group: the general group's blocks (biases and LayerNorm weights of a GPT-2: 64-element
// chunks) take a few KB instead of the 64 x 64 group's ~55 KB, so more of them share an SM.
inline KernelConfig make_kernel_config(const cm::PlanTables& pt, int world) {
    const ModelPlan& plan = pt.plan;
    LLMC_CHECK(plan.max_n <= 128, "--demo_chunk " + std::to_string(plan.chunk) +
                                      ": the CUDA DeMo kernels handle chunks up to 128 x 128 (use --demo_chunk <= 128)");
    KernelConfig kc;
    kc.threads = plan.max_n <= cm::kFixedChunk ? 256 : 1024;  // cm::launch_tables relies on this split
    kc.world = world;
    const bool fixed_kernels = kc.threads == 256;
    auto is_fixed = [fixed_kernels](const cm::ChunkTensor& ct) {  // cm::launch_tables' rule
        return fixed_kernels && ct.n1 == cm::kFixedChunk && ct.n2 == cm::kFixedChunk;
    };
    carve_layouts(pt, world, size_t(kc.threads), is_fixed, kc.compress, kc.apply, &kc.compress_compact);
    carve_layouts(pt, world, size_t(kc.threads), [&](const cm::ChunkTensor& ct) { return !is_fixed(ct); },
                  kc.compress_general, kc.apply_general, nullptr);
    for (const cm::ChunkTensor& ct : pt.tensors)
        if (is_fixed(ct) && (ct.offset % 4 != 0 || ct.cols % 4 != 0)) kc.vec4_io = false;
    return kc;
}

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
template <int THREADS, int TJ = 4, int TC = 4>
__device__ __forceinline__ void run_jobs(const cm::MatmulJob& j0, const cm::MatmulJob& j1, int njobs) {
    static_assert(TJ % 4 == 0 && 64 % TC == 0, "tiles: rows in float4s, columns spread over a 64-column group");
    constexpr int kLanes = 64 / TC;  // lanes across one 64-column group
    auto tiles = [](const cm::MatmulJob& j) { return ((j.J + TJ - 1) / TJ) * ((j.C + 63) / 64) * kLanes; };
    const int count0 = tiles(j0);
    const int total = count0 + (njobs > 1 ? tiles(j1) : 0);
    for (int id = threadIdx.x; id < total; id += THREADS) {
        const bool second = id >= count0;
        const cm::MatmulJob jb = second ? j1 : j0;
        const int local = second ? id - count0 : id;
        const int lc = local % kLanes, rest = local / kLanes;
        const int ncg = (jb.C + 63) / 64;
        const int cg = rest % ncg, tr = rest / ncg;
        const int c_first = cg * 64 + lc;
        if (c_first >= jb.C) continue;
        int cofs[TC];
#pragma unroll
        for (int b = 0; b < TC; b++) cofs[b] = min(c_first + kLanes * b, jb.C - 1) * jb.ics;
        float acc[TJ][TC];
#pragma unroll
        for (int q = 0; q < TJ; q++)
#pragma unroll
            for (int b = 0; b < TC; b++) acc[q][b] = 0.0f;
        const int j_first = TJ * tr;
        cm::mm_tile<TJ, TC>(jb.A + j_first, jb.lda, jb.In, jb.irs, cofs, jb.K, acc);
#pragma unroll
        for (int q = 0; q < TJ; q++) {
            if (j_first + q >= jb.J) break;
#pragma unroll
            for (int b = 0; b < TC; b++) {
                const int c = c_first + kLanes * b;
                if (c < jb.C) jb.out[(j_first + q) * jb.ors + c * jb.ocs] = acc[q][b];
            }
        }
    }
}

// ---- the tensor-core products (256 threads = 8 warps, 64 x 64 chunks, tensor_core_dims) -------------------
// The folded basis of 64 (even block, then odd block, 32 x 32 each, fold[r * 32 + j] = A(j, r)) as the A
// fragments of the DCT passes, split hi / lo: float4 entries [(q * 2 + {0 hi, 1 lo}) * 32 + lane] for
// q = (parity * 2 + row block) * 4 + k-step. Both passes use it (n1 = n2 = 64).
// Entry e (< 16 * 32) of that table: the 4 values lane e % 32 holds of A fragment q = e / 32, split hi / lo. The
// table's one definition, for the kernels (build_tensor_basis) and the host (tensor_basis_table).
__host__ __device__ __forceinline__ void tensor_basis_entry(const float* __restrict__ fold, int e, uint32_t (&hi)[4],
                                                            uint32_t (&lo)[4]) {
    const int q = e >> 5, lane = e & 31, g = lane >> 2, t = lane & 3;
    const int p = q >> 3, mb = (q >> 2) & 1, ks = q & 3;
    const float* a = fold + p * 32 * 32;
    const int j = 16 * mb + g, r = 8 * ks + t;
    auto load = [](const float* x) {  // read-only cache on the device
#ifdef __CUDA_ARCH__
        return __ldg(x);
#else
        return *x;
#endif
    };
    const float v[4] = {load(a + r * 32 + j), load(a + r * 32 + j + 8), load(a + (r + 4) * 32 + j),
                        load(a + (r + 4) * 32 + j + 8)};
#pragma unroll
    for (int i = 0; i < 4; i++) split_tf32(v[i], hi[i], lo[i]);
}
// The table built into shared memory by the block. No barrier inside.
__device__ __forceinline__ void build_tensor_basis(const float* __restrict__ fold, float4* tbl) {
    for (int e = threadIdx.x; e < 16 * 32; e += blockDim.x) {
        uint32_t hi[4], lo[4];
        tensor_basis_entry(fold, e, hi, lo);
        const int q = e >> 5, lane = e & 31;
        tbl[(q * 2) * 32 + lane] = make_float4(llmc::km::bits_to_float(hi[0]), llmc::km::bits_to_float(hi[1]),
                                               llmc::km::bits_to_float(hi[2]), llmc::km::bits_to_float(hi[3]));
        tbl[(q * 2 + 1) * 32 + lane] = make_float4(llmc::km::bits_to_float(lo[0]), llmc::km::bits_to_float(lo[1]),
                                                   llmc::km::bits_to_float(lo[2]), llmc::km::bits_to_float(lo[3]));
    }
}

// build_tensor_basis's table computed once on the host (the same entries, so the same bits) for the folded basis
// of 64 (cm::folded_basis); kernel_tables puts it at the head of the device's folded table.
inline std::vector<float> tensor_basis_table() {
    const std::vector<float> fold = cm::folded_basis(64);
    std::vector<float> tbl(kTensorBasisFloats);
    for (int e = 0; e < 16 * 32; e++) {
        uint32_t hi[4], lo[4];
        tensor_basis_entry(fold.data(), e, hi, lo);
        const int q = e >> 5, lane = e & 31;
        for (int i = 0; i < 4; i++) {
            tbl[((q * 2) * 32 + lane) * 4 + i] = llmc::km::bits_to_float(hi[i]);
            tbl[((q * 2 + 1) * 32 + lane) * 4 + i] = llmc::km::bits_to_float(lo[i]);
        }
    }
    return tbl;
}
// The precomputed table (kTensorBasisFloats at `table`, 16-byte aligned) into shared memory. No barrier inside.
__device__ __forceinline__ void copy_tensor_basis(const float4* __restrict__ table, float4* tbl) {
    for (int e = threadIdx.x; e < kTensorBasisFloats / 4; e += blockDim.x) tbl[e] = __ldg(table + e);
}

// One folded DCT pass on the tensor cores: for parity p in {0, 1}, Out(j, c) = sum_{r < 32} A_p(j, r) In_p(r, c)
// (j < 32, c < 64) with In_p(r, c) = in[p * in_ps + r * in_rs + c * in_cs], written to
// out[p * out_ps + j * out_rs + c * out_cs]. Warp w: parity w / 4, rows 16 ((w / 2) % 2) + [0, 16), columns
// 32 (w % 2) + [0, 32) (4 tiles of 8). Same sums as cm::pass1_job / pass2_job up to rounding. No barrier inside.
__device__ __forceinline__ void tensor_dct_pass(const float4* tbl, const float* in, int in_ps, int in_rs, int in_cs,
                                                float* out, int out_ps, int out_rs, int out_cs) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p = warp >> 2, mb = (warp >> 1) & 1, nh = warp & 1;
    const float* src = in + p * in_ps + (32 * nh + g) * in_cs;
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const int q = (p * 2 + mb) * 4 + ks;
        const float4 h = tbl[(q * 2) * 32 + lane], l = tbl[(q * 2 + 1) * 32 + lane];
        const uint32_t a_hi[4] = {llmc::km::float_to_bits(h.x), llmc::km::float_to_bits(h.y),
                                  llmc::km::float_to_bits(h.z), llmc::km::float_to_bits(h.w)};
        const uint32_t a_lo[4] = {llmc::km::float_to_bits(l.x), llmc::km::float_to_bits(l.y),
                                  llmc::km::float_to_bits(l.z), llmc::km::float_to_bits(l.w)};
        const float* s0 = src + (8 * ks + t) * in_rs;
        const float* s1 = s0 + 4 * in_rs;
        uint32_t b_hi[4][2], b_lo[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            split_tf32(s0[8 * nt * in_cs], b_hi[nt][0], b_lo[nt][0]);
            split_tf32(s1[8 * nt * in_cs], b_hi[nt][1], b_lo[nt][1]);
        }
        mma_3xtf32(acc, a_hi, a_lo, b_hi, b_lo);
    }
    float* dst = out + p * out_ps + (16 * mb + g) * out_rs + (32 * nh + 2 * t) * out_cs;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        float* o = dst + 8 * nt * out_cs;
        o[0] = acc[nt][0];
        o[out_cs] = acc[nt][1];
        o[8 * out_rs] = acc[nt][2];
        o[8 * out_rs + out_cs] = acc[nt][3];
    }
}

// The decode product on the tensor cores: dec(m, n) = sum_{s < K} AS[s][m] T[s][n] (m, n < 64; K a multiple of 8,
// rows R..K-1 of AS and T zero), dec rows of d.lde. Warp w: rows 16 (w / 2) + [0, 16), columns 32 (w % 2) +
// [0, 32). No barrier inside.
__device__ __forceinline__ void tensor_decode_product(const cm::ChunkDims& d, const float* AS, const float* T, int K,
                                                      float* dec) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mb = warp >> 1, nh = warp & 1;
    float acc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 8) {
        const float* a0 = AS + (k0 + t) * d.ldas + 16 * mb + g;
        const float* a1 = a0 + 4 * d.ldas;
        uint32_t a_hi[4], a_lo[4];
        split_tf32(a0[0], a_hi[0], a_lo[0]);
        split_tf32(a0[8], a_hi[1], a_lo[1]);
        split_tf32(a1[0], a_hi[2], a_lo[2]);
        split_tf32(a1[8], a_hi[3], a_lo[3]);
        const float* b0 = T + (k0 + t) * d.ldt + 32 * nh + g;
        const float* b1 = b0 + 4 * d.ldt;
        uint32_t b_hi[4][2], b_lo[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            split_tf32(b0[8 * nt], b_hi[nt][0], b_lo[nt][0]);
            split_tf32(b1[8 * nt], b_hi[nt][1], b_lo[nt][1]);
        }
        mma_3xtf32(acc, a_hi, a_lo, b_hi, b_lo);
    }
    float* dst = dec + (16 * mb + g) * d.lde + 32 * nh + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        float* o = dst + 8 * nt;
        o[0] = acc[nt][0];
        o[1] = acc[nt][1];
        o[8 * d.lde] = acc[nt][2];
        o[8 * d.lde + 1] = acc[nt][3];
    }
}

// Step 9 on the ascending list (Lidx, Lval)[0, count): dec (n1 x lde, in `dec`) = C1^T S C2. Uses T (n2-wide
// rows) and AS (ldas-wide rows) scratch and segs (2 n1 + 1 ints). Starts and ends with all threads in step.
// TENSOR (64 x 64 chunks, 256 threads, tensor_core_dims): the product on the tensor cores, over the rows rounded
// up to a multiple of 8 (the extra rows of T and AS zeroed).
template <int THREADS, int TJ = 4, int TC = 4, bool TENSOR = false>
__device__ __forceinline__ void decode_list(const cm::ChunkDims& d, const float* __restrict__ c1,
                                            const float* __restrict__ c2, const uint32_t* Lidx, const float* Lval,
                                            int count, float* T, float* AS, float* dec, int* segs, uint32_t* scan) {
    int* seg_start = segs;
    int* seg_row = segs + d.n1 + 1;
    // row segments of the list (a list sorted by flat index is grouped by row, rows ascending)
    const int per = (count + THREADS - 1) / THREADS;
    const int e0 = min(count, int(threadIdx.x) * per), e1 = min(count, e0 + per);
    uint32_t starts = 0;
    for (int e = e0; e < e1; e++)
        starts += (e == 0 || Lidx[e] / uint32_t(d.n2) != Lidx[e - 1] / uint32_t(d.n2)) ? 1u : 0u;
    uint32_t R = 0;
    uint32_t slot = block_exclusive_scan<THREADS>(starts, scan, &R);
    for (int e = e0; e < e1; e++) {
        const int row = int(Lidx[e] / uint32_t(d.n2));
        if (e == 0 || row != int(Lidx[e - 1] / uint32_t(d.n2))) {
            seg_start[slot] = e;
            seg_row[slot] = row;
            slot++;
        }
    }
    if (threadIdx.x == 0) seg_start[R] = count;
    __syncthreads();
    const int rows = int(R), padded = TENSOR ? (rows + 7) & ~7 : rows;
    for (int q = threadIdx.x; q < padded * d.n2; q += THREADS) {
        const int s = q / d.n2, n = q - s * d.n2;
        T[s * d.ldt + n] = s < rows ? cm::decode_row_value(Lidx, Lval, seg_start[s], seg_start[s + 1], c2, d.n2, n) : 0.0f;
    }
    for (int q = threadIdx.x; q < padded * d.ldas; q += THREADS) {
        const int s = q / d.ldas, m = q - s * d.ldas;
        AS[q] = s < rows && m < d.n1 ? c1[seg_row[s] * d.n1 + m] : 0.0f;
    }
    __syncthreads();
    if constexpr (TENSOR) {
        static_assert(THREADS == 256, "the tensor-core decode takes 8 warps");
        tensor_decode_product(d, AS, T, padded, dec);
    } else {
        const cm::MatmulJob job = cm::decode_job(d, AS, T, rows, dec);
        run_jobs<THREADS, TJ, TC>(job, job, 1);
    }
    __syncthreads();
}

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
            p[j] = cm::sign_update(m[s][j], dec[b * lde + col + j], ap.lr, ap.wd_factor, decays, ap.decay_after);
        if (!ap.keep_master) store4(master + origin + off, p);
        if (!ap.keep_params) store_floatx4<STOCHASTIC>(params + origin + off, p, origin + off, seed);
    }
}

// FIXED = 64: every chunk of the launch is 64 x 64 and every size below is a compile-time constant (divisions
// become shifts, loops unroll); FIXED = 0: any chunk shape, sizes read from the tensor table. TUNE picks the
// 64 x 64 kernel's tuning (kTunings): tuning 0 holds it to 64 registers so 4 blocks share an SM (53 KB of
// shared memory each; ptxas spills ~14 floats to L1).
// The compress parameters with `clip` read from the device when the caller left it there
// (cm::CompressParams::clip_device): every thread reads the same 4 bytes.
__device__ __forceinline__ cm::CompressParams with_device_clip(cm::CompressParams p) {
    if (p.clip_device) p.clip = *p.clip_device;
    return p;
}

template <int THREADS, int FIXED, int TUNE = 0>
__global__ void __launch_bounds__(THREADS, FIXED ? compress_min_blocks(kTunings[TUNE]) : 1)
    demo_compress_kernel(const CompressArgs a) {
    static_assert(FIXED == 0 || FIXED * FIXED <= kMaxElemsPerThread * THREADS, "fixed chunk too large");
    constexpr KernelTuning kTune = FIXED ? kTunings[TUNE] : kGeneralTuning;
    constexpr int kTileJ = kTune.tile_j, kTileC = kTune.tile_c;
    constexpr bool kTensor = FIXED == int(cm::kFixedChunk) && kTune.tensor_dct;
    constexpr bool kLean = FIXED == int(cm::kFixedChunk) && kTune.lean_io;
    constexpr bool kRefetch = kLean && kTune.refetch;
    constexpr bool kDctMomentum = kLean && kTune.dct_momentum;
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
    if constexpr (kTensor) {
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
                    P[b * d.ldx + n] = cm::add_rn(x1, x2);
                    P[(d.he1 + b) * d.ldx + n] = cm::sub_rn(x1, x2);
                } else {
                    P[b * d.ldx + n] = x1;
                }
            }
        }
    }
    __syncthreads();

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
    if constexpr (kDctMomentum) {  // 9-10 in the DCT domain: the sent coefficients' feedback, the one write
        lean_dct_feedback<THREADS>(momentum, cols32, p.alpha, Q, d.lde, Lidx, Lval, k);
        return;
    }

    // 9: decode what was sent (T in P, gathered C1 rows in B, dec in Q)
    decode_list<THREADS, kTileJ, kTileC, kTensor>(d, a.natural + ct.nat1, a.natural + ct.nat2, Lidx, Lval, int(k), P, B,
                                                   Q, segs, scan);

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

// ---------------------------------------------------------------------------------------------------------
struct ApplyArgs {
    const cm::ChunkTensor* tensors;
    int num_tensors;
    const float* natural;
    const uint8_t* buckets;  // world buckets of p.bucket_bytes, back to back
    float* master;
    llmc::floatX* params;
    cm::ApplyParams p;
    uint32_t seed;
    bool stochastic;
    uint32_t* error;  // [0]: kErr* flags, [1]: lowest rank with an error
    SmemLayout L;
};

template <int THREADS, int FIXED, int TUNE = 0>  // FIXED and TUNE as demo_compress_kernel
__global__ void __launch_bounds__(THREADS, FIXED ? kTunings[TUNE].min_blocks : 1) demo_apply_kernel(const ApplyArgs a) {
    static_assert(FIXED == 0 || FIXED * FIXED <= kMaxElemsPerThread * THREADS, "fixed chunk too large");
    constexpr KernelTuning kTune = FIXED ? kTunings[TUNE] : kGeneralTuning;
    constexpr int kTileJ = kTune.tile_j, kTileC = kTune.tile_c;
    constexpr bool kTensor = FIXED == int(cm::kFixedChunk) && kTune.tensor_dct;
    static_assert(!kTensor || THREADS == 256, "the tensor-core path takes 8 warps");
    LLMC_DYNAMIC_SHARED(float4, smem4);
    float* sm = reinterpret_cast<float*>(smem4);
    const int tid = threadIdx.x;
    const uint64_t gchunk = blockIdx.x;
    const cm::ChunkTensor ct = a.tensors[cm::tensor_of_chunk(a.tensors, a.num_tensors, gchunk)];
    const uint64_t c = gchunk - ct.chunk_offset;
    const cm::ChunkDims d = kTensor ? tensor_core_dims()
                            : FIXED ? cm::make_dims(FIXED, FIXED)
                                    : cm::make_dims(int(ct.n1), int(ct.n2));
    const uint64_t origin = block_chunk_origin(ct, uint32_t(c));
    float* P = sm + a.L.P;
    float* Q = sm + a.L.Q;  // sums, then dec
    float* B = sm + a.L.B;
    uint32_t* cnt = reinterpret_cast<uint32_t*>(sm + a.L.C);
    uint32_t* Lidx = reinterpret_cast<uint32_t*>(sm + a.L.Lidx);
    float* Lval = sm + a.L.Lval;
    uint32_t* touched = reinterpret_cast<uint32_t*>(sm + a.L.masks);
    int* segs = reinterpret_cast<int*>(sm + a.L.segs);
    uint32_t* scan = reinterpret_cast<uint32_t*>(sm + a.L.scratch);
    const uint32_t n = uint32_t(d.elems), k = ct.k;

    // lean I/O: no clearing of the sums and counts; a coefficient's first sender is told by its `touched` bit
    constexpr bool kLeanApply = FIXED == int(cm::kFixedChunk) && kTune.lean_io;
    if constexpr (!kLeanApply) {
        for (uint32_t i = tid; i < n; i += THREADS) {
            Q[i] = 0.0f;
            cnt[i] = 0u;
        }
    }
    touched[tid] = 0u;
    __syncthreads();

    // scatter-mean: batches of ranks staged in the list, then summed rank by rank (a fixed order)
    const int world = a.p.world;
    const int batch = max(1, int(a.L.lcap / k));
    uint32_t err = 0;
    int err_rank = world;
    for (int r0 = 0; r0 < world; r0 += batch) {
        const int nb = min(batch, world - r0);
        for (uint32_t e = tid; e < uint32_t(nb) * k; e += THREADS) {
            const uint32_t rr = e / k, j = e - rr * k;
            const uint8_t* bucket = a.buckets + uint64_t(r0 + int(rr)) * a.p.bucket_bytes;
            const uint64_t item = c * k + j;
            const float scale =
                a.p.values == cm::kValuesSign ? llmc::km::bits_to_float(cm::load_u32(bucket + ct.scales_off + 4 * c)) : 0.0f;
            Lidx[e] = cm::get_index(bucket + ct.indices_off, a.p.indices, int(ct.index_bytes), item);
            Lval[e] = cm::get_value(bucket + ct.values_off, a.p.values, item, scale);
        }
        __syncthreads();
        for (int rr = 0; rr < nb; rr++) {
            for (uint32_t j = tid; j < k; j += THREADS) {
                const uint32_t e = uint32_t(rr) * k + j;
                const uint32_t i = Lidx[e];
                uint32_t bad = 0;
                if (i >= n) bad = cm::kErrIndexRange;
                else if (j > 0 && i <= Lidx[e - 1]) bad = cm::kErrNotAscending;
                if (bad) {
                    err |= bad;
                    err_rank = min(err_rank, r0 + rr);
                    continue;
                }
                const float v = Lval[e];
                if constexpr (kLeanApply) {  // Q[i] and cnt[i] hold garbage until i's first sender writes them
                    const uint32_t bit = 1u << (i & 31);
                    const bool first = (atomicOr(touched + (i >> 5), bit) & bit) == 0u;
                    Q[i] = first ? v : cm::add_rn(Q[i], v);
                    cnt[i] = first ? 1u : cnt[i] + 1u;
                } else {
                    const uint32_t c0 = cnt[i];
                    Q[i] = c0 == 0 ? v : cm::add_rn(Q[i], v);
                    cnt[i] = c0 + 1;
                    if (c0 == 0) atomicOr(touched + (i >> 5), 1u << (i & 31));
                }
            }
            __syncthreads();
        }
    }
    if (err) {
        atomicOr(a.error, err);
        atomicMin(a.error + 1, uint32_t(err_rank));
    }

    // the ascending list of coefficients anyone sent, with their means
    uint32_t count = 0;
    {
        const uint32_t w = touched[tid];
        uint32_t pos = block_exclusive_scan<THREADS>(__popc(w), scan, &count);
        uint32_t bits = w;
        while (bits) {
            const int bit = __ffs(bits) - 1;
            bits &= bits - 1;
            const uint32_t i = uint32_t(tid) * 32u + uint32_t(bit);
            Lidx[pos] = i;
            Lval[pos] = cm::div_rn(Q[i], static_cast<float>(cnt[i]));
            pos++;
        }
    }
    __syncthreads();
    decode_list<THREADS, kTileJ, kTileC, kTensor>(d, a.natural + ct.nat1, a.natural + ct.nat2, Lidx, Lval, int(count), P,
                                                   B, Q, segs, scan);

    // update the master weights and the floatX copy (p.keep_master: the floatX copy alone; p.keep_params: the
    // master weights alone)
    const bool decays = a.p.apply_wd && ct.decays;
    if constexpr (FIXED == int(cm::kFixedChunk) && kTune.lean_io) {
        static_assert(THREADS == 256, "lean I/O: 16 threads per 64-column row, 16 rows per 256 threads");
        if (a.stochastic) lean_apply_update<true>(a.master, a.params, origin, ct.cols, Q, d.lde, a.p, decays, a.seed);
        else lean_apply_update<false>(a.master, a.params, origin, ct.cols, Q, d.lde, a.p, decays, a.seed);
    } else {
#pragma unroll
        for (int r = 0; r < kMaxElemsPerThread; r++) {
            const int q = tid + r * THREADS;
            if (q < int(n)) {
                const int b = q / d.n2, nn = q - b * d.n2;
                const uint64_t gi = origin + (uint32_t(b) * ct.cols + uint32_t(nn));  // 32-bit offset (block_chunk_origin)
                const float p = cm::sign_update(a.master[gi], Q[b * d.lde + nn], a.p.lr, a.p.wd_factor, decays,
                                                a.p.decay_after);
                if (!a.p.keep_master) a.master[gi] = p;
                if (a.p.keep_params) continue;
                if (a.stochastic) llmc::store_stochastic(a.params + gi, p, gi, a.seed);
                else a.params[gi] = llmc::from_float<llmc::floatX>(p);
            }
        }
    }
}

// master -> floatX params (nearest, or stochastic with the given seed), for set_weights.
__global__ void demo_round_params_kernel(llmc::floatX* params, const float* master, size_t n, uint32_t seed,
                                         bool stochastic) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        if (stochastic) llmc::store_stochastic(params + i, master[i], i, seed);
        else params[i] = llmc::from_float<llmc::floatX>(master[i]);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Device copies of a plan's tables (pointers into memory the caller owns). `tensors` is cm::launch_tables'
// order: the fixed_tensors tensors of 64 x 64 chunks (fixed_chunks chunks), then the general ones.
struct DeviceTables {
    const cm::ChunkTensor* tensors = nullptr;
    int fixed_tensors = 0, general_tensors = 0;
    uint64_t fixed_chunks = 0, general_chunks = 0;
    const float* folded = nullptr;
    const float* natural = nullptr;
};
inline DeviceTables device_tables(const cm::LaunchTables& lt, const cm::ChunkTensor* tensors, const float* folded,
                                  const float* natural) {
    return DeviceTables{tensors, lt.fixed_tensors, static_cast<int>(lt.tensors.size()) - lt.fixed_tensors,
                        lt.fixed_chunks, lt.general_chunks, folded, natural};
}

// A plan's tables as the kernels read them: the launch tables (cm::launch_tables) and the folded bases with
// tensor_basis_table in front (the fold offsets shifted past it), so tunings with basis_table find it at offset 0.
struct KernelTables {
    cm::LaunchTables order;
    std::vector<float> folded;
};
inline KernelTables kernel_tables(const cm::PlanTables& pt) {
    KernelTables kt{cm::launch_tables(pt), tensor_basis_table()};
    static_assert(kTensorBasisFloats % 4 == 0, "the folded bases stay 16-byte aligned behind the table");
    kt.folded.insert(kt.folded.end(), pt.bases.folded.begin(), pt.bases.folded.end());
    for (cm::ChunkTensor& t : kt.order.tensors) {
        t.fold1 += kTensorBasisFloats;
        t.fold2 += kTensorBasisFloats;
    }
    return kt;
}

// Device copies of a plan's tables in their own buffers (checkers and tests; CudaDemo keeps them in its arena).
struct OwnedDeviceTables {
    KernelTables host;
    llmc::DeviceBuffer<cm::ChunkTensor> tensors;
    llmc::DeviceBuffer<float> folded, natural;
    DeviceTables view;
    explicit OwnedDeviceTables(const cm::PlanTables& pt)
        : host(kernel_tables(pt)), tensors(host.order.tensors.size(), "DeMo tensor table"),
          folded(host.folded.size(), "DeMo bases"), natural(pt.bases.natural.size(), "DeMo bases") {
        tensors.upload(host.order.tensors);
        folded.upload(host.folded);
        natural.upload(pt.bases.natural);
        view = device_tables(host.order, tensors.data(), folded.data(), natural.data());
    }
};

// Raises a kernel's dynamic shared memory limit on the current device to `bytes`. Limits only grow, so
// optimizers of different configurations can coexist.
inline void raise_smem_limit(const void* kernel, size_t bytes) {
    static std::map<std::pair<const void*, int>, size_t> raised;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    size_t& have = raised[{kernel, device}];
    if (bytes <= have) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    have = bytes;
}

// The shared-memory layout of tuning t's 64 x 64 compress launch.
inline const SmemLayout& fixed_compress_layout(const KernelConfig& kc, int t) {
    return kTunings[t].compact_smem ? kc.compress_compact : kc.compress;
}

// The 64 x 64 kernels of tuning TUNE (prepare_kernels does the fp32 and the tensor-core tunings).
template <int TUNE>
inline void prepare_tuning(const KernelConfig& kc) {
    if (kc.threads != 256) return;
    const void* compress = reinterpret_cast<const void*>(demo_compress_kernel<256, cm::kFixedChunk, TUNE>);
    raise_smem_limit(compress, fixed_compress_layout(kc, TUNE).bytes());
    if constexpr (kTunings[TUNE].compact_smem)  // 5 blocks x 45.5 KB need the largest shared-memory carveout
        CUDA_CHECK(cudaFuncSetAttribute(compress, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    raise_smem_limit(reinterpret_cast<const void*>(demo_apply_kernel<256, cm::kFixedChunk, apply_tuning(TUNE)>),
                     kc.apply.bytes());
}

// Sets the dynamic shared memory limits of the kernels for `kc` and checks the device can hold them.
inline void prepare_kernels(const KernelConfig& kc, const ModelPlan& plan) {
    int device = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t need = kc.max_bytes();
    LLMC_CHECK(need <= size_t(optin),
               "DeMo kernels need " + std::to_string(need) + " bytes of shared memory per block for --demo_chunk " +
                   std::to_string(plan.chunk) + " / --demo_topk " + std::to_string(plan.topk) + " with " +
                   std::to_string(kc.world) + " ranks; this GPU allows " + std::to_string(optin) +
                   " (lower --demo_chunk or --demo_topk)");
    if (kc.threads == 256) {
        raise_smem_limit(reinterpret_cast<const void*>(demo_compress_kernel<256, 0>), kc.compress_general.bytes());
        raise_smem_limit(reinterpret_cast<const void*>(demo_apply_kernel<256, 0>), kc.apply_general.bytes());
        prepare_tuning<kExactTuning>(kc);
        prepare_tuning<kRadixTuning>(kc);
        prepare_tuning<kTensorTuning>(kc);
    } else {
        raise_smem_limit(reinterpret_cast<const void*>(demo_compress_kernel<1024, 0>), kc.compress_general.bytes());
        raise_smem_limit(reinterpret_cast<const void*>(demo_apply_kernel<1024, 0>), kc.apply_general.bytes());
    }
}

// Whether a launch of these buffers can take the lean_io tunings' accesses of 4 elements (16 bytes of fp32, 8 of
// bf16): compress reads and writes momentum and gradient, apply the master weights and the floatX copy.
inline bool lean_io_fits(const KernelConfig& kc, const float* momentum, const float* grads) {
    return kc.vec4_io && reinterpret_cast<uintptr_t>(momentum) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(grads) % 16 == 0;
}
inline bool lean_apply_fits(const KernelConfig& kc, const float* master, const llmc::floatX* params) {
    return kc.vec4_io && reinterpret_cast<uintptr_t>(master) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(params) % (4 * sizeof(llmc::floatX)) == 0;
}

// Compress every chunk: momentum updated in place, items into `bucket` (its body must be zero). One launch per
// group of cm::launch_tables (the 64 x 64 one only exists with 256-thread kernels). TUNE: see kTunings; a lean_io
// tuning runs as its twin without lean I/O when the buffers do not fit it (lean_io_fits).
template <int TUNE = kExactTuning>
inline void launch_compress(const KernelConfig& kc, const DeviceTables& t, float* momentum, const float* grads,
                            uint8_t* bucket, const cm::CompressParams& p, cudaStream_t stream) {
    if constexpr (kTunings[TUNE].dct_momentum) {
        LLMC_CHECK(lean_io_fits(kc, momentum, grads), "DeMo compress tuning " + std::to_string(TUNE) +
                                                          " (DCT-domain momentum) needs 16-byte aligned 64 x 64 rows");
    } else if constexpr (kTunings[TUNE].lean_io) {
        if (!lean_io_fits(kc, momentum, grads))
            return launch_compress<without_lean_io(TUNE)>(kc, t, momentum, grads, bucket, p, stream);
    }
    LLMC_CHECK(t.fixed_chunks <= 0x7fffffffu && t.general_chunks <= 0x7fffffffu, "DeMo: too many chunks for one launch");
    LLMC_CHECK(t.fixed_chunks == 0 || kc.threads == 256, "DeMo: 64 x 64 launch group with 1024-thread kernels");
    if (t.fixed_chunks) {
        const SmemLayout& L = fixed_compress_layout(kc, TUNE);
        const CompressArgs args{t.tensors, t.fixed_tensors, t.folded, t.natural, momentum, grads, bucket, p, L};
        LLMC_LAUNCH(static_cast<unsigned>(t.fixed_chunks), 256, L.bytes(), stream,
                    demo_compress_kernel<256, cm::kFixedChunk, TUNE>)(args);
        CUDA_CHECK_LAUNCH();
    }
    if (t.general_chunks) {
        const CompressArgs args{t.tensors + t.fixed_tensors, t.general_tensors, t.folded, t.natural, momentum, grads,
                                bucket, p, kc.compress_general};
        const dim3 grid(static_cast<unsigned>(t.general_chunks));
        const size_t smem = kc.compress_general.bytes();
        if (kc.threads == 256) LLMC_LAUNCH(grid, 256, smem, stream, demo_compress_kernel<256, 0>)(args);
        else LLMC_LAUNCH(grid, 1024, smem, stream, demo_compress_kernel<1024, 0>)(args);
        CUDA_CHECK_LAUNCH();
    }
}

// Apply p.world buckets (back to back, p.bucket_bytes each) to the master weights and params. `error` (2 words,
// device) must hold {0, UINT32_MAX} before the launch. TUNE runs apply_tuning(TUNE)'s kernel. p.world may be
// below the world the launch was configured for (kc.world: the shared-memory layouts for W ranks hold the
// union of fewer ranks' coefficients), e.g. one rank's own bucket (p.keep_master: eager delayed updates).
template <int TUNE = kExactTuning>
inline void launch_apply(const KernelConfig& kc, const DeviceTables& t, const uint8_t* buckets, float* master,
                         llmc::floatX* params, const cm::ApplyParams& p, uint32_t seed, bool stochastic,
                         uint32_t* error, cudaStream_t stream) {
    if constexpr (kTunings[TUNE].lean_io) {
        if (!lean_apply_fits(kc, master, params))
            return launch_apply<without_lean_io(TUNE)>(kc, t, buckets, master, params, p, seed, stochastic, error, stream);
    }
    LLMC_CHECK(p.world >= 1 && p.world <= kc.world, "DeMo apply: launch configured for " + std::to_string(kc.world) +
                                                        " ranks, got " + std::to_string(p.world));
    LLMC_CHECK(t.fixed_chunks <= 0x7fffffffu && t.general_chunks <= 0x7fffffffu, "DeMo: too many chunks for one launch");
    LLMC_CHECK(t.fixed_chunks == 0 || kc.threads == 256, "DeMo: 64 x 64 launch group with 1024-thread kernels");
    if (t.fixed_chunks) {
        const ApplyArgs args{t.tensors, t.fixed_tensors, t.natural, buckets, master, params, p, seed, stochastic, error,
                             kc.apply};
        LLMC_LAUNCH(static_cast<unsigned>(t.fixed_chunks), 256, kc.apply.bytes(), stream,
                    demo_apply_kernel<256, cm::kFixedChunk, apply_tuning(TUNE)>)(args);
        CUDA_CHECK_LAUNCH();
    }
    if (t.general_chunks) {
        const ApplyArgs args{t.tensors + t.fixed_tensors, t.general_tensors, t.natural, buckets, master, params, p, seed,
                             stochastic, error, kc.apply_general};
        const dim3 grid(static_cast<unsigned>(t.general_chunks));
        const size_t smem = kc.apply_general.bytes();
        if (kc.threads == 256) LLMC_LAUNCH(grid, 256, smem, stream, demo_apply_kernel<256, 0>)(args);
        else LLMC_LAUNCH(grid, 1024, smem, stream, demo_apply_kernel<1024, 0>)(args);
        CUDA_CHECK_LAUNCH();
    }
}

// Tuning numbers chosen at run time (the trainer's LLMC_DEMO_TUNING) -> the launches above; every tuning's
// kernels are compiled in.
template <class F>
inline void at_tuning(int tune, F&& f) {  // f(std::integral_constant<int, tune>{})
    bool found = false;
    for_each_tuning([&](auto t) {
        if (decltype(t)::value == tune) {
            f(t);
            found = true;
        }
    });
    LLMC_CHECK(found, "DeMo: no kernel tuning " + std::to_string(tune));
}
inline void prepare_tuning_at(int tune, const KernelConfig& kc) {
    at_tuning(tune, [&](auto t) { prepare_tuning<decltype(t)::value>(kc); });
}
inline void launch_compress_at(int tune, const KernelConfig& kc, const DeviceTables& t, float* momentum,
                               const float* grads, uint8_t* bucket, const cm::CompressParams& p, cudaStream_t stream) {
    at_tuning(tune, [&](auto u) { launch_compress<decltype(u)::value>(kc, t, momentum, grads, bucket, p, stream); });
}
inline void launch_apply_at(int tune, const KernelConfig& kc, const DeviceTables& t, const uint8_t* buckets,
                            float* master, llmc::floatX* params, const cm::ApplyParams& p, uint32_t seed,
                            bool stochastic, uint32_t* error, cudaStream_t stream) {
    at_tuning(tune, [&](auto u) {
        launch_apply<decltype(u)::value>(kc, t, buckets, master, params, p, seed, stochastic, error, stream);
    });
}

// Bytes a compress launch moves through DRAM (momentum read + write, gradient read, bucket write), for GB/s.
inline double compress_dram_bytes(const ModelPlan& plan, size_t bucket_bytes) {
    return double(plan.num_params) * 12.0 + double(bucket_bytes);
}
// Apply: every rank's bucket read, master read + write, floatX params written.
inline double apply_dram_bytes(const ModelPlan& plan, size_t bucket_bytes, int world) {
    return double(plan.num_params) * (8.0 + sizeof(llmc::floatX)) + double(bucket_bytes) * world;
}

}  // namespace demo
