// The run's configuration (TrainConfig) and its schema, shared by both trainers: the run layer's own keys (data,
// batch, schedule, output) and the keys each part declares next to its code (the model's shape, the optimizers'
// options, the CUDA kernels' and the transports' switches), bound into one Schema (base/schema.h) from which JSON
// config files are read, flags parsed, `--help` printed and the resolved config written next to the metrics.
//
// Sources apply in command-line order after the defaults: each `--config FILE.json` (flat JSON object of schema
// keys; may be repeated, e.g. a model shape file then a run file) where it stands, and each flag, so a later
// source wins. validate_config then checks every range, naming the source that set the value last.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/base/limits.h"
#include "llmc/base/schema.h"
#include "llmc/comm/comm_options.h"
#include "llmc/cuda/cuda_options.h"
#include "llmc/data/token_files.h"
#include "llmc/model/model_config.h"
#include "llmc/optim/optimizer.h"
#include "llmc/optim/schedule.h"

namespace llmc {

struct TrainConfig {
    ModelConfig model;
    // data
    std::string train_data = "data/default/default_train_*.bin";
    std::string val_data = "data/default/default_val_*.bin";
    std::string tokenizer = "data/default/tokenizer.bin";
    bool shuffle = true;
    DataFormat data_format = DataFormat::auto_detect;  // of train_data and val_data (auto: each set by its files)
    TokenDtype memmap_dtype = TokenDtype::uint16;       // of OLMo token files
    // The end-of-sequence token (starts every text sample) and the padding token (fills padded positions). No
    // source setting them: the family's (resolve_token_ids).
    int eos_token_id = 50256;
    int pad_token_id = 50256;
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
    // optimizer: which one, and every optimizer's options (each declares its own keys)
    std::string optimizer = "adamw";
    OptimizerConfig optim = [] {
        OptimizerConfig o;
        o.weight_decay = 0.1f;
        return o;
    }();
    // switches of the CUDA kernels and of the transports
    CudaOptions cuda;
    CommOptions comm;
    // evaluation and output
    int val_every = 25;
    int val_batches = 8;
    std::string choices;                 // llm.c eval file (HellaSwag) scored at each validation ("" = none)
    int choices_examples = 0;            // its first N examples (0 = all)
    int sample_every = 0;
    int sample_tokens = 48;
    std::string out_dir = "out";
    int checkpoint_every = 0;
    int weight_check_every = 0;  // compare every rank's shared weights every N steps (0: never)
    float checkpoint_every_minutes = 0.0f;  // also one when this much wall time has passed since the last (0 = off)
    int keep_checkpoints = 2;
    std::string resume;                  // "", "auto" (latest in out_dir) or a checkpoint directory
    bool reset_momentum = false;         // allow resuming with another world size by resetting optimizer state
    bool overwrite = false;              // a run may delete out_dir's checkpoints of steps after its start
    std::string init_from;               // model file to start from instead of random init
    int64_t seed = 1337;
    int threads = 0;                     // OpenMP threads per rank; 0 = cores / ranks on this host
    int virtual_ranks = 1;               // data-parallel ranks each process simulates (transport_virtual.h)
    float comm_timeout = 1800.0f;        // seconds a collective may wait for the other ranks (0 = forever)
    float time_limit_minutes = 0.0f;     // stop at a step, with a checkpoint, before this much wall time (0 = none)
    int log_every = 1;
    float peak_tflops = 0.0f;            // each device's peak TFLOP/s for MFU; 0 = the GPU's from a table, else none
    bool dry_run = false;                // print the resolved config and traffic report, then exit

    ConfigSources sources;               // where each key's value came from (for messages; not a key itself)

    LrSchedule schedule() const;
};

// The schema of TrainConfig: every part's keys, grouped for --help.
const Schema<TrainConfig>& train_config_schema();

// Parses argv (without argv[0]). Returns false when --help was given (help already printed to stdout).
// `program` names the binary in the usage text.
bool parse_command_line(int argc, const char* const* argv, TrainConfig& config, const std::string& program);
void load_config_file(const std::string& path, TrainConfig& config);
// With --init_from FILE and no model key given, the model's family and shape are FILE's header's (its keys'
// source is FILE). Part of parse_command_line.
void take_model_from_init_file(TrainConfig& config);
// eos_token_id and pad_token_id that no source set take those of the --init_from model's run (its config.json, when
// found), else the family's defaults: gpt2 50256 and 50256 (GPT-2's <|endoftext|>), olmo 50279 and 1 (the DeMo
// paper's OLMo configs). Part of parse_command_line.
void resolve_token_ids(TrainConfig& config);
// Checks every key's range and the cross-key constraints that do not depend on the world size (seq_len <=
// max_seq_len, the chosen optimizer's options...), naming each key as config.sources does.
void validate_config(const TrainConfig& config);
std::string config_to_json(const TrainConfig& config, int indent = 2);
std::string help_text(const std::string& program);
// The schema's key names (tests check that help and parser cover the same set).
std::vector<std::string> config_keys();
// The keys a resumed run must keep (the model's shape, the batch and data order, the optimizer's state layout).
std::vector<std::string> fixed_on_resume_keys();

}  // namespace llmc
