// Shared trainer pieces (see train_common.h).
#include "llmc/train_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "demo/chunk_plan.h"
#include "demo/demo_chunk_math.h"
#include "demo/traffic_report.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/model_io.h"
#include "llmc/schedule.h"
#include "llmc/stop_signal.h"
#include "llmc/transport_mpi.h"

#ifndef LLMC_GIT_VERSION
#define LLMC_GIT_VERSION "unknown"
#endif

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

void print_dry_run_report(const TrainConfig& cfg, int world) {
    // (the optimizer's own checks ran in validate_config)
    print_config_warnings(cfg);
    std::printf("%s\n", config_to_json(cfg).c_str());
    std::fflush(stdout);
    // One rank sends nothing; report for the paper's 64 ranks then (mpirun -np N for another count).
    demo::TrafficOptions traffic;
    traffic.world_size = world > 1 ? world : 64;
    traffic.chunk = cfg.demo_chunk;
    demo::print_traffic_report(std::cout,
                               "traffic per rank per step, " + cfg.model.describe() + ", " +
                                   std::to_string(traffic.world_size) + " ranks",
                               demo::gpt2_shapes(cfg.model), traffic);
}

std::vector<std::string> config_warnings(const TrainConfig& cfg) {
    std::vector<std::string> warnings;
    // the optimizers' decay factor, in their float arithmetic, at the peak learning rate
    if (const float factor = 1.0f - cfg.lr * cfg.weight_decay; factor <= 0.0f)
        warnings.push_back("lr " + format_float(cfg.lr) + " x weight_decay " + format_float(cfg.weight_decay) +
                           " >= 1: decoupled weight decay multiplies the decayed weights by 1 - lr x weight_decay = " +
                           format_float(factor) + " at the peak learning rate: " +
                           (factor < 0.0f ? "it flips their sign" : "it zeroes them") + " instead of shrinking them");
    if (cfg.warmup_steps > cfg.steps) {
        const LrSchedule schedule = cfg.schedule();
        warnings.push_back("warmup_steps " + std::to_string(cfg.warmup_steps) + " > steps " +
                           std::to_string(cfg.steps) + ": the learning rate is still warming up at the last step, " +
                           "where it reaches " + format_float(schedule.at(cfg.steps - 1)) + ", not lr " +
                           format_float(cfg.lr));
    }
    if (const LrSchedule schedule = cfg.schedule();
        schedule.shape == LrShape::wsd && cfg.warmup_steps <= cfg.steps && schedule.decay_start() < cfg.warmup_steps)
        warnings.push_back("lr_schedule wsd: the decay over the last lr_decay_frac " + format_float(cfg.lr_decay_frac) +
                           " of the steps starts at step " + std::to_string(schedule.decay_start()) +
                           ", before warmup ends at step " + std::to_string(cfg.warmup_steps) +
                           ": the learning rate never stays at lr");
    if (cfg.optimizer == "demo") {
        // demo::plan_tensor clamps a tensor's k to its chunks' elements (a 1-D tensor's chunk is one row)
        const ParamLayout layout = ParamLayout::gpt2(cfg.model);
        size_t clamped = 0, fewest = SIZE_MAX;
        std::string example;
        for (const ParamTensor& t : layout.tensors) {
            const demo::TensorPlan p = demo::plan_tensor(t.shape, static_cast<size_t>(cfg.demo_chunk),
                                                         static_cast<size_t>(cfg.demo_topk));
            if (p.k == static_cast<size_t>(cfg.demo_topk)) continue;
            clamped++;
            if (p.chunk_elems < fewest) {
                fewest = p.chunk_elems;
                example = std::to_string(p.n1) + " x " + std::to_string(p.n2) + " in " + t.name;
            }
        }
        if (clamped > 0)
            warnings.push_back("demo_topk " + std::to_string(cfg.demo_topk) + " exceeds the elements of the DeMo " +
                               "chunks of " + std::to_string(clamped) + " of " + std::to_string(layout.tensors.size()) +
                               " tensors (demo_chunk " + std::to_string(cfg.demo_chunk) + "; smallest: " + example +
                               "): their k is clamped to a chunk's elements, so they send every coefficient");
    }
    if (cfg.checkpoint_every < 0 && cfg.time_limit_minutes > 0.0f)
        warnings.push_back("time_limit_minutes " + format_float(cfg.time_limit_minutes) +
                           " with checkpoint_every -1: the run stops at its limit without a checkpoint to continue from");
    if (cfg.checkpoint_every < 0 && cfg.checkpoint_every_minutes > 0.0f)
        warnings.push_back("checkpoint_every_minutes " + format_float(cfg.checkpoint_every_minutes) +
                           " with checkpoint_every -1: no checkpoint is written");
    return warnings;
}

void print_config_warnings(const TrainConfig& cfg) {
    for (const std::string& warning : config_warnings(cfg)) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    std::fflush(stderr);
}

std::string demo_delay_phrase(const TrainConfig& cfg) {
    if (cfg.optimizer != "demo" || cfg.demo_delay == 0) return "";
    return cfg.demo_eager ? "applied a step late, own share at once" : "applied a step late";
}

bool ddp_overlap_from_env() {
    const char* s = std::getenv("LLMC_DDP_OVERLAP");
    const std::string v = s ? s : "1";
    LLMC_CHECK(v == "0" || v == "1", "LLMC_DDP_OVERLAP must be 0 or 1; got '" + v + "'");
    return v == "1";
}

std::vector<ParamRange> untouched_wte_ranges(Transport& transport, const ParamLayout& layout,
                                             std::span<const int> inputs, size_t max_runs) {
    std::vector<uint64_t> touched = token_row_bitmap(inputs, static_cast<size_t>(layout.config.padded_vocab_size));
    transport.allreduce_or(touched);
    return layout.untouched_wte_rows(touched, max_runs);
}

// The agreement's bitmap: word 0 has bit 0 set by a rank that failed to load; with `rows`, the row bitmap follows.
void batch_agreement_start(Transport& transport, const ParamLayout& layout, bool loaded, bool rows,
                           std::span<const int> last_inputs) {
    std::vector<uint64_t> bits = {loaded ? uint64_t{0} : uint64_t{1}};
    if (rows) {
        const auto touched = token_row_bitmap(loaded ? last_inputs : std::span<const int>(),
                                              static_cast<size_t>(layout.config.padded_vocab_size));
        bits.insert(bits.end(), touched.begin(), touched.end());
    }
    transport.allreduce_or_start(bits);
}

BatchAgreement batch_agreement_finish(Transport& transport, const ParamLayout& layout, bool rows, size_t max_runs) {
    const size_t row_words = rows ? token_row_words(static_cast<size_t>(layout.config.padded_vocab_size)) : 0;
    std::vector<uint64_t> bits(1 + row_words);
    transport.allreduce_or_finish(bits);
    BatchAgreement agreed;
    agreed.all_loaded = bits[0] == 0;
    if (rows && agreed.all_loaded)
        agreed.wte_early = layout.untouched_wte_rows(std::span<const uint64_t>(bits).subspan(1), max_runs);
    return agreed;
}

RunData open_run_data(const TrainConfig& cfg, int rank, int world) {
    LLMC_CHECK(!cfg.train_data.empty(),
               cfg.sources.name("train_data") + " is empty (give a glob of llm.c token shards)");
    RunData data{DataLoader(cfg.train_data, cfg.batch_size, cfg.seq_len, rank, world, cfg.shuffle, cfg.seed,
                            cfg.model.vocab_size),
                 nullptr, 0, nullptr, {}};
    if (!cfg.val_data.empty() && cfg.val_batches > 0) {
        data.val = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, rank, world, false,
                                                cfg.seed, cfg.model.vocab_size);
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
        data.tokenizer = std::make_unique<TokenizerDecoder>(TokenizerDecoder::load(cfg.tokenizer));
        // checked now, not at the first sample: a sampled id may be any of the model's vocabulary
        LLMC_CHECK(data.tokenizer->size() >= static_cast<size_t>(cfg.model.vocab_size),
                   cfg.tokenizer + ": holds " + std::to_string(data.tokenizer->size()) + " tokens, fewer than the " +
                       std::to_string(cfg.model.vocab_size) + " of the model's vocabulary (another tokenizer?)");
        LLMC_CHECK(data.tokenizer->eot() < cfg.model.vocab_size,
                   cfg.tokenizer + ": its end-of-text token " + std::to_string(data.tokenizer->eot()) +
                       ", which starts every sample, is outside the model's vocabulary of " +
                       std::to_string(cfg.model.vocab_size) + " (another tokenizer, or " +
                       cfg.sources.name("sample_every") + " 0)");
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

namespace {
StepReporter::Clock::duration seconds(double n) {
    return std::chrono::duration_cast<StepReporter::Clock::duration>(std::chrono::duration<double>(n));
}
}  // namespace

StepReporter::StepReporter(const TrainConfig& cfg, int start_step, MetricsLog* log, ModelFlops flops,
                           Clock::time_point launched)
    : cfg_(cfg), start_step_(start_step), log_(log), flops_(flops), last_checkpoint_(launched) {
    if (cfg.time_limit_minutes > 0.0f) deadline_ = launched + seconds(60.0 * cfg.time_limit_minutes);
    // Until a save is timed: the weights and two fp32 moments per parameter (AdamW's state; DeMo's is smaller)
    // written at 200 MB/s, a slow shared file system's pace.
    checkpoint_seconds_ = static_cast<double>(ParamLayout::gpt2(cfg.model).num_params) * 12.0 / 200e6;
}

double StepReporter::time_to_next_stop(int step, double step_seconds) const {
    // A stop asked for at this report happens after step + 1 (the ranks learn of it at that step's report) and its
    // evaluations; one asked for at the next report, after step + 2. Each step's evaluations come after its report.
    int evaluations = 0;
    for (int s = step; s <= step + 2 && s < cfg_.steps; s++) {
        const StepDuties due = step_duties(cfg_, s);
        evaluations += due.validate || due.sample;
    }
    return 2.0 * step_seconds + evaluations * evaluation_seconds_ + checkpoint_seconds_;
}

void StepReporter::evaluations_done(Clock::time_point began) {
    evaluation_seconds_ = std::chrono::duration<double>(Clock::now() - began).count();
}

void StepReporter::checkpoint_saved(Clock::time_point began, int64_t step) {
    last_checkpoint_ = Clock::now();
    checkpoint_seconds_ = std::chrono::duration<double>(last_checkpoint_ - began).count();
    last_checkpoint_step_ = step;
    checkpoint_requested_ = false;
}

void StepReporter::report(int step, Clock::time_point started, double local_loss, float lr, const StepResult& result,
                          const CommCounters& comm, Transport& transport, TrainingState& state) {
    flush(transport);  // the last step's averages travelled during this step
    const double step_seconds = std::chrono::duration<double>(Clock::now() - started).count();

    state.step = step + 1;
    state.tokens += cfg_.total_batch_size;
    state.cumulative_bytes_sent += static_cast<int64_t>(comm.bytes_sent);
    StepMetrics m;
    m.step = step + 1;
    m.total_steps = cfg_.steps;
    m.loss = local_loss;
    m.lr = lr;
    m.grad_norm = result.grad_norm;
    m.step_seconds = step_seconds;
    m.comm = comm;
    m.comm_seconds = m.comm.seconds;
    m.compute_seconds = m.step_seconds - m.comm_seconds;
    m.tokens = state.tokens;
    m.tokens_per_second = cfg_.total_batch_size / m.step_seconds;
    m.model_tflops = flops_.per_token * m.tokens_per_second / transport.world_size() / 1e12;
    if (flops_.peak_tflops > 0.0) m.mfu = m.model_tflops / flops_.peak_tflops;
    m.cumulative_bytes_sent = state.cumulative_bytes_sent;
    m.optimizer = result.seconds;
    if (step > start_step_ || cfg_.steps - start_step_ == 1) {
        session_seconds_ += m.step_seconds;
        session_steps_++;
    }
    m.eta_seconds = session_steps_ ? session_seconds_ / session_steps_ * (cfg_.steps - step - 1) : 0.0;
    // the third value: how many ranks were asked to stop (a signal that reached one rank stops every one); the
    // fourth: how many would pass the time limit if they did not ask now (see stop_requested); the fifth: how
    // many found --checkpoint_every_minutes passed since the last checkpoint
    const Clock::time_point now = Clock::now();
    const bool out_of_time = deadline_ && now + seconds(time_to_next_stop(step, step_seconds)) >= *deadline_;
    const bool checkpoint_due = cfg_.checkpoint_every_minutes > 0.0f &&
                                now >= last_checkpoint_ + seconds(60.0 * cfg_.checkpoint_every_minutes);
    const double local[5] = {m.loss, m.grad_norm, StopSignals::received() != 0 ? 1.0 : 0.0, out_of_time ? 1.0 : 0.0,
                             checkpoint_due ? 1.0 : 0.0};
    transport.allreduce_sum_start(local);
    pending_ = m;
    if (step + 1 == cfg_.steps || transport.world_size() == 1) flush(transport);  // one rank: nothing to wait for
}

void StepReporter::flush(Transport& transport) {
    if (!pending_) return;
    StepMetrics m = *pending_;
    pending_.reset();
    double sums[5];
    transport.allreduce_sum_finish(sums);
    m.loss = sums[0] / transport.world_size();
    m.grad_norm = sums[1] / transport.world_size();
    if (sums[2] > 0.0) stop_reason_ = StopReason::signal;
    else if (sums[3] > 0.0 && stop_reason_ == StopReason::none) stop_reason_ = StopReason::time_limit;
    // a request sent before the last checkpoint was saved (its step's report travelled meanwhile) is spent
    if (sums[4] > 0.0 && m.step > last_checkpoint_step_) checkpoint_requested_ = true;
    const bool diverged = !std::isfinite(m.loss) || !std::isfinite(m.grad_norm);
    if (log_) {
        log_->log_step(m);
        if (diverged) log_->log_diverged(m.step, m.loss, m.grad_norm);
        if (m.step % cfg_.log_every == 0 || m.step == cfg_.steps || diverged) {
            std::printf("%s\n", format_progress(m).c_str());
            std::fflush(stdout);
        }
    }
    // Every rank holds the same averages, so every rank stops here, before this step's evaluations and
    // checkpoint: no checkpoint holds the diverged weights, and --resume auto goes back to the last good one.
    if (diverged)
        throw Diverged("step " + std::to_string(m.step) + ": the loss is " + format_value(m.loss) +
                       " and the gradient norm " + format_value(m.grad_norm) +
                       ": training diverged (lower --lr, or clip the gradients with --grad_clip); no checkpoint "
                       "was written for it");
}

int finish_stopped_run(const TrainConfig& cfg, const Transport& transport, MetricsLog* log, int64_t step,
                       StopReason reason) {
    if (transport.rank() == 0) {
        const int signal = StopSignals::received();
        const std::string why = reason == StopReason::time_limit
                                    ? "time limit of " + format_float(cfg.time_limit_minutes) + " minutes"
                                : signal == 0                ? "a stop signal on another rank"
                                : transport.world_size() > 1 ? std::string(signal_name(signal)) + " on rank 0"
                                                             : std::string(signal_name(signal));
        std::optional<std::string> checkpoint;
        if (cfg.checkpoint_every >= 0) checkpoint = checkpoint_dir(cfg.out_dir, step);
        if (log) log->log_stopped(static_cast<int>(step), cfg.steps, why, checkpoint);
        const std::string saved = checkpoint ? "; checkpoint " + *checkpoint + ": continue with --resume auto"
                                             : "; no checkpoint (--checkpoint_every -1)";
        std::printf("stopped after step %lld of %d on %s%s%s\n", static_cast<long long>(step), cfg.steps,
                    reason == StopReason::time_limit ? "the " : "", why.c_str(), saved.c_str());
        std::fflush(stdout);
    }
    return kStoppedExitStatus;
}

int report_fatal_error(const std::exception& e, const Transport* transport) {
    const bool user_error = dynamic_cast<const Error*>(&e) != nullptr;
    const bool multi_rank = transport && transport->world_size() > 1;
    const std::string where = multi_rank ? " (rank " + std::to_string(transport->rank()) + ")" : "";
    if (dynamic_cast<const std::bad_alloc*>(&e))
        std::fprintf(stderr, "error%s: out of host memory (%s): the model, the batch or the data are too large for "
                     "this machine (--dry_run prints the model's size)\n", where.c_str(), e.what());
    else
        std::fprintf(stderr, "error%s: %s%s\n", where.c_str(), user_error ? "" : "internal: ", e.what());
    std::fflush(stderr);
    const int status = dynamic_cast<const Diverged*>(&e) ? kDivergedExitStatus : 1;
    // Ranks that hit the same error (a bad flag) all get to say so before mpirun ends the job.
    if (multi_rank) std::_Exit(status);
    return status;
}

int trainer_main(int argc, char** argv, const char* program, TrainFunction train) {
    const StepReporter::Clock::time_point started = StepReporter::Clock::now();
    std::unique_ptr<Transport> transport;
    try {
        const bool launched_ranks = started_by_mpi_launcher();  // before MPI_Init sets Open MPI's variables
        transport = make_world_transport(&argc, &argv);
        TrainConfig cfg;
        if (!parse_command_line(argc - 1, argv + 1, cfg, program)) return 0;
        const StopSignals stop_signals(!launched_ranks);  // a stop signal now ends the run at a step, with a checkpoint
        return train(cfg, *transport, Launch{argc, argv, started});
    } catch (const std::exception& e) {
        return report_fatal_error(e, transport.get());
    }
}

}  // namespace llmc
