// The one run-configuration schema shared by both trainers and the tools: every key has a type, a default
// and a help line in a single table (config.cpp), from which JSON config files are read, command-line flags
// are parsed, `--help` is printed and the resolved config is written next to the metrics. So the help
// always matches the parser, and any config key can be overridden from the command line.
//
// Sources apply in command-line order after the defaults: each `--config FILE.json` (flat JSON object of schema
// keys; may be repeated, e.g. a model shape file then a run file) where it stands, and each flag, so a later
// source wins.
// Flags take `--key value` or `--key=value`; booleans also accept a bare `--key` (true). Numbers are plain
// decimals (integers: -?digits; floats also with a fraction and an exponent, e.g. 6e-4, .5): no blanks, no leading
// '+', no hex, inf or nan. Unknown keys, malformed values and out-of-range choices throw llmc::Error naming the
// flag or file and key; so do the range checks, which name the source that set the value last.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llmc/gpt2_layout.h"
#include "llmc/optimizer.h"
#include "llmc/schedule.h"

namespace llmc {

// Where each key's current value came from, so that a message about it names what the user wrote: the last
// source that set it (a JSON file, or a flag; a key no source set holds its default). The parser keeps it in
// TrainConfig::sources; the checks that see only an OptimizerConfig take it as an argument.
class ConfigSources {
public:
    void set_by_file(const std::string& key, const std::string& path) { set_by_[key] = {path, ""}; }
    // `typed`: the flag as the user spelled it ("--warmup-steps" for warmup_steps)
    void set_by_flag(const std::string& key, const std::string& typed) { set_by_[key] = {"", typed}; }
    // The file that set `key` last; "" when a flag did or nothing did.
    std::string file(const std::string& key) const;
    // How a message names `key`: "configs/x.json: key 'lr'" when a file set it last, else the flag as typed
    // ("--lr" when nothing set it).
    std::string name(const std::string& key) const;
    // Where `key`'s value came from: the file or the flag as typed that set it last; "" for the default.
    std::string origin(const std::string& key) const;
    // The sources of `keys` that some source set, each once in first-seen order ("configs/tiny.json, --num_heads"),
    // for a check that relates them; "" when all hold their defaults.
    std::string list(const std::vector<std::string>& keys) const;

private:
    struct Source {
        std::string file;  // the config file that set the key last, or "" for a flag
        std::string flag;  // the flag that did, as typed
    };
    std::map<std::string, Source> set_by_;
};

// A float as a message shows it, recognisably what the user typed: the shortest text that reads back as the same
// float, its exponent unpadded (-1e-9 and -0, where std::to_string prints -0.000000 for both).
std::string format_float(float v);

// Limits the trainers' --threads and --sample_tokens share with sample_gpt's and eval_gpt's flags.
inline constexpr long long kMaxThreads = 4096, kMaxSampleTokens = 1'000'000;

struct TrainConfig {
    ModelConfig model;
    // data
    std::string train_data = "data/default/default_train_*.bin";
    std::string val_data = "data/default/default_val_*.bin";
    std::string tokenizer = "data/default/tokenizer.bin";
    bool shuffle = true;
    // batch
    int batch_size = 4;             // micro-batch sequences per rank
    int seq_len = 64;               // tokens per sequence (<= max_seq_len)
    int64_t total_batch_size = 0;   // tokens per optimizer step over all ranks; 0 = batch_size*seq_len*world
    // schedule
    int steps = 100;
    float lr = 6e-4f;
    int warmup_steps = 10;
    float warmup_start_frac = 0.0f;  // warmup rises linearly from warmup_start_frac * lr
    std::string lr_schedule = "cosine";  // cosine | linear | wsd | constant (schedule.h)
    float final_lr_frac = 0.1f;      // the decay ends at final_lr_frac * lr at the last step
    float lr_decay_frac = 0.2f;      // wsd: the share of the steps that decay
    // optimizer
    std::string optimizer = "adamw";     // adamw | demo
    float weight_decay = 0.1f;
    std::string decay_groups = "2d";     // 2d | all
    float grad_clip = 1.0f;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    std::string grad_wire = "fp32";      // fp32 | bf16 (AdamW-DDP all-reduce precision)
    float demo_decay = 0.999f;
    int demo_topk = 32;
    int demo_chunk = 64;
    std::string demo_momentum = "lr";    // lr | ema
    float demo_alpha = 1.0f;
    std::string demo_values = "fp32";    // fp32 | bf16 | sign
    std::string demo_indices = "auto";   // auto | packed12
    int demo_delay = 0;                  // 0 | 1 (apply each step's DeMo update one step later)
    bool demo_eager = true;              // with demo_delay 1: this rank's share of the update at once
    // evaluation and output
    int val_every = 25;
    int val_batches = 8;
    std::string choices;                 // llm.c eval file (HellaSwag) scored at each validation ("" = none)
    int choices_examples = 0;            // its first N examples (0 = all)
    int sample_every = 0;
    int sample_tokens = 48;
    std::string out_dir = "out";
    int checkpoint_every = 0;
    float checkpoint_every_minutes = 0.0f;  // also one when this much wall time has passed since the last (0 = off)
    int keep_checkpoints = 2;
    std::string resume;                  // "", "auto" (latest in out_dir) or a checkpoint directory
    bool reset_momentum = false;         // allow resuming with another world size by resetting optimizer state
    bool overwrite = false;              // a run may delete out_dir's checkpoints of steps after its start
    std::string init_from;               // llm.c model file to start from instead of random init
    int64_t seed = 1337;
    int threads = 0;                     // OpenMP threads per rank; 0 = cores / ranks on this host
    float comm_timeout = 1800.0f;        // seconds a collective may wait for the other ranks (0 = forever)
    float time_limit_minutes = 0.0f;     // stop at a step, with a checkpoint, before this much wall time (0 = none)
    int log_every = 1;
    float peak_tflops = 0.0f;            // each device's peak TFLOP/s for MFU; 0 = the GPU's from a table, else none
    bool dry_run = false;                // print the resolved config and traffic report, then exit

    ConfigSources sources;               // where each key's value came from (for messages; not a key itself)

    OptimizerConfig optimizer_config() const;
    LrSchedule schedule() const;
};

// Parses argv (without argv[0]). Returns false when --help was given (help already printed to stdout).
// `program` names the binary in the usage text.
bool parse_command_line(int argc, const char* const* argv, TrainConfig& config, const std::string& program);
void load_config_file(const std::string& path, TrainConfig& config);
// Checks every key's range and the cross-key constraints that do not depend on the world size (seq_len <=
// max_seq_len, the chosen optimizer's options...), naming each key as config.sources does.
void validate_config(const TrainConfig& config);
std::string config_to_json(const TrainConfig& config, int indent = 2);
std::string help_text(const std::string& program);
// The schema's key names (tests check that help and parser cover the same set).
std::vector<std::string> config_keys();

}  // namespace llmc
