// OLMo's CUDA kernels (llmc/cuda/rope.cuh, swiglu.cuh, norms.cuh) on the emulated device, against the
// double-precision references of test/support/olmo_kernel_reference.h. Unlike test_llmc_kernels_emu.cpp this
// test calls the host wrappers themselves (linked with emu/runtime.cpp, the emulated CUDA runtime), so the path
// each wrapper picks, its launch configuration and its column-reduction calls are what is checked; the scalar
// paths are reached through buffers one element off 16-byte alignment. Shapes are small and odd: T not a
// multiple of anything, several heads, channel counts that are multiples of 8 but not powers of two, some over
// the register paths' limits, row counts with a partial last block of 8 rows and a partial last 64-row split.
// Kernels promised deterministic also give the same bits with every block's threads in another order
// (emu::launch_settings), and the scalar and 128-bit paths of the elementwise kernels give the same bits (the
// same fp32 operations per element).
//
// Tolerances: a floatX (bf16) store is correctly rounded, so within 2^-8 of its value relative (kRound; fp32
// builds: 1e-5 for fp32 arithmetic against double). Absolute floors, where outputs cancel to ~0: 1e-5 for
// outputs of O(1) inputs whose fp32 arithmetic has a few roundings of ~6e-8 each (RoPE, SwiGLU, the norms'
// outputs); 2e-5 for the norms' dinp (dx ~ rstd times row means of O(1) terms, added to dinp ~0.5); 1e-6 / 1e-5
// relative for fp32 statistics; 1e-4 absolute and 1e-5 relative for dweight, an fp32 sum of N terms of O(1).
// The rotary table itself must match double angles to within one float rounding (6e-8 of 1).

// g++ (not nvcc) warns that the norm kernels may read registers they did not load: the second pass skips exactly
// the slices the first one skipped.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "emu/block_emulator.h"
// block_emulator.h first: the kernels below see its threadIdx, intrinsics and min/max.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/base/rope_table.h"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/norms.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/swiglu.cuh"
#include "test/support/olmo_kernel_reference.h"
#include "test/support/testing.h"

namespace {

using emu::Order;
using llmc::DeviceBuffer;
using llmc::floatX;

constexpr double kRound = llmc::kFloatXIsFloat ? 1e-5 : 1.0 / 256 + 1e-5;
constexpr cudaStream_t kStream = nullptr;

// ---- data and device buffers -----------------------------------------------------------------------------
std::vector<float> random_floats(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * d(rng);
    return v;
}
// Values exactly representable in floatX (what a kernel reads), as floats for the references.
std::vector<float> random_floatX_values(size_t n, float scale, uint32_t seed, float offset = 0.0f) {
    return llmc::round_to_floatX(random_floats(n, scale, seed, offset));
}

// A device copy of a host tensor, `shift` elements past the start of its allocation: shift 1 puts a floatX
// buffer off 16-byte alignment, which sends the wrappers to their scalar kernels.
template <class T>
struct Dev {
    DeviceBuffer<T> buf;
    size_t n, shift;
    Dev(const std::vector<T>& host, size_t shift_by = 0) : buf(host.size() + 8), n(host.size()), shift(shift_by) {
        buf.upload(host.data(), n, shift);
    }
    explicit Dev(size_t count, size_t shift_by = 0) : buf(count + 8), n(count), shift(shift_by) {}
    T* p() const { return buf.data() + shift; }
    std::vector<T> get() const {
        CUDA_CHECK(cudaDeviceSynchronize());
        return buf.download(n, shift);
    }
};
Dev<floatX> dev_fx(const std::vector<float>& v, size_t shift = 0) { return Dev<floatX>(llmc::host_to_floatX(v), shift); }
std::vector<float> get_fx(const Dev<floatX>& d) { return llmc::host_from_floatX(d.get()); }

void set_order(Order order) { emu::launch_settings().order = order; }

// ---- comparisons -----------------------------------------------------------------------------------------
// |got - ref| <= atol + rtol |ref| for every element (NaN fails); prints one line with the largest errors.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref, double atol,
                  double rtol) {
    EXPECT_EQ(got.size(), ref.size());
    double max_abs = 0.0, max_rel = 0.0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < got.size() && i < ref.size(); i++) {
        const double err = std::fabs(double(got[i]) - ref[i]);
        if (!(err <= atol + rtol * std::fabs(ref[i])) && bad++ == 0) first_bad = i;
        if (!(err <= max_abs)) max_abs = std::isnan(err) ? INFINITY : err;
        if (std::fabs(ref[i]) > atol && err / std::fabs(ref[i]) > max_rel) max_rel = err / std::fabs(ref[i]);
    }
    std::printf("  %-56s max_abs %.2e max_rel %.2e  (atol %.0e rtol %.1e, n=%zu)%s\n", what.c_str(), max_abs, max_rel,
                atol, rtol, got.size(), bad ? "  FAIL" : "");
    if (bad)
        std::printf("    %zu out of tolerance, first at %zu: got %.8g want %.8g\n", bad, first_bad, double(got[first_bad]),
                    ref[first_bad]);
    EXPECT_EQ(bad, size_t{0});
}
std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

template <class T>
void expect_same_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    size_t d = got.size() == want.size() ? 0 : SIZE_MAX;
    for (size_t i = 0; d != SIZE_MAX && i < got.size(); i++) d += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
    std::printf("  %-56s %zu of %zu values differ (bit for bit)%s\n", what.c_str(), d == SIZE_MAX ? got.size() : d,
                want.size(), d ? "  FAIL" : "");
    EXPECT_EQ(d, size_t{0});
}

std::string shape(const char* names, std::initializer_list<int> values) {
    std::string s = "(";
    const char* n = names;
    for (const int v : values) {
        if (s.size() > 1) s += ",";
        s += *n++;
        s += '=';
        s += std::to_string(v);
    }
    return s + ")";
}

// =========================================================================================================
// RoPE
TEST(rope_table_matches_double_angles) {
    const int max_T = 50, hs = 24;
    const double theta = 10000.0;
    const std::vector<float> table = llmc::rope_table(max_T, hs, theta);
    EXPECT_EQ(table.size(), size_t(max_T) * hs);
    double worst = 0.0;
    for (int t = 0; t < max_T; t++)
        for (int i = 0; i < hs / 2; i++) {
            const double a = t * std::pow(theta, -2.0 * i / hs);
            worst = std::max(worst, std::fabs(table[2 * (size_t(t) * hs / 2 + i)] - std::cos(a)));
            worst = std::max(worst, std::fabs(table[2 * (size_t(t) * hs / 2 + i) + 1] - std::sin(a)));
        }
    std::printf("  rope_table (max_T=50, hs=24) vs double: max_abs %.2e\n", worst);
    EXPECT(worst <= 6e-8);
    EXPECT_EQ(table[0], 1.0f);  // t = 0: no turn
    EXPECT_EQ(table[1], 0.0f);
    EXPECT_ERROR(llmc::rope_table(4, 7, theta), "even head_size");
}

void check_rope(int B, int T, int C, int NH) {
    const int hs = C / NH;
    const double theta = 10000.0;
    // a table with more rows than T, as the model uploads one for its longest sequence
    const std::vector<float> table = llmc::rope_table(T + 5, hs, theta);
    const auto qkv = random_floatX_values(size_t(B) * T * 3 * C, 1.0f, 51);
    const bool vec = (hs / 2) % llmc::x128::size == 0;
    const std::string label = shape("BTCN", {B, T, C, NH}) + " hs=" + std::to_string(hs) + (vec ? " 128-bit" : " scalar");
    Dev<float> d_table(table), d_table_off(table, 1);

    for (const bool backward : {false, true}) {
        const std::vector<double> ref = olmo_ref::rope(qkv, B, T, C, NH, theta, backward);
        const char* name = backward ? "rope_backward " : "rope_forward ";
        auto run = [&](size_t shift, Order order) {
            set_order(order);
            Dev<floatX> d = dev_fx(qkv, shift);
            const float* tab = shift ? d_table_off.p() : d_table.p();
            if (backward) llmc::rope_backward(d.p(), tab, B, T, C, NH, kStream);
            else llmc::rope_forward(d.p(), tab, B, T, C, NH, kStream);
            return d.get();
        };
        const std::vector<floatX> got = run(0, Order::Forward);
        // two products of O(1) values and a sum in fp32, then one rounding
        expect_close(name + label, llmc::host_from_floatX(got), ref, 1e-5, kRound);
        std::vector<floatX> v_got, v_in;
        for (size_t tok = 0; tok < size_t(B) * T; tok++)
            for (int c = 2 * C; c < 3 * C; c++) {
                v_got.push_back(got[tok * 3 * C + c]);
                v_in.push_back(llmc::host_to_floatX(qkv[tok * 3 * C + c]));
            }
        expect_same_bits("  v untouched", v_got, v_in);
        // the scalar kernel (buffers off alignment) does the same fp32 operations per pair
        if (vec) expect_same_bits("  128-bit vs scalar kernel", run(1, Order::Shuffled), got);
    }
    set_order(Order::Forward);
}

TEST(rope) {
    check_rope(2, 37, 96, 3);   // hs 32: 16 pairs per half, two 128-bit chunks; T = 37 restarts at the second row
    check_rope(1, 19, 120, 5);  // hs 24: 12 pairs, scalar in bf16 (12 % 8), 128-bit in fp32
    check_rope(2, 11, 136, 4);  // hs 34: 17 pairs, scalar; C = 136 = 17 x 8
    check_rope(1, 9, 256, 2);   // hs 128 (OLMo-1B's): 64 pairs
}

// The kernel refuses heads it cannot pair.
TEST(rope_rejects_odd_heads) {
    Dev<floatX> d(size_t(3) * 30);
    Dev<float> table(llmc::rope_table(1, 10, 10000.0));
    EXPECT_ERROR(llmc::rope_forward(d.p(), table.p(), 1, 1, 30, 4, kStream), "heads of even size");  // 30 / 4
    EXPECT_ERROR(llmc::rope_forward(d.p(), table.p(), 1, 1, 30, 2, kStream), "heads of even size");  // hs 15
}

// =========================================================================================================
// SwiGLU
void check_swiglu(int N, int H) {
    auto fch = random_floatX_values(size_t(N) * 2 * H, 2.0f, 61);
    // saturated gates: expf(-g) overflows or vanishes; sigmoid must come out 0 or 1, never NaN
    for (const float g : {-120.0f, -90.0f, 95.0f, 40.0f}) fch[size_t(N - 1) * 2 * H + H + size_t(std::abs(int(g))) % H] = g;
    const auto dout = random_floatX_values(size_t(N) * H, 1.0f, 62);
    const bool vec = H % llmc::x128::size == 0;
    const std::string label = shape("NH", {N, H}) + (vec ? " 128-bit" : " scalar");

    auto forward = [&](size_t shift, Order order) {
        set_order(order);
        Dev<floatX> in = dev_fx(fch, shift), out(size_t(N) * H, shift);
        llmc::swiglu_forward(out.p(), in.p(), N, H, kStream);
        return out.get();
    };
    const std::vector<floatX> out = forward(0, Order::Forward);
    // silu(g) x: expf, a division and two products in fp32 (relative ~1e-6), then one rounding
    expect_close("swiglu_forward " + label, llmc::host_from_floatX(out), olmo_ref::swiglu_forward(fch, N, H), 1e-5, kRound);
    if (vec) expect_same_bits("  128-bit vs scalar kernel", forward(1, Order::Reverse), out);

    auto backward = [&](size_t shift, bool in_place) {
        Dev<floatX> in = dev_fx(fch, shift), d = dev_fx(dout, shift), dfch(size_t(N) * 2 * H, shift);
        llmc::swiglu_backward(in_place ? in.p() : dfch.p(), d.p(), in.p(), N, H, kStream);
        return in_place ? in.get() : dfch.get();
    };
    const std::vector<floatX> dfch = backward(0, false);
    // dgate's factor 1 + g (1 - sigmoid(g)) cancels near g = -1.28: the floor covers its fp32 error there
    expect_close("swiglu_backward " + label, llmc::host_from_floatX(dfch), olmo_ref::swiglu_backward(dout, fch, N, H),
                 1e-5, kRound);
    expect_same_bits("  in place (dfch = fch)", backward(0, true), dfch);
    if (vec) expect_same_bits("  128-bit vs scalar kernel", backward(1, false), dfch);
    set_order(Order::Forward);
}

TEST(swiglu) {
    check_swiglu(37, 96);   // 128-bit; 37 rows
    check_swiglu(13, 100);  // H not a multiple of 8: scalar
    check_swiglu(5, 512);   // H = 4C for C = 128
}

// =========================================================================================================
// Norms. rms false: the LayerNorm without weight and bias; true: RMSNorm with a weight.
struct NormData {
    int N, C;
    std::vector<float> a, b, w, dout, dinp0, dw0;
    NormData(int n, int c) : N(n), C(c) {
        a = random_floatX_values(size_t(N) * C, 1.0f, 71, 0.3f);
        b = random_floatX_values(size_t(N) * C, 0.5f, 72);
        w = random_floatX_values(size_t(C), 0.2f, 73, 1.0f);
        dout = random_floatX_values(size_t(N) * C, 1.0f, 74);
        dinp0 = random_floatX_values(size_t(N) * C, 0.5f, 75);
        dw0 = random_floats(size_t(C), 0.1f, 76);
    }
};

struct NormRun {
    std::vector<floatX> out, residual;
    std::vector<float> mean, rstd;
};
// shift 1: every floatX buffer off alignment (the scalar kernels)
NormRun run_norm_forward(const NormData& d, bool rms, bool fused, size_t shift, Order order) {
    set_order(order);
    const size_t n = size_t(d.N) * d.C;
    Dev<floatX> a = dev_fx(d.a, shift), b = dev_fx(d.b, shift), w = dev_fx(d.w, shift);
    Dev<floatX> out(n, shift), resid(n, shift);
    Dev<float> mean(size_t(d.N)), rstd(size_t(d.N));
    if (rms) {
        if (fused) llmc::fused_residual_rmsnorm_forward(resid.p(), out.p(), rstd.p(), a.p(), b.p(), w.p(), d.N, d.C, kStream);
        else llmc::rmsnorm_forward(out.p(), rstd.p(), a.p(), w.p(), d.N, d.C, kStream);
    } else {
        if (fused)
            llmc::fused_residual_layernorm_noaffine_forward(resid.p(), out.p(), mean.p(), rstd.p(), a.p(), b.p(), d.N, d.C,
                                                            kStream);
        else llmc::layernorm_noaffine_forward(out.p(), mean.p(), rstd.p(), a.p(), d.N, d.C, kStream);
    }
    NormRun r{out.get(), fused ? resid.get() : std::vector<floatX>{}, rms ? std::vector<float>{} : mean.get(), rstd.get()};
    set_order(Order::Forward);
    return r;
}

std::string path_name(int vecs) {
    std::string s = " ";
    s += vecs ? std::to_string(vecs) : std::string("scalar");
    if (vecs) s += " x128/lane";
    return s;
}

void check_norm_forward(const NormData& d, bool rms, int vecs) {
    const std::string label = std::string(rms ? "rmsnorm" : "layernorm_noaffine") + " " + shape("NC", {d.N, d.C}) +
                              path_name(vecs);
    for (const bool fused : {false, true}) {
        // the fused residual: round(a + b), the input of the norm
        std::vector<float> x = d.a;
        if (fused)
            for (size_t i = 0; i < x.size(); i++) x[i] = float(double(d.a[i]) + d.b[i]);
        x = llmc::round_to_floatX(x);
        const olmo_ref::NormForward ref = olmo_ref::norm_forward(x, d.w, d.N, d.C, rms);
        const NormRun r = run_norm_forward(d, rms, fused, vecs ? 0 : 1, Order::Forward);
        const std::string what = (fused ? "fused residual " : "") + label;
        if (fused) expect_same_bits("  residual = round(a + b)", r.residual, llmc::host_to_floatX(x));
        expect_close(what + " out", llmc::host_from_floatX(r.out), ref.out, 1e-5, kRound);
        if (!rms) expect_close("  mean", r.mean, ref.mean, 1e-6, 1e-5);
        expect_close("  rstd", r.rstd, ref.rstd, 1e-6, 1e-5);
        const NormRun s = run_norm_forward(d, rms, fused, vecs ? 0 : 1, Order::Shuffled);
        expect_same_bits("  forward vs shuffled thread order", s.out, r.out);
        EXPECT_EQ(std::memcmp(s.rstd.data(), r.rstd.data(), r.rstd.size() * sizeof(float)), 0);
    }
}

struct NormGrads {
    std::vector<floatX> dinp;
    std::vector<float> dw;
};
NormGrads run_norm_backward(const NormData& d, bool rms, const std::vector<float>& mean, const std::vector<float>& rstd,
                            size_t shift, Order order, bool accumulate = true) {
    set_order(order);
    Dev<floatX> x = dev_fx(d.a, shift), w = dev_fx(d.w, shift), dout = dev_fx(d.dout, shift), dinp = dev_fx(d.dinp0, shift);
    Dev<float> m(mean), r(rstd), dw(accumulate ? d.dw0 : std::vector<float>(size_t(d.C), NAN));
    DeviceBuffer<float> scratch(llmc::rmsnorm_backward_scratch_floats(d.N, d.C));
    if (rms) llmc::rmsnorm_backward(dinp.p(), dw.p(), scratch.data(), dout.p(), x.p(), w.p(), r.p(), d.N, d.C, kStream, accumulate);
    else llmc::layernorm_noaffine_backward(dinp.p(), dout.p(), x.p(), m.p(), r.p(), d.N, d.C, kStream);
    NormGrads g{dinp.get(), rms ? dw.get() : std::vector<float>{}};
    set_order(Order::Forward);
    return g;
}

void check_norm_backward(const NormData& d, bool rms, int vecs) {
    const std::string label = std::string(rms ? "rmsnorm_backward" : "layernorm_noaffine_backward") + " " +
                              shape("NC", {d.N, d.C}) + path_name(vecs);
    // the statistics the forward kept, as the backward gets them
    const NormRun f = run_norm_forward(d, rms, false, 0, Order::Forward);
    const olmo_ref::NormBackward ref =
        olmo_ref::norm_backward(d.dinp0, d.dout, d.a, d.w, rms ? d.dw0 : std::vector<float>{}, d.N, d.C, rms);
    const size_t shift = vecs ? 0 : 1;  // 1: every floatX buffer off alignment, the scalar kernels
    const NormGrads g = run_norm_backward(d, rms, f.mean, f.rstd, shift, Order::Forward);
    expect_close(label + " dinp (added)", llmc::host_from_floatX(g.dinp), ref.dinp, 2e-5, kRound);
    if (rms) expect_close("  dweight (added)", g.dw, ref.dweight, 1e-4, 1e-5);
    const NormGrads s = run_norm_backward(d, rms, f.mean, f.rstd, shift, Order::Shuffled);
    expect_same_bits("  forward vs shuffled thread order: dinp", s.dinp, g.dinp);
    if (!rms) return;
    expect_same_bits("  forward vs shuffled thread order: dweight", s.dw, g.dw);
    // accumulate false: written over NaN, the bits of adding to zeros
    NormData zero = d;
    zero.dw0.assign(size_t(d.C), 0.0f);
    const NormGrads z = run_norm_backward(zero, rms, f.mean, f.rstd, shift, Order::Forward);
    const NormGrads nw = run_norm_backward(d, rms, f.mean, f.rstd, shift, Order::WarpSerial, false);
    expect_same_bits("  dweight written (accumulate false) vs added to zeros", nw.dw, z.dw);
    if (vecs) {
        // the scalar dinp kernel and the column reduction with scalar loads: the same dweight additions in the
        // same order as the fused partials (or the 128-bit column reduction above 8 slices)
        const NormGrads sc = run_norm_backward(d, rms, f.mean, f.rstd, 1, Order::Reverse);
        expect_close("  scalar kernels: dinp", llmc::host_from_floatX(sc.dinp), ref.dinp, 2e-5, kRound);
        expect_same_bits("  scalar kernels vs 128-bit: dweight", sc.dw, g.dw);
    }
}

// The path the wrappers pick for C (the test buffers are aligned), then the scalar one (shifted buffers).
void check_norm(int N, int C, bool rms) {
    const NormData d(N, C);
    const int chosen = llmc::norm_lane_vecs(C, true);
    for (const int vecs : chosen ? std::vector<int>{chosen, 0} : std::vector<int>{0}) check_norm_forward(d, rms, vecs);
    check_norm_backward(d, rms, chosen);
    if (chosen) check_norm_backward(d, rms, 0);
}

// 26 rows: a last block of 2 rows; 150: three 64-row splits, the last partial. C = 200 (bf16: 1 slice, lanes
// 25..31 idle), 776 (4 slices, the last partial), 1288 (bf16: 8 slices, the fused dweight's limit), 2056 (9:
// the 16-slice kernel, dweight by the column reduction), 4104 (bf16: 17 slices, over the register paths: scalar).
TEST(layernorm_noaffine) {
    for (const auto& [N, C] : {std::pair{26, 200}, std::pair{150, 776}, std::pair{9, 1288}, std::pair{5, 2056},
                              std::pair{3, 4104}})
        check_norm(N, C, false);
}

TEST(rmsnorm) {
    for (const auto& [N, C] : {std::pair{26, 200}, std::pair{150, 776}, std::pair{9, 1288}, std::pair{70, 2056},
                              std::pair{3, 4104}})
        check_norm(N, C, true);
}

// No rows: dweight written (accumulate false) is zeros, added to (true) it is unchanged; dinp untouched.
TEST(rmsnorm_backward_without_rows) {
    const int C = 40;
    Dev<float> dw(std::vector<float>(C, NAN)), keep(std::vector<float>(C, 2.0f));
    DeviceBuffer<float> scratch(1);
    llmc::rmsnorm_backward(nullptr, dw.p(), scratch.data(), nullptr, nullptr, nullptr, nullptr, 0, C, kStream, false);
    llmc::rmsnorm_backward(nullptr, keep.p(), scratch.data(), nullptr, nullptr, nullptr, nullptr, 0, C, kStream, true);
    expect_same_bits("rmsnorm_backward N=0 accumulate false: zeros", dw.get(), std::vector<float>(C, 0.0f));
    expect_same_bits("rmsnorm_backward N=0 accumulate true: unchanged", keep.get(), std::vector<float>(C, 2.0f));
}

}  // namespace

TEST_MAIN()
