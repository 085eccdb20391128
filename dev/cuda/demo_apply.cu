// Checker for demo_apply_kernel (llmc/optim/demo/demo_kernels.cuh): 1, 3 and 8 ranks' buckets written by the CPU
// DemoOptimizer (so the GPU also proves it reads the CPU's wire format) on awkward plans and the d12 shapes,
// fp32 / bf16 / sign values, u8-u16 / packed12 indices, with weight decay on the 2-D tensors:
//  1. master weights bit-exact against the host reference of the same per-chunk math
//     (demo::cm::apply_plan_host, run on the CPU by test_demo_chunk_math), the floatX parameters bit-exact
//     against nearest / stochastic rounding of the GPU's own master weights;
//  2. against DemoOptimizer::apply on the same buckets (demo::cm::compare_apply: parameters bit-equal except
//     where the decoded update is within rounding of zero, checked with an fp64 decode);
//  3. corrupt buckets (an index outside its chunk, a repeated index) raise the error flags.
// Timing: the full d12 (124M parameters) apply of 1 and 8 ranks' buckets, GB/s of the bytes it must move
// (buckets read, master read + write, floatX write), for every tuning of the 64 x 64 kernel that apply
// distinguishes (demo::kTunings: tensor-core decode, lean I/O), each fp32 tuning checked bit-identical to tuning 0
// (master weights and params), the tensor-core one with cm::compare_apply (signs may differ only where the
// decoded value is within rounding of 0) and its lean I/O twin bit-identical to it. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "llmc/optim/demo/demo_cuda.cuh"
#include "llmc/optim/demo/demo_optimizer.h"
#include "test/support/demo_agreement.h"
#include "test/support/demo_host_reference.h"
#include "dev/cuda/common.h"
#include "llmc/model/param_layout.h"
#include "test/support/demo_corrupt_buckets.h"

using namespace llmc;
namespace cm = demo::cm;

namespace {

ParamLayout d12_layout(int layers) {
    ModelConfig mc;
    mc.num_layers = layers;
    return ParamLayout::gpt2(mc);
}

struct GpuApplyResult {
    std::vector<float> master;
    std::vector<floatX> params;
    uint32_t error[2];
};

GpuApplyResult gpu_apply(CudaEnv& env, const cm::PlanTables& pt, int world, const std::vector<std::byte>& buckets,
                         const std::vector<float>& master0, const cm::ApplyParams& ap, uint32_t seed, bool stochastic) {
    const demo::KernelConfig kc = demo::make_kernel_config(pt, world);
    demo::prepare_kernels(kc, pt.plan);
    demo::OwnedDeviceTables tables(pt);
    DeviceBuffer<uint8_t> db(buckets.size(), "buckets");
    db.upload(reinterpret_cast<const uint8_t*>(buckets.data()), buckets.size());
    auto dm = check::to_device(master0);
    DeviceBuffer<floatX> dp(master0.size(), "params");
    DeviceBuffer<uint32_t> derr(2, "error");
    derr.upload(std::vector<uint32_t>{0u, UINT32_MAX});
    demo::launch_apply(kc, tables.view, db.data(), dm.data(), dp.data(), ap, seed, stochastic, derr.data(), env.stream);
    env.sync();
    GpuApplyResult r;
    r.master = dm.download();
    r.params = dp.download();
    const std::vector<uint32_t> e = derr.download();
    r.error[0] = e[0];
    r.error[1] = e[1];
    return r;
}

void check_case(CudaEnv& env, check::Checker& ck, const std::string& name, const ParamLayout& layout,
                const OptimizerConfig& cfg, int world, uint32_t seed) {
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    const float lr = 1e-3f;
    const std::vector<float> p0 = check::random_floats(n, 0.02f, seed);
    // every rank's bucket from the CPU optimizer (rank 0's compress also applies the weight decay to p_cpu)
    LocalTransport transport;
    std::vector<float> p_cpu = p0;
    std::vector<std::byte> all;
    std::vector<size_t> offsets{0};
    StepTimings tm;
    std::unique_ptr<demo::DemoOptimizer> rank0;
    for (int r = 0; r < world; r++) {
        auto opt = std::make_unique<demo::DemoOptimizer>(cfg, layout, transport);
        ByteWriter w;
        cm::write_state(w, pt.plan, check::random_floats(n, 1e-3f, seed + 100 + r));
        ByteReader rd(w.bytes(), "momentum");
        opt->load_state(rd);
        std::vector<float> g = check::random_floats(n, 1.0f, seed + 200 + r), p = p0;
        std::vector<std::byte> b;
        opt->compress(r == 0 ? p_cpu : p, g, lr, b, tm);
        all.insert(all.end(), b.begin(), b.end());
        offsets.push_back(all.size());
        if (r == 0) rank0 = std::move(opt);
    }
    rank0->apply(all, offsets, p_cpu, lr, tm);
    std::printf("%s, %d rank(s): %zu parameters, %zu chunks\n", name.c_str(), world, n, pt.plan.total_chunks);

    const cm::ApplyParams ap = cm::apply_params(cfg, lr, world, pt.bucket_bytes);
    const uint32_t seed_sr = 0x5eed0000u + seed;
    const GpuApplyResult g = gpu_apply(env, pt, world, all, p0, ap, seed_sr, /*stochastic=*/true);
    ck.expect(g.error[0] == 0, "no error flags");

    // 1. vs the host reference
    std::vector<float> p_ref = p0;
    const uint32_t err = cm::apply_plan_host(pt, all.data(), p_ref.data(), ap);
    size_t master_diffs = 0, param_diffs = 0;
    for (size_t i = 0; i < n; i++) {
        master_diffs += km::float_to_bits(g.master[i]) != km::float_to_bits(p_ref[i]);
        const uint32_t want = kFloatXIsFloat ? km::float_to_bits(g.master[i])
                                             : km::bf16_bits_stochastic(g.master[i], km::element_noise(i, seed_sr));
        param_diffs += storage_bits(g.params[i]) != want;
    }
    ck.expect(err == 0 && master_diffs == 0, "master == host reference (" + std::to_string(master_diffs) + " differ)");
    ck.expect(param_diffs == 0, "params == stochastic rounding of master (" + std::to_string(param_diffs) + " differ)");
    const GpuApplyResult gn = gpu_apply(env, pt, world, all, p0, ap, seed_sr, /*stochastic=*/false);
    size_t nearest_diffs = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t want = kFloatXIsFloat ? km::float_to_bits(gn.master[i]) : km::bf16_bits_rne(gn.master[i]);
        nearest_diffs += storage_bits(gn.params[i]) != want;
    }
    ck.expect(nearest_diffs == 0, "params == nearest rounding of master (" + std::to_string(nearest_diffs) + " differ)");

    // 2. vs the CPU optimizer
    const cm::ApplyAgreement a = cm::compare_apply(pt, all, world, g.master, p_cpu);
    std::printf("  vs CPU DemoOptimizer: %s\n", a.describe().c_str());
    ck.expect(a.ok(), "agrees with DemoOptimizer::apply");
}

void check_corrupt(CudaEnv& env, check::Checker& ck) {
    const OptimizerConfig cfg = demo_corrupt::config();
    const ParamLayout layout = demo_corrupt::layout();
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    std::vector<float> delta(n, 0.0f), grads = check::random_floats(n, 1.0f, 5);
    std::vector<std::byte> bucket;
    cm::compress_plan_host(pt, delta.data(), grads.data(), cm::compress_params(cfg, 1e-3f, 1.0f), bucket);
    const std::vector<float> p0 = check::random_floats(n, 0.02f, 6);
    const cm::ApplyParams ap = cm::apply_params(cfg, 1e-3f, 2, pt.bucket_bytes);
    for (const demo_corrupt::Case& c : demo_corrupt::cases(pt, bucket)) {
        const GpuApplyResult g = gpu_apply(env, pt, 2, c.buckets, p0, ap, 1, false);
        ck.expect((g.error[0] & c.flag) && g.error[1] == c.rank, std::string(c.what) + " flagged");
    }
}

__global__ void fill_kernel(float* x, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = scale * (float(km::element_noise(i, seed)) * 2.3283064e-10f - 0.5f);
}

void time_d12(CudaEnv& env, check::Checker& ck, const OptimizerConfig& cfg, int world, const char* label) {
    const ParamLayout layout = d12_layout(12);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    // one bucket from the GPU compress, used for every rank
    const demo::KernelConfig kc1 = demo::make_kernel_config(pt, 1);
    demo::prepare_kernels(kc1, pt.plan);
    const demo::KernelConfig kc = demo::make_kernel_config(pt, world);
    demo::prepare_kernels(kc, pt.plan);
    demo::OwnedDeviceTables tables(pt);
    DeviceBuffer<float> m(n, "momentum"), g(n, "grads"), master(n, "master");
    DeviceBuffer<floatX> params(n, "params");
    DeviceBuffer<uint8_t> buckets(pt.bucket_bytes * size_t(world), "buckets");
    DeviceBuffer<uint32_t> err(2, "error");
    fill_kernel<<<grid_stride_blocks(n, 256), 256, 0, env.stream>>>(m.data(), n, 1, 2e-3f);
    fill_kernel<<<grid_stride_blocks(n, 256), 256, 0, env.stream>>>(g.data(), n, 2, 2.0f);
    fill_kernel<<<grid_stride_blocks(n, 256), 256, 0, env.stream>>>(master.data(), n, 3, 0.04f);
    CUDA_CHECK(cudaMemset(buckets.data(), 0, buckets.bytes()));
    CUDA_CHECK(cudaMemcpy(buckets.data(), pt.header.data(), demo::kBucketHeaderBytes, cudaMemcpyHostToDevice));
    demo::launch_compress(kc1, tables.view, m.data(), g.data(), buckets.data(), cm::compress_params(cfg, 6e-4f, 1.0f), env.stream);
    for (int r = 1; r < world; r++)
        CUDA_CHECK(cudaMemcpyAsync(buckets.data() + size_t(r) * pt.bucket_bytes, buckets.data(), pt.bucket_bytes,
                                   cudaMemcpyDeviceToDevice, env.stream));
    const cm::ApplyParams ap = cm::apply_params(cfg, 6e-4f, world, pt.bucket_bytes);
    DeviceBuffer<float> master0(n, "master");
    CUDA_CHECK(cudaMemcpyAsync(master0.data(), master.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, env.stream));
    std::vector<float> master_t0, master_tc;
    std::vector<floatX> params_t0, params_tc;
    auto same_bits = [](const std::vector<floatX>& a, const std::vector<floatX>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(floatX)) == 0;
    };
    // every tuning of the 64 x 64 kernel that apply distinguishes (decode on the tensor cores, lean I/O; the
    // rest are compress's), checked bit-identical to tuning 0 (fp32 decode) or kTensorTuning (lean I/O on the
    // tensor-core decode), the latter against tuning 0 to compare_apply's tolerance, then timed
    demo::for_each_tuning([&](auto tune) {
        constexpr int T = decltype(tune)::value;
        if constexpr (demo::apply_tuning(T) != T) return;  // the same apply kernel as an earlier tuning
        demo::prepare_tuning<T>(kc);
        CUDA_CHECK(cudaMemcpyAsync(master.data(), master0.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, env.stream));
        err.upload(std::vector<uint32_t>{0u, UINT32_MAX});
        demo::launch_apply<T>(kc, tables.view, buckets.data(), master.data(), params.data(), ap, 42, true, err.data(),
                              env.stream);
        env.sync();
        if (T == 0) {
            master_t0 = master.download();
            params_t0 = params.download();
        } else if constexpr (demo::is_exact_apply(T)) {
            ck.expect(master.download() == master_t0 && same_bits(params.download(), params_t0),
                      "d12 W=" + std::to_string(world) + ": tuning " + std::to_string(T) +
                          " gives tuning 0's master weights and params");
        } else if (T != demo::kTensorTuning) {
            ck.expect(master.download() == master_tc && same_bits(params.download(), params_tc),
                      "d12 W=" + std::to_string(world) + ": tuning " + std::to_string(T) + " gives tuning " +
                          std::to_string(demo::kTensorTuning) + "'s master weights and params");
        } else {  // the tensor-core decode: signs may differ only where the decoded value is within rounding of 0
            const std::vector<uint8_t> b = buckets.download();
            master_tc = master.download();
            params_tc = params.download();
            const cm::ApplyAgreement a = cm::compare_apply(pt, std::span(reinterpret_cast<const std::byte*>(b.data()), b.size()),
                                                           world, master_tc, master_t0);
            std::printf("  d12 W=%d tuning %d vs tuning 0: %s\n", world, T, a.describe().c_str());
            ck.expect(a.ok(), "d12 W=" + std::to_string(world) + ": tuning " + std::to_string(T) + " agrees with tuning 0");
        }
        const float ms = check::time_ms(env.stream, 10, [&] {
            demo::launch_apply<T>(kc, tables.view, buckets.data(), master.data(), params.data(), ap, 42, true, err.data(),
                                  env.stream);
        });
        char name[128];
        std::snprintf(name, sizeof name, "demo_apply d12 %s W=%d [tuning %d: %s]", label, world, T, demo::tuning_name(T));
        check::report_bandwidth(name, ms, demo::apply_dram_bytes(pt.plan, pt.bucket_bytes, world));
        ck.expect(err.download()[0] == 0, std::string(name) + ": no error flags");
    });
}

}  // namespace

int main() {
    return check::run_checker("demo_apply", [](CudaEnv& env, check::Checker& ck) {
        const auto fp32 = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32);
        const auto bf16 = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 1.0f, 5);
        const auto sign = cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 3);
        const std::vector<std::vector<size_t>> mixed = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {128, 192},
                                                        {67, 64}, {64, 67}, {67, 67}};  // primes: 1x64, 64x1, 1x1 chunks
        uint32_t seed = 1000;
        for (const auto& [label, cfg] : {std::pair{"fp32/smallest/k32", fp32}, std::pair{"bf16/packed12/k5", bf16},
                                         std::pair{"sign/smallest/k3", sign}})
            for (int world : {1, 3, 8}) check_case(env, ck, std::string("mixed awkward shapes ") + label, llmc::ParamLayout::of_shapes(mixed), cfg, world, seed += 10);
        check_case(env, ck, "d12 shapes (2 layers) fp32/smallest/k32", d12_layout(2), fp32, 3, seed += 10);
        check_case(env, ck, "d12 shapes (2 layers) sign/smallest/k3", d12_layout(2), sign, 8, seed += 10);
        check_corrupt(env, ck);
        time_d12(env, ck, fp32, 1, "fp32 k32");
        time_d12(env, ck, fp32, 8, "fp32 k32");
        time_d12(env, ck, bf16, 8, "bf16+packed12 k5");
    });
}
