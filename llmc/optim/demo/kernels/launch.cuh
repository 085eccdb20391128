// Launch glue of the DeMo kernels: the shared-memory layouts of a plan, the device copies of its tables, the
// preparation of every instantiation, and launch_compress / launch_apply (by tuning, at compile or run time).
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/optim/demo/kernels/apply.cuh"
#include "llmc/optim/demo/kernels/compress.cuh"
#include "llmc/optim/demo/kernels/dct_products.cuh"
#include "llmc/optim/demo/kernels/tunings.h"
#include "llmc/optim/demo/plan_tables.h"

namespace demo {

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

// The 64 x 64 kernels of tuning TUNE (prepare_kernels does the fp32 and the tensor-core tunings); IDENTITY: their
// instantiations without a transform (prepare_identity_kernels).
template <int TUNE, bool IDENTITY = false>
inline void prepare_tuning(const KernelConfig& kc) {
    if (kc.threads != 256) return;
    const void* compress = reinterpret_cast<const void*>(demo_compress_kernel<256, cm::kFixedChunk, TUNE, IDENTITY>);
    raise_smem_limit(compress, fixed_compress_layout(kc, TUNE).bytes());
    if constexpr (kTunings[TUNE].compact_smem)  // 5 blocks x 45.5 KB need the largest shared-memory carveout
        CUDA_CHECK(cudaFuncSetAttribute(compress, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    raise_smem_limit(
        reinterpret_cast<const void*>(demo_apply_kernel<256, cm::kFixedChunk, apply_tuning(TUNE), IDENTITY>),
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

// prepare_kernels' limits for the kernels without a transform (--optimizer topk) that launch_identity_compress and
// launch_identity_apply run: kIdentityTuning, its twin without lean I/O, and the general kernels.
inline void prepare_identity_kernels(const KernelConfig& kc) {
    if (kc.threads == 256) {
        raise_smem_limit(reinterpret_cast<const void*>(demo_compress_kernel<256, 0, 0, true>), kc.compress_general.bytes());
        raise_smem_limit(reinterpret_cast<const void*>(demo_apply_kernel<256, 0, 0, true>), kc.apply_general.bytes());
        static_assert(apply_tuning(kIdentityTuning) == kLeanApplyTuning && without_lean_io(kLeanApplyTuning) ==
                      without_lean_io(kIdentityTuning), "the identity launches' kernels are these tunings'");
        prepare_tuning<kIdentityTuning, true>(kc);
        prepare_tuning<without_lean_io(kIdentityTuning), true>(kc);
    } else {
        raise_smem_limit(reinterpret_cast<const void*>(demo_compress_kernel<1024, 0, 0, true>), kc.compress_general.bytes());
        raise_smem_limit(reinterpret_cast<const void*>(demo_apply_kernel<1024, 0, 0, true>), kc.apply_general.bytes());
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
// tuning runs as its twin without lean I/O when the buffers do not fit it (lean_io_fits). IDENTITY: the kernels
// without a transform (--optimizer topk).
template <int TUNE = kExactTuning, bool IDENTITY = false>
inline void launch_compress(const KernelConfig& kc, const DeviceTables& t, float* momentum, const float* grads,
                            uint8_t* bucket, const cm::CompressParams& p, cudaStream_t stream) {
    if constexpr (kTunings[TUNE].dct_momentum) {
        LLMC_CHECK(lean_io_fits(kc, momentum, grads), "DeMo compress tuning " + std::to_string(TUNE) +
                                                          " (DCT-domain momentum) needs 16-byte aligned 64 x 64 rows");
    } else if constexpr (kTunings[TUNE].lean_io) {
        if (!lean_io_fits(kc, momentum, grads))
            return launch_compress<without_lean_io(TUNE), IDENTITY>(kc, t, momentum, grads, bucket, p, stream);
    }
    LLMC_CHECK(t.fixed_chunks <= 0x7fffffffu && t.general_chunks <= 0x7fffffffu, "DeMo: too many chunks for one launch");
    LLMC_CHECK(t.fixed_chunks == 0 || kc.threads == 256, "DeMo: 64 x 64 launch group with 1024-thread kernels");
    if (t.fixed_chunks) {
        const SmemLayout& L = fixed_compress_layout(kc, TUNE);
        const CompressArgs args{t.tensors, t.fixed_tensors, t.folded, t.natural, momentum, grads, bucket, p, L};
        LLMC_LAUNCH(static_cast<unsigned>(t.fixed_chunks), 256, L.bytes(), stream,
                    demo_compress_kernel<256, cm::kFixedChunk, TUNE, IDENTITY>)(args);
        CUDA_CHECK_LAUNCH();
    }
    if (t.general_chunks) {
        const CompressArgs args{t.tensors + t.fixed_tensors, t.general_tensors, t.folded, t.natural, momentum, grads,
                                bucket, p, kc.compress_general};
        const dim3 grid(static_cast<unsigned>(t.general_chunks));
        const size_t smem = kc.compress_general.bytes();
        if (kc.threads == 256) LLMC_LAUNCH(grid, 256, smem, stream, demo_compress_kernel<256, 0, 0, IDENTITY>)(args);
        else LLMC_LAUNCH(grid, 1024, smem, stream, demo_compress_kernel<1024, 0, 0, IDENTITY>)(args);
        CUDA_CHECK_LAUNCH();
    }
}

// Apply p.world buckets (back to back, p.bucket_bytes each) to the master weights and params. `error` (2 words,
// device) must hold {0, UINT32_MAX} before the launch. TUNE runs apply_tuning(TUNE)'s kernel. p.world may be
// below the world the launch was configured for (kc.world: the shared-memory layouts for W ranks hold the
// union of fewer ranks' coefficients), e.g. one rank's own bucket (p.keep_master: eager delayed updates).
// IDENTITY as launch_compress.
template <int TUNE = kExactTuning, bool IDENTITY = false>
inline void launch_apply(const KernelConfig& kc, const DeviceTables& t, const uint8_t* buckets, float* master,
                         llmc::floatX* params, const cm::ApplyParams& p, uint32_t seed, bool stochastic,
                         uint32_t* error, cudaStream_t stream) {
    if constexpr (kTunings[TUNE].lean_io) {
        if (!lean_apply_fits(kc, master, params))
            return launch_apply<without_lean_io(TUNE), IDENTITY>(kc, t, buckets, master, params, p, seed, stochastic,
                                                                 error, stream);
    }
    LLMC_CHECK(p.world >= 1 && p.world <= kc.world, "DeMo apply: launch configured for " + std::to_string(kc.world) +
                                                        " ranks, got " + std::to_string(p.world));
    LLMC_CHECK(t.fixed_chunks <= 0x7fffffffu && t.general_chunks <= 0x7fffffffu, "DeMo: too many chunks for one launch");
    LLMC_CHECK(t.fixed_chunks == 0 || kc.threads == 256, "DeMo: 64 x 64 launch group with 1024-thread kernels");
    if (t.fixed_chunks) {
        const ApplyArgs args{t.tensors, t.fixed_tensors, t.natural, buckets, master, params, p, seed, stochastic, error,
                             kc.apply};
        LLMC_LAUNCH(static_cast<unsigned>(t.fixed_chunks), 256, kc.apply.bytes(), stream,
                    demo_apply_kernel<256, cm::kFixedChunk, apply_tuning(TUNE), IDENTITY>)(args);
        CUDA_CHECK_LAUNCH();
    }
    if (t.general_chunks) {
        const ApplyArgs args{t.tensors + t.fixed_tensors, t.general_tensors, t.natural, buckets, master, params, p, seed,
                             stochastic, error, kc.apply_general};
        const dim3 grid(static_cast<unsigned>(t.general_chunks));
        const size_t smem = kc.apply_general.bytes();
        if (kc.threads == 256) LLMC_LAUNCH(grid, 256, smem, stream, demo_apply_kernel<256, 0, 0, IDENTITY>)(args);
        else LLMC_LAUNCH(grid, 1024, smem, stream, demo_apply_kernel<1024, 0, 0, IDENTITY>)(args);
        CUDA_CHECK_LAUNCH();
    }
}

// Tuning numbers chosen at run time (the trainer's --demo_kernel_tuning) -> the launches above; every tuning's
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

// --optimizer topk's launches (no transform): kIdentityTuning's compress, the lean apply, each falling back to its
// twin without lean I/O where the buffers do not fit 16-byte accesses.
inline void launch_identity_compress(const KernelConfig& kc, const DeviceTables& t, float* momentum, const float* grads,
                                     uint8_t* bucket, const cm::CompressParams& p, cudaStream_t stream) {
    launch_compress<kIdentityTuning, true>(kc, t, momentum, grads, bucket, p, stream);
}
inline void launch_identity_apply(const KernelConfig& kc, const DeviceTables& t, const uint8_t* buckets, float* master,
                                  llmc::floatX* params, const cm::ApplyParams& p, uint32_t seed, bool stochastic,
                                  uint32_t* error, cudaStream_t stream) {
    launch_apply<kLeanApplyTuning, true>(kc, t, buckets, master, params, p, seed, stochastic, error, stream);
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
