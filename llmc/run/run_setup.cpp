// The start of a run (see run_setup.h).
#include "llmc/run/run_setup.h"
#include <algorithm>
#include <cstdio>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/text_tokenizer.h"

#ifndef LLMC_GIT_VERSION
#define LLMC_GIT_VERSION "unknown"
#endif

namespace llmc {

int resolve_batch_geometry(TrainConfig& cfg, int world) {
    const int64_t tokens_per_micro = static_cast<int64_t>(cfg.batch_size) * cfg.seq_len * world;
    if (cfg.total_batch_size == 0) cfg.total_batch_size = tokens_per_micro;
    const std::string total = cfg.sources.name("total_batch_size") + " " + std::to_string(cfg.total_batch_size);
    LLMC_CHECK(cfg.total_batch_size % tokens_per_micro == 0,
               total + " is not a multiple of batch_size*seq_len*ranks = " + std::to_string(cfg.batch_size) + "*" +
                   std::to_string(cfg.seq_len) + "*" + std::to_string(world) + " = " + std::to_string(tokens_per_micro));
    const int64_t accumulation = cfg.total_batch_size / tokens_per_micro;
    LLMC_CHECK(accumulation <= INT32_MAX, total + " needs " + std::to_string(accumulation) +
                                              " micro-steps per step, more than " + std::to_string(INT32_MAX) +
                                              " (raise --batch_size or lower it)");
    return static_cast<int>(accumulation);
}

void check_same_config_everywhere(Transport& transport, const std::string& config_json) {
    std::vector<std::byte> all;
    std::vector<size_t> offsets;
    transport.allgather_bytes(std::as_bytes(std::span(config_json.data(), config_json.size())), all, offsets,
                              GatherSizes::exchange);
    const auto text_of = [&](int r) {
        return std::string(reinterpret_cast<const char*>(all.data()) + offsets[r], offsets[r + 1] - offsets[r]);
    };
    const auto reference = nlohmann::json::parse(text_of(0));
    for (int r = 1; r < transport.world_size(); r++) {
        const auto other = nlohmann::json::parse(text_of(r));
        for (const auto& [key, value] : reference.items())
            if (other[key] != value)
                fail("rank " + std::to_string(r) + " was started with --" + key + "=" + other[key].dump() +
                     " but rank 0 with " + value.dump() + " (every rank needs the same flags and config files)");
    }
    transport.reset_counters();
}
std::string agree_on_config(const TrainConfig& cfg, Transport& world) {
    const std::string config_json = config_to_json(cfg, -1);
    check_same_config_everywhere(world, config_json);
    world.configure(cfg.comm);
    return config_json;
}

// The decoder for samples: the llm.c decode file, or a tokenizer.json's bytes of each token (ids it leaves
// unassigned, and those past its vocabulary that a model may have, decode to nothing).
TokenizerDecoder load_sample_decoder(const TrainConfig& cfg) {
    if (!is_hf_tokenizer_file(cfg.tokenizer)) return TokenizerDecoder::load(cfg.tokenizer);
    const std::unique_ptr<TextTokenizer> tokenizer = load_hf_tokenizer(cfg.tokenizer);
    check_tokenizer_fits(*tokenizer, cfg.model.vocab_size, cfg.sources.name("vocab_size"));
    std::vector<std::string> bytes(static_cast<size_t>(cfg.model.vocab_size));
    for (int id = 0; id < tokenizer->vocab_size(); id++)
        if (tokenizer->is_assigned(id)) bytes[static_cast<size_t>(id)] = tokenizer->token_bytes(id);
    return TokenizerDecoder::from_token_bytes(cfg.tokenizer, bytes, cfg.eos_token_id);
}

RunData open_run_data(const TrainConfig& cfg, int rank, int world) {
    LLMC_CHECK(!cfg.train_data.empty(),
               cfg.sources.name("train_data") + " is empty (give a glob or @list of token files)");
    RunData data{DataLoader(cfg.train_data, cfg.batch_size, cfg.seq_len, rank, world, cfg.shuffle, cfg.seed,
                            cfg.model.vocab_size, cfg.data_format, cfg.memmap_dtype),
                 nullptr, 0, nullptr, {}};
    if (!cfg.val_data.empty() && cfg.val_batches > 0) {
        data.val = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, rank, world, false,
                                                cfg.seed, cfg.model.vocab_size, cfg.data_format, cfg.memmap_dtype);
        const uint64_t held = data.val->groups_per_epoch();  // batches per rank (the same on every rank)
        data.val_batches = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(cfg.val_batches), held));
        if (rank == 0 && data.val_batches < cfg.val_batches)
            std::fprintf(stderr, "warning: %s %d: %s holds %llu batches of %d x %d tokens per rank%s; each validation "
                         "reads those\n", cfg.sources.name("val_batches").c_str(), cfg.val_batches,
                         cfg.val_data.c_str(), static_cast<unsigned long long>(held), cfg.batch_size, cfg.seq_len,
                         world > 1 ? (" with " + std::to_string(world) + " ranks").c_str() : "");
        const size_t n = static_cast<size_t>(cfg.batch_size) * cfg.seq_len;
        std::vector<int> inputs(n), targets(n);
        for (int i = 0; i < data.val_batches; i++) data.val->next_batch(inputs, targets);  // their token ids checked
        data.val->reset();
    }
    if (cfg.sample_every > 0 && rank == 0) {
        data.tokenizer = std::make_unique<TokenizerDecoder>(load_sample_decoder(cfg));
        // checked now, not at the first sample: a sampled id may be any of the model's vocabulary
        LLMC_CHECK(data.tokenizer->size() >= static_cast<size_t>(cfg.model.vocab_size),
                   cfg.tokenizer + ": holds " + std::to_string(data.tokenizer->size()) + " tokens, fewer than the " +
                       std::to_string(cfg.model.vocab_size) + " of the model's vocabulary (another tokenizer?)");
    }
    if (!cfg.choices.empty()) {
        const size_t wanted = static_cast<size_t>(cfg.choices_examples);
        data.choices = read_choice_examples(cfg.choices, nullptr, cfg.model.vocab_size, wanted);
        LLMC_CHECK(wanted == 0 || data.choices.size() == wanted,
                   cfg.sources.name("choices_examples") + " " + std::to_string(wanted) + ": " + cfg.choices +
                       " holds only " + std::to_string(data.choices.size()) + " examples");
        check_choices_fit(data.choices, static_cast<size_t>(cfg.seq_len) + 1, cfg.choices);
    }
    return data;
}

std::string batch_banner(const TrainConfig& cfg, int world, int grad_accum, const DataLoader& train) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "batch %d x %d tokens x %d ranks x %d accumulation = %lld tokens/step | %llu train tokens, "
                  "%llu groups/epoch",
                  cfg.batch_size, cfg.seq_len, world, grad_accum, static_cast<long long>(cfg.total_batch_size),
                  static_cast<unsigned long long>(train.total_tokens()),
                  static_cast<unsigned long long>(train.groups_per_epoch()));
    return line;
}

nlohmann::ordered_json run_record(const TrainConfig& cfg, int world, int grad_accum, const char* trainer, int argc,
                                  char** argv) {
    nlohmann::ordered_json record = nlohmann::ordered_json::parse(config_to_json(cfg));
    nlohmann::ordered_json run;
    run["code_version"] = LLMC_GIT_VERSION;
    run["trainer"] = trainer;
    run["world_size"] = world;
    run["grad_accum_steps"] = grad_accum;
    run["tokens_per_step"] = static_cast<long long>(cfg.batch_size) * cfg.seq_len * world * grad_accum;
    run["argv"] = std::vector<std::string>(argv, argv + argc);
    record["_run"] = run;
    return record;
}

void write_run_record(const std::string& out_dir, const nlohmann::ordered_json& record) {
    const std::string text = record.dump(2) + "\n";
    write_file_atomic(out_dir + "/config.json", std::as_bytes(std::span(text.data(), text.size())));
}

}  // namespace llmc
