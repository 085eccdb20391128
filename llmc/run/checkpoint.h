// Checkpoint directories: <out_dir>/checkpoints/step_00000100/ holds model.bin (llm.c fp32 model file, loadable
// by llm.c), state_rank<r>.bin for every rank (step, data position, RNG, the run's resolved config, the training
// shards' fingerprint and that rank's optimizer state: DeMo momentum differs per rank) and COMPLETE, a marker rank
// 0 writes last, after every rank's files are in place, and removes first when it saves over a checkpoint of the
// same step. The marker records each file's size and XXH64 (checksum.h), checked before a resume reads the file,
// so a corrupt or swapped file stops the resume instead of training on (--resume auto falls back to the newest
// intact checkpoint). Every file is written atomically and the directories are synced after each rename, so the
// marker survives a power loss once written; a directory without COMPLETE is ignored by --resume auto (and
// deleted once a newer checkpoint is complete) and refused by an explicit --resume. A state file must agree with
// its marker (step, world size) and its name (rank), or the resume stops naming it.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llmc/base/checksum.h"
#include "llmc/base/error.h"
#include "llmc/data/dataloader.h"
#include "llmc/model/param_layout.h"
#include "llmc/base/host_memory.h"

namespace llmc {

// A checkpoint file that is missing, truncated or fails its checksum: --resume auto falls back to an older
// checkpoint on it (any other error stops the resume). what() is "<problem>; <advice>"; the fallback's warning
// says the problem alone, since it does something else than the advice.
struct CorruptCheckpointFile : Error {
    explicit CorruptCheckpointFile(const std::string& problem, const std::string& advice = "")
        : Error(advice.empty() ? problem : problem + "; " + advice), problem(problem) {}
    std::string problem;
};

struct TrainingState {
    int64_t step = 0;  // completed optimizer steps
    int world_size = 1;
    int rank = 0;
    DataPosition data;
    std::array<uint64_t, 4> sample_rng{};
    int64_t tokens = 0;
    int64_t cumulative_bytes_sent = 0;
    DataFingerprint train_data;              // all zero in version-1 files (not checked then)
    std::string config_json;                 // the run's resolved config, to check a resume against
    LargeVector<std::byte> optimizer_state;  // Optimizer::save_state blob
};

struct CheckpointInfo {
    std::string dir;
    int64_t step = 0;
    int world_size = 0;
    std::string optimizer;
    std::map<std::string, FileDigest> files;  // by file name; empty in markers written before checksums
};

std::string checkpoint_dir(const std::string& out_dir, int64_t step);
std::string state_path(const std::string& dir, int rank);
std::string model_path(const std::string& dir);
inline constexpr const char* kModelFileName = "model.bin";  // model_path's file, as the marker names it

FileDigest write_training_state(const std::string& path, const TrainingState& state);
// With `marker`, the bytes are checked against its checksum (verify_checkpoint_file) before they are parsed: the
// file is read once.
TrainingState read_training_state(const std::string& path, const CheckpointInfo* marker = nullptr);

void mark_checkpoint_complete(const CheckpointInfo& info);
// Removes <dir>/COMPLETE, durably, before a checkpoint of the same step is written over it: until the new marker,
// the directory is incomplete rather than a mix of two runs' files.
void unmark_checkpoint(const std::string& dir);
// Throws CorruptCheckpointFile "<path>: ..." unless the file `path` of checkpoint `ck` has the size and XXH64 its
// marker records (a marker from before checksums has none: nothing to check). `digest` gives the file's digest where the caller reads
// it anyway (default: digest_file).
void verify_checkpoint_file(const CheckpointInfo& ck, const std::string& path,
                            const std::function<FileDigest()>& digest = {});
// Reads <dir>/COMPLETE; throws "<dir>: ..." when dir is not a checkpoint directory or its marker is missing or
// malformed.
CheckpointInfo read_checkpoint_info(const std::string& dir);
// The complete checkpoint with the highest step under <out_dir>/checkpoints, if any. Directories whose marker is
// malformed or names another step than the directory's are not counted; `skipped` (if given) gets a line for each.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped = nullptr);
// Every complete checkpoint under <out_dir>/checkpoints, oldest first (the same rules as find_latest_checkpoint).
std::vector<CheckpointInfo> find_checkpoints(const std::string& out_dir, std::vector<std::string>* skipped = nullptr);
// Renames a checkpoint that failed its checks to <dir>.corrupt (kept for a post-mortem, ignored by every scan, never
// pruned) and returns the new name.
std::string set_aside_checkpoint(const std::string& dir);
// Deletes all but the newest `keep` complete checkpoints (keep == 0 keeps everything), and the incomplete
// directories (a run died while saving them) of steps below the newest complete one. A deletion removes the
// COMPLETE marker first, durably: a kill midway leaves an incomplete directory, never a complete-looking one
// without its files.
void prune_checkpoints(const std::string& out_dir, int keep);
// Deletes the step_* directories under <out_dir>/checkpoints of steps above `step` (--overwrite: a run that
// starts at `step` replaces them); returns how many.
int remove_checkpoints_after(const std::string& out_dir, int64_t step);
// Throws naming `path` unless the state read from it is the one its checkpoint's marker `ck` and its file name
// promise: the marker's step and world size (`rank`'s file when the world size is the same).
void check_state_matches_checkpoint(const std::string& path, const TrainingState& state, const CheckpointInfo& ck,
                                    int rank);

// Compares the keys of the checkpointed config that must not change across a resume (model shape, batch
// geometry, optimizer, seed, data). Throws naming the first differing key and where this run's value came from,
// `origin(key)` ("configs/x.json", "--batch-size"; "" for the default), e.g.
// "<path>: batch_size is 8 here (--batch-size) but 4 in the checkpoint (resume with the same value)".
// `may_differ` lists keys exempted (a resume with another world size changes the resolved total_batch_size).
void check_resume_compatible(const std::string& path, const std::string& saved_config_json,
                             const std::string& current_config_json,
                             const std::function<std::string(const std::string&)>& origin = {},
                             const std::vector<std::string>& may_differ = {});

// A model as the tools that read one (sample_gpt, eval_gpt) take it: an llm.c model file, a checkpoint directory
// (its model.bin), or a run's out_dir (its latest complete checkpoint); `checkpoint` is set when the file belongs to
// a complete checkpoint, whose marker has its checksum (a checkpoint directory without its marker gets a warning on
// stderr). Throws "<path>: ..." when it is none of these.
struct ModelSource {
    std::string file;
    std::optional<CheckpointInfo> checkpoint;
};
ModelSource resolve_model_source(const std::string& path);
// Loads the source's file into `params` (its header must describe `config`) and, for a checkpoint's file, checks
// the bytes read against the marker's size and XXH64.
void load_model_source(const ModelSource& source, const ModelConfig& config, std::span<float> params);

// What the tools that read a model (sample_gpt, eval_gpt) and --init_from take from the run that trained it, when
// they find its record: <out_dir>/config.json beside the checkpoints/ that hold the model file. Each is unset when
// there is no record or the record lacks the key (a run from before the key, a loose model file).
struct RunSettings {
    std::string record;  // the config.json read, or ""
    std::optional<int> eos_token_id, pad_token_id;
    std::optional<std::string> tokenizer;  // the run's --tokenizer (its decode file or tokenizer.json)
    std::optional<DataFormat> data_format;
    std::optional<TokenDtype> memmap_dtype;
};
// Throws "<record>: ..." for a record that is not JSON or holds a value of the wrong kind.
RunSettings read_run_settings(const std::string& model_file);
// The run's tokenizer when it is a Hugging Face tokenizer.json (which sample_gpt and eval_gpt then use), else "".
std::string run_tokenizer_json(const RunSettings& run);

}  // namespace llmc
