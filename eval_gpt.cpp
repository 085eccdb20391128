// eval_gpt: the loss of a model on token shards, on the CPU: a trained checkpoint against a held-out set, or two
// runs' checkpoints (DeMo and AdamW, say) against the same data after the fact. Reads the shards as the trainers'
// validation does (llmc::DataLoader, one rank, no shuffling: windows of B*T+1 tokens every B*T tokens, shard after
// shard) and averages the cross-entropy over --batches batches, or over every window of the shards.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/gpt2_cpu.h"
#include "llmc/model_io.h"
#include "llmc/tool_flags.h"

namespace {

constexpr const char* kUsage = R"(usage: eval_gpt --model PATH [options]

Prints a GPT-2 model's mean cross-entropy loss (and perplexity) on llm.c token shards, on the CPU.

  --model PATH       an llm.c model file (fp32 or bf16), a checkpoint directory (its model.bin, checked against
                     the checkpoint's checksum), or a run's --out_dir (its latest complete checkpoint); repeat it
                     to compare models on the same batches (a line each)
  --data GLOB        token shards (default "data/default/default_val_*.bin")
  --batch_size B     sequences per batch (default 4)
  --seq_len T        tokens per sequence (default 0: the model's max_seq_len)
  --batches N        batches to average (default 0: every window of B*T+1 tokens in the shards, once)
  --threads N        OpenMP threads (default 0: all cores)
  --json             a JSON line per model: model, data, batch_size, seq_len, batches, tokens, loss, perplexity,
                     seconds
  --help             print this help

The shards are read in order, without shuffling, as the trainers read their validation shards; the loss of a
checkpoint with the trainer's --batch_size, --seq_len and --val_batches is the val loss its run logged (to
rounding). Flags take --key value or --key=value; dashes and underscores are equal.
)";

struct Options {
    std::vector<std::string> models;
    std::string data = "data/default/default_val_*.bin";
    long long batch_size = 4, seq_len = 0, batches = 0, threads = 0;
    bool json = false;
};

Options parse_args(int argc, char** argv) {
    using llmc::flag_integer;
    Options o;
    llmc::for_each_flag(argc, argv, kUsage, {"json"}, [&](const std::string& key, const std::string& flag,
                                                          const std::string& value) {
        if (key == "model") o.models.push_back(value);
        else if (key == "data") o.data = value;
        else if (key == "batch_size") o.batch_size = flag_integer(flag, value, 1, 1 << 20);
        else if (key == "seq_len") o.seq_len = flag_integer(flag, value, 0, 1 << 20);
        else if (key == "batches") o.batches = flag_integer(flag, value, 0, INT64_MAX);
        else if (key == "threads") o.threads = flag_integer(flag, value, 0, 4096);
        else if (key == "json") o.json = value == "true";
        else llmc::fail(flag + ": unknown flag (see --help)");
    });
    LLMC_CHECK(!o.models.empty(), "--model is required (see --help)");
    LLMC_CHECK(!o.data.empty(), "--data is empty");
    return o;
}

// One model's line: its loss over the same batches as every other model's.
void evaluate(const llmc::ModelSource& source, const llmc::ModelConfig& config, const Options& o) {
    const int T = o.seq_len > 0 ? static_cast<int>(o.seq_len) : config.max_seq_len;
    const int B = static_cast<int>(o.batch_size);
    LLMC_CHECK(T <= config.max_seq_len, "--seq_len " + std::to_string(T) + " exceeds the model's max_seq_len " +
                                            std::to_string(config.max_seq_len) + " (" + source.file + ")");
    llmc::GPT2Cpu model(config, llmc::ModelUse::inference);
    llmc::load_model_source(source, config, model.params());
    llmc::DataLoader loader(o.data, B, T, 0, 1, /*shuffle=*/false, 0, config.vocab_size);
    const uint64_t windows = loader.groups_per_epoch();  // > 0, or the loader would have refused the shards
    const uint64_t batches = o.batches > 0 ? static_cast<uint64_t>(o.batches) : windows;
    LLMC_CHECK(batches <= windows, "--batches " + std::to_string(batches) + ": " + o.data + " holds only " +
                                       std::to_string(windows) + " batches of B=" + std::to_string(B) +
                                       " T=" + std::to_string(T));

    const auto start = std::chrono::steady_clock::now();
    std::vector<int> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    double sum = 0.0;
    for (uint64_t i = 0; i < batches; i++) {
        loader.next_batch(inputs, targets);
        sum += model.forward(inputs.data(), targets.data(), B, T);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double loss = sum / static_cast<double>(batches);
    const uint64_t tokens = batches * static_cast<uint64_t>(B) * T;
    if (o.json) {
        const nlohmann::json line = {{"model", source.file}, {"data", o.data},     {"batch_size", B},
                                     {"seq_len", T},         {"batches", batches}, {"tokens", tokens},
                                     {"loss", loss},         {"perplexity", std::exp(loss)}, {"seconds", seconds}};
        std::printf("%s\n", line.dump().c_str());
    } else {
        std::printf("%s on %s: loss %.4f, perplexity %.2f, over %llu tokens (%llu batches of B=%d T=%d); %.1f s, "
                    "%.0f tokens/s\n",
                    source.file.c_str(), o.data.c_str(), loss, std::exp(loss),
                    static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(batches), B, T, seconds,
                    tokens / seconds);
    }
    std::fflush(stdout);
}

int run(const Options& o) {
    if (o.threads > 0) omp_set_num_threads(static_cast<int>(o.threads));
    // every --model found and its header read before the first is evaluated: a typo in the last one costs nothing
    std::vector<llmc::ModelSource> sources;
    std::vector<llmc::ModelConfig> configs;
    for (const std::string& model : o.models) {
        sources.push_back(llmc::resolve_model_source(model));
        configs.push_back(llmc::read_model_config(sources.back().file));
    }
    for (size_t i = 0; i < sources.size(); i++) evaluate(sources[i], configs[i], o);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse_args(n, args)); });
}
