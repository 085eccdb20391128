// Tests of DeMo's wire codec: exact round trips for every value and index encoding on awkward chunk shapes
// (1-D, 1x1 chunks, k = chunk elements, odd k so bit-packed groups straddle bytes), the byte-size formulas,
// bf16 round-to-nearest-even and the sign quantizer, and detection of buckets that do not match this rank. The
// entropy (Elias-Fano) indices also against a bit-by-bit encoder written here from codec.h's layout, at many
// chunk sizes U (not powers of two too) and k from 1 to U, and its corrupt inputs refused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/base/error.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"

namespace {

using llmc::DemoIndexEncoding;
using llmc::DemoValueEncoding;

const std::vector<std::vector<size_t>> kAwkwardShapes = {{96, 50}, {7}, {128, 64}, {50, 1000}, {1000},
                                                         {3, 5},   {67, 67}, {2, 3, 4}, {1}, {4096}};

// Distinct random indices per chunk in ascending order (as the optimizer sends them) and random values with
// some zeros and exact ties; values then quantized as the optimizer does.
demo::Selection random_selection(const demo::ModelPlan& plan, DemoValueEncoding values, uint64_t seed) {
    llmc::Rng rng(seed);
    demo::Selection sel;
    sel.resize(plan);
    for (const demo::TensorPlan& t : plan.tensors) {
        std::vector<uint32_t> all(t.chunk_elems);
        for (size_t c = 0; c < t.num_chunks; c++) {
            for (size_t i = 0; i < all.size(); i++) all[i] = static_cast<uint32_t>(i);
            for (size_t i = 0; i < t.k; i++) std::swap(all[i], all[i + rng.below(all.size() - i)]);  // partial shuffle
            std::sort(all.begin(), all.begin() + static_cast<ptrdiff_t>(t.k));
            const size_t s = t.select_offset + c * t.k;
            for (size_t j = 0; j < t.k; j++) {
                sel.indices[s + j] = all[j];
                const uint64_t kind = rng.below(10);
                sel.values[s + j] = kind == 0 ? 0.0f : kind == 1 ? -0.25f : static_cast<float>(rng.normal() * 1e-3);
            }
            sel.scales[t.chunk_offset + c] = demo::quantize_chunk(values, &sel.values[s], t.k);
        }
    }
    return sel;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

}  // namespace

TEST(round_trip_every_encoding) {
    const DemoValueEncoding value_encodings[] = {DemoValueEncoding::fp32, DemoValueEncoding::bf16,
                                                 DemoValueEncoding::sign};
    const DemoIndexEncoding index_encodings[] = {DemoIndexEncoding::smallest, DemoIndexEncoding::packed12,
                                                 DemoIndexEncoding::entropy};
    // topk 1, odd 3 and 13 (bit groups end mid-byte), 32, and huge (k = chunk elements everywhere).
    for (size_t topk : {1, 3, 13, 32, 100000}) {
        const demo::ModelPlan plan = demo::plan_model(kAwkwardShapes, 64, topk);
        for (DemoValueEncoding ve : value_encodings)
            for (DemoIndexEncoding ie : index_encodings) {
                const demo::WireFormat format{ve, ie};
                const demo::Selection sel = random_selection(plan, ve, topk * 10 + static_cast<int>(ve));
                std::vector<std::byte> bucket;
                demo::encode_bucket(plan, format, sel, bucket);
                EXPECT_EQ(bucket.size(), demo::bucket_bytes(plan, format));
                demo::Selection back;
                demo::decode_bucket(plan, format, bucket, back, "test bucket");
                EXPECT(back.indices == sel.indices);
                bool values_equal = true;
                for (size_t s = 0; s < sel.values.size(); s++) {
                    // A zero sent with the sign encoding is +scale: the quantizer already made it so.
                    const bool same = same_bits(back.values[s], sel.values[s]) ||
                                      (back.values[s] == 0.0f && sel.values[s] == 0.0f);
                    values_equal = values_equal && same;
                }
                EXPECT(values_equal);
                if (ve == DemoValueEncoding::sign)
                    for (size_t c = 0; c < plan.total_chunks; c++) EXPECT(same_bits(back.scales[c], sel.scales[c]));
                // Encoding twice gives the same bytes (zeroed padding, no uninitialized bits).
                std::vector<std::byte> again;
                demo::encode_bucket(plan, format, back, again);
                EXPECT(again == bucket);
            }
    }
}

TEST(byte_size_formulas) {
    // One [128, 64] tensor: 2 chunks of 64x64, k = 32 -> 64 items; and one [7] tensor: 1 chunk, k = 7.
    const demo::ModelPlan plan = demo::plan_model({{128, 64}, {7}}, 64, 32);
    using WF = demo::WireFormat;
    // fp32 + u16: 64*4 + 64*2 = 384; [7]: values 28, indices u8 7 -> 8 (padded)
    EXPECT_EQ(demo::bucket_bytes(plan, WF{DemoValueEncoding::fp32, DemoIndexEncoding::smallest}),
              32u + 256u + 128u + 28u + 8u);
    // bf16 + packed12: 64*2 + 64*12/8 = 128 + 96; [7]: 14 -> 16, ceil(84/8) = 11 -> 12
    EXPECT_EQ(demo::bucket_bytes(plan, WF{DemoValueEncoding::bf16, DemoIndexEncoding::packed12}),
              32u + 128u + 96u + 16u + 12u);
    // sign + u16: scales 2*4, bits 64/8 = 8, indices 128; [7]: scale 4, bits 1 -> 4, indices 7 -> 8
    EXPECT_EQ(demo::bucket_bytes(plan, WF{DemoValueEncoding::sign, DemoIndexEncoding::smallest}),
              32u + 8u + 8u + 128u + 4u + 4u + 8u);
    // fp32 + entropy: 64x64 chunks, k 32: l = 7, H = 4095 >> 7 = 31, 32*7 + 32 + 31 = 287 bits a chunk, 574 ->
    // 72 bytes; [7] with k 7: l = 0, H = 6, 13 bits -> 2 bytes -> 4 (padded)
    EXPECT_EQ(demo::bucket_bytes(plan, WF{DemoValueEncoding::fp32, DemoIndexEncoding::entropy}),
              32u + 256u + 72u + 28u + 4u);
    EXPECT_EQ(demo::reference_bytes(plan), (64u + 7u) * 12u);
}

namespace {

// codec.h's entropy layout, bit by bit: for each chunk the k low parts (l bits each, least significant first),
// then per item (h_i - h_{i-1}) zeros and a one, then zeros up to H; l and H counted here without the codec.
struct EfParams {
    size_t l = 0, high_max = 0, chunk_bits = 0;
};
EfParams ef_params(size_t U, size_t k) {
    EfParams p;
    while ((k << (p.l + 1)) <= U) p.l++;  // the largest l with k * 2^l <= U
    const size_t bucket_width = size_t{1} << p.l;
    p.high_max = (U + bucket_width - 1) / bucket_width - 1;  // ceil(U / 2^l) - 1
    p.chunk_bits = k * p.l + k + p.high_max;
    return p;
}
void ef_reference_chunk(std::vector<int>& bits, const uint32_t* x, size_t k, const EfParams& p) {
    for (size_t i = 0; i < k; i++)
        for (size_t b = 0; b < p.l; b++) bits.push_back(static_cast<int>((x[i] >> b) & 1u));
    size_t prev = 0;
    for (size_t i = 0; i < k; i++) {
        const size_t h = x[i] >> p.l;
        for (size_t z = prev; z < h; z++) bits.push_back(0);
        bits.push_back(1);
        prev = h;
    }
    for (size_t z = prev; z < p.high_max; z++) bits.push_back(0);
}
// The whole index part of a tensor (padded to 4 bytes), from its items.
std::vector<uint8_t> ef_reference_part(const demo::TensorPlan& t, const uint32_t* items) {
    const EfParams p = ef_params(t.chunk_elems, t.k);
    std::vector<int> bits;
    for (size_t c = 0; c < t.num_chunks; c++) ef_reference_chunk(bits, items + c * t.k, t.k, p);
    EXPECT_EQ(bits.size(), t.num_chunks * p.chunk_bits);
    std::vector<uint8_t> bytes(((bits.size() + 7) / 8 + 3) & ~size_t{3}, 0);
    for (size_t b = 0; b < bits.size(); b++) bytes[b / 8] |= static_cast<uint8_t>(bits[b] << (b % 8));
    return bytes;
}
double log2_binomial(size_t n, size_t k) {
    return (std::lgamma(double(n) + 1) - std::lgamma(double(k) + 1) - std::lgamma(double(n - k) + 1)) / std::log(2.0);
}

}  // namespace

TEST(entropy_indices_match_the_layout_at_many_sizes) {
    // 1-D tensors of 3 chunks of U (chunk = U): powers of two, primes, U = 1; k from 1 to U, index sets random, dense
    // at the start or the end of the chunk, and evenly spread.
    llmc::Rng rng(17);
    size_t cases = 0;
    for (size_t U : {1, 2, 3, 5, 7, 8, 31, 64, 100, 127, 257, 1000, 2400, 4093, 4096}) {
        std::vector<size_t> ks = {1, 2, 3, U / 2, U / 3, U - 1, U, 1 + rng.below(U), 1 + rng.below(U)};
        for (size_t k : ks) {
            if (k < 1 || k > U) continue;
            const demo::ModelPlan plan = demo::plan_model({{3 * U}}, U, k);
            const demo::TensorPlan& t = plan.tensors[0];
            EXPECT(t.chunk_elems == U && t.k == k && t.num_chunks == 3);
            demo::Selection sel;
            sel.resize(plan);
            std::vector<uint32_t> all(U);
            for (size_t c = 0; c < 3; c++) {
                uint32_t* x = sel.indices.data() + c * k;
                const uint64_t kind = rng.below(4);
                for (size_t i = 0; i < U; i++) all[i] = static_cast<uint32_t>(i);
                if (kind == 0) {
                    for (size_t i = 0; i < k; i++) std::swap(all[i], all[i + rng.below(U - i)]);
                    std::sort(all.begin(), all.begin() + static_cast<ptrdiff_t>(k));
                    std::copy(all.begin(), all.begin() + static_cast<ptrdiff_t>(k), x);
                } else {
                    for (size_t i = 0; i < k; i++)
                        x[i] = static_cast<uint32_t>(kind == 1 ? i : kind == 2 ? U - k + i : i * U / k);
                }
                for (size_t i = 0; i < k; i++) sel.values[c * k + i] = static_cast<float>(i) - 0.5f;
            }
            const demo::WireFormat format{DemoValueEncoding::fp32, DemoIndexEncoding::entropy};
            std::vector<std::byte> bucket;
            demo::encode_bucket(plan, format, sel, bucket);
            const EfParams p = ef_params(U, k);
            EXPECT_EQ(demo::entropy_chunk_bits(U, k), p.chunk_bits);
            EXPECT_EQ(static_cast<size_t>(demo::entropy_low_bits(U, k)), p.l);
            // the bits can never beat the information bound, and stay within 3 bits per index of log2(U / k)
            EXPECT(static_cast<double>(p.chunk_bits) + 1e-9 >= log2_binomial(U, k));
            EXPECT(static_cast<double>(p.chunk_bits) < double(k) * (std::log2(double(U) / double(k)) + 3.0));
            const size_t index_part = demo::index_part_bytes(t, DemoIndexEncoding::entropy);
            const std::vector<uint8_t> want = ef_reference_part(t, sel.indices.data());
            EXPECT_EQ(index_part, want.size());
            EXPECT_EQ(bucket.size(), demo::kBucketHeaderBytes + 3 * k * 4 + want.size());
            const size_t at = demo::kBucketHeaderBytes + 3 * k * 4;  // after the fp32 values
            if (bucket.size() == at + want.size()) EXPECT(std::memcmp(bucket.data() + at, want.data(), want.size()) == 0);
            demo::Selection back;
            demo::decode_bucket(plan, format, bucket, back, "test bucket");
            EXPECT(back.indices == sel.indices);
            EXPECT(back.values == sel.values);
            cases++;
        }
    }
    EXPECT(cases > 100);
}

TEST(entropy_corrupt_buckets_are_refused) {
    // [96, 50]: 2 chunks of 48 x 50 = 2400 elements, k = 4: l = 9, H = 4, 44 bits a chunk; the index part (after
    // 8 fp32 values) is 11 bytes of stream and one byte of padding.
    const demo::ModelPlan plan = demo::plan_model({{96, 50}}, 64, 4);
    const demo::TensorPlan& t = plan.tensors[0];
    EXPECT_EQ(demo::entropy_chunk_bits(t.chunk_elems, t.k), size_t{44});
    const demo::WireFormat format{DemoValueEncoding::fp32, DemoIndexEncoding::entropy};
    demo::Selection sel;
    sel.resize(plan);
    const uint32_t good[8] = {3, 700, 701, 2399, 0, 512, 1024, 2048};
    std::copy(good, good + 8, sel.indices.begin());
    std::vector<std::byte> bucket;
    demo::encode_bucket(plan, format, sel, bucket);
    const size_t part = demo::kBucketHeaderBytes + 8 * 4;
    EXPECT_EQ(bucket.size(), part + 12);
    demo::Selection out;
    demo::decode_bucket(plan, format, bucket, out, "rank 2's bucket");
    EXPECT(out.indices == sel.indices);
    auto with_items = [&](std::vector<uint32_t> items) {  // a bucket whose stream codes `items`, valid or not
        std::vector<std::byte> b = bucket;
        const std::vector<uint8_t> bytes = ef_reference_part(t, items.data());
        std::memcpy(b.data() + part, bytes.data(), bytes.size());
        return b;
    };
    EXPECT(with_items({3, 700, 701, 2399, 0, 512, 1024, 2048}) == bucket);
    auto flip = [&](size_t bit) {
        std::vector<std::byte> b = bucket;
        b[part + bit / 8] ^= std::byte(1u << (bit % 8));
        return b;
    };
    // chunk 0's unary part starts at bit 36: a one cleared, a one added
    EXPECT_ERROR(demo::decode_bucket(plan, format, flip(36 + 0), out, "rank 2's bucket"),
                 "rank 2's bucket: an entropy");
    EXPECT_ERROR(demo::decode_bucket(plan, format, flip(36 + 1), out, "rank 2's bucket"), "exactly k ones");
    EXPECT_ERROR(demo::decode_bucket(plan, format, with_items({3, 700, 700, 2399, 0, 1, 2, 3}), out, "b"),
                 "not strictly ascending");
    EXPECT_ERROR(demo::decode_bucket(plan, format, with_items({3, 700, 701, 2399, 5, 4, 1024, 2048}), out, "b"),
                 "not strictly ascending");
    // high part 4 (the largest) with low part 400: 4 * 512 + 400 = 2448 >= 2400
    EXPECT_ERROR(demo::decode_bucket(plan, format, with_items({3, 700, 701, 2448, 0, 1, 2, 3}), out, "b"),
                 "outside its chunk");
    EXPECT_ERROR(demo::decode_bucket(plan, format, flip(88), out, "b"), "padding");
    EXPECT_ERROR(demo::decode_bucket(plan, format, flip(95), out, "b"), "padding");
    {  // a stream that ends inside a byte: [7] with k = 7 takes 13 bits, bits 13-15 of its second byte are padding
        const demo::ModelPlan small = demo::plan_model({{7}}, 64, 7);
        demo::Selection all7;
        all7.resize(small);
        for (uint32_t i = 0; i < 7; i++) all7.indices[i] = i;
        std::vector<std::byte> b;
        demo::encode_bucket(small, format, all7, b);
        demo::decode_bucket(small, format, b, out, "b");
        b[demo::kBucketHeaderBytes + 7 * 4 + 1] ^= std::byte{1u << 5};
        EXPECT_ERROR(demo::decode_bucket(small, format, b, out, "b"), "padding");
    }
    EXPECT_ERROR(demo::decode_bucket(plan, format, std::span(bucket).first(bucket.size() - 4), out, "b"), "expected");
    EXPECT_ERROR(demo::decode_bucket(plan, {DemoValueEncoding::fp32, DemoIndexEncoding::smallest}, bucket, out, "b"),
                 "--demo_indices");
    // The encoder takes strictly ascending indices inside the chunk only.
    for (const std::vector<uint32_t>& items : std::vector<std::vector<uint32_t>>{
             {3, 2, 701, 2399, 0, 1, 2, 3}, {3, 3, 701, 2399, 0, 1, 2, 3}, {3, 700, 701, 2400, 0, 1, 2, 3}}) {
        std::copy(items.begin(), items.end(), sel.indices.begin());
        std::vector<std::byte> b;
        EXPECT_ERROR(demo::encode_bucket(plan, format, sel, b), "strictly ascending");
    }
}

TEST(bf16_rounds_to_nearest_even) {
    const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16 keeps 7 mantissa bits
    EXPECT_EQ(demo::round_to_bf16(one + std::ldexp(1.0f, -8)), one);               // halfway -> even (down)
    EXPECT_EQ(demo::round_to_bf16(one + 3 * std::ldexp(1.0f, -8)), one + 2 * ulp);  // halfway -> even (up)
    EXPECT_EQ(demo::round_to_bf16(one + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), one + ulp);  // above half
    EXPECT_EQ(demo::round_to_bf16(-3.0f), -3.0f);
    EXPECT_EQ(demo::round_to_bf16(0.0f), 0.0f);
    EXPECT(std::isnan(demo::round_to_bf16(std::nanf(""))));
    EXPECT(std::isinf(demo::round_to_bf16(3.4e38f)));  // rounds past the largest bf16, as RNE does
}

TEST(sign_quantizer) {
    float v[4] = {0.5f, -1.5f, 0.0f, 2.0f};
    const float scale = demo::quantize_chunk(DemoValueEncoding::sign, v, 4);
    EXPECT_EQ(scale, 1.0f);
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], -1.0f);
    EXPECT_EQ(v[2], 1.0f);  // one bit has no zero: zero is sent as +scale
    EXPECT_EQ(v[3], 1.0f);
    float z[3] = {0.0f, -0.0f, 0.0f};
    EXPECT_EQ(demo::quantize_chunk(DemoValueEncoding::sign, z, 3), 0.0f);
    EXPECT(z[0] == 0.0f && z[1] == 0.0f && z[2] == 0.0f);
}

TEST(mismatched_buckets_are_rejected) {
    const demo::ModelPlan plan = demo::plan_model(kAwkwardShapes, 64, 8);
    const demo::WireFormat format{DemoValueEncoding::fp32, DemoIndexEncoding::smallest};
    const demo::Selection sel = random_selection(plan, format.values, 5);
    std::vector<std::byte> bucket;
    demo::encode_bucket(plan, format, sel, bucket);
    demo::Selection out;

    const demo::ModelPlan other_topk = demo::plan_model(kAwkwardShapes, 64, 9);
    EXPECT_ERROR(demo::decode_bucket(other_topk, format, bucket, out, "bucket from rank 1"), "fingerprint");
    const demo::ModelPlan other_chunk = demo::plan_model(kAwkwardShapes, 32, 8);
    EXPECT_ERROR(demo::decode_bucket(other_chunk, format, bucket, out, "bucket from rank 1"), "rank 1");
    auto shapes = kAwkwardShapes;
    shapes.push_back({5});
    EXPECT_ERROR(demo::decode_bucket(demo::plan_model(shapes, 64, 8), format, bucket, out, "b"), "tensors");
    EXPECT_ERROR(demo::decode_bucket(plan, {DemoValueEncoding::bf16, DemoIndexEncoding::smallest}, bucket, out, "b"),
                 "--demo_values");
    EXPECT_ERROR(demo::decode_bucket(plan, {DemoValueEncoding::fp32, DemoIndexEncoding::packed12}, bucket, out, "b"),
                 "--demo_indices");
    EXPECT_ERROR(demo::decode_bucket(plan, format, std::span(bucket).first(bucket.size() - 4), out, "b"),
                 "expected");
    EXPECT_ERROR(demo::decode_bucket(plan, format, std::span(bucket).first(10), out, "b"), "header");

    std::vector<std::byte> bad = bucket;
    bad[0] = std::byte{'X'};
    EXPECT_ERROR(demo::decode_bucket(plan, format, bad, out, "b"), "magic");
    bad = bucket;
    bad[4] = std::byte{7};
    EXPECT_ERROR(demo::decode_bucket(plan, format, bad, out, "b"), "version");
    // An index past its chunk: the first tensor ([96, 50], 2400-element chunks, u16 indices) starts its
    // index part after 2 chunks * 8 fp32 values.
    bad = bucket;
    const uint16_t too_big = 2400;
    std::memcpy(bad.data() + demo::kBucketHeaderBytes + 16 * 4, &too_big, 2);
    EXPECT_ERROR(demo::decode_bucket(plan, format, bad, out, "b"), "corrupt");

    // packed12 is refused where a chunk exceeds 4096 elements.
    const demo::ModelPlan big = demo::plan_model({{128, 128}}, 128, 8);
    EXPECT_ERROR(demo::check_wire_format(big, {DemoValueEncoding::fp32, DemoIndexEncoding::packed12}),
                 "--demo_indices");
}

TEST_MAIN()
