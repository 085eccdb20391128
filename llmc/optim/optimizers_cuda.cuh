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
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/demo/flexdemo_cuda.cuh"
#include "llmc/optim/diloco/diloco_cuda.cuh"
#include "llmc/optim/optimizer_cuda.cuh"

namespace llmc {

// The config an optimizer of the DeMo family runs with: --optimizer topk is DeMo with no transform (demo::as_topk,
// the CPU registry's rule), which the kernels' IDENTITY instantiations run.
inline OptimizerConfig device_optimizer_config(const std::string& name, const OptimizerConfig& config) {
    return name == "topk" ? demo::as_topk(config) : config;
}

// Throws the one-line refusal for an optimizer registered for the CPU trainer only (signum), sparseloco with a
// --diloco_wire other than fp32 (the CPU's refusal), or a DeMo transform
// or kernel option the kernels do not run (--demo_transform random; topk with the DCT kernels' options; the
// entropy-coded indices, which the kernels do not pack; --demo_diagnostics): train_gpt calls it before it touches the GPU, so the
// message comes first on any machine.
inline void check_device_optimizer(const std::string& name, const OptimizerConfig& config) {
    if (name != "adamw" && name != "demo" && name != "topk" && name != "diloco" && name != "sparseloco")
        fail("--optimizer: '" + name + "' has no CUDA implementation (train_gpt_cpu runs it)");
    if (name == "sparseloco") check_sparseloco_wire(config);  // before any GPU work, as the CPU trainer's message
    if (name == "adamw" || name == "diloco" || name == "sparseloco") return;  // no DeMo kernels
    demo::check_device_transform(device_optimizer_config(name, config).demo);
    if (config.demo.diagnostics > 0) fail("--demo_diagnostics: CPU trainer only for now (train_gpt_cpu runs it)");
    if (config.demo.indices == DemoIndexEncoding::entropy)
        fail("--demo_indices entropy: train_gpt's DeMo kernels pack auto and packed12 indices only (train_gpt_cpu runs "
             "it)");
}

// `overlap`: AdamW-DDP's all-reduce overlapped with the backward (the trainer reports the final gradient ranges).
// --shard_group_size S > 1 (resolved here, a collective: auto asks the transport for the ranks on a host): sharded
// AdamW (ZeRO-1 at S = world), and FlexDeMo for demo and topk (also at S = 1 with --demo_replicate_every > 1).
inline std::unique_ptr<DeviceOptimizer> make_device_optimizer(const std::string& name, const OptimizerConfig& given,
                                                              const ParamLayout& layout, Transport& transport,
                                                              cudaStream_t stream, bool stochastic_rounding,
                                                              uint32_t seed, bool overlap) {
    check_device_optimizer(name, given);
    const OptimizerConfig config = device_optimizer_config(name, given);
    if (name == "diloco" || name == "sparseloco")  // sparseloco: DiLoCo with the CPU's SparseLoCo wire (host)
        return std::make_unique<CudaDiloco>(config, layout, transport, stream, stochastic_rounding, seed, name);
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
