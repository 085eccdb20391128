// The CUDA trainer: GPT-2 on the GPU (llmc/gpt2_cuda.cuh: bf16 parameters and activations, fp32 gradients,
// fp32 master weights in the optimizer, cuBLASLt matmuls), data-parallel over MPI ranks with one GPU each.
// It is train_gpt_cpu.cpp with the model and the optimizer moved to the device: the same flags and config
// files (llmc/config.h), data loader, LR schedule, metrics.jsonl lines, progress line and checkpoints (llm.c
// fp32 model.bin + per-rank state with the same optimizer blobs), so a run can move between the two trainers.
// One training step, top to bottom:
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
// Environment knobs (GPU-only, not in the shared config schema):
//   LLMC_STOCHASTIC_ROUNDING=0  rounds the bf16 parameters to nearest instead of stochastically;
//   LLMC_GELU_FUSION=0/1/2      the GELU as separate kernels (default before sm_90) / the forward as a cuBLASLt
//                               epilogue / the backward too (DGELU epilogue; default on sm_90+);
//   LLMC_ATTENTION=auto|flash|matmul  llmc/flash_attention.cuh (tensor-core tiles, no T x T matrices in memory;
//                               bf16 build, head size 64) or the cuBLASLt + softmax attention; auto (default):
//                               flash where it can run;
//   LLMC_FLASH_DQ=shares|shares_bf16|atomic  how the flash backward sums dQ over key tiles: per-pair shares and a
//                               second kernel (default, deterministic), the shares in bf16 (half their traffic,
//                               deterministic, each share rounded to bf16), or FlashAttention-2's fp32 atomic adds
//                               (not bit-identical from run to run);
//   LLMC_MATMUL_TUNE=0|1        1: each matmul problem's cuBLASLt algorithm is the fastest of the heuristic's
//                               first 8, timed when the problem is first met (the weight gradients excepted), not
//                               its first choice; tuned runs are not bit-reproducible across runs (llmc/matmul.cuh);
//   LLMC_CUDA_GRAPH=0|1         1: each training micro-step's kernels replayed as one captured CUDA graph (the same
//                               bits; not with AdamW-DDP's overlapped all-reduce; llmc/gpt2_cuda.cuh);
//   LLMC_BIAS_GRAD=reduce|epilogue  the qkv and fc bias gradients by a column reduction over dout (default) or
//                               from cuBLASLt's BGRADB epilogue on their weight-gradient products (no pass of its
//                               own; the sums in cuBLASLt's order; llmc/matmul.cuh);
//   LLMC_DEMO_DCT=fp32|tensor   --optimizer demo: the compress kernel's DCTs in fp32 multiply-adds (default,
//                               bit-identical to the host reference) or on the tensor cores (3xTF32);
//   LLMC_DEMO_MOMENTUM=spatial|dct  --optimizer demo: the 64 x 64 chunks' momentum as the reference keeps it
//                               (default) or in the DCT domain (the same step to rounding, a faster compress;
//                               checkpoints record it; demo/demo_cuda.cuh);
//   LLMC_DEMO_TUNING=N          --optimizer demo: the DeMo kernels of demo::kTunings[N] (the kernel lab's
//                               candidates, for timing them in whole steps; demo/demo_cuda.cuh);
//   LLMC_TRANSPORT=mpi          gradients and DeMo buckets through pinned host memory and the MPI transport
//                               instead of NCCL (llmc/transport_staged.cuh), for clusters without NCCL;
//   LLMC_DDP_OVERLAP=0|1        --optimizer adamw with several ranks: 1 (default) starts each layer's gradient
//                               all-reduce as soon as the backward has finished it, overlapping the rest of the
//                               backward (llmc/adamw.cuh; with LLMC_TRANSPORT=mpi through host memory and MPI's
//                               reducer thread); 0 all-reduces after the backward;
//   LLMC_PROFILE_STEP=N         brackets step N with cudaProfilerStart/Stop, for `ncu --profile-from-start off`
//                               or `nsys profile --capture-range=cudaProfilerApi`.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>

#include "demo/demo_cuda.cuh"
#include "llmc/adamw.cuh"
#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/cuda_common.cuh"
#include "llmc/dataloader.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "llmc/gpt2_cpu.h"
#include "llmc/gpt2_cuda.cuh"
#include "llmc/metrics.h"
#include "llmc/model_io.h"
#include "llmc/optimizer_cuda.cuh"
#include "llmc/rng.h"
#include "llmc/schedule.h"
#include "llmc/tokenizer.h"
#include "llmc/train_common.h"
#include "llmc/transport_nccl.cuh"
#include "llmc/transport_staged.cuh"

namespace {

using namespace llmc;

// The most runs of untouched wte rows AdamW-DDP's overlapped all-reduce starts early over LLMC_TRANSPORT=mpi (the
// longest ones): that transport copies each range to the host on its own. NCCL packs any number into one all-reduce.
constexpr size_t kStagedEarlyWteRanges = 64;

bool env_flag(const char* name, bool default_value) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) != 0 : default_value;
}

// ---- the optimizer hook ---------------------------------------------------------------------------------
// --optimizer adamw: CudaAdamW (llmc/adamw.cuh).
// --optimizer demo: CudaDemo (demo/demo_cuda.cuh): fused compress / apply kernels (demo/demo_kernels.cuh), the
// buckets exchanged with NcclTransport::allgather_device (or through host memory without NCCL; with --demo_delay 1
// the exchange is started at the end of a step and finished in the next one's optimizer step, so it overlaps that
// step's forward and backward), the same state blob as demo::DemoOptimizer so checkpoints move between trainers.
// overlap: the transport's overlapped all-reduce for AdamW-DDP (false: all-reduce after the backward).
std::unique_ptr<DeviceOptimizer> make_device_optimizer(const TrainConfig& cfg, const ParamLayout& layout,
                                                       Transport& transport, CudaEnv& env, bool overlap) {
    if (cfg.optimizer == "demo")
        return std::make_unique<demo::CudaDemo>(cfg.optimizer_config(), layout, transport, env.stream,
                                                env_flag("LLMC_STOCHASTIC_ROUNDING", true), static_cast<uint32_t>(cfg.seed));
    return std::make_unique<CudaAdamW>(cfg.optimizer_config(), layout, transport, env.stream,
                                       env_flag("LLMC_STOCHASTIC_ROUNDING", true), static_cast<uint32_t>(cfg.seed),
                                       overlap);
}

// ---------------------------------------------------------------------------------------------------------

// Autoregressive sample from the end-of-text token, at temperature 1 (the CPU trainer's procedure).
std::string sample_text(GPT2Cuda& model, const TrainConfig& cfg, const TokenizerDecoder& tok, Rng& rng) {
    std::vector<int> tokens = {tok.eot()};
    std::string text;
    const int max_len = std::min(cfg.seq_len, cfg.model.max_seq_len);
    for (int i = 0; i < cfg.sample_tokens; i++) {
        const size_t start = tokens.size() > static_cast<size_t>(max_len) ? tokens.size() - max_len : 0;
        const int T = static_cast<int>(tokens.size() - start);
        // Run a length that is a multiple of 8 (cuBLASLt-friendly attention shapes); causality makes the padding
        // tokens after position T-1 irrelevant to its logits.
        const int T_run = std::min(max_len, (T + 7) / 8 * 8);
        std::vector<int> window(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
        window.resize(T_run, tok.eot());
        model.forward(window.data(), nullptr, 1, T_run);
        const std::vector<float> logits = model.logits_row(static_cast<size_t>(T - 1));
        const int next = sample_token(logits, cfg.model.vocab_size, rng);
        tokens.push_back(next);
        text += tok.decode(next);
    }
    return text;
}

void write_gpu_run_record(const TrainConfig& cfg, int world, int grad_accum, const CudaEnv& env,
                          const GPT2Cuda& model, const demo::KernelChoice& demo_kernels, bool ddp_overlap, int argc,
                          char** argv) {
    nlohmann::ordered_json record = run_record(cfg, world, grad_accum, "train_gpt", argc, argv);
    record["_run"]["device"] = env.describe();
    record["_run"]["precision"] = kFloatXName;
    record["_run"]["stochastic_rounding"] = env_flag("LLMC_STOCHASTIC_ROUNDING", true) && !kFloatXIsFloat;
    record["_run"]["gelu_fusion"] = model.gelu_fusion();
    record["_run"]["attention"] = model.attention_name();
    record["_run"]["matmul_tune"] = env.tune_matmuls;
    record["_run"]["cuda_graph"] = model.cuda_graph();
    record["_run"]["bias_grad"] = model.bias_grad_epilogue() ? "epilogue" : "reduce";
    if (cfg.optimizer == "adamw") record["_run"]["ddp_overlap"] = ddp_overlap;
    if (cfg.optimizer == "demo") {
        record["_run"]["demo_dct"] = demo_kernels.tensor_cores ? "tensor" : "fp32";
        record["_run"]["demo_momentum_domain"] = demo_kernels.dct_momentum ? "dct" : "spatial";
        if (demo_kernels.forced_tuning >= 0) record["_run"]["demo_tuning"] = demo_kernels.forced_tuning;
    }
    write_run_record(cfg.out_dir, record);
}

std::vector<float> download_master(DeviceOptimizer& optimizer, size_t n) {
    std::vector<float> host(n);
    CUDA_CHECK(cudaMemcpy(host.data(), optimizer.master_weights(), n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

int train(TrainConfig cfg, Transport& world_transport, const Launch& launch) {
    const int rank = world_transport.rank(), world = world_transport.world_size();
    const bool main_rank = rank == 0;

    // Batch geometry: total_batch_size tokens per step = B * T * world * grad_accum.
    const int grad_accum = resolve_batch_geometry(cfg, world);
    const int64_t tokens_per_micro = cfg.total_batch_size / grad_accum;
    world_transport.set_collective_timeout(cfg.comm_timeout);  // the NCCL transport takes it from here
    const std::string config_json = config_to_json(cfg, -1);
    check_same_config_everywhere(world_transport, config_json);

    const ParamLayout layout = ParamLayout::gpt2(cfg.model);
    if (cfg.dry_run) {
        if (main_rank) print_dry_run_report(cfg, world);
        return 0;
    }
    (void)flash_attention_from_env(cfg.model);  // a bad LLMC_ATTENTION or LLMC_GELU_FUSION fails here, before
    (void)gelu_fusion_from_env(0);              // any GPU work
    (void)flash_dq_from_env();
    (void)matmul_tune_from_env();
    (void)cuda_graph_from_env();
    (void)bias_grad_epilogue_from_env();
    const demo::KernelChoice demo_kernels = demo::demo_kernels_from_env();  // a bad LLMC_DEMO_DCT/_MOMENTUM/_TUNING fails here too
    const bool overlap_requested = ddp_overlap_from_env();
    if (!cuda_device_present()) fail("no CUDA device found: train_gpt needs an NVIDIA GPU (train_gpt_cpu runs without one)");

    // One GPU per rank; NCCL for the training collectives (world of one: no NCCL at all), or MPI through
    // pinned host memory when LLMC_TRANSPORT=mpi.
    CudaEnv env(local_device_index(rank));
    const char* transport_env = std::getenv("LLMC_TRANSPORT");
    const std::string transport_kind = transport_env ? transport_env : "nccl";
    if (transport_kind != "nccl" && transport_kind != "mpi")
        fail("LLMC_TRANSPORT='" + transport_kind + "' is not a transport: use nccl (default) or mpi");
    std::unique_ptr<Transport> training_transport;
    // AdamW-DDP's all-reduce during the backward, with several ranks (either transport)
    const bool overlap = overlap_requested && cfg.optimizer == "adamw" && world > 1;
    if (transport_kind == "mpi")
        training_transport = std::make_unique<HostStagedTransport>(world_transport, env.stream);
    else
        training_transport = std::make_unique<NcclTransport>(world_transport, env.stream);
    Transport& transport = *training_transport;
    const size_t early_wte_runs = transport_kind == "mpi" ? kStagedEarlyWteRanges : SIZE_MAX;
    GPT2Cuda model(cfg.model, cfg.batch_size, cfg.seq_len, env);
    std::unique_ptr<DeviceOptimizer> optimizer = make_device_optimizer(cfg, layout, transport, env, overlap);
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
                                             sample_rng, state, [&](ByteReader& r) { optimizer->load_state(r); });
    if (start.checkpoint && start.checkpoint->world_size == world) optimizer->set_steps_done(state.step);
    if (!start.weights_loaded) {
        GPT2Cpu init(cfg.model);  // the CPU trainer's seeded init, bit for bit
        init.init_random(static_cast<uint64_t>(cfg.seed));
        const auto p = init.params();
        std::copy(p.begin(), p.end(), weights.begin());
    }
    // fp32 weights -> device (through the gradient buffer, which is fp32 and the same size) -> master + params
    CUDA_CHECK(cudaMemcpy(model.grads(), weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    optimizer->set_weights(model.grads(), model.params());
    model.zero_padded_vocab_rows(optimizer->master_weights());  // eager delayed DeMo: a resumed round's own share
    model.zero_grad();
    weights = std::vector<float>();

    // MFU's peak: --peak_tflops, or the GPU's dense bf16 peak where it is known (bf16 build; the fp32 build's
    // kernels run on other units)
    const double known_peak = std::is_same_v<floatX, float> ? 0.0 : known_peak_bf16_tflops(env.props.name);
    const double peak_tflops = cfg.peak_tflops > 0.0f ? double(cfg.peak_tflops) : known_peak;
    std::unique_ptr<MetricsLog> log;
    if (main_rank) {
        print_config_warnings(cfg);  // legal settings that probably do not do what was meant
        make_dirs(cfg.out_dir);
        write_gpu_run_record(cfg, world, grad_accum, env, model, demo_kernels, overlap, launch.argc, launch.argv);
        log = std::make_unique<MetricsLog>(cfg.out_dir, start.checkpoint ? static_cast<int>(state.step) : -1);
        const std::string optimizer =
            cfg.optimizer == "demo"
                ? "demo (" + demo_kernels.describe() + (cfg.demo_delay ? ", " + demo_delay_phrase(cfg) : "") + ")"
                : cfg.optimizer;
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
    StepReporter reporter(cfg, start_step, log.get(), {gpt2_flops_per_token(layout, cfg.seq_len), peak_tflops},
                          launch.started);
    const char* profile_env = std::getenv("LLMC_PROFILE_STEP");
    const int profile_step = profile_env ? std::atoi(profile_env) : -1;
    const GPT2Cuda::GradsFinal grads_final = [&](std::span<const ParamRange> ranges) {
        optimizer->on_gradients_final(model.grads(), ranges);
    };
    // A step's micro-steps: its loaded batches queued through the forward and backward, the gradients written anew.
    // `wte_early`: the overlapped all-reduce's wte rows the last batch leaves alone on every rank (a host
    // collective, after the ranks agreed that every batch loaded: untouched_wte_ranges, or the agreement on a step
    // queued ahead).
    const auto queue_micro_steps = [&](std::span<const ParamRange> wte_early) {
        transport.reset_counters();
        model.zero_grad();
        for (int micro = 0; micro < grad_accum; micro++) {
            // the last micro-step's backward tells the overlapped all-reduce which gradients are final, layer by
            // layer (only it listens: without it the backward may run as one CUDA graph, LLMC_CUDA_GRAPH)
            const bool last = micro == grad_accum - 1;
            model.queue_forward_backward(inputs[micro].data(), targets[micro].data(), cfg.batch_size, cfg.seq_len,
                                         1.0f / static_cast<float>(grad_accum),
                                         last && overlap ? grads_final : GPT2Cuda::GradsFinal(),
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
        // The step is queued without waiting for the GPU (on one rank; several wait for their collectives): the
        // micro-steps, the optimizer (which clips on the device), the padded rows' reset; then one wait, after
        // which the losses, the norm and the optimizer's errors are read.
        if (!queued_ahead) {
            t0 = StepReporter::Clock::now();
            if (!loaded_ahead) load_batches();
            queue_micro_steps(overlap ? untouched_wte_ranges(transport, layout, inputs.back(), early_wte_runs)
                                      : std::vector<ParamRange>());
        }
        // Nothing due after this step: the next step's micro-steps are queued before this step's results are
        // read, so the GPU goes on to them without waiting for the host (which reports meanwhile). Never past a
        // step with an evaluation, a sample or a checkpoint (they use the model and the data position as this
        // step leaves them) or around the profiled step. Its batches are read now, and with several ranks the
        // ranks' agreement on them (batch_agreement_start) travels during this step's optimizer, which waits
        // for its collective: the host has no latency of its own to wait for between that collective's end and
        // queuing the next step. A batch that fails to load is reported after this step, and then nothing of the
        // next step is queued on any rank: the ranks agree on that first, because a collective's enqueue may wait
        // for its peers (NCCL's lazy connection setup; every collective on the emulated device) while the failing
        // rank waits for them in its report. With several ranks the loss report's all-reduce runs on the host
        // (the world transport, MPI) beside the next step's device work and its collectives (NCCL on the device;
        // the MPI transport's helper threads on communicators of their own), and is finished at the next step's
        // report (StepReporter), so the host does not wait for it either.
        StepDuties due = step_duties(cfg, step);
        // A stop signal or the time limit (on any rank; the ranks learn it together, at the last step's report):
        // this step is the last, with a checkpoint and nothing queued after it (its own batches may have been read
        // already). --checkpoint_every_minutes's checkpoint comes the same way.
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
        model.zero_padded_vocab_rows(optimizer->master_weights());
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
            // The checkpoint holds the fp32 master weights: the same llm.c file the CPU trainer writes.
            const std::vector<float> master = main_rank ? download_master(*optimizer, model.num_params()) : std::vector<float>();
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
