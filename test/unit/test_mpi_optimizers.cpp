// Run under mpirun -np N (test/e2e/test_mpi.sh). Each rank trains tensors of awkward shapes with its own
// pseudo-random gradients through the MPI transport; every rank also simulates all N ranks in one process
// (N optimizer instances, buckets concatenated by hand) and checks that the real run gives exactly the same
// parameters and momentum, bit for bit: DeMo for every wire encoding, AdamW-DDP (the transport sums in rank
// order). Also checks the byte counters against the bucket sizes. Built without MPI it skips.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/adamw/adamw.h"
#include "llmc/base/kernel_math.h"
#include "llmc/base/rng.h"
#include "llmc/run/batch_agreement.h"
#include "llmc/comm/transport_mpi.h"
#include "test/support/demo_simulation.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

std::unique_ptr<Transport> g_world;  // the test's one MPI world, created in main

ParamLayout awkward_layout() {
    return testing::layout_of_shapes({{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {64, 64}});
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
    void allgather_bytes(std::span<const std::byte>, std::vector<std::byte>&, std::vector<size_t>&, GatherSizes) override {
        fail("simulation must not communicate");
    }
    void allreduce_sum(std::span<double>) override {}
    void allreduce_max(std::span<double>) override {}
    void allreduce_or(std::span<uint64_t>) override {}
    void broadcast(std::span<std::byte>, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override { std::exit(code); }
};

// One DeMo run of `steps` steps through the real step() on the MPI world, checked bit for bit against every
// rank simulated here (test/support/demo_simulation.h). With cfg.demo.delay == 1 the simulation follows the delayed
// order (step s applies round s-1 with its lr, then compresses), and after the last step finish_updates()
// applies the round still in flight, as the simulation's side does, so the last round's content is checked too.
// With eager updates too, step() leaves this rank's working weights in params: they must be the simulation's,
// and the shared weights (master_weights) the ones compared after that final apply, which params then equal.
// Returns the byte counters summed over the steps (`over_steps`) and with that final finish (`total`).
struct RunCounters {
    CommCounters over_steps, total;
};

void add_bytes(CommCounters& sum, const CommCounters& c) {
    sum.bytes_sent += c.bytes_sent;
    sum.bytes_recv += c.bytes_recv;
    sum.payload_bytes += c.payload_bytes;
    sum.size_exchanges += c.size_exchanges;
}

RunCounters run_demo_case(const OptimizerConfig& cfg, const char* label) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    const int steps = 5;
    const float lrs[steps] = {0.01f, 0.02f, 0.005f, 0.01f, 0.03f};  // varied: each round must use its own lr
    const bool delayed = cfg.demo.delay == 1, eager = delayed && cfg.demo.eager;

    demo::DemoOptimizer real(cfg, layout, world);
    std::vector<float> params = initial_params(layout.num_params);
    real.set_weights(params);
    const uint64_t bucket = real.bucket_bytes();
    RunCounters counted;
    for (int s = 0; s < steps; s++) {
        std::vector<float> g = gradient(layout.num_params, me, s);
        world.reset_counters();
        real.step(params, g, lrs[s]);
        EXPECT_EQ(world.counters().payload_bytes, bucket);
        // delayed: step s receives round s-1 (its payload was counted when it started), nothing at the first
        const uint64_t rounds_received = delayed && s == 0 ? 0 : 1;
        EXPECT_EQ(world.counters().bytes_recv, rounds_received * bucket * (W - 1));  // equal bucket sizes
        EXPECT_EQ(world.counters().bytes_sent, rounds_received * bucket * (W - 1));
        add_bytes(counted.over_steps, world.counters());
        if (delayed) {
            // the trainer's loss reduction, on MPI_COMM_WORLD while the round travels on the helper thread
            EXPECT(world.allgather_in_flight());
            std::vector<double> loss = {static_cast<double>(me + 1)};
            world.allreduce_sum(loss);
            EXPECT_EQ(loss[0], W * (W + 1) / 2.0);
        }
    }
    // the first round exchanges the bucket sizes; the later ones know them (GatherSizes::equal)
    EXPECT_EQ(counted.over_steps.size_exchanges, uint64_t{W > 1 ? 1u : 0u});
    counted.total = counted.over_steps;
    const std::vector<float> working = params;
    const std::span<float> shared = real.master_weights(params);
    EXPECT(eager == (shared.data() != params.data()));
    // what the trainers do after the last step: the round in flight is finished and applied (nothing when
    // undelayed), and finishing again does nothing
    for (int call = 0; call < 2; call++) {
        world.reset_counters();
        StepResult finished;
        const std::vector<float> before(shared.begin(), shared.end());
        real.finish_updates(params, finished);
        EXPECT(!world.allgather_in_flight());
        const bool applies = delayed && call == 0;
        EXPECT_EQ(world.counters().payload_bytes, uint64_t{0});
        EXPECT_EQ(world.counters().bytes_recv, applies ? bucket * (W - 1) : uint64_t{0});
        EXPECT(applies != demo_simulation::bit_equal(before, shared));
        EXPECT(demo_simulation::bit_equal(params, shared));  // eager: the working weights are the shared ones now
        add_bytes(counted.total, world.counters());
    }

    std::vector<std::vector<std::vector<float>>> grads(steps);  // [step][rank]
    for (int s = 0; s < steps; s++)
        for (int r = 0; r < W; r++) grads[s].push_back(gradient(layout.num_params, r, s));
    demo_simulation::SimResult sim = demo_simulation::simulate(cfg, layout, initial_params(layout.num_params), grads,
                                                               std::vector<float>(lrs, lrs + steps));
    std::vector<float> sim_params = sim.params_per_step.back();
    if (delayed) {
        NoTransport none;
        demo::DemoOptimizer applier(cfg, layout, none);
        StepTimings t;
        applier.apply(sim.pending, sim.pending_offsets, sim_params, lrs[steps - 1], t);
    }
    const std::vector<float>& sim_momentum = sim.momentum_per_step.back()[me];
    size_t param_mismatch = 0, momentum_mismatch = 0;
    for (size_t i = 0; i < params.size(); i++) {
        param_mismatch += shared[i] != sim_params[i];
        momentum_mismatch += real.momentum()[i] != sim_momentum[i];
    }
    if (eager) EXPECT(demo_simulation::bit_equal(working, sim.working_per_step.back()[size_t(me)]));
    if (param_mismatch || momentum_mismatch)
        std::fprintf(stderr, "  %s rank %d: %zu params and %zu momentum entries differ from the simulation\n", label,
                     me, param_mismatch, momentum_mismatch);
    EXPECT_EQ(param_mismatch, size_t{0});
    EXPECT_EQ(momentum_mismatch, size_t{0});
    // All ranks hold the same (shared) parameters after every step.
    std::vector<double> sum = {0.0};
    for (float p : shared) sum[0] += p;
    std::vector<double> max = sum;
    world.allreduce_max(max);
    EXPECT_EQ(max[0], sum[0]);
    return counted;
}

}  // namespace

TEST(demo_mpi_equals_simulation_every_encoding) {
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1f;
    for (auto values : {DemoValueEncoding::fp32, DemoValueEncoding::bf16, DemoValueEncoding::sign})
        for (auto indices : {DemoIndexEncoding::smallest, DemoIndexEncoding::packed12, DemoIndexEncoding::entropy}) {
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

TEST(demo_mpi_delayed_equals_simulation) {
    // --demo_delay 1 through the real step(): MpiTransport's overlapped all-gather (helper thread, its own
    // communicator) with scalar reductions in between, bit-identical to the delayed simulation. Byte counters:
    // the steps count every round's payload but one round less of sent/received bytes than the undelayed run
    // (the last round is still in flight); finishing it gives exactly the undelayed run's counts.
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1f;
    cfg.demo.topk = 8;
    for (auto values : {DemoValueEncoding::fp32, DemoValueEncoding::sign, DemoValueEncoding::bf16}) {
        cfg.demo.values = values;
        cfg.demo.indices = values == DemoValueEncoding::bf16 ? DemoIndexEncoding::packed12 : DemoIndexEncoding::smallest;
        cfg.demo.delay = 0;
        const RunCounters plain = run_demo_case(cfg, "undelayed");
        cfg.demo.delay = 1;
        for (const bool eager : {false, true}) {  // the eager share is local: the same traffic
            cfg.demo.eager = eager;
            const RunCounters delayed = run_demo_case(cfg, eager ? "delayed, eager" : "delayed, stale");
            const uint64_t round_wire = plain.total.bytes_recv / 5;  // equal bucket sizes: the same every round
            EXPECT_EQ(delayed.over_steps.payload_bytes, plain.total.payload_bytes);
            EXPECT_EQ(delayed.over_steps.bytes_recv, plain.total.bytes_recv - round_wire);
            EXPECT_EQ(delayed.over_steps.bytes_sent, plain.total.bytes_sent - round_wire);
            EXPECT_EQ(delayed.total.payload_bytes, plain.total.payload_bytes);
            EXPECT_EQ(delayed.total.bytes_recv, plain.total.bytes_recv);
            EXPECT_EQ(delayed.total.bytes_sent, plain.total.bytes_sent);
        }
    }
    cfg.demo.momentum = DemoMomentum::ema;
    cfg.demo.feedback_alpha = 0.2f;
    cfg.decay_groups = DecayGroups::all;
    cfg.grad_clip = 0.5f;
    run_demo_case(cfg, "delayed options");
    cfg.demo.indices = DemoIndexEncoding::entropy;  // the overlapped all-gather of entropy-coded buckets
    run_demo_case(cfg, "delayed, entropy indices");
}

// MpiTransport's all-gather with GatherSizes::equal (no size exchange; MPI_Allgather / MPI_Iallgather) against
// the exchanging one: the same bytes, offsets and ring counters, blocking and split (with a scalar reduction in
// between), and only the exchanging calls count a size exchange. Oracle: each rank's bytes are a formula of
// (rank, position). Under test_mpi.sh also without the helper thread and in slices of 1000 bytes.
TEST(allgather_equal_sizes_equals_exchanged) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const size_t E = 777;
    auto byte_of = [](int r, size_t j) { return std::byte(static_cast<unsigned char>((31 * r + 7 * j + 3) & 0xff)); };
    std::vector<std::byte> mine(E);
    for (size_t j = 0; j < E; j++) mine[j] = byte_of(me, j);
    for (const bool split : {false, true})
        for (const GatherSizes how : {GatherSizes::exchange, GatherSizes::equal}) {
            std::vector<std::byte> all;
            std::vector<size_t> offsets;
            world.reset_counters();
            if (split) {
                world.allgather_bytes_start(mine, how);
                std::vector<double> scalar = {1.0};
                world.allreduce_sum(scalar);
                EXPECT_EQ(scalar[0], static_cast<double>(W));
                world.allgather_bytes_finish(all, offsets);
            } else {
                world.allgather_bytes(mine, all, offsets, how);
            }
            EXPECT_EQ(offsets.size(), static_cast<size_t>(W) + 1);
            EXPECT_EQ(all.size(), E * W);
            size_t wrong = 0;
            for (int r = 0; r < W; r++) {
                wrong += offsets[r] != E * r;
                for (size_t j = 0; j < E && E * r + j < all.size(); j++) wrong += all[E * r + j] != byte_of(r, j);
            }
            EXPECT_EQ(wrong, size_t{0});
            const CommCounters c = world.counters();
            EXPECT_EQ(c.payload_bytes, uint64_t{E});
            EXPECT_EQ(c.bytes_recv, uint64_t{E} * (W - 1));
            EXPECT_EQ(c.bytes_sent, uint64_t{E} * (W - 1));
            EXPECT_EQ(c.size_exchanges, uint64_t{how == GatherSizes::exchange && W > 1 ? 1u : 0u});
            EXPECT(next_gather_sizes(offsets, E) == GatherSizes::equal);
            EXPECT(next_gather_sizes(offsets, E + 1) == GatherSizes::exchange);
        }
}

TEST(adamw_ddp_averages_gradients) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    OptimizerConfig cfg;
    AdamW real(cfg, layout, world);
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
        const float inv = 1.0f / static_cast<float>(W);
        for (float& x : mean) x *= inv;
        single.step(p_sim, mean, 1e-3f);
    }
    // The transport sums in rank order and scales by 1/W, as the hand-made mean: the same bits.
    size_t differ = 0;
    for (size_t i = 0; i < p_real.size(); i++) differ += p_real[i] != p_sim[i];
    EXPECT_EQ(differ, size_t{0});
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
    // Exactly: the ranks' bf16 values added in rank order, each partial sum rounded to bf16, times 1/W.
    size_t differ = 0;
    for (size_t i = 0; i < n && W > 1; i++) {
        uint16_t sum = km::bf16_bits_rne(all[0][i]);
        for (int r = 1; r < W; r++)
            sum = km::bf16_bits_rne(km::bf16_bits_to_float(sum) + km::bf16_bits_to_float(km::bf16_bits_rne(all[r][i])));
        differ += mine[i] != km::bf16_bits_to_float(sum) * (1.0f / static_cast<float>(W));
    }
    EXPECT_EQ(differ, size_t{0});
}

// The OR of the ranks' bitmaps (the overlapped all-reduce's touched embedding rows), against the union each rank
// computes from every rank's bits: rank r sets bits r and 63 - r of word 0, the bits of word 1 above 8 r, and
// word 2 only on rank 0.
TEST(allreduce_or_gives_the_union) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const auto bits_of = [](int r) {
        return std::vector<uint64_t>{(uint64_t{1} << r) | (uint64_t{1} << (63 - r)), ~uint64_t{0} << (8 * r % 64),
                                     r == 0 ? uint64_t{0x8000000000000001} : 0};
    };
    std::vector<uint64_t> mine = bits_of(me), expect(3, 0);
    for (int r = 0; r < W; r++)
        for (size_t w = 0; w < 3; w++) expect[w] |= bits_of(r)[w];
    world.reset_counters();
    world.allreduce_or(mine);
    EXPECT(mine == expect);
    EXPECT_EQ(world.counters().bytes_sent, uint64_t{0});  // bookkeeping, uncounted
}

// The split reductions (Transport::allreduce_sum_start / _finish: the step report's loss and norm, in flight
// while the next step computes; allreduce_or_start / _finish: AdamW-DDP's bitmap of touched rows, in flight
// during a forward), both at once, with the world communicator's other collectives in between (a blocking sum,
// a blocking OR, an all-gather, an overlapped all-reduce), two rounds. Oracles: every rank's values added in
// rank order here (values whose sum depends on the order; the blocking sum must give the same bits) and the
// union of every rank's bits. Through the MPI transport's own split reductions, and through the defaults of
// Transport (the whole reduction in start) over a transport that forwards only the blocking collectives.
void check_split_reductions(Transport& world) {
    const int W = world.world_size(), me = world.rank();
    const auto values_of = [](int r, int round) {
        return std::vector<double>{r % 2 ? -1e16 : 1e16 + r, 0.1 * (r + 1) + round, std::ldexp(3.0, -r - round)};
    };
    const auto bits_of = [](int r, int round) {
        return std::vector<uint64_t>{uint64_t{1} << (r + round), ~uint64_t{0} << (r % 64)};
    };
    for (int round = 0; round < 2; round++) {
        world.allreduce_or_start(bits_of(me, round));
        world.allreduce_sum_start(values_of(me, round));
        std::vector<double> blocking = values_of(me, round);
        world.allreduce_sum(blocking);
        std::vector<uint64_t> bits = {uint64_t{1} << me};
        world.allreduce_or(bits);
        EXPECT_EQ(bits[0], (uint64_t{1} << W) - 1);
        std::vector<std::byte> all;
        std::vector<size_t> offsets;
        world.allgather_bytes(std::vector<std::byte>(16 + me, std::byte{7}), all, offsets, GatherSizes::exchange);
        EXPECT_EQ(all.size(), static_cast<size_t>(16 * W + W * (W - 1) / 2));
        std::vector<float> grads(3000, static_cast<float>(me));
        const std::vector<ParamRange> ranges = {{0, 3000}};
        world.allreduce_mean_start(grads.data(), grads.size(), ranges, false);
        world.allreduce_mean_finish();
        EXPECT_EQ(grads[2999], static_cast<float>(W - 1) / 2);
        std::vector<double> split(3, 0.0), expect = values_of(0, round);
        world.allreduce_sum_finish(split);
        for (int r = 1; r < W; r++)
            for (size_t i = 0; i < expect.size(); i++) expect[i] += values_of(r, round)[i];
        EXPECT(split == expect);
        EXPECT(blocking == expect);
        std::vector<uint64_t> split_bits(2, 0), union_bits(2, 0);
        world.allreduce_or_finish(split_bits);
        for (int r = 0; r < W; r++)
            for (size_t w = 0; w < 2; w++) union_bits[w] |= bits_of(r, round)[w];
        EXPECT(split_bits == union_bits);
    }
    std::vector<double> two(2);
    EXPECT_ERROR(world.allreduce_sum_finish(two), "without its start");
    world.allreduce_sum_start(two);
    EXPECT_ERROR(world.allreduce_sum_start(two), "while another is in flight");
    world.allreduce_sum_finish(two);
    std::vector<uint64_t> word(1);
    EXPECT_ERROR(world.allreduce_or_finish(word), "without its start");
    world.allreduce_or_start(word);
    std::vector<uint64_t> words(2);
    EXPECT_ERROR(world.allreduce_or_finish(words), "with another count");
    world.allreduce_or_finish(word);
}

// The MPI world's blocking collectives and nothing else: the split reductions are Transport's defaults.
class BlockingOnly final : public Transport {
public:
    explicit BlockingOnly(Transport& world) : world_(world) {}
    std::string_view name() const override { return "blocking-only"; }
    int rank() const override { return world_.rank(); }
    int world_size() const override { return world_.world_size(); }
    void allreduce_mean(std::span<float> data) override { world_.allreduce_mean(data); }
    void allgather_bytes(std::span<const std::byte> mine, std::vector<std::byte>& all, std::vector<size_t>& offsets,
                         GatherSizes sizes) override {
        world_.allgather_bytes(mine, all, offsets, sizes);
    }
    void allreduce_sum(std::span<double> values) override { world_.allreduce_sum(values); }
    void allreduce_max(std::span<double> values) override { world_.allreduce_max(values); }
    void allreduce_or(std::span<uint64_t> bits) override { world_.allreduce_or(bits); }
    void broadcast(std::span<std::byte> data, int root) override { world_.broadcast(data, root); }
    void barrier() override { world_.barrier(); }
    [[noreturn]] void abort(int code) override {
        world_.abort(code);
        std::exit(code);  // not reached: the compiler does not carry [[noreturn]] through the virtual call
    }

private:
    Transport& world_;
};

TEST(split_reductions_equal_blocking_ones) {
    check_split_reductions(*g_world);
    BlockingOnly defaults(*g_world);
    check_split_reductions(defaults);
}

// The trainers' batch agreement (batch_agreement_start / _finish: one split OR of a failed-to-load flag and the
// last batch's wte row bitmap), with a blocking sum in flight between start and finish as in the trainers.
// Oracles: the runs of rows no rank's tokens touch, found by a loop over the rows here (all of them, and the
// longest one, lower rows first on ties), and "every rank loaded" known here for each round.
TEST(batch_agreement_gives_every_rank_the_same_decision) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    ModelConfig config;
    config.max_seq_len = 16;
    config.vocab_size = 190;
    config.padded_vocab_size = 200;  // the bitmap's last word is partial
    config.num_layers = 1;
    config.num_heads = 2;
    config.channels = 8;
    const ParamLayout layout = ParamLayout::gpt2(config);
    const size_t rows = 200, C = 8, wte = layout.find("wte.weight").offset;
    const auto tokens_of = [](int r) {  // rank r touches rows 3r..3r+2, 100 + 7r and 189 - r
        return std::vector<int>{3 * r, 3 * r + 1, 3 * r + 2, 100 + 7 * r, 189 - r};
    };
    std::vector<bool> touched(rows, false);
    for (int r = 0; r < W; r++)
        for (const int t : tokens_of(r)) touched[static_cast<size_t>(t)] = true;
    std::vector<ParamRange> all_runs;
    for (size_t row = 0; row < rows; row++) {
        if (touched[row]) continue;
        if (row > 0 && !touched[row - 1]) all_runs.back().numel += C;
        else all_runs.push_back({wte + row * C, C});
    }
    ParamRange longest = all_runs.front();
    for (const ParamRange& run : all_runs)
        if (run.numel > longest.numel) longest = run;
    for (const size_t max_runs : {SIZE_MAX, size_t{1}}) {
        batch_agreement_start(world, layout, true, true, tokens_of(me));
        std::vector<double> blocking = {1.0};
        world.allreduce_sum(blocking);
        const BatchAgreement agreed = batch_agreement_finish(world, layout, true, max_runs);
        EXPECT(agreed.all_loaded);
        EXPECT(agreed.wte_early == (max_runs == 1 ? std::vector<ParamRange>{longest} : all_runs));
    }
    // the last rank failed to load: no rank queues, whatever the others read
    const bool loaded = me != W - 1;
    const std::vector<int> mine = tokens_of(me);
    batch_agreement_start(world, layout, loaded, true, loaded ? std::span<const int>(mine) : std::span<const int>());
    BatchAgreement agreed = batch_agreement_finish(world, layout, true, SIZE_MAX);
    EXPECT(!agreed.all_loaded);
    EXPECT(agreed.wte_early.empty());
    // without rows (no overlapped all-reduce): only the flag
    batch_agreement_start(world, layout, true, false, tokens_of(me));
    agreed = batch_agreement_finish(world, layout, false, SIZE_MAX);
    EXPECT(agreed.all_loaded);
    EXPECT(agreed.wte_early.empty());
}

// AdamW-DDP's overlapped all-reduce (Transport::allreduce_mean_start / _finish): ranges started in several
// calls, in no particular order, with a scalar reduction on the world communicator in between (the trainer's
// main thread may use it while the reducer thread works). Oracles: the blocking all-reduce of each range on its
// own (the same bits: every element is summed in rank order), the exact mean (float rounding), and the ring counters of
// one all-reduce of all the ranges together. Elements outside the ranges stay as they were.
TEST(overlapped_allreduce_equals_blocking_per_range) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const size_t n = 20000;
    const std::vector<ParamRange> first = {{15000, 5000}, {9000, 3000}, {12500, 0}}, second = {{100, 8000}, {12000, 2500}};
    size_t covered = 0;
    for (const auto* part : {&first, &second})
        for (const ParamRange& r : *part) covered += r.numel;
    for (bool bf16 : {false, true}) {
        const std::vector<float> local = gradient(n, me, 11);
        std::vector<float> overlapped = local, blocking = local;
        world.reset_counters();
        world.allreduce_mean_start(overlapped.data(), n, first, bf16);
        std::vector<double> scalar = {1.0};
        world.allreduce_sum(scalar);
        EXPECT_EQ(scalar[0], static_cast<double>(W));
        world.allreduce_mean_start(overlapped.data(), n, second, bf16);
        world.allreduce_mean_finish();
        const CommCounters c = world.counters();
        const uint64_t bytes = covered * (bf16 ? 2 : 4);
        EXPECT_EQ(c.payload_bytes, bytes);
        EXPECT_EQ(c.bytes_sent, 2 * static_cast<uint64_t>(W - 1) * bytes / W);
        EXPECT_EQ(c.bytes_recv, c.bytes_sent);
        EXPECT_EQ(c.collectives, uint64_t{W > 1 ? 1u : 0u});

        for (const auto* part : {&first, &second})
            for (const ParamRange& r : *part) {
                std::span<float> range(blocking.data() + r.offset, r.numel);
                if (bf16) world.allreduce_mean_bf16(range);
                else world.allreduce_mean(range);
            }
        std::vector<std::vector<float>> all;
        for (int r = 0; r < W; r++) all.push_back(gradient(n, r, 11));
        size_t differ = 0, off_mean = 0;
        for (size_t i = 0; i < n; i++) {
            if (overlapped[i] != blocking[i]) differ++;
            double exact = 0.0, S = 0.0;
            for (int r = 0; r < W; r++) exact += all[r][i], S += std::fabs(all[r][i]);
            exact /= W;
            const bool in_range = (i >= 100 && i < 8100) || (i >= 9000 && i < 14500) || i >= 15000;
            if (!in_range && overlapped[i] != local[i]) off_mean++;
            if (in_range && W > 1 && std::fabs(overlapped[i] - exact) > (bf16 ? 2.0 * std::ldexp(S, -9) : 1e-6 * S) + 1e-30)
                off_mean++;
        }
        EXPECT_EQ(differ, size_t{0});
        EXPECT_EQ(off_mean, size_t{0});
    }
    std::vector<float> buffer(100, 1.0f);
    const std::vector<ParamRange> outside = {{0, 10}, {95, 10}};
    EXPECT_ERROR(world.allreduce_mean_start(buffer.data(), buffer.size(), outside, false), "outside the buffer");
    world.allreduce_mean_finish();  // nothing was started: a no-op
}

// allreduce_mean_wait(n): the ranges of the first n starts hold the mean when it returns, before finish()
// (--mpi_helper_threads false reduces nothing before a wait or finish, so a wait that returned early leaves them as
// they were). A start with no elements counts as a start. The wait counts no collective and no bytes: finish()
// counts one all-reduce of everything. Waiting for more starts than began is refused.
TEST(overlapped_allreduce_wait_gives_early_ranges) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const size_t n = 20000;
    const std::vector<std::vector<ParamRange>> starts = {
        {{15000, 5000}}, {{9000, 3000}, {12500, 0}}, {{12500, 0}}, {{100, 8000}, {12000, 2500}}};
    for (bool bf16 : {false, true}) {
        const std::vector<float> local = gradient(n, me, 23);
        std::vector<float> overlapped = local, blocking = local;
        world.reset_counters();
        for (const auto& ranges : starts) world.allreduce_mean_start(overlapped.data(), n, ranges, bf16);
        world.allreduce_mean_wait(0);
        world.allreduce_mean_wait(1);
        const std::vector<float> after_first = overlapped;
        world.allreduce_mean_wait(3);
        const std::vector<float> after_third = overlapped;
        EXPECT_ERROR(world.allreduce_mean_wait(5), "only 4 began");
        const CommCounters before_finish = world.counters();
        EXPECT_EQ(before_finish.collectives, uint64_t{0});
        EXPECT_EQ(before_finish.bytes_sent, uint64_t{0});
        world.allreduce_mean_finish();
        EXPECT_EQ(world.counters().collectives, uint64_t{W > 1 ? 1u : 0u});
        EXPECT_EQ(world.counters().payload_bytes, uint64_t{(5000 + 3000 + 8000 + 2500) * (bf16 ? 2u : 4u)});

        for (const auto& ranges : starts)
            for (const ParamRange& r : ranges) {
                std::span<float> range(blocking.data() + r.offset, r.numel);
                if (bf16) world.allreduce_mean_bf16(range);
                else world.allreduce_mean(range);
            }
        size_t early_first = 0, early_third = 0, final_differ = 0;
        for (size_t i = 15000; i < 20000; i++) early_first += after_first[i] != blocking[i];
        for (size_t i = 9000; i < 12000; i++) early_third += after_third[i] != blocking[i];
        for (size_t i = 15000; i < 20000; i++) early_third += after_third[i] != blocking[i];
        for (size_t i = 0; i < n; i++) final_differ += overlapped[i] != blocking[i];
        EXPECT_EQ(early_first, size_t{0});
        EXPECT_EQ(early_third, size_t{0});
        EXPECT_EQ(final_differ, size_t{0});
    }
    EXPECT_ERROR(world.allreduce_mean_wait(1), "only 0 began");
}

// AdamW with its gradients reported final in backward order (on_gradients_final, three calls, tensors last to
// first) takes the same step as AdamW all-reducing after the backward, bit for bit: every element is summed in
// rank order either way. A step with part of the gradient reported refuses to run.
TEST(adamw_overlapped_step_equals_step_after_backward) {
    Transport& world = *g_world;
    const int me = world.rank();
    const ParamLayout layout = awkward_layout();
    for (GradWire wire : {GradWire::fp32, GradWire::bf16}) {
        OptimizerConfig cfg;
        cfg.adamw.grad_wire = wire;
        AdamW overlapped(cfg, layout, world), after(cfg, layout, world);
        std::vector<float> p_overlapped = initial_params(layout.num_params), p_after = p_overlapped;
        for (int s = 0; s < 3; s++) {
            std::vector<float> g_overlapped = gradient(layout.num_params, me, s), g_after = g_overlapped;
            world.reset_counters();
            std::vector<ParamRange> ranges;
            for (size_t t = layout.tensors.size(); t-- > 0;) ranges.push_back({layout.tensors[t].offset, layout.tensors[t].numel});
            overlapped.on_gradients_final(g_overlapped, std::span(ranges).subspan(0, 2));
            overlapped.on_gradients_final(g_overlapped, std::span(ranges).subspan(2, 4));
            overlapped.on_gradients_final(g_overlapped, std::span(ranges).subspan(6));
            const StepResult r_overlapped = overlapped.step(p_overlapped, g_overlapped, 1e-3f);
            const CommCounters c_overlapped = world.counters();
            world.reset_counters();
            const StepResult r_after = after.step(p_after, g_after, 1e-3f);
            EXPECT_EQ(c_overlapped.payload_bytes, world.counters().payload_bytes);
            EXPECT_EQ(c_overlapped.bytes_sent, world.counters().bytes_sent);
            EXPECT_EQ(c_overlapped.collectives, world.counters().collectives);
            EXPECT_EQ(r_overlapped.grad_norm, r_after.grad_norm);
        }
        size_t differ = 0;
        for (size_t i = 0; i < p_after.size(); i++) differ += p_overlapped[i] != p_after[i];
        EXPECT_EQ(differ, size_t{0});

        std::vector<float> g = gradient(layout.num_params, me, 9);
        const std::vector<ParamRange> part = {{layout.tensors.back().offset, layout.tensors.back().numel}};
        overlapped.on_gradients_final(g, part);
        EXPECT_ERROR(overlapped.step(p_overlapped, g, 1e-3f), "the overlapped all-reduce needs all");
        world.allreduce_mean_finish();  // what was started completes on every rank
    }
}

int main(int argc, char** argv) {
#ifndef LLMC_USE_MPI
    testing::skip("built without MPI (USE_MPI=0)");
#endif
    g_world = make_world_transport(&argc, &argv);
    // the comm group's keys as flags (--mpi_message_bytes 100 ...): test_mpi.sh runs the paths they change
    try {
        Schema<CommOptions> comm;
        comm.add("comm", comm_option_keys());
        CommOptions options;
        ConfigSources sources;
        comm.parse_command_line(argc - 1, argv + 1, options, sources, "test_mpi_optimizers");
        validate_comm_options(options, sources);
        g_world->configure(options);
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    if (g_world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const int rc = testing::run_all();
    std::vector<double> failed = {static_cast<double>(rc)};
    g_world->allreduce_max(failed);
    g_world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
