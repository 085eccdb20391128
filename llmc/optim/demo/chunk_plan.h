// How DeMo cuts each parameter tensor into DCT chunks, and how many coefficients each chunk sends. Pure host
// code (no OpenMP, no BLAS): the CPU optimizer, the CUDA kernels, the wire codec and the traffic report all
// derive their sizes from this one plan, so they cannot disagree.
//
// Rules (those of the DeMo paper's reference implementation):
// - Per dimension of size s, the chunk length is the largest divisor of s that is <= chunk; s itself when
//   s <= chunk. A prime s > chunk gets length 1 (that dimension is not compressed).
// - A 2-D tensor [R, C] is cut into (R/n1) x (C/n2) blocks of n1 x n2; chunk c = i * (C/n2) + j for block
//   row i and block column j; inside a block, coefficient (b, d) has flat index b * n2 + d.
// - A 1-D tensor [S] is treated as the 2-D tensor [1, S]: n1 = 1 (the size-1 DCT is the identity), so its
//   chunks are the S/n2 pieces of n2 and the flat index is just the position in the piece.
// - Our extension, not in the reference: a tensor with more than 2 dimensions is viewed as 2-D by flattening
//   all leading dimensions into rows ([a, b, c] -> [a*b, c]), the way a Linear layer sees its input.
// - A chunk of 1 x 1 (prime sizes in both dimensions) is valid: its DCT is the identity, k = 1, so the
//   element itself is transmitted (no compression, but the semantics stay exact).
// - k = clamp(topk, 1, chunk elements).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace demo {

// Largest divisor of `size` that is <= `chunk` (size itself when size <= chunk). size >= 1, chunk >= 1.
size_t chunk_length(size_t size, size_t chunk);

// Bytes of the smallest unsigned integer that holds every chunk-local index 0..chunk_elems-1 (1, 2 or 4).
int index_bytes_for(size_t chunk_elems);

struct TensorPlan {
    size_t offset = 0;        // where the tensor starts in the flat parameter buffer
    size_t rows = 0, cols = 0;  // the tensor seen as 2-D (1-D: rows = 1)
    size_t n1 = 1, n2 = 1;    // chunk lengths along rows and cols
    size_t block_rows = 0, block_cols = 0;  // rows / n1, cols / n2
    size_t num_chunks = 0;    // block_rows * block_cols
    size_t chunk_elems = 0;   // n1 * n2
    size_t k = 0;             // coefficients selected per chunk
    int index_bytes = 0;      // width of a chunk-local index in the "smallest" encoding
    size_t chunk_offset = 0;  // index of this tensor's first chunk among all tensors' chunks
    size_t select_offset = 0; // index of this tensor's first selected coefficient among all tensors'
    size_t numel() const { return rows * cols; }
    size_t selected() const { return num_chunks * k; }
};

struct ModelPlan {
    size_t chunk = 0, topk = 0;     // the options the plan was built with
    std::vector<TensorPlan> tensors;
    size_t num_params = 0;          // sum of numel (tensors are laid out back to back from offset 0 if the
                                    // caller gave consecutive offsets; the plan does not require it)
    size_t total_chunks = 0;
    size_t total_selected = 0;      // sum over tensors of num_chunks * k
    size_t max_chunk_elems = 0;
    size_t max_n = 0;               // largest n1 or n2 (sizes of the DCT bases needed)

    // Which tensor holds global chunk g (tensors with chunks, binary search over chunk_offset).
    size_t tensor_of_chunk(size_t g) const;
    // A 64-bit digest of every number of the plan, written into buckets and state so ranks or runs with a
    // different plan are detected.
    uint64_t fingerprint() const;
};

// Plan for one tensor of the given shape (>= 1 dimension, every size >= 1). Throws llmc::Error otherwise.
TensorPlan plan_tensor(std::span<const size_t> shape, size_t chunk, size_t topk);

// Plan for a list of tensors (offsets are assigned back to back in list order unless `offsets` is given,
// with one entry per tensor). Throws llmc::Error naming --demo_chunk / --demo_topk when they are < 1.
ModelPlan plan_model(const std::vector<std::vector<size_t>>& shapes, size_t chunk, size_t topk,
                     std::span<const size_t> offsets = {});

// ---- shards (FlexDeMo: each rank of a node steps on one part of the plan) ----
// A shard is a run of consecutive block rows (n1 rows of a tensor: whole chunks, contiguous in the flat buffer), so
// its chunks and their top-k are those of the whole plan. shard_boundaries cuts the plan's block rows, in parameter
// order, into `parts` runs of about equal chunk counts and returns their flat offsets (parts + 1 entries, from 0
// to num_params). It needs tensors laid out back to back from 0 and at least `parts` block rows (llmc::Error
// naming --shard_group_size otherwise).
std::vector<size_t> shard_boundaries(const ModelPlan& plan, size_t parts);
// The plan of the block rows in flat range [begin, end) (boundaries of shard_boundaries), offsets counted from
// begin; `tensors` receives, per tensor of the slice, the index of its tensor in `plan`.
ModelPlan slice_plan(const ModelPlan& plan, size_t begin, size_t end, std::vector<size_t>* tensors = nullptr);

}  // namespace demo
