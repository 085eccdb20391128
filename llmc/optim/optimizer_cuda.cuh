// The device-side optimizer interface of the CUDA trainer: llmc::Optimizer (optimizer.h) for device buffers.
// Parameters are floatX on the device (what the kernels read); gradients are fp32 on the device; the
// optimizer owns the fp32 master weights (and its state) in one allocation, and writes the floatX parameters
// from them after every update. As on the CPU, the optimizer owns data parallelism: it receives this rank's
// LOCAL gradient and talks to the other ranks only through a Transport whose collectives accept device
// pointers (NcclTransport, transport_nccl.cuh; LocalTransport for one rank).
//
// Implementations: CudaAdamW (adamw.cuh) and CudaDemo (llmc/optim/demo/demo_cuda.cuh: momentum, DCT encode, top-k and
// packing fused per chunk, the bucket exchange through NcclTransport::allgather_device or host memory, then
// scatter-mean, inverse DCT and the sign update on the master weights), CudaDiloco (llmc/optim/diloco/diloco_cuda.cuh:
// local inner AdamW steps, the pseudo-gradient's exchange at syncs); optimizers_cuda.cuh picks one in
// make_device_optimizer.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/base/fileio.h"
#include "llmc/comm/transport.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

class DeviceOptimizer {
public:
    virtual ~DeviceOptimizer() = default;
    virtual std::string_view name() const = 0;
    // Installs the weights: `weights` (fp32, device, layout.num_params) become the master weights and `params`
    // their floatX rounding (the rounding the last step used, so a resumed run continues bit-identically).
    // Call after load_state() when resuming.
    virtual void set_weights(const float* weights, floatX* params) = 0;
    // One step on this rank's local gradient `grads` (fp32, device; may be modified: averaged, clipped).
    // Updates the master weights and rewrites `params`. `lr` is this step's scheduled learning rate.
    // step() enqueues the update on the stream and returns without waiting for the GPU where it can (the
    // gradient clip reads the norm on the device): the GPU never idles while the host reads a result back.
    // What the host learns from the step's device work (its gradient norm, the GPU time of its parts, a corrupt
    // bucket its kernels found) complete_step() fills in, after the caller's own wait for the step (the
    // trainer's end of step), and before the next step.
    virtual StepResult step(floatX* params, float* grads, float lr) = 0;
    // Waits for the last step's device work (nothing left to wait for after the caller's wait for the step's end),
    // not for work queued after it (the trainer's next micro-steps), then completes `result` (that step's
    // StepResult), or throws what its kernels found wrong. Once per step.
    virtual void complete_step(StepResult& /*result*/) {}
    // step(), then complete_step(): for callers without an end of step of their own (tests, labs).
    StepResult step_completed(floatX* params, float* grads, float lr) {
        StepResult result = step(params, grads, lr);
        complete_step(result);
        return result;
    }
    // Called during the last backward before step() (on the host, in backward order) with ranges of `grads`
    // that no later kernel of this step writes: an optimizer may start exchanging them while the backward goes
    // on. Every range of the buffer is reported exactly once per step, or none is (the trainer may not
    // call this at all). The default ignores it.
    virtual void on_gradients_final(float* /*grads*/, std::span<const ParamRange> /*ranges*/) {}
    // After the last step: folds in any update still in flight (Optimizer::finish_updates, the CPU
    // interface's rule), rewriting the master weights and `params`; its time is added to `result`.
    virtual void finish_updates(floatX* /*params*/, StepResult& /*result*/) {}
    // The fp32 master weights on the device (model checkpoints are written from these; the trainer also
    // re-zeroes the padded vocabulary rows of wte in them after each step, as the CPU trainer does). A sharded
    // step holds only its shard: it refuses this; master_shard() and download_master_weights() serve every kind.
    virtual float* master_weights() = 0;
    // The master weights this rank holds: [begin, begin + count) of the flat layout at `data` (all of them, from
    // 0, for an optimizer that is not sharded: count SIZE_MAX).
    struct MasterShard {
        float* data = nullptr;
        size_t begin = 0, count = SIZE_MAX;
    };
    virtual MasterShard master_shard() { return {master_weights(), 0, SIZE_MAX}; }
    // All n master weights on the host where `wanted` (else an empty vector). A sharded step gathers them over its
    // node through `scratch` (device, n floats, overwritten: the trainer's gradient buffer between steps); then
    // every rank must call it, wanted or not.
    virtual std::vector<float> download_master_weights(size_t n, float* /*scratch*/, bool wanted) {
        std::vector<float> host(wanted ? n : 0);
        if (wanted) CUDA_CHECK(cudaMemcpy(host.data(), master_weights(), n * sizeof(float), cudaMemcpyDeviceToHost));
        return host;
    }
    // The ranks whose weights must agree bit for bit after every step (llmc::Optimizer::weight_group's rule).
    virtual Transport& weight_group(Transport& world) { return world; }
    // Same blobs as the CPU optimizers, so checkpoints move between the CPU and CUDA trainers.
    virtual void save_state(ByteWriter& out) const = 0;
    virtual void load_state(ByteReader& in) = 0;
    // Steps already taken, from the checkpoint's training state, for optimizers whose state blob does not
    // carry the count (DeMo's, shared with the CPU): it seeds the stochastic rounding of the steps to come.
    // Call after load_state() and before set_weights() when resuming.
    virtual void set_steps_done(int64_t /*steps*/) {}
};

}  // namespace llmc
