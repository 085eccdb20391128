// Run under mpirun -np 4 (test/e2e/test_flexdemo.sh). The sharded step against its flat twin: N nodes of S ranks,
// rank (n, s) with gradient g(n*S+s), must step as flat DeMo / AdamW-DDP on N ranks whose gradients are the nodes'
// averages (simulated here, one optimizer per flat rank, buckets concatenated by hand). Without clipping the
// averages are the same floats, so weights, momenta and every chunk's index set must match bit for bit; with
// clipping the norm's summation order differs, and at least 99.9% of the chunks must choose the same indices.
// Also: the transport's groups (reduce-scatter, in-place all-gather, counters by link), --demo_replicate_every,
// the cross-rank weight check, state save / load and its topology check, and the state each rank holds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/base/rng.h"
#include "llmc/comm/topology.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/model/model_config.h"
#include "llmc/model/param_layout.h"
#include "llmc/optim/adamw/adamw.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/demo/flexdemo.h"
#include "llmc/run/weight_check.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

std::unique_ptr<Transport> g_world;

ParamLayout awkward_layout() {
    return testing::layout_of_shapes({{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {64, 64}, {87, 40}});
}

std::vector<float> gradient(size_t n, int rank, int step, double scale = 1.0) {
    return testing::random_normal(n, 7919ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(step), scale);
}

std::vector<float> initial_params(size_t n) { return testing::random_normal(n, 11, 0.02); }

// The node's average as the reduce-scatter forms it: summed in rank order, times 1/S.
std::vector<float> node_average(size_t n, int node, int S, int step, double scale) {
    std::vector<float> sum = gradient(n, node * S, step, scale);
    for (int s = 1; s < S; s++) {
        const std::vector<float> g = gradient(n, node * S + s, step, scale);
        for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    const float inv = 1.0f / static_cast<float>(S);
    for (float& x : sum) x *= inv;
    return sum;
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

OptimizerConfig demo_config(int S) {
    OptimizerConfig c;
    c.shard_group_size = S;
    c.grad_clip = 0.0f;
    c.weight_decay = 0.1f;
    c.demo.topk = 8;
    c.demo.chunk = 32;
    return c;
}

// Chunks whose index sets agree between this rank's shard and flat rank `node`'s selection of the same chunks.
struct Agreement {
    size_t same = 0, chunks = 0;
};
Agreement compare_indices(const demo::ModelPlan& full, size_t shard_begin, const demo::DemoOptimizer& shard,
                          const demo::DemoOptimizer& flat) {
    Agreement a;
    const demo::ModelPlan& sp = shard.plan();
    for (const demo::TensorPlan& t : sp.tensors) {
        // the full tensor holding this slice, and the slice's first block row in it
        const size_t at = shard_begin + t.offset;
        const demo::TensorPlan* f = nullptr;
        for (const demo::TensorPlan& ft : full.tensors)
            if (at >= ft.offset && at < ft.offset + ft.numel()) f = &ft;
        const size_t row0 = (at - f->offset) / (f->n1 * f->cols);
        const size_t flat_first = f->select_offset + row0 * f->block_cols * f->k;
        for (size_t c = 0; c < t.num_chunks; c++) {
            const uint32_t* mine = shard.selection().indices.data() + t.select_offset + c * t.k;
            const uint32_t* theirs = flat.selection().indices.data() + flat_first + c * t.k;
            a.same += std::equal(mine, mine + t.k, theirs) ? 1 : 0;
            a.chunks++;
        }
    }
    return a;
}

// FlexDeMo on the world in nodes of S against flat DeMo on W/S simulated ranks with the nodes' averages.
// Returns the chunks' agreement over all steps and ranks; `exact`: weights and momenta must match bit for bit.
Agreement flexdemo_vs_flat(OptimizerConfig cfg, int S, int steps, double grad_scale, bool exact, const char* label) {
    Transport& world = *g_world;
    const int W = world.world_size(), N = W / S, me = world.rank();
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    demo::FlexDemo hybrid(cfg, layout, world, S);
    LocalTransport local;
    std::vector<std::unique_ptr<demo::DemoOptimizer>> flat;
    OptimizerConfig flat_cfg = cfg;
    flat_cfg.shard_group_size = 1;
    for (int r = 0; r < N; r++) flat.push_back(std::make_unique<demo::DemoOptimizer>(flat_cfg, layout, local));
    const demo::ModelPlan full = flat[0]->plan();
    std::vector<float> params = initial_params(n);
    std::vector<std::vector<float>> flat_params(N, params);
    const int node = me / S;
    const size_t begin = hybrid.shard_begin(), end = hybrid.shard_end();
    Agreement total;
    bool weights_ok = true, momentum_ok = true;
    StepTimings tm;
    for (int step = 0; step < steps; step++) {
        const float lr = 0.01f * static_cast<float>(1 + step % 3);
        // flat: every simulated rank compresses its node's average, then all apply every bucket
        std::vector<std::byte> all;
        std::vector<size_t> offsets{0};
        for (int r = 0; r < N; r++) {
            std::vector<float> g = node_average(n, r, S, step, grad_scale);
            const float scale = clip_scale(grad_norm(g), cfg.grad_clip);
            std::vector<std::byte> bucket;
            flat[r]->compress(flat_params[r], g, lr, bucket, tm, scale);
            all.insert(all.end(), bucket.begin(), bucket.end());
            offsets.push_back(all.size());
        }
        for (int r = 0; r < N; r++) flat[r]->apply(all, offsets, flat_params[r], lr, tm);
        // hybrid: this rank's own gradient through the real step
        std::vector<float> g = gradient(n, me, step, grad_scale);
        hybrid.step(params, g, lr);
        const Agreement a = compare_indices(full, begin, hybrid.shard_optimizer(), *flat[node]);
        total.same += a.same;
        total.chunks += a.chunks;
        weights_ok = weights_ok && bit_equal(params, flat_params[0]);
        momentum_ok = momentum_ok && bit_equal(hybrid.shard_optimizer().momentum(),
                                               std::span<const float>(flat[node]->momentum()).subspan(begin, end - begin));
        check_weights_agree(world, params, step + 1);  // every rank of every node holds the same weights
    }
    if (exact) {
        if (!weights_ok) std::printf("  %s: weights differ from flat DeMo's\n", label);
        if (!momentum_ok) std::printf("  %s: momentum differs from flat DeMo's\n", label);
        EXPECT(weights_ok);
        EXPECT(momentum_ok);
        EXPECT_EQ(total.same, total.chunks);
    }
    return total;
}

TEST(groups_reduce_scatter_and_gather_in_place) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    if (W % 2 != 0) return;
    Topology t = make_topology(world, 2);
    EXPECT_EQ(t.node_group->world_size(), 2);
    EXPECT_EQ(t.replica_group->world_size(), W / 2);
    EXPECT_EQ(t.node_group->rank(), me % 2);
    EXPECT_EQ(t.replica_group->rank(), me / 2);
    const size_t n = 1001;
    const std::vector<size_t> offsets = {0, 377, n};  // uneven
    std::vector<float> data = gradient(n, me, 0);
    world.reset_counters();
    t.node_group->reduce_scatter_mean(data, offsets);
    const int node = me / 2, local = me % 2;
    const std::vector<float> a = gradient(n, node * 2, 0), b = gradient(n, node * 2 + 1, 0);
    bool ok = true;
    for (size_t i = offsets[local]; i < offsets[local + 1]; i++) ok = ok && data[i] == (a[i] + b[i]) * 0.5f;
    EXPECT(ok);
    const size_t mine = offsets[local + 1] - offsets[local], other = n - mine;
    CommCounters c = world.counters();
    EXPECT_EQ(c.bytes_sent, other * 4);
    EXPECT_EQ(c.bytes_recv, mine * 4);
    EXPECT_EQ(c.bytes_sent_intra, other * 4);
    EXPECT_EQ(c.bytes_sent_inter, uint64_t{0});
    EXPECT_EQ(c.payload_bytes, n * 4);
    // the gather: every rank's range in place; bytes by link
    std::vector<float> w(n, -1.0f);
    for (size_t i = offsets[local]; i < offsets[local + 1]; i++) w[i] = static_cast<float>(me * 10000 + i);
    const std::vector<size_t> bytes = {0, offsets[1] * 4, n * 4};
    world.reset_counters();
    t.node_group->allgather_inplace(std::as_writable_bytes(std::span<float>(w)), bytes);
    ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && w[i] == static_cast<float>((node * 2 + (i >= offsets[1] ? 1 : 0)) * 10000 + i);
    EXPECT(ok);
    c = world.counters();
    EXPECT_EQ(c.bytes_sent, mine * 4);
    EXPECT_EQ(c.bytes_recv, other * 4);
    // a replica-group collective counts as inter-node traffic, the world's own as well
    std::vector<float> r(64, static_cast<float>(node));
    world.reset_counters();
    t.replica_group->allreduce_mean(r);
    c = world.counters();
    EXPECT(r[0] == static_cast<float>(W / 2 - 1) / 2.0f);
    EXPECT_EQ(c.bytes_sent_intra, uint64_t{0});
    EXPECT_EQ(c.bytes_sent_inter, c.bytes_sent);
    EXPECT_EQ(c.bytes_sent, static_cast<uint64_t>(2 * (W / 2 - 1) * 256 / (W / 2)));
}

TEST(shard_group_size_must_divide_the_world) {
    Transport& world = *g_world;
    const int W = world.world_size();
    EXPECT_ERROR(resolve_shard_group_size(world, W + 1), "does not divide the " + std::to_string(W) + " ranks");
    EXPECT_EQ(resolve_shard_group_size(world, 0), W);  // auto: mpirun put every rank on this host, in order
}

TEST(flexdemo_equals_flat_demo_of_the_nodes_averages) {
    const int W = g_world->world_size();
    for (int S : {1, 2, 4}) {
        if (W % S != 0) continue;
        for (auto values : {DemoValueEncoding::fp32, DemoValueEncoding::sign}) {
            OptimizerConfig cfg = demo_config(S);
            cfg.demo.values = values;
            const std::string label = "S=" + std::to_string(S) + (values == DemoValueEncoding::sign ? " sign" : " fp32");
            const Agreement a = flexdemo_vs_flat(cfg, S, 6, 1.0, true, label.c_str());
            std::printf("  %s: %zu of %zu chunk index sets equal, weights and momenta bit-identical\n", label.c_str(),
                        a.same, a.chunks);
        }
    }
    if (W % 2 == 0) {  // FlexDeMo's buckets across nodes with entropy-coded indices
        OptimizerConfig cfg = demo_config(2);
        cfg.demo.values = DemoValueEncoding::bf16;
        cfg.demo.indices = DemoIndexEncoding::entropy;
        const Agreement a = flexdemo_vs_flat(cfg, 2, 4, 1.0, true, "S=2 bf16 entropy");
        std::printf("  S=2 bf16 entropy: %zu of %zu chunk index sets equal, weights and momenta bit-identical\n",
                    a.same, a.chunks);
    }
}

TEST(flexdemo_with_clipping_agrees_on_the_index_sets) {
    const int W = g_world->world_size();
    if (W % 2 != 0) return;
    OptimizerConfig cfg = demo_config(2);
    cfg.grad_clip = 1.0f;  // the gradients' norms are ~100: every step clips
    const Agreement a = flexdemo_vs_flat(cfg, 2, 10, 1.0, false, "S=2 clipped");
    std::printf("  S=2 clipped: %zu of %zu chunk index sets equal (%.4f%%)\n", a.same, a.chunks,
                100.0 * static_cast<double>(a.same) / static_cast<double>(a.chunks));
    EXPECT(static_cast<double>(a.same) >= 0.999 * static_cast<double>(a.chunks));
}

// --demo_replicate_every 2: odd steps are the node's own sign steps (no inter-node bytes, momentum at rest), even
// ones DeMo rounds; --demo_replicate_every 1 is the plain sharded step, bit for bit.
TEST(replicate_every) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    if (W % 2 != 0) return;
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    OptimizerConfig every1 = demo_config(2), every2 = demo_config(2);
    every1.demo.replicate_every = 1;
    every2.demo.replicate_every = 2;
    demo::FlexDemo plain(demo_config(2), layout, world, 2), one(every1, layout, world, 2), two(every2, layout, world, 2);
    std::vector<float> p_plain = initial_params(n), p_one = p_plain, p_two = p_plain;
    for (int step = 0; step < 4; step++) {
        const float lr = 0.01f;
        std::vector<float> g = gradient(n, me, step), g1 = g, g2 = g;
        plain.step(p_plain, g, lr);
        one.step(p_one, g1, lr);
        EXPECT(bit_equal(p_plain, p_one));
        // the node's own step: weight decay (on 2-D tensors), then -lr * sign(node average)
        const std::vector<float> avg = node_average(n, me / 2, 2, step, 1.0);
        std::vector<float> expected = p_two;
        for (const ParamTensor& t : layout.tensors)
            for (size_t i = t.offset; i < t.offset + t.numel; i++) {
                if (t.is_matrix()) expected[i] *= static_cast<float>(1.0 - 0.01 * 0.1);
                expected[i] -= lr * static_cast<float>((avg[i] > 0.0f) - (avg[i] < 0.0f));
            }
        const std::vector<float> momentum_before(two.shard_optimizer().momentum().begin(),
                                                 two.shard_optimizer().momentum().end());
        world.reset_counters();
        two.step(p_two, g2, lr);
        const bool local = (step + 1) % 2 != 0;
        EXPECT_EQ(world.counters().bytes_sent_inter == 0, local || W == 2);  // one node: no other to reach
        if (local) {
            EXPECT(bit_equal(p_two, expected));
            EXPECT(bit_equal(two.shard_optimizer().momentum(), momentum_before));
        }
        check_weights_agree(two.weight_group(world), p_two, step + 1);  // the nodes part between rounds
    }
    EXPECT(!bit_equal(p_two, p_plain));
}

TEST(weight_check_catches_a_rank_that_drifted) {
    Transport& world = *g_world;
    if (world.world_size() < 2) return;
    std::vector<float> w = initial_params(1000);
    check_weights_agree(world, w, 1);
    if (world.rank() == world.world_size() - 1) w[500] = std::nextafter(w[500], 1.0f);
    EXPECT_ERROR(check_weights_agree(world, w, 7), "shared weights differ after step 7");
}

// Sharded AdamW (and ZeRO-1 at S = W) against AdamW-DDP on one simulated rank fed the global average, which the
// replica all-reduce (rank order) forms from the node averages exactly as the flat all-reduce would.
TEST(sharded_adamw_equals_adamw_ddp) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    for (int S : {2, 4}) {
        if (W % S != 0 || S > W) continue;
        for (float clip : {0.0f, 1.0f}) {
            OptimizerConfig cfg;
            cfg.weight_decay = 0.1f;
            cfg.grad_clip = clip;
            cfg.shard_group_size = S;
            AdamW sharded(cfg, layout, world, S);
            LocalTransport local;
            AdamW flat(cfg, layout, local, 1);
            std::vector<float> p = initial_params(n), q = p;
            double worst = 0.0;
            bool exact = true;
            for (int step = 0; step < 5; step++) {
                const float lr = 0.001f;
                // flat N-rank all-reduce of the node averages: summed in node order, times 1/N
                const int N = W / S;
                std::vector<float> avg = node_average(n, 0, S, step, 1.0);
                for (int r = 1; r < N; r++) {
                    const std::vector<float> a = node_average(n, r, S, step, 1.0);
                    for (size_t i = 0; i < n; i++) avg[i] += a[i];
                }
                for (float& x : avg) x *= 1.0f / static_cast<float>(N);
                flat.step(q, avg, lr);
                std::vector<float> g = gradient(n, me, step);
                sharded.step(p, g, lr);
                exact = exact && bit_equal(p, q);
                for (size_t i = 0; i < n; i++) worst = std::max(worst, static_cast<double>(std::fabs(p[i] - q[i])));
                check_weights_agree(world, p, step + 1);
            }
            if (clip == 0.0f) EXPECT(exact);
            else EXPECT(worst < 1e-6);
            std::printf("  AdamW S=%d clip %g: largest weight difference to AdamW-DDP %.3g\n", S, clip, worst);
            // moments for the shard only
            EXPECT(sharded.state_bytes() <= flat.state_bytes() / S + 16 * 8 * S);
        }
    }
}

TEST(flexdemo_state_round_trip_and_topology_check) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    if (W % 2 != 0) return;
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    const OptimizerConfig cfg = demo_config(2);
    demo::FlexDemo a(cfg, layout, world, 2);
    std::vector<float> p = initial_params(n);
    for (int step = 0; step < 3; step++) {
        std::vector<float> g = gradient(n, me, step);
        a.step(p, g, 0.01f);
    }
    ByteWriter saved;
    a.save_state(saved);
    demo::FlexDemo b(cfg, layout, world, 2);
    ByteReader in(saved.bytes(), "state_rank" + std::to_string(me) + ".bin");
    b.load_state(in);
    std::vector<float> q = p;
    for (int step = 3; step < 6; step++) {
        std::vector<float> g = gradient(n, me, step), h = g;
        a.step(p, g, 0.01f);
        b.step(q, h, 0.01f);
    }
    EXPECT(bit_equal(p, q));
    if (W % 4 == 0) {
        OptimizerConfig four = cfg;
        four.shard_group_size = 4;
        demo::FlexDemo c(four, layout, world, 4);
        ByteReader again(saved.bytes(), "state_rank" + std::to_string(me) + ".bin");
        EXPECT_ERROR(c.load_state(again), "in nodes of 2; this run has " + std::to_string(W) + " in nodes of 4");
    }
}

// Optimizer state per rank falls as 1/S (up to the balance of whole block rows); measured on the shards' buffers,
// for a GPT-2 of configs/small.json's shape (chunk 64, the default).
TEST(state_per_rank_falls_with_the_group_size) {
    ModelConfig model;
    model.num_layers = 4;
    model.num_heads = 4;
    model.channels = 256;
    model.max_seq_len = 256;
    const ParamLayout layout = ParamLayout::of(model);
    OptimizerConfig cfg;
    const double flat = static_cast<double>(demo::flexdemo_state_bytes_per_rank(cfg, layout, 1));
    for (int S : {2, 4}) {
        const double mine = static_cast<double>(demo::flexdemo_state_bytes_per_rank(cfg, layout, S));
        std::printf("  DeMo state per rank at S=%d: %.0f of %.0f bytes (%.3f; 1/S = %.3f)\n", S, mine, flat,
                    mine / flat, 1.0 / S);
        EXPECT(mine <= flat / S * 1.10);  // shards balance chunk counts; 1-D tensors have small chunks
        EXPECT(mine >= flat / S * 0.90);
    }
}

}  // namespace

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
