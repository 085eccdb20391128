// The CPU trainer: GPT-2 in fp32 (OpenMP + OpenBLAS), data-parallel over MPI ranks with any registered optimizer
// (AdamW-DDP, DeMo). It is the reference the CUDA trainer is tested against and the way to run the DeMo vs AdamW
// experiments on machines without a GPU. One training step, top to bottom:
//   every micro-step: next batch of this rank's data slice -> forward -> backward (gradients accumulate; in the
//     last one, AdamW-DDP starts each layer's all-reduce as soon as the backward has finished it)
//   optimizer.step(params, local grads, lr)   <- the optimizer owns the exchange between ranks
//   metrics (loss averaged over ranks, tok/s, bytes from the transport) -> progress line + metrics.jsonl
//   every N steps: validation loss, a text sample, a checkpoint (model + every rank's state, atomic)
//
//   ./train_gpt_cpu --help                          every flag, with defaults
//   mpirun -np 4 ./train_gpt_cpu --optimizer demo   4 ranks on the default corpus
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/tokenizer.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/sampling.h"
#include "llmc/optim/optimizers.h"
#include "llmc/run/batch_agreement.h"
#include "llmc/run/config.h"
#include "llmc/run/dry_run.h"
#include "llmc/run/evaluation.h"
#include "llmc/run/metrics.h"
#include "llmc/run/run_checkpoints.h"
#include "llmc/run/run_setup.h"
#include "llmc/run/step_reporter.h"
#include "llmc/run/trainer_main.h"
#include "llmc/run/weight_check.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using namespace llmc;

int default_threads(int world, int virtual_ranks) {
    // Ranks on this host share its cores; Open MPI tells us how many processes share it, each with its virtual ranks.
    int local_ranks = world;
    if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_ranks = std::max(1, std::atoi(s)) * virtual_ranks;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / local_ranks);
}

// Autoregressive sample from the end-of-sequence token (--eos_token_id), at temperature 1, on the model's key/value
// cache: the context runs once, then one position per token, until it outgrows seq_len and the window slides (run
// whole per token).
std::string sample_text(ModelCpu& model, const TrainConfig& cfg, const TokenizerDecoder& tok, Rng& rng) {
    std::vector<int> tokens = {cfg.eos_token_id};
    std::string text;
    const int window = std::min(cfg.seq_len, cfg.model.max_seq_len);
    std::span<const float> logits = model.start_sequence(tokens);
    for (int i = 0; i < cfg.sample_tokens; i++) {
        if (i > 0) logits = model.continue_sequence(tokens, window);
        const int next = sample_token(logits, cfg.model.vocab_size, rng);
        tokens.push_back(next);
        text += tok.decode(next);
    }
    return text;
}

int train(TrainConfig cfg, Transport& transport, const Launch& launch) {
    const int rank = transport.rank(), world = transport.world_size();
    const bool main_rank = rank == 0;
    const int threads = cfg.threads > 0 ? cfg.threads : default_threads(world, cfg.virtual_ranks);
    omp_set_num_threads(threads);  // this thread's: a virtual rank's lane sets its own
    openblas_set_num_threads(threads);

    const int grad_accum = resolve_batch_geometry(cfg, world);
    // the sharded step reduce-scatters after the backward
    const bool ddp_overlap =
        cfg.optim.adamw.ddp_overlap && cfg.optimizer == "adamw" && world > 1 && cfg.optim.shard_group_size == 1;
    const int64_t tokens_per_micro = cfg.total_batch_size / grad_accum;
    transport.set_collective_timeout(cfg.comm_timeout);
    const std::string config_json = agree_on_config(cfg, transport);

    if (cfg.dry_run) {  // before the model's memory is taken: a dry run may ask about a model too large for here
        if (main_rank) print_dry_run_report(cfg, world);
        return 0;
    }
    ModelCpu model(cfg.model);
    const ParamLayout& layout = model.layout();
    std::unique_ptr<Optimizer> optimizer = optimizer_family(cfg.optimizer).make(cfg.optim, layout, transport);
    RunData data = open_run_data(cfg, rank, world);
    DataLoader& train_loader = data.train;

    // Starting point: a checkpoint, an llm.c model file, or a fresh seeded init (identical on every rank).
    TrainingState state;
    state.world_size = world;
    state.rank = rank;
    state.config_json = config_json;
    Rng sample_rng(static_cast<uint64_t>(cfg.seed) + 1);
    const RunStart start = resolve_run_start(cfg, config_json, tokens_per_micro, transport, model.params(),
                                             train_loader, sample_rng, state,
                                             [&](ByteReader& r) { optimizer->load_state(r); },
                                             optimizer_family(cfg.optimizer).reshard_state);
    if (!start.weights_loaded) model.init_random(static_cast<uint64_t>(cfg.seed));
    optimizer->set_weights(model.params());  // eager delayed DeMo: a resumed round's own share goes back in
    model.zero_padded_vocab_rows(optimizer->master_weights(model.params()));

    std::unique_ptr<MetricsLog> log;
    if (main_rank) {
        print_config_warnings(cfg);  // legal settings that probably do not do what was meant
        nlohmann::ordered_json record = run_record(cfg, world, grad_accum, "train_gpt_cpu", launch.argc, launch.argv);
        if (cfg.optimizer == "adamw") record["_run"]["ddp_overlap"] = ddp_overlap;  // in effect: with several ranks
        write_run_record(cfg.out_dir, record);
        log = std::make_unique<MetricsLog>(cfg.out_dir, start.checkpoint ? static_cast<int>(state.step) : -1);
        std::printf("model %s | %.2fM parameters | optimizer %s | %d rank(s) x %d thread(s)\n",
                    cfg.model.describe().c_str(), layout.num_params / 1e6, optimizer_banner(cfg).c_str(), world, threads);
        std::printf("%s\n", batch_banner(cfg, world, grad_accum, train_loader).c_str());
        if (cfg.peak_tflops > 0.0f) std::printf("MFU against %g TFLOP/s per rank (--peak_tflops)\n", cfg.peak_tflops);
    }

    const LrSchedule schedule = cfg.schedule();
    const size_t n = static_cast<size_t>(cfg.batch_size) * cfg.seq_len;
    std::vector<int> inputs(n), targets(n);
    const int start_step = static_cast<int>(state.step);
    StepReporter reporter(cfg, start_step, log.get(), {model_flops_per_token(layout, cfg.seq_len), cfg.peak_tflops},
                          launch.started);
    const ModelCpu::GradsFinal grads_final = [&](std::span<const ParamRange> ranges) {
        optimizer->on_gradients_final(model.grads(), ranges);
    };
    const StepReporter::FlushOnError flush_on_error(reporter, transport);
    for (int step = start_step; step < cfg.steps; step++) {
        const auto t0 = StepReporter::Clock::now();
        transport.reset_counters();
        model.zero_grad();
        double loss = 0.0;
        for (int micro = 0; micro < grad_accum; micro++) {
            train_loader.next_batch(inputs, targets);
            const bool last = micro == grad_accum - 1;
            // the wte rows no rank's last batch touches can be all-reduced early; the ranks' OR of them travels
            // during the forward
            const bool report = ddp_overlap && last;
            if (report) batch_agreement_start(transport, layout, true, true, inputs);
            loss += model.forward(inputs.data(), targets.data(), cfg.batch_size, cfg.seq_len);
            const std::vector<ParamRange> wte_early =
                report ? batch_agreement_finish(transport, layout, true, SIZE_MAX).wte_early
                       : std::vector<ParamRange>();
            model.backward(1.0f / static_cast<float>(grad_accum), report ? grads_final : ModelCpu::GradsFinal(),
                           wte_early);
        }
        loss /= grad_accum;
        const float lr = schedule.at(step);
        optimizer->set_step(step);
        StepResult result = optimizer->step(model.params(), model.grads(), lr);
        if (step + 1 == cfg.steps) optimizer->finish_updates(model.params(), result);  // --demo_delay's last round
        model.zero_padded_vocab_rows(optimizer->master_weights(model.params()));
        if (cfg.weight_check_every > 0 && (step + 1) % cfg.weight_check_every == 0)
            check_weights_agree(optimizer->weight_group(transport), optimizer->master_weights(model.params()), step + 1);
        reporter.report(step, t0, loss, lr, result, transport.counters(), transport, state);

        StepDuties due = step_duties(cfg, step);
        // a stop signal or the time limit (the ranks learn it together): this step is the last, with a checkpoint
        const bool stopping = reporter.stop_requested() && step + 1 < cfg.steps;
        if (stopping || reporter.checkpoint_requested()) due.checkpoint = cfg.checkpoint_every >= 0;
        if (due.validate || due.sample || due.checkpoint || stopping) reporter.flush(transport);
        const auto evaluating = StepReporter::Clock::now();
        run_step_evaluations(due, step, model, data, cfg, transport, log.get(), state.tokens,
                             [&](const TokenizerDecoder& tok) { return sample_text(model, cfg, tok, sample_rng); });
        if (due.validate || due.sample) reporter.evaluations_done(evaluating);
        if (due.checkpoint) {
            state.data = train_loader.position();
            state.sample_rng = sample_rng.state();
            const auto saving = StepReporter::Clock::now();
            // the shared weights: with eager delayed DeMo, params hold this rank's working weights
            save_checkpoint(cfg, transport, optimizer->master_weights(model.params()),
                            [&](ByteWriter& w) { optimizer->save_state(w); }, state);
            reporter.checkpoint_saved(saving, state.step);
        }
        if (stopping) {
            optimizer->finish_updates(model.params(), result);  // --demo_delay's round in flight: not left hanging
            return finish_stopped_run(cfg, transport, log.get(), state.step, reporter.stop_reason());
        }
    }
    // A resume onto another number of ranks with no step left converts the checkpoint: the redistributed state is
    // saved in this out_dir (never over the checkpoint read), e.g. to look at it or to start a run on M ranks later.
    if (start.checkpoint && start.checkpoint->world_size != world && start_step == cfg.steps &&
        cfg.checkpoint_every >= 0 && start.checkpoint->dir != checkpoint_dir(cfg.out_dir, state.step)) {
        state.data = train_loader.position();
        state.sample_rng = sample_rng.state();
        save_checkpoint(cfg, transport, optimizer->master_weights(model.params()),
                        [&](ByteWriter& w) { optimizer->save_state(w); }, state);
    }
    if (main_rank) std::printf("done: %d steps, metrics in %s/metrics.jsonl\n", cfg.steps, cfg.out_dir.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::trainer_main(argc, argv, "train_gpt_cpu", train, /*simulates_ranks=*/true);
}
