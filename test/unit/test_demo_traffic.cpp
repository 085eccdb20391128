// Tests of the DeMo traffic report: the paper's OLMo shapes must reproduce the DeMo paper's byte counts for its
// configs exactly, and our encodings must come out at the expected fractions.
#include <sstream>
#include <string>

#include "llmc/optim/demo/traffic_report.h"
#include "llmc/base/error.h"
#include "test/support/testing.h"

TEST(paper_300m_numbers) {
    const demo::TrafficSummary s = demo::summarize_traffic(demo::olmo_paper_shapes("300m"), {});
    EXPECT_EQ(s.params, 319946752u);
    EXPECT_EQ(s.chunks, 78112u);
    EXPECT_EQ(s.demo.size(), 6u);
    EXPECT_EQ(s.demo[0].topk, 1);
    EXPECT_EQ(s.demo[0].reference, 78112u * 12u);  // 0.937 MB
    EXPECT_EQ(s.demo[3].reference, 78112u * 8u * 12u);  // 7.499 MB
    EXPECT_EQ(s.demo[5].reference, 78112u * 32u * 12u);  // 29.995 MB
    // fp32 values + u16 indices: 6 bytes per coefficient instead of 12, plus 32 header bytes (every part of
    // every tensor is already a multiple of 4 bytes here).
    EXPECT_EQ(s.demo[5].ours[0][0], 32u + 78112u * 32u * 6u);
    EXPECT(s.demo[5].packed12_valid);
    // bf16 values + 12-bit indices: 2 + 1.5 bytes per coefficient (k = 32 keeps every part 4-byte aligned).
    EXPECT_EQ(s.demo[5].ours[1][1], 32u + 78112u * 32u * 7u / 2u);
    // fp32 values + entropy indices: 287 bits per 64x64 chunk at k = 32 (l = 7: 224 low bits, 32 ones, 31 zeros);
    // every tensor's chunk count is a multiple of 32, so no part needs padding.
    EXPECT_EQ(s.demo[5].ours[0][2], 32u + 78112u * 32u * 4u + 78112u * 287u / 8u);
    std::ostringstream out;
    demo::print_traffic_report(out, "paper 300m", demo::olmo_paper_shapes("300m"), {});
    for (const char* v : {"319,946,752", "78,112", "0.937", "7.499", "29.995"})
        EXPECT(out.str().find(v) != std::string::npos);
}

TEST(paper_1b_numbers) {
    const demo::TrafficSummary s = demo::summarize_traffic(demo::olmo_paper_shapes("1b"), {});
    EXPECT_EQ(s.params, 1176764416u);
    EXPECT_EQ(s.chunks, 287296u);
    EXPECT_EQ(s.demo[0].reference, 287296u * 12u);  // 3.448 MB
    EXPECT_EQ(s.demo[4].reference, 287296u * 16u * 12u);  // 55.161 MB
    EXPECT_EQ(s.demo[5].reference, 287296u * 32u * 12u);  // 110.322 MB
    std::ostringstream out;
    demo::print_traffic_report(out, "paper 1b", demo::olmo_paper_shapes("1b"), {});
    for (const char* v : {"1,176,764,416", "287,296", "3.448", "55.161", "110.322"})
        EXPECT(out.str().find(v) != std::string::npos);
}

TEST(gpt2_and_options) {
    llmc::ModelConfig c;  // d12
    const demo::TrafficSummary s = demo::summarize_traffic(demo::model_shapes(c), {8, 64, {32}});
    EXPECT_EQ(s.params, 124475904u);
    EXPECT_EQ(s.allreduce_fp32, uint64_t{2} * 7 * 124475904 * 4 / 8);
    // fp32 + smallest indices: 6 bytes per coefficient in 64x64 chunks, 5 in the 1-D tensors' 64-element
    // chunks (u8 indices): a little under half the reference's 12.
    EXPECT(s.demo[0].ours[0][0] * 2 < s.demo[0].reference);
    EXPECT(s.demo[0].ours[0][0] * 2 > s.demo[0].reference * 95 / 100);
    EXPECT_ERROR(demo::olmo_paper_shapes("7b"), "--paper");
    EXPECT_ERROR(demo::summarize_traffic(demo::model_shapes(c), {0, 64, {32}}), "--world");
    const demo::TrafficSummary big = demo::summarize_traffic(demo::model_shapes(c), {8, 128, {32}});
    EXPECT(!big.demo[0].packed12_valid);  // 128x128 chunks exceed 12 bits
    std::ostringstream out;
    demo::print_traffic_report(out, "d12", demo::model_shapes(c), {8, 128, {32}});
    EXPECT(out.str().find("n/a") != std::string::npos);
}

TEST_MAIN()
