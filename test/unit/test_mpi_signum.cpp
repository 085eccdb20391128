// Signum with majority vote (llmc/optim/signum/) through the MPI transport. Three modes:
//   test_mpi_signum                       (any number of ranks, also run alone by test/run_tests.sh) the vote rule
//                                         and packing, the byte counters, every rank's weights bit for bit after
//                                         every step, state round trips with a bit-identical resume, one-line errors;
//   test_mpi_signum --write-cases DIR     (one process) writes the cases for the PyTorch reference
//                                         dev/reference/signum_reference.py, one line per case name;
//   mpirun -np W test_mpi_signum --check-cases DIR   runs the cases of W ranks, each rank with its own gradients
//                                         from the case file, and compares every step's parameters and momentum
//                                         with the reference's CASE.out, and every rank's weights with rank 0's.
// test/e2e/test_signum.sh drives all three at 1, 2 and 4 ranks. Built without MPI it skips.
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "llmc/comm/transport_mpi.h"
#include "llmc/optim/adamw/adamw.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/signum/signum.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

std::unique_ptr<Transport> g_world;

// Awkward shapes: tensors that start and end inside a byte of the packed signs, and 68,110 elements (not a
// multiple of 8). tensor_1 gets a zero gradient in the tie cases, tensor_6 opposite gradients on the two halves of
// the ranks.
const std::vector<std::vector<size_t>> kShapes = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}, {64, 64}};

ParamLayout awkward_layout() { return testing::layout_of_shapes(kShapes); }

// ---- the reference cases ----

struct Case {
    std::string name;
    int ranks;
    float beta, weight_decay, grad_clip;
    DecayGroups groups;
    bool ties;  // tensor_1's gradient zero everywhere, tensor_6's opposite between rank r and r + W/2
};
constexpr int kSteps = 5;
const float kLrs[kSteps] = {0.01f, 0.02f, 0.005f, 0.01f, 0.03f};  // varied: each step must use its own lr
// Gradient scale per step: at 1e-3 no rank's norm reaches grad_clip, so clipped and unclipped steps alternate.
const float kGradScale[kSteps] = {1.0f, 0.5f, 1e-3f, 2.0f, 1.0f};

std::vector<Case> cases() {
    std::vector<Case> all;
    for (int w : {1, 2, 4}) {
        const std::string ws = std::to_string(w);
        all.push_back({"signum_w" + ws + "_clip_wd2d", w, 0.9f, 0.1f, 1.0f, DecayGroups::matrices, false});
        // exact ties need no clipping (the ranks' scales would differ): signSGD (beta 0) with decay on every tensor,
        // and a long momentum without decay
        all.push_back({"signum_w" + ws + "_ties_wdall", w, 0.0f, 0.1f, 0.0f, DecayGroups::all, true});
        all.push_back({"signum_w" + ws + "_beta099_nowd", w, 0.99f, 0.0f, 0.0f, DecayGroups::matrices, true});
    }
    return all;
}

OptimizerConfig config_of(const Case& c) {
    OptimizerConfig cfg;
    cfg.signum.beta = c.beta;
    cfg.weight_decay = c.weight_decay;
    cfg.grad_clip = c.grad_clip;
    cfg.decay_groups = c.groups;
    return cfg;
}

std::vector<float> case_gradient(const Case& c, const ParamLayout& layout, int rank, int step) {
    std::vector<float> g = testing::random_normal(layout.num_params, 1000003ull * (rank + 1) + step, 1.0);
    for (float& x : g) x *= static_cast<float>(rank + 1) * kGradScale[step];
    if (c.ties) {
        const ParamTensor& zero = layout.tensors[1];
        std::fill(g.begin() + zero.offset, g.begin() + zero.offset + zero.numel, 0.0f);
        const int half = c.ranks / 2;
        if (c.ranks % 2 == 0 && rank >= half) {  // rank r + W/2: the negation of rank r's tensor_6
            const ParamTensor& tie = layout.tensors[6];
            const std::vector<float> twin = case_gradient(c, layout, rank - half, step);
            for (size_t i = tie.offset; i < tie.offset + tie.numel; i++) g[i] = -twin[i];
        }
    }
    return g;
}

std::vector<float> initial_params(size_t n) { return testing::random_normal(n, 7, 0.02); }

void write_floats(std::FILE* f, const std::vector<float>& v) {
    LLMC_CHECK(std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size(), "short write");
}

int write_cases(const std::string& dir) {
    const ParamLayout layout = awkward_layout();
    for (const Case& c : cases()) {
        const std::string base = dir + "/" + c.name;
        std::FILE* j = std::fopen((base + ".json").c_str(), "w");
        LLMC_CHECK(j, "cannot write " + base + ".json");
        std::fprintf(j, "{\"ranks\": %d, \"steps\": %d, \"shapes\": [", c.ranks, kSteps);
        for (size_t t = 0; t < kShapes.size(); t++) {
            std::fprintf(j, "%s[", t ? ", " : "");
            for (size_t d = 0; d < kShapes[t].size(); d++) std::fprintf(j, "%s%zu", d ? ", " : "", kShapes[t][d]);
            std::fprintf(j, "]");
        }
        std::fprintf(j, "], \"lr\": [");
        for (int s = 0; s < kSteps; s++) std::fprintf(j, "%s%.9g", s ? ", " : "", kLrs[s]);
        std::fprintf(j, "], \"beta\": %.9g, \"weight_decay\": %.9g, \"grad_clip\": %.9g, \"decay_groups\": \"%s\"}\n",
                     c.beta, c.weight_decay, c.grad_clip, c.groups == DecayGroups::all ? "all" : "matrices");
        std::fclose(j);
        std::FILE* b = std::fopen((base + ".bin").c_str(), "wb");
        LLMC_CHECK(b, "cannot write " + base + ".bin");
        write_floats(b, initial_params(layout.num_params));
        for (int s = 0; s < kSteps; s++)
            for (int r = 0; r < c.ranks; r++) write_floats(b, case_gradient(c, layout, r, s));
        std::fclose(b);
        std::printf("%s\n", c.name.c_str());
    }
    return 0;
}

std::vector<float> read_floats(const std::string& path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    LLMC_CHECK(f, "cannot read " + path + " (run dev/reference/signum_reference.py on the cases first)");
    std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    return v;
}

// Every rank's buffer equals rank 0's, bit for bit (an uncounted all-gather of the whole buffer).
bool same_on_every_rank(std::span<const float> v) {
    Transport& world = *g_world;
    std::vector<std::byte> all;
    std::vector<size_t> offsets;
    world.allgather_bytes(std::as_bytes(v), all, offsets, GatherSizes::exchange);
    double differ = 0;
    for (int r = 1; r < world.world_size(); r++)
        differ += std::memcmp(all.data() + offsets[r], all.data(), v.size_bytes()) != 0;
    return differ == 0;
}

// The worst |a - b| / max(1, |b|) over a range, and how many differ at all.
struct Diff {
    double worst = 0;
    size_t differ = 0;
};
Diff diff(const float* a, const float* b, size_t n) {
    Diff d;
    for (size_t i = 0; i < n; i++) {
        const double scale = std::max(1.0, std::fabs(static_cast<double>(b[i])));
        d.worst = std::max(d.worst, std::fabs(static_cast<double>(a[i]) - b[i]) / scale);
        d.differ += a[i] != b[i];
    }
    return d;
}

int check_cases(const std::string& dir) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params, bits = signum_packed_bytes(n);
    int checked = 0;
    for (const Case& c : cases()) {
        if (c.ranks != W) continue;
        const std::string base = dir + "/" + c.name;
        const std::vector<float> in = read_floats(base + ".bin"), out = read_floats(base + ".out");
        EXPECT_EQ(in.size(), n * (1 + static_cast<size_t>(kSteps) * W));
        EXPECT_EQ(out.size(), n * static_cast<size_t>(kSteps) * (1 + W));
        if (in.size() != n * (1 + static_cast<size_t>(kSteps) * W) || out.size() != n * kSteps * (1 + W)) continue;
        Signum opt(config_of(c), layout, world);
        std::vector<float> params(in.begin(), in.begin() + static_cast<ptrdiff_t>(n));
        Diff p_worst, m_worst;
        size_t tie_moved = 0;
        bool identical = true;
        for (int s = 0; s < kSteps; s++) {
            const float* g = in.data() + n * (1 + static_cast<size_t>(s) * W + me);
            std::vector<float> grads(g, g + n);
            const std::vector<float> before = params;
            world.reset_counters();
            opt.step(params, grads, kLrs[s]);
            // 1 bit per element: the rank's ceil(n / 8) bytes, and an all-gather sends them to the W - 1 others
            EXPECT_EQ(world.counters().payload_bytes, uint64_t{bits});
            EXPECT_EQ(world.counters().bytes_sent, uint64_t{bits} * (W - 1));
            EXPECT_EQ(world.counters().bytes_recv, uint64_t{bits} * (W - 1));
            const float* ref_p = out.data() + n * static_cast<size_t>(s) * (1 + W);
            const float* ref_m = ref_p + n * (1 + me);
            const Diff dp = diff(params.data(), ref_p, n), dm = diff(opt.momentum().data(), ref_m, n);
            p_worst.worst = std::max(p_worst.worst, dp.worst);
            p_worst.differ += dp.differ;
            m_worst.worst = std::max(m_worst.worst, dm.worst);
            m_worst.differ += dm.differ;
            identical = identical && same_on_every_rank(params);
            if (c.ties && W % 2 == 0) {  // exact ties: tensor_6 only decays
                const ParamTensor& t = layout.tensors[6];
                const float f = c.groups == DecayGroups::all || t.is_matrix()
                                    ? static_cast<float>(1.0 - static_cast<double>(kLrs[s]) * c.weight_decay)
                                    : 1.0f;
                for (size_t i = t.offset; i < t.offset + t.numel; i++) tie_moved += params[i] != before[i] * f;
            }
        }
        // Votes are exact, so the parameters agree within float rounding: g++ may fuse the decay and the update, or
        // the momentum's two products and sum, into one multiply-add each, which PyTorch's separate ops round twice.
        EXPECT(p_worst.worst <= 1e-7);
        EXPECT(m_worst.worst <= 1e-6);
        EXPECT(identical);
        EXPECT_EQ(tie_moved, size_t{0});
        EXPECT_EQ(opt.steps(), int64_t{kSteps});
        if (me == 0)
            std::printf("%-28s %d rank(s): params vs reference max |diff| %.3g (%zu differ), momentum %.3g (%zu "
                        "differ), ranks bit-identical: %s\n",
                        c.name.c_str(), W, p_worst.worst, p_worst.differ, m_worst.worst, m_worst.differ,
                        identical ? "yes" : "NO");
        checked++;
    }
    EXPECT(checked == 3);
    return testing::Registry::get().failures == 0 ? 0 : 1;
}

// ---- the tests run without arguments ----

std::vector<float> rank_gradient(size_t n, int rank, int step) {
    return testing::random_normal(n, 5000011ull * (rank + 1) + step, 0.1 * (rank + 1));
}

// The vote from packed signs: +1 and -1 by majority, 0 on a tie, bit i % 8 of byte i / 8, for worlds of 1 to 4.
TEST(vote_counts_packed_signs_and_ties_are_zero) {
    // 4 ranks, 9 elements (2 bytes each): element i's pattern of +1 ranks
    const unsigned plus[9] = {0b1111, 0b0000, 0b0111, 0b0001, 0b0011, 0b0101, 0b1001, 0b1110, 0b1000};
    const float expect4[9] = {1, -1, 1, -1, 0, 0, 0, 1, -1};
    std::vector<std::byte> all(4 * 2, std::byte{0});
    for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < 9; i++)
            if ((plus[i] >> r) & 1u) all[r * 2 + i / 8] |= std::byte{static_cast<unsigned char>(1u << (i % 8))};
    const auto vote = [&](int world, size_t i) {
        int8_t v[8];
        signum_votes_of_byte(all.data(), 2, world, i / 8, v);
        return static_cast<float>(v[i % 8]);
    };
    for (size_t i = 0; i < 9; i++) EXPECT_EQ(vote(4, i), expect4[i]);
    // the first 3 ranks alone: an odd world never ties
    for (size_t i = 0; i < 9; i++) {
        const int p = std::popcount(plus[i] & 0b0111u);
        EXPECT_EQ(vote(3, i), p >= 2 ? 1.0f : -1.0f);
    }
    EXPECT_EQ(signum_packed_bytes(0), size_t{0});
    EXPECT_EQ(signum_packed_bytes(8), size_t{1});
    EXPECT_EQ(signum_packed_bytes(68110), size_t{8514});
}

// One rank alone (LocalTransport): the packed signs are those of the momentum, a zero momentum counting as +1, and
// the update is -lr * sign with decay on the matrices only; nothing is sent.
TEST(one_rank_steps_by_the_sign_of_its_momentum) {
    const ParamLayout layout = awkward_layout();
    LocalTransport local;
    OptimizerConfig cfg;
    cfg.weight_decay = 0.5f;
    cfg.grad_clip = 0.0f;
    Signum opt(cfg, layout, local);
    std::vector<float> p = initial_params(layout.num_params), g = rank_gradient(layout.num_params, 0, 0);
    const ParamTensor& vec = layout.tensors[1];
    std::fill(g.begin() + vec.offset, g.begin() + vec.offset + vec.numel, 0.0f);
    const std::vector<float> p0 = p;
    opt.step(p, g, 0.01f);
    size_t wrong = 0;
    const float wd = static_cast<float>(1.0 - static_cast<double>(0.01f) * 0.5);
    const float one_minus_beta = static_cast<float>(1.0 - static_cast<double>(0.9f));
    for (const ParamTensor& t : layout.tensors)
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const float m = one_minus_beta * g[i];
            const bool bit = (std::to_integer<unsigned>(opt.sent()[i / 8]) >> (i % 8)) & 1u;
            const float expect = (t.is_matrix() ? p0[i] * wd : p0[i]) - 0.01f * (m < 0.0f ? -1.0f : 1.0f);
            // within an ulp: the compiler may fuse the decay and the update into one multiply-add
            wrong += bit != (m >= 0.0f) || std::fabs(p[i] - expect) > 1e-8f || opt.momentum()[i] != m;
        }
    EXPECT_EQ(wrong, size_t{0});
    EXPECT_EQ(local.counters().bytes_sent, uint64_t{0});
    EXPECT_EQ(local.counters().payload_bytes, uint64_t{signum_packed_bytes(layout.num_params)});
}

// On the MPI world: ceil(n / 8) bytes of payload per step, (W - 1) times that sent and received, and every rank's
// weights bit-identical after every step although each has its own gradient.
TEST(world_sends_one_bit_per_element_and_ranks_agree) {
    Transport& world = *g_world;
    const int W = world.world_size(), me = world.rank();
    const ParamLayout layout = awkward_layout();
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1f;
    Signum opt(cfg, layout, world);
    std::vector<float> p = initial_params(layout.num_params);
    const uint64_t bits = signum_packed_bytes(layout.num_params);
    bool identical = true;
    for (int s = 0; s < 4; s++) {
        std::vector<float> g = rank_gradient(layout.num_params, me, s);
        world.reset_counters();
        const StepResult r = opt.step(p, g, 0.01f);
        EXPECT_EQ(world.counters().payload_bytes, bits);
        EXPECT_EQ(world.counters().bytes_sent, bits * (W - 1));
        EXPECT_EQ(world.counters().bytes_recv, bits * (W - 1));
        EXPECT(r.seconds.transform > 0 && r.seconds.apply > 0 && r.seconds.clip > 0);
        EXPECT_EQ(r.grad_norm, grad_norm(rank_gradient(layout.num_params, me, s)));  // the local norm
        identical = identical && same_on_every_rank(p);
    }
    EXPECT(identical);
}

// A run of 4 steps equals 2 steps, a save, a fresh optimizer's load and 2 more, bit for bit.
TEST(state_round_trip_resumes_bit_identically) {
    Transport& world = *g_world;
    const int me = world.rank();
    const ParamLayout layout = awkward_layout();
    OptimizerConfig cfg;
    cfg.weight_decay = 0.1f;
    Signum straight(cfg, layout, world), first(cfg, layout, world);
    std::vector<float> p_straight = initial_params(layout.num_params), p_resumed = p_straight;
    for (int s = 0; s < 4; s++) {
        std::vector<float> g = rank_gradient(layout.num_params, me, s);
        straight.step(p_straight, g, 0.01f * (s + 1));
    }
    for (int s = 0; s < 2; s++) {
        std::vector<float> g = rank_gradient(layout.num_params, me, s);
        first.step(p_resumed, g, 0.01f * (s + 1));
    }
    ByteWriter w;
    first.save_state(w);
    Signum second(cfg, layout, world);
    ByteReader r(w.bytes(), "state.bin");
    second.load_state(r);
    EXPECT(r.at_end());
    EXPECT_EQ(second.steps(), int64_t{2});
    for (int s = 2; s < 4; s++) {
        std::vector<float> g = rank_gradient(layout.num_params, me, s);
        second.step(p_resumed, g, 0.01f * (s + 1));
    }
    EXPECT(std::memcmp(p_straight.data(), p_resumed.data(), p_straight.size() * sizeof(float)) == 0);
    EXPECT(std::memcmp(straight.momentum().data(), second.momentum().data(), p_straight.size() * sizeof(float)) == 0);
    EXPECT_EQ(second.steps(), int64_t{4});
}

// A blob of another optimizer, of another model size, or cut short is refused with one line naming the file.
TEST(state_of_another_optimizer_or_size_is_refused) {
    const ParamLayout layout = awkward_layout();
    LocalTransport local;
    OptimizerConfig cfg;
    Signum opt(cfg, layout, local);
    const auto refused = [&](std::span<const std::byte> blob, const char* needle) {
        ByteReader r(blob, "ck/state_rank0.bin");
        EXPECT_ERROR(opt.load_state(r), needle);
    };
    ByteWriter adamw_blob;
    AdamW(cfg, layout, local).save_state(adamw_blob);
    refused(adamw_blob.bytes(), "ck/state_rank0.bin: optimizer state is for 'adamw', not 'signum'");
    ByteWriter demo_blob;
    demo::DemoOptimizer(cfg, layout, local).save_state(demo_blob);
    refused(demo_blob.bytes(), "optimizer state is for 'demo', not 'signum'");

    ParamLayout smaller = layout;
    smaller.tensors.pop_back();
    smaller.num_params -= 64 * 64;
    ByteWriter small_blob;
    Signum(cfg, smaller, local).save_state(small_blob);
    refused(small_blob.bytes(), "Signum state has 64014 parameters, model has 68110");

    ByteWriter full;
    opt.save_state(full);
    refused(std::span<const std::byte>(full.bytes()).first(full.bytes().size() - 4), "corrupt or truncated");
    // and the other optimizers refuse a Signum blob
    ByteReader r(full.bytes(), "s.bin");
    AdamW other(cfg, layout, local);
    EXPECT_ERROR(other.load_state(r), "optimizer state is for 'signum', not 'adamw'");
}

// Out-of-range options: one line naming the flag.
TEST(options_are_checked) {
    const ParamLayout layout = awkward_layout();
    LocalTransport local;
    const auto with = [](auto set) {
        OptimizerConfig c;
        set(c);
        return c;
    };
    EXPECT_ERROR(Signum(with([](OptimizerConfig& c) { c.signum.beta = 1.0f; }), layout, local),
                 "--signum_beta must be in [0, 1) (got 1)");
    EXPECT_ERROR(Signum(with([](OptimizerConfig& c) { c.signum.beta = -0.5f; }), layout, local),
                 "--signum_beta must be in [0, 1) (got -0.5)");
    EXPECT_ERROR(Signum(with([](OptimizerConfig& c) { c.signum.beta = std::numeric_limits<float>::quiet_NaN(); }),
                        layout, local),
                 "--signum_beta must be in [0, 1)");
    EXPECT_ERROR(Signum(with([](OptimizerConfig& c) { c.weight_decay = -0.1f; }), layout, local),
                 "--weight_decay must be >= 0");
    EXPECT_ERROR(Signum(with([](OptimizerConfig& c) { c.shard_group_size = 2; }), layout, local),
                 "--shard_group_size: --optimizer signum runs flat only");
    Signum ok(OptimizerConfig{}, layout, local);
    std::vector<float> p(10), g(10);
    EXPECT_ERROR(ok.step(p, g, 0.01f), "signum: buffers of 10 / 10 floats, the layout has 68110");
}

}  // namespace

int main(int argc, char** argv) {
#ifndef LLMC_USE_MPI
    testing::skip("built without MPI (USE_MPI=0)");
#endif
    g_world = make_world_transport(&argc, &argv);
    int rc = 0;
    try {
        const std::string mode = argc >= 3 ? argv[1] : "";
        if (mode == "--write-cases") {
            rc = write_cases(argv[2]);
        } else if (mode == "--check-cases") {
            if (g_world->rank() != 0) std::freopen("/dev/null", "w", stdout);
            rc = check_cases(argv[2]);
        } else {
            if (g_world->rank() != 0) std::freopen("/dev/null", "w", stdout);
            rc = testing::run_all();
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        rc = 2;
    }
    std::vector<double> failed = {static_cast<double>(rc)};
    g_world->allreduce_max(failed);
    g_world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
