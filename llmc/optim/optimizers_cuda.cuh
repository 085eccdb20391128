// The CUDA trainer's optimizers by the name --optimizer gives, the device twin of optimizers.h: one line per
// optimizer, each built from the same OptimizerConfig as its CPU counterpart (whose state blob it shares).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "llmc/base/error.h"
#include "llmc/comm/transport.h"
#include "llmc/optim/adamw/adamw.cuh"
#include "llmc/optim/demo/demo_cuda.cuh"
#include "llmc/optim/optimizer_cuda.cuh"

namespace llmc {

// `overlap`: AdamW-DDP's all-reduce overlapped with the backward (the trainer reports the final gradient ranges).
inline std::unique_ptr<DeviceOptimizer> make_device_optimizer(const std::string& name, const OptimizerConfig& config,
                                                              const ParamLayout& layout, Transport& transport,
                                                              cudaStream_t stream, bool stochastic_rounding,
                                                              uint32_t seed, bool overlap) {
    LLMC_CHECK(config.shard_group_size == 1 && config.demo.replicate_every == 1,
               "--shard_group_size / --demo_replicate_every: the sharded steps run in train_gpt_cpu only so far");
    if (name == "adamw")
        return std::make_unique<CudaAdamW>(config, layout, transport, stream, stochastic_rounding, seed, overlap);
    if (name == "demo")
        return std::make_unique<demo::CudaDemo>(config, layout, transport, stream, stochastic_rounding, seed);
    fail("--optimizer: '" + name + "' has no CUDA implementation (train_gpt_cpu runs it)");
}

}  // namespace llmc
