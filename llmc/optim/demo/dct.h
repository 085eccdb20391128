// Orthonormal DCT-II bases (and, for --demo_transform random, seeded random orthogonal ones) and the block
// transforms DeMo applies to whole tensors: encode E = C1 X C2^T and
// decode X = C1^T E C2 for every n1 x n2 block of a row-major [rows, cols] tensor, plus a sparse decode of one
// chunk when only a few of its coefficients are non-zero (error feedback: k of them; apply side: at most
// k * ranks). This header names no BLAS or OpenMP type, so the CUDA build can include it for the bases;
// the dense block transforms are implemented with OpenBLAS in dct.cpp (CPU only).
//
// Layout: the encoded tensor has the same shape as the input; coefficient (b, d) of block (i, j) sits where
// element (i*n1 + b, j*n2 + d) sits. The chunk plan's flat index inside a chunk is b * n2 + d.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace demo {

// C[k][n] = sqrt((k == 0 ? 1 : 2) / N) * cos(pi * (2n + 1) * k / (2N)), row-major N x N, computed in double
// and rounded once to fp32 (the reference's bases are fp32 too).
// Entries where the angle is a multiple of pi/2 ((2n+1)k a multiple of N) are exact: 0 or +-scale.
std::vector<float> dct_basis(size_t n);
std::vector<double> dct_basis_f64(size_t n);

// --demo_transform random: a fixed random orthogonal N x N matrix Q (row-major, Q Q^T = I), the same on every
// rank and in dev/reference/demo_reference.py, which builds it independently from this specification:
//  1. seed = 0x44654D6F52616E64 ("DeMoRand") XOR (N * 0x9E3779B97F4A7C15), mod 2^64;
//  2. splitmix64: state += 0x9E3779B97F4A7C15; z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//     z = (z ^ (z >> 27)) * 0x94D049BB133111EB; output z ^ (z >> 31) (all mod 2^64);
//  3. Box-Muller per pair of outputs a, b: u1 = ((a >> 11) + 1) / 2^53, u2 = (b >> 11) / 2^53,
//     r = sqrt(-2 ln u1), normals r cos(2 pi u2) then r sin(2 pi u2); they fill A (N x N) row by row (an odd
//     N * N drops the last sine);
//  4. modified Gram-Schmidt over the rows of A in float64: for i = 0..N-1, v = A[i]; for j < i in order,
//     v -= (Q[j] . v) Q[j] (dot products summed in index order); Q[i] = v / |v|.
// N = 1 gives [1] (the trainer treats a length-1 chunk as the identity). The fp32 version rounds once.
std::vector<double> random_orthogonal_basis_f64(size_t n);
std::vector<float> random_orthogonal_basis(size_t n);

// Which basis DctBases builds: the DCT-II (with its even/odd symmetry, which the butterflies exploit) or the
// random orthogonal one or the identity (--optimizer topk) (no symmetry: plain products).
enum class BasisKind { dct, random, identity };

// The fp32 bases of the sizes a plan needs, computed once. Filled by ensure() (not thread-safe) before any
// parallel use; the getters are const and safe to call from many threads.
class DctBases {
public:
    void set_kind(BasisKind kind);  // before the first ensure()
    BasisKind kind() const { return kind_; }
    // C[k][N-1-n] = (-1)^k C[k][n] holds (the DCT): the transforms may fold by it.
    bool symmetric() const { return kind_ == BasisKind::dct; }
    void ensure(size_t n);
    const float* basis(size_t n) const;  // throws llmc::Error when ensure(n) was not called
    // For even n: the n/2 even rows of C, then the n/2 odd rows, each cut to its first n/2 columns
    // ([2, n/2, n/2]), the factors of the butterfly in encode_block_row. DCT bases only.
    const float* halves(size_t n) const;

private:
    BasisKind kind_ = BasisKind::dct;
    std::vector<std::vector<float>> by_size_;  // index n; empty where not needed
    std::vector<std::vector<float>> halves_;
};

// Floats of per-thread scratch that encode_block_row needs for a block row of n1 x cols.
size_t block_row_scratch_elems(size_t cols, size_t n1);

// Block DCT of one block row (n1 rows x cols, row-major, contiguous) into e (same shape, must not overlap
// x): its column transform (the n1*cols/n2 row segments of n2 times C2^T) and its row transform (C1 times
// the [n1, cols] result, halved by the even/odd symmetry of C1 when n1 is even and the bases are the DCT's),
// as sgemm calls of at most 64^3 multiply-adds, which OpenBLAS runs in the calling thread: safe and efficient
// to call from many OpenMP threads at once. bases must hold n1 and n2.
void encode_block_row(const float* x, float* e, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                      float* scratch);

// Scratch of encode_blocks/decode_blocks (per-thread slabs), grown on first use and then reused.
struct BlockScratch {
    std::vector<float> buffer;
};

// Block DCT of a whole [rows, cols] tensor: e = C1 x C2^T per block, block rows in parallel (OpenMP). Call
// from outside any parallel region.
void encode_blocks(const float* x, float* e, size_t rows, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                   BlockScratch& scratch);
// Inverse: x = C1^T e C2 per block. Same conventions.
void decode_blocks(const float* e, float* x, size_t rows, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                   BlockScratch& scratch);

// Per-thread scratch for decode_chunk_sparse (grows on first use, then reused without allocating).
struct SparseDecodeScratch {
    std::vector<float> lines;     // one partial row (or column) product per distinct row (or column)
    std::vector<int32_t> slot;    // row/column -> position in `lines`, -1 when unused
    std::vector<uint32_t> order;  // distinct rows/columns in first-seen order
    std::vector<const float*> a_rows, t_rows;  // the factors of the final low-rank product
    std::vector<float> fold;                   // its even and odd halves before unfolding
};

// out[n1 * n2] = C1^T S C2 for the chunk whose only non-zero coefficients are val[j] at flat index idx[j]
// (b = idx / n2, d = idx % n2; indices may repeat, values then add). Work is (distinct lines) * n1 * n2,
// grouping by rows or by columns, whichever has fewer distinct values, as register-tiled low-rank products
// halved by the basis symmetry C[k][N-1-n] = (-1)^k C[k][n] when `symmetric` (the DCT; false for bases without
// it, DctBases::symmetric()); a chunk with no coefficient decodes to zeros.
// Deterministic: sums follow the order of idx within each parity class.
void decode_chunk_sparse(const float* c1, size_t n1, const float* c2, size_t n2, std::span<const uint32_t> idx,
                         std::span<const float> val, float* out, SparseDecodeScratch& scratch, bool symmetric);

}  // namespace demo
