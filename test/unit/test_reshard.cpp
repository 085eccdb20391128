// Elastic resume's redistribution of per-rank optimizer state (llmc/optim/reshard.h, demo_reshard.h, AdamW's):
// which old ranks each new rank takes, on DeMo blobs written by the canonical writer (state_format.h) and read back
// by its reader: the mean over ranks is kept (within one fp32 rounding per element, against a long double sum),
// N -> 2N -> N and N -> M -> N for N, M in {1, 2, 4} return the original momenta bit for bit where the rule
// promises it, and blobs that cannot be redistributed (a pending delayed round, FlexDeMo's, sharded AdamW's,
// mismatched shapes) are refused naming the file; AdamW-DDP's state is old rank 0's on every new rank.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/demo_reshard.h"
#include "llmc/optim/demo/state_format.h"
#include "llmc/optim/optimizers.h"
#include "llmc/optim/reshard.h"
#include "test/support/testing.h"

namespace {
namespace cm = demo::cm;
using Momenta = std::vector<std::vector<float>>;  // one per rank

const demo::ModelPlan& plan() {
    static const demo::ModelPlan p = demo::plan_model({{37, 70}, {130}, {64, 64}}, 64, 8);
    return p;
}

Momenta random_momenta(int world, uint64_t seed) {
    llmc::Rng rng(seed);
    Momenta m(world, std::vector<float>(plan().num_params));
    for (auto& rank : m)
        for (float& x : rank) x = static_cast<float>((rng.uniform() - 0.5) * std::ldexp(1.0, int(rng.below(20)) - 10));
    return m;
}

std::vector<llmc::ByteWriter> blobs_of(const Momenta& m) {
    std::vector<llmc::ByteWriter> blobs(m.size());
    for (size_t r = 0; r < m.size(); r++) cm::write_state(blobs[r], plan(), m[r]);
    return blobs;
}

// What every new rank of `new_world` gets from the old ranks' momenta, through the blobs.
Momenta reshard(const Momenta& old, int new_world) {
    std::vector<llmc::ByteWriter> blobs = blobs_of(old);
    Momenta out(new_world);
    for (int j = 0; j < new_world; j++) {
        llmc::ByteWriter w;
        demo::reshard_state(static_cast<int>(old.size()), j, new_world,
                            [&](int r) { return llmc::ByteReader(blobs[r].bytes(), "old_rank" + std::to_string(r)); },
                            w);
        llmc::ByteReader in(w.bytes(), "new");
        cm::read_state(in, plan(), out[j]);  // the canonical reader takes it
        EXPECT(in.at_end());
    }
    return out;
}

long double rank_mean(const Momenta& m, size_t i) {
    long double s = 0;
    for (const auto& r : m) s += r[i];
    return s / m.size();
}
}  // namespace

TEST(rule_names_the_sources) {
    EXPECT(llmc::reshard_rule(2, 3, 4).sources == std::vector<int>{1});           // copy j mod N
    EXPECT(llmc::reshard_rule(4, 1, 2).sources == (std::vector<int>{1, 3}));      // j, j+M
    EXPECT(llmc::reshard_rule(4, 0, 1).sources == (std::vector<int>{0, 1, 2, 3}));
    EXPECT(llmc::reshard_rule(2, 2, 3).sources == (std::vector<int>{0, 1}));      // neither divides: all
    EXPECT(llmc::reshard_rule(3, 0, 2).sources == (std::vector<int>{0, 1, 2}));
}

TEST(mean_over_ranks_is_kept) {
    for (int n : {1, 2, 3, 4})
        for (int m : {1, 2, 3, 4}) {
            const Momenta old = random_momenta(n, 100 + n * 10 + m);
            const Momenta now = reshard(old, m);
            double worst = 0;  // in units of the fp32 rounding of a new value (2^-24 of its magnitude, relative)
            for (size_t i = 0; i < plan().num_params; i++) {
                const long double want = rank_mean(old, i), got = rank_mean(now, i);
                long double scale = 0;
                for (const auto& r : now) scale = std::max<long double>(scale, std::fabs(r[i]));
                if (scale > 0) worst = std::max<double>(worst, double(std::fabs(got - want) / (scale * std::ldexp(1.0L, -24))));
            }
            EXPECT(worst <= 1.0);
            if (m % n == 0) EXPECT(worst == 0.0);  // copies: exact
        }
}

TEST(two_n_to_n_is_the_rounded_exact_mean) {
    const Momenta old = random_momenta(4, 7);
    const Momenta now = reshard(old, 2);
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; i < plan().num_params; i++) {
            const long double exact = (static_cast<long double>(old[j][i]) + old[j + 2][i]) / 2;
            const float rounded = static_cast<float>(exact);
            if (now[j][i] != rounded) {
                EXPECT(now[j][i] == rounded);
                return;
            }
        }
}

TEST(round_trips_return_the_momenta_bit_for_bit) {
    for (int n : {1, 2, 4})
        for (int m : {1, 2, 4}) {
            const Momenta old = random_momenta(n, 31 * n + m);
            const Momenta back = reshard(reshard(old, m), n);
            // N -> M -> N is the identity when M is a multiple of N (copies, then means of equal copies); with
            // M < N the ranks' momenta were averaged: every rank j comes back as the mean of its group
            if (m % n == 0) {
                EXPECT(back == old);
            } else {
                const Momenta via = reshard(old, m);
                for (int j = 0; j < n; j++) EXPECT(back[j] == via[j % m]);
            }
        }
}

TEST(refuses_what_it_cannot_redistribute) {
    const Momenta old = random_momenta(2, 5);
    auto refuse = [&](std::vector<llmc::ByteWriter>& blobs) {
        return [&blobs]() {
            llmc::ByteWriter w;
            demo::reshard_state(2, 0, 1, [&](int r) { return llmc::ByteReader(blobs[r].bytes(), "ck/state_rank" + std::to_string(r) + ".bin"); }, w);
        };
    };
    std::vector<llmc::ByteWriter> pending(2);
    demo::PendingRound round;
    round.present = true;
    round.lr = 0.1f;
    round.bucket.resize(16);
    for (int r = 0; r < 2; r++) cm::write_state(pending[r], plan(), old[r], cm::MomentumDomain::spatial, round);
    EXPECT_ERROR(refuse(pending)(), "ck/state_rank0.bin: DeMo state holds a delayed round not yet applied");
    std::vector<llmc::ByteWriter> other(2);
    other[0].put_string("flexdemo");
    other[1].put_string("flexdemo");
    EXPECT_ERROR(refuse(other)(), "ck/state_rank0.bin: optimizer state 'flexdemo' cannot be redistributed");
    std::vector<llmc::ByteWriter> mixed = blobs_of(old);
    mixed[1] = llmc::ByteWriter();
    const demo::ModelPlan small = demo::plan_model({{37, 70}, {130}, {64, 63}}, 64, 8);
    cm::write_state(mixed[1], small, std::vector<float>(small.num_params));
    EXPECT_ERROR(refuse(mixed)(), "ck/state_rank1.bin: DeMo state of another shape");
}

// AdamW-DDP: old rank 0's moments on every new rank, field for field; ZeRO-1's shards refused.
TEST(adamw_takes_rank_0s_and_refuses_shards) {
    const auto reshard = llmc::optimizer_family("adamw").reshard_state;
    EXPECT(reshard != nullptr);
    EXPECT(llmc::optimizer_family("signum").reshard_state == nullptr);
    EXPECT(llmc::optimizer_family("diloco").reshard_state == nullptr);
    EXPECT(llmc::optimizer_family("topk").reshard_state == llmc::optimizer_family("demo").reshard_state);
    llmc::ByteWriter old;
    old.put_string("adamw");
    old.put<uint64_t>(3);
    old.put<int64_t>(17);
    const std::vector<float> m = {1.5f, -2.0f, 0.25f}, v = {4.0f, 0.5f, 1e-8f};
    old.put_array(std::span<const float>(m));
    old.put_array(std::span<const float>(v));
    int asked = -1;
    for (int j = 0; j < 3; j++) {
        llmc::ByteWriter w;
        reshard(2, j, 3, [&](int r) { asked = r; return llmc::ByteReader(old.bytes(), "s0"); }, w);
        EXPECT_EQ(asked, 0);
        EXPECT(w.bytes().size() == old.bytes().size() &&
               std::equal(w.bytes().begin(), w.bytes().end(), old.bytes().begin()));
    }
    llmc::ByteWriter sharded;
    sharded.put_string("adamw-sharded");
    llmc::ByteWriter w;
    EXPECT_ERROR(reshard(2, 0, 1, [&](int) { return llmc::ByteReader(sharded.bytes(), "ck/state_rank0.bin"); }, w),
                 "ck/state_rank0.bin: optimizer state 'adamw-sharded' cannot be redistributed");
}

TEST_MAIN()
