// CudaDemo: the DeviceOptimizer of --optimizer demo in the CUDA trainer (llmc/optim/optimizer_cuda.cuh), the GPU
// twin of demo::DemoOptimizer (demo_optimizer.h): same options and validation messages, same chunk plan, same
// wire format (codec.h), same state blob (checkpoints move between the CPU and CUDA trainers).
//
// One step (all on the trainer's stream unless noted):
//   clip    deterministic global L2 norm of the LOCAL gradient (global_norm.cuh); the compress kernel takes
//           the clip scale from it on the device                             -> StepTimings::clip (cudaEvents)
//   compress demo_compress_kernel (demo_kernels.cuh): momentum, DCT, top-k, quantization, packing into this
//           rank's bucket, error feedback                               -> StepTimings::transform (cudaEvents)
//           (top-k and packing are fused into that kernel: StepTimings::topk stays 0)
//   exchange NcclTransport::allgather_device when the transport is NCCL (the buckets stay on the GPU);
//           any other Transport (LocalTransport, MPI without NCCL) through host memory with allgather_bytes;
//           every rank's 32-byte header and size are checked with the CPU decoder's messages; the first
//           exchange of a process also exchanges the sizes, the later ones know them (GatherSizes::equal)
//                                          -> StepTimings::exchange (host wall, from the bucket being ready)
//   apply   demo_apply_kernel: scatter-mean, inverse DCT, sign, weight decay, update of the fp32 master
//           weights and their floatX copy                                     -> StepTimings::apply (cudaEvents)
// On one rank step() does not wait for the GPU (--demo_delay 0): the norm stays on the device, and the apply's
// end is complete_step's, which the trainer calls after its own end-of-step wait. With NCCL the gathered headers
// and the apply kernel's error flags are read back into pinned memory behind the apply and checked there
// (headers first: a bucket from a rank with other options gets the CPU decoder's message, not the index errors
// its body causes; the run stops either way before anything is written), and the norm and the kernels' times
// are read then too. With several ranks the host also waits for the all-gather itself (NcclTransport's
// watchdog covers it); the host path waits for its copies. --demo_delay 1's two updates (the pending round's
// apply and the own share) keep their error flags and events apart until complete_step reads them.
// With --demo_delay 1 (the CPU optimizer's order, demo_optimizer.h) the update of step t is applied at step t+1
// and its buckets travel during step t+1's forward and backward: clip; finish the pending round's exchange
// (NcclTransport::allgather_device_finish, or Transport::allgather_bytes_finish and the upload) and apply it
// with its own lr, the weight decay following with this step's lr in the same pass (ApplyParams::decay_after:
// the CPU optimizer decays in its compress, after the apply); compress; start this round's exchange
// (allgather_device_start behind the compress, or allgather_bytes_start from a host copy of the bucket).
// StepTimings::exchange is then the time inside finish and start. One bucket buffer suffices: its all-gather
// is finished before the next compress rewrites it, and the gathered buckets are applied before the next start
// overwrites them. The state blob keeps the pending round (this rank's bucket and lr); a run resumed from it
// exchanges that bucket again at its first step. After the last step, finish_updates applies the last round
// (its lr, no weight decay), so the final weights and checkpoint hold every update and no pending round.
// With --demo_delay 1 and eager updates (config.demo.eager, the default; the CPU optimizer's order again) the
// master weights are the shared weights (identical on every rank; master_weights(), what checkpoints hold) and
// the floatX params this rank's working weights: the shared ones minus lr * sign(decode(this rank's own bucket
// of the pending round)). The step: clip; finish the pending round's exchange; apply it to the master weights
// and decay them with this step's lr, as above but without writing the floatX copy (keep_params); compress;
// start this round's exchange; then the own share: demo_apply_kernel over bucket_ alone (world 1,
// ApplyParams::keep_master, this step's lr, no weight decay) writes params = round(master - lr * sign(decode)),
// the master weights untouched, with the rounding of step t_ (StepTimings::apply covers it too). Its read of
// bucket_ runs beside the all-gather's (NCCL's comm stream reads the same buffer: two reads). set_weights,
// given a pending round (a resume), writes params the same way from bucket_ and the pending lr.
// Memory: master weights, momentum, norm scratch, this rank's bucket, the gathered buckets (world x bucket)
// and the plan's tables are ONE device allocation.
//
// Stochastic rounding of the floatX parameters (bf16 builds, as CudaAdamW) seeds every step from the run's
// seed and a step counter. The DeMo state blob (the CPU's) has no step counter: the trainer restores it with
// set_steps_done() from the checkpoint's training state, so set_weights repeats the last step's rounding (of
// the master weights, or with eager updates of the master weights minus the pending round's own share) and a
// resumed run continues bit-identically.
#pragma once
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llmc/optim/demo/plan_tables.h"
#include "llmc/optim/demo/state_format.h"
#include "llmc/optim/demo/demo_kernels.cuh"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/optim/optimizer_cuda.cuh"
#include "llmc/comm/transport.h"
#include "llmc/comm/transport_nccl.cuh"

namespace demo {

// The kernels the trainer launches, from the config's demo_dct, demo_momentum_domain and demo_kernel_tuning
// (checked by validate_demo_options). The apply is always the lean I/O fp32 kernel (kLeanApplyTuning: the exact
// apply's bits, 0.86 against 1.25 ms at d12 on an H200). The 64 x 64 compress:
//  fp32 + spatial is kDefaultTuning, bit-identical to the host reference (the CPU module's bucket bits);
//  tensor + spatial kTensorLeanTuning, fp32 + dct kDctMomentumTuning, tensor + dct kDctMomentumTensorTuning (the
//  fastest: 1.001 against 1.574 ms at d12, k = 32, on an H100 on 2026-11-27; docs/benchmarks.md). The
//  DCT-domain tunings need 16-byte aligned 64 x 64 rows (every GPT-2 shape; others are refused with a message);
//  the rest fall back to their twins without lean I/O. A forced tuning (demo_kernel_tuning) runs that row of
//  demo::kTunings (and the exact apply when it has no lean I/O).
struct KernelChoice {
    bool tensor_cores = false;  // the compress kernel's DCTs on the tensor cores
    bool dct_momentum = false;  // the 64 x 64 chunks' momentum in the DCT domain (== compress_tuning()'s)
    int forced_tuning = -1;     // demo_kernel_tuning, or -1
    int compress_tuning() const {
        return forced_tuning >= 0 ? forced_tuning
               : dct_momentum     ? (tensor_cores ? kDctMomentumTensorTuning : kDctMomentumTuning)
               : tensor_cores     ? kTensorLeanTuning
                                  : kDefaultTuning;
    }
    int apply_tuning() const {
        return forced_tuning >= 0 && !kTunings[forced_tuning].lean_io ? kExactTuning : kLeanApplyTuning;
    }
    // "DCTs in fp32" / "DCTs on tensor cores, 3xTF32", then ", momentum in the DCT domain" and
    // ", kernel tuning N (<name>)" when forced
    std::string describe() const {
        std::string s = tensor_cores ? "DCTs on tensor cores, 3xTF32" : "DCTs in fp32";
        if (dct_momentum) s += ", momentum in the DCT domain";
        if (forced_tuning >= 0)
            s += ", kernel tuning " + std::to_string(forced_tuning) + " (" + tuning_name(forced_tuning) + ")";
        return s;
    }
};
inline KernelChoice kernel_choice(const llmc::DemoConfig& d) {
    KernelChoice k;
    k.tensor_cores = d.dct == llmc::DemoDct::tensor;
    k.dct_momentum = d.momentum_domain == llmc::DemoMomentumDomain::dct;
    if (d.kernel_tuning >= 0 && d.kernel_tuning < kNumTunings) {  // validate_demo_options refuses others
        k.forced_tuning = d.kernel_tuning;
        k.tensor_cores = kTunings[d.kernel_tuning].tensor_dct;
        k.dct_momentum = kTunings[d.kernel_tuning].dct_momentum;
    }
    return k;
}

// The transforms the kernels run: the DCT (folded by its even/odd symmetry, which a random orthogonal basis lacks)
// and none (identity: --optimizer topk, the kernels' IDENTITY instantiations, which have no DCTs to put on the
// tensor cores, no DCT domain and none of the kernel lab's DCT tunings). One line naming the key otherwise.
inline void check_device_transform(const llmc::DemoConfig& d) {
    if (d.transform == llmc::DemoTransform::random)
        llmc::fail("--demo_transform random: train_gpt's DeMo kernels run the DCT or no transform (train_gpt_cpu runs "
                   "random)");
    if (d.transform != llmc::DemoTransform::identity) return;
    if (d.dct == llmc::DemoDct::tensor)
        llmc::fail("--demo_dct tensor: --optimizer topk has no DCTs to run on the tensor cores (use fp32)");
    if (d.momentum_domain == llmc::DemoMomentumDomain::dct)
        llmc::fail("--demo_momentum_domain dct: --optimizer topk has no transform (its momentum is spatial)");
    if (d.kernel_tuning >= 0)
        llmc::fail("--demo_kernel_tuning: the kernel lab's tunings are DeMo's DCT kernels; --optimizer topk runs its "
                   "own (use -1)");
}

// The weight decay of --demo_delay 1's first step, which has no round to apply (CudaDemo::apply_delayed; later
// steps decay in the apply kernel, ApplyParams::decay_after): x *= wd_factor, the CPU optimizer's rounding.
__global__ void demo_weight_decay_kernel(float* x, size_t n, float wd_factor) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = cm::mul_rn(x[i], wd_factor);
}

// FlexDeMo's step between exchanges: x = x * decay_factor - lr * sign(g) (the CPU's order and rounding).
__global__ void demo_sign_step_kernel(float* x, const float* g, size_t n, float decay_factor, float lr) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float sign = static_cast<float>((g[i] > 0.0f) - (g[i] < 0.0f));
        x[i] = cm::mul_rn(x[i], decay_factor) - lr * sign;
    }
}

class CudaDemo final : public llmc::DeviceOptimizer {
public:
    // transport: NcclTransport (buckets exchanged on the device) or any Transport (through host memory).
    CudaDemo(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout, llmc::Transport& transport,
             cudaStream_t stream, bool stochastic_rounding = true, uint32_t seed = 1337)
        : CudaDemo(config, validated_tables(config, layout), layout.num_params, transport, stream, stochastic_rounding,
                   seed) {}
    // DeMo on `plan`, a plan of `n` parameters (FlexDeMo's shard of a model: slice_plan), whose tensors' weight
    // decay flags are `decays`.
    CudaDemo(const llmc::OptimizerConfig& config, const ModelPlan& plan, const std::vector<uint8_t>& decays, size_t n,
             llmc::Transport& transport, cudaStream_t stream, bool stochastic_rounding, uint32_t seed)
        : CudaDemo(config, validated_tables(config, plan, decays), n, transport, stream, stochastic_rounding, seed) {}

private:
    static cm::PlanTables validated_tables(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout) {
        validate_demo_options(config);
        check_device_transform(config.demo);
        return cm::plan_tables(config, layout);
    }
    static cm::PlanTables validated_tables(const llmc::OptimizerConfig& config, const ModelPlan& plan,
                                           const std::vector<uint8_t>& decays) {
        validate_demo_options(config);
        check_device_transform(config.demo);
        return cm::make_plan_tables(plan, WireFormat{config.demo.values, config.demo.indices}, decays,
                                    config.demo.transform == llmc::DemoTransform::identity);
    }
    CudaDemo(const llmc::OptimizerConfig& config, cm::PlanTables tables, size_t num_params, llmc::Transport& transport,
             cudaStream_t stream, bool stochastic_rounding, uint32_t seed)
        : config_(config), n_(num_params), transport_(transport), stream_(stream),
          stochastic_(stochastic_rounding && !llmc::kFloatXIsFloat), seed_(seed),
          kernel_choice_(kernel_choice(config.demo)), tables_(std::move(tables)) {
        world_ = transport.world_size();
        LLMC_CHECK(world_ >= 1, "DeMo: transport reports no ranks");
        kernels_ = make_kernel_config(tables_, world_);
        prepare_kernels(kernels_, tables_.plan);
        if (kernels_.threads == 256) {
            LLMC_CHECK(!kernel_choice_.dct_momentum || kernels_.vec4_io,
                       "DeMo: the momentum in the DCT domain (--demo_momentum_domain dct) needs every 64 x 64 tensor's "
                       "offset and row length to be multiples of 4; this model's are not (use --demo_momentum_domain "
                       "spatial)");
            if (!tables_.identity) {
                prepare_tuning_at(kernel_choice_.compress_tuning(), kernels_);
                prepare_tuning_at(kernel_choice_.apply_tuning(), kernels_);
            }
        }
        if (tables_.identity) prepare_identity_kernels(kernels_);
        nccl_ = dynamic_cast<llmc::NcclTransport*>(&transport);

        const size_t n = n_, bytes = tables_.bucket_bytes;
        memory_.add(&master_, n);
        memory_.add(&momentum_, n);
        memory_.add(&norm_scratch_, llmc::kNormScratchFloats);
        memory_.add(&bucket_, bytes);
        memory_.add(&gathered_, bytes * size_t(world_));
        const KernelTables kt = kernel_tables(tables_);
        const cm::LaunchTables& order = kt.order;
        memory_.add(&tensors_, order.tensors.size());
        memory_.add(&folded_, kt.folded.size());
        memory_.add(&natural_, tables_.bases.natural.size());
        memory_.add(&error_, 2 * kUpdateSlots);
        header_readback_ = llmc::PinnedHostBuffer<std::byte>(size_t(world_) * kBucketHeaderBytes);
        error_readback_ = llmc::PinnedHostBuffer<uint32_t>(2 * kUpdateSlots);
        memory_.allocate("master weights + DeMo momentum, buckets and tables (" + std::to_string(n) +
                         " parameters x 2 x fp32, " + std::to_string(world_) + " x " + std::to_string(bytes) +
                         " bucket bytes)");
        memory_.zero(stream_);
        upload(tensors_, order.tensors.data(), order.tensors.size() * sizeof(cm::ChunkTensor));
        upload(folded_, kt.folded.data(), kt.folded.size() * sizeof(float));
        upload(natural_, tables_.bases.natural.data(), tables_.bases.natural.size() * sizeof(float));
        upload(bucket_, tables_.header.data(), kBucketHeaderBytes);  // the header never changes
        device_tables_ = demo::device_tables(order, tensors_, folded_, natural_);
        for (size_t t = 0; t < tables_.tensors.size(); t++) {  // the first delayed step's decay, adjacent tensors merged
            if (!tables_.tensors[t].decays) continue;
            const size_t offset = tables_.plan.tensors[t].offset, count = tables_.plan.tensors[t].numel();
            if (!decay_ranges_.empty() && decay_ranges_.back().first + decay_ranges_.back().second == offset)
                decay_ranges_.back().second += count;
            else if (count)
                decay_ranges_.emplace_back(offset, count);
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

public:
    ~CudaDemo() override {
        // the last delayed round's all-gather still reads bucket_ / host_bucket_ and writes gathered_: every rank
        // started it, so it completes (the transport outlives the optimizer)
        if (in_flight_ && (nccl_ || config_.demo.delay == 1)) {
            try {
                if (nccl_)
                    nccl_->allgather_device_finish();
                else
                    transport_.allgather_bytes_finish(host_all_, offsets_);
            } catch (...) {
            }
        }
    }
    CudaDemo(const CudaDemo&) = delete;
    CudaDemo& operator=(const CudaDemo&) = delete;

    std::string_view name() const override { return "demo"; }

    // weights: the shared weights. params: their floatX copy, or with eager updates and a pending round (a
    // resume) the working weights, the master weights minus that round's own share.
    void set_weights(const float* weights, llmc::floatX* params) override {
        const size_t n = n_;
        if (weights != master_)
            CUDA_CHECK(cudaMemcpyAsync(master_, weights, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
        const bool sr = stochastic_ && t_ > 0;
        if (eager() && pending_) {
            // the checkpoint's bucket: its header checked before the kernel reads it at the plan's offsets
            std::vector<std::byte> header(kBucketHeaderBytes);
            CUDA_CHECK(cudaMemcpyAsync(header.data(), bucket_, kBucketHeaderBytes, cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            cm::check_bucket_header(tables_.plan, tables_.format, header, tables_.bucket_bytes, kPendingBucket);
            llmc::StepResult unused;
            apply_own_share(params, pending_lr_, sr);
            finish_updates_queued(unused);
            return;
        }
        if (n) {
            LLMC_LAUNCH(llmc::grid_stride_blocks(n, 512), 512, 0, stream_, demo_round_params_kernel)(params, master_, n,
                                                                                         step_seed(t_), sr);
            CUDA_CHECK_LAUNCH();
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    llmc::StepResult step(llmc::floatX* params, float* grads, float lr) override {
        LLMC_CHECK(!step_pending_, "DeMo: step() again before complete_step() of the last one");
        // the local norm, read back by complete_step; the compress kernel reads the clip coefficient on the device
        const float* clip = clip_norm_.queue(norm_scratch_, grads, n_, config_.grad_clip, stream_);
        given_norm_ = -1.0;
        return step_clipped(params, grads, lr, clip);
    }
    // The sharded step's (FlexDeMo's): the clip coefficient `clip` (on the device) of `norm`, the norm of the
    // node's whole gradient, of which `grads` is this rank's shard; complete_step reports `norm`.
    llmc::StepResult step_with_clip(llmc::floatX* params, float* grads, float lr, const float* clip, double norm) {
        LLMC_CHECK(!step_pending_, "DeMo: step() again before complete_step() of the last one");
        given_norm_ = norm;
        return step_clipped(params, grads, lr, clip);
    }
    // FlexDeMo's step between exchanges (--demo_replicate_every): weight decay, then master -= lr * sign(grads),
    // the floatX copy rounded as a step rounds. Counts as a step (the stochastic rounding's counter).
    void local_sign_step(llmc::floatX* params, const float* grads, float lr) {
        t_++;
        const float wd_factor = cm::apply_params(config_, lr, world_, tables_.bucket_bytes).wd_factor;
        for (size_t t = 0; t < tables_.tensors.size(); t++) {
            const size_t offset = tables_.plan.tensors[t].offset, count = tables_.plan.tensors[t].numel();
            if (count == 0) continue;
            const float factor = config_.weight_decay != 0.0f && tables_.tensors[t].decays ? wd_factor : 1.0f;
            LLMC_LAUNCH(llmc::grid_stride_blocks(count, 512), 512, 0, stream_, demo_sign_step_kernel)(
                master_ + offset, grads + offset, count, factor, lr);
        }
        if (n_)
            LLMC_LAUNCH(llmc::grid_stride_blocks(n_, 512), 512, 0, stream_, demo_round_params_kernel)(
                params, master_, n_, step_seed(t_), stochastic_);
        CUDA_CHECK_LAUNCH();
    }

private:
    llmc::StepResult step_clipped(llmc::floatX* params, float* grads, float lr, const float* clip) {
        step_pending_ = true;
        llmc::StepResult result;
        t_++;

        if (config_.demo.delay == 0) {
            compress(grads, lr, clip, result);
            const auto start = std::chrono::steady_clock::now();
            exchange_start();
            exchange_finish();
            result.seconds.exchange = seconds_since(start);
            apply_gathered(params, cm::apply_params(config_, lr, world_, tables_.bucket_bytes));
            return result;  // complete_step finishes the update
        }
        // --demo_delay 1: the previous round's buckets travelled during this step's forward and backward
        if (pending_) finish_pending_exchange(result);
        apply_delayed(params, lr);
        compress(grads, lr, clip, result);  // after the finish: the previous all-gather no longer reads bucket_
        pending_ = true;
        pending_lr_ = lr;
        const auto start = std::chrono::steady_clock::now();
        exchange_start();
        result.seconds.exchange += seconds_since(start);
        if (eager()) apply_own_share(params, lr, stochastic_);  // while the all-gather runs
        return result;  // complete_step finishes both updates
    }

public:

    // The step's updates finished (finish_updates: the gathered headers and the apply kernels' error flags
    // checked, their times read, the compress kernel's too); the local norm and its GPU time (StepTimings::clip).
    void complete_step(llmc::StepResult& result) override {
        if (!step_pending_) return;
        step_pending_ = false;
        finish_updates_queued(result);
        if (given_norm_ >= 0.0) result.grad_norm = given_norm_;
        else clip_norm_.read(result.grad_norm, result.seconds.clip);
    }

    // --demo_delay 1 after the last step: finish the pending round's exchange and apply it with its own lr and
    // no weight decay (the next step's compress would have decayed), writing the master weights and the floatX
    // copy (rounded as step t_ rounds): eager working weights become the shared ones. No pending round: nothing.
    void finish_updates(llmc::floatX* params, llmc::StepResult& result) override {
        if (!pending_) return;
        finish_updates_queued(result);  // the last step's (its slots are needed)
        finish_pending_exchange(result);
        cm::ApplyParams ap = cm::apply_params(config_, pending_lr_, world_, tables_.bucket_bytes);
        ap.apply_wd = false;
        apply_gathered(params, ap);
        finish_updates_queued(result);
        pending_ = false;
    }

    float* master_weights() override { return master_; }

    // The state blob records the momentum's domain (a dct_momentum tuning's is saved as it is, and read_state
    // converts a blob of the other domain).
    // A pending round (--demo_delay 1) is saved as this rank's bucket (its all-gather, if in flight, only reads
    // it) and lr, as the CPU optimizer saves it.
    void save_state(llmc::ByteWriter& out) const override {
        std::vector<float> m(n_);
        CUDA_CHECK(cudaMemcpyAsync(m.data(), momentum_, m.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        PendingRound pending;
        if (pending_) {
            pending.present = true;
            pending.lr = pending_lr_;
            pending.bucket.resize(tables_.bucket_bytes);
            CUDA_CHECK(cudaMemcpyAsync(pending.bucket.data(), bucket_, tables_.bucket_bytes, cudaMemcpyDeviceToHost, stream_));
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        cm::write_state(out, tables_.plan, m, momentum_domain(), pending);
    }

    // A pending round goes back into bucket_, its exchange not started: the first step starts it.
    void load_state(llmc::ByteReader& in) override {
        LLMC_CHECK(!in_flight_, "DeMo: load_state while a delayed round's all-gather is in flight");
        std::vector<float> m;
        PendingRound pending;
        cm::read_state(in, tables_.plan, m, momentum_domain(), pending, config_.demo.delay == 1, tables_.bucket_bytes);
        upload(momentum_, m.data(), m.size() * sizeof(float));
        if (pending.present) upload(bucket_, pending.bucket.data(), pending.bucket.size());
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        pending_ = pending.present;
        pending_lr_ = pending.lr;
        t_ = 0;
    }
    void set_steps_done(int64_t steps) override { t_ = steps; }

    // For checkers and tests.
    const cm::PlanTables& tables() const { return tables_; }
    const ModelPlan& plan() const { return tables_.plan; }
    size_t bucket_bytes() const { return tables_.bucket_bytes; }
    float* momentum() { return momentum_; }
    const uint8_t* bucket() const { return bucket_; }
    const uint8_t* gathered() const { return gathered_; }
    const KernelConfig& kernel_config() const { return kernels_; }
    const DeviceTables& device_tables() const { return device_tables_; }
    bool exchanges_on_device() const { return nccl_ != nullptr; }
    bool has_pending_round() const { return pending_; }  // --demo_delay 1: compressed, not yet applied
    // Where the 64 x 64 chunks' momentum lives on the device (--demo_momentum_domain, or the forced tuning's).
    cm::MomentumDomain momentum_domain() const {
        return kernels_.threads == 256 && kernel_choice_.dct_momentum
                   ? cm::MomentumDomain::dct64
                   : cm::MomentumDomain::spatial;
    }

private:
    static constexpr const char* kPendingBucket = "DeMo: this rank's pending bucket";
    // --demo_delay 1 with eager updates (config.demo.eager): the working weights take the own share at once
    bool eager() const { return config_.demo.delay == 1 && config_.demo.eager; }
    static double seconds_since(std::chrono::steady_clock::time_point s) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    }
    uint32_t step_seed(int64_t t) const {
        return llmc::km::squirrel_noise5(static_cast<uint32_t>(t), seed_ ^ 0x44654d6fu);
    }
    template <typename T>
    void upload(T* dst, const void* src, size_t bytes) {
        if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    }

    // This step's gradient into this rank's bucket (header stays, body zeroed for the OR-ed bit parts), the
    // momentum and error feedback updated; compress_start_ .. compress_end_ time it (StepTimings::transform, read by
    // read_compress_time after the step's next wait).
    // The clip coefficient comes from the device (`clip`, global_norm_for_clip_async).
    void compress(float* grads, float lr, const float* clip, llmc::StepResult& result) {
        const size_t bytes = tables_.bucket_bytes;
        CUDA_CHECK(cudaMemsetAsync(bucket_ + kBucketHeaderBytes, 0, bytes - kBucketHeaderBytes, stream_));
        compress_start_.record(stream_);
        cm::CompressParams cp = cm::compress_params(config_, lr, 1.0f);
        cp.clip_device = clip;
        if (tables_.identity)
            launch_identity_compress(kernels_, device_tables_, momentum_, grads, bucket_, cp, stream_);
        else
            launch_compress_at(kernel_choice_.compress_tuning(), kernels_, device_tables_, momentum_, grads,
                               bucket_, cp, stream_);
        compress_end_.record(stream_);
        compress_timed_ = true;
        result.seconds.topk = 0.0;  // fused into the compress kernel (counted in transform)
    }
    void read_compress_time(llmc::StepResult& result) {
        compress_end_.synchronize();  // done already after finish_updates_queued's wait
        result.seconds.transform = compress_end_.ms_since(compress_start_) * 1e-3;
        compress_timed_ = false;
    }

    // The gathered buckets (gathered_) applied with the rounding of step t_.
    void apply_gathered(llmc::floatX* params, const cm::ApplyParams& ap) { apply_buckets(gathered_, params, ap, stochastic_); }

    // The updates of a step are queued, not waited for: each takes the next of kUpdateSlots slots (its error
    // words on the device and their pinned readback, two events timing it), and finish_updates_queued, after the
    // caller's wait (complete_step) or its own, checks and times them in queue order.
    struct UpdateSlot {
        bool checked = false;         // an apply kernel ran: its error flags are read
        const char* whose = nullptr;  // names the buckets in its errors (nullptr: the rank the kernel names)
    };
    static constexpr int kUpdateSlots = 2;  // --demo_delay 1 with eager updates: the pending round's, the own share
    UpdateSlot& next_update_slot() {
        LLMC_CHECK(queued_updates_ < kUpdateSlots, "DeMo: more updates queued in one step than it has slots for");
        UpdateSlot& u = updates_[queued_updates_];
        u = UpdateSlot{};
        update_start_[queued_updates_].record(stream_);
        return u;
    }
    void end_update_slot() {
        update_end_[queued_updates_].record(stream_);
        queued_updates_++;
    }

    // The apply kernel over `buckets` (`whose` names them in its errors), its error flags read back behind it.
    void apply_buckets(const uint8_t* buckets, llmc::floatX* params, const cm::ApplyParams& ap, bool stochastic,
                       const char* whose = nullptr) {
        const int slot = queued_updates_;
        UpdateSlot& u = next_update_slot();
        u.checked = true;
        u.whose = whose;
        // the error flags and the lowest failing rank (UINT32_MAX: none), set on the device
        uint32_t* error = error_ + 2 * slot;
        CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(uint32_t), stream_));
        CUDA_CHECK(cudaMemsetAsync(error + 1, 0xff, sizeof(uint32_t), stream_));
        if (tables_.identity)
            launch_identity_apply(kernels_, device_tables_, buckets, master_, params, ap, step_seed(t_), stochastic,
                                  error, stream_);
        else
            launch_apply_at(kernel_choice_.apply_tuning(), kernels_, device_tables_, buckets, master_, params, ap,
                            step_seed(t_), stochastic, error, stream_);
        CUDA_CHECK(cudaMemcpyAsync(error_readback_.data() + 2 * slot, error, 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                   stream_));
        end_update_slot();
    }

    // Eager delayed updates: params = master - lr * sign(decode(bucket_ alone)) (the scatter-mean over one rank
    // is its values; no weight decay), rounded as step t_ rounds, the master weights unchanged (StepTimings::apply
    // covers it). bucket_ is this rank's own (valid) bucket or, in set_weights, the checkpoint's: the kernel's
    // error flags are checked all the same.
    void apply_own_share(llmc::floatX* params, float lr, bool stochastic) {
        cm::ApplyParams ap = cm::apply_params(config_, lr, 1, tables_.bucket_bytes);
        ap.apply_wd = false;
        ap.keep_master = true;
        apply_buckets(bucket_, params, ap, stochastic, kPendingBucket);
    }

    // --demo_delay 1's update, in the CPU optimizer's order (it decays the weights in its compress, after the
    // previous round's apply): the pending round's gathered buckets with their own lr, then the weight decay
    // with this step's `lr` (ApplyParams::decay_after: one pass), the floatX copy written from the result with
    // the rounding of step t_ (what set_weights repeats on a resume). With eager updates the apply leaves the
    // floatX copy alone (keep_params): the own share (apply_own_share, after the compress) rewrites it. The first
    // step has no round to apply: a decay pass, then (stale) a rounding pass.
    void apply_delayed(llmc::floatX* params, float lr) {
        const size_t n = n_;
        if (pending_) {
            cm::ApplyParams ap = cm::apply_params(config_, pending_lr_, world_, tables_.bucket_bytes);
            ap.wd_factor = cm::apply_params(config_, lr, world_, tables_.bucket_bytes).wd_factor;
            ap.decay_after = true;
            ap.keep_params = eager();
            apply_gathered(params, ap);
            return;
        }
        next_update_slot();
        if (config_.weight_decay != 0.0f) {
            const float wd_factor = cm::apply_params(config_, lr, world_, tables_.bucket_bytes).wd_factor;
            for (const auto& [offset, count] : decay_ranges_) {
                LLMC_LAUNCH(llmc::grid_stride_blocks(count, 512), 512, 0, stream_, demo_weight_decay_kernel)(
                    master_ + offset, count, wd_factor);
            }
        }
        if (n && !eager()) {
            LLMC_LAUNCH(llmc::grid_stride_blocks(n, 512), 512, 0, stream_, demo_round_params_kernel)(params, master_, n,
                                                                                         step_seed(t_), stochastic_);
        }
        CUDA_CHECK_LAUNCH();
        end_update_slot();
    }

    // Waits for the queued updates (nothing left to wait for after the caller's wait), not for what the caller
    // queued after them (the trainer's next micro-steps); checks the gathered headers read back before them
    // (exchange_finish), then each update's error flags in queue order: a corrupt bucket is reported as its slot's
    // `whose`, else by the rank the kernel names. Adds their GPU times to StepTimings::apply and reads the
    // compress kernel's time if it is due.
    void finish_updates_queued(llmc::StepResult& result) {
        const int queued = std::exchange(queued_updates_, 0);
        if (queued > 0)
            update_end_[queued - 1].synchronize();
        else
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (headers_pending_) {
            headers_pending_ = false;
            check_headers(std::span<const std::byte>(header_readback_.data(), header_readback_.size()));
        }
        for (int i = 0; i < queued; i++) {
            result.seconds.apply += update_end_[i].ms_since(update_start_[i]) * 1e-3;
            const uint32_t* error = error_readback_.data() + 2 * i;
            if (!updates_[i].checked || error[0] == 0) continue;
            const std::string who =
                updates_[i].whose ? std::string(updates_[i].whose) : "DeMo bucket from rank " + std::to_string(error[1]);
            if (error[0] & cm::kErrIndexRange) llmc::fail(who + ": coefficient index outside its chunk (corrupt DeMo bucket)");
            llmc::fail(who + ": coefficient indices of a chunk not strictly ascending (corrupt DeMo bucket)");
        }
        if (compress_timed_) read_compress_time(result);
    }

    // The exchange of bucket_, every rank's bucket into gathered_ (rank r at r * bucket_bytes), in two halves.
    // start: NCCL enqueues the all-gather behind the compute stream's work (the compress); any other transport
    // gets a host copy of the bucket (host_bucket_, untouched until finish). With --demo_delay 0 the host path
    // runs the blocking allgather_bytes here (finish only checks), so an undelayed run keeps its collective.
    void exchange_start() {
        const size_t bytes = tables_.bucket_bytes;
        if (nccl_) {
            nccl_->allgather_device_start(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bucket_), bytes),
                                          reinterpret_cast<std::byte*>(gathered_), bytes * size_t(world_), offsets_,
                                          gather_sizes_);
        } else {
            host_bucket_.resize(bytes);
            CUDA_CHECK(cudaMemcpyAsync(host_bucket_.data(), bucket_, bytes, cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            if (config_.demo.delay == 0)
                transport_.allgather_bytes(host_bucket_, host_all_, offsets_, gather_sizes_);
            else
                transport_.allgather_bytes_start(host_bucket_, gather_sizes_);
        }
        in_flight_ = true;
    }
    // --demo_delay 1: the pending round's exchange finished (started first if load_state brought the round),
    // its time added to StepTimings::exchange.
    void finish_pending_exchange(llmc::StepResult& result) {
        const auto start = std::chrono::steady_clock::now();
        if (!in_flight_) exchange_start();
        exchange_finish();
        result.seconds.exchange += seconds_since(start);
    }
    // finish: the all-gather's end; every rank's header and size checked (NCCL: after the update's wait, from the
    // copies queued here; see the top of the file), and (host path) the buckets uploaded. Once the sizes were all
    // this rank's, the next exchanges skip the size exchange (gather_sizes_).
    void exchange_finish() {
        const size_t bytes = tables_.bucket_bytes;
        in_flight_ = false;
        if (config_.demo.delay == 1 && !nccl_) transport_.allgather_bytes_finish(host_all_, offsets_);
        gather_sizes_ = llmc::next_gather_sizes(offsets_, bytes);
        if (nccl_) {
            // the compute stream waits for the broadcasts (with several ranks, the host too)
            nccl_->allgather_device_finish(false);
            std::memset(header_readback_.data(), 0, header_readback_.size());
            for (int r = 0; r < world_; r++)
                if (offsets_[size_t(r) + 1] - offsets_[size_t(r)] >= kBucketHeaderBytes)
                    CUDA_CHECK(cudaMemcpyAsync(header_readback_.data() + size_t(r) * kBucketHeaderBytes,
                                               gathered_ + offsets_[size_t(r)], kBucketHeaderBytes,
                                               cudaMemcpyDeviceToHost, stream_));
            headers_pending_ = true;
            return;
        }
        LLMC_CHECK(offsets_.size() == size_t(world_) + 1, "DeMo: all-gather returned a wrong number of buckets");
        std::vector<std::byte> headers(size_t(world_) * kBucketHeaderBytes);
        for (int r = 0; r < world_; r++) {
            const size_t size = offsets_[size_t(r) + 1] - offsets_[size_t(r)];
            if (size >= kBucketHeaderBytes)
                std::memcpy(headers.data() + size_t(r) * kBucketHeaderBytes, host_all_.data() + offsets_[size_t(r)],
                            kBucketHeaderBytes);
        }
        check_headers(headers);
        // every size checked: the buckets are back to back at r * bytes
        CUDA_CHECK(cudaMemcpyAsync(gathered_, host_all_.data(), bytes * size_t(world_), cudaMemcpyHostToDevice,
                                   stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // host_all_ may change before the copy ran otherwise
    }
    // Every rank's header (world_ x kBucketHeaderBytes, zeros for a bucket shorter than one) and size.
    void check_headers(std::span<const std::byte> headers) const {
        for (int r = 0; r < world_; r++)
            cm::check_bucket_header(tables_.plan, tables_.format,
                                    headers.subspan(size_t(r) * kBucketHeaderBytes, kBucketHeaderBytes),
                                    offsets_[size_t(r) + 1] - offsets_[size_t(r)], "DeMo bucket from rank " + std::to_string(r));
    }

    llmc::OptimizerConfig config_;
    size_t n_ = 0;  // parameters: the model's, or the shard's
    llmc::Transport& transport_;
    cudaStream_t stream_;
    bool stochastic_;
    uint32_t seed_;
    KernelChoice kernel_choice_;  // demo_dct, demo_momentum_domain, demo_kernel_tuning
    cm::PlanTables tables_;
    int world_ = 1;
    KernelConfig kernels_;
    DeviceTables device_tables_;
    llmc::NcclTransport* nccl_ = nullptr;
    llmc::DeviceArena memory_;
    float* master_ = nullptr;
    float* momentum_ = nullptr;
    float* norm_scratch_ = nullptr;
    uint8_t* bucket_ = nullptr;
    uint8_t* gathered_ = nullptr;
    cm::ChunkTensor* tensors_ = nullptr;
    float* folded_ = nullptr;
    float* natural_ = nullptr;
    uint32_t* error_ = nullptr;
    llmc::PinnedHostBuffer<std::byte> header_readback_;  // the gathered headers, checked after the update's wait
    llmc::PinnedHostBuffer<uint32_t> error_readback_;    // the apply kernel's error flags and rank
    bool headers_pending_ = false;  // header_readback_ holds headers not yet checked
    bool compress_timed_ = false;   // compress_start_ .. compress_end_ hold a compress whose time is not yet read
    llmc::TimedCudaEvent compress_start_, compress_end_;
    llmc::TimedCudaEvent update_start_[kUpdateSlots], update_end_[kUpdateSlots];  // each queued update, timed
    UpdateSlot updates_[kUpdateSlots];
    int queued_updates_ = 0;  // updates queued since the last finish_updates_queued
    llmc::QueuedClipNorm clip_norm_;
    bool step_pending_ = false;  // step() ran, complete_step() not yet
    double given_norm_ = -1.0;   // step_with_clip's norm (-1: step()'s own, from clip_norm_)
    std::vector<std::byte> host_bucket_, host_all_;
    std::vector<size_t> offsets_;
    // The first exchange of a process learns the bucket sizes; once every rank's matched (a bucket's size follows
    // from the plan and the wire format) the later ones skip the size exchange: with NCCL, a start that never
    // blocks the host.
    llmc::GatherSizes gather_sizes_ = llmc::GatherSizes::exchange;
    std::vector<std::pair<size_t, size_t>> decay_ranges_;  // (offset, count) of the weight-decayed parameters
    int64_t t_ = 0;  // steps done (the stochastic rounding's step counter)
    // --demo_delay 1: a round compressed into bucket_ and not yet applied, its lr, and whether its exchange was
    // started (false after load_state: the next step starts it)
    bool pending_ = false;
    float pending_lr_ = 0.0f;
    bool in_flight_ = false;
};

}  // namespace demo
