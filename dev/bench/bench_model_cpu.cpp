// Benchmark of one CPU training step (ModelCpu forward + backward + llmc::AdamW update) on a randomly
// initialised model and random tokens: median milliseconds of forward, backward, optimizer and the whole
// step after warmup, and tokens/s. By default GPT-2 124M (d12) at B=4,T=64 (llm.c's train_gpt2.c setting,
// compared in docs/benchmarks.md) and at B=8,T=256.
//
// Usage: bench_model_cpu [--arch gpt2|olmo|both] [--layers L] [--heads H] [--channels C] [-B B] [-T T]
//                        [--steps N] [--warmup W]
// Any of --layers/--heads/--channels/-B/-T replaces the two defaults with that single configuration (the
// unspecified values keep d12 and B=4,T=64). --arch both runs the configuration as GPT-2 and as OLMo (vocabulary
// 50280) and prints the ratio of their step times beside the ratio of their flops per token (llm.c's estimate,
// model_flops_per_token), the cost OLMo's larger MLP predicts. Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/optim/adamw/adamw.h"
#include "llmc/base/error.h"
#include "llmc/model/model_cpu.h"
#include "llmc/base/rng.h"
#include "llmc/comm/transport.h"

namespace {

struct BenchCase {
    llmc::ModelConfig config;
    int B = 4, T = 64;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Returns the median step time in seconds.
double run_case(const BenchCase& bc, int steps, int warmup) {
    llmc::ModelCpu model(bc.config);
    model.init_random(1337);
    llmc::OptimizerConfig opt_config;
    opt_config.weight_decay = 0.1f;
    llmc::LocalTransport transport;
    llmc::AdamW adamw(opt_config, model.layout(), transport);

    const size_t N = size_t(bc.B) * bc.T;
    llmc::Rng rng(42);
    std::vector<int> tokens(N + 1);
    for (int& t : tokens) t = static_cast<int>(rng.below(bc.config.vocab_size));

    std::vector<double> fwd, bwd, opt, total;
    float loss = 0.0f;
    for (int step = 0; step < warmup + steps; step++) {
        const double t0 = now_seconds();
        model.zero_grad();
        loss = model.forward(tokens.data(), tokens.data() + 1, bc.B, bc.T);
        const double t1 = now_seconds();
        model.backward();
        const double t2 = now_seconds();
        adamw.step(model.params(), model.grads(), 1e-4f);
        const double t3 = now_seconds();
        if (step < warmup) continue;
        fwd.push_back(t1 - t0);  // zero_grad counted with forward, as llm.c's loop does
        bwd.push_back(t2 - t1);
        opt.push_back(t3 - t2);
        total.push_back(t3 - t0);
    }
    const double step_s = median(total);
    std::printf("%-34s B=%-3d T=%-4d  step %8.1f ms  (fwd %7.1f  bwd %7.1f  adamw %6.1f)  %8.0f tok/s  loss %.4f\n",
                bc.config.describe().c_str(), bc.B, bc.T, 1e3 * step_s, 1e3 * median(fwd), 1e3 * median(bwd),
                1e3 * median(opt), N / step_s, loss);
    std::fflush(stdout);
    return step_s;
}

int parse_int(const char* flag, const char* value, long min_value = 1) {
    LLMC_CHECK(value != nullptr, std::string(flag) + " needs a value");
    char* end = nullptr;
    const long v = std::strtol(value, &end, 10);
    LLMC_CHECK(*value != '\0' && *end == '\0' && v >= min_value && v < (1L << 30),
               std::string(flag) + ": expected an integer >= " + std::to_string(min_value) + ", got '" + value + "'");
    return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        BenchCase custom;
        bool have_custom = false;
        int steps = 5, warmup = 1;
        std::string arch = "gpt2";
        for (int i = 1; i < argc; i++) {
            const std::string flag = argv[i];
            const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
            if (flag == "--arch") {
                LLMC_CHECK(value && (std::string(value) == "gpt2" || std::string(value) == "olmo" ||
                                     std::string(value) == "both"),
                           "--arch: expected gpt2, olmo or both");
                arch = value;
            } else if (flag == "--layers") custom.config.num_layers = parse_int(argv[i], value), have_custom = true;
            else if (flag == "--heads") custom.config.num_heads = parse_int(argv[i], value), have_custom = true;
            else if (flag == "--channels") custom.config.channels = parse_int(argv[i], value), have_custom = true;
            else if (flag == "-B") custom.B = parse_int(argv[i], value), have_custom = true;
            else if (flag == "-T") custom.T = parse_int(argv[i], value), have_custom = true;
            else if (flag == "--steps") steps = parse_int(argv[i], value);
            else if (flag == "--warmup") warmup = parse_int(argv[i], value, 0);
            else llmc::fail("unknown flag '" + flag + "' (see the comment at the top of bench_model_cpu.cpp)");
            i++;
        }
        std::vector<BenchCase> shapes;
        if (have_custom) {
            shapes.push_back(custom);
        } else {
            shapes.push_back(BenchCase{llmc::ModelConfig{}, 4, 64});
            shapes.push_back(BenchCase{llmc::ModelConfig{}, 8, 256});
        }
        std::printf("ModelCpu fwd+bwd+AdamW, median of %d steps after %d warmup, %d OpenMP threads\n", steps, warmup,
                    omp_get_max_threads());
        const auto as_olmo = [](BenchCase bc) {
            bc.config.arch = llmc::ModelArch::olmo;
            bc.config.vocab_size = 50280;
            return bc;
        };
        for (const BenchCase& shape : shapes) {
            std::vector<BenchCase> cases;
            if (arch != "olmo") cases.push_back(shape);
            if (arch != "gpt2") cases.push_back(as_olmo(shape));
            std::vector<double> seconds, flops;
            for (const BenchCase& bc : cases) {
                llmc::validate_model_config(bc.config, "bench config");
                LLMC_CHECK(bc.T <= bc.config.max_seq_len, "-T " + std::to_string(bc.T) + " exceeds max_seq_len " +
                                                              std::to_string(bc.config.max_seq_len));
                seconds.push_back(run_case(bc, steps, warmup));
                flops.push_back(llmc::model_flops_per_token(llmc::ParamLayout::of(bc.config), bc.T));
            }
            if (cases.size() == 2)
                std::printf("OLMo / GPT-2: step time %.3fx, flops per token %.3fx\n", seconds[1] / seconds[0],
                            flops[1] / flops[0]);
        }
    } catch (const llmc::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
