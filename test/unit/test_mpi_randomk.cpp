// --optimizer randomk (llmc/optim/demo/randomk.h) against the PyTorch reference dev/reference/randomk_reference.py,
// driven by test/e2e/test_randomk.sh:
//   test_mpi_randomk --write-cases DIR   (one process) writes a case per world size (1, 2, 4) and variant (fp32: lr
//                                        momentum, alpha 1, sign step; bf16: EMA momentum, alpha 0.5, bf16 values,
//                                        the unsigned step, decay on all tensors, another seed): awkward shapes,
//                                        initial weights, every rank's gradient of 6 steps; prints the case names
//   test_mpi_randomk (bare, as test/run_tests.sh runs it: one rank) makes every check below but the reference's.
//   mpirun -np W test_mpi_randomk --check-cases DIR   runs the cases of W ranks through the real step() on the MPI
//                                        transport and compares, after every step, the positions every chunk drew
//                                        with the reference's (exactly), the weights and this rank's momentum with
//                                        the reference's; and checks what needs no reference: every rank drew the
//                                        same positions and holds bit-identical weights, the bytes are the ring
//                                        model's 2 (W-1)/W x the values' bytes, a blob saved at step 3 resumes bit for
//                                        bit, foreign blobs and bad options are refused in one line, and the index
//                                        rule's sparse path equals a plain Fisher-Yates written here from the spec.
// Built without MPI it skips.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "llmc/base/checksum.h"
#include "llmc/base/fileio.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/optim/demo/randomk.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

constexpr int kSteps = 6;
const char* const kVariants[] = {"fp32", "bf16"};

// 2-D of chunk 48 x 32 and 64 x 32 (k small against n: the sparse draws), 1-D, a prime 37 rows (> chunk: n1 = 1),
// 1-D 130 (n2 = 26), 3 x 5 (k clamped to 15 in bf16), 3-D flattened to 6 x 40.
ParamLayout awkward_layout() {
    return testing::layout_of_shapes({{96, 50}, {7}, {128, 64}, {37, 64}, {130}, {3, 5}, {2, 3, 40}});
}

std::vector<float> gradient(size_t n, int rank, int step) {
    return testing::random_normal(n, 7000003ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(step),
                                  0.004 * (1 + 2 * rank));  // rank 0 under the clip, the others over it
}
std::vector<float> initial_params(size_t n) { return testing::random_normal(n, 11, 0.02); }
float lr_at(int step) { return 2e-3f * static_cast<float>(step + 1) / 3.0f; }

OptimizerConfig case_config(const std::string& variant) {
    OptimizerConfig c;
    c.grad_clip = 1.0f;
    c.demo.chunk = 32;
    if (variant == "fp32") {
        c.weight_decay = 0.1f;
        c.demo.topk = 8;
    } else {
        c.weight_decay = 0.05f;
        c.decay_groups = DecayGroups::all;
        c.demo.topk = 20;
        c.demo.decay = 0.9f;
        c.demo.momentum = DemoMomentum::ema;
        c.demo.feedback_alpha = 0.5f;
        c.demo.values = DemoValueEncoding::bf16;
        c.demo.sign = false;
        c.randomk.seed = 12345;
    }
    return c;
}

std::string case_name(int world, const std::string& variant) {
    std::string name = "w";  // appended piece by piece: g++ 12 warns (-Wrestrict) about "w" + std::to_string(...)
    name += std::to_string(world);
    name += "_";
    name += variant;
    return name;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    LLMC_CHECK(f.good(), "cannot write " + path);
}

std::string g9(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

void write_cases(const std::string& dir) {
    const ParamLayout layout = awkward_layout();
    for (int world : {1, 2, 4})
        for (const char* variant : kVariants) {
            const OptimizerConfig c = case_config(variant);
            const std::string cd = dir + "/" + case_name(world, variant);
            make_dirs(cd);
            std::string shapes, decay_list, lrs;
            for (const ParamTensor& t : layout.tensors) {
                std::string s;
                for (size_t d : t.shape) {
                    if (!s.empty()) s += ",";
                    s += std::to_string(d);
                }
                shapes += std::string(shapes.empty() ? "" : ",") + "[" + s + "]";
                decay_list += std::string(decay_list.empty() ? "" : ",") +
                              (llmc::decays(t, c.decay_groups) ? "true" : "false");
            }
            for (int s = 0; s < kSteps; s++) {
                if (!lrs.empty()) lrs += ",";
                lrs += g9(lr_at(s));
            }
            const DemoConfig& d = c.demo;
            std::ofstream meta(cd + "/meta.json");
            meta << "{\"ranks\": " << world << ", \"steps\": " << kSteps << ", \"chunk\": " << d.chunk
                 << ", \"topk\": " << d.topk << ", \"decay\": " << g9(d.decay) << ", \"momentum\": \""
                 << (d.momentum == DemoMomentum::ema ? "ema" : "lr") << "\", \"alpha\": " << g9(d.feedback_alpha)
                 << ", \"values\": \"" << (d.values == DemoValueEncoding::bf16 ? "bf16" : "fp32")
                 << "\", \"sign\": " << (d.sign ? 1 : 0) << ", \"seed\": " << c.randomk.seed
                 << ", \"weight_decay\": " << g9(c.weight_decay) << ", \"grad_clip\": " << g9(c.grad_clip)
                 << ", \"shapes\": [" << shapes << "], \"decays\": [" << decay_list << "], \"lrs\": [" << lrs
                 << "]}\n";
            write_floats(cd + "/init.bin", initial_params(layout.num_params));
            std::vector<float> grads;
            for (int s = 0; s < kSteps; s++)
                for (int r = 0; r < world; r++) {
                    const std::vector<float> g = gradient(layout.num_params, r, s);
                    grads.insert(grads.end(), g.begin(), g.end());
                }
            write_floats(cd + "/grads.bin", grads);
            std::printf("%s\n", case_name(world, variant).c_str());
        }
}

template <class T>
uint64_t hash_of(std::span<const T> w) {
    return digest_bytes(std::as_bytes(w)).xxh64;
}

// True when every rank passes the same hash.
bool agree(Transport& t, uint64_t h) {
    const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
    std::vector<double> v = {hi, lo, -hi, -lo};
    t.allreduce_max(v);
    return v[0] == -v[2] && v[1] == -v[3];
}

// Tolerance: both sides run the same fp32 operations, but g++ contracts a*b + c into one rounding where torch rounds
// twice, and the clip norm is summed in another order, so elements differ by a few ulps: within 1e-5 of
// max(|reference|, 5% of the tensor's largest |value|). An ulp can move a value across a bf16 rounding boundary, one
// quantum of the wire (1/256 of a value at most, below 1/64 of the tensor's largest momentum after feedback), and in
// the sign step it can flip the sign of a mean that cancels to about 0 (at most 2 lr per step): such elements are
// excused, at most 0.5% of them. The checks print how many (none here; a wrong draw or step fails thousands).
struct Compare {
    size_t failures = 0, excused = 0, compared = 0;
    double worst = 0.0;
};

void compare_tensorwise(const ParamLayout& layout, const float* got, const float* want, double excuse_abs,
                        double excuse_rel_of_max, const char* what, Compare& out) {
    for (const ParamTensor& t : layout.tensors) {
        double maxw = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) maxw = std::max(maxw, std::fabs(double(want[i])));
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double err = std::fabs(double(got[i]) - double(want[i]));
            const double rel = err / std::max(std::fabs(double(want[i])), std::max(0.05 * maxw, 1e-30));
            out.compared++;
            if (rel <= 1e-5) {
                out.worst = std::max(out.worst, rel);
            } else if (err <= excuse_abs || err <= excuse_rel_of_max * maxw) {
                out.excused++;
            } else {
                if (out.failures < 5)
                    std::printf("    %s element %zu of %s: %.9g vs reference %.9g\n", what, i - t.offset,
                                t.name.c_str(), double(got[i]), double(want[i]));
                out.failures++;
            }
        }
    }
}

template <class T>
std::vector<T> read_array(const std::string& path) {
    const std::vector<std::byte> raw = read_whole_file(path);
    std::vector<T> v(raw.size() / sizeof(T));
    std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
    return v;
}

void check_case(Transport& world, const std::string& dir, const std::string& variant) {
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    const int W = world.world_size(), me = world.rank();
    const OptimizerConfig c = case_config(variant);
    demo::RandomK opt(c, layout, world);
    const size_t selected = opt.plan().total_selected;
    // without a case directory (test/run_tests.sh runs the binary bare): every check but the reference's
    const bool reference = !dir.empty();
    const size_t per_step = n * (static_cast<size_t>(W) + 2);
    std::vector<float> ref;
    std::vector<uint32_t> ref_idx;
    if (reference) {
        ref = read_array<float>(dir + "/" + case_name(W, variant) + "/expected.bin");
        ref_idx = read_array<uint32_t>(dir + "/" + case_name(W, variant) + "/expected_idx.bin");
        EXPECT_EQ(ref.size(), kSteps * per_step);
        EXPECT_EQ(ref_idx.size(), kSteps * selected);
        if (ref.size() != kSteps * per_step || ref_idx.size() != kSteps * selected) return;
    }

    std::vector<float> params = initial_params(n);
    Compare cmp_w, cmp_m;
    size_t index_mismatches = 0;
    double lr_sum = 0.0;
    LargeVector<std::byte> blob;  // after step 3, with the weights it goes with
    std::vector<float> blob_params;
    // the ring model for one all-reduce of `selected` values (transport.h), integer as the transports count
    const uint64_t value_bytes = selected * (c.demo.values == DemoValueEncoding::bf16 ? 2 : 4);
    const uint64_t want_bytes = W == 1 ? 0 : 2 * static_cast<uint64_t>(W - 1) * value_bytes / static_cast<uint64_t>(W);
    for (int s = 0; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        world.reset_counters();
        const StepResult r = opt.step(params, g, lr_at(s));
        lr_sum += lr_at(s);
        EXPECT_EQ(world.counters().bytes_sent, want_bytes);
        EXPECT_EQ(demo::randomk_bytes_sent(opt.plan(), c.demo.values, W), want_bytes);
        EXPECT(r.seconds.transform > 0.0 && r.seconds.apply > 0.0);
        EXPECT_EQ(opt.steps(), int64_t{s + 1});
        EXPECT(agree(world, hash_of(opt.indices())));   // every rank drew the same positions
        EXPECT(agree(world, hash_of(std::span<const float>(params))));  // and holds the same weights
        if (reference) {
            const float* rs = ref.data() + s * per_step;
            for (size_t i = 0; i < selected; i++) index_mismatches += opt.indices()[i] != ref_idx[s * selected + i];
            // a sign flip moves a weight by 2 lr in the step it happens
            const double sign_excuse = c.demo.sign ? 2.0 * lr_sum + 1e-9 : 0.0;
            compare_tensorwise(layout, params.data(), rs, sign_excuse, 0.0, "weight", cmp_w);
            const double bf16_excuse = c.demo.values == DemoValueEncoding::bf16 ? 1.0 / 64 : 0.0;
            compare_tensorwise(layout, opt.momentum().data(), rs + n * (2 + me), 0.0, bf16_excuse, "momentum", cmp_m);
        }
        if (s == 2) {
            ByteWriter w;
            opt.save_state(w);
            blob = w.bytes();
            blob_params = params;
        }
    }
    if (reference)
        std::printf("  %s on %d rank(s): positions %zu x %d steps, %zu differ from the reference's; weights %zu "
                    "compared, worst %.2e relative, %zu excused, %zu failed; momentum worst %.2e, %zu excused, %zu "
                    "failed\n",
                    variant.c_str(), W, selected, kSteps, index_mismatches, cmp_w.compared, cmp_w.worst, cmp_w.excused,
                    cmp_w.failures, cmp_m.worst, cmp_m.excused, cmp_m.failures);
    EXPECT_EQ(index_mismatches, size_t{0});
    EXPECT_EQ(cmp_w.failures, size_t{0});
    EXPECT_EQ(cmp_m.failures, size_t{0});
    EXPECT(cmp_w.excused * 200 <= cmp_w.compared);
    EXPECT(cmp_m.excused * 200 <= cmp_m.compared);

    // the blob of step 3 resumed by a fresh optimizer: steps 4-6 give the same bits (no RNG state: the step count)
    demo::RandomK resumed(c, layout, world);
    ByteReader reader(blob, "step-3 blob");
    resumed.load_state(reader);
    EXPECT_EQ(resumed.steps(), int64_t{3});
    std::vector<float> p2 = blob_params;
    for (int s = 3; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        resumed.step(p2, g, lr_at(s));
    }
    EXPECT(p2 == params);
    ByteWriter a, b;
    opt.save_state(a);
    resumed.save_state(b);
    EXPECT(a.bytes() == b.bytes());
}

// The index rule from randomk.h's text, the whole array every time: the optimizer's sparse path must agree.
std::vector<uint32_t> plain_fisher_yates(uint64_t key, size_t n, size_t k) {
    std::vector<uint32_t> a(n);
    std::iota(a.begin(), a.end(), 0u);
    for (size_t j = 0; j < k; j++) {
        uint64_t z = key + j + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        std::swap(a[j], a[j + z % (n - j)]);
    }
    a.resize(k);
    std::sort(a.begin(), a.end());
    return a;
}

void check_index_rule() {
    // splitmix64 of 0 and 1 (the published test vector of the generator seeded with 0: its first two outputs)
    EXPECT_EQ(demo::randomk_splitmix64(0), 0xE220A8397B1DCDAFull);
    EXPECT_EQ(demo::randomk_splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
    const size_t sizes[][2] = {{1, 1}, {5, 5}, {7, 3}, {64, 3}, {64, 4}, {2400, 8}, {4096, 32}, {32, 8}, {100000, 50}};
    std::vector<uint32_t> scratch, got;
    size_t mismatches = 0, distinct_sets = 0;
    for (const auto& nk : sizes)
        for (uint64_t t = 0; t < 20; t++) {
            const uint64_t key = demo::randomk_chunk_key(3, t, 1, t * 7);
            got.assign(nk[1], 0);
            demo::randomk_select(key, nk[0], nk[1], got.data(), scratch);
            mismatches += got != plain_fisher_yates(key, nk[0], nk[1]);
            std::vector<uint32_t> other(nk[1]);
            demo::randomk_select(key + 1, nk[0], nk[1], other.data(), scratch);
            distinct_sets += other != got;
        }
    EXPECT_EQ(mismatches, size_t{0});
    EXPECT(distinct_sets >= 7 * 20 - 5);  // the keys matter (the 1- and 5-element chunks draw everything)
}

void check_refusals(Transport& world) {
    const ParamLayout layout = awkward_layout();
    const OptimizerConfig c = case_config("fp32");
    demo::RandomK opt(c, layout, world);
    ByteWriter other;
    other.put_string("adamw");
    other.put<uint64_t>(layout.num_params);
    ByteReader r1(other.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r1), "ck/state_0.bin: optimizer state is for 'adamw', not 'randomk'");
    ByteWriter small;
    small.put_string("randomk");
    small.put<uint64_t>(12);
    ByteReader r2(small.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r2), "ck/state_0.bin: randomk state has 12 parameters, model has");
    ByteWriter mine;
    opt.save_state(mine);
    OptimizerConfig seeded = c;
    seeded.randomk.seed = 7;
    demo::RandomK other_seed(seeded, layout, world);
    ByteReader r3(mine.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(other_seed.load_state(r3), "saved with --randomk_seed 0, this run has 7");
    OptimizerConfig k9 = c;
    k9.demo.topk = 9;
    demo::RandomK other_k(k9, layout, world);
    ByteReader r4(mine.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(other_k.load_state(r4), "randomk state was saved with another chunk plan");

    OptimizerConfig bad = c;
    bad.randomk.seed = -1;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--randomk_seed must be >= 0 (got -1)");
    bad = c;
    bad.demo.values = DemoValueEncoding::sign;
    EXPECT_ERROR(demo::RandomK refused(bad, layout, world), "--demo_values: --optimizer randomk all-reduces fp32 or bf16");
    bad = c;
    bad.demo.indices = DemoIndexEncoding::packed12;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--demo_indices: --optimizer randomk sends no indices");
    bad = c;
    bad.demo.delay = 1;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--demo_delay: --optimizer randomk runs --demo_delay 0 only");
    bad = c;
    bad.demo.transform = DemoTransform::random;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--demo_transform: --optimizer randomk has no transform");
    bad = c;
    bad.shard_group_size = 2;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--shard_group_size: --optimizer randomk runs flat only");
    bad = c;
    bad.demo.topk = 0;
    EXPECT_ERROR(demo::validate_randomk_options(bad), "--demo_topk must be >= 1 (got 0)");
}

}  // namespace

int main(int argc, char** argv) {
#ifndef LLMC_USE_MPI
    testing::skip("built without MPI (USE_MPI=0)");
#endif
    if (argc == 3 && std::string(argv[1]) == "--write-cases") {
        write_cases(argv[2]);
        return 0;
    }
    if (argc != 1 && (argc != 3 || std::string(argv[1]) != "--check-cases")) {
        std::fprintf(stderr,
                     "usage: test_mpi_randomk --write-cases DIR | --check-cases DIR (test/e2e/test_randomk.sh)\n");
        return 2;
    }
    std::unique_ptr<Transport> world = make_world_transport(&argc, &argv);
    if (world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const std::string dir = argc == 3 ? argv[2] : "";
    try {
        for (const char* variant : kVariants) check_case(*world, dir, variant);
        check_index_rule();
        check_refusals(*world);
    } catch (const std::exception& e) {
        testing::report_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    }
    std::vector<double> failed = {static_cast<double>(testing::Registry::get().failures)};
    world->allreduce_max(failed);
    if (world->rank() == 0)
        std::printf("%s\n", failed[0] == 0.0 ? "all randomk checks passed" : "randomk checks FAILED");
    world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
