// The start of a run that both trainers share: the batch geometry, the ranks' agreement on the config (then the
// transports' comm options), the data a run reads, the banner's batch line, and the run record next to the metrics.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/comm/transport.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/multiple_choice.h"
#include "llmc/data/tokenizer.h"
#include "llmc/run/config.h"

namespace llmc {

// Resolves total_batch_size (0 -> B*T*world) and returns the gradient-accumulation steps; throws naming
// total_batch_size as cfg.sources does when it is not a multiple of batch_size*seq_len*world.
int resolve_batch_geometry(TrainConfig& cfg, int world);

// Every rank must run the same configuration: compares each rank's resolved config with rank 0's and throws
// naming the first differing key. Resets the transport's counters afterwards.
void check_same_config_everywhere(Transport& transport, const std::string& config_json);

// check_same_config_everywhere on the resolved config, then the world transport takes the config's comm options.
// Returns the resolved config as compact JSON (what checkpoints record).
std::string agree_on_config(const TrainConfig& cfg, Transport& world);

// What a run reads besides its weights: this rank's training stream, the validation stream (null without
// --val_data or with --val_batches 0), the tokenizer's decoder on the rank that prints samples (rank 0 with
// --sample_every > 0; null elsewhere) and the --choices examples (every rank). Opening them validates every shard
// header, the tokenizer file and the examples (each must fit rows of seq_len + 1 tokens), and reads the validation
// batches once (every validation reads the same ones), so a bad token id there stops the run before it trains.
// A --val_batches above the batches each rank's share of the validation shards holds is lowered to them, with a
// warning from rank 0: more would read the same windows again.
struct RunData {
    DataLoader train;
    std::unique_ptr<DataLoader> val;
    int val_batches = 0;  // per rank, each validation
    std::unique_ptr<TokenizerDecoder> tokenizer;
    std::vector<ChoiceExample> choices;
};
RunData open_run_data(const TrainConfig& cfg, int rank, int world);

// The banner's batch line: "batch B x T tokens x W ranks x A accumulation = N tokens/step | ..." (train tokens
// and window groups per epoch); a trainer appends what it knows besides.
std::string batch_banner(const TrainConfig& cfg, int world, int grad_accum, const DataLoader& train);

// The resolved config plus "_run": code version, trainer, world size, accumulation, tokens per step, argv.
// Trainers add their own fields to record["_run"] before writing it to <out_dir>/config.json.
nlohmann::ordered_json run_record(const TrainConfig& cfg, int world, int grad_accum, const char* trainer, int argc,
                                  char** argv);
void write_run_record(const std::string& out_dir, const nlohmann::ordered_json& record);

}  // namespace llmc
