// Benchmark of the DeMo bucket all-gather on the MPI transport: microseconds per all-gather when the ranks
// exchange their bucket sizes first (GatherSizes::exchange, what every round cost before DeMo learnt its sizes)
// and when they know them (GatherSizes::equal, every round after DeMo's first), blocking and split (start then
// finish, as --demo_delay 1 runs it). The difference is one small collective per round: on a slow or distant
// link a round trip per step. Sizes: a 64-byte bucket (latency alone), 64 KiB, and the GPT-2 124M bucket at
// --demo_topk 32 (fp32 values, smallest indices). Run it on the ranks and links to judge, e.g. 4 ranks here,
// or 4 emulated hosts of scripts/bandwidth_lab.sh:
//
//   mpirun -np 4 build/bench/bench_allgather [--reps N] [--bytes N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/traffic_report.h"
#include "llmc/base/error.h"
#include "llmc/comm/transport_mpi.h"

namespace {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

size_t gpt2_bucket_bytes() {
    std::vector<std::vector<size_t>> shapes;
    for (const demo::NamedShape& s : demo::model_shapes(llmc::ModelConfig{})) shapes.push_back(s.shape);
    return demo::bucket_bytes(demo::plan_model(shapes, 64, 32), demo::WireFormat{});
}

// Median microseconds per all-gather of `bytes` over `reps` calls (after 3 untimed), the slowest rank's per call.
double median_us(llmc::Transport& t, size_t bytes, llmc::GatherSizes how, bool split, int reps) {
    std::vector<std::byte> mine(bytes, std::byte{0x5a}), all;
    std::vector<size_t> offsets;
    std::vector<double> times;
    for (int i = -3; i < reps; i++) {
        t.barrier();
        const double start = now_seconds();
        if (split) {
            t.allgather_bytes_start(mine, how);
            t.allgather_bytes_finish(all, offsets);
        } else {
            t.allgather_bytes(mine, all, offsets, how);
        }
        std::vector<double> took = {now_seconds() - start};
        t.allreduce_max(took);
        if (i >= 0) times.push_back(took[0] * 1e6);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    return times[times.size() / 2];
}

int run(int argc, char** argv) {
    std::unique_ptr<llmc::Transport> world = llmc::make_world_transport(&argc, &argv);
    int reps = 200;
    std::vector<size_t> sizes = {64, 64 * 1024, gpt2_bucket_bytes()};
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        LLMC_CHECK(i + 1 < argc && (flag == "--reps" || flag == "--bytes"),
                   "bench_allgather: unknown flag or missing value '" + flag + "' (flags: --reps N, --bytes N)");
        const long long v = std::stoll(argv[++i]);
        LLMC_CHECK(v > 0, "bench_allgather: " + flag + " must be positive");
        if (flag == "--reps") reps = static_cast<int>(v);
        else sizes = {static_cast<size_t>(v)};
    }
    const bool lead = world->rank() == 0;
    if (lead)
        std::printf("all-gather of equal buckets, %d rank(s) (%s transport), median of %d, microseconds per call\n",
                    world->world_size(), std::string(world->name()).c_str(), reps);
    if (lead) std::printf("%12s  %-8s  %12s  %12s  %10s\n", "bytes", "mode", "exchange", "equal", "saved");
    for (const size_t bytes : sizes)
        for (const bool split : {false, true}) {
            const double exchanged = median_us(*world, bytes, llmc::GatherSizes::exchange, split, reps);
            const double equal = median_us(*world, bytes, llmc::GatherSizes::equal, split, reps);
            if (lead)
                std::printf("%12zu  %-8s  %12.1f  %12.1f  %10.1f\n", bytes, split ? "split" : "blocking", exchanged,
                            equal, exchanged - equal);
        }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
