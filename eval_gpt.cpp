// eval_gpt: the loss of a model on token files, on the CPU: a trained checkpoint against a held-out set, or two
// runs' checkpoints (DeMo and AdamW, say) against the same data after the fact. Reads the files as the trainers'
// validation does (llmc::DataLoader, one rank, no shuffling: llm.c shards in windows of B*T+1 tokens every B*T
// tokens, OLMo token files in instances of T tokens, file after file) and averages the cross-entropy over the
// positions with a target of --batches batches, or of every batch the files hold (every position of an llm.c
// window; all but the last of an OLMo instance, as OLMo's loss). The format and dtype are the flags', else those of the model's run.
// With --choices, the accuracy on a multiple-choice set instead (HellaSwag, as llm.c scores it: the completion of
// least summed or mean loss after the context; llmc/data/multiple_choice.h reads the examples).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/run/checkpoint.h"
#include "llmc/run/config.h"
#include "llmc/data/dataloader.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/targets.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/data/multiple_choice.h"
#include "llmc/data/text_tokenizer.h"
#include "llmc/base/tool_flags.h"

namespace {

constexpr const char* kUsage = R"(usage: eval_gpt --model PATH [options]

Prints a model's mean cross-entropy loss (and perplexity) on token files (llm.c shards or OLMo's), on the CPU.

  --model PATH       an llm.c model file (fp32 or bf16), a checkpoint directory (its model.bin, checked against
                     the checkpoint's checksum), or a run's --out_dir (its latest complete checkpoint); repeat it
                     to compare models on the same batches (a line each)
  --data GLOB        token files: a glob, or @FILE listing paths (default "data/default/default_val_*.bin")
  --data_format F    llmc, olmo or auto (by the files); default: the model's run's, else auto
  --memmap_dtype D   the ids' type in OLMo files: uint8, uint16, uint32, uint64; default: the run's, else uint16
  --batch_size B     sequences per batch (default 4)
  --seq_len T        tokens per sequence (default 0: the model's max_seq_len)
  --batches N        batches to average (default 0: every batch the files hold, once: llm.c windows of B*T+1
                     tokens, or B OLMo instances of T tokens)
  --threads N        OpenMP threads (default 0: all cores)
  --json             a JSON line per model: model, data, batch_size, seq_len, batches, tokens, targets (the
                     positions the loss averages over: all of llm.c's, B*(T-1) a batch of OLMo's), loss,
                     perplexity, seconds (with --choices: model, choices, examples, acc, acc_norm, cropped, seconds)
  --help             print this help

Multiple choice (instead of --data, --batch_size, --seq_len and --batches):
  --choices FILE     the accuracy on multiple-choice examples: llm.c's eval file (*.bin, as its
                     dev/data/hellaswag.py writes hellaswag_val.bin) or JSON Lines in HellaSwag's schema ("ctx",
                     "endings", "label" a line, as hellaswag_val.jsonl; .gz or .zst too), tokenized as llm.c does
                     (the context, then each ending with a space before it). acc picks the completion of least
                     summed loss, acc_norm of least mean loss per token (llm.c's headline figure). A context too
                     long for max_seq_len loses its first tokens (counted as cropped).
  --examples N       examples to score (default 0: all)
  --per_example      also a line per example: its label, predictions and each completion's summed and mean loss
  --write_eval_file PATH  also write the examples read (the first --examples) as llm.c's eval file, which
                     the trainers' --choices reads (--model may then be omitted)
  --tokenizer PATH   a Hugging Face tokenizer.json for JSON Lines (default: the first model's run's --tokenizer
                     when that is a tokenizer.json, else GPT-2's --encoder and --vocab)
  --encoder PATH     GPT-2 encoder.json for JSON Lines (default data/cache/gpt2/encoder.json)
  --vocab PATH       GPT-2 vocab.bpe (default data/cache/gpt2/vocab.bpe)

The files are read in order, without shuffling, as the trainers read their validation files; the loss of a
checkpoint with its run's --batch_size and --seq_len, and --batches = the run's --val_batches x its ranks (each
rank validates on batches of its own), is the val loss the run logged (to rounding). Flags take --key value or
--key=value; dashes and underscores are equal.
)";

struct Options {
    std::vector<std::string> models;
    std::string data = "data/default/default_val_*.bin";
    std::optional<llmc::DataFormat> data_format;  // unset: the model's run's, else auto
    std::optional<llmc::TokenDtype> memmap_dtype;
    long long batch_size = 4, seq_len = 0, batches = 0, threads = 0;
    bool json = false;
    std::string choices, write_eval_file;
    std::string tokenizer, encoder = "data/cache/gpt2/encoder.json", vocab = "data/cache/gpt2/vocab.bpe";
    long long examples = 0;
    bool per_example = false;
};

Options parse_args(int argc, char** argv) {
    using llmc::flag_integer;
    Options o;
    std::set<std::string> shard_flags, choice_flags;
    const auto valued = {"model",    "data",     "batch_size", "seq_len", "batches",         "threads",
                         "choices",  "examples", "encoder",    "vocab",   "write_eval_file", "data_format",
                         "memmap_dtype", "tokenizer"};
    llmc::for_each_flag(argc, argv, kUsage, {"json", "per_example"}, valued,
                        [&](const std::string& key, const std::string& flag, const std::string& value) {
        if (key == "data" || key == "batch_size" || key == "seq_len" || key == "batches" || key == "data_format" ||
            key == "memmap_dtype")
            shard_flags.insert(flag);
        if (key == "examples" || key == "per_example" || key == "encoder" || key == "vocab" || key == "tokenizer" ||
            key == "write_eval_file")
            choice_flags.insert(flag);
        if (key == "model") o.models.push_back(value);
        else if (key == "data") o.data = value;
        else if (key == "data_format") o.data_format = llmc::parse_data_format(value, flag);
        else if (key == "memmap_dtype") o.memmap_dtype = llmc::parse_token_dtype(value, flag);
        else if (key == "batch_size") o.batch_size = flag_integer(flag, value, 1, 1 << 20);
        else if (key == "seq_len") o.seq_len = flag_integer(flag, value, 0, 1 << 20);
        else if (key == "batches") o.batches = flag_integer(flag, value, 0, INT64_MAX);
        else if (key == "threads") o.threads = flag_integer(flag, value, 0, llmc::kMaxThreads);
        else if (key == "json") o.json = value == "true";
        else if (key == "choices") o.choices = value;
        else if (key == "examples") o.examples = flag_integer(flag, value, 0, INT64_MAX);
        else if (key == "per_example") o.per_example = value == "true";
        else if (key == "write_eval_file") o.write_eval_file = value;
        else if (key == "encoder") o.encoder = value;
        else if (key == "vocab") o.vocab = value;
        else if (key == "tokenizer") o.tokenizer = value;
        else llmc::fail(flag + ": unknown flag (see --help)");
    });
    LLMC_CHECK(!o.models.empty() || !o.write_eval_file.empty(), "--model is required (see --help)");
    if (!o.choices.empty()) {
        LLMC_CHECK(shard_flags.empty(), *shard_flags.begin() + " does not apply to --choices (see --help)");
    } else {
        LLMC_CHECK(choice_flags.empty(), *choice_flags.begin() + " applies only with --choices (see --help)");
    }
    LLMC_CHECK(!o.data.empty(), "--data is empty");
    return o;
}

// One model's line: its loss over the same batches as every other model's.
void evaluate(const llmc::ModelSource& source, const llmc::ModelConfig& config, const Options& o) {
    const int T = o.seq_len > 0 ? static_cast<int>(o.seq_len) : config.max_seq_len;
    const int B = static_cast<int>(o.batch_size);
    LLMC_CHECK(T <= config.max_seq_len, "--seq_len " + std::to_string(T) + " exceeds the model's max_seq_len " +
                                            std::to_string(config.max_seq_len) + " (" + source.file + ")");
    llmc::ModelCpu model(config, llmc::ModelUse::inference);
    llmc::load_model_source(source, config, model.params());
    const llmc::RunSettings run = llmc::read_run_settings(source.file);
    llmc::DataLoader loader(o.data, B, T, 0, 1, /*shuffle=*/false, 0, config.vocab_size,
                            o.data_format.value_or(run.data_format.value_or(llmc::DataFormat::auto_detect)),
                            o.memmap_dtype.value_or(run.memmap_dtype.value_or(llmc::TokenDtype::uint16)));
    const uint64_t windows = loader.groups_per_epoch();  // > 0, or the loader would have refused the files
    const uint64_t batches = o.batches > 0 ? static_cast<uint64_t>(o.batches) : windows;
    LLMC_CHECK(batches <= windows, "--batches " + std::to_string(batches) + ": " + o.data + " holds only " +
                                       std::to_string(windows) + " batches of B=" + std::to_string(B) +
                                       " T=" + std::to_string(T));

    const auto start = std::chrono::steady_clock::now();
    std::vector<int> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    llmc::TargetMean mean;  // the batch means weighed by their targets (llm.c windows: the plain mean, bit for bit)
    uint64_t targets_scored = 0;
    for (uint64_t i = 0; i < batches; i++) {
        loader.next_batch(inputs, targets);
        const double batch_loss = model.forward(inputs.data(), targets.data(), B, T);
        LLMC_CHECK(std::isfinite(batch_loss), source.file + ": the loss of batch " + std::to_string(i + 1) + " is " +
                                                  (std::isnan(batch_loss) ? "NaN" : "inf") +
                                                  " (the weights, or a diverged run's model)");
        mean.add(batch_loss, model.target_count(), inputs.size());
        targets_scored += model.target_count();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double loss = mean.value();
    const uint64_t tokens = batches * static_cast<uint64_t>(B) * T;
    if (o.json) {
        const nlohmann::json line = {{"model", source.file}, {"data", o.data},     {"batch_size", B},
                                     {"seq_len", T},         {"batches", batches}, {"tokens", tokens},
                                     {"targets", targets_scored}, {"loss", loss}, {"perplexity", std::exp(loss)},
                                     {"seconds", seconds}};
        std::printf("%s\n", line.dump().c_str());
    } else {
        std::printf("%s on %s: loss %.4f, perplexity %.2f, over %llu targets of %llu tokens (%llu batches of B=%d "
                    "T=%d); %.1f s, %.0f tokens/s\n",
                    source.file.c_str(), o.data.c_str(), loss, std::exp(loss),
                    static_cast<unsigned long long>(targets_scored), static_cast<unsigned long long>(tokens),
                    static_cast<unsigned long long>(batches), B, T, seconds, tokens / seconds);
    }
    std::fflush(stdout);
}

void evaluate_choices(const llmc::ModelSource& source, const llmc::ModelConfig& config,
                      const std::vector<llmc::ChoiceExample>& examples, const Options& o) {
    const size_t row_tokens = static_cast<size_t>(config.max_seq_len) + 1;  // a row's last token is only a target
    llmc::check_choices_fit(examples, row_tokens, o.choices);
    llmc::ModelCpu model(config, llmc::ModelUse::inference);
    llmc::load_model_source(source, config, model.params());
    const auto start = std::chrono::steady_clock::now();
    // an example a forward (up to 4 rows: HellaSwag's), as long as its longest row: two examples a forward padded
    // to the longer were 1.3x slower for GPT-2 124M on 2 cores
    const llmc::ChoiceBatching batching{row_tokens, 4, 0, false,
                                        llmc::read_run_settings(source.file).pad_token_id.value_or(0)};
    const std::vector<llmc::ChoiceScore> scores = llmc::score_choices(
        examples, 0, 1, batching, [&](const int* inputs, const int* targets, int B, int T) {
            model.forward(inputs, targets, B, T);
            const auto losses = model.losses();
            LLMC_CHECK(llmc::count_non_finite(losses) == 0,
                       source.file + ": the forward pass gives NaN or inf losses (the weights, or a diverged "
                                     "run's model)");
            return losses;
        });
    size_t correct = 0, correct_norm = 0, cropped = 0;
    for (size_t i = 0; i < examples.size(); i++) {
        const llmc::ChoiceScore& score = scores[i];
        correct += score.prediction == examples[i].label;
        correct_norm += score.prediction_norm == examples[i].label;
        cropped += score.cropped > 0;
        if (o.per_example && o.json) {
            const nlohmann::json line = {{"example", i},
                                         {"label", examples[i].label},
                                         {"prediction", score.prediction},
                                         {"prediction_norm", score.prediction_norm},
                                         {"sum_losses", score.sum},
                                         {"mean_losses", score.mean},
                                         {"cropped", score.cropped}};
            std::printf("%s\n", line.dump().c_str());
        } else if (o.per_example) {
            std::printf("example %zu: label %d, predicted %d (summed loss) %d (mean loss); mean losses", i,
                        examples[i].label, score.prediction, score.prediction_norm);
            for (const double m : score.mean) std::printf(" %.4f", m);
            std::printf("\n");
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double n = static_cast<double>(examples.size());
    if (o.json) {
        const nlohmann::json line = {{"model", source.file},           {"choices", o.choices},
                                     {"examples", examples.size()},    {"acc", correct / n},
                                     {"acc_norm", correct_norm / n},   {"cropped", cropped},
                                     {"seconds", seconds}};
        std::printf("%s\n", line.dump().c_str());
    } else {
        std::printf("%s on %s: acc_norm %.4f (least mean loss), acc %.4f (least summed loss), over %zu examples "
                    "(%zu with the context cropped to max_seq_len); %.1f s, %.1f examples/s\n",
                    source.file.c_str(), o.choices.c_str(), correct_norm / n, correct / n, examples.size(), cropped,
                    seconds, n / seconds);
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
    if (o.choices.empty()) {
        for (size_t i = 0; i < sources.size(); i++) evaluate(sources[i], configs[i], o);
        return 0;
    }
    // the examples are read once, for the smallest vocabulary among the models (each model's ids must fit it)
    int vocab_size = 65535;  // what the eval file format holds
    for (const llmc::ModelConfig& c : configs) vocab_size = std::min(vocab_size, c.vocab_size);
    std::unique_ptr<llmc::TextTokenizer> tokenizer;
    if (!llmc::is_eval_file(o.choices)) {
        std::string tokenizer_json = o.tokenizer;
        if (tokenizer_json.empty() && !sources.empty())
            tokenizer_json = llmc::run_tokenizer_json(llmc::read_run_settings(sources[0].file));
        tokenizer = llmc::load_text_tokenizer(tokenizer_json, o.encoder, o.vocab);
        for (size_t i = 0; i < sources.size(); i++)
            llmc::check_tokenizer_fits(*tokenizer, configs[i].vocab_size, sources[i].file);
    }
    const std::vector<llmc::ChoiceExample> examples = llmc::read_choice_examples(
        o.choices, tokenizer.get(), vocab_size, static_cast<size_t>(o.examples));
    LLMC_CHECK(o.examples == 0 || examples.size() == static_cast<size_t>(o.examples),
               "--examples " + std::to_string(o.examples) + ": " + o.choices + " holds only " +
                   std::to_string(examples.size()));
    if (!o.write_eval_file.empty()) {
        llmc::write_eval_file(o.write_eval_file, examples);
        std::fprintf(stderr, "eval_gpt: wrote %zu examples to %s\n", examples.size(), o.write_eval_file.c_str());
    }
    for (size_t i = 0; i < sources.size(); i++) evaluate_choices(sources[i], configs[i], examples, o);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse_args(n, args)); });
}
