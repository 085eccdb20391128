// Benchmark of one DeMo step on GPT-2 d12 shapes (124M parameters, k = 32, chunk 64, fp32 values): time of
// the transform (momentum + DCT encode + error feedback), top-k (selection + packing), exchange
// (LocalTransport, so only a copy) and apply, the apply side fed W = 4 simulated ranks' buckets so the
// union of coefficients per chunk is realistic. Also prints bucket bytes per encoding against the
// reference's int64 + fp32, the effect of bf16 values on the update (sign flips against fp32 values), and
// the DeMo step as a percentage of a d12 forward + backward at 2048 tokens on the CPU model.
//
//   build/bench/bench_demo [--reps N] [--model-reps N] (0 skips the model timing) [--B 4 --T 512]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/base/error.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/param_layout.h"
#include "llmc/base/rng.h"

namespace {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of all threads of the process: with other jobs on the machine, wall times stretch while CPU
// times stay near what the work costs, so the bench prints both.
double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Fast deterministic pseudo-normal fill (sum of uniforms is plenty for timing inputs).
void fill(std::vector<float>& v, uint64_t seed, float scale) {
    llmc::Rng rng(seed);
    for (float& x : v) {
        const uint64_t r = rng.next_u64();
        const double u = (static_cast<double>(r & 0xffff) + static_cast<double>((r >> 16) & 0xffff) +
                          static_cast<double>((r >> 32) & 0xffff) - 3 * 32767.5) / 32767.5;
        x = static_cast<float>(u * scale);
    }
}

struct Options {
    int reps = 3;
    int model_reps = 1;
    int B = 4, T = 512;
};

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string f = argv[i];
        LLMC_CHECK(i + 1 < argc, f + " needs a value");
        const int v = std::stoi(argv[++i]);
        if (f == "--reps") o.reps = std::max(1, v);
        else if (f == "--model-reps") o.model_reps = std::max(0, v);
        else if (f == "--B") o.B = v;
        else if (f == "--T") o.T = v;
        else llmc::fail("unknown option " + f);
    }
    return o;
}

int run(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up line by line when piped
    llmc::ModelConfig mc;  // d12: L12 H12 C768, T 1024, Vp 50304
    const llmc::ParamLayout layout = llmc::ParamLayout::gpt2(mc);
    const size_t n = layout.num_params;
    constexpr int kWorld = 4;
    llmc::OptimizerConfig cfg;  // topk 32, chunk 64, fp32 values, u16 indices
    std::printf("DeMo step on GPT-2 %s: %zu params, k=%d, chunk %d, %s values, apply fed %d ranks' buckets\n",
                mc.describe().c_str(), n, cfg.demo.topk, cfg.demo.chunk, demo::value_encoding_name(cfg.demo.values),
                kWorld);

    std::vector<float> params(n), params0(n);
    fill(params0, 1, 0.02f);
    std::vector<std::vector<float>> grads(kWorld, std::vector<float>(n));
    for (int r = 0; r < kWorld; r++) fill(grads[r], 100 + r, 1e-2f);

    // ---- timing: W compress calls (one per simulated rank), one exchange, one apply of all W buckets ----
    {
        llmc::LocalTransport transport;
        demo::DemoOptimizer demo_opt(cfg, layout, transport);
        params = params0;
        std::vector<double> transform, topk, exchange, apply, clip, total, cpu;
        for (int rep = 0; rep <= opt.reps; rep++) {  // rep 0 warms up (first touch of every buffer)
            llmc::StepTimings tm;
            std::vector<std::byte> all, bucket, gathered;
            std::vector<size_t> offsets{0}, gathered_offsets;
            double clip_s = 0.0, cpu_s = 0.0;
            for (int r = 0; r < kWorld; r++) {
                llmc::StepTimings rank_tm;
                std::vector<float> g = grads[r];
                const double c0 = now_seconds();
                // As DemoOptimizer::step: the norm pass, then the clip's scaling folded into compress.
                const float scale = llmc::clip_scale(llmc::grad_norm(g), cfg.grad_clip);
                clip_s = now_seconds() - c0;
                const double cpu0 = cpu_seconds();
                demo_opt.compress(params, g, 1e-4f, bucket, rank_tm, scale);
                if (r == 0) cpu_s = cpu_seconds() - cpu0;
                all.insert(all.end(), bucket.begin(), bucket.end());
                offsets.push_back(all.size());
                if (r == 0) tm = rank_tm;  // one rank's compress is one step's cost
            }
            const double e0 = now_seconds(), cpu0 = cpu_seconds();
            transport.allgather_bytes(bucket, gathered, gathered_offsets, llmc::GatherSizes::equal);
            tm.exchange = now_seconds() - e0;
            demo_opt.apply(all, offsets, params, 1e-4f, tm);
            cpu_s += cpu_seconds() - cpu0;
            if (rep == 0) continue;
            transform.push_back(tm.transform);
            topk.push_back(tm.topk);
            exchange.push_back(tm.exchange);
            apply.push_back(tm.apply);
            clip.push_back(clip_s);
            total.push_back(tm.transform + tm.topk + tm.exchange + tm.apply);
            cpu.push_back(cpu_s);
        }
        auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        const double tot = median(total);
        const double clip_med = median(clip);
        std::printf("\nDeMo step, median of %d (ms): transform %.1f  topk %.1f  exchange %.2f  apply(W=%d) %.1f  "
                    "total %.1f  (+ local gradient norm for the clip %.1f)\n",
                    opt.reps, 1e3 * median(transform), 1e3 * median(topk), 1e3 * median(exchange), kWorld,
                    1e3 * median(apply), 1e3 * tot, 1e3 * clip_med);
        const double tot_cpu = median(cpu);
        std::printf("DeMo step CPU time (all threads), median: %.1f ms; wall times of every rep (ms):", 1e3 * tot_cpu);
        for (double t : total) std::printf(" %.1f", 1e3 * t);
        std::printf("\n");

        // ---- bytes per encoding ----
        const demo::ModelPlan& plan = demo_opt.plan();
        const size_t ref = demo::reference_bytes(plan);
        std::printf("\nbucket bytes per rank per step (reference int64+fp32: %.3f MB)\n", ref / 1e6);
        for (auto ve : {llmc::DemoValueEncoding::fp32, llmc::DemoValueEncoding::bf16, llmc::DemoValueEncoding::sign})
            for (auto ie : {llmc::DemoIndexEncoding::smallest, llmc::DemoIndexEncoding::packed12,
                            llmc::DemoIndexEncoding::entropy}) {
                const size_t b = demo::bucket_bytes(plan, demo::WireFormat{ve, ie});
                std::printf("  %-5s + %-8s  %8.3f MB   %.2fx fewer than the reference\n",
                            demo::value_encoding_name(ve), demo::index_encoding_name(ie), b / 1e6,
                            static_cast<double>(ref) / static_cast<double>(b));
            }

        // ---- model forward + backward ----
        if (opt.model_reps > 0) {
            llmc::ModelCpu model(mc);
            model.init_random(7);
            const int tokens = opt.B * opt.T;
            std::vector<int> inputs(tokens), targets(tokens);
            llmc::Rng rng(9);
            for (int i = 0; i < tokens; i++) {
                inputs[i] = static_cast<int>(rng.below(static_cast<uint64_t>(mc.vocab_size)));
                targets[i] = static_cast<int>(rng.below(static_cast<uint64_t>(mc.vocab_size)));
            }
            std::vector<double> fb, fb_cpu;
            for (int rep = 0; rep <= opt.model_reps; rep++) {  // rep 0 warms up
                const double t0 = now_seconds(), cpu0 = cpu_seconds();
                model.zero_grad();
                model.forward(inputs.data(), targets.data(), opt.B, opt.T);
                model.backward();
                if (rep == 0) continue;
                fb.push_back(now_seconds() - t0);
                fb_cpu.push_back(cpu_seconds() - cpu0);
            }
            const double fbt = median(fb), fbt_cpu = median(fb_cpu);
            std::printf("\nd12 forward+backward, B=%d T=%d (%d tokens), median of %d: wall %.2f s, CPU %.2f s\n"
                        "DeMo step = %.1f%% of it by wall time (%.1f%% with the clip), %.1f%% by CPU time "
                        "(target <= 5%%)\n",
                        opt.B, opt.T, tokens, opt.model_reps, fbt, fbt_cpu, 100.0 * tot / fbt,
                        100.0 * (tot + clip_med) / fbt, 100.0 * tot_cpu / fbt_cpu);
        }
    }

    // ---- bf16 versus fp32 values: one step from the same state, W ranks ----
    {
        std::vector<std::vector<float>> result;
        for (auto ve : {llmc::DemoValueEncoding::fp32, llmc::DemoValueEncoding::bf16}) {
            llmc::OptimizerConfig c = cfg;
            c.demo.values = ve;
            llmc::LocalTransport transport;
            std::vector<std::unique_ptr<demo::DemoOptimizer>> ranks;
            std::vector<std::byte> all, bucket;
            std::vector<size_t> offsets{0};
            params = params0;
            llmc::StepTimings tm;
            for (int r = 0; r < kWorld; r++) {
                ranks.push_back(std::make_unique<demo::DemoOptimizer>(c, layout, transport));
                std::vector<float> p = params0;  // every rank starts from the same parameters
                ranks[r]->compress(p, grads[r], 1e-4f, bucket, tm);
                all.insert(all.end(), bucket.begin(), bucket.end());
                offsets.push_back(all.size());
                ranks.back().reset();  // the apply below needs only the buckets; keep memory low
            }
            demo::DemoOptimizer applier(c, layout, transport);
            applier.apply(all, offsets, params, 1e-4f, tm);
            result.push_back(params);
        }
        size_t flips = 0;
        double max_diff = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double d = std::fabs(static_cast<double>(result[0][i]) - result[1][i]);
            flips += d != 0.0;
            max_diff = std::max(max_diff, d);
        }
        std::printf("\nbf16 vs fp32 values, one step, W=%d, lr 1e-4: max |update difference| %.3g (= %.2f lr), "
                    "sign flips %zu of %zu (%.4f%%)\n",
                    kWorld, max_diff, max_diff / 1e-4, flips, n, 100.0 * static_cast<double>(flips) / n);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
