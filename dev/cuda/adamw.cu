// Checker for llmc/optim/adamw/adamw.cuh: the AdamW kernel against km::adamw_update on the host (master weights and
// moments), the floatX parameters bit-exactly against kernel_math's round-to-nearest-even and stochastic
// rounding of the GPU's own master values, and the CudaAdamW optimizer against the CPU llmc::AdamW over a
// few steps (same gradient, clipping, decay groups), plus a state save/load round trip. Timing on a 124M
// buffer. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/optim/adamw/adamw.cuh"
#include "llmc/optim/adamw/adamw.h"

using namespace llmc;

static void check_kernel(CudaEnv& env, check::Checker& ck, bool stochastic) {
    const std::string label = stochastic ? "(stochastic)" : "(nearest)";
    const size_t n = 10000019, n1 = 6000000;
    auto master = check::random_floats(n, 0.05f, 61);
    const auto grads = check::random_floats(n, 0.01f, 62);
    auto m = check::random_floats(n, 0.001f, 63);
    auto v = check::random_floats(n, 1e-5f, 64);
    for (float& x : v) x = std::fabs(x);
    const uint32_t seed = 0x1234567u;
    const km::AdamWParams h1 = km::adamw_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, true, 7, 0.8f);
    const km::AdamWParams h2 = km::adamw_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, false, 7, 0.8f);

    auto d_master = check::to_device(master), d_grads = check::to_device(grads), d_m = check::to_device(m), d_v = check::to_device(v);
    DeviceBuffer<floatX> d_params(n);
    adamw_update(d_params.data(), d_master.data(), d_grads.data(), d_m.data(), d_v.data(), n1, h1, 0, seed, stochastic, env.stream);
    adamw_update(d_params.data() + n1, d_master.data() + n1, d_grads.data() + n1, d_m.data() + n1, d_v.data() + n1,
                 n - n1, h2, n1, seed, stochastic, env.stream);
    env.sync();
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) master[i] = km::adamw_update(master[i], grads[i], m[i], v[i], i < n1 ? h1 : h2);
    const auto g_master = check::from_device(d_master);
    ck.compare("master " + label, g_master, master, 1e-8f, 1e-6f);
    // m = b1 m + (1 - b1) g cancels where the two terms (~1e-3 here) nearly cancel: the GPU's fused multiply-add
    // and the host's rounding differ by a few ulps of the terms (ulp(1e-3) = 1.2e-10), not of the result.
    ck.compare("m " + label, check::from_device(d_m), m, 1e-9f, 1e-6f);
    ck.compare("v " + label, check::from_device(d_v), v, 1e-12f, 1e-6f);
    const auto params = d_params.download();
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t want = kFloatXIsFloat ? km::float_to_bits(g_master[i])
                              : stochastic   ? km::bf16_bits_stochastic(g_master[i], km::element_noise(i, seed))
                                             : km::bf16_bits_rne(g_master[i]);
        mismatches += storage_bits(params[i]) != want;
    }
    ck.expect(mismatches == 0, "params bit-exact rounding " + label + " (" + std::to_string(mismatches) + " off)");
}

static void check_optimizer(CudaEnv& env, check::Checker& ck) {
    ModelConfig mc;
    mc.max_seq_len = 64;
    mc.vocab_size = 100;
    mc.padded_vocab_size = 128;
    mc.num_layers = 2;
    mc.num_heads = 4;
    mc.channels = 64;
    const ParamLayout layout = ParamLayout::gpt2(mc);
    const size_t n = layout.num_params;
    OptimizerConfig oc;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 1.0f;
    LocalTransport cpu_transport, gpu_transport;
    AdamW cpu(oc, layout, cpu_transport);
    CudaAdamW gpu(oc, layout, gpu_transport, env.stream, false, 1337);
    auto p_cpu = check::random_floats(n, 0.02f, 71);
    auto d_init = check::to_device(p_cpu);
    DeviceBuffer<floatX> d_params(n);
    gpu.set_weights(d_init.data(), d_params.data());
    DeviceBuffer<float> d_grads(n);
    for (int step = 1; step <= 4; step++) {
        // step 2 gets a large gradient so clipping kicks in
        auto g = check::random_floats(n, step == 2 ? 1.0f : 0.001f, 80 + step);
        d_grads.upload(g);
        const float lr = 1e-3f * step;
        const StepResult rc = cpu.step(p_cpu, g, lr);
        const StepResult rg = gpu.step_completed(d_params.data(), d_grads.data(), lr);
        ck.expect(std::fabs(rc.grad_norm - rg.grad_norm) <= 1e-6 * rc.grad_norm,
                  "grad norm step " + std::to_string(step) + " (" + std::to_string(rg.grad_norm) + " vs " + std::to_string(rc.grad_norm) + ")");
    }
    std::vector<float> g_master(n);
    CUDA_CHECK(cudaMemcpy(g_master.data(), gpu.master_weights(), n * sizeof(float), cudaMemcpyDeviceToHost));
    ck.compare("CudaAdamW vs CPU AdamW master", g_master, p_cpu, 1e-7f, 1e-5f);
    ck.compare("params = round(master)", llmc::host_from_floatX(d_params.download()), round_to_floatX(g_master), 0.0f, 0.0f);

    ByteWriter w1;
    gpu.save_state(w1);
    ByteWriter w_cpu;
    cpu.save_state(w_cpu);
    ck.expect(w1.bytes().size() == w_cpu.bytes().size(), "state blob has the CPU AdamW layout");
    CudaAdamW gpu2(oc, layout, gpu_transport, env.stream, false, 1337);
    ByteReader r(w1.bytes(), "state");
    gpu2.load_state(r);
    ByteWriter w2;
    gpu2.save_state(w2);
    ck.expect(w1.bytes() == w2.bytes(), "state save/load round trip");
    // a CPU blob loads into the GPU optimizer
    CudaAdamW gpu3(oc, layout, gpu_transport, env.stream, false, 1337);
    ByteReader rc(w_cpu.bytes(), "cpu state");
    gpu3.load_state(rc);
    ck.expect(gpu3.steps_done() == 4, "CPU AdamW state loads");
}

int main() {
    return check::run_checker("adamw", [](CudaEnv& env, check::Checker& ck) {
        check_kernel(env, ck, false);
        check_kernel(env, ck, true);
        check_optimizer(env, ck);
        const size_t n = 124475904;
        DeviceBuffer<float> master(n), grads(n), m(n), v(n);
        DeviceBuffer<floatX> params(n);
        for (auto* b : {&master, &grads, &m, &v}) CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
        const km::AdamWParams h = km::adamw_params(6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, true, 1, 1.0f);
        const float ms = check::time_ms(env.stream, 10, [&] {
            adamw_update(params.data(), master.data(), grads.data(), m.data(), v.data(), n, h, 0, 42, true, env.stream);
        });
        check::report_bandwidth("adamw_update (124M, stochastic)", ms, double(n) * (7 * 4 + sizeof(floatX)));
    });
}
