// Builds the chunk plans declared in chunk_plan.h.
#include "llmc/optim/demo/chunk_plan.h"

#include <algorithm>
#include <string>

#include "llmc/base/error.h"
#include "llmc/optim/chunking.h"

namespace demo {

size_t chunk_length(size_t size, size_t chunk) {
    LLMC_CHECK(size >= 1, "chunk_length: tensor dimension must be >= 1");
    LLMC_CHECK(chunk >= 1, "--demo_chunk must be >= 1");
    return llmc::largest_divisor_at_most(size, chunk);
}

int index_bytes_for(size_t chunk_elems) {
    if (chunk_elems <= (size_t{1} << 8)) return 1;
    if (chunk_elems <= (size_t{1} << 16)) return 2;
    return 4;
}

TensorPlan plan_tensor(std::span<const size_t> shape, size_t chunk, size_t topk) {
    LLMC_CHECK(!shape.empty(), "demo chunk plan: tensor has no dimensions");
    for (size_t s : shape) LLMC_CHECK(s >= 1, "demo chunk plan: tensor dimension of size 0");
    LLMC_CHECK(chunk >= 1, "--demo_chunk must be >= 1, got " + std::to_string(chunk));
    LLMC_CHECK(topk >= 1, "--demo_topk must be >= 1, got " + std::to_string(topk));
    TensorPlan p;
    if (shape.size() == 1) {
        p.rows = 1;
        p.cols = shape[0];
    } else {
        p.rows = 1;
        for (size_t d = 0; d + 1 < shape.size(); d++) p.rows *= shape[d];
        p.cols = shape.back();
    }
    p.n1 = shape.size() == 1 ? 1 : chunk_length(p.rows, chunk);
    p.n2 = chunk_length(p.cols, chunk);
    p.block_rows = p.rows / p.n1;
    p.block_cols = p.cols / p.n2;
    p.num_chunks = p.block_rows * p.block_cols;
    p.chunk_elems = p.n1 * p.n2;
    p.k = std::clamp<size_t>(topk, 1, p.chunk_elems);
    p.index_bytes = index_bytes_for(p.chunk_elems);
    return p;
}

namespace {
// Adds tensor p (its offset set) to the plan: its first chunk and selection follow the plan's, and the totals grow.
void append_tensor(ModelPlan& m, TensorPlan p) {
    p.chunk_offset = m.total_chunks;
    p.select_offset = m.total_selected;
    m.num_params += p.numel();
    m.total_chunks += p.num_chunks;
    m.total_selected += p.selected();
    m.max_chunk_elems = std::max(m.max_chunk_elems, p.chunk_elems);
    m.max_n = std::max({m.max_n, p.n1, p.n2});
    m.tensors.push_back(p);
}
}  // namespace

ModelPlan plan_model(const std::vector<std::vector<size_t>>& shapes, size_t chunk, size_t topk,
                     std::span<const size_t> offsets) {
    LLMC_CHECK(chunk >= 1, "--demo_chunk must be >= 1, got " + std::to_string(chunk));
    LLMC_CHECK(topk >= 1, "--demo_topk must be >= 1, got " + std::to_string(topk));
    LLMC_CHECK(offsets.empty() || offsets.size() == shapes.size(),
               "demo chunk plan: offsets and shapes differ in count");
    ModelPlan m;
    m.chunk = chunk;
    m.topk = topk;
    size_t next_offset = 0;
    for (size_t t = 0; t < shapes.size(); t++) {
        TensorPlan p = plan_tensor(shapes[t], chunk, topk);
        p.offset = offsets.empty() ? next_offset : offsets[t];
        next_offset = p.offset + p.numel();
        append_tensor(m, p);
    }
    return m;
}

std::vector<size_t> shard_boundaries(const ModelPlan& plan, size_t parts) {
    LLMC_CHECK(parts >= 1, "--shard_group_size must be >= 1");
    size_t expected = 0, block_rows = 0;
    for (const TensorPlan& t : plan.tensors) {
        LLMC_CHECK(t.offset == expected, "DeMo shards: the plan's tensors are not back to back from 0");
        expected += t.numel();
        block_rows += t.block_rows;
    }
    LLMC_CHECK(block_rows >= parts, "--shard_group_size " + std::to_string(parts) + ": the model has only " +
                                        std::to_string(block_rows) + " DeMo block rows to share out");
    // A boundary goes before the first block row at which the chunks so far reach the part's share; each part
    // keeps at least one block row.
    std::vector<size_t> bounds = {0};
    size_t chunks_before = 0, rows_left = block_rows;
    for (const TensorPlan& t : plan.tensors) {
        for (size_t r = 0; r < t.block_rows; r++, rows_left--) {
            const size_t part = bounds.size();  // the boundary looked for next: that of part `part`
            const bool due = part < parts && chunks_before * parts >= part * plan.total_chunks;
            const bool forced = part < parts && rows_left == parts - part;  // one row left per remaining part
            if (chunks_before > 0 && bounds.back() != t.offset + r * t.n1 * t.cols && (due || forced))
                bounds.push_back(t.offset + r * t.n1 * t.cols);
            chunks_before += t.block_cols;
        }
    }
    bounds.push_back(plan.num_params);
    LLMC_CHECK(bounds.size() == parts + 1, "internal: DeMo shards cut into " + std::to_string(bounds.size() - 1) +
                                               " parts, not " + std::to_string(parts));
    return bounds;
}

ModelPlan slice_plan(const ModelPlan& plan, size_t begin, size_t end, std::vector<size_t>* tensors) {
    ModelPlan m;
    m.chunk = plan.chunk;
    m.topk = plan.topk;
    if (tensors) tensors->clear();
    for (size_t i = 0; i < plan.tensors.size(); i++) {
        const TensorPlan& t = plan.tensors[i];
        const size_t row_elems = t.n1 * t.cols;  // one block row
        const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
        if (lo >= hi) continue;
        LLMC_CHECK((lo - t.offset) % row_elems == 0 && (hi - t.offset) % row_elems == 0,
                   "internal: a DeMo shard boundary inside a block row");
        TensorPlan p = t;
        p.rows = (hi - lo) / t.cols;
        p.block_rows = p.rows / p.n1;
        p.num_chunks = p.block_rows * p.block_cols;
        p.offset = lo - begin;
        append_tensor(m, p);
        if (tensors) tensors->push_back(i);
    }
    return m;
}

size_t ModelPlan::tensor_of_chunk(size_t g) const {
    // Last tensor whose first chunk is <= g, skipping tensors without chunks (none exist: every tensor has
    // at least one chunk, but the search stays correct either way).
    auto it = std::upper_bound(tensors.begin(), tensors.end(), g,
                               [](size_t v, const TensorPlan& t) { return v < t.chunk_offset; });
    size_t t = static_cast<size_t>(it - tensors.begin()) - 1;
    while (tensors[t].num_chunks == 0) t--;
    return t;
}

uint64_t ModelPlan::fingerprint() const {
    // FNV-1a over the numbers that define the wire layout.
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](uint64_t v) {
        for (int i = 0; i < 8; i++) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= 0x100000001b3ull;
        }
    };
    mix(tensors.size());
    for (const TensorPlan& t : tensors) {
        mix(t.rows);
        mix(t.cols);
        mix(t.n1);
        mix(t.n2);
        mix(t.k);
    }
    return h;
}

}  // namespace demo
