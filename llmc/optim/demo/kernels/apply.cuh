// The DeMo apply kernel: every rank's items of a chunk, scatter-mean, inverse DCT, sign and the update of the master
// weights and their floatX copy, one thread block per chunk (see demo_kernels.cuh); its IDENTITY instantiations
// (--optimizer topk) put the means at their indices instead of the inverse DCT.
#pragma once
#include <cuda_runtime.h>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/kernels/compress.cuh"
#include "llmc/optim/demo/kernels/dct_products.cuh"
#include "llmc/optim/demo/kernels/tunings.h"

namespace demo {

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

template <int THREADS, int FIXED, int TUNE = 0, bool IDENTITY = false>  // FIXED, TUNE, IDENTITY as demo_compress_kernel
__global__ void __launch_bounds__(THREADS, FIXED ? kTunings[TUNE].min_blocks : 1) demo_apply_kernel(const ApplyArgs a) {
    static_assert(FIXED == 0 || FIXED * FIXED <= kMaxElemsPerThread * THREADS, "fixed chunk too large");
    constexpr KernelTuning kTune = FIXED ? kTunings[TUNE] : kGeneralTuning;
    constexpr int kTileJ = kTune.tile_j, kTileC = kTune.tile_c;
    constexpr bool kTensor = FIXED == int(cm::kFixedChunk) && kTune.tensor_dct;
    static_assert(!kTensor || THREADS == 256, "the tensor-core path takes 8 warps");
    static_assert(!IDENTITY || !kTune.tensor_dct, "no transform: no tensor-core decode");
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
    if constexpr (IDENTITY)  // the means at their indices (the sums in Q were read above)
        identity_decode<THREADS>(d, Lidx, Lval, int(count), Q);
    else
        decode_list<THREADS, kTileJ, kTileC, kTensor>(d, a.natural + ct.nat1, a.natural + ct.nat2, Lidx, Lval,
                                                       int(count), P, B, Q, segs, scan);

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
                                                a.p.decay_after, a.p.use_sign);
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

}  // namespace demo
