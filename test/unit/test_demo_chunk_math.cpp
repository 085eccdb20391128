// Host tests of llmc/optim/demo/demo_chunk_math.h, the per-chunk math the CUDA DeMo kernels run (the same functions,
// compiled here by g++). They prove the canonical computation reproduces the CPU DemoOptimizer:
//  - compress on several plans (64x64 chunks, [96,50], [7], [50,1000], [3,5], a d12-sized [768,768], mixed,
//    prime sizes giving 1 x 64, 64 x 1 and 1 x 1 chunks)
//    and options (fp32/bf16/sign values, smallest/packed12 indices, lr/EMA momentum, alpha 1/0.2, topk
//    3/5/32, chunk 16/64, from zero and from random momentum): the canonical bucket decodes to the same index
//    sets except in near-tie chunks (verified with fp64 E), values within 2e-5 of the chunk's largest value
//    (summation orders differ: folded DCT with fmaf chains vs OpenBLAS sgemm), bf16 values equal or one bf16
//    ulp apart at a rounding boundary, sign bits equal, and the momentum within 2e-5 of the chunk's largest;
//    the canonical bucket re-encodes byte-identically through the codec (same layout, padding, bit packing);
//  - apply over 1 and 3 ranks' CPU buckets: parameters bit-equal except where the decoded value is within
//    rounding of zero (fp64 check), counted;
//  - the pieces: option validation and bucket-header checks give the CPU's messages, the state blob is the
//    CPU's byte for byte, the folded bases hold the CPU's basis values, register tiles do not change any
//    value, the top-k search picks the CPU's set (ties to the lower index) on adversarial keys, the wire
//    helpers round-trip, and corrupt buckets raise the apply error flags.
// Each comparison prints its measured agreement.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "llmc/optim/demo/plan_tables.h"
#include "llmc/optim/demo/state_format.h"
#include "test/support/demo_agreement.h"
#include "test/support/demo_host_reference.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"

namespace {

using llmc::DemoIndexEncoding;
using llmc::DemoMomentum;
using llmc::DemoValueEncoding;
namespace cm = demo::cm;

// Sets the CPU optimizer's momentum through its state blob (written by the canonical writer).
void set_cpu_momentum(demo::DemoOptimizer& opt, const cm::PlanTables& pt, const std::vector<float>& m) {
    llmc::ByteWriter w;
    cm::write_state(w, pt.plan, m);
    llmc::ByteReader r(w.bytes(), "momentum");
    opt.load_state(r);
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const llmc::Error& e) {
        return e.what();
    }
    return "(no error)";
}

struct Case {
    std::string name;
    std::vector<std::vector<size_t>> shapes;
    llmc::OptimizerConfig cfg;
};

std::vector<Case> cases() {
    const auto fp32 = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32);
    const auto bf16 = cm::demo_config(DemoValueEncoding::bf16, DemoIndexEncoding::packed12, DemoMomentum::ema, 0.2f, 5);
    const auto sign = cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 3);
    const auto small = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 0.5f, 7, 16);
    const std::vector<std::vector<size_t>> mixed = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}};
    std::vector<Case> out;
    for (const auto& [label, cfg] : {std::pair{"fp32/u16/lr/a1/k32", fp32}, std::pair{"bf16/p12/ema/a.2/k5", bf16},
                                     std::pair{"sign/u16/lr/a1/k3", sign}}) {
        out.push_back({std::string("64x64 [128,192]+[192] ") + label, {{128, 192}, {192}}, cfg});
        out.push_back({std::string("[96,50] ") + label, {{96, 50}}, cfg});
        out.push_back({std::string("[7] ") + label, {{7}}, cfg});
        out.push_back({std::string("[50,1000] ") + label, {{50, 1000}}, cfg});
        out.push_back({std::string("[3,5] ") + label, {{3, 5}}, cfg});
    }
    out.push_back({"d12 [768,768] fp32/u16/lr/a1/k32", {{768, 768}}, fp32});
    // prime sizes > chunk: n1 = 1 ([67,64]), n2 = 1 ([64,67]), 1x1 chunks ([67,67]: every element sent)
    out.push_back({"primes [67,64]+[64,67]+[67,67] fp32/k32", {{67, 64}, {64, 67}, {67, 67}}, fp32});
    out.push_back({"primes [67,64]+[64,67]+[67,67] sign/k3", {{67, 64}, {64, 67}, {67, 67}}, sign});
    out.push_back({"mixed chunk16 fp32/p12/lr/a.5/k7", mixed, small});
    out.push_back({"mixed bf16/p12/ema/a.2/k5", mixed, bf16});
    return out;
}

}  // namespace

// The CPU optimizer refuses each bad option with the one-line message that names its flag (the CUDA optimizer and
// validate_config run the same validate_demo_options).
TEST(bad_options_refused_naming_the_flag) {
    const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{96, 50}, {7}});
    llmc::LocalTransport transport;
    const std::vector<std::pair<std::function<void(llmc::OptimizerConfig&)>, std::string>> cases = {
        {[](llmc::OptimizerConfig& c) { c.demo.topk = 0; }, "--demo_topk must be >= 1 (got 0)"},
        {[](llmc::OptimizerConfig& c) { c.demo.chunk = -3; }, "--demo_chunk must be >= 1 (got -3)"},
        {[](llmc::OptimizerConfig& c) { c.demo.decay = 1.0f; }, "--demo_decay must be in [0, 1) (got 1)"},
        {[](llmc::OptimizerConfig& c) { c.demo.decay = std::nanf(""); }, "--demo_decay must be in [0, 1) (got nan)"},
        {[](llmc::OptimizerConfig& c) { c.demo.feedback_alpha = 0.0f; }, "--demo_alpha must be in (0, 1] (got 0)"},
        {[](llmc::OptimizerConfig& c) { c.demo.feedback_alpha = 1.5f; }, "--demo_alpha must be in (0, 1] (got 1.5)"},
        {[](llmc::OptimizerConfig& c) { c.weight_decay = -1e-3f; }, "--weight_decay must be >= 0 (got -0.001)"},
        {[](llmc::OptimizerConfig& c) { c.demo.chunk = 4097; }, "--demo_chunk must be <= 4096 (got 4097)"},
        {[](llmc::OptimizerConfig& c) { c.demo.kernel_tuning = 13; },
         "--demo_kernel_tuning must be -1 or a row of demo::kTunings, 0 to 12 (got 13)"},
    };
    for (const auto& [edit, message] : cases) {
        llmc::OptimizerConfig cfg;
        edit(cfg);
        EXPECT_EQ(error_of([&] { demo::DemoOptimizer opt(cfg, layout, transport); }), message);
    }
    llmc::OptimizerConfig ok;
    EXPECT_EQ(error_of([&] { demo::DemoOptimizer opt(ok, layout, transport); }), std::string("(no error)"));
}

TEST(folded_bases_hold_cpu_basis_values) {
    for (size_t n : {1, 2, 3, 5, 7, 48, 50, 63, 64}) {
        const std::vector<float> c = demo::dct_basis(n), f = cm::folded_basis(n);
        const int he = int(n + 1) / 2, ho = int(n) / 2, ld = cm::ceil4(he);
        bool ok = true;
        for (int r = 0; r < he; r++)
            for (int j = 0; j < ld; j++)
                ok = ok && f[size_t(r) * ld + j] == (j < he ? c[size_t(2 * j) * n + r] : 0.0f);
        for (int r = 0; r < ho; r++)
            for (int j = 0; j < ld; j++)
                ok = ok && f[size_t(he + r) * ld + j] == (j < ho ? c[size_t(2 * j + 1) * n + r] : 0.0f);
        EXPECT(ok);
    }
}

// The kernels use 4 x 4 register tiles with strided columns; the host reference 1 x 1 tiles. Same values.
TEST(register_tiles_do_not_change_values) {
    const int K = 37, J = 13, C = 50, lda = 16, irs = 53;
    const std::vector<float> A = testing::random_normal(size_t(K) * lda, 1, 1.0), In = testing::random_normal(size_t(K) * irs, 2, 1.0);
    std::vector<float> out1(size_t(J) * C), out4(size_t(J) * C, 0.0f);
    cm::MatmulJob jb{A.data(), lda, In.data(), irs, 1, K, J, C, out1.data(), C, 1};
    cm::run_job_host(jb);
    for (int j0 = 0; j0 < J; j0 += 4)
        for (int c0 = 0; c0 < 16; c0++) {
            int cofs[4];
            for (int b = 0; b < 4; b++) cofs[b] = std::min(c0 + 16 * b, C - 1);
            float acc[4][4] = {};
            cm::mm_tile<4, 4>(A.data() + j0, lda, In.data(), irs, cofs, K, acc);
            for (int q = 0; q < 4; q++)
                for (int b = 0; b < 4; b++)
                    if (j0 + q < J && c0 + 16 * b < C) out4[size_t(j0 + q) * C + c0 + 16 * b] = acc[q][b];
        }
    EXPECT(std::memcmp(out1.data(), out4.data(), out1.size() * sizeof(float)) == 0);
}

// The indices a top-k rule selects, ascending: keys >= above, then the first `need` ties.
std::vector<uint32_t> selected_by(const cm::TopkRule& rule, const std::vector<uint32_t>& keys) {
    std::vector<uint32_t> out;
    uint32_t ties = 0;
    for (uint32_t i = 0; i < uint32_t(keys.size()); i++) {
        if (cm::topk_greater(rule, keys[i])) out.push_back(i);
        else if (cm::topk_tie(rule, keys[i]) && ties++ < rule.need) out.push_back(i);
    }
    return out;
}

// The binary-search top-k picks exactly the CPU's select_topk set, also with heavy ties, zeros and NaN.
TEST(topk_search_matches_cpu_selection) {
    llmc::Rng rng(7);
    demo::TopkScratch scratch;
    int checked = 0, mismatches = 0;
    for (int trial = 0; trial < 400; trial++) {
        const size_t n = 1 + rng.next_u64() % 300;
        const size_t k = 1 + rng.next_u64() % n;
        std::vector<float> v(n);
        const int mode = trial % 5;
        for (size_t i = 0; i < n; i++) {
            const double x = rng.normal();
            if (mode == 0) v[i] = static_cast<float>(x);
            else if (mode == 1) v[i] = static_cast<float>(std::round(x * 2.0) / 2.0);  // many equal magnitudes
            else if (mode == 2) v[i] = 0.0f;
            else if (mode == 3) v[i] = (i % 3 == 0) ? -1.0f : 1.0f;
            else v[i] = (i == n / 2) ? std::nanf("") : static_cast<float>(x);
        }
        std::vector<uint32_t> cpu(k);
        demo::select_topk(v, k, cpu.data(), scratch);
        std::vector<uint32_t> keys(n);
        uint32_t max_key = 0;
        for (size_t i = 0; i < n; i++) max_key = std::max(max_key, keys[i] = cm::magnitude_key(v[i]));
        cm::TopkSearch s = cm::topk_search_init(max_key, uint32_t(n));
        int steps = 0;
        while (cm::topk_search_active(s, uint32_t(k))) {
            const uint32_t mid = cm::topk_search_mid(s);
            uint32_t c = 0;
            for (uint32_t key : keys) c += key >= mid;
            cm::topk_search_update(s, mid, c, uint32_t(k));
            steps++;
        }
        EXPECT(steps <= 32);
        const cm::TopkRule rule = cm::topk_rule(s, uint32_t(k));
        const std::vector<uint32_t> mine = selected_by(rule, keys);
        checked++;
        if (mine != cpu) mismatches++;
    }
    std::printf("  top-k: %d selections compared with select_topk, %d differ\n", checked, mismatches);
    EXPECT_EQ(mismatches, 0);
}

// The radix select of the kernels (histogram rounds over 8-bit digits) picks the CPU's select_topk set too, on
// the same kinds of keys plus whole 64 x 64 chunks and keys that share long prefixes (exact counts reached
// after 1, 2, 3 or 4 digits, ties on the last one), in at most 4 rounds.
TEST(radix_select_matches_cpu_selection) {
    llmc::Rng rng(11);
    demo::TopkScratch scratch;
    int checked = 0, mismatches = 0, rounds_seen[5] = {0, 0, 0, 0, 0};
    for (int trial = 0; trial < 1200; trial++) {
        const size_t n = trial % 3 == 0 ? 4096 : 1 + rng.next_u64() % 300;
        const size_t k = trial % 7 == 0 ? n : 1 + rng.next_u64() % std::min<size_t>(n, trial % 2 ? 40 : n);
        std::vector<float> v(n);
        const int mode = trial % 7;
        const uint32_t base = 0x3c000000u + uint32_t(rng.next_u64() % 0x1000000u);
        for (size_t i = 0; i < n; i++) {
            const double x = rng.normal();
            if (mode == 0) v[i] = static_cast<float>(x);
            else if (mode == 1) v[i] = static_cast<float>(std::round(x * 2.0) / 2.0);
            else if (mode == 2) v[i] = 0.0f;
            else if (mode == 3) v[i] = (i % 3 == 0) ? -1.0f : 1.0f;
            else if (mode == 4) v[i] = (i == n / 2) ? std::nanf("") : static_cast<float>(x);
            else {  // bit patterns sharing the top 1-3 bytes, varying low bits only
                const int free_bits = mode == 5 ? 8 : 16;
                const uint32_t bits = base + uint32_t(rng.next_u64() % (1u << free_bits));
                float f;
                std::memcpy(&f, &bits, 4);
                v[i] = (i & 1) ? -f : f;
            }
        }
        std::vector<uint32_t> cpu(k);
        demo::select_topk(v, k, cpu.data(), scratch);
        std::vector<uint32_t> keys(n);
        for (size_t i = 0; i < n; i++) keys[i] = cm::magnitude_key(v[i]);
        cm::RadixSelect s = cm::radix_select_init(uint32_t(n), uint32_t(k));
        int rounds = 0;
        while (!s.done) {
            uint32_t hist[256] = {};
            for (uint32_t key : keys)
                if (cm::radix_counts(s, key)) hist[cm::radix_digit(s, key)]++;
            uint32_t above = 0;
            const uint32_t digit = cm::pick_bin(hist, 256, s.need, &above);
            cm::radix_select_step(s, digit, above, hist[digit]);
            rounds++;
        }
        EXPECT(rounds <= 4);
        rounds_seen[rounds]++;
        const std::vector<uint32_t> mine = selected_by(s.rule, keys);
        checked++;
        if (mine != cpu) mismatches++;
    }
    std::printf("  radix top-k: %d selections compared with select_topk, %d differ; rounds 0/1/2/3/4: %d/%d/%d/%d/%d\n",
                checked, mismatches, rounds_seen[0], rounds_seen[1], rounds_seen[2], rounds_seen[3], rounds_seen[4]);
    EXPECT_EQ(mismatches, 0);
    for (int r = 1; r <= 4; r++) EXPECT(rounds_seen[r] > 0);  // every exit of the search was exercised
}

// The kernels' fast path (one histogram of cm::coarse_bin, exact ranking among the keys of the k-th largest's
// bin) gives the CPU's select_topk set whenever it applies (that bin is taken whole, or holds at most
// kMaxTopkCandidates keys); the rest falls back to RadixSelect (tested above). All three outcomes occur.
TEST(coarse_topk_matches_cpu_selection) {
    llmc::Rng rng(13);
    demo::TopkScratch scratch;
    int checked = 0, mismatches = 0, whole = 0, ranked = 0, fallback = 0;
    for (int trial = 0; trial < 1500; trial++) {
        const size_t n = trial % 2 ? 4096 : 64 + rng.next_u64() % 2000;
        const size_t k = trial % 3 == 0 ? 1 + rng.next_u64() % 64 : 32;
        std::vector<float> v(n);
        const int mode = trial % 6;
        for (size_t i = 0; i < n; i++) {
            const double x = rng.normal();
            if (mode <= 2) v[i] = static_cast<float>(x * std::exp(rng.normal()));  // heavy-tailed magnitudes
            else if (mode == 3) v[i] = static_cast<float>(std::round(x * 8.0) / 8.0);  // ties
            else if (mode == 4) v[i] = (i % 7 == 0) ? static_cast<float>(x) : 0.0f;  // mostly zeros
            else v[i] = 1.0f + static_cast<float>(i % 97) * 1e-4f;                   // one narrow bin
        }
        std::vector<uint32_t> keys(n);
        for (size_t i = 0; i < n; i++) keys[i] = cm::magnitude_key(v[i]);
        std::vector<uint32_t> hist(cm::kCoarseBins, 0);
        for (uint32_t key : keys) hist[cm::coarse_bin(key)]++;
        uint32_t above = 0;
        const uint32_t B = cm::pick_bin(hist.data(), cm::kCoarseBins, uint32_t(k), &above);
        const uint32_t need = uint32_t(k) - above, C = hist[B];
        cm::TopkRule rule;
        if (C == need) {
            rule = cm::topk_rule_at(B << (31 - cm::kCoarseBits), 0, need, need);
            whole++;
        } else if (C <= cm::kMaxTopkCandidates) {
            std::vector<uint32_t> cand;
            for (uint32_t key : keys)
                if (cm::coarse_bin(key) == B) cand.push_back(key);
            EXPECT_EQ(uint32_t(cand.size()), C);
            int holders = 0;
            for (uint32_t c : cand) {
                uint32_t g = 0, t = 0;
                for (uint32_t o : cand) g += o > c, t += o == c;
                if (cm::is_rank_holder(g, t, need)) {
                    rule = cm::topk_rule_at(c, g, t, need);
                    holders++;
                }
            }
            EXPECT(holders >= 1);
            ranked++;
        } else {
            fallback++;
            continue;
        }
        std::vector<uint32_t> cpu(k);
        demo::select_topk(v, k, cpu.data(), scratch);
        const std::vector<uint32_t> mine = selected_by(rule, keys);
        checked++;
        if (mine != cpu) mismatches++;
    }
    std::printf("  coarse top-k: %d selections compared with select_topk, %d differ; bin taken whole %d, "
                "candidates ranked %d, fallback %d\n", checked, mismatches, whole, ranked, fallback);
    EXPECT_EQ(mismatches, 0);
    EXPECT(whole > 0 && ranked > 0 && fallback > 0);
}

TEST(wire_helpers_round_trip) {
    std::vector<uint8_t> buf(4096, 0);
    auto or_word = [](uint8_t* w, uint32_t bits) { cm::store_u32(w, cm::load_u32(w) | bits); };
    llmc::Rng rng(3);
    std::vector<uint32_t> idx(200);
    for (uint32_t& i : idx) i = uint32_t(rng.next_u64() % 4096);
    for (size_t s = 0; s < idx.size(); s++) cm::put_index(buf.data(), cm::kIndicesPacked12, 2, s, idx[s], or_word);
    bool ok = true;
    for (size_t s = 0; s < idx.size(); s++) ok = ok && cm::get_index(buf.data(), cm::kIndicesPacked12, 2, s) == idx[s];
    for (int bytes : {1, 2, 4}) {
        std::vector<uint8_t> b2(1024, 0);
        for (size_t s = 0; s < 100; s++) cm::put_index(b2.data(), cm::kIndicesSmallest, bytes, s, idx[s] & 0xff, or_word);
        for (size_t s = 0; s < 100; s++) ok = ok && cm::get_index(b2.data(), cm::kIndicesSmallest, bytes, s) == (idx[s] & 0xff);
    }
    std::vector<uint8_t> vb(1024, 0);
    for (size_t s = 0; s < 100; s++) cm::put_sign_bit(vb.data(), s, (s % 3 == 0) ? -1.0f : 1.0f, or_word);
    for (size_t s = 0; s < 100; s++) ok = ok && cm::get_value(vb.data(), cm::kValuesSign, s, 0.5f) == ((s % 3 == 0) ? -0.5f : 0.5f);
    ok = ok && cm::get_value(vb.data(), cm::kValuesSign, 0, 0.0f) == 0.0f;
    EXPECT(ok);
}

TEST(header_state_and_bucket_checks_match_cpu) {
    const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{96, 50}, {7}, {128, 64}});
    for (const auto& cfg : {cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::lr_scaled, 1.0f, 5),
                            cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::ema, 1.0f, 32)}) {
        const cm::PlanTables pt = cm::plan_tables(cfg, layout);
        llmc::LocalTransport transport;
        demo::DemoOptimizer opt(cfg, layout, transport);
        std::vector<float> p = testing::random_normal(layout.num_params, 11, 0.02), g = testing::random_normal(layout.num_params, 12, 1.0);
        std::vector<std::byte> bucket;
        llmc::StepTimings tm;
        opt.compress(p, g, 1e-3f, bucket, tm);
        EXPECT_EQ(bucket.size(), pt.bucket_bytes);
        EXPECT(std::memcmp(bucket.data(), pt.header.data(), demo::kBucketHeaderBytes) == 0);
        // state blob: byte for byte, and readable back
        llmc::ByteWriter wc, wm;
        opt.save_state(wc);
        cm::write_state(wm, pt.plan, opt.momentum());
        EXPECT(wc.bytes() == wm.bytes());
        std::vector<float> back;
        llmc::ByteReader r(wc.bytes(), "state.bin");
        cm::read_state(r, pt.plan, back);
        EXPECT(r.at_end());
        EXPECT(std::equal(back.begin(), back.end(), opt.momentum().begin()));
        // a state of another topk: the same message as the CPU's load_state
        llmc::OptimizerConfig other = cfg;
        other.demo.topk = 6;
        const cm::PlanTables pt2 = cm::plan_tables(other, layout);
        std::vector<float> dummy;
        demo::DemoOptimizer opt2(other, layout, transport);
        EXPECT_EQ(error_of([&] { llmc::ByteReader rr(wc.bytes(), "s"); cm::read_state(rr, pt2.plan, dummy); }),
                  error_of([&] { llmc::ByteReader rr(wc.bytes(), "s"); opt2.load_state(rr); }));
        // corrupt headers and sizes: decode_bucket's messages
        std::vector<std::pair<size_t, uint8_t>> corruptions = {{0, 0x11}, {4, 9}, {6, 7}, {7, 7}, {8, 99}, {16, 1}, {24, 5}};
        for (auto [off, val] : corruptions) {
            std::vector<std::byte> bad = bucket;
            bad[off] = std::byte{val};
            demo::Selection sel;
            const std::string cpu = error_of([&] { demo::decode_bucket(pt.plan, pt.format, bad, sel, "rank 2"); });
            const std::string mine = error_of([&] {
                cm::check_bucket_header(pt.plan, pt.format, std::span(bad).first(32), bad.size(), "rank 2");
            });
            EXPECT_EQ(cpu, mine);
        }
        std::vector<std::byte> longer = bucket;
        longer.resize(bucket.size() + 4);
        demo::Selection sel;
        EXPECT_EQ(error_of([&] { demo::decode_bucket(pt.plan, pt.format, longer, sel, "rank 1"); }),
                  error_of([&] { cm::check_bucket_header(pt.plan, pt.format, std::span(longer).first(32), longer.size(), "rank 1"); }));
    }
}

// Compress: canonical (host) vs DemoOptimizer::compress, from zero momentum and from random momentum.
TEST(compress_matches_cpu_optimizer) {
    int failures = 0;
    for (const Case& cs : cases()) {
        const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes(cs.shapes);
        const cm::PlanTables pt = cm::plan_tables(cs.cfg, layout);
        const size_t n = layout.num_params;
        for (int from_random = 0; from_random < 2; from_random++) {
            llmc::LocalTransport transport;
            demo::DemoOptimizer opt(cs.cfg, layout, transport);
            const std::vector<float> m0 = from_random ? testing::random_normal(n, 100, 1e-3) : std::vector<float>(n, 0.0f);
            if (from_random) set_cpu_momentum(opt, pt, m0);
            std::vector<float> params = testing::random_normal(n, 101, 0.02);
            std::vector<float> grads = testing::random_normal(n, 102, 1.0);
            // clip the gradient as step() would; the canonical compress multiplies by the same scale
            std::vector<float> clipped = grads;
            const double norm = llmc::clip_grad_norm(clipped, cs.cfg.grad_clip);
            const float clip = llmc::km::clip_scale(norm, cs.cfg.grad_clip);
            const float lr = 6e-4f;
            std::vector<std::byte> cpu_bucket, mine_bucket;
            llmc::StepTimings tm;
            opt.compress(params, clipped, lr, cpu_bucket, tm);
            std::vector<float> delta = m0;
            const cm::CompressParams cp = cm::compress_params(cs.cfg, lr, clip);
            cm::compress_plan_host(pt, delta.data(), grads.data(), cp, mine_bucket);
            const std::vector<float> cpu_m(opt.momentum().begin(), opt.momentum().end());
            const cm::CompressAgreement a = cm::compare_compress(pt, mine_bucket, cpu_bucket, delta, cpu_m, m0, grads, cp);
            const bool ok = a.ok(2e-5, 2e-5);
            std::printf("  %-40s %s: %s\n", cs.name.c_str(), from_random ? "random m" : "zero m  ", a.describe().c_str());
            if (!ok) failures++;
        }
    }
    EXPECT_EQ(failures, 0);
}

// Ties: a tensor whose momentum and gradient are zero has E == 0 everywhere; both pick the first k indices.
TEST(compress_ties_match_cpu_optimizer) {
    for (const auto& cfg : {cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 32),
                            cm::demo_config(DemoValueEncoding::sign, DemoIndexEncoding::packed12, DemoMomentum::ema, 1.0f, 5)}) {
        const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{64, 64}, {96, 50}, {7}});
        const cm::PlanTables pt = cm::plan_tables(cfg, layout);
        const size_t n = layout.num_params, zeros = 64 * 64;
        std::vector<float> m0 = testing::random_normal(n, 500, 1e-3), grads = testing::random_normal(n, 501, 1.0);
        std::fill(m0.begin(), m0.begin() + zeros, 0.0f);
        std::fill(grads.begin(), grads.begin() + zeros, 0.0f);
        llmc::LocalTransport transport;
        demo::DemoOptimizer opt(cfg, layout, transport);
        set_cpu_momentum(opt, pt, m0);
        std::vector<float> params = testing::random_normal(n, 502, 0.02);
        std::vector<std::byte> cpu_bucket, mine_bucket;
        llmc::StepTimings tm;
        opt.compress(params, grads, 1e-3f, cpu_bucket, tm);  // no clipping: clip scale 1
        std::vector<float> delta = m0;
        const cm::CompressParams cp = cm::compress_params(cfg, 1e-3f, 1.0f);
        cm::compress_plan_host(pt, delta.data(), grads.data(), cp, mine_bucket);
        const std::vector<float> cpu_m(opt.momentum().begin(), opt.momentum().end());
        const cm::CompressAgreement a = cm::compare_compress(pt, mine_bucket, cpu_bucket, delta, cpu_m, m0, grads, cp);
        std::printf("  zero tensor + [96,50] + [7] %s: %s\n", demo::value_encoding_name(cfg.demo.values), a.describe().c_str());
        EXPECT(a.ok(2e-5, 2e-5));
        EXPECT_EQ(a.set_mismatch, size_t{0});
        demo::Selection sel;
        demo::decode_bucket(pt.plan, pt.format, mine_bucket, sel, "canonical");
        bool first_k = true;  // the zero chunk sends indices 0..k-1
        for (size_t j = 0; j < pt.plan.tensors[0].k; j++) first_k = first_k && sel.indices[j] == j;
        EXPECT(first_k);
    }
}

// Apply: canonical (host) vs DemoOptimizer::apply on the same CPU buckets of 1 and 3 ranks.
TEST(apply_matches_cpu_optimizer) {
    int failures = 0;
    for (const Case& cs : cases()) {
        const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes(cs.shapes);
        const cm::PlanTables pt = cm::plan_tables(cs.cfg, layout);
        const size_t n = layout.num_params;
        for (int world : {1, 3}) {
            llmc::LocalTransport transport;
            const std::vector<float> p0 = testing::random_normal(n, 200, 0.02);
            std::vector<float> p_cpu = p0;
            std::vector<std::byte> all;
            std::vector<size_t> offsets{0};
            llmc::StepTimings tm;
            const float lr = 1e-3f;
            std::unique_ptr<demo::DemoOptimizer> rank0;
            for (int r = 0; r < world; r++) {
                auto opt = std::make_unique<demo::DemoOptimizer>(cs.cfg, layout, transport);
                set_cpu_momentum(*opt, pt, testing::random_normal(n, 300 + r, 1e-3));
                std::vector<float> g = testing::random_normal(n, 400 + r, 1.0), p = p0;
                std::vector<std::byte> b;
                opt->compress(r == 0 ? p_cpu : p, g, lr, b, tm);  // rank 0's compress applies the weight decay
                all.insert(all.end(), b.begin(), b.end());
                offsets.push_back(all.size());
                if (r == 0) rank0 = std::move(opt);
            }
            rank0->apply(all, offsets, p_cpu, lr, tm);
            std::vector<float> p_mine = p0;
            const uint32_t err = cm::apply_plan_host(pt, all.data(), p_mine.data(),
                                                     cm::apply_params(cs.cfg, lr, world, pt.bucket_bytes));
            EXPECT_EQ(err, 0u);
            const cm::ApplyAgreement a = cm::compare_apply(pt, all, world, p_mine, p_cpu);
            std::printf("  %-40s %d rank(s): %s\n", cs.name.c_str(), world, a.describe().c_str());
            if (!a.ok()) failures++;
        }
    }
    EXPECT_EQ(failures, 0);
}

// Canonical compress + apply bucket round trip, and corrupt buckets raise the error flags.
TEST(apply_flags_corrupt_buckets) {
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 4);
    const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{96, 50}});  // 48 x 50 chunks: u16 indices
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    std::vector<float> delta(n, 0.0f), grads = testing::random_normal(n, 9, 1.0), p = testing::random_normal(n, 10, 0.02);
    std::vector<std::byte> bucket;
    cm::compress_plan_host(pt, delta.data(), grads.data(), cm::compress_params(cfg, 1e-3f, 1.0f), bucket);
    const cm::ApplyParams ap = cm::apply_params(cfg, 1e-3f, 1, pt.bucket_bytes);
    EXPECT_EQ(cm::apply_plan_host(pt, bucket.data(), p.data(), ap), 0u);
    uint8_t* idx = reinterpret_cast<uint8_t*>(bucket.data()) + pt.tensors[0].indices_off;
    std::vector<std::byte> bad = bucket;
    cm::store_u16(reinterpret_cast<uint8_t*>(bad.data()) + pt.tensors[0].indices_off + 2, 48 * 50);  // out of range
    EXPECT_EQ(cm::apply_plan_host(pt, bad.data(), p.data(), ap) & cm::kErrIndexRange, cm::kErrIndexRange);
    bad = bucket;
    const uint16_t first = cm::load_u16(idx);
    cm::store_u16(reinterpret_cast<uint8_t*>(bad.data()) + pt.tensors[0].indices_off + 2, first);  // duplicate
    EXPECT_EQ(cm::apply_plan_host(pt, bad.data(), p.data(), ap) & cm::kErrNotAscending, cm::kErrNotAscending);
}

// The momentum's domain in the state blob (the CUDA dct_momentum tunings keep the 64 x 64 chunks' momentum as
// M = C1 m C2^T): cm::convert_momentum against the DCT's definition in double on the 64 x 64 chunks, the other
// chunks untouched, the round trip within rounding; a blob saved in the DCT domain reads
// back bit for bit in that domain and converted in the other; version-1 blobs (no domain field) still read as
// spatial; an unknown domain is refused with a message.
TEST(momentum_domain_in_state_blobs) {
    const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{128, 64}, {96, 50}, {7}});
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 8);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    const size_t n = layout.num_params;
    const std::vector<float> m = testing::random_normal(n, 21, 1e-3);
    using Domain = cm::MomentumDomain;
    std::vector<float> M = m;
    cm::convert_momentum(pt.plan, M, Domain::spatial, Domain::dct64);
    // the 128 x 64 tensor (two 64 x 64 chunks) against the definition, E = C m C^T in double with
    // C[k][n] = sqrt((k == 0 ? 1 : 2) / 64) cos(pi (2n + 1) k / 128); the rest unchanged
    std::vector<double> c(64 * 64), e(128 * 64, 0.0);
    for (int k = 0; k < 64; k++)
        for (int i = 0; i < 64; i++) c[k * 64 + i] = std::sqrt((k == 0 ? 1.0 : 2.0) / 64.0) * std::cos(M_PI * (2 * i + 1) * k / 128.0);
    for (int chunk = 0; chunk < 2; chunk++)
        for (int p = 0; p < 64; p++)
            for (int q = 0; q < 64; q++) {
                double acc = 0.0;
                for (int b = 0; b < 64; b++)
                    for (int i = 0; i < 64; i++) acc += c[p * 64 + b] * double(m[(chunk * 64 + b) * 64 + i]) * c[q * 64 + i];
                e[(chunk * 64 + p) * 64 + q] = acc;
            }
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < e.size(); i++) {
        worst = std::max(worst, std::fabs(double(M[i]) - e[i]));
        scale = std::max(scale, std::fabs(e[i]));
    }
    std::printf("  convert_momentum vs the DCT's definition: max err %.2e of max |E| %.2e\n", worst, scale);
    EXPECT(worst <= 1e-6f * scale);
    EXPECT(std::equal(M.begin() + 128 * 64, M.end(), m.begin() + 128 * 64));
    std::vector<float> back = M;
    cm::convert_momentum(pt.plan, back, Domain::dct64, Domain::spatial);
    float round_trip = 0.0f;
    for (size_t i = 0; i < n; i++) round_trip = std::max(round_trip, std::fabs(back[i] - m[i]));
    EXPECT(round_trip <= 1e-6f * 4e-3f);
    std::vector<float> same = m;
    cm::convert_momentum(pt.plan, same, Domain::dct64, Domain::dct64);
    EXPECT(same == m);

    llmc::ByteWriter w;
    cm::write_state(w, pt.plan, M, Domain::dct64);
    std::vector<float> got;
    {
        llmc::ByteReader r(w.bytes(), "state.bin");
        cm::read_state(r, pt.plan, got, Domain::dct64);
        EXPECT(r.at_end());
        EXPECT(got == M);
    }
    {
        llmc::ByteReader r(w.bytes(), "state.bin");
        cm::read_state(r, pt.plan, got, Domain::spatial);
        EXPECT(got == back);
    }
    {  // the CPU optimizer reads it as spatial
        llmc::LocalTransport transport;
        demo::DemoOptimizer opt(cfg, layout, transport);
        llmc::ByteReader r(w.bytes(), "state.bin");
        opt.load_state(r);
        EXPECT(std::equal(back.begin(), back.end(), opt.momentum().begin()));
    }
    // version 1: the same fields without the domain
    llmc::ByteWriter v1;
    v1.put_string("demo");
    v1.put<uint32_t>(1);
    v1.put<uint64_t>(pt.plan.tensors.size());
    v1.put<uint64_t>(n);
    v1.put<uint64_t>(pt.plan.chunk);
    v1.put<uint64_t>(pt.plan.topk);
    v1.put<uint64_t>(pt.plan.fingerprint());
    v1.put_array(std::span<const float>(m));
    {
        llmc::ByteReader r(v1.bytes(), "old.bin");
        cm::read_state(r, pt.plan, got, Domain::spatial);
        EXPECT(r.at_end());
        EXPECT(got == m);
    }
    // an unknown domain (the field right before the momentum array's length; the pending-round flag ends the blob)
    std::vector<std::byte> bad(w.bytes().begin(), w.bytes().end());
    const size_t domain_at = bad.size() - 1 - n * sizeof(float) - sizeof(uint64_t) - sizeof(uint32_t);
    bad[domain_at] = std::byte{7};
    EXPECT_EQ(error_of([&] { llmc::ByteReader r(bad, "bad.bin"); cm::read_state(r, pt.plan, got); }),
              std::string("bad.bin: DeMo state has momentum domain 7 (0 or 1 expected)"));
}

// --demo_delay 1's pending round: saved with the momentum, read back only by a delayed run, and its bucket
// must have the plan's size.
TEST(pending_round_in_state_blobs) {
    const llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{128, 64}, {70}});
    const auto cfg = cm::demo_config(DemoValueEncoding::fp32, DemoIndexEncoding::smallest, DemoMomentum::lr_scaled, 1.0f, 8);
    const cm::PlanTables pt = cm::plan_tables(cfg, layout);
    using Domain = cm::MomentumDomain;
    const size_t n = pt.plan.num_params;
    std::vector<float> m(n);
    for (size_t i = 0; i < n; i++) m[i] = 0.001f * float(int(i % 97) - 48);
    demo::PendingRound pending;
    pending.present = true;
    pending.lr = 3.5e-4f;
    pending.bucket.resize(pt.bucket_bytes);
    for (size_t i = 0; i < pending.bucket.size(); i++) pending.bucket[i] = std::byte(uint8_t(i * 31 + 7));
    llmc::ByteWriter w;
    cm::write_state(w, pt.plan, m, Domain::spatial, pending);
    {
        llmc::ByteReader r(w.bytes(), "state.bin");
        std::vector<float> got;
        demo::PendingRound back;
        cm::read_state(r, pt.plan, got, Domain::spatial, back, true, pt.bucket_bytes);
        EXPECT(r.at_end());
        EXPECT(got == m);
        EXPECT(back.present);
        EXPECT_EQ(back.lr, pending.lr);
        EXPECT(back.bucket == pending.bucket);
    }
    std::vector<float> got;
    EXPECT_EQ(error_of([&] { llmc::ByteReader r(w.bytes(), "s.bin"); cm::read_state(r, pt.plan, got); }),
              std::string("s.bin: DeMo state holds an update not yet applied (saved with --demo_delay 1); resume with "
                          "--demo_delay 1"));
    demo::PendingRound back;
    EXPECT_EQ(error_of([&] {
                  llmc::ByteReader r(w.bytes(), "s.bin");
                  cm::read_state(r, pt.plan, got, Domain::spatial, back, true, pt.bucket_bytes + 1);
              }),
              std::string("s.bin: pending DeMo bucket has " + std::to_string(pt.bucket_bytes) + " elements, expected " +
                          std::to_string(pt.bucket_bytes + 1)));
    // a blob without a pending round: a delayed run starts with nothing to apply
    llmc::ByteWriter plain;
    cm::write_state(plain, pt.plan, m);
    llmc::ByteReader r(plain.bytes(), "plain.bin");
    back.present = true;
    cm::read_state(r, pt.plan, got, Domain::spatial, back, true, pt.bucket_bytes);
    EXPECT(!back.present);
    EXPECT(r.at_end());
}

TEST_MAIN()
