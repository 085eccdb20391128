// DiLoCo on the GPU (--optimizer diloco in train_gpt): the CPU Diloco of diloco.h (its header is the spec) with
// every buffer on the device.
//  - Inner step: this rank's own gradient norm (QueuedClipNorm: the clip coefficient stays on the device, the host
//    does not wait) and km::adamw_update on the local fp32 master weights, the floatX parameters written from them
//    with round-to-nearest-even or stochastic rounding (noise from the flat index and a per-step seed).
//  - Outer step, at steps divisible by H: delta = global - local (one kernel), its mean over the ranks
//    (average_pseudo_gradient: the wire), then buf = mu buf + delta; update = delta + mu buf;
//    global -= outer_lr update; local = global, params = rounding of global (one kernel).
//  - The wire: fp32 Transport::allreduce_mean and bf16 allreduce_mean_bf16 on the device buffer (NCCL, or the
//    host-staged MPI transport); int8: a kernel cuts the pseudo-gradient into the CPU's blocks and writes the CPU's
//    message (fp32 scales, then int8 values), NcclTransport::allgather_device (or allgather_bytes through host
//    memory) gathers the W messages, and a kernel sums float(q) * s over the ranks in rank order, times 1 / W.
//    Division and rounding are IEEE (__fdiv_rn, rintf: --use_fast_math would make '/' approximate), products and
//    sums unfused, so the messages are the CPU's bit for bit for the same delta. A new pseudo-gradient wire is one
//    more case of average_pseudo_gradient.
//  - --optimizer sparseloco (sparseloco.h): the CPU's SparseLocoWire itself, staged through the host in this first
//    version: at a sync the device delta is copied to pinned host memory, the CPU object runs the whole exchange
//    there (its error feedback in host memory, top-k, 2-bit values, Transport::allgather_bytes through host
//    memory, the median-norm clip, the mean), and the mean is copied back for the Nesterov kernel. So the
//    arithmetic and the bytes are the CPU trainer's; the compression costs host time once per H inner steps.
//    Device kernels for the encoder and decoder are future work.
//  - Weights: master_ (the local fp32 weights the forward's floatX params round) and global_, momentum_, m_, v_,
//    delta_ in one allocation. master_weights() is global_ (the model file of a checkpoint, --weight_check_every);
//    the state blob is the CPU Diloco's, local weights included (then SparseLoCo's error feedback, the host wire's
//    own save_state), so checkpoints move between the two trainers.
#pragma once
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/kernel_math.h"
#include "llmc/comm/transport.h"
#include "llmc/comm/transport_nccl.cuh"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/global_norm.cuh"
#include "llmc/optim/diloco/diloco.h"
#include "llmc/optim/diloco/sparseloco.h"
#include "llmc/optim/optimizer_cuda.cuh"

namespace llmc {

// Rounded float arithmetic no compiler fuses or approximates (nvcc contracts a*b+c and, under --use_fast_math,
// approximates '/'; g++ -march=native contracts too, which matters on the emulated device).
__device__ __forceinline__ float diloco_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    volatile float r = a * b;
    return r;
#endif
}
__device__ __forceinline__ float diloco_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}
__device__ __forceinline__ float diloco_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    volatile float r = a / b;
    return r;
#endif
}

// The inner AdamW step of [0, n) of already-offset pointers; `noise_offset`: the range's flat offset. The clip
// coefficient comes from the device (`clip`). `write_params` false at a sync step, whose outer step writes them.
__global__ void diloco_inner_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                                    km::AdamWParams h, const float* clip, uint64_t noise_offset, uint32_t seed,
                                    bool stochastic, bool write_params) {
    h.grad_scale = *clip;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        float mi = m[i], vi = v[i];
        const float p = km::adamw_update(master[i], grads[i], mi, vi, h);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (!write_params) continue;
        if (stochastic) store_stochastic(params + i, p, noise_offset + i, seed);
        else params[i] = from_float<floatX>(p);
    }
}

__global__ void diloco_delta_kernel(float* delta, const float* global, const float* local, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        delta[i] = global[i] - local[i];
}

// One CUDA block per int8 block b = [begin[b], end[b]) of the flat buffer: its absmax scale (NaN if it holds a
// non-finite value, 0 if all zero) and its values rint(x / s) clamped to [-127, 127] (diloco.h).
constexpr int kDilocoThreads = 256;
__global__ void diloco_int8_encode_kernel(const float* x, const uint64_t* begin, const uint64_t* end, float* scales,
                                          int8_t* values) {
    __shared__ float absmax[kDilocoThreads];
    __shared__ int finite[kDilocoThreads];
    const size_t lo = begin[blockIdx.x], hi = end[blockIdx.x];
    float a = 0.0f;
    int f = 1;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float ax = fabsf(x[i]);
        f &= ax <= FLT_MAX ? 1 : 0;  // false for inf and NaN
        a = fmaxf(a, ax);
    }
    absmax[threadIdx.x] = a;
    finite[threadIdx.x] = f;
    __syncthreads();
    for (unsigned stride = kDilocoThreads / 2; stride > 0; stride /= 2) {  // max and AND: exact in any order
        if (threadIdx.x < stride) {
            absmax[threadIdx.x] = fmaxf(absmax[threadIdx.x], absmax[threadIdx.x + stride]);
            finite[threadIdx.x] &= finite[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float s = finite[0] ? diloco_div(absmax[0], 127.0f) : km::bits_to_float(0x7fc00000u);
    if (threadIdx.x == 0) scales[blockIdx.x] = s;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float q = s > 0.0f ? fminf(fmaxf(rintf(diloco_div(x[i], s)), -127.0f), 127.0f) : 0.0f;
        values[i] = static_cast<int8_t>(q);
    }
}

// delta[i] = (sum over ranks r in rank order of float(q_r[i]) * s_r[b]) * inv_world over the W gathered messages
// (rank r's at r * message_bytes: `blocks` scales, then n values), one CUDA block per int8 block b.
__global__ void diloco_int8_mean_kernel(float* delta, const std::byte* gathered, size_t message_bytes, size_t blocks,
                                        int world, const uint64_t* begin, const uint64_t* end, float inv_world) {
    const size_t b = blockIdx.x, lo = begin[b], hi = end[b];
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float sum = 0.0f;
        for (int r = 0; r < world; r++) {
            const std::byte* msg = gathered + size_t(r) * message_bytes;
            float s;  // a scale of rank r > 0 need not be 4-byte aligned (messages of 4 blocks + n bytes)
            memcpy(&s, msg + b * sizeof(float), sizeof s);
            const int8_t q = static_cast<int8_t>(msg[blocks * sizeof(float) + i]);
            sum = diloco_add(sum, diloco_mul(static_cast<float>(q), s));
        }
        delta[i] = diloco_mul(sum, inv_world);
    }
}

// The outer Nesterov step (torch.optim.SGD(nesterov=True)) on the global weights; the local weights restart there.
__global__ void diloco_outer_kernel(floatX* params, float* master, float* global, float* momentum, const float* delta,
                                    size_t n, float mu, float outer_lr, uint32_t seed, bool stochastic) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float d = delta[i];
        const float buf = diloco_add(diloco_mul(mu, momentum[i]), d);
        momentum[i] = buf;
        const float update = diloco_add(d, diloco_mul(mu, buf));
        const float g = global[i] - diloco_mul(outer_lr, update);
        global[i] = g;
        master[i] = g;
        if (stochastic) store_stochastic(params + i, g, i, seed);
        else params[i] = from_float<floatX>(g);
    }
}

__global__ void diloco_round_kernel(floatX* params, const float* master, size_t n, uint32_t seed, bool stochastic) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        if (stochastic) store_stochastic(params + i, master[i], i, seed);
        else params[i] = from_float<floatX>(master[i]);
    }
}

// mismatch <- 1 where a[i] and b[i] differ in any bit (a resume's model file against the blob's global weights).
__global__ void diloco_differs_kernel(const float* a, const float* b, size_t n, unsigned* mismatch) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        if (km::float_to_bits(a[i]) != km::float_to_bits(b[i])) atomicOr(mismatch, 1u);
}

class CudaDiloco final : public DeviceOptimizer {
public:
    // transport: collectives on device pointers (NcclTransport, HostStagedTransport). name: "diloco" (the
    // --diloco_wire formats on the device) or "sparseloco" (the CPU's SparseLocoWire on a host copy of the delta).
    CudaDiloco(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport, cudaStream_t stream,
               bool stochastic_rounding, uint32_t seed, std::string_view name = "diloco")
        : config_(config), layout_(layout), transport_(transport), stream_(stream),
          stochastic_(stochastic_rounding && !kFloatXIsFloat), seed_(seed), n_(layout.num_params),
          world_(transport.world_size()) {
        LLMC_CHECK(name == "diloco" || name == "sparseloco", "CudaDiloco: no wire named '" + std::string(name) + "'");
        validate_diloco_options(config);
        if (name == "sparseloco") {  // validates the sparseloco_* keys and refuses --diloco_wire other than fp32
            host_wire_ = std::make_unique<SparseLocoWire>(config, layout, transport);
            host_delta_ = PinnedHostBuffer<float>(n_);
        }
        LLMC_CHECK(config.shard_group_size == 1, "--shard_group_size: diloco runs one replica per rank (1, got " +
                                                     std::to_string(config.shard_group_size) + ")");
        nccl_ = dynamic_cast<NcclTransport*>(&transport);
        for (const ParamTensor& t : layout.tensors) {  // runs of same-decay tensors: one launch each
            const bool d = decays(t, config.decay_groups);
            if (!ranges_.empty() && ranges_.back().decays == d && ranges_.back().offset + ranges_.back().numel == t.offset)
                ranges_.back().numel += t.numel;
            else
                ranges_.push_back({t.offset, t.numel, d});
        }
        std::vector<uint64_t> begin, end;
        if (int8()) {
            for (const ParamTensor& t : layout.tensors)
                for (size_t lo = 0; lo < t.numel; lo += kDilocoInt8Block) {
                    begin.push_back(t.offset + lo);
                    end.push_back(t.offset + std::min(t.numel, lo + kDilocoInt8Block));
                }
            blocks_ = begin.size();
            message_bytes_ = blocks_ * sizeof(float) + n_;
        }
        const size_t n = n_;
        for (float** buffer : {&master_, &global_, &momentum_, &m_, &v_, &delta_}) memory_.add(buffer, n);
        memory_.add(&norm_scratch_, kNormScratchFloats);
        memory_.add(&mismatch_, 1);
        memory_.add(&block_begin_, blocks_);
        memory_.add(&block_end_, blocks_);
        memory_.add(&message_, message_bytes_);
        memory_.add(&gathered_, message_bytes_ * size_t(world_));
        memory_.allocate("DiLoCo local and global weights + state (" + std::to_string(n) + " parameters x 6 x fp32" +
                         (int8() ? ", int8 messages of " + std::to_string(world_) + " ranks" : std::string()) + ")");
        memory_.zero(stream_);
        if (blocks_) {
            CUDA_CHECK(cudaMemcpyAsync(block_begin_, begin.data(), blocks_ * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
            CUDA_CHECK(cudaMemcpyAsync(block_end_, end.data(), blocks_ * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
        }
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    CudaDiloco(const CudaDiloco&) = delete;
    CudaDiloco& operator=(const CudaDiloco&) = delete;

    std::string_view name() const override { return host_wire_ ? host_wire_->name() : "diloco"; }

    // Fresh: `weights` become the global and the local weights. After load_state: `weights` (the checkpoint's model
    // file) must be the blob's global weights; the blob's local ones are already in master_. The parameters get the
    // rounding the last step gave them (step t's seed: the inner and the outer kernel round the same way).
    void set_weights(const float* weights, floatX* params) override {
        const size_t n = n_;
        if (!loaded_) {
            CUDA_CHECK(cudaMemcpyAsync(global_, weights, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
            CUDA_CHECK(cudaMemcpyAsync(master_, weights, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
        } else {
            unsigned differs = 0;
            CUDA_CHECK(cudaMemsetAsync(mismatch_, 0, sizeof(unsigned), stream_));
            launch(diloco_differs_kernel, n, weights, global_, n, mismatch_);
            CUDA_CHECK(cudaMemcpyAsync(&differs, mismatch_, sizeof differs, cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            LLMC_CHECK(differs == 0, "diloco: the checkpoint's model file is not its optimizer state's global weights");
            loaded_ = false;
        }
        launch(diloco_round_kernel, n, params, master_, n, step_seed(steps_), stochastic_ && steps_ > 0);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    StepResult step(floatX* params, float* grads, float lr) override {
        LLMC_CHECK(!step_pending_, "DiLoCo: step() again before complete_step() of the last one");
        LLMC_CHECK(!loaded_, "diloco: step() before set_weights() took the checkpoint's weights");
        StepResult result;
        // this rank's own gradient: nothing is exchanged inside a round
        const float* clip = clip_norm_.queue(norm_scratch_, grads, n_, config_.grad_clip, stream_);
        steps_++;
        const bool sync = steps_ % config_.diloco.inner_steps == 0;
        const uint32_t seed = step_seed(steps_);
        const AdamWConfig& a = config_.adamw;
        inner_start_.record(stream_);
        for (const Range& r : ranges_) {
            const km::AdamWParams h =
                km::adamw_params(lr, a.beta1, a.beta2, a.eps, config_.weight_decay, r.decays, steps_, 1.0f);
            launch(diloco_inner_kernel, r.numel, params + r.offset, master_ + r.offset, grads + r.offset,
                   m_ + r.offset, v_ + r.offset, r.numel, h, clip, uint64_t(r.offset), seed, stochastic_, !sync);
        }
        inner_end_.record(stream_);
        step_pending_ = true;
        outer_timed_ = sync;
        if (sync) outer_step(params, seed, result.seconds);
        return result;
    }

    // The norm before clipping, the GPU times of the norm (clip) and of the inner update and outer step (apply).
    void complete_step(StepResult& result) override {
        if (!step_pending_) return;
        step_pending_ = false;
        (outer_timed_ ? outer_end_ : inner_end_).synchronize();
        clip_norm_.read(result.grad_norm, result.seconds.clip);
        result.seconds.apply += inner_end_.ms_since(inner_start_) * 1e-3;
        if (outer_timed_) result.seconds.apply += outer_end_.ms_since(outer_start_) * 1e-3;
    }

    // The global weights: identical on every rank at every step (the model file, --weight_check_every).
    float* master_weights() override { return global_; }

    void save_state(ByteWriter& out) const override {
        const size_t n = n_;
        const size_t wire_bytes = host_wire_ ? host_wire_->state_bytes() : 0;
        out.reserve(out.bytes().size() + 128 + 5 * n * sizeof(float) + wire_bytes);
        out.put_string(std::string(name()));
        out.put<uint64_t>(n);
        out.put<uint32_t>(static_cast<uint32_t>(config_.diloco.inner_steps));
        out.put<int64_t>(steps_);
        out.put<int64_t>(steps_);  // the inner AdamW's t: every step is one inner step
        // the CPU blob's order; the local weights last (master_: before set_weights, the blob's that load_state put)
        for (const float* buffer : {global_, momentum_, m_, v_, master_}) {  // each copied before the next put
            std::byte* slot = out.put_array_space<float>(n);
            CUDA_CHECK(cudaMemcpyAsync(slot, buffer, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
        if (host_wire_) host_wire_->save_state(out);
    }

    void load_state(ByteReader& in) override {
        const std::string name = in.get_string("optimizer name");
        const std::string mine(this->name());
        LLMC_CHECK(name == mine, in.source() + ": optimizer state is for '" + name + "', not '" + mine +
                                     "' (use the checkpointed run's --optimizer)");
        const uint64_t n = in.get<uint64_t>("parameter count");
        LLMC_CHECK(n == n_, in.source() + ": optimizer state has " + std::to_string(n) + " parameters, model has " +
                                std::to_string(n_));
        const uint32_t h = in.get<uint32_t>("inner steps");
        LLMC_CHECK(static_cast<int>(h) == config_.diloco.inner_steps,
                   in.source() + ": DiLoCo state of rounds of " + std::to_string(h) + " steps; this run has " +
                       std::to_string(config_.diloco.inner_steps) + " (--diloco_inner_steps)");
        const int64_t steps = in.get<int64_t>("step count"), t = in.get<int64_t>("inner step count");
        LLMC_CHECK(steps >= 0 && t == steps, in.source() + ": DiLoCo state with step count " + std::to_string(steps) +
                                                 " and inner AdamW step count " + std::to_string(t));
        // every array checked before any is copied, so a truncated blob leaves the state as it was
        const char* what[] = {"diloco global weights", "diloco outer momentum", "diloco inner first moment",
                              "diloco inner second moment", "diloco local weights"};
        float* into[] = {global_, momentum_, m_, v_, master_};
        const std::byte* from[5];
        for (int k = 0; k < 5; k++) from[k] = in.get_array_space<float>(n_, what[k]);
        if (host_wire_) host_wire_->load_state(in);  // SparseLoCo's error feedback (host memory), after Diloco's
        for (int k = 0; k < 5; k++)
            CUDA_CHECK(cudaMemcpyAsync(into[k], from[k], n_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        steps_ = steps;
        loaded_ = true;
    }

    int64_t steps() const { return steps_; }

private:
    // The sync: the pseudo-gradient, its mean over the ranks, the outer step on the global weights (queued), whose
    // kernel also puts the local weights and the parameters back at the global ones.
    void outer_step(floatX* params, uint32_t seed, StepTimings& seconds) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the inner update done: its time is not the sync's
        auto start = std::chrono::steady_clock::now();
        launch(diloco_delta_kernel, n_, delta_, global_, master_, n_);
        if (int8() && blocks_)
            LLMC_LAUNCH(static_cast<int>(blocks_), kDilocoThreads, 0, stream_, diloco_int8_encode_kernel)(
                delta_, block_begin_, block_end_, reinterpret_cast<float*>(message_),
                reinterpret_cast<int8_t*>(message_ + blocks_ * sizeof(float)));
        CUDA_CHECK_LAUNCH();
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // the collectives read buffers whose producers are complete
        seconds.transform += seconds_since(start);

        average_pseudo_gradient(seconds);

        start = std::chrono::steady_clock::now();
        if (int8() && blocks_)
            LLMC_LAUNCH(static_cast<int>(blocks_), kDilocoThreads, 0, stream_, diloco_int8_mean_kernel)(
                delta_, gathered_, message_bytes_, blocks_, world_, block_begin_, block_end_,
                1.0f / static_cast<float>(world_));
        CUDA_CHECK_LAUNCH();
        outer_start_.record(stream_);
        launch(diloco_outer_kernel, n_, params, master_, global_, momentum_, delta_, n_, config_.diloco.outer_momentum,
               config_.diloco.outer_lr, seed, stochastic_);
        outer_end_.record(stream_);
        seconds.apply += seconds_since(start);  // the host's share; complete_step adds the GPU time
    }

    // delta_ <- the mean over ranks of delta_ (fp32, bf16, sparseloco), or the W int8 messages into gathered_
    // (int8: the mean kernel decodes them). The one place a pseudo-gradient wire lives: a new one is a case here
    // (and its codec). Adds the collective's time to seconds.exchange (sparseloco: the host wire's own split, the
    // copies to and from the host in transform and apply).
    void average_pseudo_gradient(StepTimings& seconds) {
        if (host_wire_) {  // staged through the host: the CPU's SparseLoCo exchange on a copy of the delta
            auto start = std::chrono::steady_clock::now();
            const size_t bytes = n_ * sizeof(float);
            CUDA_CHECK(cudaMemcpyAsync(host_delta_.data(), delta_, bytes, cudaMemcpyDeviceToHost, stream_));
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            seconds.transform += seconds_since(start);
            host_wire_->average(std::span<float>(host_delta_.data(), n_), seconds);
            start = std::chrono::steady_clock::now();
            // queued: the outer kernel behind it reads the mean; host_delta_ is next written after a later sync
            CUDA_CHECK(cudaMemcpyAsync(delta_, host_delta_.data(), bytes, cudaMemcpyHostToDevice, stream_));
            seconds.apply += seconds_since(start);
            return;
        }
        const auto start = std::chrono::steady_clock::now();
        average_on_device();
        seconds.exchange += seconds_since(start);
    }

    // The --diloco_wire formats: the collective on the device buffers.
    void average_on_device() {
        const std::span<float> delta(delta_, n_);
        switch (config_.diloco.wire) {
            case DilocoWire::fp32: transport_.allreduce_mean(delta); return;
            case DilocoWire::bf16: transport_.allreduce_mean_bf16(delta); return;
            case DilocoWire::int8: break;
        }
        const std::span<const std::byte> mine(message_, message_bytes_);
        if (nccl_) {
            nccl_->allgather_device(mine, gathered_, message_bytes_ * size_t(world_), offsets_, GatherSizes::exchange);
        } else {
            host_message_.resize(message_bytes_);
            CUDA_CHECK(cudaMemcpy(host_message_.data(), message_, message_bytes_, cudaMemcpyDeviceToHost));
            transport_.allgather_bytes(host_message_, host_all_, offsets_, GatherSizes::exchange);
            LLMC_CHECK(host_all_.size() <= message_bytes_ * size_t(world_), "diloco: int8 messages too large");
            CUDA_CHECK(cudaMemcpy(gathered_, host_all_.data(), host_all_.size(), cudaMemcpyHostToDevice));
        }
        LLMC_CHECK(offsets_.size() == size_t(world_) + 1, "diloco: the int8 all-gather's offsets");
        for (int r = 0; r < world_; r++)
            LLMC_CHECK(offsets_[r + 1] - offsets_[r] == message_bytes_,
                       "diloco: an int8 pseudo-gradient of " + std::to_string(offsets_[r + 1] - offsets_[r]) +
                           " bytes from rank " + std::to_string(r) + ", expected " + std::to_string(message_bytes_));
    }

    template <typename Kernel, typename... Args>
    void launch(Kernel kernel, size_t n, Args... args) {
        if (n == 0) return;
        LLMC_LAUNCH(grid_stride_blocks(n, 512), 512, 0, stream_, kernel)(args...);
        CUDA_CHECK_LAUNCH();
    }
    // The stochastic-rounding seed of step t (1-based), derived from the run's seed.
    uint32_t step_seed(int64_t t) const { return km::squirrel_noise5(static_cast<uint32_t>(t), seed_ ^ 0x44694c6fu); }
    bool int8() const { return config_.diloco.wire == DilocoWire::int8; }
    static double seconds_since(std::chrono::steady_clock::time_point s) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    }

    struct Range {
        size_t offset, numel;
        bool decays;
    };
    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    NcclTransport* nccl_ = nullptr;  // the int8 messages stay on the device when the transport is NCCL
    cudaStream_t stream_;
    bool stochastic_;
    uint32_t seed_;
    size_t n_;
    int world_;
    std::vector<Range> ranges_;
    DeviceArena memory_;
    float *master_ = nullptr, *global_ = nullptr, *momentum_ = nullptr, *m_ = nullptr, *v_ = nullptr,
          *delta_ = nullptr, *norm_scratch_ = nullptr;
    unsigned* mismatch_ = nullptr;
    // int8 wire: the blocks' flat [begin, end), this rank's message and the W gathered ones (device), host copies
    size_t blocks_ = 0, message_bytes_ = 0;
    uint64_t *block_begin_ = nullptr, *block_end_ = nullptr;
    std::byte *message_ = nullptr, *gathered_ = nullptr;
    std::vector<std::byte> host_message_, host_all_;
    std::vector<size_t> offsets_;
    // sparseloco: the CPU wire (its error feedback in host memory) and the pinned host copy of the delta it averages
    std::unique_ptr<PseudoGradientWire> host_wire_;
    PinnedHostBuffer<float> host_delta_;
    QueuedClipNorm clip_norm_;
    TimedCudaEvent inner_start_, inner_end_, outer_start_, outer_end_;
    bool step_pending_ = false, outer_timed_ = false;
    int64_t steps_ = 0;    // completed steps (= the inner AdamW's t)
    bool loaded_ = false;  // load_state ran, set_weights not yet
};

}  // namespace llmc
