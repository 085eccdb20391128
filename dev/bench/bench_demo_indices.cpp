// Benchmark of DeMo's index encodings (llmc/optim/demo/codec.h) on 64 x 64 chunks: bits per index of the entropy
// (Elias-Fano) encoding against the information bound log2(C(4096, k)) / k of a k-subset and the 12- and 16-bit
// packings, for k = 1 ... 128, and encode_bucket / decode_bucket nanoseconds per index for each, on one thread.
// The values are sign-encoded (1 bit each) so the timings are mostly the indices'; sizes do not depend on which
// indices are chosen (every encoding has a fixed size per chunk), timings use random k-subsets.
//
//   build/bench/bench_demo_indices [--chunks N (1024)] [--reps N (5)]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/rng.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"

namespace {

// CPU seconds of the calling thread (the codec runs on it with one OpenMP thread): on a shared machine wall times
// stretch with the other jobs, thread CPU times stay near what the work costs.
double now_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double log2_binomial(double n, double k) {
    return (std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1)) / std::log(2.0);
}

// Median seconds of `reps` calls of f after one warm-up call.
template <typename F>
double median_seconds(int reps, F&& f) {
    f();
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_seconds();
        f();
        t.push_back(now_seconds() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int run(int argc, char** argv) {
    size_t chunks = 1024;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        const std::string f = argv[i];
        LLMC_CHECK(i + 1 < argc, f + " needs a value");
        const long v = std::stol(argv[++i]);
        if (f == "--chunks") chunks = static_cast<size_t>(std::max(1L, v));
        else if (f == "--reps") reps = static_cast<int>(std::max(1L, v));
        else llmc::fail("unknown option " + f);
    }
    omp_set_num_threads(1);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const llmc::DemoIndexEncoding encodings[3] = {llmc::DemoIndexEncoding::smallest, llmc::DemoIndexEncoding::packed12,
                                                  llmc::DemoIndexEncoding::entropy};
    std::printf("DeMo index encodings on %zu chunks of 64 x 64 (U = 4096), sign values, 1 thread, CPU time, median "
                "of %d\n",
                chunks, reps);
    std::printf("bits per index: bound = log2(C(4096, k)) / k; ef = entropy (Elias-Fano), index part incl. padding\n");
    std::printf("%5s %8s %8s %8s %8s %8s | %-26s | %-26s\n", "k", "bound", "ef", "ef/bound", "p12", "u16",
                "encode ns/index u16 p12 ef", "decode ns/index u16 p12 ef");
    llmc::Rng rng(1);
    for (size_t k : {1, 2, 4, 8, 16, 32, 64, 128}) {
        // one [64, 64 * chunks] tensor: `chunks` chunks of 64 x 64
        const demo::ModelPlan plan = demo::plan_model({{64, 64 * chunks}}, 64, k);
        const demo::TensorPlan& t = plan.tensors[0];
        demo::Selection sel;
        sel.resize(plan);
        std::vector<uint32_t> all(t.chunk_elems);
        for (size_t c = 0; c < t.num_chunks; c++) {
            for (size_t i = 0; i < all.size(); i++) all[i] = static_cast<uint32_t>(i);
            for (size_t i = 0; i < k; i++) std::swap(all[i], all[i + rng.below(all.size() - i)]);
            std::sort(all.begin(), all.begin() + static_cast<ptrdiff_t>(k));
            for (size_t i = 0; i < k; i++) {
                sel.indices[c * k + i] = all[i];
                sel.values[c * k + i] = rng.below(2) ? 1.0f : -1.0f;
            }
            sel.scales[c] = 1.0f;
        }
        const double items = static_cast<double>(t.selected());
        double bits[3], enc_ns[3], dec_ns[3];
        for (int e = 0; e < 3; e++) {
            const demo::WireFormat format{llmc::DemoValueEncoding::sign, encodings[e]};
            bits[e] = 8.0 * static_cast<double>(demo::index_part_bytes(t, encodings[e])) / items;
            std::vector<std::byte> bucket;
            demo::Selection back;
            const auto encode = [&] { demo::encode_bucket(plan, format, sel, bucket); };
            const auto decode = [&] { demo::decode_bucket(plan, format, bucket, back, "bench"); };
            enc_ns[e] = 1e9 * median_seconds(reps, encode) / items;
            dec_ns[e] = 1e9 * median_seconds(reps, decode) / items;
            LLMC_CHECK(back.indices == sel.indices, "bench: round trip lost indices");
        }
        const double bound = log2_binomial(4096.0, static_cast<double>(k)) / static_cast<double>(k);
        std::printf("%5zu %8.3f %8.3f %8.3f %8.3f %8.3f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f\n", k, bound, bits[2],
                    bits[2] / bound, bits[1], bits[0], enc_ns[0], enc_ns[1], enc_ns[2], dec_ns[0], dec_ns[1],
                    dec_ns[2]);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
