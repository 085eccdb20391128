// Checkpoint directories: <out_dir>/checkpoints/step_00000100/ holds model.bin (llm.c fp32 model file, loadable
// by llm.c), state_rank<r>.bin for every rank (step, data position, RNG, the run's resolved config and that
// rank's optimizer state: DeMo momentum differs per rank) and COMPLETE, a marker rank 0 writes last, after
// every rank's files are in place. Every file is written atomically; a directory without COMPLETE is ignored
// by --resume auto and refused by an explicit --resume.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llmc/dataloader.h"

namespace llmc {

struct TrainingState {
    int64_t step = 0;  // completed optimizer steps
    int world_size = 1;
    int rank = 0;
    DataPosition data;
    std::array<uint64_t, 4> sample_rng{};
    int64_t tokens = 0;
    int64_t cumulative_bytes_sent = 0;
    std::string config_json;                 // the run's resolved config, to check a resume against
    std::vector<std::byte> optimizer_state;  // Optimizer::save_state blob
};

struct CheckpointInfo {
    std::string dir;
    int64_t step = 0;
    int world_size = 0;
    std::string optimizer;
};

std::string checkpoint_dir(const std::string& out_dir, int64_t step);
std::string state_path(const std::string& dir, int rank);
std::string model_path(const std::string& dir);

void write_training_state(const std::string& path, const TrainingState& state);
TrainingState read_training_state(const std::string& path);

void mark_checkpoint_complete(const CheckpointInfo& info);
// Reads <dir>/COMPLETE; throws "<dir>: incomplete checkpoint..." when it is missing or malformed.
CheckpointInfo read_checkpoint_info(const std::string& dir);
// The complete checkpoint with the highest step under <out_dir>/checkpoints, if any.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& out_dir);
// Deletes all but the newest `keep` complete checkpoints (keep == 0 keeps everything).
void prune_checkpoints(const std::string& out_dir, int keep);

// Compares the keys of the checkpointed config that must not change across a resume (model shape, batch
// geometry, optimizer, seed, data). Throws naming the first differing key, e.g.
// "<path>: --batch_size is 8 here but 4 in the checkpoint".
// `may_differ` lists keys exempted (a resume with another world size changes the resolved total_batch_size).
void check_resume_compatible(const std::string& path, const std::string& saved_config_json,
                             const std::string& current_config_json,
                             const std::vector<std::string>& may_differ = {});

}  // namespace llmc
