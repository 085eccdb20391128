// Communication volume of one training step per rank: AdamW-DDP's gradient all-reduce versus DeMo's bucket
// in the reference wire format (int64 index + fp32 value per coefficient) and in ours (every value and index
// encoding of llmc/optim/demo/codec.h, headers and padding included). Used by the demo_report tool and by the trainer's
// --dry-run; the paper's OLMo shapes reproduce the byte counts of the DeMo paper's configs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "llmc/model/param_layout.h"
#include "llmc/optim/optimizer.h"

namespace demo {

struct NamedShape {
    std::string name;
    std::vector<size_t> shape;
};

// Every tensor of the model's layout (any family: GPT-2's biases and LayerNorm parameters included), in buffer order.
std::vector<NamedShape> model_shapes(const llmc::ModelConfig& config);
// The paper's OLMo models ("300m": d 1024, "1b": d 2048; 16 layers each): per layer fused QKV [3d, d],
// attention out [d, d], SwiGLU ff_proj [8d, d] (d -> 8d, split in two halves), ff_out [d, 4d]; a tied
// embedding [50304, d]; no biases, no LayerNorm parameters. Throws llmc::Error naming --paper otherwise.
std::vector<NamedShape> olmo_paper_shapes(const std::string& which);

struct TrafficOptions {
    int world_size = 64;
    int chunk = 64;
    std::vector<int> topks = {1, 2, 4, 8, 16, 32};
};

// DeMo volumes at one k, in bytes per rank per step.
struct DemoTraffic {
    int topk = 0;
    uint64_t reference = 0;  // chunks * k * (8 + 4)
    // ours[value][index]: value 0 fp32, 1 bf16, 2 sign; index 0 smallest, 1 packed12 (0 when not valid), 2 entropy
    uint64_t ours[3][3] = {};
    bool packed12_valid = false;
};

struct TrafficSummary {
    size_t tensors = 0;
    uint64_t params = 0;
    uint64_t chunks = 0;
    size_t max_chunk_elems = 0;
    uint64_t grad_fp32 = 0, grad_bf16 = 0;            // the gradient, AdamW-DDP's payload
    uint64_t allreduce_fp32 = 0, allreduce_bf16 = 0;  // ring all-reduce bytes sent: 2 (W-1)/W n bytes
    std::vector<DemoTraffic> demo;                    // one per TrafficOptions::topks
};

// Throws llmc::Error naming --world, --chunk or --topk for values < 1.
TrafficSummary summarize_traffic(const std::vector<NamedShape>& shapes, const TrafficOptions& options);

// The tables: model summary, AdamW-DDP volumes, DeMo MB per k and encoding, and AdamW/DeMo ratios.
// MB = 1e6 bytes.
void print_traffic_report(std::ostream& out, const std::string& title, const std::vector<NamedShape>& shapes,
                          const TrafficOptions& options);

}  // namespace demo
