// PowerSGD (llmc/optim/powersgd/) against the PyTorch reference dev/reference/powersgd_reference.py, driven by
// test/e2e/test_powersgd.sh:
//   test_mpi_powersgd --write-cases DIR   (one process) writes two cases per world size (1, 2, 4): awkward shapes
//                                         (1-D tensors, matrices too small to compress, one just over the line),
//                                         initial weights, every rank's gradient of every step; prints their names
//   test_mpi_powersgd (bare, as test/run_tests.sh runs it: one rank) makes every check below but the reference's.
//   mpirun -np W test_mpi_powersgd --check-cases DIR   runs the cases of W ranks through the real step() on the MPI
//                                         transport and compares the weights, the averaged approximation and each
//                                         rank's error buffer after every step with the reference's; and checks what
//                                         holds without a reference: every rank's weights bit-identical after every
//                                         step, two collectives a step and the ring model's bytes, a state saved
//                                         after step 2 resumes bit for bit, foreign blobs and bad options refused.
// Built without MPI it skips.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llmc/base/checksum.h"
#include "llmc/base/fileio.h"
#include "llmc/base/host_memory.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/optim/powersgd/powersgd.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

constexpr int kSteps = 5;

// {96, 50}, {128, 64}, {50, 1000}, {5, 300} are compressed at rank 4 (k (n + m) < n m); {3, 5}, {6, 4}, {1, 40},
// {2, 300} (k = 2: 604 >= 600) and the 1-D tensors are not. At rank 1 all the matrices but {1, 40} (41 >= 40) are.
ParamLayout awkward_layout() {
    return testing::layout_of_shapes(
        {{96, 50}, {7}, {128, 64}, {3, 5}, {50, 1000}, {1000}, {6, 4}, {1, 40}, {2, 300}, {5, 300}});
}

struct Case {
    const char* name;
    int rank;
    bool warm_start;
    int64_t seed;
    float grad_clip;
    DecayGroups decay;
};
// "r4": the defaults, clipping on most steps, decay of the matrices; "r1": rank 1, a fresh Q every step, another
// seed, no clipping, decay of every tensor.
const Case kCases[] = {{"r4", 4, true, 0, 0.05f, DecayGroups::matrices}, {"r1", 1, false, 5, 0.0f, DecayGroups::all}};

std::vector<float> gradient(size_t n, int rank, int step) {
    return testing::random_normal(n, 1000003ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(step),
                                  0.002 * (1 + 2 * rank));
}
std::vector<float> initial_params(size_t n) { return testing::random_normal(n, 7, 0.02); }
float lr_at(int step) { return 1e-3f * static_cast<float>(step + 1) / 3.0f; }

OptimizerConfig case_config(const Case& k) {
    OptimizerConfig c;
    c.weight_decay = 0.1f;
    c.decay_groups = k.decay;
    c.grad_clip = k.grad_clip;
    c.adamw.beta1 = 0.9f;
    c.adamw.beta2 = 0.95f;
    c.adamw.eps = 1e-8f;
    c.powersgd.rank = k.rank;
    c.powersgd.warm_start = k.warm_start;
    c.powersgd.seed = k.seed;
    return c;
}

std::string case_name(int world, const Case& k) {
    std::string name = "w";
    name += std::to_string(world);
    name += "_";
    name += k.name;
    return name;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    LLMC_CHECK(f.good(), "cannot write " + path);
}

void write_cases(const std::string& dir) {
    const ParamLayout layout = awkward_layout();
    for (int world : {1, 2, 4})
        for (const Case& k : kCases) {
            const OptimizerConfig c = case_config(k);
            const std::string cd = dir + "/" + case_name(world, k);
            make_dirs(cd);
            std::string shapes, decay_list, lrs;
            for (const ParamTensor& t : layout.tensors) {
                std::string s;
                for (size_t d : t.shape) {  // piece by piece: g++ 12 warns (-Wrestrict) about "," + std::to_string(...)
                    if (!s.empty()) s += ",";
                    s += std::to_string(d);
                }
                shapes += std::string(shapes.empty() ? "" : ",") + "[" + s + "]";
                decay_list += std::string(decay_list.empty() ? "" : ",") +
                              (llmc::decays(t, c.decay_groups) ? "true" : "false");
            }
            char buf[64];
            for (int s = 0; s < kSteps; s++) {
                std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(lr_at(s)));
                lrs += std::string(lrs.empty() ? "" : ",") + buf;
            }
            std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(k.grad_clip));
            std::ofstream meta(cd + "/meta.json");
            meta << "{\"ranks\": " << world << ", \"steps\": " << kSteps << ", \"rank\": " << k.rank
                 << ", \"warm_start\": " << (k.warm_start ? "true" : "false") << ", \"seed\": " << k.seed
                 << ", \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1, \"grad_clip\": " << buf
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
            std::printf("%s\n", case_name(world, k).c_str());
        }
}

uint64_t hash_of(std::span<const float> w) { return digest_bytes(std::as_bytes(w)).xxh64; }

// True when every rank passes the same hash.
bool agree(Transport& t, uint64_t h) {
    const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
    std::vector<double> v = {hi, lo, -hi, -lo};
    t.allreduce_max(v);
    return v[0] == -v[2] && v[1] == -v[3];
}

// The ring model restated from the shapes: each of the two all-reduces of b bytes sends 2 (W-1)/W b; the P's hold
// n k floats per compressed matrix, the second all-reduce m k per compressed matrix plus every other tensor whole.
double ring_model_bytes(const ParamLayout& layout, int r, int world) {
    double p = 0, qf = 0;
    for (const ParamTensor& t : layout.tensors) {
        const bool matrix = t.shape.size() == 2;
        const double n = matrix ? double(t.shape[0]) : 0, m = matrix ? double(t.shape[1]) : 0;
        const double k = matrix ? std::min({n, m, double(r)}) : 0;
        if (matrix && k * (n + m) < n * m) {
            p += n * k;
            qf += m * k;
        } else {
            qf += double(t.numel);
        }
    }
    return 2.0 * (world - 1) / world * 4.0 * (p + qf);
}

// Tolerances. The C++ and the reference run the same fp32 steps but sum differently: OpenBLAS's sgemm and torch's
// matmul order a dot product of up to 1000 terms differently, and the norms and dots of orth are summed in double
// here and in fp32 by torch, so an element differs by some ulps of its dot product's terms, about 1e-6 of the
// matrix's scale, compounded over 5 steps of the feedback (e and the warm Q carry the rounding on). g_hat and e are
// low-rank sums whose elements cancel, so they are compared within kTol of their tensor's largest |value| (measured:
// at most 2.2e-5, at 4 ranks). The weights: AdamW's step lr * m / (sqrt(v) + eps) is scale-free in g_hat, so an
// element's *relative* error in g_hat becomes a relative error of its update, and that is large where g_hat is near
// 0 against its tensor's scale. An element is compared within 1e-5 of max(|w|, 5% of the tensor's largest |w|), and
// excused if it is within 2 x the sum of the lrs (a step moves a weight by about lr at most), at most 1% of them.
// Whole rows go together: g_hat's row i is P's row i times Q^T, so a row of P near 0 (measured: one row of the
// 50 x 1000 tensor at rank 1 on 4 ranks, 0.3% of the elements) moves every element of that row. A wrong decay or
// update moves every element and fails. The checks print the worst errors and the count excused.
constexpr double kTol = 1e-4;

struct Compare {
    size_t failures = 0, excused = 0, compared = 0;
    double worst = 0.0;
};

void compare_scaled(const ParamLayout& layout, const float* got, const float* want, const char* what, Compare& out) {
    for (const ParamTensor& t : layout.tensors) {
        double scale = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) scale = std::max(scale, std::fabs(double(want[i])));
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double err = std::fabs(double(got[i]) - double(want[i]));
            out.compared++;
            if (err <= kTol * scale) {
                out.worst = std::max(out.worst, scale > 0 ? err / scale : 0.0);
            } else {
                if (out.failures < 5)
                    std::printf("    %s element %zu of %s: %.9g vs reference %.9g (scale %.3g)\n", what,
                                i - t.offset, t.name.c_str(), double(got[i]), double(want[i]), scale);
                out.failures++;
            }
        }
    }
}

void compare_weights(const ParamLayout& layout, const float* got, const float* want, double lr_sum, Compare& out) {
    for (const ParamTensor& t : layout.tensors) {
        double maxw = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) maxw = std::max(maxw, std::fabs(double(want[i])));
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double err = std::fabs(double(got[i]) - double(want[i]));
            const double rel = err / std::max(std::fabs(double(want[i])), 0.05 * maxw);
            out.compared++;
            if (rel <= 1e-5) {
                out.worst = std::max(out.worst, rel);
            } else if (err <= 2.0 * lr_sum) {
                out.excused++;
            } else {
                if (out.failures < 5)
                    std::printf("    weight %zu of %s: %.9g vs reference %.9g\n", i - t.offset, t.name.c_str(),
                                double(got[i]), double(want[i]));
                out.failures++;
            }
        }
    }
}

void check_case(Transport& world, const std::string& dir, const Case& k) {
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    const int W = world.world_size(), me = world.rank();
    const bool reference = !dir.empty();
    const size_t per_step = n * (static_cast<size_t>(W) + 2);
    std::vector<float> ref;
    if (reference) {
        const std::vector<std::byte> raw = read_whole_file(dir + "/" + case_name(W, k) + "/expected.bin");
        EXPECT_EQ(raw.size(), kSteps * per_step * sizeof(float));
        if (raw.size() != kSteps * per_step * sizeof(float)) return;
        ref.resize(raw.size() / sizeof(float));
        std::memcpy(ref.data(), raw.data(), raw.size());
    }
    const OptimizerConfig c = case_config(k);
    PowerSgd opt(c, layout, world);
    EXPECT_EQ(opt.plan().matrices.size(), size_t(k.rank == 4 ? 4 : 7));
    std::vector<float> params = initial_params(n);
    Compare cw, cg, ce;
    double lr_sum = 0.0;
    LargeVector<std::byte> saved;
    std::vector<float> saved_params;
    for (int s = 0; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        world.reset_counters();
        opt.step(params, g, lr_at(s));
        lr_sum += lr_at(s);
        const CommCounters counters = world.counters();
        EXPECT_EQ(static_cast<double>(counters.bytes_sent), ring_model_bytes(layout, k.rank, W));
        EXPECT_EQ(static_cast<double>(counters.bytes_sent), double(powersgd_bytes_sent(layout, k.rank, W)));
        if (W > 1) EXPECT_EQ(counters.collectives, uint64_t{2});
        EXPECT(agree(world, hash_of(params)));  // the weights, and so the averaged approximation, on every rank
        EXPECT(agree(world, hash_of(g)));
        if (reference) {
            const float* want = ref.data() + s * per_step;
            compare_weights(layout, params.data(), want, lr_sum, cw);
            compare_scaled(layout, g.data(), want + n, "g_hat", cg);
            compare_scaled(layout, opt.error().data(), want + n * (2 + me), "e", ce);
        }
        if (s == 1) {
            ByteWriter w;
            opt.save_state(w);
            saved = w.bytes();
            saved_params = params;
        }
    }
    if (reference)
        std::printf("  %s on %d rank(s): %zu weights, worst %.2e relative, %zu excused, %zu failed; g_hat worst %.2e "
                    "of scale, %zu failed; e worst %.2e, %zu failed\n",
                    k.name, W, cw.compared, cw.worst, cw.excused, cw.failures, cg.worst, cg.failures, ce.worst,
                    ce.failures);
    EXPECT_EQ(cw.failures, size_t{0});
    EXPECT_EQ(cg.failures, size_t{0});
    EXPECT_EQ(ce.failures, size_t{0});
    EXPECT(cw.excused * 100 <= cw.compared);

    // resume from the state after step 2: the last steps give the same bits, and the same state
    PowerSgd resumed(c, layout, world);
    ByteReader reader(saved, "state after step 2");
    resumed.load_state(reader);
    EXPECT_EQ(resumed.steps(), int64_t{2});
    std::vector<float> p2 = saved_params;
    for (int s = 2; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        resumed.step(p2, g, lr_at(s));
    }
    EXPECT(p2 == params);
    ByteWriter a, b;
    opt.save_state(a);
    resumed.save_state(b);
    EXPECT(a.bytes() == b.bytes());
}

// Properties of the pieces that hold without a reference: orth's columns are orthonormal; a zero column stays 0.
void check_pieces() {
    std::vector<float> x(300 * 4);
    for (size_t j = 0; j < x.size(); j++) x[j] = powersgd_normal(3, 0, 1, j);
    double mean = 0, sq = 0;
    for (float v : x) mean += v, sq += double(v) * v;
    mean /= double(x.size());
    EXPECT(std::fabs(mean) < 0.1 && std::fabs(sq / double(x.size()) - 1.0) < 0.1);
    EXPECT(powersgd_normal(3, 0, 1, 0) != powersgd_normal(4, 0, 1, 0));
    EXPECT(powersgd_normal(3, 0, 1, 0) != powersgd_normal(3, 1, 1, 0));
    powersgd_orthogonalize(x.data(), 300, 4);
    double worst = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++) {
            double dot = 0;
            for (size_t r = 0; r < 300; r++) dot += double(x[r * 4 + a]) * x[r * 4 + b];
            worst = std::max(worst, std::fabs(dot - (a == b ? 1.0 : 0.0)));
        }
    EXPECT(worst < 1e-5);
    std::vector<float> z(10 * 2, 0.0f);
    for (size_t r = 0; r < 10; r++) z[r * 2 + 1] = 1.0f;
    powersgd_orthogonalize(z.data(), 10, 2);
    for (size_t r = 0; r < 10; r++) EXPECT(z[r * 2] == 0.0f && std::isfinite(z[r * 2 + 1]));
}

void check_refusals(Transport& world) {
    const ParamLayout layout = awkward_layout();
    const OptimizerConfig c = case_config(kCases[0]);
    PowerSgd opt(c, layout, world);
    ByteWriter other;
    other.put_string("adamw");
    other.put<uint64_t>(layout.num_params);
    ByteReader r1(other.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r1), "ck/state_0.bin: optimizer state is for 'adamw', not 'powersgd'");
    ByteWriter small;
    small.put_string("powersgd");
    small.put<uint64_t>(12);
    ByteReader r2(small.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r2), "optimizer state has 12 parameters, model has");
    ByteWriter rank;
    rank.put_string("powersgd");
    rank.put<uint64_t>(layout.num_params);
    rank.put<uint32_t>(2);
    ByteReader r3(rank.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r3), "PowerSGD state of rank 2; this run has 4 (--powersgd_rank)");
    ByteWriter truncated;
    opt.save_state(truncated);
    LargeVector<std::byte> cut(truncated.bytes().begin(), truncated.bytes().end() - 8);
    ByteReader r4(cut, "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r4), "ck/state_0.bin");
    OptimizerConfig bad = c;
    bad.powersgd.rank = 0;
    EXPECT_ERROR(validate_powersgd_options(bad), "--powersgd_rank must be >= 1 (got 0)");
    bad = c;
    bad.powersgd.seed = -1;
    EXPECT_ERROR(validate_powersgd_options(bad), "--powersgd_seed must be >= 0 (got -1)");
    bad = c;
    bad.adamw.beta2 = 1.0f;
    EXPECT_ERROR(validate_powersgd_options(bad), "--beta2 must be in [0, 1) (got 1)");
    bad = c;
    bad.shard_group_size = 2;
    EXPECT_ERROR((void)PowerSgd(bad, layout, world), "--shard_group_size");
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
                     "usage: test_mpi_powersgd --write-cases DIR | --check-cases DIR (test/e2e/test_powersgd.sh)\n");
        return 2;
    }
    std::unique_ptr<Transport> world = make_world_transport(&argc, &argv);
    if (world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const std::string dir = argc == 3 ? argv[2] : "";
    try {
        check_pieces();
        for (const Case& k : kCases) check_case(*world, dir, k);
        check_refusals(*world);
    } catch (const std::exception& e) {
        testing::report_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    }
    std::vector<double> failed = {static_cast<double>(testing::Registry::get().failures)};
    world->allreduce_max(failed);
    if (world->rank() == 0)
        std::printf("%s\n", failed[0] == 0.0 ? "all PowerSGD checks passed" : "PowerSGD checks FAILED");
    world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
