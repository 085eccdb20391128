// Resuming and saving checkpoints (see run_checkpoints.h).
#include "llmc/run/run_checkpoints.h"
#include <cstdio>
#include <vector>

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

RunStart resolve_run_start(const TrainConfig& cfg, const std::string& config_json, int64_t tokens_per_micro,
                           Transport& transport, std::span<float> weights, DataLoader& train_loader, Rng& sample_rng,
                           TrainingState& state, const std::function<void(ByteReader&)>& load_optimizer_state) {
    RunStart start;
    std::string resumed;  // rank 0 prints it once every rank has loaded its files
    const int rank = transport.rank(), world = transport.world_size();
    const bool main_rank = rank == 0;
    const std::string checkpoints = cfg.out_dir + "/checkpoints";
    LLMC_CHECK(cfg.checkpoint_every < 0 || !file_exists(checkpoints) || is_directory(checkpoints),
               checkpoints + ": not a directory, so no checkpoint could be saved (move it away)");
    std::vector<std::string> skipped;
    const std::optional<CheckpointInfo> latest = find_latest_checkpoint(cfg.out_dir, &skipped);
    if (main_rank)
        for (const std::string& line : skipped) std::fprintf(stderr, "warning: %s\n", line.c_str());
    if (cfg.resume == "auto") start.checkpoint = latest;
    else if (!cfg.resume.empty()) start.checkpoint = read_checkpoint_info(cfg.resume);
    state.train_data = train_loader.fingerprint();
    if (start.checkpoint) {
        const CheckpointInfo& ck = *start.checkpoint;
        LLMC_CHECK(ck.step <= cfg.steps, ck.dir + ": the checkpoint is at step " + std::to_string(ck.step) +
                                             ", past --steps " + std::to_string(cfg.steps) +
                                             " (raise --steps to continue the run)");
        const bool same_world = ck.world_size == world;
        if (!same_world && !cfg.reset_momentum)
            fail(ck.dir + ": checkpoint was written by " + std::to_string(ck.world_size) +
                 " ranks but this run has " + std::to_string(world) +
                 "; resume with the same number of ranks, or pass --reset_momentum to keep "
                 "the weights and step and start the optimizer state afresh");
        // with another world size every rank reads rank 0's state: the step, the tokens and the config
        const std::string path = state_path(ck.dir, same_world ? rank : 0);
        TrainingState saved = read_training_state(path, &ck);
        check_state_matches_checkpoint(path, saved, ck, same_world ? rank : 0);
        check_resume_compatible(path, saved.config_json, config_json,
                                [&](const std::string& key) { return cfg.sources.origin(key); },
                                same_world ? std::vector<std::string>{} : std::vector<std::string>{"total_batch_size"});
        const DataFingerprint& was = saved.train_data;
        if (was.shards != 0 && !(was == state.train_data)) {
            const DataFingerprint& now = state.train_data;
            auto files = [](const DataFingerprint& f) {
                return std::to_string(f.shards) + " files of " + std::to_string(f.tokens) + " tokens";
            };
            fail(path + ": the training shards are not the checkpoint's (" +
                 (was.shards == now.shards && was.tokens == now.tokens
                      ? files(now) + " then and now, but other names or sizes"
                      : files(was) + " then, " + files(now) + " now") +
                 "); resume on the same files");
        }
        load_checkpoint_model(ck, cfg.model, weights);
        start.weights_loaded = true;
        state.step = saved.step;
        state.tokens = saved.tokens;
        // with another world size, rank 0's: its text samples and the logged byte count continue
        sample_rng.set_state(saved.sample_rng);
        state.cumulative_bytes_sent = saved.cumulative_bytes_sent;
        if (!same_world) {
            const uint64_t groups_done = static_cast<uint64_t>(saved.tokens) / tokens_per_micro;
            DataPosition p;
            p.epoch = groups_done / train_loader.groups_per_epoch();
            train_loader.set_position(p);
            std::vector<int> skip_x(static_cast<size_t>(cfg.batch_size) * cfg.seq_len), skip_y(skip_x.size());
            for (uint64_t g = 0; g < groups_done % train_loader.groups_per_epoch(); g++) train_loader.next_batch(skip_x, skip_y);
            resumed = "resumed weights from " + ck.dir + " (step " + std::to_string(state.step) +
                      ") with a fresh optimizer state";
        } else {
            ByteReader reader(saved.optimizer_state, path);
            load_optimizer_state(reader);
            train_loader.set_position(saved.data);
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
    // -1) would start its metrics.jsonl afresh, and that run's lines would be lost.
    const std::string metrics = metrics_path(cfg.out_dir);
    if (main_rank && !start.checkpoint && !cfg.overwrite && file_exists(metrics) && File(metrics, "rb").size() > 0)
        fail(metrics + ": holds another run's metrics, and no checkpoint continues that run; replace them with " +
             cfg.sources.name("overwrite") + ", or use another " + cfg.sources.name("out_dir"));
    return start;
}

void save_checkpoint(const TrainConfig& cfg, Transport& transport, std::span<const float> weights,
                     const std::function<void(ByteWriter&)>& save_optimizer_state, TrainingState state) {
    const std::string dir = checkpoint_dir(cfg.out_dir, state.step);
    if (transport.rank() == 0) {
        make_dirs(dir);
        unmark_checkpoint(dir);  // saving over a checkpoint of this step: incomplete until the new marker
    }
    transport.barrier();
    FileDigest model_digest;
    if (transport.rank() == 0) model_digest = save_model(model_path(dir), cfg.model, weights);
    ByteWriter opt_state;
    save_optimizer_state(opt_state);
    state.optimizer_state = std::move(opt_state.bytes());
    const FileDigest state_digest = write_training_state(state_path(dir, transport.rank()), state);
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
        prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints);
        std::printf("saved checkpoint %s\n", dir.c_str());
    }
}

}  // namespace llmc
