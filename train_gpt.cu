// The CUDA trainer: GPT-2 or OLMo (--arch) on the GPU (llmc/model/model_cuda.cuh: bf16 parameters and activations,
// fp32 gradients, fp32 master weights in the optimizer, cuBLASLt matmuls), data-parallel over MPI ranks with one
// GPU each.
// It is train_gpt_cpu.cpp with the model and the optimizer moved to the device: the same flags and config files
// (llmc/run/config.h), data loader, LR schedule, metrics.jsonl lines, progress line and checkpoints (llm.c fp32
// model.bin + per-rank state with the same optimizer blobs), so a run can move between the two trainers. The
// kernels' switches are the schema's "cuda" and "comm" groups (--help lists them). One training step:
//   every micro-step: next batch of this rank's data slice -> forward + backward on the GPU (grads accumulate)
//   optimizer->step(params, local grads, lr)   <- the optimizer owns the exchange between ranks (NCCL)
//   one wait for the GPU: the step so far is only queued (on one GPU the host never waits inside it, and queues
//   the next step's micro-steps before this wait when nothing is due after the step), then
//   optimizer->complete_step (the norm, the GPU times, DeMo's checks) and the micro-steps' losses
//   metrics (loss averaged over ranks, tok/s, bytes from the transport) -> progress line + metrics.jsonl
//   every N steps: validation loss, a text sample, a checkpoint (model + every rank's state, atomic)
//
//   ./train_gpt --help                                  every flag, with defaults
//   mpirun -np 8 ./train_gpt --optimizer adamw          8 GPUs, AdamW-DDP (NCCL all-reduce)
// LLMC_PROFILE_STEP=N (a profiling knob, not a config key) brackets step N with cudaProfilerStart/Stop, for
// `ncu --profile-from-start off` or `nsys profile --capture-range=cudaProfilerApi`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/comm/transport_nccl.cuh"
#include "llmc/comm/transport_staged.cuh"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/data/dataloader.h"
#include "llmc/data/tokenizer.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_cuda.cuh"
#include "llmc/model/sampling.h"
#include "llmc/optim/optimizers.h"
#include "llmc/optim/optimizers_cuda.cuh"
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

namespace {

using namespace llmc;

// The most runs of untouched wte rows AdamW-DDP's overlapped all-reduce starts early over --transport mpi (the
// longest ones): that transport copies each range to the host on its own. NCCL packs any number into one all-reduce.
constexpr size_t kStagedEarlyWteRanges = 64;

// Autoregressive sample from the end-of-sequence token (--eos_token_id), at temperature 1 (the CPU trainer's
// procedure).
std::string sample_text(ModelCuda& model, const TrainConfig& cfg, const TokenizerDecoder& tok, Rng& rng) {
    std::vector<int> tokens = {cfg.eos_token_id};
    std::string text;
    const int max_len = std::min(cfg.seq_len, cfg.model.max_seq_len);
    for (int i = 0; i < cfg.sample_tokens; i++) {
        const size_t start = tokens.size() > static_cast<size_t>(max_len) ? tokens.size() - max_len : 0;
        const int T = static_cast<int>(tokens.size() - start);
        // Run a length that is a multiple of 8 (cuBLASLt-friendly attention shapes), padded with --pad_token_id;
        // causality makes the padding tokens after position T-1 irrelevant to its logits.
        const int T_run = std::min(max_len, (T + 7) / 8 * 8);
        std::vector<int> window(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
        window.resize(T_run, cfg.pad_token_id);
        model.forward(window.data(), nullptr, 1, T_run);
        const std::vector<float> logits = model.logits_row(static_cast<size_t>(T - 1));
        const int next = sample_token(logits, cfg.model.vocab_size, rng);
        tokens.push_back(next);
        text += tok.decode(next);
    }
    return text;
}

// The run record with what this run resolved: the device, the precision, and the switches that "auto" or the build
// decides (the config keys themselves are recorded as given).
void write_gpu_run_record(const TrainConfig& cfg, int world, int grad_accum, const CudaEnv& env,
                          const ModelCuda& model, bool ddp_overlap, int argc, char** argv) {
    nlohmann::ordered_json record = run_record(cfg, world, grad_accum, "train_gpt", argc, argv);
    record["_run"]["device"] = env.describe();
    record["_run"]["precision"] = kFloatXName;
    record["_run"]["stochastic_rounding"] = cfg.cuda.stochastic_rounding && !kFloatXIsFloat;
    if (!cfg.model.is_olmo()) record["_run"]["gelu_fusion"] = model.gelu_fusion();  // OLMo's MLP has no GELU
    record["_run"]["attention"] = model.attention_name();
    if (cfg.optimizer == "adamw") record["_run"]["ddp_overlap"] = ddp_overlap;
    write_run_record(cfg.out_dir, record);
}

// The padded vocabulary rows of wte kept at zero in the parameters and in the master weights this rank holds.
void zero_padded_vocab_rows(ModelCuda& model, DeviceOptimizer& optimizer) {
    const DeviceOptimizer::MasterShard shard = optimizer.master_shard();
    model.zero_padded_vocab_rows(shard.data, shard.begin, shard.count);
}

// --weight_check_every: the shared weights compared across the weight group: the fp32 master weights where every
// rank holds them all (eager delayed DeMo's floatX copy is this rank's working weights), else the floatX
// parameters the node's all-gather wrote.
void check_device_weights(ModelCuda& model, DeviceOptimizer& optimizer, Transport& transport, int step) {
    const bool sharded = optimizer.master_shard().count != SIZE_MAX;
    const size_t n = model.num_params();
    std::vector<std::byte> host(n * (sharded ? sizeof(floatX) : sizeof(float)));
    CUDA_CHECK(cudaMemcpy(host.data(), sharded ? static_cast<const void*>(model.params()) : optimizer.master_weights(),
                          host.size(), cudaMemcpyDeviceToHost));
    check_weights_agree(optimizer.weight_group(transport), host, step);
}

int train(TrainConfig cfg, Transport& world_transport, const Launch& launch) {
    const int rank = world_transport.rank(), world = world_transport.world_size();
    const bool main_rank = rank == 0;

    // Batch geometry: total_batch_size tokens per step = B * T * world * grad_accum.
    const int grad_accum = resolve_batch_geometry(cfg, world);
    const int64_t tokens_per_micro = cfg.total_batch_size / grad_accum;
    world_transport.set_collective_timeout(cfg.comm_timeout);  // the NCCL transport takes it from here
    const std::string config_json = agree_on_config(cfg, world_transport);

    const ParamLayout layout = ParamLayout::of(cfg.model);
    if (cfg.dry_run) {
        if (main_rank) print_dry_run_report(cfg, world);
        return 0;
    }
    (void)use_flash_attention(cfg.model, cfg.cuda.attention);  // --attention flash where it cannot run fails here
    check_device_optimizer(cfg.optimizer, cfg.optim);  // CPU-only optimizers and options fail here, before any GPU work
    if (!cuda_device_present()) fail("no CUDA device found: train_gpt needs an NVIDIA GPU (train_gpt_cpu runs without one)");

    // One GPU per rank; NCCL for the training collectives (world of one: no NCCL at all), or MPI through
    // pinned host memory with --transport mpi.
    CudaEnv env(local_device_index(rank));
    const bool staged = cfg.comm.transport == TransportChoice::mpi;
    std::unique_ptr<Transport> training_transport;
    if (staged) training_transport = std::make_unique<HostStagedTransport>(world_transport, env.stream);
    else training_transport = std::make_unique<NcclTransport>(world_transport, env.stream);
    Transport& transport = *training_transport;
    // AdamW-DDP's all-reduce during the backward, with several ranks (either transport)
    const bool overlap = cfg.optim.adamw.ddp_overlap && cfg.optimizer == "adamw" && world > 1 &&
                         cfg.optim.shard_group_size == 1;
    const size_t early_wte_runs = staged ? kStagedEarlyWteRanges : SIZE_MAX;
    ModelCuda model(cfg.model, cfg.batch_size, cfg.seq_len, env, cfg.cuda);
    std::unique_ptr<DeviceOptimizer> optimizer =
        make_device_optimizer(cfg.optimizer, cfg.optim, layout, transport, env.stream, cfg.cuda.stochastic_rounding,
                              static_cast<uint32_t>(cfg.seed), overlap);
    RunData data = open_run_data(cfg, rank, world);
    DataLoader& train_loader = data.train;

    // Starting point: a checkpoint, an llm.c model file, or a fresh seeded init (identical on every rank and
    // to the CPU trainer's, which draws it).
    TrainingState state;
    state.world_size = world;
    state.rank = rank;
    state.config_json = config_json;
    Rng sample_rng(static_cast<uint64_t>(cfg.seed) + 1);
    std::vector<float> weights(layout.num_params);
    const RunStart start = resolve_run_start(cfg, config_json, tokens_per_micro, transport, weights, train_loader,
                                             sample_rng, state, [&](ByteReader& r) { optimizer->load_state(r); },
                                             nullptr, optimizer_family(cfg.optimizer).reshard_state != nullptr);
    if (start.checkpoint && start.checkpoint->world_size == world) optimizer->set_steps_done(state.step);
    if (!start.weights_loaded) {
        ModelCpu init(cfg.model);  // the CPU trainer's seeded init, bit for bit
        init.init_random(static_cast<uint64_t>(cfg.seed));
        const auto p = init.params();
        std::copy(p.begin(), p.end(), weights.begin());
    }
    // fp32 weights -> device (through the gradient buffer, which is fp32 and the same size) -> master + params
    CUDA_CHECK(cudaMemcpy(model.grads(), weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    optimizer->set_weights(model.grads(), model.params());
    zero_padded_vocab_rows(model, *optimizer);  // eager delayed DeMo: a resumed round's own share
    model.zero_grad();
    weights = std::vector<float>();

    // MFU's peak: --peak_tflops, or the GPU's dense bf16 peak where it is known (bf16 build; the fp32 build's
    // kernels run on other units)
    const double known_peak = std::is_same_v<floatX, float> ? 0.0 : known_peak_bf16_tflops(env.props.name);
    const double peak_tflops = cfg.peak_tflops > 0.0f ? double(cfg.peak_tflops) : known_peak;
    std::unique_ptr<MetricsLog> log;
    if (main_rank) {
        print_config_warnings(cfg);  // legal settings that probably do not do what was meant
        write_gpu_run_record(cfg, world, grad_accum, env, model, overlap, launch.argc, launch.argv);
        log = std::make_unique<MetricsLog>(cfg.out_dir, start.checkpoint ? static_cast<int>(state.step) : -1);
        std::string optimizer = cfg.optimizer;
        if (cfg.optimizer == "demo") {
            const std::string late = optimizer_family("demo").describe(cfg.optim);
            optimizer += " (" + demo::kernel_choice(cfg.optim.demo).describe() + (late.empty() ? "" : ", " + late) + ")";
        } else if (cfg.optimizer == "topk") {  // no DCTs: the kernel choice does not apply
            optimizer += " (" + optimizer_family("topk").describe(cfg.optim) + ")";
        } else if (cfg.optimizer == "diloco" || cfg.optimizer == "sparseloco") {
            optimizer = optimizer_banner(cfg);  // the CPU trainer's: its rounds and wire
        }
        std::printf("model %s | %.2fM parameters | optimizer %s | %d rank(s) x GPU %s | %s\n", cfg.model.describe().c_str(),
                    layout.num_params / 1e6, optimizer.c_str(), world, env.describe().c_str(), kFloatXName);
        std::printf("%s | activations %.0f MiB (%s attention)\n", batch_banner(cfg, world, grad_accum, train_loader).c_str(),
                    model.activation_bytes() / 1048576.0, model.attention_name());
        if (cfg.peak_tflops > 0.0f)
            std::printf("MFU against %g TFLOP/s per GPU (--peak_tflops)\n", double(cfg.peak_tflops));
        else if (peak_tflops > 0.0)
            std::printf("MFU against %g TFLOP/s per GPU (the %s's dense bf16 peak; --peak_tflops sets another)\n",
                        peak_tflops, env.props.name);
        else
            std::printf("MFU not reported: %s has no known %s peak (--peak_tflops sets one)\n", env.props.name,
                        kFloatXName);
    }

    const LrSchedule schedule = cfg.schedule();
    const size_t n = static_cast<size_t>(cfg.batch_size) * cfg.seq_len;
    // A step's batches, one per micro-step, all read before any is queued: a batch that fails to load (a token id
    // out of range) stops the run before the step's device work starts.
    std::vector<std::vector<int>> inputs(grad_accum, std::vector<int>(n)), targets(grad_accum, std::vector<int>(n));
    const auto load_batches = [&] {
        for (int micro = 0; micro < grad_accum; micro++) train_loader.next_batch(inputs[micro], targets[micro]);
    };
    const int start_step = static_cast<int>(state.step);
    StepReporter reporter(cfg, start_step, log.get(), {model_flops_per_token(layout, cfg.seq_len), peak_tflops},
                          launch.started);
    const char* profile_env = std::getenv("LLMC_PROFILE_STEP");
    const int profile_step = profile_env ? std::atoi(profile_env) : -1;
    const ModelCuda::GradsFinal grads_final = [&](std::span<const ParamRange> ranges) {
        optimizer->on_gradients_final(model.grads(), ranges);
    };
    // Queues a step's forward and backward passes over its loaded batches. `wte_early`: the wte rows no rank's last
    // batch touches, whose all-reduce the overlapped AdamW-DDP can start early (batch_agreement.h).
    const auto queue_micro_steps = [&](std::span<const ParamRange> wte_early) {
        transport.reset_counters();
        model.zero_grad();
        for (int micro = 0; micro < grad_accum; micro++) {
            // the last backward reports its final gradients layer by layer to the overlapped all-reduce
            const bool last = micro == grad_accum - 1;
            model.queue_forward_backward(inputs[micro].data(), targets[micro].data(), cfg.batch_size, cfg.seq_len,
                                         1.0f / static_cast<float>(grad_accum),
                                         last && overlap ? grads_final : ModelCuda::GradsFinal(),
                                         last ? wte_early : std::span<const ParamRange>());
        }
    };
    CudaEvent step_end;
    bool queued_ahead = false;  // this step's micro-steps were queued before the last step's wait
    bool loaded_ahead = false;  // this step's batches were read then, but not queued (another rank's failed to load)
    StepReporter::Clock::time_point t0;
    const StepReporter::FlushOnError flush_on_error(reporter, transport);
    for (int step = start_step; step < cfg.steps; step++) {
        if (step == profile_step) CUDA_CHECK(cudaProfilerStart());
        // The whole step is queued on the GPU first; the host waits once, at its end, then reads the results.
        if (!queued_ahead) {
            t0 = StepReporter::Clock::now();
            if (!loaded_ahead) load_batches();
            queue_micro_steps(overlap ? untouched_wte_ranges(transport, layout, inputs.back(), early_wte_runs)
                                      : std::vector<ParamRange>());
        }
        // When nothing is due after this step, the next step is queued before this one's wait, so the GPU never
        // idles while the host reports. Evaluations, samples and checkpoints need the model as this step leaves it,
        // and the ranks must agree that every next batch loaded before any queues its collectives.
        StepDuties due = step_duties(cfg, step);
        // A stop signal or the time limit (the ranks learn it together): this step is the last, with a checkpoint.
        const bool stopping = reporter.stop_requested() && step + 1 < cfg.steps;
        if (stopping || reporter.checkpoint_requested()) due.checkpoint = cfg.checkpoint_every >= 0;
        const bool queue_next = step + 1 < cfg.steps && !due.validate && !due.sample && !due.checkpoint &&
                                !stopping && step != profile_step && step + 1 != profile_step;
        std::exception_ptr next_step_error;
        queued_ahead = loaded_ahead = false;
        if (queue_next) {
            try {
                load_batches();
                loaded_ahead = true;
            } catch (...) {
                next_step_error = std::current_exception();
            }
            if (world > 1) batch_agreement_start(transport, layout, loaded_ahead, overlap, inputs.back());
        }
        const float lr = schedule.at(step);
        StepResult result = optimizer->step(model.params(), model.grads(), lr);
        if (step + 1 == cfg.steps) optimizer->finish_updates(model.params(), result);  // --demo_delay's last round
        zero_padded_vocab_rows(model, *optimizer);
        step_end.record(env.stream);
        const CommCounters comm = transport.counters();
        bool a_rank_failed_to_load = false;
        if (queue_next) {
            const BatchAgreement agreed = world > 1 ? batch_agreement_finish(transport, layout, overlap,
                                                                             early_wte_runs)
                                                    : BatchAgreement{loaded_ahead, {}};
            a_rank_failed_to_load = !agreed.all_loaded;
            if (agreed.all_loaded) {
                queue_micro_steps(agreed.wte_early);
                queued_ahead = true;
            }
        }
        step_end.synchronize();  // this step's device work is finished before its time is taken
        const auto step_done = StepReporter::Clock::now();
        optimizer->complete_step(result);
        double loss = 0.0;
        for (const float micro_loss : model.take_losses(static_cast<size_t>(grad_accum))) loss += micro_loss;
        loss /= grad_accum;
        if (step == profile_step) CUDA_CHECK(cudaProfilerStop());
        reporter.report(step, t0, loss, lr, result, comm, transport, state);
        if (cfg.weight_check_every > 0 && (step + 1) % cfg.weight_check_every == 0)
            check_device_weights(model, *optimizer, transport, step + 1);
        if (a_rank_failed_to_load) reporter.flush(transport);  // the job ends: every rank writes this step first
        if (next_step_error) std::rethrow_exception(next_step_error);
        t0 = step_done;  // a step queued ahead starts on the GPU when this one ends
        if (due.validate || due.sample || due.checkpoint || stopping) reporter.flush(transport);

        const auto evaluating = StepReporter::Clock::now();
        run_step_evaluations(due, step, model, data, cfg, transport, log.get(), state.tokens,
                             [&](const TokenizerDecoder& tok) { return sample_text(model, cfg, tok, sample_rng); });
        if (due.validate || due.sample) reporter.evaluations_done(evaluating);
        if (due.checkpoint) {
            state.data = train_loader.position();
            state.sample_rng = sample_rng.state();
            const auto saving = StepReporter::Clock::now();
            // The checkpoint holds the fp32 master weights: the same llm.c file the CPU trainer writes (a sharded
            // step gathers them over the node, through the gradient buffer: every rank takes part).
            const std::vector<float> master = optimizer->download_master_weights(model.num_params(), model.grads(), main_rank);
            save_checkpoint(cfg, transport, master, [&](ByteWriter& w) { optimizer->save_state(w); }, state);
            reporter.checkpoint_saved(saving, state.step);
        }
        if (stopping) {
            optimizer->finish_updates(model.params(), result);  // --demo_delay's round in flight: not left hanging
            return finish_stopped_run(cfg, transport, log.get(), state.step, reporter.stop_reason());
        }
    }
    if (main_rank) std::printf("done: %d steps, metrics in %s/metrics.jsonl\n", cfg.steps, cfg.out_dir.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::trainer_main(argc, argv, "train_gpt", train); }
