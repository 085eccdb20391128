// SparseLoCo (llmc/optim/diloco/sparseloco.h) against the PyTorch reference dev/reference/sparseloco_reference.py,
// driven by test/e2e/test_sparseloco.sh:
//   test_mpi_sparseloco --write-cases DIR   (one process) writes a case per world size (1, 2, 4) and variant (2-bit
//                                           top-64 of 64 x 64 chunks, the fp32-values ablation, 2-bit top-8 of 16 x
//                                           16 chunks with ef_decay 0.9): awkward shapes, initial weights, every
//                                           rank's gradient of every step, 9 steps in rounds of 3; and a bytes-only
//                                           case of GPT-2 124M's shapes; prints the case names
//   test_mpi_sparseloco (bare, as test/run_tests.sh runs it: one rank) makes every check below but the reference's.
//   mpirun -np W test_mpi_sparseloco --check-cases DIR   runs the cases of W ranks through the real step() on the
//                                           MPI transport and compares each rank's local weights and the global ones
//                                           after every step with the reference's; checks that the global weights
//                                           are bit-identical on every rank at every step (and the local ones after
//                                           a sync), bytes only at syncs ((W-1) messages, the message size the
//                                           reference counts, also for GPT-2 124M), a mid-round blob resumed bit
//                                           for bit, foreign blobs and bad options refused; the 12-bit and 2-bit
//                                           packings round-trip exactly and the quantizer matches hand-worked values.
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
#include "llmc/optim/diloco/sparseloco.h"
#include "test/support/layouts.h"
#include "test/support/testing.h"

using namespace llmc;

namespace {

constexpr int kSteps = 9, kInnerSteps = 3;
struct Variant {
    const char* name;
    const char* values;
    int topk, chunk;
    float ef_decay;
};
const Variant kVariants[] = {{"2bit", "2bit", 64, 64, 0.95f}, {"fp32", "fp32", 64, 64, 0.95f},
                             {"2bit_k8_c16", "2bit", 8, 16, 0.9f}};

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

OptimizerConfig case_config(const Variant& v) {
    OptimizerConfig c;
    c.weight_decay = 0.1f;
    c.grad_clip = 1.0f;
    c.adamw.beta1 = 0.9f;
    c.adamw.beta2 = 0.95f;
    c.adamw.eps = 1e-8f;
    c.diloco.inner_steps = kInnerSteps;
    c.diloco.outer_lr = 0.7f;
    c.diloco.outer_momentum = 0.9f;
    c.sparseloco.topk = v.topk;
    c.sparseloco.chunk = v.chunk;
    c.sparseloco.ef_decay = v.ef_decay;
    c.sparseloco.values = std::string(v.values) == "2bit" ? SparselocoValues::two_bit : SparselocoValues::fp32;
    return c;
}

std::string case_name(int world, const Variant& v) {
    std::string name = "w";  // appended piece by piece: g++ 12 warns (-Wrestrict) about "w" + std::to_string(...)
    name += std::to_string(world);
    name += "_";
    name += v.name;
    return name;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    LLMC_CHECK(f.good(), "cannot write " + path);
}

std::string shapes_json(const ParamLayout& layout) {
    std::string shapes;
    for (const ParamTensor& t : layout.tensors) {
        std::string s;
        for (size_t d : t.shape) {
            if (!s.empty()) s += ",";
            s += std::to_string(d);
        }
        shapes += std::string(shapes.empty() ? "" : ",") + "[" + s + "]";
    }
    return "[" + shapes + "]";
}

void write_cases(const std::string& dir) {
    const ParamLayout layout = awkward_layout();
    for (int world : {1, 2, 4})
        for (const Variant& v : kVariants) {
            const OptimizerConfig c = case_config(v);
            const std::string cd = dir + "/" + case_name(world, v);
            make_dirs(cd);
            std::string decay_list, lrs;
            for (const ParamTensor& t : layout.tensors)
                decay_list += std::string(decay_list.empty() ? "" : ",") +
                              (llmc::decays(t, c.decay_groups) ? "true" : "false");
            char buf[64];
            for (int s = 0; s < kSteps; s++) {
                std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(lr_at(s)));
                lrs += std::string(lrs.empty() ? "" : ",") + buf;
            }
            std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v.ef_decay));
            std::ofstream meta(cd + "/meta.json");
            meta << "{\"ranks\": " << world << ", \"steps\": " << kSteps << ", \"inner_steps\": " << kInnerSteps
                 << ", \"outer_lr\": 0.7, \"outer_momentum\": 0.9, \"beta1\": 0.9, \"beta2\": 0.95, \"eps\": 1e-8, "
                 << "\"weight_decay\": 0.1, \"grad_clip\": 1.0, \"topk\": " << v.topk << ", \"chunk\": " << v.chunk
                 << ", \"ef_decay\": " << buf << ", \"values\": \"" << v.values << "\", \"shapes\": "
                 << shapes_json(layout) << ", \"decays\": [" << decay_list << "], \"lrs\": [" << lrs << "]}\n";
            write_floats(cd + "/init.bin", initial_params(layout.num_params));
            std::vector<float> grads;
            for (int s = 0; s < kSteps; s++)
                for (int r = 0; r < world; r++) {
                    const std::vector<float> g = gradient(layout.num_params, r, s);
                    grads.insert(grads.end(), g.begin(), g.end());
                }
            write_floats(cd + "/grads.bin", grads);
            std::printf("%s\n", case_name(world, v).c_str());
        }
    // GPT-2 124M (ModelConfig's defaults): the message size only, with the default options
    const std::string cd = dir + "/gpt2_124m";
    make_dirs(cd);
    std::ofstream meta(cd + "/meta.json");
    meta << "{\"bytes_only\": true, \"topk\": 64, \"chunk\": 64, \"values\": \"2bit\", \"shapes\": "
         << shapes_json(ParamLayout::of(ModelConfig{})) << "}\n";
    std::printf("gpt2_124m\n");
}

uint64_t hash_of(std::span<const float> w) { return digest_bytes(std::as_bytes(w)).xxh64; }

// True when every rank passes the same hash.
bool agree(Transport& t, uint64_t h) {
    const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
    std::vector<double> v = {hi, lo, -hi, -lo};
    t.allreduce_max(v);
    return v[0] == -v[2] && v[1] == -v[3];
}

size_t reference_message_bytes(const std::string& dir, const std::string& name) {
    std::ifstream f(dir + "/" + name + "/message_bytes.txt");
    size_t b = 0;
    f >> b;
    LLMC_CHECK(f.good() || f.eof(), "cannot read " + dir + "/" + name + "/message_bytes.txt");
    return b;
}

// Tolerance: both sides run the same fp32 operations, but torch may fuse a multiply-add and sums the clip norm in
// another order, so elements differ by a few ulps. The pseudo-gradient global - local cancels, so an ulp of a weight
// becomes an absolute error of an element however small it is: elements are compared within 1e-5 of max(|reference|,
// 5% of the tensor's largest |w|). An ulp in a rank's error feedback can also move a value across a quantization bin
// boundary or swap the k-th and (k+1)-th of a chunk, which moves that element by up to one sent value of that rank,
// carried on by the outer momentum: such an element is excused within 2 outer_lr (1 + mu) / (1 - mu) times the
// tensor's largest |sent value| so far (W times its largest |averaged delta|), at most 0.05% of the elements (a
// flip shows in a few elements for the rest of the run). The checks print how many they excused: none here, while a
// reference without the median clip, with the upper median, without error feedback, with a range of 4 sigma or
// with templar's per-coordinate mean excuses 1-20% of them.
struct Compare {
    size_t failures = 0, excused = 0, compared = 0;
    double worst = 0.0;
};

void compare_tensorwise(const ParamLayout& layout, const float* got, const float* want, const float* sent_max,
                        const OptimizerConfig& c, Compare& out) {
    const double mu = c.diloco.outer_momentum;
    const double carry = c.diloco.outer_lr * (1 + mu) / (1 - mu);
    for (size_t ti = 0; ti < layout.tensors.size(); ti++) {
        const ParamTensor& t = layout.tensors[ti];
        double maxw = 0.0;
        for (size_t i = t.offset; i < t.offset + t.numel; i++) maxw = std::max(maxw, std::fabs(double(want[i])));
        for (size_t i = t.offset; i < t.offset + t.numel; i++) {
            const double err = std::fabs(double(got[i]) - double(want[i]));
            const double rel = err / std::max(std::fabs(double(want[i])), 0.05 * maxw);
            out.compared++;
            if (rel <= 1e-5) {
                out.worst = std::max(out.worst, rel);
            } else if (err <= 2.0 * carry * sent_max[ti]) {
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

std::unique_ptr<Diloco> make(const OptimizerConfig& c, const ParamLayout& layout, Transport& world) {
    return make_sparseloco(c, layout, world);
}

void check_case(Transport& world, const std::string& dir, const Variant& v) {
    const ParamLayout layout = awkward_layout();
    const size_t n = layout.num_params;
    const int W = world.world_size(), me = world.rank();
    const bool reference = !dir.empty();
    const size_t per_step = n * (static_cast<size_t>(W) + 2);
    const OptimizerConfig c = case_config(v);
    const sparseloco::Plan plan = sparseloco_plan(c, layout);
    if (v.topk == 8) EXPECT(plan.total_slots % 2 == 1);  // the last 12-bit pair is half padding
    std::vector<float> ref;
    if (reference) {
        const std::vector<std::byte> raw = read_whole_file(dir + "/" + case_name(W, v) + "/expected.bin");
        EXPECT_EQ(raw.size(), kSteps * per_step * sizeof(float));
        if (raw.size() != kSteps * per_step * sizeof(float)) return;
        ref.resize(raw.size() / sizeof(float));
        std::memcpy(ref.data(), raw.data(), raw.size());
        // the message size the reference counts from the shapes alone
        EXPECT_EQ(plan.message_bytes(), reference_message_bytes(dir, case_name(W, v)));
    }

    std::unique_ptr<Diloco> opt = make(c, layout, world);
    EXPECT_EQ(std::string(opt->name()), std::string("sparseloco"));
    std::vector<float> params = initial_params(n);
    opt->set_weights(params);
    std::vector<float> sent_max(layout.tensors.size(), 0.0f);
    Compare cmp, cmp_global;
    LargeVector<std::byte> mid_round;  // the blob after step 4 (mid-round), and the weights it goes with
    std::vector<float> mid_params;
    for (int s = 0; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        world.reset_counters();
        const StepResult res = opt->step(params, g, lr_at(s));
        const bool sync = (s + 1) % kInnerSteps == 0;
        const CommCounters counters = world.counters();
        EXPECT_EQ(static_cast<double>(counters.bytes_sent), sync ? sparseloco_sync_bytes_sent(c, layout, W) : 0.0);
        EXPECT_EQ(static_cast<double>(counters.bytes_sent),
                  sync ? static_cast<double>((W - 1) * plan.message_bytes()) : 0.0);
        if (sync) EXPECT(res.seconds.transform > 0.0 && res.seconds.apply > 0.0);
        if (reference) {
            const float* ref_step = ref.data() + s * per_step;
            for (size_t ti = 0; ti < layout.tensors.size(); ti++)
                for (size_t i = layout.tensors[ti].offset; i < layout.tensors[ti].offset + layout.tensors[ti].numel;
                     i++)
                    sent_max[ti] = std::max(sent_max[ti], static_cast<float>(W) * std::fabs(ref_step[n * (W + 1) + i]));
            compare_tensorwise(layout, params.data(), ref_step + n * me, sent_max.data(), c, cmp);
            compare_tensorwise(layout, opt->master_weights(params).data(), ref_step + n * W, sent_max.data(), c,
                               cmp_global);
        }
        EXPECT(agree(world, hash_of(opt->master_weights(params))));
        EXPECT_EQ(opt->synced_last_step(), sync);
        if (sync) {  // every rank's weights bit-identical, and the global ones
            EXPECT(agree(world, hash_of(params)));
            EXPECT(std::memcmp(params.data(), opt->master_weights(params).data(), n * sizeof(float)) == 0);
        }
        if (s == 3) {
            ByteWriter w;
            opt->save_state(w);
            mid_round = w.bytes();
            mid_params = params;
        }
    }
    if (reference)
        std::printf("  %s on %d rank(s): local weights %zu compared, worst %.2e relative, %zu excused, %zu failed; "
                    "global %zu excused, %zu failed; message %zu bytes (%zu values of %zu)\n",
                    v.name, W, cmp.compared, cmp.worst, cmp.excused, cmp.failures, cmp_global.excused,
                    cmp_global.failures, plan.message_bytes(), plan.total_slots, n);
    EXPECT_EQ(cmp.failures, size_t{0});
    EXPECT_EQ(cmp_global.failures, size_t{0});
    EXPECT(cmp.excused * 2000 <= cmp.compared);
    EXPECT(cmp_global.excused * 2000 <= cmp_global.compared);

    // A resume mid-round (after the first sync: the error feedback is in the blob): a new optimizer from the blob,
    // the checkpoint's model file (the global weights) in params; the last steps must give the same bits.
    std::unique_ptr<Diloco> resumed = make(c, layout, world);
    ByteReader reader(mid_round, "mid-round blob");
    resumed->load_state(reader);
    EXPECT(reader.at_end());
    std::vector<float> p2(n);
    {
        std::unique_ptr<Diloco> probe = make(c, layout, world);  // the blob's global weights: the model file
        ByteReader r2(mid_round, "mid-round blob");
        probe->load_state(r2);
        std::vector<float> dummy(n);
        std::span<float> gw = probe->master_weights(dummy);
        std::copy(gw.begin(), gw.end(), p2.begin());
    }
    resumed->set_weights(p2);
    EXPECT(p2 == mid_params);
    for (int s = 4; s < kSteps; s++) {
        std::vector<float> g = gradient(n, me, s);
        resumed->step(p2, g, lr_at(s));
    }
    EXPECT(p2 == params);
    ByteWriter a, b;
    opt->save_state(a);
    resumed->save_state(b);
    EXPECT(a.bytes() == b.bytes());
}

// Exact round trips of the packings, and the quantizer on values worked out by hand.
void check_codec() {
    std::vector<uint16_t> idx;
    for (size_t len : {0, 1, 2, 7, 64, 4097}) {
        idx.resize(len);
        for (size_t i = 0; i < len; i++) idx[i] = static_cast<uint16_t>((i * 2654435761u + 17) % 4096);
        if (len > 1) {
            idx[0] = 4095;
            idx[1] = 0;
        }
        std::vector<std::byte> packed(3 * ((len + 1) / 2), std::byte{0xaa});
        sparseloco::pack_indices12(idx, packed.data());
        std::vector<uint16_t> back(len);
        sparseloco::unpack_indices12(packed.data(), back);
        EXPECT(back == idx);
        std::vector<uint8_t> codes(len);
        for (size_t i = 0; i < len; i++) codes[i] = static_cast<uint8_t>(idx[i] % 4);
        std::vector<std::byte> cp((len + 3) / 4, std::byte{0xff});
        sparseloco::pack_codes2(codes, cp.data());
        std::vector<uint8_t> cb(len);
        sparseloco::unpack_codes2(cp.data(), cb);
        EXPECT(cb == codes);
    }
    // templar's byte layout: (0xabc, 0x123) -> bc 3a 12
    const uint16_t pair[2] = {0xabc, 0x123};
    std::byte three[3];
    sparseloco::pack_indices12(pair, three);
    EXPECT(three[0] == std::byte{0xbc} && three[1] == std::byte{0x3a} && three[2] == std::byte{0x12});

    // {1, -1, 1, -1}: mean 0, std sqrt(4/3), scale 1.5 std = 1.732: 1/1.732 + 2 = 2.58 -> 3, -> 1.42 -> 1;
    // the bins' means are 1 and -1, so the values come back exactly
    {
        const float v[4] = {1, -1, 1, -1};
        uint8_t q[4];
        float book[5];
        sparseloco::quantize_2bit(v, q, book);
        EXPECT(q[0] == 3 && q[1] == 1 && q[2] == 3 && q[3] == 1);
        EXPECT(book[0] == 0.0f && book[1] == 0.0f && book[2] == -1.0f && book[3] == 0.0f && book[4] == 1.0f);
    }
    // {2, 0, 0, 0}: mean 0.5, centered {1.5, -0.5 x3}, std = sqrt(3 / 3) = 1, scale 1.5: 1 + 2 -> 3, -1/3 + 2 -> 2
    {
        const float v[4] = {2, 0, 0, 0};
        uint8_t q[4];
        float book[5];
        sparseloco::quantize_2bit(v, q, book);
        EXPECT(q[0] == 3 && q[1] == 2 && q[2] == 2 && q[3] == 2);
        EXPECT(book[0] == 0.5f && book[3] == -0.5f && book[4] == 1.5f);
        EXPECT(sparseloco::dequantize_2bit(q[0], book) == 2.0f && sparseloco::dequantize_2bit(q[1], book) == 0.0f);
    }
    // {-8, 0 x 6, 1}: mean -0.875, std sqrt(58.875 / 7) = 2.90, scale 4.35: the outlier alone in bin 0 (-7.125 /
    // 4.35 + 2 = 0.36), 1 in bin 2 with the zeros (1.875 / 4.35 + 2 = 2.43), whose mean is 7.125 / 7 - 0.875
    {
        const float v[8] = {-8, 0, 0, 0, 0, 0, 0, 1};
        uint8_t q[8];
        float book[5];
        sparseloco::quantize_2bit(v, q, book);
        EXPECT(q[0] == 0);
        for (int i = 1; i < 8; i++) EXPECT(q[i] == 2);
        EXPECT(sparseloco::dequantize_2bit(q[0], book) == -8.0f);
        EXPECT(book[3] == static_cast<float>(7.125 / 7.0));
    }
    // one value: std 0 -> scale 1, code 2, and it decodes exactly; a NaN poisons its tensor's codebook
    {
        const float one[1] = {0.25f};
        uint8_t q[1];
        float book[5];
        sparseloco::quantize_2bit(one, q, book);
        EXPECT(q[0] == 2 && sparseloco::dequantize_2bit(q[0], book) == 0.25f);
        const float bad[2] = {1.0f, std::nanf("")};
        uint8_t q2[2];
        sparseloco::quantize_2bit(bad, q2, book);
        EXPECT(std::isnan(sparseloco::dequantize_2bit(q2[0], book)));
    }
    // the median rule: torch.median's lower middle value; the clip
    EXPECT(sparseloco::lower_median({3.0f, 1.0f, 2.0f, 4.0f}) == 2.0f);
    EXPECT(sparseloco::lower_median({5.0f}) == 5.0f);
    EXPECT(sparseloco::clip_factor(2.0f, 4.0f) == 2.0f / (4.0f + 1e-8f));
    EXPECT(sparseloco::clip_factor(4.0f, 2.0f) == 1.0f);

    // the plan: [96, 50] with chunk 64 -> 48 x 50 chunks (2 of them), [1000] -> pieces of 50, prime 7 -> one piece
    const ParamLayout layout = awkward_layout();
    const sparseloco::Plan plan = sparseloco::make_plan(layout, 64, 64, true);
    EXPECT(plan.tensors[0].n1 == 48 && plan.tensors[0].n2 == 50 && plan.tensors[0].num_chunks == 2);
    EXPECT(plan.tensors[1].n1 == 1 && plan.tensors[1].n2 == 7 && plan.tensors[1].k == 7);
    EXPECT(plan.tensors[2].n1 == 64 && plan.tensors[2].n2 == 64 && plan.tensors[2].num_chunks == 2);
    EXPECT(plan.tensors[4].n2 == 50 && plan.tensors[4].num_chunks == 20 && plan.tensors[4].k == 50);
    // an encode/decode of a buffer: positions inside their chunks, fp32 values exact, and a wrong size refused
    const sparseloco::Plan fp = sparseloco::make_plan(layout, 16, 5, false);
    const std::vector<float> x = testing::random_normal(layout.num_params, 99, 1.0);
    std::vector<std::byte> msg;
    sparseloco::encode(fp, x, msg);
    EXPECT_EQ(msg.size(), fp.message_bytes());
    sparseloco::Decoded d;
    sparseloco::decode(fp, msg, d, "test");
    bool exact = true;
    for (size_t s = 0; s < d.positions.size(); s++) exact = exact && d.values[s] == x[d.positions[s]];
    EXPECT(exact);
    // chunk 0 of tensor 2 (16 x 16 of a [128, 64]): the 5 largest |x| of its elements
    {
        const sparseloco::TensorPlan& p = fp.tensors[2];
        std::vector<float> mags;
        for (size_t l = 0; l < p.chunk_elems; l++) mags.push_back(std::fabs(x[p.offset + p.element(0, l)]));
        std::sort(mags.begin(), mags.end());
        float fifth = mags[mags.size() - 5], got_min = 1e30f;
        for (size_t s = p.first_slot; s < p.first_slot + p.k; s++) got_min = std::min(got_min, std::fabs(d.values[s]));
        EXPECT(got_min == fifth);
    }
    msg.pop_back();
    EXPECT_ERROR(sparseloco::decode(fp, msg, d, "rank 1's message"), "rank 1's message: a SparseLoCo message of");
}

void check_refusals(Transport& world, const std::string& dir) {
    const ParamLayout layout = awkward_layout();
    const OptimizerConfig c = case_config(kVariants[0]);
    std::unique_ptr<Diloco> opt = make(c, layout, world);
    ByteWriter other;
    other.put_string("diloco");
    other.put<uint64_t>(layout.num_params);
    ByteReader r1(other.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt->load_state(r1), "ck/state_0.bin: optimizer state is for 'diloco', not 'sparseloco'");
    // a real DiLoCo blob of this layout too
    Diloco dl(c, layout, world);
    ByteWriter dlb;
    dl.save_state(dlb);
    ByteReader r2(dlb.bytes(), "ck/state_1.bin");
    EXPECT_ERROR(opt->load_state(r2), "optimizer state is for 'diloco', not 'sparseloco'");
    ByteWriter small;
    small.put_string("sparseloco");
    small.put<uint64_t>(12);
    ByteReader r3(small.bytes(), "ck/state_0.bin");
    EXPECT_ERROR(opt->load_state(r3), "optimizer state has 12 parameters, model has");
    // a SparseLoCo blob cut before its error feedback
    ByteWriter full;
    opt->save_state(full);
    const std::vector<std::byte> cut(full.bytes().begin(), full.bytes().end() - 8);
    std::unique_ptr<Diloco> other_opt = make(c, layout, world);
    ByteReader r4(cut, "ck/state_0.bin");
    EXPECT_ERROR(other_opt->load_state(r4), "ck/state_0.bin: corrupt or truncated (sparseloco error feedback)");

    OptimizerConfig bad = c;
    bad.sparseloco.topk = 0;
    EXPECT_ERROR(validate_sparseloco_options(bad), "--sparseloco_topk must be in [1, 4096] (got 0)");
    bad = c;
    bad.sparseloco.chunk = 65;
    EXPECT_ERROR(validate_sparseloco_options(bad), "--sparseloco_chunk must be in [1, 64] (got 65)");
    bad = c;
    bad.sparseloco.ef_decay = 1.5f;
    EXPECT_ERROR(validate_sparseloco_options(bad), "--sparseloco_ef_decay must be in [0, 1] (got 1.5)");
    bad = c;
    bad.diloco.wire = DilocoWire::int8;
    // the config layer runs every family's check whatever --optimizer is, so DiLoCo's int8 must pass this one;
    // SparseLoCo itself refuses it
    validate_sparseloco_options(bad);
    EXPECT_ERROR(make(bad, layout, world), "--diloco_wire does not apply to --optimizer sparseloco");
    EXPECT_ERROR(check_sparseloco_wire(bad), "--diloco_wire does not apply to --optimizer sparseloco");
    bad = c;
    bad.diloco.inner_steps = 0;
    EXPECT_ERROR(validate_sparseloco_options(bad), "--diloco_inner_steps must be >= 1 (got 0)");

    // GPT-2 124M's message, against the reference's count from its shapes
    if (!dir.empty()) {
        OptimizerConfig d;
        const ParamLayout gpt2 = ParamLayout::of(ModelConfig{});
        const sparseloco::Plan p = sparseloco_plan(d, gpt2);
        const size_t want = reference_message_bytes(dir, "gpt2_124m");
        EXPECT_EQ(p.message_bytes(), want);
        std::printf("  GPT-2 124M: %zu bytes per message (%zu values of %zu, %.3f bits per parameter; fp32 "
                    "all-reduce payload %zu)\n",
                    p.message_bytes(), p.total_slots, gpt2.num_params,
                    8.0 * static_cast<double>(p.message_bytes()) / static_cast<double>(gpt2.num_params),
                    4 * gpt2.num_params);
    }
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
        std::fprintf(stderr, "usage: test_mpi_sparseloco --write-cases DIR | --check-cases DIR "
                             "(test/e2e/test_sparseloco.sh)\n");
        return 2;
    }
    std::unique_ptr<Transport> world = make_world_transport(&argc, &argv);
    if (world->rank() != 0) std::freopen("/dev/null", "w", stdout);
    const std::string dir = argc == 3 ? argv[2] : "";
    try {
        check_codec();
        for (const Variant& v : kVariants) check_case(*world, dir, v);
        check_refusals(*world, dir);
    } catch (const std::exception& e) {
        testing::report_failure(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what());
    }
    std::vector<double> failed = {static_cast<double>(testing::Registry::get().failures)};
    world->allreduce_max(failed);
    if (world->rank() == 0)
        std::printf("%s\n", failed[0] == 0.0 ? "all SparseLoCo checks passed" : "SparseLoCo checks FAILED");
    world.reset();
    return failed[0] != 0.0 ? 1 : 0;
}
