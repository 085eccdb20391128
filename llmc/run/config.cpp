// The schema of TrainConfig (see config.h): the run layer's keys, every part's keys bound in, and the checks.
#include "llmc/run/config.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "llmc/base/error.h"
#include "llmc/model/model_io.h"
#include "llmc/optim/optimizers.h"
#include "llmc/run/checkpoint.h"

namespace llmc {

namespace {

// Each part's options within TrainConfig, for Schema::add.
ModelConfig& model_part(TrainConfig& c) { return c.model; }
OptimizerConfig& optim_part(TrainConfig& c) { return c.optim; }
AdamWConfig& adamw_part(TrainConfig& c) { return c.optim.adamw; }
DemoConfig& demo_part(TrainConfig& c) { return c.optim.demo; }
DilocoConfig& diloco_part(TrainConfig& c) { return c.optim.diloco; }
SignumConfig& signum_part(TrainConfig& c) { return c.optim.signum; }
RandomkConfig& randomk_part(TrainConfig& c) { return c.optim.randomk; }
SparselocoConfig& sparseloco_part(TrainConfig& c) { return c.optim.sparseloco; }
PowerSgdConfig& powersgd_part(TrainConfig& c) { return c.optim.powersgd; }
CudaOptions& cuda_part(TrainConfig& c) { return c.cuda; }
CommOptions& comm_part(TrainConfig& c) { return c.comm; }

std::string optimizer_help() {
    std::string help = "the optimizer:";
    const auto& families = optimizer_families();
    for (size_t i = 0; i < families.size(); i++)
        help += std::string(i == 0 ? " " : i + 1 == families.size() ? " or " : ", ") + families[i].name + " (" +
                families[i].help + ")";
    return help;
}

Schema<TrainConfig> make_schema() {
    Schema<TrainConfig> schema;
    schema.add("model", model_part, model_config_keys());
    schema
        .add("data", std::vector<Key<TrainConfig>>{
            key("train_data", &TrainConfig::train_data,
                "train token files: a glob, or @FILE listing paths (llm.c shards or OLMo token files)").fixed(),
            key("val_data", &TrainConfig::val_data, "val token files, as train_data ('' disables validation)"),
            key("tokenizer", &TrainConfig::tokenizer, "tokenizer for samples: llm.c decode file, or a Hugging Face tokenizer.json"),
            key("shuffle", &TrainConfig::shuffle, "seeded shuffle of shard and batch order each epoch").fixed(),
            key("data_format", &TrainConfig::data_format,
                "token files: llmc (llm.c shards, windows of B*T+1), olmo (OLMo's raw memmap files, instances of T "
                "tokens), or auto (by the files: llm.c shards start with a magic number); a change of what is read "
                "is refused on resume",
                {{"auto", DataFormat::auto_detect}, {"llmc", DataFormat::llmc}, {"olmo", DataFormat::olmo}})
                .fixed(),
            key("memmap_dtype", &TrainConfig::memmap_dtype,
                "token ids' type in OLMo files (llm.c shards hold uint16); a change is refused on resume",
                {{"uint8", TokenDtype::uint8}, {"uint16", TokenDtype::uint16}, {"uint32", TokenDtype::uint32},
                 {"uint64", TokenDtype::uint64}})
                .fixed(),
            key("eos_token_id", &TrainConfig::eos_token_id,
                "end-of-sequence token, which starts every text sample (default: the --init_from model's run's, else by "
                "arch: gpt2 50256, olmo 50279)"),
            key("pad_token_id", &TrainConfig::pad_token_id,
                "padding token for padded positions (default: the --init_from model's run's, else by arch: gpt2 50256, "
                "olmo 1)"),
        })
        .add("batch", std::vector<Key<TrainConfig>>{
            key("batch_size", &TrainConfig::batch_size, "micro-batch sequences per rank (B)").fixed(),
            key("seq_len", &TrainConfig::seq_len, "tokens per sequence (T <= max_seq_len)").fixed(),
            key("total_batch_size", &TrainConfig::total_batch_size,
                "tokens per optimizer step over all ranks; a multiple of B*T*ranks (0 = B*T*ranks)").fixed(),
        })
        .add("schedule", std::vector<Key<TrainConfig>>{
            key("steps", &TrainConfig::steps, "optimizer steps"),
            key("lr", &TrainConfig::lr, "peak learning rate"),
            key("warmup_steps", &TrainConfig::warmup_steps, "linear warmup steps"),
            key("warmup_start_frac", &TrainConfig::warmup_start_frac, "warmup starts at this fraction of lr"),
            key("lr_schedule", &TrainConfig::lr_schedule,
                "after warmup: cosine or linear decay to the floor, wsd (lr, then a linear decay over the last "
                "lr_decay_frac of the steps) or constant",
                {"cosine", "linear", "wsd", "constant"}),
            key("final_lr_frac", &TrainConfig::final_lr_frac, "the decay ends at this fraction of lr (the floor)"),
            key("lr_decay_frac", &TrainConfig::lr_decay_frac, "wsd: the share of the steps that decay"),
        })
        .add("output", std::vector<Key<TrainConfig>>{
            key("val_every", &TrainConfig::val_every, "validation loss every N steps (0 = only at the end)"),
            key("val_batches", &TrainConfig::val_batches,
                "validation batches per rank (at most what each rank's share of the val shards holds)"),
            key("choices", &TrainConfig::choices,
                "llm.c eval file (*.bin: HellaSwag as llm.c's dev/data/hellaswag.py writes it) whose multiple-choice "
                "accuracy each validation also logs ('' = none; eval_gpt --choices scores checkpoints)"),
            key("choices_examples", &TrainConfig::choices_examples, "score the first N examples of --choices (0 = all)"),
            key("sample_every", &TrainConfig::sample_every, "print a text sample every N steps (0 = never)"),
            key("sample_tokens", &TrainConfig::sample_tokens, "tokens per sample"),
            key("out_dir", &TrainConfig::out_dir, "metrics.jsonl, config.json and checkpoints go here"),
            key("checkpoint_every", &TrainConfig::checkpoint_every, "checkpoint every N steps (0 = only at the end, -1 = never)"),
            key("weight_check_every", &TrainConfig::weight_check_every,
                "every N steps compare a hash of every rank's shared weights and stop with an error if any differ "
                "(0 = never)"),
            key("checkpoint_every_minutes", &TrainConfig::checkpoint_every_minutes,
                "also checkpoint at the first step that ends this many minutes after the last checkpoint or the start "
                "(0 = by steps only; nothing with --checkpoint_every -1)"),
            key("keep_checkpoints", &TrainConfig::keep_checkpoints, "complete checkpoints kept (0 = all)"),
            key("resume", &TrainConfig::resume, "'auto' (latest checkpoint in out_dir) or a checkpoint directory"),
            key("reset_momentum", &TrainConfig::reset_momentum,
                "on resume with another world size, start optimizer state afresh"),
            key("overwrite", &TrainConfig::overwrite,
                "delete out_dir's checkpoints of steps after this run's start (without it such a run stops)"),
            key("init_from", &TrainConfig::init_from,
                "model file to start from instead of a random init (with no model key given, its header sets the "
                "family and shape)"),
            key("seed", &TrainConfig::seed, "seed for init, shuffling and sampling").fixed(),
            key("threads", &TrainConfig::threads, "OpenMP threads per rank (0 = cores / ranks)"),
            key("virtual_ranks", &TrainConfig::virtual_ranks,
                "data-parallel ranks each process simulates, one thread each: P processes x V compute what P*V MPI "
                "ranks compute, bit for bit (train_gpt_cpu only; not with --shard_group_size)"),
            key("comm_timeout", &TrainConfig::comm_timeout,
                "seconds a collective may wait for the other ranks before this rank exits (0 = forever)"),
            key("time_limit_minutes", &TrainConfig::time_limit_minutes,
                "minutes of wall time since the start: the run stops at the last step that leaves time for its "
                "checkpoint, as on a stop signal (0 = no limit)"),
            key("log_every", &TrainConfig::log_every, "progress line every N steps"),
            key("peak_tflops", &TrainConfig::peak_tflops,
                "each rank's peak TFLOP/s, for MFU in the metrics (0: in train_gpt the GPU's dense bf16 peak if known, "
                "else no MFU)"),
            key("dry_run", &TrainConfig::dry_run, "print resolved config and traffic report, then exit"),
        })
        .add("optimizer", std::vector<Key<TrainConfig>>{
            key("optimizer", &TrainConfig::optimizer, optimizer_help().c_str(), optimizer_names()).fixed(),
        });
    schema.add("optimizer", optim_part, optimizer_config_keys())
        .add("optimizer", adamw_part, adamw_config_keys())
        .add("optimizer", demo_part, demo_config_keys())
        .add("optimizer", diloco_part, diloco_config_keys())
        .add("optimizer", signum_part, signum_config_keys())
        .add("optimizer", randomk_part, randomk_config_keys())
        .add("optimizer", sparseloco_part, sparseloco_config_keys())
        .add("optimizer", powersgd_part, powersgd_config_keys())
        .add("cuda", cuda_part, cuda_option_keys())
        .add("cuda", demo_part, demo_cuda_keys())
        .add("comm", comm_part, comm_option_keys());
    return schema;
}

}  // namespace

const Schema<TrainConfig>& train_config_schema() {
    static const Schema<TrainConfig> schema = make_schema();
    return schema;
}

std::vector<std::string> config_keys() { return train_config_schema().keys(); }

std::vector<std::string> fixed_on_resume_keys() {
    std::vector<std::string> keys;
    for (const auto& e : train_config_schema().entries())
        if (e.fixed_on_resume) keys.push_back(e.name);
    return keys;
}

void load_config_file(const std::string& path, TrainConfig& cfg) {
    train_config_schema().load_file(path, cfg, cfg.sources);
}

bool parse_command_line(int argc, const char* const* argv, TrainConfig& cfg, const std::string& program) {
    if (!train_config_schema().parse_command_line(argc, argv, cfg, cfg.sources, program)) return false;
    take_model_from_init_file(cfg);
    resolve_token_ids(cfg);
    validate_config(cfg);
    return true;
}

void take_model_from_init_file(TrainConfig& cfg) {
    if (cfg.init_from.empty() || !cfg.sources.list(model_config_key_names()).empty()) return;
    cfg.model = read_model_config(cfg.init_from);
    for (const std::string& key : model_config_key_names()) cfg.sources.set_by_file(key, cfg.init_from);
}

void resolve_token_ids(TrainConfig& cfg) {
    // --init_from a checkpoint's model: its run's tokens first (the model file does not record them)
    const RunSettings init = cfg.init_from.empty() ? RunSettings{} : read_run_settings(cfg.init_from);
    const bool olmo = cfg.model.is_olmo();
    const auto resolve = [&](const char* key, int& id, const std::optional<int>& from_init, int fallback) {
        if (!cfg.sources.origin(key).empty()) return;
        id = from_init.value_or(fallback);
        if (from_init) cfg.sources.set_by_file(key, init.record);
    };
    resolve("eos_token_id", cfg.eos_token_id, init.eos_token_id, olmo ? 50279 : 50256);
    resolve("pad_token_id", cfg.pad_token_id, init.pad_token_id, olmo ? 1 : 50256);
}

std::string config_to_json(const TrainConfig& cfg, int indent) { return train_config_schema().to_json(cfg).dump(indent); }

std::string help_text(const std::string& program) { return train_config_schema().help(program); }

void validate_config(const TrainConfig& c) {
    const ConfigSources& s = c.sources;
    // the shape checks relate several keys: they name every source that set one
    const std::string model_sources = s.list(model_config_key_names());
    validate_model_config(c.model, model_sources.empty() ? "model config" : "model config (" + model_sources + ")");
    const auto at_least = [&](const char* key, long long v, long long min, const std::string& note = "") {
        LLMC_CHECK(v >= min, s.name(key) + (min == 1 ? " must be > 0" : " must be >= " + std::to_string(min)) +
                                 " (got " + std::to_string(v) + (note.empty() ? "" : "; " + note) + ")");
    };
    const auto at_most = [&](const char* key, long long v, long long max, const std::string& note) {
        LLMC_CHECK(v <= max, s.name(key) + " must be <= " + std::to_string(max) + " (got " + std::to_string(v) + "; " +
                                 note + ")");
    };
    const auto in_unit_interval = [&](const char* key, float v) {
        LLMC_CHECK(v >= 0.0f && v <= 1.0f, s.name(key) + " must be in [0, 1] (got " + format_float(v) + ")");
    };
    at_least("batch_size", c.batch_size, 1);
    at_least("seq_len", c.seq_len, 1);
    at_least("steps", c.steps, 1);
    const std::string shape_file = s.file("max_seq_len");
    LLMC_CHECK(c.seq_len <= c.model.max_seq_len,
               s.name("seq_len") + " " + std::to_string(c.seq_len) + " exceeds max_seq_len " +
                   std::to_string(c.model.max_seq_len) + (shape_file.empty() ? "" : " (" + shape_file + ")"));
    at_least("total_batch_size", c.total_batch_size, 0);
    for (const auto& [key, id, what] : {std::tuple{"eos_token_id", c.eos_token_id, "end-of-text"},
                                        std::tuple{"pad_token_id", c.pad_token_id, "padding"}})
        LLMC_CHECK(id >= 0 && id < c.model.vocab_size,
                   s.name(key) + " " + std::to_string(id) +
                       (s.origin(key).empty() ? std::string(" (the default of arch ") + arch_name(c.model.arch) + ")"
                                              : std::string()) +
                       " is outside the vocabulary [0, " + std::to_string(c.model.vocab_size) + "): set it to the " +
                       "tokenizer's " + what + " token");
    LLMC_CHECK(c.lr > 0.0f, s.name("lr") + " must be > 0 (got " + format_float(c.lr) + ")");
    at_least("warmup_steps", c.warmup_steps, 0);
    in_unit_interval("final_lr_frac", c.final_lr_frac);
    in_unit_interval("warmup_start_frac", c.warmup_start_frac);
    in_unit_interval("lr_decay_frac", c.lr_decay_frac);
    at_least("val_every", c.val_every, 0);
    at_least("val_batches", c.val_batches, 0);
    at_least("choices_examples", c.choices_examples, 0);
    LLMC_CHECK(c.choices.empty() || c.choices.ends_with(".bin"),
               s.name("choices") + " '" + c.choices + "' is not an llm.c eval file (*.bin); eval_gpt --choices "
               "reads JSON Lines, and --write_eval_file makes one");
    at_least("sample_every", c.sample_every, 0);
    at_least("sample_tokens", c.sample_tokens, 0);
    at_most("sample_tokens", c.sample_tokens, kMaxSampleTokens, "sample_gpt's limit too");
    at_least("keep_checkpoints", c.keep_checkpoints, 0);
    at_least("threads", c.threads, 0);
    at_most("threads", c.threads, kMaxThreads, "OpenMP threads per rank");
    at_least("virtual_ranks", c.virtual_ranks, 1);
    at_most("virtual_ranks", c.virtual_ranks, kMaxVirtualRanks, "simulated ranks per process");
    LLMC_CHECK(c.virtual_ranks == 1 || c.optim.shard_group_size == 1,
               s.name("virtual_ranks") + " " + std::to_string(c.virtual_ranks) + " with " + s.name("shard_group_size") +
                   ": virtual ranks do not simulate groups of ranks yet (FlexDeMo, sharded steps); use "
                   "--shard_group_size 1 or real ranks");
    at_least("checkpoint_every", c.checkpoint_every, -1, "0: only at the end, -1: never");
    at_least("weight_check_every", c.weight_check_every, 0, "0: never");
    at_least("log_every", c.log_every, 1);
    LLMC_CHECK(c.comm_timeout >= 0.0f, s.name("comm_timeout") + " must be >= 0 (got " + format_float(c.comm_timeout) +
                                           "; seconds, 0 waits forever)");
    LLMC_CHECK(c.checkpoint_every_minutes >= 0.0f, s.name("checkpoint_every_minutes") + " must be >= 0 (got " +
                                                       format_float(c.checkpoint_every_minutes) + "; 0: by steps only)");
    LLMC_CHECK(c.time_limit_minutes >= 0.0f, s.name("time_limit_minutes") + " must be >= 0 (got " +
                                                 format_float(c.time_limit_minutes) + "; 0: no limit)");
    LLMC_CHECK(c.peak_tflops >= 0.0f, s.name("peak_tflops") + " must be >= 0 (got " + format_float(c.peak_tflops) +
                                          "; 0: looked up for a known GPU, else no MFU)");
    LLMC_CHECK(!c.out_dir.empty(), s.name("out_dir") + " must not be empty");
    // The optimizers' own checks (their constructors make them again, naming flags: they see no sources), here so
    // that a dry run makes them too and a bad value fails before any rank starts work: the chosen one's first, then
    // the others', since a key is refused whether or not this run reads it.
    optimizer_family(c.optimizer).validate(c.optim, s);
    for (const OptimizerFamily& f : optimizer_families())
        if (f.name != c.optimizer) f.validate(c.optim, s);
    validate_comm_options(c.comm, s);
}

LrSchedule TrainConfig::schedule() const {
    const LrShape shape = lr_schedule == "linear" ? LrShape::linear
                          : lr_schedule == "wsd"  ? LrShape::wsd
                          : lr_schedule == "constant" ? LrShape::constant
                                                      : LrShape::cosine;
    return {lr, warmup_steps, steps, warmup_start_frac, final_lr_frac, shape, lr_decay_frac};
}

}  // namespace llmc
