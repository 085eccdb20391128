// Resuming and saving checkpoints (see run_checkpoints.h).
#include "llmc/run/run_checkpoints.h"
#include <array>
#include <map>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/base/dir_lock.h"
#include "llmc/base/error.h"
#include "llmc/model/model_io.h"
#include "llmc/run/metrics.h"

namespace llmc {

namespace {
// A checkpoint's model.bin, checked against its marker as it loads: one read of what can be gigabytes, by every
// rank. A file that does not load and also fails its checksum is reported as corrupt, the likelier story.
void load_checkpoint_model(const CheckpointInfo& ck, const ModelConfig& model, std::span<float> weights) {
    const std::string path = model_path(ck.dir);
    FileDigest digest;
    try {
        load_model(path, model, weights, &digest);
    } catch (const Error&) {
        verify_checkpoint_file(ck, path);
        throw;
    }
    verify_checkpoint_file(ck, path, [&] { return digest; });
}
}  // namespace

namespace {
// The first rank's error ("" where that rank had none), on every rank: the ranks stop, or go on, together.
std::string first_error(Transport& transport, const std::string& mine) {
    if (transport.world_size() == 1) return mine;
    std::vector<std::byte> all;
    std::vector<size_t> offsets;
    transport.allgather_bytes(std::as_bytes(std::span(mine.data(), mine.size())), all, offsets, GatherSizes::exchange);
    for (size_t r = 0; r + 1 < offsets.size(); r++)
        if (offsets[r + 1] > offsets[r])
            return std::string(reinterpret_cast<const char*>(all.data() + offsets[r]), offsets[r + 1] - offsets[r]);
    return "";
}

// This rank's state file and the model of checkpoint `ck`, read and checked against the marker and this run.
// Returns the saved state; the weights are in `weights`.
TrainingState read_checkpoint(const CheckpointInfo& ck, const TrainConfig& cfg, const std::string& config_json,
                              int rank, int world, const DataFingerprint& train_data, std::span<float> weights,
                              bool elastic, bool elastic_unsupported_here) {
    LLMC_CHECK(ck.step <= cfg.steps, ck.dir + ": the checkpoint is at step " + std::to_string(ck.step) +
                                         ", past --steps " + std::to_string(cfg.steps) +
                                         " (raise --steps to continue the run)");
    const bool same_world = ck.world_size == world;
    if (!same_world && !cfg.reset_momentum && !elastic)
        fail(ck.dir + ": checkpoint was written by " + std::to_string(ck.world_size) + " ranks but this run has " +
             std::to_string(world) + " and its optimizer state (" + cfg.optimizer +
             (elastic_unsupported_here ? ", on this trainer" : "") +
             ") cannot be redistributed; resume with the same number of ranks, or pass --reset_momentum to keep "
             "the weights and step and start the optimizer state afresh");
    // with another world size every rank reads rank 0's state: the step, the tokens and the config
    const std::string path = state_path(ck.dir, same_world ? rank : 0);
    TrainingState saved = read_training_state(path, &ck);
    check_state_matches_checkpoint(path, saved, ck, same_world ? rank : 0);
    // data_format and memmap_dtype are fixed only where they change what is read: the fingerprint covers the format
    // and dtype of OLMo files, so with the same fingerprint (auto resolved the same, or llm.c shards, which ignore
    // the dtype) they may differ
    const DataFingerprint& was = saved.train_data;
    std::vector<std::string> may_differ;
    if (!same_world) may_differ.push_back("total_batch_size");
    if (was.shards != 0 && was == train_data) may_differ.insert(may_differ.end(), {"data_format", "memmap_dtype"});
    check_resume_compatible(path, saved.config_json, config_json,
                            [&](const std::string& key) { return cfg.sources.origin(key); }, may_differ);
    if (was.shards != 0 && !(was == train_data)) {
        auto files = [](const DataFingerprint& f) {
            return std::to_string(f.shards) + " files of " + std::to_string(f.tokens) + " tokens";
        };
        fail(path + ": the training shards are not the checkpoint's (" +
             (was.shards == train_data.shards && was.tokens == train_data.tokens
                  ? files(train_data) + " then and now, but other names, sizes or data format"
                  : files(was) + " then, " + files(train_data) + " now") +
             "); resume on the same files");
    }
    load_checkpoint_model(ck, cfg.model, weights);
    return saved;
}

// Where --resume points: the checkpoint every rank read intact, with this rank's saved state. --resume auto tries
// the complete checkpoints newest first: one whose files are missing or fail their checksums on any rank is set
// aside (step_N.corrupt) with a warning and the next older one is tried. Any other problem stops every rank.
std::optional<std::pair<CheckpointInfo, TrainingState>> choose_checkpoint(
    const TrainConfig& cfg, const std::string& config_json, Transport& transport, const DataFingerprint& train_data,
    std::span<float> weights, std::optional<CheckpointInfo>& latest, bool elastic, bool elastic_unsupported_here) {
    const int rank = transport.rank(), world = transport.world_size();
    std::vector<std::string> skipped;
    const std::vector<CheckpointInfo> complete = find_checkpoints(cfg.out_dir, &skipped);
    if (rank == 0)
        for (const std::string& line : skipped) std::fprintf(stderr, "warning: %s\n", line.c_str());
    if (!complete.empty()) latest = complete.back();
    std::vector<CheckpointInfo> candidates;
    if (cfg.resume == "auto") candidates.assign(complete.rbegin(), complete.rend());
    else if (!cfg.resume.empty()) candidates.push_back(read_checkpoint_info(cfg.resume));
    std::string first_corrupt;
    const bool fall_back = cfg.resume == "auto";
    for (size_t i = 0; i < candidates.size(); i++) {
        const CheckpointInfo& ck = candidates[i];
        std::string error;  // 'C' + message: a corrupt file, which --resume auto survives; 'E' + message: not
        TrainingState saved;
        try {
            saved = read_checkpoint(ck, cfg, config_json, rank, world, train_data, weights, elastic,
                                    elastic_unsupported_here);
        } catch (const CorruptCheckpointFile& e) {
            error = "C" + (fall_back ? e.problem : std::string(e.what()));
        } catch (const Error& e) {
            error = std::string("E") + e.what();
        }
        error = first_error(transport, error);
        if (error.empty()) return std::make_pair(ck, std::move(saved));
        if (error[0] == 'E' || !fall_back) fail(error.substr(1));
        const std::string problem = error.substr(1);
        if (first_corrupt.empty()) first_corrupt = problem;
        // every rank is done reading it before rank 0 moves it
        if (rank == 0)
            std::fprintf(stderr, "warning: %s; set aside as %s, trying an older checkpoint\n", problem.c_str(),
                         set_aside_checkpoint(ck.dir).c_str());
        transport.barrier();
        latest.reset();
        if (i + 1 < candidates.size()) latest = candidates[i + 1];  // the newest complete checkpoint left
    }
    if (!first_corrupt.empty())
        fail(cfg.out_dir + "/checkpoints: no intact checkpoint to resume (the newest: " + first_corrupt + ")");
    return std::nullopt;
}

// config.json of an earlier run in out_dir that wrote metrics but no checkpoint: the same run, killed before its
// first checkpoint and requeued, when it was to write checkpoints and every key that a resume must keep has the
// same value (a run with --checkpoint_every -1 had none to wait for: its metrics are all there is of it).
bool same_run_record(const std::string& out_dir, const std::string& config_json) {
    const std::string record = out_dir + "/config.json";
    if (!file_exists(record)) return false;
    try {
        const std::vector<std::byte> bytes = read_whole_file(record, 1 << 24);
        const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        const nlohmann::json recorded = nlohmann::json::parse(text, nullptr, false);
        if (!recorded.is_object() || !recorded.contains("checkpoint_every") ||
            !recorded["checkpoint_every"].is_number_integer() || recorded["checkpoint_every"].get<int64_t>() < 0)
            return false;
        check_resume_compatible(record, text, config_json);
        return true;
    } catch (const Error&) {
        return false;
    }
}
}  // namespace

RunStart resolve_run_start(const TrainConfig& cfg, const std::string& config_json, int64_t tokens_per_micro,
                           Transport& transport, std::span<float> weights, DataLoader& train_loader, Rng& sample_rng,
                           TrainingState& state, const std::function<void(ByteReader&)>& load_optimizer_state,
                           ReshardState reshard_state, bool reshard_elsewhere) {
    (void)tokens_per_micro;  // the data position is re-sliced from the saved one (DataLoader::reslice)
    RunStart start;
    std::string resumed;  // rank 0 prints it once every rank has loaded its files
    const int rank = transport.rank(), world = transport.world_size();
    const bool main_rank = rank == 0;
    // out_dir belongs to this run until it ends: taken before anything in it is read
    std::string locked;
    if (main_rank) try {
            start.out_dir_lock = std::make_unique<DirectoryLock>(cfg.out_dir);
        } catch (const Error& e) {
            locked = e.what();
        }
    locked = first_error(transport, locked);
    if (!locked.empty()) fail(locked);
    const std::string checkpoints = cfg.out_dir + "/checkpoints";
    LLMC_CHECK(cfg.checkpoint_every < 0 || !file_exists(checkpoints) || is_directory(checkpoints),
               checkpoints + ": not a directory, so no checkpoint could be saved (move it away)");
    state.train_data = train_loader.fingerprint();
    std::optional<CheckpointInfo> latest;
    std::optional<std::pair<CheckpointInfo, TrainingState>> chosen =
        choose_checkpoint(cfg, config_json, transport, state.train_data, weights, latest,
                          reshard_state != nullptr && !cfg.reset_momentum, reshard_elsewhere);
    if (chosen) {
        start.checkpoint = chosen->first;
        const CheckpointInfo& ck = chosen->first;
        TrainingState& saved = chosen->second;
        const bool same_world = ck.world_size == world;
        const std::string path = state_path(ck.dir, same_world ? rank : 0);
        start.weights_loaded = true;
        state.step = saved.step;
        state.tokens = saved.tokens;
        // with another world size, rank 0's: its text samples and the logged byte count continue
        sample_rng.set_state(saved.sample_rng);
        state.cumulative_bytes_sent = saved.cumulative_bytes_sent;
        if (!same_world) {
            // the same epoch and shard, after the windows every old rank consumed there (DataLoader::reslice)
            const DataLoader::Reslice reslice = train_loader.reslice(saved.data, ck.world_size);
            train_loader.set_position(reslice.position);
            const std::string sliced =
                "data re-sliced" + (reslice.skipped ? ", " + std::to_string(reslice.skipped) +
                                                          " window(s) skipped to a whole group of " +
                                                          std::to_string(world) + " ranks"
                                                    : std::string(""));
            const std::string changed = " (world size changed: " + std::to_string(ck.world_size) + " -> " +
                                        std::to_string(world) + " ranks; " + sliced + "; ";
            if (cfg.reset_momentum || !reshard_state) {
                resumed = "resumed weights from " + ck.dir + " (step " + std::to_string(state.step) +
                          ") with a fresh optimizer state" + changed + "--reset_momentum)";
            } else {
                // this rank's optimizer state from the old ranks' files the rule names, each checked as rank 0's
                std::map<int, TrainingState> old_states;
                old_states.emplace(0, std::move(saved));
                ByteWriter blob;
                std::string rule;
                std::string reading = state_path(ck.dir, 0);
                try {
                    rule = reshard_state(ck.world_size, rank, world, [&](int r) {
                        reading = state_path(ck.dir, r);
                        auto it = old_states.find(r);
                        if (it == old_states.end()) {
                            TrainingState s = read_training_state(reading, &ck);
                            check_state_matches_checkpoint(reading, s, ck, r);
                            it = old_states.emplace(r, std::move(s)).first;
                        }
                        return ByteReader(it->second.optimizer_state, reading);
                    }, blob);
                    ByteReader reader(blob.bytes(), ck.dir + " (state redistributed to rank " + std::to_string(rank) +
                                                        " of " + std::to_string(world) + ")");
                    load_optimizer_state(reader);
                } catch (const Error& e) {
                    const std::string what = e.what();
                    fail(what.starts_with(ck.dir) ? what : reading + ": " + what);
                }
                resumed = "resumed from " + ck.dir + " at step " + std::to_string(state.step) + changed + rule + ")";
            }
        } else {
            // what the state file holds is checked by the optimizer and the loader: their errors name the file
            try {
                ByteReader reader(saved.optimizer_state, path);
                load_optimizer_state(reader);
                train_loader.set_position(saved.data);
            } catch (const Error& e) {
                const std::string what = e.what();
                fail(what.starts_with(path) ? what : path + ": " + what);
            }
            resumed = "resumed from " + ck.dir + " at step " + std::to_string(state.step);
        }
        // --resume auto --init_from M: M starts the run, its checkpoints continue it (a preempted fine-tuning job)
        if (!cfg.init_from.empty())
            resumed += " (" + cfg.sources.name("init_from") + " " + cfg.init_from + " not read)";
    } else if (!cfg.init_from.empty()) {
        load_model(cfg.init_from, cfg.model, weights);
        start.weights_loaded = true;
    }
    // A rank that could not load its files has ended the job before this: no rank says "resumed" or deletes
    // checkpoints for a start that failed.
    transport.barrier();
    if (main_rank && !resumed.empty()) std::printf("%s\n", resumed.c_str());
    // Checkpoints in out_dir beyond this run's start belong to another history (a fresh run's out_dir holding an
    // earlier run, a resume from an older step): saved among them, this run's checkpoints would be pruned before
    // theirs and --resume auto would continue theirs.
    if (latest && latest->step > state.step) {
        const std::string held = state.step == 0 ? "another run's checkpoints (up to step " + std::to_string(latest->step) + ")"
                                                 : "checkpoints after step " + std::to_string(state.step) +
                                                       ", where this run resumes (up to step " +
                                                       std::to_string(latest->step) + ")";
        if (!cfg.overwrite)
            fail(cfg.out_dir + "/checkpoints: holds " + held + "; continue the latest with --resume auto, delete " +
                 "them with --overwrite, or use another --out_dir");
        if (main_rank)
            std::printf("removed %d checkpoint(s) after step %lld from %s/checkpoints (--overwrite)\n",
                        remove_checkpoints_after(cfg.out_dir, state.step), static_cast<long long>(state.step),
                        cfg.out_dir.c_str());
    }
    // A fresh start over another run's metrics (a run without a checkpoint: stopped early, or --checkpoint_every
    // -1) would start its metrics.jsonl afresh, and that run's lines would be lost. The same run, killed before
    // its first checkpoint and started again by --resume auto (a requeue), starts afresh.
    const std::string metrics = metrics_path(cfg.out_dir);
    if (main_rank && !start.checkpoint && !cfg.overwrite && file_exists(metrics) && File(metrics, "rb").size() > 0) {
        if (cfg.resume == "auto" && same_run_record(cfg.out_dir, config_json))
            std::fprintf(stderr, "warning: %s: the same run (config.json matches) ended before its first checkpoint; "
                         "starting it afresh\n", metrics.c_str());
        else
            fail(metrics + ": holds another run's metrics, and no checkpoint continues that run; replace them with " +
                 cfg.sources.name("overwrite") + ", or use another " + cfg.sources.name("out_dir"));
    }
    return start;
}

void save_checkpoint(const TrainConfig& cfg, Transport& transport, std::span<const float> weights,
                     const std::function<void(ByteWriter&)>& save_optimizer_state, TrainingState state) {
    const std::string dir = checkpoint_dir(cfg.out_dir, state.step);
    ByteWriter opt_state;
    save_optimizer_state(opt_state);
    // A checkpoint of diverged weights could not be loaded, and would replace the intact ones before it.
    std::array<double, 2> non_finite = {transport.rank() == 0 ? double(count_non_finite(weights)) : 0.0,
                                        double(opt_state.non_finite_floats())};
    transport.allreduce_sum(non_finite);
    if (non_finite[0] + non_finite[1] > 0) {
        auto count = [](double n, const char* what) { return std::to_string(static_cast<long long>(n)) + what; };
        std::string which = non_finite[0] > 0 ? count(non_finite[0], " of the weights") : "";
        if (non_finite[1] > 0)
            which += (which.empty() ? "" : " and ") + count(non_finite[1], " values of the optimizer state");
        const std::optional<CheckpointInfo> last = find_latest_checkpoint(cfg.out_dir);
        throw Diverged("step " + std::to_string(state.step) + ": " + which +
                       " are NaN or inf after the update, so no checkpoint was written (the run diverged; " +
                       (last ? "the newest checkpoint, " + last->dir + ", is from before" : "no checkpoint is left") +
                       ")");
    }
    if (transport.rank() == 0) {
        make_dirs(dir);
        sync_directory(cfg.out_dir);  // the new directories' entries reach the disk before what they will hold
        sync_directory(cfg.out_dir + "/checkpoints");
        unmark_checkpoint(dir);  // saving over a checkpoint of this step: incomplete until the new marker
    }
    transport.barrier();
    FileDigest model_digest;
    if (transport.rank() == 0) model_digest = save_model(model_path(dir), cfg.model, weights);
    state.optimizer_state = std::move(opt_state.bytes());
    const FileDigest state_digest = write_training_state(state_path(dir, transport.rank()), state);
    sync_directory(dir);  // this rank's renames are durable before its digest says the files are in place
    // Every rank's digest to rank 0; being a collective, this also means every rank's files are in place
    // before the marker says so.
    const int world = transport.world_size();
    std::vector<uint64_t> digests(2 * static_cast<size_t>(world), 0);
    digests[2 * transport.rank()] = state_digest.bytes;
    digests[2 * transport.rank() + 1] = state_digest.xxh64;
    transport.allreduce_or(digests);
    if (transport.rank() == 0) {
        CheckpointInfo info{dir, state.step, world, cfg.optimizer, {}};
        info.files[kModelFileName] = model_digest;
        for (int r = 0; r < world; r++) {
            const std::string name = state_path(dir, r).substr(dir.size() + 1);
            info.files[name] = {digests[2 * static_cast<size_t>(r)], digests[2 * static_cast<size_t>(r) + 1]};
        }
        mark_checkpoint_complete(info);
        sync_directory(dir);
        prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
        std::printf("saved checkpoint %s\n", dir.c_str());
    }
}

}  // namespace llmc
