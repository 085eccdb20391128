// End-to-end GPU test of --optimizer demo: 10 steps of the CUDA GPT-2 + CudaDemo (llmc/optim/demo/demo_cuda.cuh) against
// 10 steps of ModelCpu + the CPU DemoOptimizer, from the same fp32 checkpoint on the same batch (the tiny
// reference model of dev/reference/gpt2_reference.py), one rank, lr 1e-3, weight decay 0.1, clip 1.0, DeMo
// defaults (topk 32, chunk 64, decay 0.999, fp32 values). Compares the loss before every step and the loss
// drop over the run; also checks that two GPU runs are bit-identical, and that the state blob moves between
// CudaDemo and DemoOptimizer unchanged (with --demo_momentum_domain dct, whose momentum the GPU keeps in the DCT
// domain: that DemoOptimizer reads it as cm::convert_momentum's spatial momentum, and CudaDemo reads the CPU's blob
// back to within rounding of the CPU's momentum). The same with --demo_delay 1 (each step's update applied at the
// next step), with eager updates (the default: each rank's working weights take its own share of the round at
// once) and without (stale): 10 (stale: 5) delayed GPU steps against delayed CPU steps, eager differing from stale
// and (one rank: the own share is the whole round) giving the undelayed run's losses, the NCCL path's split
// exchange against the host path's, the state blob with its pending round (this rank's bucket and lr) moving
// both ways, and set_weights rewriting the working weights from a blob's pending round as the run left them.
// Tolerances: the fp32 build (-DENABLE_FP32) is tight (GPU and CPU gradients differ by summation order only;
// measured on the CPU, 1e-6 relative gradient noise moves the 10-step losses by < 4e-5 and 1e-2 noise by
// < 4e-3); the bf16 build is loose (bf16 activations: the step-0 loss alone differs by up to 2e-2).
//
//   /usr/bin/python3 dev/reference/gpt2_reference.py --config tiny --batch 4 --seq 32 --out-dir build/reference/tiny
//   build/cuda/gpu_test_demo [reference dir, default build/reference/tiny]
// Exit 0 pass, 1 fail, 77 skipped (no GPU, or no reference files).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "llmc/optim/demo/demo_cuda.cuh"
#include "llmc/optim/demo/demo_optimizer.h"
#include "test/support/demo_agreement.h"
#include "test/support/demo_host_reference.h"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/base/fileio.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_cuda.cuh"
#include "llmc/model/model_io.h"
#include "llmc/comm/transport.h"
#include "test/support/kernel_flags.h"
#include "test/support/torch_reference.h"

using namespace llmc;

namespace {

using Batch = torch_reference::State;  // the reference batch (the rest of the state is unused here)
using torch_reference::rel_l2;

constexpr int kSteps = 10;
constexpr int kStaleSteps = 5;  // the stale delayed GPU run's (the CPU's has kSteps): the emulated device is slow
constexpr float kLr = 1e-3f;

// eager: --demo_delay 1's eager updates (DemoConfig::eager; only meaningful with delay 1)
// The kernel switches given on the command line (--demo_momentum_domain dct ...): every CudaDemo of the test runs them.
testing::KernelFlags g_kernels;

OptimizerConfig demo_config(int delay = 0, bool eager = true) {
    OptimizerConfig oc;
    oc.demo = g_kernels.demo;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 1.0f;
    oc.demo.delay = delay;
    oc.demo.eager = eager;
    return oc;  // DeMo defaults
}

struct GpuRun {
    std::vector<float> losses, norms, master, momentum;  // momentum: spatial (converted from the DCT domain)
    std::vector<floatX> params;                          // the working weights after the run
    llmc::LargeVector<std::byte> state;
    double transform = 0, exchange = 0, apply = 0;
    bool pending = false;  // a round compressed and not applied (--demo_delay 1)
};

// transport: LocalTransport (buckets through host memory, the non-NCCL path) or a one-rank NcclTransport
// (buckets stay on the device: allgather_device).
GpuRun run_gpu(CudaEnv& env, const ModelConfig& mc, const std::vector<float>& weights, const Batch& b, int steps,
               Transport& transport, int delay = 0, bool eager = true) {
    const ParamLayout layout = ParamLayout::gpt2(mc);
    ModelCuda model(mc, b.B, b.T, env, g_kernels.cuda);
    demo::CudaDemo opt(demo_config(delay, eager), layout, transport, env.stream, /*stochastic_rounding=*/false, 1337);
    CUDA_CHECK(cudaMemcpy(model.grads(), weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    opt.set_weights(model.grads(), model.params());
    GpuRun r;
    for (int s = 0; s < steps; s++) {
        model.zero_grad();
        r.losses.push_back(model.forward_backward(b.inputs.data(), b.targets.data(), b.B, b.T, 1.0f));
        const StepResult res = opt.step_completed(model.params(), model.grads(), kLr);
        model.zero_padded_vocab_rows(opt.master_weights());
        r.norms.push_back(float(res.grad_norm));
        r.transform += res.seconds.transform;
        r.exchange += res.seconds.exchange;
        r.apply += res.seconds.apply;
    }
    env.sync();
    r.master.resize(layout.num_params);
    r.momentum.resize(layout.num_params);
    r.params.resize(layout.num_params);
    CUDA_CHECK(cudaMemcpy(r.master.data(), opt.master_weights(), r.master.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(r.params.data(), model.params(), r.params.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(r.momentum.data(), opt.momentum(), r.momentum.size() * sizeof(float), cudaMemcpyDeviceToHost));
    demo::cm::convert_momentum(opt.plan(), r.momentum, opt.momentum_domain(), demo::cm::MomentumDomain::spatial);
    ByteWriter w;
    opt.save_state(w);
    r.state = std::move(w.bytes());
    r.pending = opt.has_pending_round();
    return r;
}

// 10 steps of ModelCpu + DemoOptimizer (the trainer's order: set_weights before the first step, the forward on
// the working weights, the padded vocabulary rows zeroed in them and in the shared weights after each step).
struct CpuRun {
    std::vector<float> losses, norms, params, momentum;  // params: the shared weights (master_weights)
    llmc::LargeVector<std::byte> state;
};
CpuRun run_cpu(const ModelConfig& mc, const std::vector<float>& weights, const Batch& b, int delay, bool eager = true) {
    const ParamLayout layout = ParamLayout::gpt2(mc);
    ModelCpu cpu(mc);
    std::copy(weights.begin(), weights.end(), cpu.params().begin());
    LocalTransport transport;
    demo::DemoOptimizer opt(demo_config(delay, eager), layout, transport);
    opt.set_weights(cpu.params());
    CpuRun r;
    for (int s = 0; s < kSteps; s++) {
        cpu.zero_grad();
        r.losses.push_back(cpu.forward(b.inputs.data(), b.targets.data(), b.B, b.T));
        cpu.backward(1.0f);
        r.norms.push_back(float(opt.step(cpu.params(), cpu.grads(), kLr).grad_norm));
        cpu.zero_padded_vocab_rows(opt.master_weights(cpu.params()));
    }
    const std::span<float> shared = opt.master_weights(cpu.params());
    r.params.assign(shared.begin(), shared.end());
    r.momentum.assign(opt.momentum().begin(), opt.momentum().end());
    ByteWriter w;
    opt.save_state(w);
    r.state = std::move(w.bytes());
    return r;
}

// Per-step losses (the GPU run's steps) within `tol` of the CPU's (printed, with the largest difference).
bool losses_match(const GpuRun& gpu, const std::vector<float>& cpu_losses, const std::vector<float>& cpu_norms,
                  double tol) {
    if (gpu.losses.size() > cpu_losses.size()) return false;
    bool ok = true;
    double worst = 0.0;
    for (size_t s = 0; s < gpu.losses.size(); s++) {
        const double d = std::fabs(double(gpu.losses[s]) - cpu_losses[s]);
        std::printf("  step %zu: loss %.6f (CPU %.6f, diff %.2e)  grad norm %.5f (CPU %.5f)\n", s, gpu.losses[s],
                    cpu_losses[s], d, gpu.norms[s], cpu_norms[s]);
        ok &= d <= tol;
        worst = std::max(worst, d);
    }
    std::printf("  largest loss difference GPU vs CPU: %.3e\n", worst);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    skip_without_cuda_device();
    g_kernels = testing::take_kernel_flags(argc, argv);
    const std::string dir = argc > 1 ? argv[1] : "build/reference/tiny";
    if (!torch_reference::present(dir)) return 77;
    const std::string model_file = dir + "/model.bin", state_file = dir + "/state.bin";
    torch_reference::Checks checks(64);
    const double tol_loss = kFloatXIsFloat ? 2e-3 : 5e-2;  // absolute, per step, on losses of ~10.8
    const double tol_drop = kFloatXIsFloat ? 0.02 : 0.10;  // relative, loss drop over the run
    try {
        CudaEnv env;
        const ModelConfig mc = read_model_config(model_file);
        const ParamLayout layout = ParamLayout::gpt2(mc);
        std::vector<float> weights(layout.num_params);
        load_model(model_file, mc, weights);
        const Batch batch = torch_reference::read_state(state_file, layout.num_params);
        std::printf("gpu_test_demo on %s, floatX = %s: %s, B=%d T=%d, %d DeMo steps at lr %g\n", env.describe().c_str(),
                    kFloatXName, mc.describe().c_str(), batch.B, batch.T, kSteps, kLr);

        // CPU: ModelCpu + DemoOptimizer
        const CpuRun cpu = run_cpu(mc, weights, batch, 0);
        const std::vector<float>& cpu_losses = cpu.losses;
        const std::vector<float>& cpu_norms = cpu.norms;
        LocalTransport cpu_transport;  // for the optimizers that only load and save state

        // GPU: ModelCuda + CudaDemo, twice
        LocalTransport host_path;
        const GpuRun gpu = run_gpu(env, mc, weights, batch, kSteps, host_path);
        checks.expect(losses_match(gpu, cpu_losses, cpu_norms, tol_loss),
                      "losses match the CPU DemoOptimizer run (tol " + std::to_string(tol_loss) + ")");
        const double drop_cpu = cpu_losses.front() - cpu_losses.back(), drop_gpu = gpu.losses.front() - gpu.losses.back();
        std::printf("  loss drop over %d steps: GPU %.5f, CPU %.5f\n", kSteps, drop_gpu, drop_cpu);
        checks.expect(drop_cpu > 0.1, "the CPU run's loss decreases (sanity)");
        checks.expect(std::fabs(drop_gpu - drop_cpu) <= tol_drop * drop_cpu, "loss drop matches (rel tol " + std::to_string(tol_drop) + ")");
        std::printf("  after %d steps: master weights rel L2 diff %.3e, momentum rel L2 diff %.3e\n", kSteps,
                    rel_l2(gpu.master, cpu.params), rel_l2(gpu.momentum, cpu.momentum));
        std::printf("  GPU optimizer time over %d steps: compress %.3f ms, exchange %.3f ms, apply %.3f ms\n", kSteps,
                    gpu.transform * 1e3, gpu.exchange * 1e3, gpu.apply * 1e3);

        const GpuRun again = run_gpu(env, mc, weights, batch, 3, host_path);
        checks.expect(std::memcmp(again.losses.data(), gpu.losses.data(), 3 * sizeof(float)) == 0,
               "GPU run is deterministic (first 3 losses bit-identical)");
        LocalTransport world_of_one;
        NcclTransport nccl(world_of_one, env.stream, /*nccl_for_one_rank=*/true);
        const GpuRun via_nccl = run_gpu(env, mc, weights, batch, 3, nccl);
        checks.expect(std::memcmp(via_nccl.losses.data(), gpu.losses.data(), 3 * sizeof(float)) == 0 &&
                   std::memcmp(via_nccl.state.data(), again.state.data(), again.state.size()) == 0,
               "NCCL device exchange (allgather_device) gives the same run");
        checks.expect(nccl.counters().size_exchanges == (nccl.uses_nccl() ? 1u : 0u),
                      "NCCL device exchange: the sizes are exchanged at the first step only (then ncclAllGather)");

        // state blob: GPU -> CPU -> GPU, unchanged (the DCT-domain momentum: converted, to rounding on the way back)
        demo::DemoOptimizer cpu2(demo_config(), layout, cpu_transport);
        ByteReader r1(gpu.state, "gpu state");
        cpu2.load_state(r1);
        ByteWriter w2;
        cpu2.save_state(w2);
        demo::CudaDemo gpu2(demo_config(), layout, cpu_transport, env.stream, false, 1337);
        ByteReader r2(w2.bytes(), "cpu state");
        gpu2.load_state(r2);
        ByteWriter w3;
        gpu2.save_state(w3);
        if (gpu2.momentum_domain() == demo::cm::MomentumDomain::spatial) {
            checks.expect(w2.bytes() == gpu.state, "GPU state blob loads into DemoOptimizer and saves back identically");
            checks.expect(w3.bytes() == gpu.state, "the CPU blob loads into CudaDemo and saves back identically");
        } else {
            const std::vector<float> cpu2_momentum(cpu2.momentum().begin(), cpu2.momentum().end());
            checks.expect(cpu2_momentum == gpu.momentum,
                          "GPU state blob (DCT domain) loads into DemoOptimizer as the converted momentum, bit for bit");
            checks.expect(w3.bytes() != w2.bytes() && w3.bytes().size() == gpu.state.size(),
                          "CudaDemo saves the CPU's blob back in its own domain");
            demo::DemoOptimizer cpu3(demo_config(), layout, cpu_transport);
            ByteReader r3(w3.bytes(), "gpu state, second");
            cpu3.load_state(r3);
            const std::vector<float> back(cpu3.momentum().begin(), cpu3.momentum().end());
            const double round_trip = rel_l2(back, cpu2_momentum);
            std::printf("  momentum through CudaDemo's DCT domain and back: rel L2 diff %.3e\n", round_trip);
            checks.expect(round_trip < 1e-6, "the CPU blob loads into CudaDemo and saves back to within 1e-6 (rel L2)");
        }

        // --demo_delay 1 on both optimizers, eager (the default) and stale (demo.eager false): the same training
        // (the first step applies nothing, the last round stays pending), the NCCL split exchange
        // (allgather_device_start / _finish) giving the host path's bits, and the state blob with its pending round
        // moving between the optimizers unchanged.
        const CpuRun cpu_d = run_cpu(mc, weights, batch, 1);
        const CpuRun cpu_s = run_cpu(mc, weights, batch, 1, /*eager=*/false);
        const llmc::LargeVector<std::byte>& cpu_d_state = cpu_d.state;
        std::printf("  --demo_delay 1, eager updates:\n");
        const GpuRun delayed = run_gpu(env, mc, weights, batch, kSteps, host_path, 1);
        checks.expect(losses_match(delayed, cpu_d.losses, cpu_d.norms, tol_loss),
                      "--demo_delay 1, eager: losses match the CPU run (tol " + std::to_string(tol_loss) + ")");
        std::printf("  --demo_delay 1, stale (demo.eager false), %d steps:\n", kStaleSteps);
        const GpuRun stale = run_gpu(env, mc, weights, batch, kStaleSteps, host_path, 1, /*eager=*/false);
        checks.expect(losses_match(stale, cpu_s.losses, cpu_s.norms, tol_loss),
                      "--demo_delay 1, stale: losses match the CPU run (tol " + std::to_string(tol_loss) + ")");
        for (const auto& [what, gpu_run, cpu_run] : {std::tuple{"eager", &delayed, &cpu_d}, std::tuple{"stale", &stale, &cpu_s}}) {
            const size_t last = gpu_run->losses.size() - 1;
            const double drop_c = cpu_run->losses.front() - cpu_run->losses[last];
            const double drop_g = gpu_run->losses.front() - gpu_run->losses[last];
            std::printf("  --demo_delay 1, %s: loss drop over %zu steps: GPU %.5f, CPU %.5f\n", what, last + 1, drop_g, drop_c);
            checks.expect(drop_c > 0.1, std::string("--demo_delay 1, ") + what + ": the CPU run's loss decreases (sanity)");
            checks.expect(std::fabs(drop_g - drop_c) <= tol_drop * drop_c,
                          std::string("--demo_delay 1, ") + what + ": loss drop matches");
            checks.expect(gpu_run->pending, std::string("--demo_delay 1, ") + what + ": the last round is pending after the run");
        }
        checks.expect(cpu_s.losses[1] != cpu_losses[1],
                      "--demo_delay 1, stale: the CPU run differs from the undelayed one at step 1");
        bool eager_differs = true;
        for (int s = 1; s < kSteps; s++)
            eager_differs &= cpu_d.losses[s] != cpu_s.losses[s] && (s >= kStaleSteps || delayed.losses[s] != stale.losses[s]);
        checks.expect(cpu_d.losses[0] == cpu_s.losses[0] && eager_differs,
                      "--demo_delay 1: eager and stale losses differ at every step from step 1 on (CPU and GPU)");
        // one rank: the own share is the whole round, so the working weights are the undelayed run's
        checks.expect(cpu_d.losses == cpu_losses && delayed.losses == gpu.losses,
                      "--demo_delay 1, eager, one rank: the undelayed run's losses, bit for bit (CPU and GPU)");
        const GpuRun d_host = run_gpu(env, mc, weights, batch, 3, host_path, 1);
        const GpuRun d_nccl = run_gpu(env, mc, weights, batch, 3, nccl, 1);
        checks.expect(std::memcmp(d_host.losses.data(), delayed.losses.data(), 3 * sizeof(float)) == 0 &&
                          std::memcmp(d_nccl.losses.data(), d_host.losses.data(), 3 * sizeof(float)) == 0 &&
                          d_nccl.state == d_host.state && d_nccl.params == d_host.params,
                      "--demo_delay 1: NCCL split exchange (allgather_device_start / _finish) gives the host path's run");

        // set_weights with a pending round (a resume): the blob and the shared weights give back the working
        // weights the run left, on the GPU bit for bit and (fp32) the CPU optimizer's
        {
            ModelCuda model(mc, batch.B, batch.T, env, g_kernels.cuda);
            demo::CudaDemo gpu_r(demo_config(1), layout, cpu_transport, env.stream, false, 1337);
            ByteReader rr(delayed.state, "gpu state (delayed, eager)");
            gpu_r.load_state(rr);
            gpu_r.set_steps_done(kSteps);
            CUDA_CHECK(cudaMemcpy(model.grads(), delayed.master.data(), delayed.master.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
            gpu_r.set_weights(model.grads(), model.params());
            model.zero_padded_vocab_rows(gpu_r.master_weights());
            env.sync();
            std::vector<floatX> back(layout.num_params);
            CUDA_CHECK(cudaMemcpy(back.data(), model.params(), back.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
            size_t differ = 0;
            for (size_t i = 0; i < back.size(); i++) differ += storage_bits(back[i]) != storage_bits(delayed.params[i]);
            checks.expect(differ == 0, "--demo_delay 1, eager: set_weights with the blob's pending round gives the "
                                       "run's working weights (" + std::to_string(differ) + " differ)");

            demo::DemoOptimizer cpu_r(demo_config(1), layout, cpu_transport);
            ByteReader rc(delayed.state, "gpu state (delayed, eager), CPU");
            cpu_r.load_state(rc);
            std::vector<float> working = delayed.master;
            cpu_r.set_weights(working);
            ModelCpu cpu_model(mc);
            std::copy(working.begin(), working.end(), cpu_model.params().begin());
            cpu_model.zero_padded_vocab_rows();
            size_t cpu_differ = 0, changed = 0;
            for (size_t i = 0; i < back.size(); i++) {
                cpu_differ += storage_bits(host_to_floatX(cpu_model.params()[i])) != storage_bits(back[i]);
                changed += cpu_model.params()[i] != delayed.master[i];
            }
            std::printf("  --demo_delay 1, eager: the pending round's own share changes %zu of %zu weights; GPU vs CPU "
                        "working weights: %zu differ\n", changed, back.size(), cpu_differ);
            // cm::ApplyAgreement's allowance: the CPU decode sums in another order, so a decoded value within
            // rounding of 0 may take the other sign
            checks.expect(changed > 0 && cpu_differ <= back.size() / 1000 + 2,
                          "--demo_delay 1, eager: the CPU optimizer's set_weights gives the same working weights");

            // finish_updates after the last step (here on the resumed optimizers: the pending round's exchange
            // starts from the blob): the round applied with its lr. One rank, eager: its own share was the whole
            // round, so the weights are the undelayed run's after kSteps steps, bit for bit; the CPU optimizer
            // finishing the same blob gives the same weights (the allowance of set_weights' check above)
            StepResult finished;
            gpu_r.finish_updates(model.params(), finished);
            model.zero_padded_vocab_rows(gpu_r.master_weights());
            env.sync();
            std::vector<float> final_master(layout.num_params);
            std::vector<floatX> final_params(layout.num_params);
            CUDA_CHECK(cudaMemcpy(final_master.data(), gpu_r.master_weights(), final_master.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(final_params.data(), model.params(), final_params.size() * sizeof(floatX),
                                  cudaMemcpyDeviceToHost));
            size_t params_differ = 0;
            for (size_t i = 0; i < final_params.size(); i++)
                params_differ += storage_bits(final_params[i]) != storage_bits(gpu.params[i]);
            checks.expect(!gpu_r.has_pending_round() && final_master == gpu.master && params_differ == 0 &&
                              final_master != delayed.master,
                          "--demo_delay 1, eager, one rank: finish_updates leaves the undelayed run's final master "
                          "weights and floatX copy on the GPU (" + std::to_string(params_differ) + " differ)");
            cpu_r.finish_updates(working, finished);
            std::copy(working.begin(), working.end(), cpu_model.params().begin());
            cpu_model.zero_padded_vocab_rows();
            size_t finish_differ = 0;
            for (size_t i = 0; i < final_master.size(); i++) finish_differ += cpu_model.params()[i] != final_master[i];
            checks.expect(finish_differ <= final_master.size() / 1000 + 2,
                          "--demo_delay 1, eager: the CPU optimizer's finish_updates gives the GPU's final weights (" +
                              std::to_string(finish_differ) + " differ)");
        }

        // the pending round is the blob's tail: flag, lr, this rank's bucket
        const size_t tail = 1 + sizeof(float) + demo::cm::plan_tables(demo_config(1), layout).bucket_bytes;
        auto same_tail = [&](const llmc::LargeVector<std::byte>& a, const llmc::LargeVector<std::byte>& b) {
            return a.size() == b.size() && a.size() > tail && std::equal(a.end() - tail, a.end(), b.end() - tail);
        };
        const bool spatial = gpu2.momentum_domain() == demo::cm::MomentumDomain::spatial;
        {  // GPU -> CPU -> GPU
            demo::DemoOptimizer cpu_load(demo_config(1), layout, cpu_transport);
            ByteReader ra(delayed.state, "gpu state (delayed)");
            cpu_load.load_state(ra);
            ByteWriter wa;
            cpu_load.save_state(wa);
            demo::CudaDemo gpu_d(demo_config(1), layout, cpu_transport, env.stream, false, 1337);
            ByteReader rb(wa.bytes(), "cpu state (delayed)");
            gpu_d.load_state(rb);
            ByteWriter wb;
            gpu_d.save_state(wb);
            checks.expect(gpu_d.has_pending_round() && (spatial ? wa.bytes() == delayed.state && wb.bytes() == delayed.state
                                                                : same_tail(wa.bytes(), delayed.state) && same_tail(wb.bytes(), delayed.state)),
                          std::string("--demo_delay 1: the GPU blob's pending round goes through DemoOptimizer and back ") +
                              (spatial ? "(blobs identical)" : "(pending round identical)"));
        }
        {  // CPU -> GPU
            demo::CudaDemo gpu_d(demo_config(1), layout, cpu_transport, env.stream, false, 1337);
            ByteReader rc(cpu_d_state, "cpu state (delayed, 10 steps)");
            gpu_d.load_state(rc);
            ByteWriter wc;
            gpu_d.save_state(wc);
            checks.expect(gpu_d.has_pending_round() && (spatial ? wc.bytes() == cpu_d_state : same_tail(wc.bytes(), cpu_d_state)),
                          std::string("--demo_delay 1: the CPU blob's pending round loads into CudaDemo and saves back ") +
                              (spatial ? "(blob identical)" : "(pending round identical)"));
        }
        {  // an undelayed CudaDemo refuses a pending round
            demo::CudaDemo gpu_0(demo_config(0), layout, cpu_transport, env.stream, false, 1337);
            ByteReader rd(cpu_d_state, "cpu state (delayed)");
            std::string what;
            try {
                gpu_0.load_state(rd);
            } catch (const std::exception& e) {
                what = e.what();
            }
            checks.expect(what.find("resume with --demo_delay 1") != std::string::npos,
                          "a pending round is refused with --demo_delay 0: " + what);
        }
    } catch (const std::exception& e) {
        std::printf("error: %s\n", e.what());
        checks.fail();
    }
    return checks.finish();
}
