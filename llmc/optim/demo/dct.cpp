// DCT-II and random orthogonal bases, and the block transforms (see dct.h). The dense transforms are small sgemm calls, so they run at
// BLAS speed in many OpenMP threads at once; the sparse decode is a register-tiled low-rank product per chunk.
#include "llmc/optim/demo/dct.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "llmc/base/error.h"

namespace demo {

std::vector<double> dct_basis_f64(size_t n) {
    LLMC_CHECK(n >= 1, "dct_basis: size must be >= 1");
    std::vector<double> c(n * n);
    const double pi = 3.14159265358979323846;
    for (size_t k = 0; k < n; k++) {
        const double scale = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
        for (size_t i = 0; i < n; i++) {
            // cos(pi (2i+1) k / (2n)) has period 4n in (2i+1) k: reducing the integer first keeps the
            // argument of cos small, so large n lose no accuracy to argument reduction.
            const size_t m = ((2 * i + 1) * k) % (4 * n);
            // The angle is m * pi / (2n): where n divides m it is a multiple of pi/2, and cos is exactly 1, 0,
            // -1 or 0. std::cos(pi / 2) is 6e-17, not 0, and at small k whole rows of a decoded update would
            // take their sign from that noise, so those entries are set exactly.
            if (m % n == 0) {
                static constexpr double kQuarterTurns[4] = {1.0, 0.0, -1.0, 0.0};
                c[k * n + i] = scale * kQuarterTurns[m / n];
                continue;
            }
            c[k * n + i] = scale * std::cos(pi * static_cast<double>(m) / (2.0 * static_cast<double>(n)));
        }
    }
    return c;
}

std::vector<float> dct_basis(size_t n) {
    const std::vector<double> c = dct_basis_f64(n);
    return std::vector<float>(c.begin(), c.end());
}

std::vector<double> random_orthogonal_basis_f64(size_t n) {
    LLMC_CHECK(n >= 1, "random_orthogonal_basis: size must be >= 1");
    if (n == 1) return {1.0};
    // The construction dct.h specifies step by step; demo_reference.py repeats it in Python.
    uint64_t state = 0x44654D6F52616E64ull ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull);
    auto next = [&state]() {
        state += 0x9E3779B97F4A7C15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    const double two_pi = 2.0 * 3.14159265358979323846, inv53 = 1.0 / 9007199254740992.0;  // 2^-53
    std::vector<double> a(n * n);
    for (size_t i = 0; i < n * n; i += 2) {
        const uint64_t x = next(), y = next();
        const double u1 = static_cast<double>((x >> 11) + 1) * inv53, u2 = static_cast<double>(y >> 11) * inv53;
        const double r = std::sqrt(-2.0 * std::log(u1));
        a[i] = r * std::cos(two_pi * u2);
        if (i + 1 < n * n) a[i + 1] = r * std::sin(two_pi * u2);
    }
    std::vector<double> q(n * n);
    for (size_t i = 0; i < n; i++) {
        double* v = q.data() + i * n;
        std::copy(a.begin() + static_cast<ptrdiff_t>(i * n), a.begin() + static_cast<ptrdiff_t>((i + 1) * n), v);
        for (size_t j = 0; j < i; j++) {
            const double* qj = q.data() + j * n;
            double dot = 0.0;
            for (size_t m = 0; m < n; m++) dot += qj[m] * v[m];
            for (size_t m = 0; m < n; m++) v[m] -= dot * qj[m];
        }
        double norm = 0.0;
        for (size_t m = 0; m < n; m++) norm += v[m] * v[m];
        norm = std::sqrt(norm);
        for (size_t m = 0; m < n; m++) v[m] /= norm;
    }
    return q;
}

std::vector<float> random_orthogonal_basis(size_t n) {
    const std::vector<double> q = random_orthogonal_basis_f64(n);
    return std::vector<float>(q.begin(), q.end());
}

void DctBases::set_kind(BasisKind kind) {
    for (const std::vector<float>& b : by_size_)
        LLMC_CHECK(b.empty() || kind == kind_, "DctBases: the basis kind is set before the first basis is built");
    kind_ = kind;
}

void DctBases::ensure(size_t n) {
    LLMC_CHECK(n >= 1, "DctBases: size must be >= 1");
    if (by_size_.size() <= n) {
        by_size_.resize(n + 1);
        halves_.resize(n + 1);
    }
    if (!by_size_[n].empty()) return;
    if (kind_ == BasisKind::identity) {
        by_size_[n].assign(n * n, 0.0f);
        for (size_t i = 0; i < n; i++) by_size_[n][i * n + i] = 1.0f;
    } else {
        by_size_[n] = kind_ == BasisKind::dct ? dct_basis(n) : random_orthogonal_basis(n);
    }
    if (n % 2 == 0 && symmetric()) {
        // Even rows then odd rows of C, each restricted to the first n/2 columns (see encode_block_row).
        const size_t h = n / 2;
        std::vector<float>& hv = halves_[n];
        hv.resize(2 * h * h);
        for (size_t j = 0; j < h; j++)
            for (size_t c = 0; c < h; c++) {
                hv[j * h + c] = by_size_[n][(2 * j) * n + c];
                hv[h * h + j * h + c] = by_size_[n][(2 * j + 1) * n + c];
            }
    }
}

const float* DctBases::halves(size_t n) const {
    LLMC_CHECK(n < halves_.size() && !halves_[n].empty(),
               "DctBases: half bases of size " + std::to_string(n) + " were not prepared");
    return halves_[n].data();
}

const float* DctBases::basis(size_t n) const {
    LLMC_CHECK(n < by_size_.size() && !by_size_[n].empty(),
               "DctBases: basis of size " + std::to_string(n) + " was not prepared");
    return by_size_[n].data();
}

namespace {

void check_blocks(size_t rows, size_t cols, size_t n1, size_t n2) {
    LLMC_CHECK(n1 >= 1 && n2 >= 1 && rows % n1 == 0 && cols % n2 == 0,
               "block DCT: chunk " + std::to_string(n1) + "x" + std::to_string(n2) + " does not tile [" +
                   std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

int as_blas_int(size_t v) {
    LLMC_CHECK(v <= 0x7fffffffu, "block DCT: dimension too large for BLAS");
    return static_cast<int>(v);
}

}  // namespace

namespace {

// Largest sgemm issued by the block transforms, in multiply-adds: OpenBLAS runs calls up to 64^3 in the
// calling thread (its GEMM_MULTITHREAD_THRESHOLD x 65536), so OpenMP threads can issue them side by side
// without fighting over OpenBLAS's own thread pool. Bigger calls would still be correct, only slower.
constexpr size_t kMaxSgemmWork = size_t{64} * 64 * 64;

// C = A B^T (a_rows x k times the transpose of b_rows x k), split into row pieces of at most kMaxSgemmWork.
void sgemm_abt_rows(size_t a_rows, size_t n, size_t k, const float* a, size_t lda, const float* b, float* c,
                    size_t ldc) {
    const size_t step = std::max<size_t>(1, kMaxSgemmWork / (n * k));
    for (size_t r = 0; r < a_rows; r += step)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, as_blas_int(std::min(step, a_rows - r)),
                    as_blas_int(n), as_blas_int(k), 1.0f, a + r * lda, as_blas_int(lda), b, as_blas_int(k), 0.0f,
                    c + r * ldc, as_blas_int(ldc));
}

// C = op(A) B with op(A) m x m (A or A^T, A row-major m x m) and B m x cols, split into column pieces.
void sgemm_square_left(bool transpose_a, size_t m, size_t cols, const float* a, const float* b, size_t ldb,
                       float* c, size_t ldc) {
    const size_t step = std::max<size_t>(1, kMaxSgemmWork / (m * m));
    for (size_t j = 0; j < cols; j += step)
        cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, CblasNoTrans, as_blas_int(m),
                    as_blas_int(std::min(step, cols - j)), as_blas_int(m), 1.0f, a, as_blas_int(m), b + j,
                    as_blas_int(ldb), 0.0f, c + j, as_blas_int(ldc));
}

}  // namespace

size_t block_row_scratch_elems(size_t cols, size_t n1) {
    if (n1 == 1) return 0;
    return n1 % 2 == 0 ? 2 * n1 * cols : n1 * cols;  // Y_i, plus the butterfly's sums and differences
}

// Per block row: the column transform Y = X_i C2^T of its n1*cols/n2 row segments, then the row transform
// E_i = C1 Y_i, with Y_i in scratch (L2-resident). Callers run block rows in parallel (OpenMP): every
// sgemm is small enough to run in the calling thread, and a block row's split into sgemm pieces is fixed,
// so results do not depend on the thread count. Measured on the 2-core dev box for the d12 tensors: 0.23 s
// against 0.36 s for sequential full-size sgemms threaded by OpenBLAS (one column sgemm per ~256 KiB group
// of block rows, one row sgemm per block row), and the gap widens when other jobs share the machine. One
// column sgemm over a whole tensor was slower still: with N = K = 64 it streams twice through memory.
//
// For even n1 the row transform uses the DCT-II symmetry C[k][n1-1-n] = (-1)^k C[k][n]: with
// S_b = Y_b + Y_(n1-1-b) and D_b = Y_b - Y_(n1-1-b) (b < n1/2), even coefficient rows are Ce S and odd ones
// Co D, where Ce/Co are the even/odd rows of C1 restricted to its first n1/2 columns. Two half-size sgemms
// writing every other row (ldc = 2 cols) replace one full one: a quarter fewer flops per encode (measured
// 0.158 s -> 0.127 s on [50304, 768]). The same butterfly on columns did not pay: it needs an
// interleaving pass and K = 32 sgemms run less efficiently.
void encode_block_row(const float* x, float* e, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                      float* scratch) {
    const size_t per_block_row = n1 * cols;
    // Column transform; with n1 == 1 there is no row transform, so it writes straight to e.
    float* y = n1 == 1 ? e : scratch;
    if (n2 == 1)
        std::memcpy(y, x, per_block_row * sizeof(float));  // the size-1 DCT is the identity
    else
        sgemm_abt_rows(per_block_row / n2, n2, n2, x, n2, bases.basis(n2), y, n2);
    if (n1 == 1) return;
    if (n1 % 2 != 0 || !bases.symmetric()) {
        sgemm_square_left(false, n1, cols, bases.basis(n1), y, cols, e, cols);
        return;
    }
    const size_t half = n1 / 2;
    float* sums = scratch + per_block_row;  // [half, cols]
    float* diffs = sums + half * cols;      // [half, cols]
    for (size_t b = 0; b < half; b++) {
        const float* top = y + b * cols;
        const float* bottom = y + (n1 - 1 - b) * cols;
        float* sum = sums + b * cols;
        float* diff = diffs + b * cols;
        for (size_t c = 0; c < cols; c++) {
            sum[c] = top[c] + bottom[c];
            diff[c] = top[c] - bottom[c];
        }
    }
    const float* even_basis = bases.halves(n1);
    const float* odd_basis = even_basis + half * half;
    sgemm_square_left(false, half, cols, even_basis, sums, cols, e, 2 * cols);
    sgemm_square_left(false, half, cols, odd_basis, diffs, cols, e + cols, 2 * cols);
}

void encode_blocks(const float* x, float* e, size_t rows, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                   BlockScratch& scratch) {
    check_blocks(rows, cols, n1, n2);
    const size_t per_block_row = n1 * cols;
    const size_t per_thread = block_row_scratch_elems(cols, n1);
    const size_t threads = static_cast<size_t>(omp_get_max_threads());
    if (scratch.buffer.size() < threads * per_thread) scratch.buffer.resize(threads * per_thread);
#pragma omp parallel
    {
        float* mine = scratch.buffer.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < rows / n1; i++)
            encode_block_row(x + i * per_block_row, e + i * per_block_row, cols, n1, n2, bases, mine);
    }
}

void decode_blocks(const float* e, float* x, size_t rows, size_t cols, size_t n1, size_t n2, const DctBases& bases,
                   BlockScratch& scratch) {
    const float* c1 = bases.basis(n1);
    const float* c2 = bases.basis(n2);
    check_blocks(rows, cols, n1, n2);
    const size_t per_block_row = n1 * cols;
    const size_t threads = static_cast<size_t>(omp_get_max_threads());
    const size_t per_thread = n1 == 1 ? 0 : per_block_row;
    if (scratch.buffer.size() < threads * per_thread) scratch.buffer.resize(threads * per_thread);
    const size_t block_rows = rows / n1;
    // The inverse, in the opposite order: T_i = C1^T E_i, then X_i = T_i C2 (C2 as the "B^T" of C2^T).
    std::vector<float> c2t(n2 * n2);
    for (size_t a = 0; a < n2; a++)
        for (size_t b = 0; b < n2; b++) c2t[b * n2 + a] = c2[a * n2 + b];
#pragma omp parallel
    {
        float* t = scratch.buffer.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < block_rows; i++) {
            const float* ei = e + i * per_block_row;
            float* xi = x + i * per_block_row;
            const float* ti = ei;
            if (n1 != 1) {
                sgemm_square_left(true, n1, cols, c1, ei, cols, t, cols);
                ti = t;
            }
            if (n2 == 1)
                std::memcpy(xi, ti, per_block_row * sizeof(float));
            else
                sgemm_abt_rows(per_block_row / n2, n2, n2, ti, n2, c2t.data(), xi, n2);
        }
    }
}

namespace {

// A 16-float vector (one AVX-512 register, two AVX2 ones) through GCC/Clang vector extensions, so the
// accumulators below stay in registers whatever the target width. Loads and stores go through memcpy
// (rows need not be aligned), and no function takes or returns one (that would tie the ABI to -march).
typedef float vec16 __attribute__((vector_size(64)));

// out[m][n] = sum_i a[i][m] * t[i][n] for m < n1, n < n2, where a[i] and t[i] point to rows of length n1 and
// n2: one small dense product of rank `count`. Register tiles of 4 rows x 64 columns (16 vector
// accumulators) cover the bulk; 16-column and single-column tiles finish the edges. Every output element
// sums over i in increasing order (deterministic).
template <int TM, int TV>
inline void product_tile(const float* const* a, const float* const* t, size_t count, size_t m0, size_t n0,
                         float* out, size_t ldo) {
    vec16 acc[TM][TV] = {};
    for (size_t i = 0; i < count; i++) {
        vec16 tv[TV];
        std::memcpy(tv, t[i] + n0, sizeof tv);
        for (int r = 0; r < TM; r++) {
            const float ar = a[i][m0 + r];
            for (int v = 0; v < TV; v++) acc[r][v] += ar * tv[v];
        }
    }
    for (int r = 0; r < TM; r++) std::memcpy(out + (m0 + r) * ldo + n0, acc[r], sizeof acc[r]);
}

template <int TM>
inline void product_rows(const float* const* a, const float* const* t, size_t count, size_t m0, size_t n2,
                         float* out, size_t ldo) {
    size_t n0 = 0;
    for (; n0 + 64 <= n2; n0 += 64) product_tile<TM, 4>(a, t, count, m0, n0, out, ldo);
    for (; n0 + 16 <= n2; n0 += 16) product_tile<TM, 1>(a, t, count, m0, n0, out, ldo);
    for (; n0 < n2; n0++)
        for (int r = 0; r < TM; r++) {
            float s = 0.0f;
            for (size_t i = 0; i < count; i++) s += a[i][m0 + r] * t[i][n0];
            out[(m0 + r) * ldo + n0] = s;
        }
}

void low_rank_product(const float* const* a, const float* const* t, size_t count, size_t n1, size_t n2,
                      float* out, size_t ldo) {
    size_t m0 = 0;
    for (; m0 + 4 <= n1; m0 += 4) product_rows<4>(a, t, count, m0, n2, out, ldo);
    for (; m0 < n1; m0++) product_rows<1>(a, t, count, m0, n2, out, ldo);
}

}  // namespace

void decode_chunk_sparse(const float* c1, size_t n1, const float* c2, size_t n2, std::span<const uint32_t> idx,
                         std::span<const float> val, float* out, SparseDecodeScratch& s, bool symmetric) {
    const size_t elems = n1 * n2;
    if (idx.empty()) {
        std::memset(out, 0, elems * sizeof(float));
        return;
    }
    const size_t nmax = n1 > n2 ? n1 : n2;
    if (s.slot.size() < nmax) s.slot.assign(nmax, -1);
    if (s.order.size() < nmax) s.order.resize(nmax);

    // Count distinct rows and columns (slot doubles as the "seen" mark; cleared again below).
    auto count_distinct = [&](bool by_row) {
        size_t distinct = 0;
        for (uint32_t f : idx) {
            const uint32_t line = by_row ? f / n2 : f % n2;
            if (s.slot[line] < 0) {
                s.slot[line] = static_cast<int32_t>(distinct);
                s.order[distinct++] = line;
            }
        }
        return distinct;
    };
    auto clear_slots = [&](size_t distinct) {
        for (size_t i = 0; i < distinct; i++) s.slot[s.order[i]] = -1;
    };
    const size_t distinct_rows = count_distinct(true);
    clear_slots(distinct_rows);
    const size_t distinct_cols = count_distinct(false);
    const bool by_row = distinct_rows <= distinct_cols;
    size_t distinct = distinct_cols;
    if (by_row) {
        clear_slots(distinct_cols);
        distinct = count_distinct(true);
    }

    // Grouped by row b: line_b = sum_j v_j C2[d_j][:] (length n2), then out = sum_b C1[b][:]^T line_b.
    // Grouped by column d: line_d = sum_j v_j C1[b_j][:] (length n1), then out = sum_d line_d^T C2[d][:].
    const size_t line_len = by_row ? n2 : n1;
    if (s.lines.size() < distinct * line_len) s.lines.resize(distinct * line_len);
    std::memset(s.lines.data(), 0, distinct * line_len * sizeof(float));
    for (size_t j = 0; j < idx.size(); j++) {
        const uint32_t b = idx[j] / n2, d = idx[j] % n2;
        const float v = val[j];
        if (by_row) {
            float* line = s.lines.data() + static_cast<size_t>(s.slot[b]) * n2;
            const float* basis_row = c2 + static_cast<size_t>(d) * n2;
            for (size_t n = 0; n < n2; n++) line[n] += v * basis_row[n];
        } else {
            float* line = s.lines.data() + static_cast<size_t>(s.slot[d]) * n1;
            const float* basis_row = c1 + static_cast<size_t>(b) * n1;
            for (size_t m = 0; m < n1; m++) line[m] += v * basis_row[m];
        }
    }
    // The final product folds the output in half with the symmetry C[k][N-1-n] = (-1)^k C[k][n] of the
    // basis on the grouped side (C1 when grouped by rows, C2 by columns): with P the sum over even lines and
    // Q over odd ones, computed for the first ceil(N/2) output rows (columns) only, the output is P + Q there
    // and P - Q mirrored. Half the multiply-adds of the plain product.
    if (s.a_rows.size() < distinct) {
        s.a_rows.resize(distinct);
        s.t_rows.resize(distinct);
    }
    // Even lines first, then odd ones, each in first-seen order.
    size_t evens = 0;
    for (size_t i = 0; i < distinct; i++) evens += (s.order[i] & 1) == 0;
    size_t pos = 0;
    for (int parity = 0; parity < 2; parity++) {
        for (size_t i = 0; i < distinct; i++) {
            const size_t l = s.order[i];
            if ((l & 1) != static_cast<size_t>(parity)) continue;
            if (by_row) {
                s.a_rows[pos] = c1 + l * n1;
                s.t_rows[pos] = s.lines.data() + i * n2;
            } else {
                s.a_rows[pos] = s.lines.data() + i * n1;
                s.t_rows[pos] = c2 + l * n2;
            }
            pos++;
        }
    }
    const float* const* a_even = s.a_rows.data();
    const float* const* t_even = s.t_rows.data();
    const float* const* a_odd = a_even + evens;
    const float* const* t_odd = t_even + evens;
    const size_t odds = distinct - evens;
    const size_t fold = by_row ? n1 : n2;
    if (fold < 2 || !symmetric) {
        low_rank_product(a_even, t_even, distinct, n1, n2, out, n2);
    } else {
        const size_t half = (fold + 1) / 2, mirrored = fold / 2;
        const size_t part = by_row ? half * n2 : n1 * half;
        if (s.fold.size() < 2 * part) s.fold.resize(2 * part);
        float* p = s.fold.data();
        float* q = p + part;
        if (by_row) {
            low_rank_product(a_even, t_even, evens, half, n2, p, n2);
            low_rank_product(a_odd, t_odd, odds, half, n2, q, n2);
            for (size_t m = 0; m < half; m++) {
                const float* pm = p + m * n2;
                const float* qm = q + m * n2;
                float* top = out + m * n2;
                for (size_t n = 0; n < n2; n++) top[n] = pm[n] + qm[n];
                if (m >= mirrored) continue;  // the middle row of an odd size has no mirror
                float* bottom = out + (n1 - 1 - m) * n2;
                for (size_t n = 0; n < n2; n++) bottom[n] = pm[n] - qm[n];
            }
        } else {
            low_rank_product(a_even, t_even, evens, n1, half, p, half);
            low_rank_product(a_odd, t_odd, odds, n1, half, q, half);
            for (size_t m = 0; m < n1; m++) {
                const float* pm = p + m * half;
                const float* qm = q + m * half;
                float* row = out + m * n2;
                for (size_t n = 0; n < half; n++) row[n] = pm[n] + qm[n];
                for (size_t n = 0; n < mirrored; n++) row[n2 - 1 - n] = pm[n] - qm[n];
            }
        }
    }
    clear_slots(distinct);
}

}  // namespace demo
