// The flash attention kernels of llmc/cuda/flash_attention.cuh run on the CPU through emu/block_emulator.h
// (which emulates mma.sync m16n8k16 and ldmatrix from the PTX ISA's fragment tables) against a double-precision
// reference of causal softmax attention written from the definition: y_t = sum_{j<=t} p_tj v_j with
// p = softmax_j(q_t.k_j / 8), the log-sum-exp per row, and the backward dq, dk, dv for a random dy
// (dp_tj = dy_t.v_j, ds_tj = p_tj (dp_tj - sum_i p_ti dp_ti), dq_t = sum_j ds_tj k_j / 8,
// dk_j = sum_t ds_tj q_t / 8, dv_j = sum_t p_tj dy_t). Sequence lengths that are and are not multiples of the
// 64-row tile (up to GPT-2's 1024: 16 tiles), batch and heads above one. The default kernels are deterministic by
// construction (no atomic sums; dQ is summed from per-tile-pair shares), so every thread order gives the same
// bits (so do LLMC_FLASH_DQ=shares_bf16's, held to the same tolerance; LLMC_FLASH_DQ=atomic's dQ is held to the
// tolerance in three block orders, with every row converted by whichever warp adds last; LLMC_FLASH_DQ=shares_last's
// dQ, summed by whichever warp writes a query tile's share last, must be the shares' bits in three block orders);
// one warp at a time (emu::Order::WarpSerial) with shared memory poisoned and cp.async copies deferred to their
// wait also catches a missing barrier or wait, and once more with copies performed at issue a buffer refilled too
// early.
//
// Tolerances: the kernels round P and dS to bf16 for the tensor-core products (relative 2^-9 per term) and
// store y, dq, dk, dv in bf16, so each output tensor is held to max |err| <= 1.5e-2 x max |ref| and to an RMS
// error <= 5e-3 x RMS of the reference; lse (fp32, computed from fp32 logits) to 2e-4 absolute. A wrong fragment
// layout, mask or tile index gives errors of the order of the values themselves.
#include "emu/block_emulator.h"
// block_emulator.h first: the kernels below see its threadIdx, intrinsics and the mma emulation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "llmc/cuda/flash_attention.cuh"
#include "test/support/testing.h"

EMU_DEFINE_SHARED(llmc::flash, flash_smem)

namespace {

using emu::Dim3;
using emu::Order;
using llmc::flash::bf16;
namespace flash = llmc::flash;

constexpr int HS = flash::kHeadSize;

std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16_rn(v[i]);
    return out;
}
std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = __bfloat162float(v[i]);
    return out;
}

// Every block of the grid; dynamic shared memory poisoned (0xff bytes: bf16 and fp32 NaN) before each, as the
// GPU leaves it undefined: a fragment read from a tile row that was never staged shows up as NaN.
void launch(Dim3 grid, Order order, const std::function<void()>& kernel, unsigned threads = flash::kThreads) {
    emu::run_grid(Dim3{threads, 1, 1}, grid, order, 99, EMU_SHARED_BYTES, kernel);
}

// Relative error of a whole tensor against its reference: max and RMS, each over the reference's max / RMS.
void expect_tensor_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref) {
    EXPECT_EQ(got.size(), ref.size());
    double max_err = 0, max_ref = 0, se = 0, sr = 0;
    for (size_t i = 0; i < got.size() && i < ref.size(); i++) {
        const double e = std::fabs(double(got[i]) - ref[i]);
        max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
        max_ref = std::max(max_ref, std::fabs(ref[i]));
        se += e * e;
        sr += ref[i] * ref[i];
    }
    const double rel_max = max_err / max_ref, rel_rms = std::sqrt(se / sr);
    const bool ok = rel_max <= 1.5e-2 && rel_rms <= 5e-3;
    std::printf("  %-34s max err %.2e (%.2e of max |ref| %.3g), rms err %.2e of rms ref%s\n", what.c_str(), max_err,
                rel_max, max_ref, rel_rms, ok ? "" : "  FAIL");
    EXPECT(ok);
}

struct Reference {
    std::vector<double> y, lse, dqkv;
};

// Causal attention of qkv (B, T, 3, NH, HS) in double; lse in base 2.
Reference reference(const std::vector<float>& qkv, const std::vector<float>& dy, int B, int T, int NH) {
    const int C = NH * HS;
    const double scale = 1.0 / std::sqrt(double(HS));
    Reference r;
    r.y.assign(size_t(B) * T * C, 0.0);
    r.lse.assign(size_t(B) * NH * T, 0.0);
    r.dqkv.assign(size_t(B) * T * 3 * C, 0.0);
    auto at = [&](int b, int t, int part, int h) { return (size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * HS; };
    std::vector<double> p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += double(qkv[at(b, t, 0, h) + d]) * qkv[at(b, j, 1, h) + d];
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += std::exp(p[j] - mx);
                r.lse[(size_t(b) * NH + h) * T + t] = (mx + std::log(sum)) / std::log(2.0);
                for (int j = 0; j <= t; j++) p[j] = std::exp(p[j] - mx) / sum;
                const size_t yo = (size_t(b) * T + t) * C + size_t(h) * HS;
                for (int j = 0; j <= t; j++)
                    for (int d = 0; d < HS; d++) r.y[yo + d] += p[j] * qkv[at(b, j, 2, h) + d];
                // backward of row t
                double pdp = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += double(dy[yo + d]) * qkv[at(b, j, 2, h) + d];
                    dp[j] = s;
                    pdp += p[j] * s;
                }
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - pdp);
                    for (int d = 0; d < HS; d++) {
                        r.dqkv[at(b, t, 0, h) + d] += scale * ds * qkv[at(b, j, 1, h) + d];
                        r.dqkv[at(b, j, 1, h) + d] += scale * ds * qkv[at(b, t, 0, h) + d];
                        r.dqkv[at(b, j, 2, h) + d] += p[j] * dy[yo + d];
                    }
                }
            }
    return r;
}

struct Result {
    std::vector<bf16> y, dqkv;
    std::vector<float> lse, scratch;  // scratch: delta, then the dQ shares of the tile pairs or the accumulators
    bool forward_variants_agree = false;
};

// The backward's key-tile kernel as flash_attention_backward launches it, with its blocks run in `block_order`
// (a permutation of the grid's linear block indices): the shares kernel's blocks are independent, so any start
// order must give the same bits; the atomic dQ's last block to add to a query tile converts it.
void run_backward_kv(Result& r, flash::FlashDq dq, const std::vector<bf16>& qkv, const std::vector<bf16>& dy, int B,
                     int T, int NH, Order order, const std::vector<unsigned>& block_order) {
    const size_t rows = llmc::flash_attention_lse_floats(B, T, NH);
    const unsigned tiles = unsigned((T + flash::kTile - 1) / flash::kTile);
    const llmc::FlashBackwardScratchLayout layout = llmc::flash_backward_scratch_layout(B, T, NH, dq);
    float* delta = r.scratch.data();
    float* dq_scratch = r.scratch.data() + layout.dq;
    unsigned* dq_count = nullptr;
    if (dq == flash::FlashDq::Atomic || dq == flash::FlashDq::SharesLast) {
        dq_count = reinterpret_cast<unsigned*>(r.scratch.data() + layout.count);
        if (dq == flash::FlashDq::Atomic) std::fill(dq_scratch, r.scratch.data() + layout.count, 0.0f);
        std::memset(dq_count, 0, flash::dq_count_words(B * NH, T) * sizeof(unsigned));
    }
    const Dim3 grid{tiles, unsigned(B * NH), 1};
    const float sl2 = flash::softmax_scale_log2(), sc = flash::softmax_scale();
    for (unsigned linear : block_order) {
        std::memset(flash::flash_smem, 0xff, sizeof(flash::flash_smem));
        emu::run_block(Dim3{flash::kThreads, 1, 1}, Dim3{linear % tiles, linear / tiles, 0}, grid, order, 99, [&] {
            if (dq == flash::FlashDq::Atomic)
                flash::flash_attention_backward_kv_kernel<flash::FlashDq::Atomic>(
                    r.dqkv.data(), dq_scratch, dq_count, qkv.data(), dy.data(), r.lse.data(), delta, T, NH, sl2, sc);
            else if (dq == flash::FlashDq::SharesLast)
                flash::flash_attention_backward_kv_kernel<flash::FlashDq::SharesLast>(
                    r.dqkv.data(), dq_scratch, dq_count, qkv.data(), dy.data(), r.lse.data(), delta, T, NH, sl2, sc);
            else if (dq == flash::FlashDq::SharesBf16)
                flash::flash_attention_backward_kv_kernel<flash::FlashDq::SharesBf16>(
                    r.dqkv.data(), dq_scratch, nullptr, qkv.data(), dy.data(), r.lse.data(), delta, T, NH, sl2, sc);
            else
                flash::flash_attention_backward_kv_kernel<flash::FlashDq::Shares>(
                    r.dqkv.data(), dq_scratch, nullptr, qkv.data(), dy.data(), r.lse.data(), delta, T, NH, sl2, sc);
        });
    }
    const unsigned rblocks = unsigned((rows * (HS / 8) + 255) / 256);
    if (dq == flash::FlashDq::Shares)
        for (unsigned x = 0; x < rblocks; x++)
            emu::run_block(256, x, rblocks, order, 9,
                           [&] { flash::flash_attention_dq_reduce_kernel(r.dqkv.data(), dq_scratch, B, T, NH, sc); });
    if (dq == flash::FlashDq::SharesBf16) {
        const bf16* shares = reinterpret_cast<const bf16*>(dq_scratch);
        for (unsigned x = 0; x < rblocks; x++)
            emu::run_block(256, x, rblocks, order, 9,
                           [&] { flash::flash_attention_dq_reduce_kernel(r.dqkv.data(), shares, B, T, NH, sc); });
    }
}

// The grid's blocks in index order, reversed, or shuffled with `seed`.
std::vector<unsigned> block_order(unsigned blocks, int kind, uint32_t seed) {
    std::vector<unsigned> v(blocks);
    std::iota(v.begin(), v.end(), 0u);
    if (kind == 1) std::reverse(v.begin(), v.end());
    if (kind == 2) std::shuffle(v.begin(), v.end(), std::mt19937(seed));
    return v;
}

// The kernels as flash_attention_forward / flash_attention_backward launch them.
Result run(const std::vector<bf16>& qkv, const std::vector<bf16>& dy, int B, int T, int NH, Order order,
           flash::FlashDq dq = flash::FlashDq::Shares, int block_order_kind = 0) {
    const int C = NH * HS;
    const size_t rows = llmc::flash_attention_lse_floats(B, T, NH);
    Result r;
    r.y.assign(size_t(B) * T * C, __float2bfloat16_rn(NAN));
    r.dqkv.assign(size_t(B) * T * 3 * C, __float2bfloat16_rn(NAN));
    r.lse.assign(rows, NAN);
    // all bits set: an unwritten share is NaN, fp32 or bf16 (either half of a word)
    r.scratch.assign(llmc::flash_attention_backward_scratch_floats(B, T, NH, dq), 0.0f);
    std::memset(r.scratch.data(), 0xff, r.scratch.size() * sizeof(float));
    float* delta = r.scratch.data();
    const Dim3 grid{unsigned((T + flash::kTile - 1) / flash::kTile), unsigned(B * NH), 1};
    const float sl2 = flash::softmax_scale_log2();
    // The forward as launched (kForwardRowTiles, kForwardQueryTiles), then the other three: 1 or 2 row tiles per
    // warp, 64 or 128 queries per block (kept for timing against it). Each gives the same bits: the same products
    // in the same order per row.
    auto forward = [&]<int RT, int QT>(std::vector<bf16>& y, std::vector<float>& lse) {
        const Dim3 g{unsigned((T + QT * flash::kTile - 1) / (QT * flash::kTile)), unsigned(B * NH), 1};
        launch(g, order, [&] { flash::flash_attention_forward_kernel<RT, QT>(y.data(), lse.data(), qkv.data(), T, NH, sl2); },
               flash::forward_threads(RT, QT));
    };
    forward.template operator()<flash::kForwardRowTiles, flash::kForwardQueryTiles>(r.y, r.lse);
    r.forward_variants_agree = true;
    auto other = [&]<int RT, int QT>() {
        std::vector<bf16> y1(r.y.size(), __float2bfloat16_rn(NAN));
        std::vector<float> lse1(rows, NAN);
        forward.template operator()<RT, QT>(y1, lse1);
        r.forward_variants_agree = r.forward_variants_agree &&
                                   std::memcmp(y1.data(), r.y.data(), y1.size() * sizeof(bf16)) == 0 &&
                                   std::memcmp(lse1.data(), r.lse.data(), rows * sizeof(float)) == 0;
    };
    other.template operator()<1, 1>();
    other.template operator()<2, 1>();
    other.template operator()<1, 2>();
    other.template operator()<2, 2>();
    const unsigned dblocks = flash::flash_delta_blocks(rows);
    for (unsigned x = 0; x < dblocks; x++)
        emu::run_block(flash::kDeltaThreads, x, dblocks, order, 7,
                       [&] { flash::flash_attention_delta_kernel(delta, dy.data(), r.y.data(), B, T, NH); });
    run_backward_kv(r, dq, qkv, dy, B, T, NH, order, block_order(grid.x * grid.y, block_order_kind, 5));
    return r;
}

void check_flash(int B, int T, int NH, uint64_t seed) {
    std::printf("  B=%d T=%d NH=%d HS=%d\n", B, T, NH, HS);
    const int C = NH * HS;
    // q, k ~ N(0, 1.5^2): logits q.k / 8 of standard deviation ~1.1, so softmax rows are neither flat nor one-hot.
    std::vector<float> qkv = testing::random_normal(size_t(B) * T * 3 * C, seed, 1.5);
    std::vector<float> dy = testing::random_normal(size_t(B) * T * C, seed + 1, 1.0);
    const std::vector<bf16> qkv_b = to_bf16(qkv), dy_b = to_bf16(dy);
    qkv = to_float(qkv_b);  // the reference sees exactly the kernels' inputs
    dy = to_float(dy_b);
    const Reference ref = reference(qkv, dy, B, T, NH);
    const Result got = run(qkv_b, dy_b, B, T, NH, Order::Forward);

    expect_tensor_close("y (forward)", to_float(got.y), ref.y);
    std::printf("  %-34s %s\n", "forward, 1/2 row tiles, 64/128 rows",
                got.forward_variants_agree ? "same bits" : "DIFFERENT BITS  FAIL");
    EXPECT(got.forward_variants_agree);
    double lse_err = 0;
    for (size_t i = 0; i < ref.lse.size(); i++) lse_err = std::max(lse_err, std::fabs(double(got.lse[i]) - ref.lse[i]));
    std::printf("  %-34s max err %.2e%s\n", "lse (base 2)", lse_err, lse_err <= 2e-4 ? "" : "  FAIL");
    EXPECT(lse_err <= 2e-4);
    // dq, dk, dv separately: each has its own scale and its own kernel
    auto check_backward = [&](const Result& res, const char* label) {
        const std::vector<float> dqkv = to_float(res.dqkv);
        for (int part = 0; part < 3; part++) {
            std::vector<float> g;
            std::vector<double> r;
            for (size_t row = 0; row < size_t(B) * T; row++)
                for (int c = 0; c < C; c++) {
                    g.push_back(dqkv[row * 3 * C + size_t(part) * C + c]);
                    r.push_back(ref.dqkv[row * 3 * C + size_t(part) * C + c]);
                }
            expect_tensor_close(std::string("d") + "qkv"[part] + label, g, r);
        }
    };
    {  // delta = rowsum(dy * y) of the forward's own (bf16) y, against a double sum; bound 1e-5 x sum |dy y|
        const std::vector<float> y = to_float(got.y);
        double worst = 0.0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < NH; h++) {
                    double sum = 0.0, mag = 0.0;
                    for (int d = 0; d < HS; d++) {
                        const size_t i = (size_t(b) * T + t) * C + size_t(h) * HS + d;
                        sum += double(dy[i]) * y[i];
                        mag += std::fabs(double(dy[i]) * y[i]);
                    }
                    const double err = std::fabs(got.scratch[(size_t(b) * NH + h) * T + t] - sum) / (mag + 1e-30);
                    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
                }
        std::printf("  %-34s max err %.2e of sum |dy y|%s\n", "delta = rowsum(dy * y)", worst, worst <= 1e-5 ? "" : "  FAIL");
        EXPECT(worst <= 1e-5);
    }
    check_backward(got, " (backward)");
    auto same_bits = [](const Result& a, const Result& b) {
        return std::memcmp(a.y.data(), b.y.data(), b.y.size() * sizeof(bf16)) == 0 &&
               std::memcmp(a.lse.data(), b.lse.data(), b.lse.size() * sizeof(float)) == 0 &&
               std::memcmp(a.dqkv.data(), b.dqkv.data(), b.dqkv.size() * sizeof(bf16)) == 0;
    };

    // the last run performs cp.async copies when issued (emu::cp_async_eager), so a buffer refilled while another
    // warp still reads it shows up too; the others defer them to the wait
    const Order orders[] = {Order::Reverse, Order::Shuffled, Order::WarpSerial, Order::WarpSerial};
    for (int run_index = 0; run_index < 4; run_index++) {
        const Order order = orders[run_index];
        emu::cp_async_eager() = run_index == 3;
        const Result again = run(qkv_b, dy_b, B, T, NH, order);
        emu::cp_async_eager() = false;
        const bool same = same_bits(again, got);
        const char* name = run_index == 3             ? "one warp at a time, eager cp.async"
                           : order == Order::Reverse  ? "reverse thread order"
                           : order == Order::Shuffled ? "shuffled thread order"
                                                      : "one warp at a time";
        std::printf("  %-34s %s\n", name, same ? "same bits" : "DIFFERENT BITS  FAIL");
        EXPECT(same);
    }

    // The bf16 shares: dK and dV the same bits (the same products), dQ within the tolerance, and the same bits in
    // every block and thread order (one owner per share element, one summation order).
    {
        const Result bf16_shares = run(qkv_b, dy_b, B, T, NH, Order::Forward, flash::FlashDq::SharesBf16);
        check_backward(bf16_shares, " (bf16 dQ shares)");
        const Result again = run(qkv_b, dy_b, B, T, NH, Order::WarpSerial, flash::FlashDq::SharesBf16, 2);
        bool kv_same = true;
        for (size_t row = 0; row < size_t(B) * T; row++)
            kv_same = kv_same && std::memcmp(bf16_shares.dqkv.data() + row * 3 * C + C,
                                             got.dqkv.data() + row * 3 * C + C, 2 * C * sizeof(bf16)) == 0;
        const bool rerun_same = same_bits(again, bf16_shares);
        const char* verdict[2] = {"DIFFERENT BITS  FAIL", "same bits"};
        std::printf("  %-34s %s\n", "bf16 dQ shares: dk, dv as shares", verdict[kv_same]);
        std::printf("  %-34s %s\n", "bf16 dQ shares: blocks shuffled", verdict[rerun_same]);
        EXPECT(kv_same);
        EXPECT(rerun_same);
    }

    // Shares summed by the last key tile to write: the same bits as the shares' sum kernel whichever block writes
    // a query tile's share last (blocks in index order, reversed, shuffled; a row no warp sums stays NaN).
    for (int blocks = 0; blocks < 3; blocks++) {
        const Order order = blocks == 2 ? Order::WarpSerial : Order::Forward;
        const Result last = run(qkv_b, dy_b, B, T, NH, order, flash::FlashDq::SharesLast, blocks);
        const bool same = same_bits(last, got);
        const char* names[3] = {"shares summed last: blocks in order", "shares summed last: blocks reversed",
                                "shares summed last: shuffled, warps"};
        std::printf("  %-34s %s\n", names[blocks], same ? "same bits" : "DIFFERENT BITS  FAIL");
        EXPECT(same);
    }

    // The atomic dQ: dK and dV the same bits (the same products), dQ within the tolerance whichever block adds
    // last and so converts a query tile's rows (blocks here run one at a time, each start order one of the GPU's
    // sums; an unconverted row stays NaN and fails).
    const struct {
        Order order;
        int blocks;
        const char* label;
    } atomic_runs[] = {{Order::Forward, 0, " (atomic dQ)"},
                       {Order::Reverse, 1, " (atomic dQ, blocks reversed)"},
                       {Order::WarpSerial, 2, " (atomic dQ, blocks shuffled, warps)"}};
    for (const auto& a : atomic_runs) {
        const Result atomic = run(qkv_b, dy_b, B, T, NH, a.order, flash::FlashDq::Atomic, a.blocks);
        check_backward(atomic, a.label);
        bool same = true;
        for (size_t row = 0; row < size_t(B) * T; row++)
            same = same && std::memcmp(atomic.dqkv.data() + row * 3 * C + C, got.dqkv.data() + row * 3 * C + C,
                                       2 * C * sizeof(bf16)) == 0;
        std::printf("  %-34s %s\n", "atomic dQ: dk, dv as with shares", same ? "same bits" : "DIFFERENT BITS  FAIL");
        EXPECT(same);
    }
}

TEST(flash_attention_one_tile) { check_flash(1, 64, 2, 11); }
TEST(flash_attention_partial_tiles) { check_flash(2, 100, 2, 12); }  // batch and heads both above one
TEST(flash_attention_four_tiles) { check_flash(1, 229, 2, 13); }
TEST(flash_attention_gpt2_length) { check_flash(1, 1024, 1, 14); }  // 16 tiles: many buffer swaps, 136 tile pairs

// SharesLast's in-kernel sum against the sum kernel's arithmetic written out on the host (0 + s_0 + s_1 ...,
// times scale, rounded to bf16 once). A sum of the attention test's shares rarely shows another order in bf16, so
// here the slots of each element are terms of ~2^20 that cancel in pairs (slot s and s + n/2) plus terms of ~1:
// the partial sums' fp32 rounding is a few percent of the result, and most elements' bits depend on the order.
// Every slot count from 1 to 16 (odd ones end on the unpaired slot), and a tile that ends past T.
TEST(flash_shares_last_sum) {
    constexpr int kRows = 16, kStride = 3 * HS;  // one warp's rows, as dqkv's q part of one head
    std::mt19937 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int order_sensitive = 0;
    for (int shares = 1; shares <= 16; shares++) {
        std::vector<float> slots(size_t(shares) * flash::kShareFloats);
        for (float& v : slots) v = normal(rng);
        const int half = shares / 2;
        for (size_t e = 0; e < flash::kShareFloats; e++)
            for (int s = 0; s < half; s++) {
                const float large = std::ldexp(normal(rng), 20);
                slots[size_t(s) * flash::kShareFloats + e] += large;
                slots[size_t(s + half) * flash::kShareFloats + e] -= large;
            }
        const int q0 = 64 + 16 * (shares % 4), T = shares == 7 ? q0 + 5 : 1024;  // 7: rows q0 + 5 .. past T
        const float scale = flash::softmax_scale();
        std::vector<bf16> dq(size_t(q0 + kRows) * kStride, __float2bfloat16_rn(NAN));
        emu::run_block(32, 0, 1, Order::Shuffled, 17, [&] {
            flash::sum_shares_last(dq.data(), kStride, slots.data(), shares, q0, T, scale, int(threadIdx.x));
        });
        bool ok = true;
        for (int r = 0; r < kRows; r++)
            for (int c = 0; c < HS; c++) {
                float sum = 0.0f, reversed = 0.0f;
                for (int s = 0; s < shares; s++) sum += slots[size_t(s) * flash::kShareFloats + r * HS + c];
                for (int s = shares - 1; s >= 0; s--) reversed += slots[size_t(s) * flash::kShareFloats + r * HS + c];
                const bf16 got = dq[size_t(q0 + r) * kStride + c];
                const bf16 want = q0 + r < T ? __float2bfloat16_rn(sum * scale) : __float2bfloat16_rn(NAN);
                ok = ok && std::memcmp(&got, &want, sizeof(bf16)) == 0;
                order_sensitive += __float2bfloat16_rn(reversed * scale) != __float2bfloat16_rn(sum * scale);
            }
        if (!ok) std::printf("  %d slots: DIFFERENT BITS from the sum kernel's order  FAIL\n", shares);
        EXPECT(ok);
    }
    std::printf("  1-16 slots: the sum kernel's bits (%d of %d elements would differ summed in reverse)\n",
                order_sensitive, 16 * kRows * HS);
    EXPECT(order_sensitive > 16 * kRows * HS / 4);  // the test can tell the orders apart
}

TEST(flash_attention_support) {
    EXPECT(llmc::flash_attention_unsupported(768, 12).empty() == !llmc::kFloatXIsFloat);
    EXPECT(!llmc::flash_attention_unsupported(768, 6).empty());  // head size 128
    EXPECT(llmc::flash_attention_unsupported(768, 6).find("head size 64") != std::string::npos ||
           llmc::kFloatXIsFloat);
}

// The emulated mma.sync itself, against a plain 16 x 8 x 16 product of the matrices the fragments encode.
TEST(emulated_mma_layout) {
    std::vector<float> A = testing::random_normal(16 * 16, 5, 1.0), Bm = testing::random_normal(16 * 8, 6, 1.0);
    A = to_float(to_bf16(A));
    Bm = to_float(to_bf16(Bm));
    std::vector<float> D(16 * 8, 0.0f);
    emu::run_block(32, 0, 1, Order::Shuffled, 3, [&] {
        const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
        auto a = [&](int r, int c) { return A[size_t(r) * 16 + c]; };
        auto b = [&](int r, int c) { return Bm[size_t(r) * 8 + c]; };
        const uint32_t af[4] = {flash::pack_bf16x2(a(g, 2 * t), a(g, 2 * t + 1)),
                                flash::pack_bf16x2(a(g + 8, 2 * t), a(g + 8, 2 * t + 1)),
                                flash::pack_bf16x2(a(g, 2 * t + 8), a(g, 2 * t + 9)),
                                flash::pack_bf16x2(a(g + 8, 2 * t + 8), a(g + 8, 2 * t + 9))};
        float d[4] = {1.0f, 2.0f, 3.0f, 4.0f};
        flash::mma_16816(d, af, flash::pack_bf16x2(b(2 * t, g), b(2 * t + 1, g)),
                         flash::pack_bf16x2(b(2 * t + 8, g), b(2 * t + 9, g)));
        D[size_t(g) * 8 + 2 * t] = d[0] - 1.0f;
        D[size_t(g) * 8 + 2 * t + 1] = d[1] - 2.0f;
        D[size_t(g + 8) * 8 + 2 * t] = d[2] - 3.0f;
        D[size_t(g + 8) * 8 + 2 * t + 1] = d[3] - 4.0f;
    });
    double err = 0;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += double(A[size_t(r) * 16 + k]) * Bm[size_t(k) * 8 + c];
            err = std::max(err, std::fabs(s - D[size_t(r) * 8 + c]));
        }
    std::printf("  emulated mma vs plain product: max err %.2e\n", err);
    EXPECT(err < 1e-5);
}

// The emulated ldmatrix (plain and .trans) against the fragment each lane must hold: A fragments of a
// row-major 16 x 16 tile, and the B fragments for a tile whose rows are k (read transposed).
TEST(emulated_ldmatrix_layout) {
    std::vector<bf16> tile(size_t(16) * flash::kPitch);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < flash::kPitch; c++) tile[size_t(r) * flash::kPitch + c] = __float2bfloat16_rn(float(r * 16 + c % 16));
    auto at = [&](int r, int c) { return float(r * 16 + c); };  // exact in bf16 (< 256)
    int bad = 0;
    emu::run_block(32, 0, 1, Order::Shuffled, 4, [&] {
        const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
        uint32_t a[4], b[4];
        flash::load_a(a, tile.data(), 0, 0, lane);
        const float want_a[4][2] = {{at(g, 2 * t), at(g, 2 * t + 1)},
                                    {at(g + 8, 2 * t), at(g + 8, 2 * t + 1)},
                                    {at(g, 2 * t + 8), at(g, 2 * t + 9)},
                                    {at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9)}};
        // B[k][n] = tile[k][n] for n-tiles 0 and 1: b0 = B[2t..2t+1][g], b1 = B[2t+8..][g], then n + 8
        flash::ldmatrix_x4<true>(b, tile.data() + (lane & 15) * flash::kPitch + (lane >> 4) * 8);
        const float want_b[4][2] = {{at(2 * t, g), at(2 * t + 1, g)},
                                    {at(2 * t + 8, g), at(2 * t + 9, g)},
                                    {at(2 * t, g + 8), at(2 * t + 1, g + 8)},
                                    {at(2 * t + 8, g + 8), at(2 * t + 9, g + 8)}};
        // the A fragment of the transposed tile (dS from dS^T): A[r][c] = tile[c][r]
        uint32_t at_[4];
        flash::load_a_trans(at_, tile.data(), 0, 0, lane);
        const float want_at[4][2] = {{at(2 * t, g), at(2 * t + 1, g)},
                                     {at(2 * t, g + 8), at(2 * t + 1, g + 8)},
                                     {at(2 * t + 8, g), at(2 * t + 9, g)},
                                     {at(2 * t + 8, g + 8), at(2 * t + 9, g + 8)}};
        for (int i = 0; i < 4; i++) {
            bad += flash::bf16_lo(a[i]) != want_a[i][0] || flash::bf16_hi(a[i]) != want_a[i][1];
            bad += flash::bf16_lo(b[i]) != want_b[i][0] || flash::bf16_hi(b[i]) != want_b[i][1];
            bad += flash::bf16_lo(at_[i]) != want_at[i][0] || flash::bf16_hi(at_[i]) != want_at[i][1];
        }
    });
    std::printf("  ldmatrix fragments: %d of 384 registers wrong\n", bad);
    EXPECT_EQ(bad, 0);
}

// The emulator's own traps, each of which stands for a GPU fault or hang that x86 would let pass: vector
// accesses off their alignment (ldmatrix rows, cp.async, the kernels' 32-bit pair stores) and a
// __syncthreads that only part of the block reaches.
TEST(emulator_traps_gpu_faults) {
    alignas(16) static bf16 smem_like[256];
    alignas(16) static bf16 global_like[256];
    EXPECT_ABORTS(emu::run_block(32, 0, 1, Order::Forward, 1, [&] {
                      uint32_t r[4];
                      flash::ldmatrix_x4<false>(r, smem_like + 8 * (threadIdx.x % 8) + (threadIdx.x == 5 ? 1 : 0));
                  }),
                  "misaligned 16-byte access (ldmatrix row address");
    EXPECT_ABORTS(emu::run_block(32, 0, 1, Order::Forward, 1, [&] {
                      llmc::cp_async<16>(smem_like + 8 * threadIdx.x + 4, global_like, true);
                  }),
                  "misaligned 16-byte access (cp.async shared-memory destination");
    EXPECT_ABORTS(emu::run_block(32, 0, 1, Order::Forward, 1, [&] {
                      llmc::cp_async<16>(smem_like + 8 * threadIdx.x, global_like + 1, false);
                  }),
                  "misaligned 16-byte access (cp.async global source");
    EXPECT_ABORTS(emu::run_block(32, 0, 1, Order::Forward, 1, [&] { flash::store_bf16x2(global_like + 1, 0u); }),
                  "misaligned 4-byte access");
    EXPECT_ABORTS(emu::run_block(64, 0, 1, Order::Forward, 1, [&] {
                      if (threadIdx.x < 32) __syncthreads();
                  }),
                  "__syncthreads not reached by every thread");
    // and the same calls, aligned, run through
    emu::run_block(32, 0, 1, Order::Forward, 1, [&] {
        uint32_t r[4];
        flash::ldmatrix_x4<false>(r, smem_like + 8 * (threadIdx.x % 8));
        llmc::cp_async<16>(smem_like + 8 * threadIdx.x, global_like + 8 * threadIdx.x, true);
        llmc::cp_async_commit();
        llmc::cp_async_wait<0>();
        flash::store_bf16x2(global_like + 2 * threadIdx.x, 0u);
    });
}

}  // namespace

TEST_MAIN()
