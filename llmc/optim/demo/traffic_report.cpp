// Traffic report (see traffic_report.h). Sizes come from the same chunk plan and codec formulas the
// optimizer uses, so the report cannot drift from what actually crosses the network.
#include "llmc/optim/demo/traffic_report.h"

#include <cstdio>
#include <string>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/base/error.h"

namespace demo {

std::vector<NamedShape> model_shapes(const llmc::ModelConfig& config) {
    const llmc::ParamLayout layout = llmc::ParamLayout::of(config);
    std::vector<NamedShape> shapes;
    for (const llmc::ParamTensor& t : layout.tensors) shapes.push_back({t.name, t.shape});
    return shapes;
}

std::vector<NamedShape> olmo_paper_shapes(const std::string& which) {
    size_t d = 0;
    if (which == "300m") d = 1024;
    else if (which == "1b") d = 2048;
    else llmc::fail("--paper must be 300m or 1b (got '" + which + "')");
    const size_t layers = 16, vocab = 50304;
    std::vector<NamedShape> shapes;
    shapes.push_back({"wte.weight (tied)", {vocab, d}});
    for (size_t l = 0; l < layers; l++) {
        const std::string p = "blocks." + std::to_string(l) + ".";
        shapes.push_back({p + "att_proj.weight", {3 * d, d}});
        shapes.push_back({p + "attn_out.weight", {d, d}});
        shapes.push_back({p + "ff_proj.weight", {8 * d, d}});
        shapes.push_back({p + "ff_out.weight", {d, 4 * d}});
    }
    return shapes;
}

TrafficSummary summarize_traffic(const std::vector<NamedShape>& shapes, const TrafficOptions& options) {
    LLMC_CHECK(options.world_size >= 1, "--world must be >= 1 (got " + std::to_string(options.world_size) + ")");
    LLMC_CHECK(options.chunk >= 1, "--chunk must be >= 1 (got " + std::to_string(options.chunk) + ")");
    std::vector<std::vector<size_t>> dims;
    for (const NamedShape& s : shapes) dims.push_back(s.shape);
    TrafficSummary sum;
    const ModelPlan base = plan_model(dims, static_cast<size_t>(options.chunk), 1);
    sum.tensors = shapes.size();
    sum.params = base.num_params;
    sum.chunks = base.total_chunks;
    sum.max_chunk_elems = base.max_chunk_elems;
    sum.grad_fp32 = sum.params * 4;
    sum.grad_bf16 = sum.params * 2;
    const uint64_t w = static_cast<uint64_t>(options.world_size);
    sum.allreduce_fp32 = 2 * (w - 1) * sum.grad_fp32 / w;
    sum.allreduce_bf16 = 2 * (w - 1) * sum.grad_bf16 / w;
    const llmc::DemoValueEncoding values[3] = {llmc::DemoValueEncoding::fp32, llmc::DemoValueEncoding::bf16,
                                               llmc::DemoValueEncoding::sign};
    const llmc::DemoIndexEncoding indices[3] = {llmc::DemoIndexEncoding::smallest, llmc::DemoIndexEncoding::packed12,
                                                llmc::DemoIndexEncoding::entropy};
    for (int k : options.topks) {
        LLMC_CHECK(k >= 1, "--topk must be >= 1 (got " + std::to_string(k) + ")");
        const ModelPlan plan = plan_model(dims, static_cast<size_t>(options.chunk), static_cast<size_t>(k));
        DemoTraffic t;
        t.topk = k;
        t.reference = reference_bytes(plan);
        t.packed12_valid = plan.max_chunk_elems <= kPacked12MaxChunkElems;
        for (int v = 0; v < 3; v++)
            for (int i = 0; i < 3; i++)
                if (i != 1 || t.packed12_valid) t.ours[v][i] = bucket_bytes(plan, WireFormat{values[v], indices[i]});
        sum.demo.push_back(t);
    }
    return sum;
}

namespace {

std::string fmt(const char* format, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v);
    return buf;
}

double mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

}  // namespace

void print_traffic_report(std::ostream& out, const std::string& title, const std::vector<NamedShape>& shapes,
                          const TrafficOptions& options) {
    const TrafficSummary s = summarize_traffic(shapes, options);
    out << "DeMo traffic report: " << title << "\n";
    out << "  tensors " << s.tensors << ", parameters " << llmc::with_commas(s.params) << ", chunk " << options.chunk
        << ": " << llmc::with_commas(s.chunks) << " chunks (largest " << s.max_chunk_elems << " elements)\n";
    out << "  MB = 1e6 bytes per rank per step. DeMo counts the rank's own bucket (its all-gather payload, the\n"
           "  paper's measure; each rank also receives the other W-1 buckets).\n\n";
    out << "AdamW-DDP, world size " << options.world_size << ":\n";
    out << "  gradient (payload)                 fp32 " << fmt("%10.3f", mb(s.grad_fp32)) << " MB   bf16 "
        << fmt("%10.3f", mb(s.grad_bf16)) << " MB\n";
    out << "  ring all-reduce sent, 2(W-1)/W n   fp32 " << fmt("%10.3f", mb(s.allreduce_fp32)) << " MB   bf16 "
        << fmt("%10.3f", mb(s.allreduce_bf16)) << " MB\n\n";

    const char* columns[10] = {"reference", "fp32+u16", "bf16+u16", "sign+u16", "fp32+p12", "bf16+p12", "sign+p12",
                               "fp32+ef",   "bf16+ef",  "sign+ef"};
    auto header = [&](const char* what) {
        out << what << "\n     k";
        for (const char* c : columns) out << std::string(12 - std::string(c).size(), ' ') << c;
        out << "\n";
    };
    auto cell = [&](const DemoTraffic& t, int col) -> uint64_t {
        if (col == 0) return t.reference;
        const int v = (col - 1) % 3, i = (col - 1) / 3;
        return t.ours[v][i];
    };
    header("DeMo MB per step per rank (reference = int64 index + fp32 value per coefficient; ours = value\n"
           "encoding + index encoding (u16 = smallest integer, u8/u16/u32 by chunk size; p12 = 12-bit packed;\n"
           "ef = entropy, Elias-Fano per chunk), 32-byte header and 4-byte padding per part included):");
    for (const DemoTraffic& t : s.demo) {
        out << fmt("%6.0f", t.topk);
        for (int col = 0; col < 10; col++) {
            const uint64_t b = cell(t, col);
            out << (col > 0 && b == 0 ? std::string("         n/a") : fmt("%12.3f", mb(b)));
        }
        out << "\n";
    }
    out << "\n";
    header("Ratio AdamW-DDP (ring all-reduce, fp32) / DeMo:");
    for (const DemoTraffic& t : s.demo) {
        out << fmt("%6.0f", t.topk);
        for (int col = 0; col < 10; col++) {
            const uint64_t b = cell(t, col);
            out << (b == 0 ? std::string("         n/a")
                           : fmt("%11.1fx", static_cast<double>(s.allreduce_fp32) / static_cast<double>(b)));
        }
        out << "\n";
    }
    out << "\n";
    header("Ratio reference / ours (bytes saved by the encoding alone):");
    for (const DemoTraffic& t : s.demo) {
        out << fmt("%6.0f", t.topk);
        for (int col = 0; col < 10; col++) {
            const uint64_t b = cell(t, col);
            out << (b == 0 ? std::string("         n/a")
                           : fmt("%11.2fx", static_cast<double>(t.reference) / static_cast<double>(b)));
        }
        out << "\n";
    }
}

}  // namespace demo
