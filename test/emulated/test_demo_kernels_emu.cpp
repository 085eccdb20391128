// The CUDA DeMo kernels (llmc/optim/demo/demo_kernels.cuh) run on the CPU through emu/block_emulator.h, against the
// host reference of the same per-chunk math (demo::cm::compress_plan_host / apply_plan_host), on every plan
// and option the GPU checkers use that is small enough to emulate: awkward shapes mixing 64 x 64 chunks (the
// kernels specialized with constant sizes) with 1 x 64, 64 x 1, 1 x 1, 48 x 50 ... chunks (the general
// kernels), fp32 / bf16 / sign values, smallest / packed12 indices, lr / EMA momentum, alpha 1 / 0.2 / 0.5,
// k = 3, 5, 7, 32 and every coefficient, --demo_chunk 16 and 96 (1024-thread kernels), 1 and 3 ranks, and
// corrupt buckets. Compress: every bucket byte and every momentum bit equal. Apply: every master weight bit
// equal, the bf16 copy equal to nearest / stochastic rounding of it, error flags and the first bad rank.
// The fibers of a block run in forward, reverse and shuffled orders; results must not depend on the order
// (a missing barrier would show here). This runs the kernels' own code, so CI proves their indexing, shared
// memory protocol and arithmetic without a GPU; speed still needs one (make gpu-check).
// Built only where the CUDA headers exist (the Makefile's emu rule), with g++.
#include "emu/block_emulator.h"
// block_emulator.h first: the kernels below see its threadIdx, intrinsics and min/max.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/optim/demo/demo_kernels.cuh"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/model/param_layout.h"
#include "llmc/base/kernel_math.h"
#include "llmc/base/rng.h"
#include "test/support/demo_corrupt_buckets.h"
#include "test/support/testing.h"

EMU_DEFINE_SHARED(demo, smem4)

namespace {

using llmc::DemoIndexEncoding;
using llmc::DemoMomentum;
using llmc::DemoValueEncoding;
using llmc::OptimizerConfig;
using llmc::ParamLayout;
namespace cm = demo::cm;
namespace km = llmc::km;

// One launch as launch_compress / launch_apply make it: the 64 x 64 group with the fixed kernel, then the rest.
// Each group with its own shared-memory layout (fixed_layout / general_layout), as the launches give it.
template <class FixedKernel, class GeneralKernel, class Args>
void emulate_launches(const demo::KernelConfig& kc, const cm::LaunchTables& lt, const demo::SmemLayout& fixed_layout,
                      const demo::SmemLayout& general_layout, emu::Order order, Args args, FixedKernel fixed,
                      GeneralKernel general) {
    auto run_group = [&](int first, int count, uint64_t chunks, int threads, const demo::SmemLayout& L, auto kernel) {
        EXPECT(L.bytes() <= EMU_SHARED_BYTES);
        Args a = args;
        a.tensors = lt.tensors.data() + first;
        a.num_tensors = count;
        a.L = L;
        // NaN everywhere in the shared memory before each block: it starts undefined
        emu::run_grid(emu::Dim3{unsigned(threads), 1, 1}, emu::Dim3{unsigned(chunks), 1, 1}, order, 99, L.bytes(),
                      [&] { kernel(a); });
    };
    if (lt.fixed_chunks) run_group(0, lt.fixed_tensors, lt.fixed_chunks, 256, fixed_layout, fixed);
    if (lt.general_chunks)
        run_group(lt.fixed_tensors, int(lt.tensors.size()) - lt.fixed_tensors, lt.general_chunks, kc.threads,
                  general_layout, general);
}

// TUNE as demo::launch_compress takes it: a lean_io tuning runs as its twin without lean I/O where the rows do
// not fit 16-byte accesses. IDENTITY: the kernels without a transform (--optimizer topk).
template <int TUNE = 0, bool IDENTITY = false>
std::vector<std::byte> emulate_compress(const cm::PlanTables& pt, std::vector<float>& momentum,
                                        const std::vector<float>& grads, const cm::CompressParams& cp, emu::Order order) {
    const demo::KernelConfig kc = demo::make_kernel_config(pt, 1);
    if constexpr (demo::kTunings[TUNE].dct_momentum) {
        const bool fits = demo::lean_io_fits(kc, momentum.data(), grads.data());  // launch_compress refuses the rest
        EXPECT(fits);
        if (!fits) return {};
    } else if constexpr (demo::kTunings[TUNE].lean_io) {
        if (!demo::lean_io_fits(kc, momentum.data(), grads.data()))
            return emulate_compress<demo::without_lean_io(TUNE), IDENTITY>(pt, momentum, grads, cp, order);
    }
    const demo::KernelTables kt = demo::kernel_tables(pt);
    const cm::LaunchTables& lt = kt.order;
    std::vector<uint8_t> bucket(pt.bucket_bytes, 0);
    std::memcpy(bucket.data(), pt.header.data(), demo::kBucketHeaderBytes);
    const demo::CompressArgs args{nullptr, 0, kt.folded.data(), pt.bases.natural.data(), momentum.data(),
                                  grads.data(), bucket.data(), cp, kc.compress};
    auto fixed = [](const demo::CompressArgs& a) { demo::demo_compress_kernel<256, cm::kFixedChunk, TUNE, IDENTITY>(a); };
    auto general = [&kc](const demo::CompressArgs& a) {
        if (kc.threads == 256) demo::demo_compress_kernel<256, 0, 0, IDENTITY>(a);
        else demo::demo_compress_kernel<1024, 0, 0, IDENTITY>(a);
    };
    emulate_launches(kc, lt, demo::fixed_compress_layout(kc, TUNE), kc.compress_general, order, args, fixed, general);
    std::vector<std::byte> out(bucket.size());
    std::memcpy(out.data(), bucket.data(), bucket.size());
    return out;
}

struct ApplyOut {
    std::vector<float> master;
    std::vector<llmc::floatX> params;
    uint32_t error[2];
};
// launch_world: the world the launch is configured for (make_kernel_config), >= world (0: world).
template <int TUNE = 0, bool IDENTITY = false>
ApplyOut emulate_apply(const cm::PlanTables& pt, int world, const std::vector<std::byte>& buckets,
                       const std::vector<float>& master0, const cm::ApplyParams& ap, uint32_t seed, bool stochastic,
                       emu::Order order, int launch_world = 0) {
    const demo::KernelConfig kc = demo::make_kernel_config(pt, launch_world ? launch_world : world);
    const cm::LaunchTables lt = cm::launch_tables(pt);
    ApplyOut out{master0, std::vector<llmc::floatX>(master0.size()), {0u, UINT32_MAX}};
    if constexpr (demo::kTunings[TUNE].lean_io) {  // as demo::launch_apply
        if (!demo::lean_apply_fits(kc, out.master.data(), out.params.data()))
            return emulate_apply<demo::without_lean_io(TUNE), IDENTITY>(pt, world, buckets, master0, ap, seed, stochastic,
                                                                        order, launch_world);
    }
    const demo::ApplyArgs args{nullptr, 0, pt.bases.natural.data(), reinterpret_cast<const uint8_t*>(buckets.data()),
                               out.master.data(), out.params.data(), ap, seed, stochastic, out.error, kc.apply};
    auto fixed = [](const demo::ApplyArgs& a) {
        demo::demo_apply_kernel<256, cm::kFixedChunk, demo::apply_tuning(TUNE), IDENTITY>(a);
    };
    auto general = [&kc](const demo::ApplyArgs& a) {
        if (kc.threads == 256) demo::demo_apply_kernel<256, 0, 0, IDENTITY>(a);
        else demo::demo_apply_kernel<1024, 0, 0, IDENTITY>(a);
    };
    emulate_launches(kc, lt, kc.apply, kc.apply_general, order, args, fixed, general);
    return out;
}

// Which path of block_select_topk each chunk takes (decided here from the host reference's keys with the
// same rule as the kernel): k >= n, the coarse bin taken whole, candidates ranked, or the RadixSelect fallback.
struct TopkPaths {
    int all = 0, whole = 0, ranked = 0, fallback = 0;
};
TopkPaths g_paths;  // summed over every case; the last test checks each path ran

void count_topk_paths(const cm::PlanTables& pt, std::vector<float> m, const std::vector<float>& grads,
                      const cm::CompressParams& cp) {
    std::vector<uint8_t> bucket(pt.bucket_bytes, 0);
    cm::ChunkScratch s;
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const cm::ChunkTensor& ct = pt.tensors[t];
        for (uint64_t c = 0; c < pt.plan.tensors[t].num_chunks; c++) {
            cm::compress_chunk_host(pt, ct, c, m.data(), grads.data(), cp, bucket.data(), s);
            const uint32_t n = uint32_t(s.keys.size()), k = ct.k;
            if (k >= n) {
                g_paths.all++;
                continue;
            }
            std::vector<uint32_t> hist(cm::kCoarseBins, 0);
            for (uint32_t key : s.keys) hist[cm::coarse_bin(key)]++;
            uint32_t above = 0;
            const uint32_t B = cm::pick_bin(hist.data(), cm::kCoarseBins, k, &above);
            if (hist[B] == k - above) g_paths.whole++;
            else if (hist[B] <= cm::kMaxTopkCandidates) g_paths.ranked++;
            else g_paths.fallback++;
        }
    }
}

const char* order_name(emu::Order o) {
    return o == emu::Order::Forward    ? "forward"
           : o == emu::Order::Reverse  ? "reverse"
           : o == emu::Order::Shuffled ? "shuffled"
                                       : "one warp at a time";
}

// Compress, then apply the resulting bucket with (world - 1) more ranks' buckets from the host reference.
// TUNE: the tuning of the 64 x 64 kernels (demo::kTunings); IDENTITY: the kernels without a transform, whose
// host reference is cfg's (cm::PlanTables::identity: demo_transform identity).
template <int TUNE = 0, bool IDENTITY = false>
void check_case(const std::string& name, const ParamLayout& layout, const OptimizerConfig& cfg, uint64_t seed,
                emu::Order order, int world = 1) {
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    EXPECT_EQ(pt.identity, IDENTITY);
    const size_t n = layout.num_params;
    const std::vector<float> m0 = testing::random_normal(n, seed, 1e-3f), grads = testing::random_normal(n, seed + 1, 1.0f);
    const cm::CompressParams cp = cm::compress_params(cfg, 6e-4f, 0.75f);
    const cm::LaunchTables lt = cm::launch_tables(pt);

    std::vector<float> m_emu = m0, m_ref = m0;
    count_topk_paths(pt, m0, grads, cp);
    constexpr bool kDctMomentum = demo::kTunings[TUNE].dct_momentum;
    using Domain = cm::MomentumDomain;  // a dct_momentum kernel's momentum is M, compared as m
    if (kDctMomentum) cm::convert_momentum(pt.plan, m_emu, Domain::spatial, Domain::dct64);
    // The kernels read the clip coefficient from the device, as CudaDemo passes it (CompressParams::clip_device);
    // the `clip` beside it is a NaN they must not read.
    const float device_clip = cp.clip;
    cm::CompressParams cp_device = cp;
    cp_device.clip = std::nanf("");
    cp_device.clip_device = &device_clip;
    const std::vector<std::byte> b_emu = emulate_compress<TUNE, IDENTITY>(pt, m_emu, grads, cp_device, order);
    if (kDctMomentum) cm::convert_momentum(pt.plan, m_emu, Domain::dct64, Domain::spatial);
    std::vector<std::byte> b_ref;
    cm::compress_plan_host(pt, m_ref.data(), grads.data(), cp, b_ref);
    size_t byte_diffs = b_emu.size() == b_ref.size() ? 0 : SIZE_MAX, mom_diffs = 0;
    for (size_t i = 0; byte_diffs != SIZE_MAX && i < b_ref.size(); i++) byte_diffs += b_emu[i] != b_ref[i];
    for (size_t i = 0; i < n; i++) mom_diffs += km::float_to_bits(m_emu[i]) != km::float_to_bits(m_ref[i]);
    const demo::KernelConfig kc = demo::make_kernel_config(pt, 1);
    const int ran = demo::lean_io_fits(kc, m_emu.data(), grads.data()) ? TUNE : demo::without_lean_io(TUNE);
    std::printf("  %s [%s, tuning %d%s%s]: %zu chunks (%llu fixed 64x64, %llu general, %d threads): compress %zu bucket bytes "
                "and %zu momentum values differ",
                name.c_str(), order_name(order), TUNE, ran == TUNE ? "" : (" run as " + std::to_string(ran)).c_str(),
                IDENTITY ? ", no transform" : "",
                pt.plan.total_chunks, (unsigned long long)lt.fixed_chunks,
                (unsigned long long)lt.general_chunks, kc.threads, byte_diffs, mom_diffs);
    constexpr bool kExact = demo::is_exact_tuning(TUNE);
    if constexpr (kExact) {
        EXPECT_EQ(byte_diffs, size_t{0});
        EXPECT_EQ(mom_diffs, size_t{0});
    } else {
        // the tensor cores' sums, the DCT-domain momentum's rounding: held to the tolerances the GPU is held to
        // against the CPU optimizer
        const cm::CompressAgreement ag = cm::compare_compress(pt, b_emu, b_ref, m_emu, m_ref, m0, grads, cp);
        std::printf("\n    (%s) vs host reference: %s", kDctMomentum ? "DCT-domain momentum" : "tensor cores",
                    ag.describe().c_str());
        EXPECT(ag.ok(2e-5, 2e-5));
        EXPECT(lt.fixed_chunks > 0);  // the 64 x 64 kernel ran
    }

    std::vector<std::byte> all = b_emu;
    for (int r = 1; r < world; r++) {
        std::vector<float> m = testing::random_normal(n, seed + 10 + r, 1e-3f), g = testing::random_normal(n, seed + 20 + r, 1.0f);
        std::vector<std::byte> b;
        cm::compress_plan_host(pt, m.data(), g.data(), cp, b);
        all.insert(all.end(), b.begin(), b.end());
    }
    const cm::ApplyParams ap = cm::apply_params(cfg, 1e-3f, world, pt.bucket_bytes);
    const std::vector<float> p0 = testing::random_normal(n, seed + 2, 0.02f);
    std::vector<float> p_ref = p0;
    const uint32_t err_ref = cm::apply_plan_host(pt, all.data(), p_ref.data(), ap);
    EXPECT_EQ(err_ref, 0u);
    for (const bool stochastic : {true, false}) {
        const uint32_t sr_seed = 0x5eed0000u + uint32_t(seed);
        const ApplyOut a = emulate_apply<TUNE, IDENTITY>(pt, world, all, p0, ap, sr_seed, stochastic, order);
        size_t master_diffs = 0, param_diffs = 0;
        for (size_t i = 0; i < n; i++) {
            master_diffs += km::float_to_bits(a.master[i]) != km::float_to_bits(p_ref[i]);
            const uint32_t want = llmc::kFloatXIsFloat ? km::float_to_bits(a.master[i])
                                  : stochastic ? km::bf16_bits_stochastic(a.master[i], km::element_noise(i, sr_seed))
                                               : km::bf16_bits_rne(a.master[i]);
            param_diffs += llmc::storage_bits(a.params[i]) != want;
        }
        if (stochastic) std::printf("; apply (%d rank(s)) %zu master weights and %zu params differ\n", world, master_diffs, param_diffs);
        EXPECT_EQ(a.error[0], 0u);
        EXPECT_EQ(param_diffs, size_t{0});
        if constexpr (demo::is_exact_apply(TUNE)) {
            EXPECT_EQ(master_diffs, size_t{0});
        } else {
            const cm::ApplyAgreement ag = cm::compare_apply(pt, all, world, a.master, p_ref);
            if (stochastic) std::printf("    (tensor cores) apply vs host reference: %s\n", ag.describe().c_str());
            EXPECT(ag.ok());
        }
    }
}

// The GPU checkers' mixed plan, with [67] for their [67,67] (1 x 1 chunks too, 67 of them instead of 4489).
const std::vector<std::vector<size_t>> kMixed = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {128, 192},
                                                 {67, 64}, {64, 67}, {67}};  // primes: 1x64, 64x1, 1x1 chunks

TEST(compress_and_apply_match_host_reference) {
    const auto fp32 = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32);
    const auto bf16 = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.2f, 5);
    const auto sign = cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 3);
    const ParamLayout mixed = ParamLayout::of_shapes(kMixed);
    check_case("mixed fp32/smallest/lr/k32", mixed, fp32, 10, emu::Order::Forward);
    check_case("mixed bf16/packed12/ema/a0.2/k5", mixed, bf16, 20, emu::Order::Forward, 3);
    check_case("mixed sign/smallest/lr/k3", mixed, sign, 30, emu::Order::Forward);
    check_case("mixed, --demo_chunk 16 topk 7 packed12", mixed,
               cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 0.5f, 7, 16), 40,
               emu::Order::Forward);
    check_case("[96,50] topk 4096 (every coefficient)", ParamLayout::of_shapes({{96, 50}, {7}}),
               cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 4096), 50,
               emu::Order::Forward);
}

// Ties: a momentum of equal magnitudes makes every chunk's top-k a tie decided by index, and zero momentum with
// zero gradient makes every coefficient 0 (the sign scale 0 path).
TEST(ties_and_zeros_match_host_reference) {
    const ParamLayout layout = ParamLayout::of_shapes({{128, 128}, {64}});
    const auto cfg = cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 1.0f, 9);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    for (int mode = 0; mode < 2; mode++) {
        std::vector<float> m(n, 0.0f), g(n, 0.0f);
        if (mode == 0)
            for (size_t i = 0; i < n; i++) g[i] = (i % 5 == 0) ? 1.0f : 0.0f;  // DCT of a comb: many equal |E|
        std::vector<float> m_emu = m, m_ref = m;
        const cm::CompressParams cp = cm::compress_params(cfg, 1e-3f, 1.0f);
        count_topk_paths(pt, m, g, cp);
        const std::vector<std::byte> b_emu = emulate_compress(pt, m_emu, g, cp, emu::Order::Reverse);
        std::vector<std::byte> b_ref;
        cm::compress_plan_host(pt, m_ref.data(), g.data(), cp, b_ref);
        EXPECT(b_emu == b_ref);
        EXPECT(std::memcmp(m_emu.data(), m_ref.data(), n * sizeof(float)) == 0);
    }
}

// The result does not depend on the order the block's threads run between barriers.
TEST(results_independent_of_thread_order) {
    const auto bf16 = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {67, 64}, {64, 67}, {7}});
    check_case("small mixed bf16/k32", layout, bf16, 60, emu::Order::Reverse, 2);
    check_case("small mixed bf16/k32", layout, bf16, 60, emu::Order::Shuffled, 2);
    check_case("small mixed bf16/k32", layout, bf16, 60, emu::Order::WarpSerial, 2);
}

// Every tuning of the 64 x 64 kernels (demo::kTunings: top-k path, tensor cores, lean I/O with and without the
// momentum refetch, L2 prefetch, all-warp bin search) agrees with the host reference too: the fp32 ones bit for
// bit, the tensor-core ones to cm::compare_compress's tolerances.
TEST(every_tuning_matches_host_reference) {
    const auto sign = cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.5f, 9);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {64, 67}, {7}});
    EXPECT(demo::make_kernel_config(cm::plan_tables(sign, layout), 1).vec4_io);  // the lean I/O tunings run as such
    demo::for_each_tuning([&](auto tune) {
        constexpr int T = decltype(tune)::value;
        check_case<T>(std::string("small mixed sign/packed12/ema/k9, ") + demo::tuning_name(T), layout, sign, 80 + T,
                      emu::Order::Shuffled, 2);
    });
}

// A 64 x 64 tensor whose rows are not 16-byte aligned (it starts at element 7 of the buffer): the lean I/O
// tunings cannot take it, and a launch runs their twins without lean I/O (demo::without_lean_io), same results.
TEST(lean_io_tunings_fall_back_on_unaligned_rows) {
    const auto fp32 = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9);
    const ParamLayout layout = ParamLayout::of_shapes({{7}, {128, 192}, {64, 64}});
    EXPECT(!demo::make_kernel_config(cm::plan_tables(fp32, layout), 1).vec4_io);
    static_assert(demo::without_lean_io(1) == demo::kExactTuning && demo::without_lean_io(4) == demo::kTensorTuning &&
                  demo::without_lean_io(5) == demo::kRadixTuning && demo::without_lean_io(8) == demo::kExactTuning &&
                  demo::without_lean_io(9) == demo::kTensorTuning);
    check_case<1>("unaligned 64x64 rows fp32/k9", layout, fp32, 130, emu::Order::Shuffled, 2);
    check_case<4>("unaligned 64x64 rows fp32/k9", layout, fp32, 131, emu::Order::Shuffled, 2);
    check_case<5>("unaligned 64x64 rows fp32/k9", layout, fp32, 132, emu::Order::Shuffled, 2);
    check_case<8>("unaligned 64x64 rows fp32/k9", layout, fp32, 133, emu::Order::Shuffled, 2);
    check_case<9>("unaligned 64x64 rows fp32/k9", layout, fp32, 134, emu::Order::Shuffled, 2);
}

// The lean I/O apply on chunks where many coefficients are sent by several of 4 ranks (k = 100: the mean over
// 2-4 senders, the first sender told by its `touched` bit), fp32 and tensor-core decode.
TEST(lean_io_apply_with_shared_coefficients) {
    const ParamLayout layout = ParamLayout::of_shapes({{192, 128}, {64, 64}, {128}});
    const auto cfg = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::ema, 0.2f, 100);
    check_case<1>("64x64 bf16/smallest/ema/a0.2/k100, lean I/O", layout, cfg, 140, emu::Order::Shuffled, 4);
    check_case<4>("64x64 bf16/smallest/ema/a0.2/k100, tensor cores, lean I/O", layout, cfg, 141, emu::Order::Reverse, 4);
}

// The tensor-core kernels on d12-like 64 x 64 chunks: fp32 values at k 32 (sparse decode rows), k 100 (every
// one of the 64 rows can hold a sent coefficient: the decode's full K), EMA momentum with alpha 0.2, 4 ranks.
TEST(tensor_core_kernels_agree_with_host_reference) {
    constexpr int T = demo::kTensorTuning;
    const ParamLayout layout = ParamLayout::of_shapes({{192, 128}, {64, 64}, {128}});
    check_case<T>("64x64 fp32/smallest/lr/k32, tensor cores", layout,
                  cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                  110, emu::Order::Forward, 2);
    check_case<T>("64x64 bf16/smallest/ema/a0.2/k100, tensor cores", layout,
                  cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::ema, 0.2f, 100),
                  120, emu::Order::WarpSerial, 4);
}

// The DCT-domain momentum (tunings 6, 7, 10 and 11): fed M = C1 m C2^T of the spatial momentum, the kernels send the
// reference's coefficients (values to rounding, the same index sets) and leave C1^T M' C2 within rounding of the
// reference's updated momentum, for lr-scaled and EMA momentum, alpha 1 and 0.2, and fp32, bf16 and sign values;
// the 64 x 64 chunks' buffer holds M, the other chunks stay spatial (cm::convert_momentum).
TEST(dct_domain_momentum_tunings_agree_with_host_reference) {
    static_assert(demo::kTunings[6].dct_momentum && !demo::kTunings[6].tensor_dct && demo::kTunings[6].register_topk &&
                  demo::kTunings[7].dct_momentum && demo::kTunings[7].tensor_dct && demo::kTunings[7].register_topk &&
                  demo::kTunings[10].dct_momentum && demo::kTunings[10].tensor_dct && !demo::kTunings[10].coarse_topk &&
                  demo::kTunings[11].dct_momentum && !demo::kTunings[11].tensor_dct && !demo::kTunings[11].coarse_topk);
    const ParamLayout layout = ParamLayout::of_shapes({{192, 128}, {64, 64}, {128}});
    check_case<6>("64x64 fp32/smallest/lr/k32, DCT-domain momentum", layout,
                  cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                  140, emu::Order::Forward, 2);
    check_case<6>("64x64 bf16/smallest/ema/a0.2/k100, DCT-domain momentum", layout,
                  cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::ema, 0.2f, 100),
                  150, emu::Order::WarpSerial, 3);
    check_case<7>("64x64 sign/packed12/lr/k5, DCT-domain momentum, tensor cores", layout,
                  cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 1.0f, 5),
                  160, emu::Order::Shuffled, 2);
    check_case<7>("64x64 bf16/packed12/lr/a0.2/k9, DCT-domain momentum, tensor cores", layout,
                  cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 0.2f, 9),
                  180, emu::Order::Forward, 2);
    check_case<10>("64x64 fp32/smallest/ema/a0.2/k32, DCT-domain momentum, tensor cores, RadixSelect", layout,
                   cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::ema, 0.2f, 32),
                   170, emu::Order::WarpSerial, 3);
    check_case<7>("64x64 fp32/smallest/lr/k32, DCT-domain momentum, tensor cores", layout,
                  cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                  190, emu::Order::WarpSerial, 2);
    check_case<11>("64x64 bf16/packed12/ema/a0.2/k9, DCT-domain momentum, RadixSelect, compact", layout,
                   cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.2f, 9),
                   200, emu::Order::Reverse, 2);
}

// The warp lookup (tunings 6 to 9) finds the tensors the binary search finds, on a plan of 40 tensors of 64 x 64
// chunks (two ballot rounds): tuning 8 gives the host reference's bits, tuning 7 those of its twin 10 (the binary
// search, RadixSelect: the same DCT-domain sums and top-k rule).
TEST(warp_lookup_finds_the_binary_search_tensors) {
    static_assert(demo::kTunings[8].warp_lookup && demo::kTunings[7].warp_lookup && !demo::kTunings[10].warp_lookup &&
                  demo::kTunings[10].dct_momentum && demo::kTunings[10].tensor_dct);
    std::vector<std::vector<size_t>> shapes;
    for (size_t i = 0; i < 40; i++) shapes.push_back({64, 64 * (1 + i % 3)});
    shapes.push_back({64});
    const ParamLayout layout = ParamLayout::of_shapes(shapes);
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 5);
    check_case<8>("40 tensors of 64x64 chunks fp32/k5, warp lookup", layout, cfg, 270, emu::Order::Shuffled, 1);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    const std::vector<float> m0 = testing::random_normal(n, 280, 1e-3f), grads = testing::random_normal(n, 281, 1.0f);
    const cm::CompressParams cp = cm::compress_params(cfg, 6e-4f, 1.0f);
    std::vector<float> m10 = m0, m7 = m0;
    const std::vector<std::byte> b10 = emulate_compress<10>(pt, m10, grads, cp, emu::Order::Forward);
    const std::vector<std::byte> b7 = emulate_compress<7>(pt, m7, grads, cp, emu::Order::Shuffled);
    const bool same_momentum = std::memcmp(m10.data(), m7.data(), n * sizeof(float)) == 0;
    std::printf("  tuning 7 vs tuning 10 on %zu chunks: buckets %s, momentum %s\n", pt.plan.total_chunks,
                b10 == b7 ? "equal" : "DIFFER", same_momentum ? "equal" : "DIFFERS");
    EXPECT(!b7.empty() && b10 == b7);
    EXPECT(same_momentum);
}

// register_topk's anchored bin search (tuning 8, exact) on the chunks that stress it, bit for bit against the host
// reference: ties (the DCT of a comb), all zeros (the RadixSelect fallback), and a momentum that is constant up to noise 1e-6
// of its size, whose chunks have one large DC coefficient and the k-th largest ~20 octaves (~160 coarse bins)
// below it, so the search walks down several 64-bin windows (counted here from the reference's keys).
template <int T>
void check_anchored_search() {
    static_assert(demo::kTunings[T].register_topk && demo::is_exact_tuning(T));
    const ParamLayout layout = ParamLayout::of_shapes({{128, 128}, {64}});
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    const cm::CompressParams cp = cm::compress_params(cfg, 1e-3f, 1.0f);
    int far_chunks = 0;
    for (int mode = 0; mode < 3; mode++) {
        std::vector<float> m(n, 0.0f), g(n, 0.0f);
        if (mode == 0)
            for (size_t i = 0; i < n; i++) g[i] = (i % 5 == 0) ? 1.0f : 0.0f;
        if (mode == 2) {
            const std::vector<float> noise = testing::random_normal(n, 300, 1e-6f);
            for (size_t i = 0; i < n; i++) m[i] = 1.0f + noise[i];
            cm::ChunkScratch s;
            std::vector<uint8_t> scratch_bucket(pt.bucket_bytes, 0);
            std::vector<float> mm = m;
            const cm::ChunkTensor& ct = pt.tensors[0];
            for (uint64_t c = 0; c < pt.plan.tensors[0].num_chunks; c++) {
                cm::compress_chunk_host(pt, ct, c, mm.data(), g.data(), cp, scratch_bucket.data(), s);
                std::vector<uint32_t> keys = s.keys;
                std::sort(keys.begin(), keys.end(), std::greater<>());
                far_chunks += cm::coarse_bin(keys[0]) - cm::coarse_bin(keys[ct.k - 1]) >= 64;
            }
        }
        count_topk_paths(pt, m, g, cp);
        std::vector<float> m_emu = m, m_ref = m;
        const std::vector<std::byte> b_emu = emulate_compress<T>(pt, m_emu, g, cp, emu::Order::Shuffled);
        std::vector<std::byte> b_ref;
        cm::compress_plan_host(pt, m_ref.data(), g.data(), cp, b_ref);
        std::printf("  tuning %d, mode %d (%s): buckets %s, momentum %s\n", T, mode, mode == 0 ? "comb" : mode == 1 ? "zeros" : "constant + noise",
                    b_emu == b_ref ? "equal" : "DIFFER",
                    std::memcmp(m_emu.data(), m_ref.data(), n * sizeof(float)) == 0 ? "equal" : "DIFFERS");
        EXPECT(b_emu == b_ref);
        EXPECT(std::memcmp(m_emu.data(), m_ref.data(), n * sizeof(float)) == 0);
    }
    std::printf("  chunks whose k-th key lies 64 or more coarse bins below the largest: %d of 4\n", far_chunks);
    EXPECT_EQ(far_chunks, 4);
}
TEST(anchored_bin_search_matches_host_reference) {
    check_anchored_search<8>();
    const ParamLayout layout = ParamLayout::of_shapes({{192, 128}, {64, 64}, {128}});
    check_case<8>("64x64 fp32/smallest/lr/k32, register top-k", layout,
                  cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                  210, emu::Order::WarpSerial, 2);
    check_case<8>("64x64 bf16/packed12/ema/a0.2/k100, register top-k", layout,
                  cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.2f, 100),
                  220, emu::Order::Reverse, 3);
}

// register_topk changes only how the top-k is found and placed, so the tunings with it must give, bit for bit, the
// buckets and momentum of their twins without it (the same DCTs and arithmetic): 7 those of 10 and 6 of 11 (the
// DCT-domain momentum, tensor cores and fp32; the twins run RadixSelect), 9 of 4 (tensor cores) and 8 of 0 (fp32).
// On every path: candidates ranked (k = 32), the bin taken whole (k = 3), ties decided by index (the DCT of a
// comb), all zeros (the RadixSelect fallback), one large coefficient far above the rest (several 64-bin windows),
// ~20 equal coefficients around the k-th largest (ranked by index), k = 4,096 (every coefficient), and k = 100
// with bf16 values and EMA momentum; in different block orders.
template <int A, int B>
void expect_same_compress(const std::string& name, const cm::PlanTables& pt, const std::vector<float>& m0,
                          const std::vector<float>& grads, const cm::CompressParams& cp, emu::Order order) {
    std::vector<float> ma = m0, mb = m0;
    const std::vector<std::byte> ba = emulate_compress<A>(pt, ma, grads, cp, order);
    const std::vector<std::byte> bb = emulate_compress<B>(pt, mb, grads, cp, emu::Order::Forward);
    const bool same_momentum = std::memcmp(ma.data(), mb.data(), ma.size() * sizeof(float)) == 0;
    std::printf("  %s, tuning %d vs %d [%s]: buckets %s, momentum %s\n", name.c_str(), A, B, order_name(order),
                ba == bb ? "equal" : "DIFFER", same_momentum ? "equal" : "DIFFERS");
    EXPECT(!ba.empty() && ba == bb);
    EXPECT(same_momentum);
}

TEST(register_topk_matches_its_twins) {
    static_assert(demo::kTunings[7].register_topk && !demo::kTunings[10].register_topk && demo::kTunings[7].tensor_dct &&
                  demo::kTunings[10].tensor_dct && demo::kTunings[7].dct_momentum && demo::kTunings[10].dct_momentum);
    static_assert(demo::kTunings[6].register_topk && !demo::kTunings[11].register_topk && !demo::kTunings[6].tensor_dct &&
                  !demo::kTunings[11].tensor_dct && demo::kTunings[6].dct_momentum && demo::kTunings[11].dct_momentum);
    static_assert(demo::kTunings[9].register_topk && demo::kTunings[9].tensor_dct && !demo::kTunings[4].register_topk &&
                  demo::kTunings[4].tensor_dct && demo::kTunings[8].register_topk && !demo::kTunings[8].tensor_dct);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {64, 64}, {64}});
    const size_t n = layout.num_params;
    struct Case {
        const char* name;
        OptimizerConfig cfg;
        int data;  // 0 random, 1 comb gradient, 2 zeros, 3 constant momentum + noise, 4 ties in the k-th key's bin
    };
    const std::vector<Case> cases = {
        {"fp32/k32 random", cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32), 0},
        {"sign/k3 random", cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.5f, 3), 0},
        {"bf16/k100 random", cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::ema, 0.2f, 100), 0},
        {"fp32/k9 comb", cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9), 1},
        {"sign/k9 zeros", cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9), 2},
        {"fp32/k9 constant + noise", cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9), 3},
        {"fp32/k9 ~20 equal keys per chunk", cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9), 4},
        {"fp32/k4096 every coefficient", cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 4096), 0},
    };
    for (size_t c = 0; c < cases.size(); c++) {
        const Case& cs = cases[c];
        const cm::PlanTables pt = cm::plan_tables(cs.cfg, layout);
        std::vector<float> m(n, 0.0f), g(n, 0.0f);
        if (cs.data == 0) {
            m = testing::random_normal(n, 400 + c, 1e-3f);
            g = testing::random_normal(n, 500 + c, 1.0f);
        } else if (cs.data == 1) {
            for (size_t i = 0; i < n; i++) g[i] = (i % 5 == 0) ? 1.0f : 0.0f;
        } else if (cs.data == 3) {
            const std::vector<float> noise = testing::random_normal(n, 600, 1e-6f);
            for (size_t i = 0; i < n; i++) m[i] = (i % 4096 == 0 ? 50.0f : 0.0f) + noise[i];
        } else if (cs.data == 4) {  // zero gradient: E = decay M, so the equal coefficients stay equal
            const std::vector<float> small = testing::random_normal(n, 700, 1e-2f);
            for (size_t i = 0; i < n; i++) m[i] = i % 199 == 7 ? (i % 2 ? 1.0f : -1.0f) : small[i];
        }
        const cm::CompressParams cp = cm::compress_params(cs.cfg, 1e-3f, 1.0f);
        const emu::Order order = c % 2 ? emu::Order::Shuffled : emu::Order::WarpSerial;
        expect_same_compress<7, 10>(cs.name, pt, m, g, cp, order);
        expect_same_compress<6, 11>(cs.name, pt, m, g, cp, c % 2 ? emu::Order::Reverse : emu::Order::Shuffled);
        expect_same_compress<9, 4>(cs.name, pt, m, g, cp, c % 2 ? emu::Order::Shuffled : emu::Order::Reverse);
        expect_same_compress<8, 0>(cs.name, pt, m, g, cp, c % 2 ? emu::Order::WarpSerial : emu::Order::Reverse);
    }
}

// The precomputed basis fragments (kernel_tables: tensor_basis_table at the head of the folded table) are the
// ones build_tensor_basis makes, bit for bit, so tuning 12 (copied to shared memory) gives tuning 7's buckets and
// momentum.
TEST(basis_table_tunings_match_tuning_7) {
    static_assert(demo::kTunings[12].basis_table == 1 && demo::kTunings[7].basis_table == 0);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {64, 64}, {64}});
    const size_t n = layout.num_params;
    for (const auto& cfg : {cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                            cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.5f, 3)}) {
        const cm::PlanTables pt = cm::plan_tables(cfg, layout);
        const std::vector<float> m = testing::random_normal(n, 800, 1e-3f), g = testing::random_normal(n, 801, 1.0f);
        const cm::CompressParams cp = cm::compress_params(cfg, 1e-3f, 1.0f);
        expect_same_compress<12, 7>("precomputed basis", pt, m, g, cp, emu::Order::Shuffled);
        expect_same_compress<12, 7>("precomputed basis", pt, m, g, cp, emu::Order::WarpSerial);
    }
}

// The emulated mma.sync m16n8k8 TF32 against a plain 16 x 8 x 8 product of the matrices its fragments encode (the
// PTX ISA's layout, written out here independently of the kernels' fragment loads), once on TF32 values (exact
// products: only the summation rounds) and once through demo::mma_3xtf32's split of fp32 values (error bounded
// by ~2^-20 of the products' magnitudes, against ~2^-11 for a single TF32 product).
TEST(emulated_tf32_mma_layout_and_split) {
    const std::vector<float> A = testing::random_normal(16 * 8, 7, 1.0f), Bm = testing::random_normal(8 * 8, 8, 1.0f);
    auto tf32 = [](float v) { return km::bits_to_float(km::float_to_bits(v) & 0xffffe000u); };
    for (const bool split : {false, true}) {
        std::vector<float> D(16 * 8, 0.0f);
        emu::run_block(32, 0, 1, emu::Order::Shuffled, 5, [&] {
            const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
            auto a = [&](int r, int c) { return split ? A[size_t(r) * 8 + c] : tf32(A[size_t(r) * 8 + c]); };
            auto b = [&](int r, int c) { return split ? Bm[size_t(r) * 8 + c] : tf32(Bm[size_t(r) * 8 + c]); };
            const float av[4] = {a(g, t), a(g + 8, t), a(g, t + 4), a(g + 8, t + 4)};
            const float bv[2] = {b(t, g), b(t + 4, g)};
            float d[1][4] = {{1.0f, 2.0f, 3.0f, 4.0f}};
            if (split) {
                uint32_t a_hi[4], a_lo[4], b_hi[1][2], b_lo[1][2];
                for (int i = 0; i < 4; i++) demo::split_tf32(av[i], a_hi[i], a_lo[i]);
                for (int i = 0; i < 2; i++) demo::split_tf32(bv[i], b_hi[0][i], b_lo[0][i]);
                demo::mma_3xtf32(d, a_hi, a_lo, b_hi, b_lo);
            } else {
                const uint32_t ab[4] = {km::float_to_bits(av[0]), km::float_to_bits(av[1]), km::float_to_bits(av[2]),
                                        km::float_to_bits(av[3])};
                demo::mma_tf32_16x8x8(d[0], ab, km::float_to_bits(bv[0]), km::float_to_bits(bv[1]));
            }
            D[size_t(g) * 8 + 2 * t] = d[0][0] - 1.0f;
            D[size_t(g) * 8 + 2 * t + 1] = d[0][1] - 2.0f;
            D[size_t(g + 8) * 8 + 2 * t] = d[0][2] - 3.0f;
            D[size_t(g + 8) * 8 + 2 * t + 1] = d[0][3] - 4.0f;
        });
        double err = 0, tf32_err = 0;
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 8; c++) {
                double s = 0, s1 = 0;
                for (int k = 0; k < 8; k++) {
                    const float x = split ? A[size_t(r) * 8 + k] : tf32(A[size_t(r) * 8 + k]);
                    const float y = split ? Bm[size_t(k) * 8 + c] : tf32(Bm[size_t(k) * 8 + c]);
                    s += double(x) * y;
                    s1 += double(tf32(x)) * tf32(y);
                }
                err = std::max(err, std::fabs(s - D[size_t(r) * 8 + c]));
                tf32_err = std::max(tf32_err, std::fabs(s - s1));
            }
        std::printf("  %s: max err %.2e vs plain product (one TF32 product of the same values: %.2e)\n",
                    split ? "3xTF32 of fp32 values" : "TF32 values", err, tf32_err);
        EXPECT(err < (split ? 2e-5 : 1e-5));
        if (split) EXPECT(err < tf32_err / 20);  // the split is what makes it fp32-accurate
    }
}

// --demo_chunk 96: uneven chunks and the 1024-thread kernels.
TEST(chunk96_1024_threads_match_host_reference) {
    check_case("[192,288]+[384], --demo_chunk 96 topk 32", ParamLayout::of_shapes({{192, 288}, {384}, {3, 5}}),
               cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32, 96), 70,
               emu::Order::Forward, 2);
}

// --optimizer topk: the kernels without a transform (IDENTITY) against the host reference's identity path, on the
// mixed plan (unaligned: the 64 x 64 chunks run kIdentityTuning's twin without lean I/O, plus the general kernels),
// on aligned 64 x 64 rows (kIdentityTuning: lean I/O, register top-k, the feedback in place), with every wire format,
// EMA momentum and alpha 0.2, --demo_chunk 16 and 96 (1024 threads), k >= n, 1-3 ranks; ties and zeros too. Beside
// the reference, what top-k of the momentum means, checked from the bucket through the CPU codec (fp32 values):
// each chunk sends the updated momentum's own values, and none left out is larger in magnitude than one sent.
void check_identity_selection(const cm::PlanTables& pt, const std::vector<float>& m0, const std::vector<float>& grads,
                              const cm::CompressParams& cp, const std::vector<std::byte>& bucket) {
    demo::Selection sel;
    demo::decode_bucket(pt.plan, pt.format, bucket, sel, "identity bucket");
    size_t wrong_values = 0, larger_left_out = 0;
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const cm::ChunkTensor& ct = pt.tensors[t];
        const demo::TensorPlan& tp = pt.plan.tensors[t];
        for (uint64_t c = 0; c < tp.num_chunks; c++) {
            const uint64_t origin = cm::chunk_origin(ct, c);
            auto x = [&](uint32_t i) {
                const uint64_t g = origin + uint64_t(i / ct.n2) * ct.cols + i % ct.n2;
                return cm::momentum_update(m0[g], grads[g], cp.clip, cp.decay, cp.grad_scale);
            };
            std::vector<bool> sent(tp.chunk_elems, false);
            float smallest = INFINITY;
            for (size_t j = 0; j < tp.k; j++) {
                const size_t item = tp.select_offset + c * tp.k + j;
                const uint32_t i = sel.indices[item];
                sent[i] = true;
                wrong_values += km::float_to_bits(sel.values[item]) != km::float_to_bits(x(i));
                smallest = std::min(smallest, std::fabs(x(i)));
            }
            for (uint32_t i = 0; i < tp.chunk_elems; i++) larger_left_out += !sent[i] && std::fabs(x(i)) > smallest;
        }
    }
    std::printf("    top-k of the momentum through the CPU codec: %zu values not the momentum's, %zu larger ones left out\n",
                wrong_values, larger_left_out);
    EXPECT_EQ(wrong_values, size_t{0});
    EXPECT_EQ(larger_left_out, size_t{0});
}

TEST(identity_kernels_match_host_reference) {
    constexpr int T = demo::kIdentityTuning;
    auto topk = [](llmc::OptimizerConfig c) { return demo::as_topk(c); };
    const auto fp32 = topk(cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32));
    const auto bf16 = topk(cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.2f, 5));
    const auto sign = topk(cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 3));
    const ParamLayout mixed = ParamLayout::of_shapes(kMixed);
    const ParamLayout aligned = ParamLayout::of_shapes({{192, 128}, {64, 67}, {7}});
    EXPECT(!demo::make_kernel_config(cm::plan_tables(fp32, mixed), 1).vec4_io);
    EXPECT(demo::make_kernel_config(cm::plan_tables(fp32, aligned), 1).vec4_io);
    check_case<T, true>("topk: mixed fp32/smallest/lr/k32", mixed, fp32, 300, emu::Order::Forward);
    check_case<T, true>("topk: aligned fp32/smallest/lr/k32", aligned, fp32, 310, emu::Order::Shuffled, 2);
    check_case<T, true>("topk: aligned bf16/packed12/ema/a0.2/k5", aligned, bf16, 320, emu::Order::WarpSerial, 3);
    check_case<T, true>("topk: aligned sign/smallest/lr/k3", aligned, sign, 330, emu::Order::Reverse, 2);
    check_case<T, true>("topk: small mixed, --demo_chunk 16 topk 7 packed12", ParamLayout::of_shapes({{64, 48}, {50}, {3, 5}}),
                        topk(cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled,
                                             0.5f, 7, 16)),
                        340, emu::Order::Shuffled, 2);
    check_case<T, true>("topk: [192,288]+[384], --demo_chunk 96 topk 32", ParamLayout::of_shapes({{192, 288}, {384}, {3, 5}}),
                        topk(cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled,
                                             1.0f, 32, 96)),
                        350, emu::Order::Forward, 2);
    check_case<T, true>("topk: [64,64] topk 4096 (every element)", ParamLayout::of_shapes({{64, 64}, {7}}),
                        topk(cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled,
                                             1.0f, 4096)),
                        360, emu::Order::Shuffled);
    // the semantics, from the bucket alone: aligned (lean I/O) and mixed (the other paths)
    for (const ParamLayout* layout : {&aligned, &mixed}) {
        const cm::PlanTables pt = cm::plan_tables(fp32, *layout);
        const size_t n = layout->num_params;
        const std::vector<float> m0 = testing::random_normal(n, 370, 1e-3f), g = testing::random_normal(n, 371, 1.0f);
        const cm::CompressParams cp = cm::compress_params(fp32, 6e-4f, 0.75f);
        std::vector<float> m = m0;
        check_identity_selection(pt, m0, g, cp, emulate_compress<T, true>(pt, m, g, cp, emu::Order::Shuffled));
    }
    // ties (a comb gradient on zero momentum: many equal magnitudes, decided by index) and all zeros (RadixSelect's
    // fallback, the sign scale 0), bucket and momentum bit for bit
    const ParamLayout ties = ParamLayout::of_shapes({{128, 128}, {64}});
    for (const auto& cfg : {sign, fp32}) {
        const cm::PlanTables pt = cm::plan_tables(cfg, ties);
        const size_t n = ties.num_params;
        for (int mode = 0; mode < 2; mode++) {
            std::vector<float> m(n, 0.0f), g(n, 0.0f);
            if (mode == 0)
                for (size_t i = 0; i < n; i++) g[i] = (i % 5 == 0) ? 1.0f : 0.0f;
            std::vector<float> m_emu = m, m_ref = m;
            const cm::CompressParams cp = cm::compress_params(cfg, 1e-3f, 1.0f);
            count_topk_paths(pt, m, g, cp);
            const std::vector<std::byte> b_emu = emulate_compress<T, true>(pt, m_emu, g, cp, emu::Order::Reverse);
            std::vector<std::byte> b_ref;
            cm::compress_plan_host(pt, m_ref.data(), g.data(), cp, b_ref);
            EXPECT(b_emu == b_ref);
            EXPECT(std::memcmp(m_emu.data(), m_ref.data(), n * sizeof(float)) == 0);
        }
    }
}

// Eager delayed updates' own share (ApplyParams::keep_master, demo_cuda.cuh): one rank's bucket, no weight decay,
// applied by a launch configured for 4 ranks (the trainer's kernels are set up for its world; the layouts for 4
// ranks hold one rank's coefficients): the master weights are left as they were and the floatX copy gets the
// host reference's update of a copy of them, rounded to nearest or stochastically. The exact apply (tuning 0)
// and the trainer's lean I/O apply (kLeanApplyTuning), the 64 x 64 kernel and the general one (1 x 64, 64 x 1,
// 1 x 1 and 3 x 5 chunks), a decaying config whose decay must not apply.
TEST(keep_master_writes_only_the_floatx_copy) {
    const auto cfg = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 1.0f, 9);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {67, 64}, {64, 67}, {67}, {3, 5}});
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    std::vector<float> m = testing::random_normal(n, 900, 1e-3f);
    const std::vector<float> g = testing::random_normal(n, 901, 1.0f);
    std::vector<std::byte> bucket;
    cm::compress_plan_host(pt, m.data(), g.data(), cm::compress_params(cfg, 1e-3f, 1.0f), bucket);
    cm::ApplyParams ap = cm::apply_params(cfg, 1e-3f, 1, pt.bucket_bytes);
    EXPECT(ap.apply_wd && ap.wd_factor != 1.0f);
    ap.apply_wd = false;
    ap.keep_master = true;
    const std::vector<float> p0 = testing::random_normal(n, 902, 0.02f);
    std::vector<float> want = p0;
    EXPECT_EQ(cm::apply_plan_host(pt, bucket.data(), want.data(), ap), 0u);
    size_t moved = 0;
    for (size_t i = 0; i < n; i++) moved += want[i] != p0[i];
    EXPECT(moved > n / 2);
    auto check = [&](auto tune, emu::Order order) {
        constexpr int T = decltype(tune)::value;
        for (const bool stochastic : {true, false}) {
            const uint32_t seed = 0x5eed1234u;
            const ApplyOut a = emulate_apply<T>(pt, 1, bucket, p0, ap, seed, stochastic, order, /*launch_world=*/4);
            size_t master_diffs = 0, param_diffs = 0;
            for (size_t i = 0; i < n; i++) {
                master_diffs += km::float_to_bits(a.master[i]) != km::float_to_bits(p0[i]);
                const uint32_t bits = llmc::kFloatXIsFloat ? km::float_to_bits(want[i])
                                      : stochastic ? km::bf16_bits_stochastic(want[i], km::element_noise(i, seed))
                                                   : km::bf16_bits_rne(want[i]);
                param_diffs += llmc::storage_bits(a.params[i]) != bits;
            }
            std::printf("  keep_master, tuning %d [%s], %s rounding: %zu master weights changed, %zu params differ "
                        "(%zu of %zu weights moved)\n", T, order_name(order), stochastic ? "stochastic" : "nearest",
                        master_diffs, param_diffs, moved, n);
            EXPECT_EQ(a.error[0], 0u);
            EXPECT_EQ(master_diffs, size_t{0});
            EXPECT_EQ(param_diffs, size_t{0});
        }
    };
    static_assert(demo::is_exact_apply(0) && demo::is_exact_apply(demo::kLeanApplyTuning) &&
                  demo::kTunings[demo::kLeanApplyTuning].lean_io && !demo::kTunings[0].lean_io);
    EXPECT(demo::make_kernel_config(pt, 4).vec4_io);  // the lean I/O apply runs as such
    check(std::integral_constant<int, 0>{}, emu::Order::Shuffled);
    check(std::integral_constant<int, demo::kLeanApplyTuning>{}, emu::Order::WarpSerial);
}

// --demo_delay 1's apply (ApplyParams::decay_after, demo_cuda.cuh): two ranks' round applied with its own lr,
// then decayed with another step's wd_factor, in one pass. The oracle does it the CPU optimizer's way: the host
// reference apply without decay, then every decaying tensor (matrices: the 1-D one stays) multiplied by
// wd_factor. keep_params (eager updates) leaves the floatX copy as it was (zeros here) and the master weights
// the same. The exact apply (tuning 0) and the trainer's lean I/O apply, 64 x 64 and general chunks.
TEST(decay_after_update_and_keep_params) {
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 7);
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {67, 64}, {67}, {3, 5}});
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    std::vector<std::byte> buckets;
    for (uint64_t r = 0; r < 2; r++) {
        std::vector<float> m = testing::random_normal(n, 910 + r, 1e-3f);
        const std::vector<float> g = testing::random_normal(n, 920 + r, 1.0f);
        std::vector<std::byte> bucket;
        cm::compress_plan_host(pt, m.data(), g.data(), cm::compress_params(cfg, 1e-3f, 1.0f), bucket);
        buckets.insert(buckets.end(), bucket.begin(), bucket.end());
    }
    cm::ApplyParams ap = cm::apply_params(cfg, 2e-3f, 2, pt.bucket_bytes);  // the pending round's lr
    ap.wd_factor = cm::apply_params(cfg, 5e-4f, 2, pt.bucket_bytes).wd_factor;  // this step's
    ap.decay_after = true;
    const std::vector<float> p0 = testing::random_normal(n, 930, 0.02f);
    std::vector<float> want = p0;
    cm::ApplyParams undecayed = ap;
    undecayed.apply_wd = false;
    undecayed.decay_after = false;
    EXPECT_EQ(cm::apply_plan_host(pt, buckets.data(), want.data(), undecayed), 0u);
    size_t decayed = 0;
    for (size_t t = 0; t < layout.tensors.size(); t++) {
        if (!pt.tensors[t].decays) continue;
        for (size_t i = layout.tensors[t].offset; i < layout.tensors[t].offset + layout.tensors[t].numel; i++, decayed++)
            want[i] = cm::mul_rn(want[i], ap.wd_factor);
    }
    EXPECT(decayed > 0 && decayed < n);
    std::vector<float> host = p0;
    EXPECT_EQ(cm::apply_plan_host(pt, buckets.data(), host.data(), ap), 0u);
    size_t host_diffs = 0;
    for (size_t i = 0; i < n; i++) host_diffs += km::float_to_bits(host[i]) != km::float_to_bits(want[i]);
    EXPECT_EQ(host_diffs, size_t{0});
    auto check = [&](auto tune, emu::Order order) {
        constexpr int T = decltype(tune)::value;
        for (const bool keep_params : {false, true}) {
            cm::ApplyParams a_p = ap;
            a_p.keep_params = keep_params;
            const ApplyOut a = emulate_apply<T>(pt, 2, buckets, p0, a_p, 7, /*stochastic=*/false, order);
            size_t master_diffs = 0, param_diffs = 0;
            for (size_t i = 0; i < n; i++) {
                master_diffs += km::float_to_bits(a.master[i]) != km::float_to_bits(want[i]);
                const uint32_t bits = keep_params ? 0u
                                      : llmc::kFloatXIsFloat ? km::float_to_bits(want[i])
                                                             : km::bf16_bits_rne(want[i]);
                param_diffs += llmc::storage_bits(a.params[i]) != bits;
            }
            std::printf("  decay_after, tuning %d [%s], keep_params %d: %zu master weights and %zu params differ from "
                        "apply-then-decay (%zu of %zu weights decayed)\n", T, order_name(order), int(keep_params),
                        master_diffs, param_diffs, decayed, n);
            EXPECT_EQ(a.error[0], 0u);
            EXPECT_EQ(master_diffs, size_t{0});
            EXPECT_EQ(param_diffs, size_t{0});
        }
    };
    check(std::integral_constant<int, 0>{}, emu::Order::Shuffled);
    check(std::integral_constant<int, demo::kLeanApplyTuning>{}, emu::Order::WarpSerial);
}

// --demo_sign false (ApplyParams::use_sign): the apply kernels step by lr * decode(G) itself. The oracle is the CPU
// optimizer's apply of the same two buckets (its own sparse decode, other summation orders): equal to rounding,
// 1e-5 of the largest step plus 4 ulps; the host reference (the same per-chunk math) bit for bit. The signed CPU
// apply shows the flag matters: its steps are all +-lr, the unsigned ones are not.
TEST(unsigned_apply_matches_the_cpu_optimizer) {
    auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 9);
    cfg.weight_decay = 0.0f;  // the CPU optimizer decays in compress, the kernel in apply
    cfg.demo.sign = false;
    const ParamLayout layout = ParamLayout::of_shapes({{128, 192}, {67, 64}, {64, 67}, {67}, {3, 5}});
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    const float lr = 1e-3f;
    std::vector<std::byte> buckets;
    for (uint64_t r = 0; r < 2; r++) {
        std::vector<float> m = testing::random_normal(n, 940 + r, 1e-3f);
        const std::vector<float> g = testing::random_normal(n, 950 + r, 1.0f);
        std::vector<std::byte> bucket;
        cm::compress_plan_host(pt, m.data(), g.data(), cm::compress_params(cfg, lr, 1.0f), bucket);
        buckets.insert(buckets.end(), bucket.begin(), bucket.end());
    }
    const cm::ApplyParams ap = cm::apply_params(cfg, lr, 2, pt.bucket_bytes);
    EXPECT(!ap.use_sign);
    const std::vector<float> p0 = testing::random_normal(n, 960, 0.02f);
    std::vector<float> host = p0;
    EXPECT_EQ(cm::apply_plan_host(pt, buckets.data(), host.data(), ap), 0u);
    auto cpu_apply = [&](bool use_sign) {
        llmc::OptimizerConfig c = cfg;
        c.demo.sign = use_sign;
        llmc::LocalTransport transport;
        demo::DemoOptimizer opt(c, layout, transport);
        std::vector<float> p = p0;
        const size_t offsets[3] = {0, pt.bucket_bytes, 2 * pt.bucket_bytes};
        llmc::StepTimings unused;
        opt.apply(buckets, offsets, p, lr, unused);
        return p;
    };
    const std::vector<float> cpu = cpu_apply(false), cpu_signed = cpu_apply(true);
    double max_step = 0.0;
    size_t unit_steps = 0, signed_unit_steps = 0;
    for (size_t i = 0; i < n; i++) {
        const double step = std::fabs(double(cpu[i]) - p0[i]);
        max_step = std::max(max_step, step);
        unit_steps += std::fabs(step - lr) < 1e-3 * lr;
        signed_unit_steps += std::fabs(std::fabs(double(cpu_signed[i]) - p0[i]) - lr) < 1e-3 * lr;
    }
    EXPECT(max_step > 0.0 && max_step < 0.5 * lr);  // lr * decode: small steps here, not +-lr
    EXPECT(unit_steps == 0 && signed_unit_steps > n / 2);
    auto check = [&](auto tune, emu::Order order) {
        constexpr int T = decltype(tune)::value;
        const ApplyOut a = emulate_apply<T>(pt, 2, buckets, p0, ap, 7, /*stochastic=*/false, order);
        size_t host_diffs = 0, beyond = 0;
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) {
            host_diffs += km::float_to_bits(a.master[i]) != km::float_to_bits(host[i]);
            const double diff = std::fabs(double(a.master[i]) - cpu[i]);
            worst = std::max(worst, diff);
            beyond += diff > 1e-5 * max_step + 4.0 * std::ldexp(std::fabs(double(cpu[i])), -23);
        }
        std::printf("  unsigned apply, tuning %d [%s]: %zu master weights differ from the host reference; vs the CPU "
                    "optimizer max |diff| %.3g (largest step %.3g), %zu beyond the tolerance\n", T, order_name(order),
                    host_diffs, worst, max_step, beyond);
        EXPECT_EQ(a.error[0], 0u);
        EXPECT_EQ(host_diffs, size_t{0});
        EXPECT_EQ(beyond, size_t{0});
    };
    check(std::integral_constant<int, 0>{}, emu::Order::Shuffled);
    check(std::integral_constant<int, demo::kLeanApplyTuning>{}, emu::Order::WarpSerial);
}

// Corrupt buckets (test/support/demo_corrupt_buckets.h): each sets its error flag and names the rank.
TEST(apply_flags_corrupt_buckets) {
    const auto cfg = demo_corrupt::config();
    const ParamLayout layout = demo_corrupt::layout();
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    std::vector<float> delta(n, 0.0f), grads = testing::random_normal(n, 5, 1.0f);
    std::vector<std::byte> bucket;
    cm::compress_plan_host(pt, delta.data(), grads.data(), cm::compress_params(cfg, 1e-3f, 1.0f), bucket);
    const std::vector<float> p0 = testing::random_normal(n, 6, 0.02f);
    const cm::ApplyParams ap = cm::apply_params(cfg, 1e-3f, 2, pt.bucket_bytes);
    for (const demo_corrupt::Case& c : demo_corrupt::cases(pt, bucket)) {
        const ApplyOut a = emulate_apply(pt, 2, c.buckets, p0, ap, 1, false, emu::Order::Forward);
        std::printf("  %s: flags %u, rank %u\n", c.what, a.error[0], a.error[1]);
        EXPECT((a.error[0] & c.flag) && a.error[1] == c.rank);
    }
}

// Every path of the kernels' top-k ran in the cases above (the counts come from the host's view of the same
// chunks, so a path the data never reaches would go unnoticed without this).
TEST(every_topk_path_exercised) {
    std::printf("  top-k paths over all compress cases: k >= n %d, coarse bin whole %d, candidates ranked %d, "
                "radix fallback %d\n", g_paths.all, g_paths.whole, g_paths.ranked, g_paths.fallback);
    EXPECT(g_paths.all > 0 && g_paths.whole > 0 && g_paths.ranked > 0 && g_paths.fallback > 0);
}

}  // namespace

TEST_MAIN()
