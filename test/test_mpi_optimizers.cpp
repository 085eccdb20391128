// Run under mpirun -np N (test/test_mpi.sh). Each rank trains tensors of awkward shapes with its own
// pseudo-random gradients through the MPI transport; every rank also simulates all N ranks in one process
// (N optimizer instances, buckets concatenated by hand) and checks that the real run gives exactly the same
// parameters and momentum: DeMo bit-identical for every wire encoding, AdamW-DDP to float-summation-order
// tolerance. Also checks the byte counters against the bucket sizes. Built without MPI it skips.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "demo/demo_optimizer.h"
#include "llmc/adamw.h"
#include "llmc/rng.h"
#include "llmc/transport_mpi.h"
#include "test/testing.h"

using namespace llmc;

namespace {

std::unique_ptr<Transport> g_world;  // the test's one MPI world, created in main

ParamLayout awkward_layout() {
    const std::vector<std::vector<size_t>> shapes = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {64, 64}};
    ParamLayout layout;
    size_t offset = 0;
    for (size_t i = 0; i < shapes.size(); i++) {
        size_t numel = 1;
        for (size_t d : shapes[i]) numel *= d;
        layout.tensors.push_back({std::string("tensor_") += std::to_string(i), ParamKind::wte, -1, offset, numel, shapes[i]});
        offset += numel;
    }
    layout.num_params = offset;
    return layout;
}

std::vector<float> gradient(size_t n, int rank, int step) {
    Rng rng(1000003ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(step));
    std::vector<float> g(n);
    for (float& x : g) x = static_cast<float>(rng.normal()) * (rank + 1);
    return g;
}

std::vector<float> initial_params(size_t n) {
    Rng rng(7);
    std::vector<float> p(n);
    for (float& x : p) x = static_cast<float>(rng.normal() * 0.02);
    return p;
}

// A transport that refuses to communicate: the simulated ranks only use compress()/apply().
class NoTransport final : public Transport {
public:
    std::string_view name() const override { return "none"; }
    int rank() const override { return 0; }
    int world_size() const override { return 1; }
    void allreduce_mean(std::span<float>) override { fail("simulation must not communicate"); }
    void allgather_bytes(std::span<const std::byte>, std::vector<std::byte>&, std::vector<size_t>&) override {
        fail("simulation must not communicate");
    }
    void allreduce_sum(std::span<double>) override {}
    void allreduce_max(std::span<double>) override {}
    void broadcast(std::span<std::byte>, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override { std::exit(code); }
};

void run_demo_case(const OptimizerConfig& cfg, const char* label) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    const int steps = 5;
    const float lr = 0.01f;

    demo::DemoOptimizer real(cfg, layout, world);
    std::vector<float> params = initial_params(layout.num_params);
    uint64_t expected_payload = 0;
    for (int s = 0; s < steps; s++) {
        std::vector<float> g = gradient(layout.num_params, me, s);
        world.reset_counters();
        real.step(params, g, lr);
        expected_payload = real.bucket_bytes();
        EXPECT_EQ(world.counters().payload_bytes, expected_payload);
        if (W > 1) EXPECT_EQ(world.counters().bytes_recv, expected_payload * (W - 1));  // equal bucket sizes
    }

    NoTransport none;
    std::vector<std::unique_ptr<demo::DemoOptimizer>> sims;
    std::vector<std::vector<float>> sim_params(W, initial_params(layout.num_params));
    for (int r = 0; r < W; r++) sims.push_back(std::make_unique<demo::DemoOptimizer>(cfg, layout, none));
    for (int s = 0; s < steps; s++) {
        std::vector<std::byte> all;
        std::vector<size_t> offsets = {0};
        for (int r = 0; r < W; r++) {
            std::vector<float> g = gradient(layout.num_params, r, s);
            clip_grad_norm(g, cfg.grad_clip);
            std::vector<std::byte> bucket;
            StepTimings t;
            sims[r]->compress(sim_params[r], g, lr, bucket, t);
            all.insert(all.end(), bucket.begin(), bucket.end());
            offsets.push_back(all.size());
        }
        for (int r = 0; r < W; r++) {
            StepTimings t;
            sims[r]->apply(all, offsets, sim_params[r], lr, t);
        }
    }
    size_t param_mismatch = 0, momentum_mismatch = 0;
    for (size_t i = 0; i < params.size(); i++) {
        param_mismatch += params[i] != sim_params[me][i];
        momentum_mismatch += real.momentum()[i] != sims[me]->momentum()[i];
    }
    if (param_mismatch || momentum_mismatch)
        std::fprintf(stderr, "  %s rank %d: %zu params and %zu momentum entries differ from the simulation\n", label,
                     me, param_mismatch, momentum_mismatch);
    EXPECT_EQ(param_mismatch, size_t{0});
    EXPECT_EQ(momentum_mismatch, size_t{0});
    // All ranks hold the same parameters after every step.
    std::vector<double> sum = {0.0};
    for (float p : params) sum[0] += p;
    std::vector<double> max = sum;
    world.allreduce_max(max);
    EXPECT_EQ(max[0], sum[0]);
}

}  // namespace

TEST(demo_mpi_equals_simulation_every_encoding) {
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1f;
    for (auto values : {DemoValueEncoding::fp32, DemoValueEncoding::bf16, DemoValueEncoding::sign})
        for (auto indices : {DemoIndexEncoding::smallest, DemoIndexEncoding::packed12}) {
            cfg.demo.values = values;
            cfg.demo.indices = indices;
            cfg.demo.topk = 8;
            run_demo_case(cfg, "encoding");
        }
}

TEST(demo_mpi_equals_simulation_options) {
    OptimizerConfig cfg;
    cfg.demo.momentum = DemoMomentum::ema;
    cfg.demo.feedback_alpha = 0.2f;
    cfg.demo.topk = 32;
    cfg.decay_groups = DecayGroups::all;
    cfg.weight_decay = 0.01f;
    cfg.grad_clip = 0.5f;
    run_demo_case(cfg, "options");
}

TEST(adamw_ddp_averages_gradients) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    OptimizerConfig cfg;
    AdamW real(cfg, layout, world);
    NoTransport none;
    AdamW sim(cfg, layout, none);
    // The simulated DDP step: average the ranks' gradients by hand, then an AdamW on one "rank" without
    // communication. A LocalTransport would make allreduce_mean the identity, which is what we want here.
    LocalTransport local;
    AdamW single(cfg, layout, local);
    std::vector<float> p_real = initial_params(layout.num_params), p_sim = p_real;
    for (int s = 0; s < 4; s++) {
        std::vector<float> g = gradient(layout.num_params, me, s);
        world.reset_counters();
        real.step(p_real, g, 1e-3f);
        const uint64_t n_bytes = layout.num_params * sizeof(float);
        EXPECT_EQ(world.counters().payload_bytes, n_bytes);
        EXPECT_EQ(world.counters().bytes_sent, W > 1 ? 2 * (W - 1) * n_bytes / W : 0);
        std::vector<float> mean(layout.num_params, 0.0f);
        for (int r = 0; r < W; r++) {
            const std::vector<float> gr = gradient(layout.num_params, r, s);
            for (size_t i = 0; i < mean.size(); i++) mean[i] += gr[i];
        }
        for (float& x : mean) x /= static_cast<float>(W);
        single.step(p_sim, mean, 1e-3f);
    }
    // MPI may sum the ranks in another order; after 4 Adam steps of size ~lr the parameters agree to well
    // below lr (each element moves by at most ~lr per step, rounding differences are ~1e-7 relative).
    double max_diff = 0.0;
    for (size_t i = 0; i < p_real.size(); i++) max_diff = std::max(max_diff, double(std::fabs(p_real[i] - p_sim[i])));
    EXPECT(max_diff < 1e-5);
    (void)sim;
}

TEST(bf16_allreduce_is_mean_within_bf16_rounding) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const size_t n = 10000;
    std::vector<std::vector<float>> all;
    for (int r = 0; r < W; r++) all.push_back(gradient(n, r, 99));
    std::vector<float> mine = all[me];
    world.reset_counters();
    world.allreduce_mean_bf16(mine);
    EXPECT_EQ(world.counters().payload_bytes, uint64_t{n * 2});
    EXPECT_EQ(world.counters().bytes_sent, W > 1 ? 2 * (W - 1) * (n * 2) / W : 0);
    // Each of the W inputs and W-1 partial sums is rounded once to bf16 (relative error <= 2^-9) and none
    // exceeds S = sum_r |g_r|, so |sum error| <= (2W-1) 2^-9 S and the mean's error <= 2 * 2^-9 * S.
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double exact = 0.0, S = 0.0;
        for (int r = 0; r < W; r++) exact += all[r][i], S += std::fabs(all[r][i]);
        exact /= W;
        if (W == 1 ? mine[i] != all[0][i] : std::fabs(mine[i] - exact) > 2.0 * std::ldexp(S, -9) + 1e-30) bad++;
    }
    EXPECT_EQ(bad, size_t{0});
}

int main(int argc, char** argv) {
#ifndef LLMC_USE_MPI
    testing::skip("built without MPI (USE_MPI=0)");
#endif
    g_world = make_world_transport(&argc, &argv);
    if (g_world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const int rc = testing::run_all();
    std::vector<double> failed = {static_cast<double>(rc)};
    g_world->allreduce_max(failed);
    g_world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
