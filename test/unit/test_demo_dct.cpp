// Tests of DeMo's chunk plan and DCT pieces: the chunk rule on the sizes the reference document lists,
// orthonormal bases, the document's known values, block encode/decode against a direct double-precision
// formula, and the sparse decode against the dense one.
#include <cmath>
#include <vector>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/dct.h"
#include "llmc/base/error.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"

namespace {

std::vector<float> random_normal(size_t n, uint64_t seed) {
    llmc::Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.normal());
    return v;
}

// E[i*n1+b][j*n2+d] = sum_{m,n} C1[b][m] X[i*n1+m][j*n2+n] C2[d][n], all in double with double bases.
std::vector<double> direct_encode(const std::vector<float>& x, size_t rows, size_t cols, size_t n1, size_t n2) {
    const std::vector<double> c1 = demo::dct_basis_f64(n1), c2 = demo::dct_basis_f64(n2);
    std::vector<double> e(rows * cols, 0.0);
    for (size_t i = 0; i < rows / n1; i++)
        for (size_t j = 0; j < cols / n2; j++)
            for (size_t b = 0; b < n1; b++)
                for (size_t d = 0; d < n2; d++) {
                    double s = 0.0;
                    for (size_t m = 0; m < n1; m++)
                        for (size_t n = 0; n < n2; n++)
                            s += c1[b * n1 + m] * static_cast<double>(x[(i * n1 + m) * cols + j * n2 + n]) *
                                 c2[d * n2 + n];
                    e[(i * n1 + b) * cols + j * n2 + d] = s;
                }
    return e;
}

}  // namespace

TEST(chunk_length_follows_the_rule) {
    struct Case { size_t size, expected; };
    const Case cases[] = {{768, 64}, {2304, 64}, {3072, 64}, {50304, 64}, {50257, 29}, {1000, 50},
                          {96, 48},  {7, 7},     {64, 64},   {1, 1},      {67, 1},     {65, 13},
                          {128, 64}, {4099, 1}};  // 67 and 4099 are primes > 64; 65 = 5 * 13
    for (const Case& c : cases) {
        EXPECT_EQ(demo::chunk_length(c.size, 64), c.expected);
        // Brute force: the largest divisor <= 64 (or the size itself).
        size_t best = 1;
        for (size_t n = 1; n <= std::min<size_t>(c.size, 64); n++)
            if (c.size % n == 0) best = n;
        EXPECT_EQ(demo::chunk_length(c.size, 64), best);
    }
    EXPECT_EQ(demo::chunk_length(768, 1), 1u);
    EXPECT_EQ(demo::chunk_length(768, 100), 96u);
    EXPECT_ERROR(demo::chunk_length(768, 0), "--demo_chunk");
}

TEST(tensor_plans) {
    auto plan = [](std::vector<size_t> shape, size_t topk) { return demo::plan_tensor(shape, 64, topk); };
    demo::TensorPlan p = plan({2304, 768}, 32);
    EXPECT_EQ(p.n1, 64u);
    EXPECT_EQ(p.n2, 64u);
    EXPECT_EQ(p.num_chunks, 36u * 12u);
    EXPECT_EQ(p.chunk_elems, 4096u);
    EXPECT_EQ(p.k, 32u);
    EXPECT_EQ(p.index_bytes, 2);

    p = plan({96, 50}, 32);  // 96 -> 48, 50 <= 64 -> 50
    EXPECT_EQ(p.n1, 48u);
    EXPECT_EQ(p.n2, 50u);
    EXPECT_EQ(p.num_chunks, 2u);
    EXPECT_EQ(p.index_bytes, 2);

    p = plan({7}, 32);  // 1-D: [1, 7], one chunk of 7, k clamped to 7
    EXPECT_EQ(p.rows, 1u);
    EXPECT_EQ(p.n1, 1u);
    EXPECT_EQ(p.n2, 7u);
    EXPECT_EQ(p.num_chunks, 1u);
    EXPECT_EQ(p.k, 7u);
    EXPECT_EQ(p.index_bytes, 1);

    p = plan({1000}, 32);  // 1000 -> 50: 20 chunks of 50
    EXPECT_EQ(p.n2, 50u);
    EXPECT_EQ(p.num_chunks, 20u);

    p = plan({50257, 768}, 32);
    EXPECT_EQ(p.n1, 29u);
    EXPECT_EQ(p.num_chunks, (50257u / 29u) * 12u);
    EXPECT_EQ(p.chunk_elems, 29u * 64u);

    p = plan({67, 67}, 32);  // primes > chunk: 1x1 chunks, k = 1
    EXPECT_EQ(p.chunk_elems, 1u);
    EXPECT_EQ(p.num_chunks, 67u * 67u);
    EXPECT_EQ(p.k, 1u);
    EXPECT_EQ(p.index_bytes, 1);

    p = plan({2, 3, 4}, 5);  // >2-D: leading dims flattened -> [6, 4]
    EXPECT_EQ(p.rows, 6u);
    EXPECT_EQ(p.cols, 4u);
    EXPECT_EQ(p.chunk_elems, 24u);
    EXPECT_EQ(p.k, 5u);

    p = plan({1}, 32);
    EXPECT_EQ(p.chunk_elems, 1u);
    EXPECT_EQ(p.k, 1u);

    EXPECT_ERROR(plan({3, 5}, 0), "--demo_topk");
    EXPECT_ERROR(demo::plan_tensor(std::vector<size_t>{0}, 64, 32), "size 0");
}

TEST(model_plan_offsets_and_fingerprint) {
    const std::vector<std::vector<size_t>> shapes = {{96, 50}, {7}, {128, 64}};
    demo::ModelPlan m = demo::plan_model(shapes, 64, 4);
    EXPECT_EQ(m.tensors.size(), 3u);
    EXPECT_EQ(m.num_params, 96u * 50u + 7u + 128u * 64u);
    EXPECT_EQ(m.tensors[1].offset, 96u * 50u);
    EXPECT_EQ(m.tensors[2].offset, 96u * 50u + 7u);
    EXPECT_EQ(m.total_chunks, 2u + 1u + 2u);
    EXPECT_EQ(m.total_selected, 2u * 4u + 1u * 4u + 2u * 4u);
    EXPECT_EQ(m.tensors[2].chunk_offset, 3u);
    EXPECT_EQ(m.tensors[2].select_offset, 12u);
    for (size_t g = 0; g < m.total_chunks; g++) {
        const size_t t = m.tensor_of_chunk(g);
        EXPECT(g >= m.tensors[t].chunk_offset && g < m.tensors[t].chunk_offset + m.tensors[t].num_chunks);
    }
    EXPECT(m.fingerprint() == demo::plan_model(shapes, 64, 4).fingerprint());
    EXPECT(m.fingerprint() != demo::plan_model(shapes, 64, 5).fingerprint());
    EXPECT(m.fingerprint() != demo::plan_model(shapes, 32, 4).fingerprint());
}

TEST(bases_are_orthonormal) {
    std::vector<size_t> sizes;
    for (size_t n = 1; n <= 64; n++) sizes.push_back(n);
    for (size_t n : {96, 100, 128, 29, 50, 48, 256}) sizes.push_back(n);
    double worst = 0.0;
    for (size_t n : sizes) {
        const std::vector<float> c = demo::dct_basis(n);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                double s = 0.0;
                for (size_t m = 0; m < n; m++) s += static_cast<double>(c[i * n + m]) * c[j * n + m];
                worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
            }
    }
    std::printf("  max |C C^T - I| over all sizes: %.3g\n", worst);
    EXPECT(worst <= 1e-6);
}

// cos(pi (2n+1) k / (2N)) is exactly 0 where the angle is an odd multiple of pi/2, i.e. where (2n+1)k is an odd
// multiple of N, and exactly +-1 where it is an even one. Those entries must be exact (a rounding residue of
// 6e-17 there gives the decoded update's sign to noise at small k); every other entry is the plain formula.
TEST(bases_have_exact_zeros_where_the_angle_is_a_multiple_of_pi_over_2) {
    const double pi = 3.14159265358979323846;
    size_t zeros = 0;
    for (size_t n : {3, 5, 6, 7, 10, 12, 48, 50, 96}) {
        const std::vector<double> c = demo::dct_basis_f64(n);
        const std::vector<float> cf = demo::dct_basis(n);
        size_t zeros_here = 0;
        for (size_t k = 0; k < n; k++) {
            const double scale = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
            for (size_t i = 0; i < n; i++) {
                const size_t a = (2 * i + 1) * k;  // the angle in units of pi / (2N)
                const bool multiple = a % n == 0, odd = multiple && (a / n) % 2 == 1;
                const double v = c[k * n + i];
                if (odd) {
                    EXPECT(v == 0.0);
                    EXPECT(cf[k * n + i] == 0.0f);
                    zeros_here++;
                } else if (multiple) {
                    EXPECT(std::fabs(v) == scale);  // cos = +-1 exactly
                } else {
                    EXPECT(v != 0.0);
                    EXPECT_NEAR(v, scale * std::cos(pi * static_cast<double>(a) / (2.0 * static_cast<double>(n))),
                                1e-12);  // the unreduced angle costs cos some ulps
                }
            }
        }
        // Orthonormal, in double and as the fp32 bases the optimizer uses.
        double worst = 0.0, worst_f = 0.0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                double s = 0.0, sf = 0.0;
                for (size_t m = 0; m < n; m++) {
                    s += c[i * n + m] * c[j * n + m];
                    sf += static_cast<double>(cf[i * n + m]) * cf[j * n + m];
                }
                worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
                worst_f = std::max(worst_f, std::fabs(sf - (i == j ? 1.0 : 0.0)));
            }
        EXPECT(worst <= 1e-12);
        EXPECT(worst_f <= 1e-6);
        EXPECT(zeros_here > 0);  // each of these sizes has some (N = 2, 4, 8, ... have none)
        zeros += zeros_here;
    }
    std::printf("  %zu exact zeros over the bases of N = 3, 5, 6, 7, 10, 12, 48, 50, 96\n", zeros);
    EXPECT(zeros > 0);
}

TEST(known_values_from_the_reference_document) {
    const std::vector<float> c4 = demo::dct_basis(4);
    const double column0[4] = {0.5, 0.6533, 0.5, 0.2706};
    for (int k = 0; k < 4; k++) EXPECT_NEAR(c4[k * 4 + 0], column0[k], 1e-4);

    // 1-D encode of 0..7 with chunk 8 (a [1, 8] tensor).
    std::vector<float> x(8), e(8);
    demo::BlockScratch slab;
    for (int i = 0; i < 8; i++) x[i] = static_cast<float>(i);
    demo::DctBases bases;
    bases.ensure(1);
    bases.ensure(8);
    demo::encode_blocks(x.data(), e.data(), 1, 8, 1, 8, bases, slab);
    const double expected[8] = {9.89949, -6.44232, 0, -0.67345, 0, -0.20090, 0, -0.05070};
    for (int i = 0; i < 8; i++) EXPECT_NEAR(e[i], expected[i], 2e-5);
}

TEST(block_encode_matches_direct_double_formula_and_round_trips) {
    struct Shape { size_t rows, cols, n1, n2; };
    // Awkward chunks, 1-D as [1, S], 1x1 chunks, several block rows and columns.
    const Shape shapes[] = {{96, 50, 48, 50}, {1, 7, 1, 7}, {128, 64, 64, 64}, {50, 1000, 50, 50},
                            {1, 1000, 1, 50}, {3, 5, 3, 5},  {67, 67, 1, 1},   {192, 128, 64, 64},
                            {1, 768, 1, 64},  {58, 192, 29, 64}};
    for (const Shape& s : shapes) {
        const std::vector<float> x = random_normal(s.rows * s.cols, 7 + s.rows * 131 + s.cols);
        std::vector<float> e(x.size()), back(x.size());
        demo::BlockScratch slab;
        demo::DctBases bases;
        bases.ensure(s.n1);
        bases.ensure(s.n2);
        demo::encode_blocks(x.data(), e.data(), s.rows, s.cols, s.n1, s.n2, bases, slab);
        const std::vector<double> ref = direct_encode(x, s.rows, s.cols, s.n1, s.n2);
        // fp32 sgemm: each coefficient is a sum of n1*n2 products of O(1) terms with fp32 bases; the error is
        // a few eps times sqrt(n1*n2) (random rounding), far below 2e-5 for chunks up to 64x64 (4096 terms).
        double worst = 0.0, worst_rt = 0.0;
        for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, std::fabs(e[i] - ref[i]));
        demo::decode_blocks(e.data(), back.data(), s.rows, s.cols, s.n1, s.n2, bases, slab);
        for (size_t i = 0; i < x.size(); i++) worst_rt = std::max(worst_rt, std::fabs(double(back[i]) - x[i]));
        std::printf("  [%zu, %zu] chunk %zux%zu: max |E - E_double| %.3g, round trip %.3g\n", s.rows, s.cols, s.n1,
                    s.n2, worst, worst_rt);
        EXPECT(worst <= 2e-5);
        EXPECT(worst_rt <= 2e-5);
    }
    std::vector<float> a(10), b(10);
    demo::BlockScratch sl;
    demo::DctBases b3;
    b3.ensure(1);
    b3.ensure(3);
    EXPECT_ERROR(demo::encode_blocks(a.data(), b.data(), 2, 5, 1, 3, b3, sl),
                 "does not tile");
}

// Both kinds of bases: the DCT's (the decode folds by its symmetry) and the random orthogonal ones (no fold).
TEST(sparse_decode_matches_dense_decode) {
    struct Shape { size_t n1, n2; };
    const Shape shapes[] = {{64, 64}, {48, 50}, {1, 7}, {3, 5}, {1, 1}, {29, 64}, {7, 1}};
    llmc::Rng rng(42);
    demo::SparseDecodeScratch scratch;
    for (const demo::BasisKind kind : {demo::BasisKind::dct, demo::BasisKind::random})
    for (const Shape& s : shapes) {
        const size_t elems = s.n1 * s.n2;
        const bool dct = kind == demo::BasisKind::dct;
        const std::vector<float> c1 = dct ? demo::dct_basis(s.n1) : demo::random_orthogonal_basis(s.n1),
                                 c2 = dct ? demo::dct_basis(s.n2) : demo::random_orthogonal_basis(s.n2);
        demo::DctBases bases;
        bases.set_kind(kind);
        bases.ensure(s.n1);
        bases.ensure(s.n2);
        demo::BlockScratch slab;
        // Random sets (with repeats), all in one row, all in one column, every coefficient, none.
        for (int trial = 0; trial < 5; trial++) {
            std::vector<uint32_t> idx;
            const size_t count = trial == 3 ? elems : trial == 4 ? 0 : std::min<size_t>(elems, 1 + rng.below(40));
            for (size_t j = 0; j < count; j++) {
                uint32_t i;
                if (trial == 1) i = static_cast<uint32_t>((rng.below(s.n1)) * s.n2 + (j % s.n2));  // few rows
                else if (trial == 2) i = static_cast<uint32_t>((j % s.n1) * s.n2 + s.n2 / 2);       // one column
                else if (trial == 3) i = static_cast<uint32_t>(j);
                else i = static_cast<uint32_t>(rng.below(elems));
                idx.push_back(i);
            }
            std::vector<float> val(count), dense(elems, 0.0f), sparse_out(elems), dense_out(elems);
            for (size_t j = 0; j < count; j++) {
                val[j] = static_cast<float>(rng.normal());
                dense[idx[j]] += val[j];
            }
            demo::decode_chunk_sparse(c1.data(), s.n1, c2.data(), s.n2, idx, val, sparse_out.data(), scratch, dct);
            demo::decode_blocks(dense.data(), dense_out.data(), s.n1, s.n2, s.n1, s.n2, bases,
                                slab);
            double worst = 0.0;
            for (size_t i = 0; i < elems; i++) worst = std::max(worst, std::fabs(double(sparse_out[i]) - dense_out[i]));
            EXPECT(worst <= 1e-5);
        }
    }
}

// --demo_transform random: the seeded matrices are orthonormal, fixed by their length alone (every rank builds the
// same), differ between lengths, have no DCT symmetry, and the block transforms (whose DCT path folds by that
// symmetry) compute E = Q1 X Q2^T with them exactly as the direct double formula does, and invert it.
TEST(random_orthogonal_bases_and_their_block_transforms) {
    for (size_t n : {2, 3, 6, 7, 29, 48, 50, 64}) {
        const std::vector<double> q = demo::random_orthogonal_basis_f64(n);
        EXPECT(q == demo::random_orthogonal_basis_f64(n));
        EXPECT(q != demo::random_orthogonal_basis_f64(n + 1) || n == 1);
        double worst = 0.0, asym = 0.0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                double s = 0.0;
                for (size_t m = 0; m < n; m++) s += q[i * n + m] * q[j * n + m];
                worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
                asym = std::max(asym, std::fabs(std::fabs(q[i * n + j]) - std::fabs(q[i * n + n - 1 - j])));
            }
        EXPECT(worst <= 1e-12);
        EXPECT(asym > 1e-3);  // not the DCT's mirror symmetry
        const std::vector<float> f = demo::random_orthogonal_basis(n);
        for (size_t i = 0; i < n * n; i++) EXPECT(f[i] == static_cast<float>(q[i]));
    }
    EXPECT(demo::random_orthogonal_basis_f64(1) == std::vector<double>{1.0});

    struct Shape { size_t rows, cols, n1, n2; };
    for (const Shape& s : {Shape{96, 100, 48, 50}, Shape{128, 64, 64, 64}, Shape{21, 6, 7, 6}, Shape{1, 50, 1, 50}}) {
        const std::vector<float> x = random_normal(s.rows * s.cols, 11 + s.n1);
        demo::DctBases bases;
        bases.set_kind(demo::BasisKind::random);
        bases.ensure(s.n1);
        bases.ensure(s.n2);
        EXPECT(!bases.symmetric());
        std::vector<float> e(x.size()), back(x.size());
        demo::BlockScratch slab;
        demo::encode_blocks(x.data(), e.data(), s.rows, s.cols, s.n1, s.n2, bases, slab);
        demo::decode_blocks(e.data(), back.data(), s.rows, s.cols, s.n1, s.n2, bases, slab);
        const std::vector<double> q1 = demo::random_orthogonal_basis_f64(s.n1), q2 = demo::random_orthogonal_basis_f64(s.n2);
        double worst = 0.0, round_trip = 0.0;
        for (size_t i = 0; i < s.rows / s.n1; i++)
            for (size_t j = 0; j < s.cols / s.n2; j++)
                for (size_t b = 0; b < s.n1; b++)
                    for (size_t d = 0; d < s.n2; d++) {
                        double v = 0.0;
                        for (size_t m = 0; m < s.n1; m++)
                            for (size_t n = 0; n < s.n2; n++)
                                v += q1[b * s.n1 + m] * double(x[(i * s.n1 + m) * s.cols + j * s.n2 + n]) * q2[d * s.n2 + n];
                        const size_t at = (i * s.n1 + b) * s.cols + j * s.n2 + d;
                        worst = std::max(worst, std::fabs(v - e[at]));
                        round_trip = std::max(round_trip, std::fabs(double(back[at]) - x[at]));
                    }
        std::printf("  [%zu, %zu] chunk %zux%zu random: max |E - E_double| %.3g, round trip %.3g\n", s.rows, s.cols,
                    s.n1, s.n2, worst, round_trip);
        EXPECT(worst <= 5e-6);
        EXPECT(round_trip <= 5e-6);
    }
}

TEST_MAIN()
