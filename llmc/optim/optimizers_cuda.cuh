// The CUDA trainer's optimizers by the name --optimizer gives, the device twin of optimizers.h: one line per
// optimizer, each built from the same OptimizerConfig as its CPU counterpart (whose state blob it shares).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "llmc/base/error.h"
#include "llmc/comm/transport.h"
#include "llmc/optim/adamw/adamw.cuh"
#include "llmc/comm/topology.h"
#include "llmc/optim/demo/demo_cuda.cuh"
#include "llmc/optim/demo/flexdemo_cuda.cuh"
#include "llmc/optim/diloco/diloco_cuda.cuh"
#include "llmc/optim/optimizer_cuda.cuh"

namespace llmc {

// Throws the one-line refusal for an optimizer registered for the CPU trainer only (signum): train_gpt calls it before
// it touches the GPU, so the message comes first on any machine.
inline void check_device_optimizer(const std::string& name) {
    if (name != "adamw" && name != "demo" && name != "diloco")
        fail("--optimizer: '" + name + "' has no CUDA implementation (train_gpt_cpu runs it)");
}

// `overlap`: AdamW-DDP's all-reduce overlapped with the backward (the trainer reports the final gradient ranges).
// --shard_group_size S > 1 (resolved here, a collective: auto asks the transport for the ranks on a host): sharded
// AdamW (ZeRO-1 at S = world), and FlexDeMo for demo (also at S = 1 with --demo_replicate_every > 1).
inline std::unique_ptr<DeviceOptimizer> make_device_optimizer(const std::string& name, const OptimizerConfig& config,
                                                              const ParamLayout& layout, Transport& transport,
                                                              cudaStream_t stream, bool stochastic_rounding,
                                                              uint32_t seed, bool overlap) {
    check_device_optimizer(name);
    // The kernels fold every DCT by its even/odd symmetry, which a random orthogonal basis lacks.
    if (name == "demo" && config.demo.transform != DemoTransform::dct)
        fail("--demo_transform random: train_gpt's DeMo kernels run the DCT only (train_gpt_cpu runs random)");
    if (name == "diloco")
        return std::make_unique<CudaDiloco>(config, layout, transport, stream, stochastic_rounding, seed);
    const int group_size = resolve_shard_group_size(transport, config.shard_group_size);
    if (name == "adamw")
        return std::make_unique<CudaAdamW>(config, layout, transport, stream, stochastic_rounding, seed, overlap,
                                           group_size);
    if (group_size == 1 && config.demo.replicate_every == 1)
        return std::make_unique<demo::CudaDemo>(config, layout, transport, stream, stochastic_rounding, seed);
    return std::make_unique<demo::CudaFlexDemo>(config, layout, transport, group_size, stream, stochastic_rounding,
                                                seed);
}

}  // namespace llmc
