// Where a run starts (a checkpoint, an llm.c model file, or a fresh init) and the checkpoints it writes, the same in
// both trainers.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "llmc/base/dir_lock.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/comm/transport.h"
#include "llmc/data/dataloader.h"
#include "llmc/run/checkpoint.h"
#include "llmc/run/config.h"

namespace llmc {

// Where a run starts, from --resume / --init_from (the CPU and the CUDA trainer alike):
//  - a checkpoint written by as many ranks: weights, step, tokens, bytes sent, data position and sampling
//    RNG are restored and `load_optimizer_state` gets this rank's optimizer blob;
//  - a checkpoint of another world size: its optimizer state redistributed (reshard_state, below), or with
//    --reset_momentum (or an optimizer without reshard_state) a fresh optimizer state; either way the weights,
//    step, tokens, rank 0's sampling RNG and byte count carry over and the data position is re-sliced; refused
//    when neither applies;
//  - --init_from: weights from an llm.c model file; otherwise nothing is loaded (a fresh run: the caller
//    draws the seeded init).
// Rank 0 first takes out_dir's lock (DirectoryLock: a second run on it stops, naming the holder). Each rank checks
// the checkpoint files it reads against the marker's sizes and checksums first; with --resume auto a checkpoint
// that fails them on any rank is set aside (step_N.corrupt) and the newest intact one resumes the run. The ranks
// then meet, so rank 0 reports the resume, and --overwrite deletes later checkpoints, only when every rank
// has loaded its files (a rank that failed has ended the job).
// `weights` receives the fp32 parameters when something was loaded. Returns the checkpoint resumed from.
struct RunStart {
    std::optional<CheckpointInfo> checkpoint;
    bool weights_loaded = false;
    std::unique_ptr<DirectoryLock> out_dir_lock;  // rank 0's, held as long as the RunStart lives
};
// `reshard_state` (OptimizerFamily::reshard_state; null: the trainer or optimizer has none) accepts a checkpoint of
// another world size without --reset_momentum (elastic resume): the weights, step, tokens, rank 0's sampling RNG and
// byte count carry over, the data position is re-sliced (DataLoader::reslice) and this rank's optimizer state is
// built from the old ranks' state files (each checked against the marker). `reshard_elsewhere`: the refusal says the
// optimizer's state can be redistributed by the other trainer. `tokens_per_micro` is no longer used (the position is
// re-sliced from the saved one, not recomputed from the token count).
using ReshardState = std::string (*)(int old_world, int new_rank, int new_world,
                                     const std::function<ByteReader(int)>& old_blob, ByteWriter& out);
RunStart resolve_run_start(const TrainConfig& cfg, const std::string& config_json, int64_t tokens_per_micro,
                           Transport& transport, std::span<float> weights, DataLoader& train_loader, Rng& sample_rng,
                           TrainingState& state, const std::function<void(ByteReader&)>& load_optimizer_state,
                           ReshardState reshard_state = nullptr, bool reshard_elsewhere = false);

// Writes checkpoint <out_dir>/checkpoints/step_N: rank 0 writes model.bin from `weights` (fp32; other ranks
// may pass an empty span), every rank its state file with the optimizer blob from `save_optimizer_state`,
// and rank 0 the COMPLETE marker once every rank's files are in place; then older checkpoints are pruned.
void save_checkpoint(const TrainConfig& cfg, Transport& transport, std::span<const float> weights,
                     const std::function<void(ByteWriter&)>& save_optimizer_state, TrainingState state);

}  // namespace llmc
