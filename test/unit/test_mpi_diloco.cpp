// DiLoCo (llmc/optim/diloco/) against the PyTorch reference dev/reference/diloco_reference.py, driven by
// test/e2e/test_diloco.sh:
//   test_mpi_diloco --write-cases DIR     (one process) writes a case per world size (1, 2, 4) and wire (fp32,
//                                         bf16, int8): awkward tensor shapes, initial weights, every rank's
//                                         gradient of every step, 9 steps in rounds of 3; prints the case names
//   test_mpi_diloco (bare, as test/run_tests.sh runs it: one rank) makes every check below but the reference's.
//   mpirun -np W test_mpi_diloco --check-cases DIR   runs the cases of W ranks through the real step() on the MPI
//                                         transport and compares each rank's local weights after every step with
//                                         the reference's, and checks what must hold without a reference: after a
//                                         sync every rank's weights are bit-identical and equal master_weights();
//                                         master_weights() agree on every rank at every step; bytes are sent only
//                                         at sync steps, as the ring model says; a checkpoint blob saved mid-round
//                                         resumes bit-identically; a foreign blob is refused with one line.
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
#include "llmc/base/rng.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/optim/diloco/diloco.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

constexpr int kSteps = 9, kInnerSteps = 3;
const char* const kWires[] = {"fp32", "bf16", "int8"};

ParamLayout awkward_layout() {
    return testing::layout_of_shapes({{96, 50}, {7}, {128, 64}, {50, 1000}, {1000}, {3, 5}});
}

// Rank 0's gradients stay under the clip (norm about 0.5), the others' are clipped.
std::vector<float> gradient(size_t n, int rank, int step) {
    return testing::random_normal(n, 1000003ull * static_cast<uint64_t>(rank + 1) + static_cast<uint64_t>(step),
                                  0.002 * (1 + 2 * rank));
}
std::vector<float> initial_params(size_t n) { return testing::random_normal(n, 7, 0.02); }
float lr_at(int step) { return 1e-3f * static_cast<float>(step + 1) / 3.0f; }  // changes every step

DilocoWire wire_of(const std::string& w) {
    return w == "fp32" ? DilocoWire::fp32 : w == "bf16" ? DilocoWire::bf16 : DilocoWire::int8;
}

OptimizerConfig case_config(const std::string& wire) {
    OptimizerConfig c;
    c.weight_decay = 0.1f;
    c.grad_clip = 1.0f;
    c.adamw.beta1 = 0.9f;
    c.adamw.beta2 = 0.95f;
    c.adamw.eps = 1e-8f;
    c.diloco.inner_steps = kInnerSteps;
    c.diloco.outer_lr = 0.7f;
    c.diloco.outer_momentum = 0.9f;
    c.diloco.wire = wire_of(wire);
    return c;
}

std::string case_name(int world, const std::string& wire) {
    std::string name = "w";  // appended piece by piece: g++ 12 warns (-Wrestrict) about "w" + std::to_string(...)
    name += std::to_string(world);
    name += "_";
    name += wire;
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
        for (const char* wire : kWires) {
            const OptimizerConfig c = case_config(wire);
            const std::string cd = dir + "/" + case_name(world, wire);
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
            char buf[64];
            for (int s = 0; s < kSteps; s++) {
                std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(lr_at(s)));
                lrs += std::string(lrs.empty() ? "" : ",") + buf;
            }
            std::ofstream meta(cd + "/meta.json");
            meta << "{\"ranks\": " << world << ", \"steps\": " << kSteps << ", \"inner_steps\": " << kInnerSteps
                 << ", \"wire\": \"" << wire << "\", \"outer_lr\": 0.7, \"outer_momentum\": 0.9, \"beta1\": 0.9, "
                 << "\"beta2\": 0.95, \"eps\": 1e-8, \"weight_decay\": 0.1, \"grad_clip\": 1.0, \"shapes\": [" << shapes
                 << "], \"decays\": [" << decay_list << "], \"lrs\": [" << lrs << "]}\n";
            write_floats(cd + "/init.bin", initial_params(layout.num_params));
            std::vector<float> grads;
            for (int s = 0; s < kSteps; s++)
                for (int r = 0; r < world; r++) {
                    const std::vector<float> g = gradient(layout.num_params, r, s);
                    grads.insert(grads.end(), g.begin(), g.end());
                }
            write_floats(cd + "/grads.bin", grads);
            std::printf("%s\n", case_name(world, wire).c_str());
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

// Tolerance: both sides run the same fp32 operations, but torch may fuse a multiply-add and sums the clip norm in
// another order, so elements differ by a few ulps. The pseudo-gradient global - local cancels, so an ulp of a weight
// (2^-24 of the tensor's largest |w| at worst) becomes an absolute error of an element however small it is: elements
// are compared within 1e-5 of max(|reference|, 5% of the tensor's largest |w|). On the bf16 and int8 wires an ulp in
// a rank's delta can land on the other side of a rounding boundary and move that element by one quantum of the wire,
// which the outer momentum carries on: such an element is excused when it is within 2 outer_lr (1 + mu) / (1 - mu)
// quanta (the Nesterov step's total gain on one delta, twice for a second flip), a quantum being the wire's step at
// the tensor's largest |averaged delta| so far (1/128 of it for bf16, 1/127 for int8), at most 0.5% of the
// elements. The checks print how many they excused (0.01% or fewer here; a wrong outer step excuses 40%).
struct Compare {
    size_t failures = 0, excused = 0, compared = 0;
    double worst = 0.0;
};

void compare_tensorwise(const ParamLayout& layout, const float* got, const float* want, const float* mean_delta_max,
                        const OptimizerConfig& c, Compare& out) {
    const double mu = c.diloco.outer_momentum;
    const double carry = c.diloco.outer_lr * (1 + mu) / (1 - mu);
    for (size_t ti = 0; ti < layout.tensors.size(); ti++) {
        const ParamTensor& t = layout.tensors[ti];
        double maxw = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) maxw = std::max(maxw, std::fabs(double(want[i])));
        const double quantum = c.diloco.wire == DilocoWire::bf16   ? mean_delta_max[ti] / 128.0
                               : c.diloco.wire == DilocoWire::int8 ? mean_delta_max[ti] / 127.0
                                                                   : 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double err = std::fabs(double(got[i]) - double(want[i]));
            const double rel = err / std::max(std::fabs(double(want[i])), 0.05 * maxw);
            out.compared++;
            if (rel <= 1e-5) {
                out.worst = std::max(out.worst, rel);
            } else if (err <= 2.0 * carry * quantum) {
                out.excused++;
            } else {
                if (out.failures < 5)
                    std::printf("    element %zu of %s: %.9g vs reference %.9g\n", i - t.offset, t.name.c_str(),
                                double(got[i]), double(want[i]));
                out.failures++;
            }
        }
    }
}

void check_case(Transport& world, const std::string& dir, const std::string& wire) {
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    const int W = world.world_size(), me = world.rank();
    // without a case directory (test/run_tests.sh runs the binary bare): every check but the reference's
    const bool reference = !dir.empty();
    const size_t per_step = n * (static_cast<size_t>(W) + 2);
    std::vector<float> ref;
    if (reference) {
        const std::vector<std::byte> raw = read_whole_file(dir + "/" + case_name(W, wire) + "/expected.bin");
        EXPECT_EQ(raw.size(), kSteps * per_step * sizeof(float));
        if (raw.size() != kSteps * per_step * sizeof(float)) return;
        ref.resize(raw.size() / sizeof(float));
        std::memcpy(ref.data(), raw.data(), raw.size());
    }

    const OptimizerConfig c = case_config(wire);
    Diloco opt(c, layout, world);
    std::vector<float> params = initial_params(n);
    opt.set_weights(params);
    // the largest |averaged delta| of each tensor over the rounds so far: the scale of a wire quantum
    std::vector<float> delta_max(layout.tensors.size(), 0.0f);
    Compare cmp, cmp_global;
    LargeVector<std::byte> mid_round;  // the blob after step 4 (mid-round), and the weights it goes with
    std::vector<float> mid_params;
    for (int s = 0; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        world.reset_counters();
        opt.step(params, g, lr_at(s));
        const bool sync = (s + 1) % kInnerSteps == 0;
        const CommCounters counters = world.counters();
        const double want_bytes = sync ? diloco_sync_bytes_sent(c.diloco.wire, layout, W) : 0.0;
        EXPECT_EQ(static_cast<double>(counters.bytes_sent), want_bytes);
        if (reference) {
            const float* ref_step = ref.data() + s * per_step;
            for (size_t ti = 0; ti < layout.tensors.size(); ti++)
                for (size_t i = layout.tensors[ti].offset; i < layout.tensors[ti].offset + layout.tensors[ti].numel;
                     i++)
                    delta_max[ti] = std::max(delta_max[ti], std::fabs(ref_step[n * (W + 1) + i]));
            compare_tensorwise(layout, params.data(), ref_step + n * me, delta_max.data(), c, cmp);
            compare_tensorwise(layout, opt.master_weights(params).data(), ref_step + n * W, delta_max.data(), c,
                               cmp_global);
        }
        EXPECT(agree(world, hash_of(opt.master_weights(params))));
        EXPECT_EQ(opt.synced_last_step(), sync);
        if (sync) {  // (b): every rank's weights bit-identical, and the global ones
            EXPECT(agree(world, hash_of(params)));
            EXPECT(std::memcmp(params.data(), opt.master_weights(params).data(), n * sizeof(float)) == 0);
        }
        if (s == 3) {
            ByteWriter w;
            opt.save_state(w);
            mid_round = w.bytes();
            mid_params = params;
        }
    }
    if (reference)
        std::printf("  %s on %d rank(s): local weights %zu compared, worst %.2e relative, %zu excused, %zu failed; "
                    "global %zu excused, %zu failed\n",
                    wire.c_str(), W, cmp.compared, cmp.worst, cmp.excused, cmp.failures, cmp_global.excused,
                    cmp_global.failures);
    EXPECT_EQ(cmp.failures, size_t{0});
    EXPECT_EQ(cmp_global.failures, size_t{0});
    EXPECT(cmp.excused * 200 <= cmp.compared);

    // A resume mid-round: a new optimizer from the blob, the checkpoint's model file (the global weights) in
    // params, set_weights puts the local weights back; the last steps must give the same bits.
    Diloco resumed(c, layout, world);
    ByteReader reader(mid_round, "mid-round blob");
    resumed.load_state(reader);
    std::vector<float> p2(n);
    {
        Diloco probe(c, layout, world);  // the blob's global weights: what the model file holds
        ByteReader r2(mid_round, "mid-round blob");
        probe.load_state(r2);
        std::vector<float> dummy(n);
        std::span<float> gw = probe.master_weights(dummy);
        std::copy(gw.begin(), gw.end(), p2.begin());
    }
    resumed.set_weights(p2);
    EXPECT(p2 == mid_params);
    for (int s = 4; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        resumed.step(p2, g, lr_at(s));
    }
    EXPECT(p2 == params);
    std::vector<float> dummy(n);
    EXPECT(std::memcmp(resumed.master_weights(dummy).data(), opt.master_weights(params).data(), n * 4) == 0);
    ByteWriter a, b;
    opt.save_state(a);
    resumed.save_state(b);
    EXPECT(a.bytes() == b.bytes());
}

void check_refusals(Transport& world) {
    const ParamLayout layout = awkward_layout();
    const OptimizerConfig c = case_config("fp32");
    Diloco opt(c, layout, world);
    ByteWriter other;
    other.put_string("adamw");
    other.put<uint64_t>(layout.num_params);
    ByteReader r1(other.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r1), "ck/state_0.bin: optimizer state is for 'adamw', not 'diloco'");
    ByteWriter small;
    small.put_string("diloco");
    small.put<uint64_t>(12);
    ByteReader r2(small.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r2), "optimizer state has 12 parameters, model has");
    ByteWriter h;
    h.put_string("diloco");
    h.put<uint64_t>(layout.num_params);
    h.put<uint32_t>(5);
    ByteReader r3(h.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt.load_state(r3), "rounds of 5 steps; this run has 3 (--diloco_inner_steps)");
    OptimizerConfig bad = c;
    bad.diloco.inner_steps = 0;
    EXPECT_ERROR(validate_diloco_options(bad), "--diloco_inner_steps must be >= 1 (got 0)");
    bad = c;
    bad.diloco.outer_momentum = 1.0f;
    EXPECT_ERROR(validate_diloco_options(bad), "--diloco_outer_momentum must be in [0, 1) (got 1)");
    bad = c;
    bad.diloco.outer_lr = 0.0f;
    EXPECT_ERROR(validate_diloco_options(bad), "--diloco_outer_lr must be > 0 (got 0)");
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
                     "usage: test_mpi_diloco --write-cases DIR | --check-cases DIR (test/e2e/test_diloco.sh)\n");
        return 2;
    }
    std::unique_ptr<Transport> world = make_world_transport(&argc, &argv);
    if (world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const std::string dir = argc == 3 ? argv[2] : "";
    try {
        for (const char* wire : kWires) check_case(*world, dir, wire);
        check_refusals(*world);
    } catch (const std::exception& e) {
        testing::report_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    }
    std::vector<double> failed = {static_cast<double>(testing::Registry::get().failures)};
    world->allreduce_max(failed);
    if (world->rank() == 0) std::printf("%s\n", failed[0] == 0.0 ? "all DiLoCo checks passed" : "DiLoCo checks FAILED");
    world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
