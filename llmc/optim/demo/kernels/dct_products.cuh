// The dense products of a DeMo chunk: the fp32 register tiles of the folded DCT passes (run_jobs), the tensor-core
// 3xTF32 path of the 64 x 64 kernels, and the sparse decode of the sent coefficients (decode_list; identity_decode
// for --optimizer topk, which has no transform).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/kernels/block_topk.cuh"
#include "llmc/optim/demo/kernels/tunings.h"
#include "llmc/optim/demo/plan_tables.h"

namespace demo {

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

// Step 9 without a transform (--optimizer topk): dec (n1 x lde) holds the list's values at their indices and zeros
// elsewhere, what decode_list gives for identity bases. Starts after a barrier that ended every read of dec's
// words and the list's writes; ends with all threads in step.
template <int THREADS>
__device__ __forceinline__ void identity_decode(const cm::ChunkDims& d, const uint32_t* Lidx, const float* Lval,
                                                int count, float* dec) {
    for (int q = threadIdx.x; q < d.n1 * d.lde; q += THREADS) dec[q] = 0.0f;
    __syncthreads();
    for (int e = threadIdx.x; e < count; e += THREADS) {  // the indices are distinct: no two threads meet
        const uint32_t i = Lidx[e];
        dec[(i / uint32_t(d.n2)) * uint32_t(d.lde) + i % uint32_t(d.n2)] = Lval[e];
    }
    __syncthreads();
}

}  // namespace demo
