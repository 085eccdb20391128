// Tests of DeMo's wire codec: exact round trips for every value and index encoding on awkward chunk shapes
// (1-D, 1x1 chunks, k = chunk elements, odd k so bit-packed groups straddle bytes), the byte-size formulas,
// bf16 round-to-nearest-even and the sign quantizer, and detection of buckets that do not match this rank.
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
    const DemoIndexEncoding index_encodings[] = {DemoIndexEncoding::smallest, DemoIndexEncoding::packed12};
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
    EXPECT_EQ(demo::reference_bytes(plan), (64u + 7u) * 12u);
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
