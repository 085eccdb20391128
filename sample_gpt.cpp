// sample_gpt: text from a trained GPT-2 on the CPU. Loads an llm.c model file (ours, a checkpoint's, or llm.c's
// own, fp32 or bf16), encodes a prompt with GPT-2's BPE or a Hugging Face tokenizer.json after an end-of-text token (as every training document
// starts in prepro_gpt2's shards; the run's eos_token_id when its config.json is found), and extends it token by
// token with temperature, top-k and top-p sampling from a seed (llmc/model/sampling.h), so the same command prints
// the same text on any machine. The model keeps each layer's keys and values (ModelCpu::start_sequence / append), so
// a token costs one position's work until the context outgrows max_seq_len; past that the window slides and is run
// whole for every token.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/data/text_tokenizer.h"
#include "llmc/run/checkpoint.h"
#include "llmc/run/config.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/base/rng.h"
#include "llmc/model/sampling.h"
#include "llmc/base/tool_flags.h"

namespace {

using llmc::fail;

constexpr const char* kUsage = R"(usage: sample_gpt --model PATH [options]

Prints text sampled from a model (GPT-2 or OLMo) on the CPU: the prompt (after an end-of-text token), then --tokens more.

  --model PATH        an llm.c model file (fp32 or bf16), a checkpoint directory (its model.bin, checked against
                      the checkpoint's checksum), or a run's --out_dir (its latest complete checkpoint)
  --prompt TEXT       text to continue (default: none, so the model starts a new document)
  --prompt_file PATH  read the prompt from a file instead
  --tokens N          tokens to generate per sample (default 64)
  --num_samples N     independent samples, one after the other from the same random stream (default 1)
  --temperature T     softmax temperature; 0 picks the most likely token every time (default 1.0)
  --top_k K           sample among the K most likely tokens only (default 0: all)
  --top_p P           then among the fewest most likely tokens whose probability reaches P (default 1.0: all)
  --seed N            random seed (default 1337)
  --stop_at_eot       end a sample at the first generated end-of-text token (the run's eos_token_id when the
                      model is a run's checkpoint, else the tokenizer's)
  --tokenizer PATH    a Hugging Face tokenizer.json (default: the run's --tokenizer when that is a tokenizer.json,
                      else GPT-2's --encoder and --vocab)
  --encoder PATH      GPT-2 encoder.json (default data/cache/gpt2/encoder.json, written by data/prepare_default.sh)
  --vocab PATH        GPT-2 vocab.bpe (default data/cache/gpt2/vocab.bpe)
  --threads N         OpenMP threads (default 0: all cores)
  --json              one JSON line per sample instead of text: sample, prompt_tokens, tokens, text
  --help              print this help

Flags take --key value or --key=value; dashes and underscores are equal (--top-k). The model sees at most its
max_seq_len last tokens (past that, each token reruns the whole window: slower). A summary with the speed goes
to stderr.
)";

struct Options {
    std::string model, prompt, tokenizer, encoder = "data/cache/gpt2/encoder.json",
                                      vocab = "data/cache/gpt2/vocab.bpe";
    std::optional<std::string> prompt_file;
    long long tokens = 64, num_samples = 1, seed = 1337, threads = 0;
    llmc::SamplingParams sampling;
    bool stop_at_eot = false, json = false;
};

Options parse_args(int argc, char** argv) {
    using llmc::flag_integer, llmc::flag_number;
    Options o;
    const auto valued = {"model",  "prompt", "prompt_file", "tokens",  "num_samples", "temperature",
                         "top_k", "top_p",  "seed",        "encoder", "vocab",       "threads", "tokenizer"};
    llmc::for_each_flag(argc, argv, kUsage, {"stop_at_eot", "json"}, valued,
                        [&](const std::string& key, const std::string& flag, const std::string& value) {
        if (key == "model") o.model = value;
        else if (key == "prompt") o.prompt = value;
        else if (key == "prompt_file") o.prompt_file = value;
        else if (key == "tokens") o.tokens = flag_integer(flag, value, 0, llmc::kMaxSampleTokens);
        else if (key == "num_samples") o.num_samples = flag_integer(flag, value, 1, 1'000'000);
        else if (key == "temperature") o.sampling.temperature = flag_number(flag, value);
        else if (key == "top_k") o.sampling.top_k = static_cast<int>(flag_integer(flag, value, 0, INT32_MAX));
        else if (key == "top_p") o.sampling.top_p = flag_number(flag, value);
        else if (key == "seed") o.seed = flag_integer(flag, value, 0, INT64_MAX);
        else if (key == "encoder") o.encoder = value;
        else if (key == "vocab") o.vocab = value;
        else if (key == "tokenizer") o.tokenizer = value;
        else if (key == "threads") o.threads = flag_integer(flag, value, 0, llmc::kMaxThreads);
        else if (key == "stop_at_eot") o.stop_at_eot = value == "true";
        else if (key == "json") o.json = value == "true";
        else fail(flag + ": unknown flag (see --help)");
    });
    LLMC_CHECK(!o.model.empty(), "--model is required (see --help)");
    LLMC_CHECK(o.prompt.empty() || !o.prompt_file, "--prompt and --prompt_file exclude each other");
    llmc::validate_sampling(o.sampling);
    return o;
}

// The text of the ids the tokenizer has (a model's vocabulary may extend past it).
std::string decode_known(const llmc::TextTokenizer& tokenizer, const std::vector<int>& tokens) {
    std::vector<int> known;
    for (int t : tokens)
        if (tokenizer.is_assigned(t)) known.push_back(t);
    return tokenizer.decode(known);
}

int run(const Options& o) {
    const llmc::ModelSource source = llmc::resolve_model_source(o.model);
    const std::string& model_file = source.file;
    const llmc::ModelConfig config = llmc::read_model_config(model_file);
    const llmc::RunSettings run = llmc::read_run_settings(source.file);
    const std::string tokenizer_json =
        !o.tokenizer.empty() ? o.tokenizer : llmc::run_tokenizer_json(run);
    const std::unique_ptr<llmc::TextTokenizer> tokenizer =
        llmc::load_text_tokenizer(tokenizer_json, o.encoder, o.vocab);
    llmc::check_tokenizer_fits(*tokenizer, config.vocab_size, model_file);
    if (o.threads > 0) omp_set_num_threads(static_cast<int>(o.threads));
    llmc::ModelCpu model(config, llmc::ModelUse::inference);
    llmc::load_model_source(source, config, model.params());

    std::string prompt = o.prompt;
    if (o.prompt_file) {
        const std::vector<std::byte> bytes = llmc::read_whole_file(*o.prompt_file, size_t(64) << 20);  // 64 MiB
        prompt.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    // the run's end-of-sequence token when its config.json says (an OLMo run's 50279), else the tokenizer's
    LLMC_CHECK(run.eos_token_id || tokenizer->eos_token(),
               tokenizer->source() + ": names no end-of-text token, and " + model_file +
                   " has no run's config.json with eos_token_id");
    const int eos = run.eos_token_id ? *run.eos_token_id : *tokenizer->eos_token();
    LLMC_CHECK(eos >= 0 && eos < config.vocab_size, model_file + ": its run's eos_token_id " + std::to_string(eos) +
                                                        " is outside the vocabulary of " +
                                                        std::to_string(config.vocab_size));
    std::vector<int> prompt_tokens = {eos};
    tokenizer->encode(prompt, prompt_tokens);
    std::fprintf(stderr, "sample_gpt: %s (%s), prompt of %zu tokens after end-of-text\n", model_file.c_str(),
                 config.describe().c_str(), prompt_tokens.size() - 1);

    // The prompt runs once: each sample continues from its cached keys and values and a copy of its logits (unless
    // a sample outgrew max_seq_len, which leaves another window in the cache).
    const auto window_of = [&](const std::vector<int>& tokens) {
        return std::span<const int>(tokens).last(std::min(tokens.size(), static_cast<size_t>(config.max_seq_len)));
    };
    const std::span<const float> first_logits = model.start_sequence(window_of(prompt_tokens));
    const std::vector<float> prompt_logits(first_logits.begin(), first_logits.end());
    LLMC_CHECK(llmc::count_non_finite(std::span(prompt_logits).first(config.vocab_size)) == 0,
               model_file + ": the forward pass gives NaN or inf logits (the weights, or a diverged run's model)");
    const int prompt_window = model.sequence_length();
    bool cache_holds_prompt = true;

    llmc::Rng rng(static_cast<uint64_t>(o.seed));
    const auto start = std::chrono::steady_clock::now();
    long long generated = 0;
    std::vector<int> context;
    for (long long sample = 0; sample < o.num_samples; sample++) {
        if (!o.json) {
            if (o.num_samples > 1) std::printf("%s--- sample %lld ---\n", sample > 0 ? "\n" : "", sample + 1);
            std::fwrite(prompt.data(), 1, prompt.size(), stdout);
            std::fflush(stdout);
        }
        context = prompt_tokens;
        if (!cache_holds_prompt) model.start_sequence(window_of(prompt_tokens));
        model.truncate_sequence(prompt_window);
        cache_holds_prompt = true;
        std::vector<int> tokens;
        for (long long i = 0; i < o.tokens; i++) {
            std::span<const float> logits = prompt_logits;
            if (i > 0) {
                cache_holds_prompt = cache_holds_prompt && model.sequence_length() < config.max_seq_len;
                logits = model.continue_sequence(context, config.max_seq_len);
            }
            const int next = llmc::sample_token(logits, config.vocab_size, rng, o.sampling);
            context.push_back(next);
            tokens.push_back(next);
            generated++;
            if (!o.json && tokenizer->is_assigned(next)) {  // a model's ids the tokenizer lacks print nothing
                const std::string& bytes = tokenizer->token_bytes(next);
                std::fwrite(bytes.data(), 1, bytes.size(), stdout);
                std::fflush(stdout);
            }
            if (o.stop_at_eot && next == eos) break;
        }
        if (o.json) {
            const nlohmann::json line = {{"sample", sample + 1},
                                         {"prompt_tokens", std::vector<int>(prompt_tokens.begin() + 1,
                                                                            prompt_tokens.end())},
                                         {"tokens", tokens},
                                         {"text", decode_known(*tokenizer, tokens)}};
            // a sample may end inside a UTF-8 sequence that its next token would have finished
            std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        }
    }
    if (!o.json) std::printf("\n");
    std::fflush(stdout);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "sample_gpt: %lld tokens in %.2f s (%.1f tokens/s, %d threads)\n", generated, seconds,
                 seconds > 0 ? generated / seconds : 0.0, omp_get_max_threads());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse_args(n, args)); });
}
