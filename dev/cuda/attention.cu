// Checker for llmc/cuda/attention.cuh (the cuBLAS + softmax path) and llmc/cuda/flash_attention.cuh: causal attention
// forward and backward against one CPU implementation per head in double, on a GPT-2 head layout (C=768,
// 12 heads), the tiny test model's (C=64, 4 heads, T=32), head size 12 with T=37, and head size 64 with T=200.
//   matmul path: forward out and the kept softmax probabilities, backward d qkv.
//   flash (bf16 build, head size 64; other shapes print why they are skipped): forward out, the log-sum-exp
//   (base 2, max abs error 1e-3), the other forward shapes (2 row tiles per warp, 128 queries per block: the same
//   bits), backward d qkv from the flash forward's out and lse with every dQ summation (flash::FlashDq): the
//   default per-pair shares, and a rerun that must give the same bits (no atomics); the shares summed by the last
//   key tile to write (opt-in), three runs with the shares' bits; the bf16 shares (opt-in) against the
//   reference, with the shares' dK, dV bits and a bit-identical rerun; the atomic dQ (opt-in, not deterministic)
//   against the reference on three runs, with the shares' dK, dV bits (the same products). T=200 is not a
//   multiple of the 64-row tiles, so the partial last tile is covered. Outputs are prefilled with NaN bits, so an
//   element a kernel never writes fails.
// Then timing (median of several runs) of both paths at B=8 and B=16, T=1024, C=768, and flash / matmul.
// bf16 builds round preatt/att/datt (flash: P and dS) to bf16 between the steps: a preatt of size ~2 rounded
// to bf16 moves its probability by up to ~1%, so each output is checked against a bound proportional to the
// magnitude of the terms it sums (sum of |att * v| for out, the like for the gradients), not to the output's
// own size, which can cancel to near zero. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <algorithm>
#include <array>
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/flash_attention.cuh"

using namespace llmc;

// The CPU reference (double, stored as float) of one shape, with for each output the sum of the absolute
// values of the terms it adds up (the bound of compare_bound).
struct Reference {
    std::vector<float> out, att, lse, dqkv;  // lse (B*NH, T) in base 2, as flash_attention_forward writes it
    std::vector<float> mag_out, mag_dqkv;
};

static Reference reference(const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int C,
                           int NH) {
    const int HS = C / NH;
    const double scale = 1.0 / std::sqrt(double(HS));
    Reference r;
    r.out.assign(size_t(B) * T * C, 0.0f);
    r.att.assign(size_t(B) * NH * T * T, 0.0f);
    r.lse.assign(size_t(B) * NH * T, 0.0f);
    r.dqkv.assign(qkv.size(), 0.0f);
    r.mag_out.assign(r.out.size(), 0.0f);
    r.mag_dqkv.assign(qkv.size(), 0.0f);

#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto at = [&](int t, int which, int d) { return double(qkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]); };
            std::vector<double> att(size_t(T) * T, 0.0), datt(T);
            for (int t = 0; t < T; t++) {
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += at(t, 0, d) * at(u, 1, d);
                    att[size_t(t) * T + u] = s * scale;
                    mx = std::max(mx, s * scale);
                }
                double sum = 0;
                for (int u = 0; u <= t; u++) sum += (att[size_t(t) * T + u] = std::exp(att[size_t(t) * T + u] - mx));
                for (int u = 0; u <= t; u++) att[size_t(t) * T + u] /= sum;
                r.lse[(size_t(b) * NH + h) * T + t] = float((mx + std::log(sum)) / std::log(2.0));
                for (int u = 0; u < T; u++) r.att[((size_t(b) * NH + h) * T + t) * T + u] = float(att[size_t(t) * T + u]);
                for (int d = 0; d < HS; d++) {
                    double y = 0, m = 0;
                    for (int u = 0; u <= t; u++) {
                        y += att[size_t(t) * T + u] * at(u, 2, d);
                        m += att[size_t(t) * T + u] * std::fabs(at(u, 2, d));
                    }
                    r.out[(size_t(b) * T + t) * C + h * HS + d] = float(y);
                    r.mag_out[(size_t(b) * T + t) * C + h * HS + d] = float(m);
                }
            }
            // backward
            auto dq = [&](int t, int which, int d) -> float& { return r.dqkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]; };
            auto mq = [&](int t, int which, int d) -> float& { return r.mag_dqkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]; };
            std::vector<double> datt_mag(T);
            for (int t = 0; t < T; t++) {
                const float* dy = &dout[(size_t(b) * T + t) * C + h * HS];
                double dot = 0, dot_mag = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0, m = 0;
                    for (int d = 0; d < HS; d++) {
                        s += dy[d] * at(u, 2, d);
                        m += std::fabs(dy[d] * at(u, 2, d));
                    }
                    datt[u] = s;
                    datt_mag[u] = m;
                    dot += s * att[size_t(t) * T + u];
                    dot_mag += m * att[size_t(t) * T + u];
                    for (int d = 0; d < HS; d++) {
                        dq(u, 2, d) += float(att[size_t(t) * T + u] * dy[d]);
                        mq(u, 2, d) += float(att[size_t(t) * T + u] * std::fabs(dy[d]));
                    }
                }
                for (int u = 0; u <= t; u++) {
                    const double dpre = scale * att[size_t(t) * T + u] * (datt[u] - dot);
                    const double dpre_mag = scale * att[size_t(t) * T + u] * (datt_mag[u] + dot_mag);
                    for (int d = 0; d < HS; d++) {
                        dq(t, 0, d) += float(dpre * at(u, 1, d));
                        dq(u, 1, d) += float(dpre * at(t, 0, d));
                        mq(t, 0, d) += float(dpre_mag * std::fabs(at(u, 1, d)));
                        mq(u, 1, d) += float(dpre_mag * std::fabs(at(t, 0, d)));
                    }
                }
            }
        }
    return r;
}

// The q, k and v parts of a (B, T, 3C) gradient compared separately (different scales).
static void compare_dqkv(check::Checker& ck, const std::string& prefix, const std::string& label,
                         const std::vector<float>& g, const Reference& ref, int B, int T, int C, float factor) {
    for (int which = 0; which < 3; which++) {
        std::vector<float> gw, rw, mw;
        for (size_t bt = 0; bt < size_t(B) * T; bt++)
            for (int c = 0; c < C; c++) {
                gw.push_back(g[bt * 3 * C + which * C + c]);
                rw.push_back(ref.dqkv[bt * 3 * C + which * C + c]);
                mw.push_back(ref.mag_dqkv[bt * 3 * C + which * C + c]);
            }
        const char* names[3] = {"dq ", "dk ", "dv "};
        ck.compare_bound(prefix + names[which] + label, gw, rw, mw, factor);
    }
}

// Whether two device buffers hold the same bits.
template <typename T>
static bool same_bits(const DeviceBuffer<T>& a, const DeviceBuffer<T>& b) {
    const auto x = a.download(), y = b.download();
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

// Scratch for the flash backward with any dQ summation (the bf16 shares need the least).
static size_t flash_scratch_floats(int B, int T, int NH) {
    return std::max(flash_attention_backward_scratch_floats(B, T, NH, flash::FlashDq::SharesLast),
                    flash_attention_backward_scratch_floats(B, T, NH, flash::FlashDq::Atomic));
}

// Whether dK and dV (the k and v parts of two (B*T, 3C) gradients) hold the same values.
static bool same_dk_dv(const std::vector<float>& a, const std::vector<float>& b, size_t rows, int C) {
    for (size_t row = 0; row < rows; row++)
        if (std::memcmp(a.data() + row * 3 * C + C, b.data() + row * 3 * C + C, 2 * C * sizeof(float)) != 0)
            return false;
    return true;
}

// Flash attention on the same inputs as the matmul path, against the same reference.
static void check_flash(CudaEnv& env, check::Checker& ck, const Reference& ref, const std::vector<float>& qkv,
                        const std::vector<float>& dout, int B, int T, int C, int NH, const std::string& label,
                        float factor) {
    const std::string why = flash_attention_unsupported(C, NH);
    if (!why.empty()) {
        std::printf("  flash %s skipped: %s\n", label.c_str(), why.c_str());
        return;
    }
    auto d_qkv = check::to_device_floatX(qkv);  // a fresh copy: attention_forward clobbered the first
    auto d_dout = check::to_device_floatX(dout);
    const size_t btc = size_t(B) * T * C, rows = flash_attention_lse_floats(B, T, NH);
    DeviceBuffer<floatX> out(btc), dqkv(3 * btc), dqkv2(3 * btc);
    DeviceBuffer<float> lse(rows), scratch(flash_scratch_floats(B, T, NH));
    // All-ones bits are NaN in bf16 and fp32: an element no kernel writes fails its comparison (the scratch too:
    // a dQ share the backward forgot to write poisons its row). The second backward's buffer starts as zeros, so
    // an unwritten element also breaks the bit-identical check.
    CUDA_CHECK(cudaMemsetAsync(out.data(), 0xff, out.bytes(), env.stream));
    CUDA_CHECK(cudaMemsetAsync(lse.data(), 0xff, lse.bytes(), env.stream));
    CUDA_CHECK(cudaMemsetAsync(dqkv.data(), 0xff, dqkv.bytes(), env.stream));
    CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0xff, scratch.bytes(), env.stream));
    CUDA_CHECK(cudaMemsetAsync(dqkv2.data(), 0, dqkv2.bytes(), env.stream));
    flash_attention_forward(env, out.data(), lse.data(), d_qkv.data(), B, T, C, NH);
    env.sync();
    ck.compare_bound("flash forward out " + label, check::from_device_floatX(out), ref.out, ref.mag_out, factor);
    ck.compare("flash forward lse " + label, check::from_device(lse), ref.lse, 1e-3f, 0.0f);
    {  // the other forwards (1 or 2 row tiles per warp, 64 or 128 queries per block) run the same products per
       // row: the same bits
        DeviceBuffer<floatX> out1(btc);
        DeviceBuffer<float> lse1(rows);
        auto same_as_default = [&]<int RT, int QT>(const char* what) {
            CUDA_CHECK(cudaMemsetAsync(out1.data(), 0xff, out1.bytes(), env.stream));
            CUDA_CHECK(cudaMemsetAsync(lse1.data(), 0xff, lse1.bytes(), env.stream));
            flash_attention_forward<RT, QT>(env, out1.data(), lse1.data(), d_qkv.data(), B, T, C, NH);
            env.sync();
            ck.expect(same_bits(out, out1) && same_bits(lse, lse1),
                      std::string("flash forward bit-identical with ") + what + " " + label);
        };
        same_as_default.template operator()<1, 1>("1 row tile per warp, 64 queries per block");
        same_as_default.template operator()<2, 1>("2 row tiles per warp, 64 queries per block");
        same_as_default.template operator()<1, 2>("1 row tile per warp, 128 queries per block");
        same_as_default.template operator()<2, 2>("2 row tiles per warp, 128 queries per block");
    }
    auto backward = [&](DeviceBuffer<floatX>& g, flash::FlashDq dq) {
        flash_attention_backward(env, g.data(), scratch.data(), d_dout.data(), out.data(), d_qkv.data(), lse.data(), B,
                                 T, C, NH, dq);
        env.sync();
    };
    backward(dqkv, flash::FlashDq::Shares);
    compare_dqkv(ck, "flash backward ", label, check::from_device_floatX(dqkv), ref, B, T, C, 2 * factor);
    backward(dqkv2, flash::FlashDq::Shares);
    ck.expect(same_bits(dqkv, dqkv2), "flash backward bit-identical on rerun " + label);
    const std::vector<float> shares = check::from_device_floatX(dqkv);
    // The shares summed by the last key tile to write: the sum kernel's order and arithmetic, so its bits, whichever
    // block writes a query tile's share last (three runs; a row no warp sums stays NaN).
    for (int run = 0; run < 3; run++) {
        CUDA_CHECK(cudaMemsetAsync(dqkv2.data(), 0xff, dqkv2.bytes(), env.stream));
        CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0xff, scratch.bytes(), env.stream));
        backward(dqkv2, flash::FlashDq::SharesLast);
        ck.expect(same_bits(dqkv, dqkv2), "flash backward with the shares summed last bit-identical to the shares, "
                                          "run " + std::to_string(run + 1) + " " + label);
    }
    // The bf16 shares: deterministic as the fp32 ones, each share rounded to bf16 before the sum.
    {
        CUDA_CHECK(cudaMemsetAsync(dqkv2.data(), 0xff, dqkv2.bytes(), env.stream));
        CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0xff, scratch.bytes(), env.stream));
        backward(dqkv2, flash::FlashDq::SharesBf16);
        const std::vector<float> bf16_shares = check::from_device_floatX(dqkv2);
        compare_dqkv(ck, "flash backward, bf16 dQ shares ", label, bf16_shares, ref, B, T, C, 2 * factor);
        ck.expect(same_dk_dv(bf16_shares, shares, size_t(B) * T, C),
                  "flash backward dK, dV the same bits with the bf16 dQ shares " + label);
        DeviceBuffer<floatX> dqkv3(3 * btc);
        CUDA_CHECK(cudaMemsetAsync(dqkv3.data(), 0, dqkv3.bytes(), env.stream));
        backward(dqkv3, flash::FlashDq::SharesBf16);
        ck.expect(same_bits(dqkv2, dqkv3), "flash backward with bf16 dQ shares bit-identical on rerun " + label);
    }
    // The atomic dQ: its sums' order varies, so each run is checked against the reference (an unconverted row
    // stays NaN), with dK and dV the same bits as the shares'.
    for (int run = 0; run < 3; run++) {
        CUDA_CHECK(cudaMemsetAsync(dqkv2.data(), 0xff, dqkv2.bytes(), env.stream));
        CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0xff, scratch.bytes(), env.stream));
        backward(dqkv2, flash::FlashDq::Atomic);
        const std::vector<float> atomic = check::from_device_floatX(dqkv2);
        compare_dqkv(ck, "flash backward, atomic dQ, run " + std::to_string(run + 1) + " ", label, atomic, ref, B, T,
                     C, 2 * factor);
        ck.expect(same_dk_dv(atomic, shares, size_t(B) * T, C),
                  "flash backward dK, dV the same bits with the atomic dQ, run " + std::to_string(run + 1) + " " +
                      label);
    }
}

static void check_shape(CudaEnv& env, check::Checker& ck, int B, int T, int C, int NH) {
    const std::string label = "(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",C=" + std::to_string(C) +
                              ",NH=" + std::to_string(NH) + ")";
    const auto qkv = check::random_floatX_values(size_t(B) * T * 3 * C, 1.0f, 31);
    const auto dout = check::random_floatX_values(size_t(B) * T * C, 1.0f, 32);
    const Reference ref = reference(qkv, dout, B, T, C, NH);

    auto d_qkv = check::to_device_floatX(qkv);
    auto d_dout = check::to_device_floatX(dout);
    const size_t btc = size_t(B) * T * C;
    DeviceBuffer<floatX> out(btc), qkvr(3 * btc), att(attention_scratch_elems(B, T, NH)),
        preatt(attention_scratch_elems(B, T, NH)), dinp(3 * btc), dqkvr(3 * btc), datt(attention_scratch_elems(B, T, NH)),
        dy(btc);
    attention_forward(env, out.data(), qkvr.data(), att.data(), preatt.data(), d_qkv.data(), B, T, C, NH);
    env.sync();
    const float factor = kFloatXIsFloat ? 1e-4f : 2e-2f;
    ck.compare_bound("forward out " + label, check::from_device_floatX(out), ref.out, ref.mag_out, factor);
    ck.compare("forward att " + label, check::from_device_floatX(att), ref.att, 1e-3f);
    attention_backward(env, dinp.data(), dqkvr.data(), datt.data(), dy.data(), d_dout.data(), qkvr.data(), att.data(), B, T, C, NH);
    env.sync();
    compare_dqkv(ck, "backward ", label, check::from_device_floatX(dinp), ref, B, T, C, 2 * factor);
    check_flash(env, ck, ref, qkv, dout, B, T, C, NH, label, factor);
}

// Median of 7 samples of check::time_ms (a warm-up and 3 timed runs each): a slow sample (clocks ramping,
// another process on the GPU) moves an average but not the median.
template <typename F>
static float median_ms(cudaStream_t stream, F&& f) {
    std::array<float, 7> ms;
    for (float& m : ms) m = check::time_ms(stream, 3, f);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// Times both paths at one shape (zero inputs: the kernels' work does not depend on the values).
static void time_shape(CudaEnv& env, int B, int T, int C, int NH) {
    const std::string shape = "(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ")";
    const int HS = C / NH;
    const size_t btc = size_t(B) * T * C;
    float mm_fwd = 0.0f, mm_bwd = 0.0f;
    {  // scoped: frees the three B x NH x T x T buffers before flash allocates
        DeviceBuffer<floatX> qkv(3 * btc), out(btc), qkvr(3 * btc), att(attention_scratch_elems(B, T, NH)),
            preatt(attention_scratch_elems(B, T, NH)), dinp(3 * btc), dqkvr(3 * btc),
            datt(attention_scratch_elems(B, T, NH)), dy(btc);
        CUDA_CHECK(cudaMemsetAsync(qkv.data(), 0, qkv.bytes(), env.stream));
        CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.bytes(), env.stream));
        const double flops = 4.0 * B * NH * double(T) * T * HS;  // two full-square matmuls (causal half wasted)
        mm_fwd = median_ms(env.stream, [&] {
            attention_forward(env, out.data(), qkvr.data(), att.data(), preatt.data(), qkv.data(), B, T, C, NH);
        });
        check::report_flops(("attention_forward " + shape).c_str(), mm_fwd, flops);
        mm_bwd = median_ms(env.stream, [&] {
            attention_backward(env, dinp.data(), dqkvr.data(), datt.data(), dy.data(), out.data(), qkvr.data(),
                               att.data(), B, T, C, NH);
        });
        check::report_flops(("attention_backward " + shape).c_str(), mm_bwd, 2 * flops);
    }
    const std::string why = flash_attention_unsupported(C, NH);
    if (!why.empty()) {
        std::printf("flash timing %s skipped: %s\n", shape.c_str(), why.c_str());
        return;
    }
    const size_t rows = flash_attention_lse_floats(B, T, NH);
    DeviceBuffer<floatX> qkv(3 * btc), out(btc), dout(btc), dqkv(3 * btc);
    DeviceBuffer<float> lse(rows), scratch(flash_scratch_floats(B, T, NH));
    CUDA_CHECK(cudaMemsetAsync(qkv.data(), 0, qkv.bytes(), env.stream));
    CUDA_CHECK(cudaMemsetAsync(dout.data(), 0, dout.bytes(), env.stream));
    const double flops = 2 * 2.0 * B * NH * (double(T) * (T + 1) / 2) * HS;  // two matmuls, causal half only
    const float fwd = median_ms(env.stream, [&] {
        flash_attention_forward(env, out.data(), lse.data(), qkv.data(), B, T, C, NH);
    });
    check::report_flops(("flash_forward " + shape).c_str(), fwd, flops);
    auto time_forward = [&]<int RT, int QT>(const char* what) {
        const float ms = median_ms(env.stream, [&] {
            flash_attention_forward<RT, QT>(env, out.data(), lse.data(), qkv.data(), B, T, C, NH);
        });
        check::report_flops((std::string("flash_forward, ") + what + " " + shape).c_str(), ms, flops);
        check::report_ratio(std::string("flash forward ") + what + " / default " + shape, ms, fwd);
    };
    time_forward.template operator()<2, 1>("2 warps x 2 row tiles");
    time_forward.template operator()<1, 2>("128 queries, 8 warps");
    time_forward.template operator()<2, 2>("128 queries, 4 warps x 2 row tiles");
    // out and lse now hold the forward's results, as a training step's backward would see them
    const float bwd = median_ms(env.stream, [&] {
        flash_attention_backward(env, dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B, T,
                                 C, NH);
    });
    check::report_flops(("flash_backward " + shape).c_str(), bwd, 2.5 * flops);  // 5 products = 2.5 x the forward's 2
    const float atomic = median_ms(env.stream, [&] {
        flash_attention_backward(env, dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B,
                                 T, C, NH, flash::FlashDq::Atomic);
    });
    check::report_flops(("flash_backward, atomic dQ " + shape).c_str(), atomic, 2.5 * flops);
    check::report_ratio("flash atomic dQ / shares " + shape, atomic, bwd);
    const float last = median_ms(env.stream, [&] {
        flash_attention_backward(env, dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B,
                                 T, C, NH, flash::FlashDq::SharesLast);
    });
    check::report_flops(("flash_backward, dQ shares summed last " + shape).c_str(), last, 2.5 * flops);
    check::report_ratio("flash dQ shares summed last / shares " + shape, last, bwd);
    const float bf16_shares = median_ms(env.stream, [&] {
        flash_attention_backward(env, dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), lse.data(), B,
                                 T, C, NH, flash::FlashDq::SharesBf16);
    });
    check::report_flops(("flash_backward, bf16 dQ shares " + shape).c_str(), bf16_shares, 2.5 * flops);
    check::report_ratio("flash bf16 dQ shares / shares " + shape, bf16_shares, bwd);
    std::printf("TIME %-32s fwd %.3f  bwd %.3f  (time ratio; speedup fwd %.2fx, bwd %.2fx)\n",
                ("flash / matmul " + shape).c_str(), fwd / mm_fwd, bwd / mm_bwd, mm_fwd / fwd, mm_bwd / bwd);
}

int main() {
    return check::run_checker("attention", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 2, 256, 768, 12);
        check_shape(env, ck, 4, 32, 64, 4);    // the tiny reference model
        check_shape(env, ck, 2, 37, 48, 4);    // head size 12, T 37: the scalar (non-128-bit) kernels
        check_shape(env, ck, 2, 200, 128, 2);  // head size 64, T 200: flash's last 64-row tile is partial
        std::printf("timing: median of 7 x (mean of 3 runs). TFLOP/s counts: matmul path the full T x T squares it\n"
                    "multiplies (fwd 2 matmuls x 2*B*NH*T*T*HS, bwd 2x fwd); flash the causal half (fwd 2 matmuls x\n"
                    "2*B*NH*T(T+1)/2*HS, bwd 2.5x fwd: the S, dP, dV, dK and dQ products the kernels run)\n");
        time_shape(env, 8, 1024, 768, 12);
        time_shape(env, 16, 1024, 768, 12);
    });
}
