// Checker for llmc/cuda/matmul.cuh: matmul_forward (bias epilogue, fused GELU epilogue vs separate GELU kernel,
// misaligned-bias and misaligned-pre_gelu fallbacks, the unfused path matmul_lt takes when cuBLASLt has no
// algorithm) and matmul_backward (dinp, plain and as the gradient of a GELU input through the DGELU epilogue or its
// fallbacks, fp32 dweight accumulation, deterministic dbias by the column reduction or by cuBLASLt's BGRADB
// epilogue, --bias_grad epilogue) against CPU loops in double, on a GPT-2 fc shape (correctness on fewer rows,
// timing on B*T = 8192 rows), with cuBLASLt's first algorithm and with CudaEnv::tune_matmuls (--matmul_tune true:
// the fastest of its candidates). Exit 0 PASS, 1 FAIL, 77 SKIP.
#include <array>
#include <cstring>
#include <string>

#include "dev/cuda/common.h"
#include "llmc/cuda/matmul.cuh"

using namespace llmc;

static float rms(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return static_cast<float>(std::sqrt(s / std::max<size_t>(1, v.size())));
}

static void check_shape(CudaEnv& env, check::Checker& ck, int N, int C, int OC) {
    const std::string label = "(N=" + std::to_string(N) + ",C=" + std::to_string(C) + ",OC=" + std::to_string(OC) + ")";
    const auto inp = check::random_floatX_values(size_t(N) * C, 1.0f, 21);
    const auto w = check::random_floatX_values(size_t(OC) * C, 0.02f, 22);
    const auto bias = check::random_floatX_values(OC + 1, 0.1f, 23);  // +1: room for a misaligned view
    const auto dout = check::random_floatX_values(size_t(N) * OC, 1.0f, 24);
    const auto dw0 = check::random_floats(size_t(OC) * C, 0.5f, 25);
    const auto db0 = check::random_floats(OC, 0.5f, 26);

    std::vector<float> ref(size_t(N) * OC), ref_mis(size_t(N) * OC), ref_gelu(size_t(N) * OC);
    std::vector<float> ref_dinp(size_t(N) * C), ref_dw(size_t(OC) * C), ref_db(OC);
    std::vector<float> ref_dw_sum(size_t(OC) * C), ref_db_sum(OC);  // the sums alone (written, not accumulated)
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += double(inp[size_t(n) * C + c]) * w[size_t(o) * C + c];
            ref[size_t(n) * OC + o] = static_cast<float>(s + bias[o]);
            ref_mis[size_t(n) * OC + o] = static_cast<float>(s + bias[o + 1]);
        }
    // GELU of the rounded pre-activation, as both GPU paths compute it
    const auto pre_rounded = round_to_floatX(ref);
    for (size_t i = 0; i < ref.size(); i++) ref_gelu[i] = km::gelu_forward(pre_rounded[i]);
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += double(dout[size_t(n) * OC + o]) * w[size_t(o) * C + c];
            ref_dinp[size_t(n) * C + c] = static_cast<float>(s);
        }
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += double(dout[size_t(n) * OC + o]) * inp[size_t(n) * C + c];
            ref_dw[size_t(o) * C + c] = static_cast<float>(s + dw0[size_t(o) * C + c]);
            ref_dw_sum[size_t(o) * C + c] = static_cast<float>(s);
        }
        double s = 0;
        for (int n = 0; n < N; n++) s += dout[size_t(n) * OC + o];
        ref_db[o] = static_cast<float>(s + db0[o]);
        ref_db_sum[o] = static_cast<float>(s);
    }

    auto d_inp = check::to_device_floatX(inp), d_w = check::to_device_floatX(w), d_bias = check::to_device_floatX(bias);
    auto d_dout = check::to_device_floatX(dout);
    DeviceBuffer<floatX> d_out(size_t(N) * OC), d_pre(size_t(N) * OC), d_dinp(size_t(N) * C);
    const float atol_out = 1e-2f * rms(ref);

    matmul_forward(env, d_out.data(), d_inp.data(), d_w.data(), d_bias.data(), N, C, OC);
    env.sync();
    ck.compare("forward +bias " + label, check::from_device_floatX(d_out), ref, atol_out);

    matmul_forward(env, d_out.data(), d_inp.data(), d_w.data(), d_bias.data() + 1, N, C, OC);  // 2-byte offset
    env.sync();
    ck.compare("forward misaligned bias " + label, check::from_device_floatX(d_out), ref_mis, atol_out);

    for (int fused = 1; fused >= 0; fused--) {
        matmul_forward(env, d_out.data(), d_inp.data(), d_w.data(), d_bias.data(), N, C, OC, d_pre.data(), fused != 0);
        env.sync();
        const std::string how = fused ? "fused gelu " : "separate gelu ";
        ck.compare(how + "pre_gelu " + label, check::from_device_floatX(d_pre), ref, atol_out);
        // cuBLASLt's GELU epilogue may use its own tanh; allow a little more than one bf16 rounding
        ck.compare(how + "out " + label, check::from_device_floatX(d_out), ref_gelu, atol_out, 2 * check::kRtol);
    }

    // The unfused path matmul_lt takes by itself when cuBLASLt has no algorithm for an epilogue, called directly,
    // and a pre_gelu 2 bytes off alignment, which sends matmul_lt there too.
    {
        const km::GemmShape g = km::linear_forward_gemm(N, C, OC);
        DeviceBuffer<floatX> pre_mis(size_t(N) * OC + 8);
        matmul_lt_unfused(env, d_out.data(), d_w.data(), d_inp.data(), d_bias.data(), g.m, g.n, g.k, g.ta, g.tb, false,
                          d_pre.data(), 1.0f, nullptr);
        env.sync();
        ck.compare("unfused bias+gelu pre_gelu " + label, check::from_device_floatX(d_pre), ref, atol_out);
        ck.compare("unfused bias+gelu out " + label, check::from_device_floatX(d_out), ref_gelu, atol_out, 2 * check::kRtol);
        matmul_forward(env, d_out.data(), d_inp.data(), d_w.data(), d_bias.data(), N, C, OC, pre_mis.data() + 1, true);
        env.sync();
        auto pre_back = check::from_device_floatX(pre_mis);
        pre_back.erase(pre_back.begin());
        pre_back.resize(ref.size());
        ck.compare("misaligned pre_gelu (fallback) pre_gelu " + label, pre_back, ref, atol_out);
        ck.compare("misaligned pre_gelu (fallback) out " + label, check::from_device_floatX(d_out), ref_gelu, atol_out,
                   2 * check::kRtol);
    }

    // dinp as the gradient of pre_gelu (inp was gelu(pre_gelu)): cuBLASLt's DGELU epilogue, the unfused path,
    // and an aux 2 bytes off alignment (the fallback again)
    {
        const auto pre = check::random_floatX_values(size_t(N) * C + 1, 1.0f, 27);
        auto d_pre_in = check::to_device_floatX(pre);
        const float atol_dinp = 1e-2f * rms(ref_dinp);
        for (int offset = 0; offset <= 1; offset++) {
            std::vector<float> want(ref_dinp.size());
            for (size_t i = 0; i < want.size(); i++) want[i] = ref_dinp[i] * km::gelu_derivative(pre[i + size_t(offset)]);
            const std::string how = offset ? "misaligned pre_gelu (fallback) " : "fused ";
            matmul_backward(env, d_dinp.data(), nullptr, nullptr, nullptr, d_dout.data(), d_inp.data(), d_w.data(), N, C,
                            OC, {.pre_gelu = d_pre_in.data() + offset});
            env.sync();
            ck.compare("backward dgelu " + how + label, check::from_device_floatX(d_dinp), want, atol_dinp, 2 * check::kRtol);
            if (offset) continue;
            const km::GemmShape g = km::linear_dinp_gemm(N, C, OC);
            matmul_lt_unfused(env, d_dinp.data(), d_w.data(), d_dout.data(), nullptr, g.m, g.n, g.k, g.ta, g.tb, false,
                              nullptr, 1.0f, d_pre_in.data());
            env.sync();
            ck.compare("backward dgelu unfused " + label, check::from_device_floatX(d_dinp), want, atol_dinp,
                       2 * check::kRtol);
        }
    }

    auto d_dw = check::to_device(dw0), d_db = check::to_device(db0);
    DeviceBuffer<float> scratch(matmul_backward_scratch_floats(N, OC));
    matmul_backward(env, d_dinp.data(), d_dw.data(), d_db.data(), scratch.data(), d_dout.data(), d_inp.data(), d_w.data(), N, C, OC);
    env.sync();
    ck.compare("backward dinp " + label, check::from_device_floatX(d_dinp), ref_dinp, 1e-2f * rms(ref_dinp));
    ck.compare("backward dweight (fp32) " + label, check::from_device(d_dw), ref_dw, 1e-3f * rms(ref_dw), 1e-3f);
    ck.compare("backward dbias (fp32) " + label, check::from_device(d_db), ref_db, 1e-4f * rms(ref_db), 1e-5f);
    // dbias is deterministic
    const auto db_first = check::from_device(d_db);
    auto d_db2 = check::to_device(db0);
    matmul_backward(env, nullptr, nullptr, d_db2.data(), scratch.data(), d_dout.data(), d_inp.data(), d_w.data(), N, C, OC);
    env.sync();
    ck.expect(std::memcmp(db_first.data(), check::from_device(d_db2).data(), OC * sizeof(float)) == 0,
              "dbias bit-identical " + label);

    // --bias_grad epilogue: dbias from the weight-gradient product's BGRADB epilogue (where cuBLASLt has it; the
    // column reduction otherwise), the same dweight, and the same bits when run again.
    {
        const bool fused = matmul_lt<float>(env, d_dw.data(), d_inp.data(), d_dout.data(), nullptr,
                                            km::linear_dweight_gemm(N, C, OC), true, nullptr, 1.0f, nullptr, scratch.data());
        env.sync();
        std::printf("  BGRADB epilogue on the dweight product %s: %s\n", label.c_str(),
                    fused ? "fused" : "no cuBLASLt kernel (the column reduction runs instead)");
        std::vector<float> db_epilogue;
        for (int run = 0; run < 2; run++) {
            auto d_dw3 = check::to_device(dw0), d_db3 = check::to_device(db0);
            matmul_backward(env, nullptr, d_dw3.data(), d_db3.data(), scratch.data(), d_dout.data(), d_inp.data(), d_w.data(),
                            N, C, OC, {.fuse_bias_grad = true});
            env.sync();
            if (run == 0) {
                ck.compare("backward dweight, bias epilogue " + label, check::from_device(d_dw3), ref_dw, 1e-3f * rms(ref_dw),
                           1e-3f);
                db_epilogue = check::from_device(d_db3);
                ck.compare("backward dbias, bias epilogue " + label, db_epilogue, ref_db, 1e-4f * rms(ref_db), 1e-5f);
            } else {
                ck.expect(std::memcmp(db_epilogue.data(), check::from_device(d_db3).data(), OC * sizeof(float)) == 0,
                          "dbias from the bias epilogue bit-identical when run again " + label);
            }
        }
    }

    // accumulate false (the first micro-step after ModelCuda::zero_grad): dweight and dbias written over NaN, by
    // the column reduction and by the bias epilogue; the product must not read the old dweight (beta 0)
    for (int fuse = 0; fuse <= 1; fuse++) {
        auto d_dw4 = check::to_device(std::vector<float>(size_t(OC) * C, NAN));
        auto d_db4 = check::to_device(std::vector<float>(size_t(OC), NAN));
        matmul_backward(env, nullptr, d_dw4.data(), d_db4.data(), scratch.data(), d_dout.data(), d_inp.data(), d_w.data(),
                        N, C, OC, {.fuse_bias_grad = fuse != 0, .accumulate = false});
        env.sync();
        const std::string how = fuse ? "bias epilogue" : "column reduction";
        ck.compare("backward dweight written, " + how + " " + label, check::from_device(d_dw4), ref_dw_sum,
                   1e-3f * rms(ref_dw_sum), 1e-3f);
        ck.compare("backward dbias written, " + how + " " + label, check::from_device(d_db4), ref_db_sum,
                   1e-4f * rms(ref_db_sum), 1e-5f);
    }
}

// Times the forward (bias; bias + GELU) and the backward (plain; DGELU) of one linear layer, with the algorithms
// the process-wide cache holds or picks now (so env.tune_matmuls decides for problems new to it); returns the
// four times in ms.
static std::array<float, 4> time_shape(CudaEnv& env, int N, int C, int OC, const std::string& name) {
    DeviceBuffer<floatX> inp(size_t(N) * C), w(size_t(OC) * C), bias(OC), out(size_t(N) * OC), pre(size_t(N) * OC),
        dinp(size_t(N) * C);
    DeviceBuffer<float> dw(size_t(OC) * C), db(OC), scratch(matmul_backward_scratch_floats(N, OC));
    for (auto* b : {&inp, &w, &bias, &out}) CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
    CUDA_CHECK(cudaMemset(dw.data(), 0, dw.bytes()));
    CUDA_CHECK(cudaMemset(db.data(), 0, db.bytes()));
    const double flops = 2.0 * N * C * OC;
    const float f = check::time_ms(env.stream, 10, [&] {
        matmul_forward(env, out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    });
    check::report_flops(("matmul_forward " + name).c_str(), f, flops);
    const float g = check::time_ms(env.stream, 10, [&] {
        matmul_forward(env, out.data(), inp.data(), w.data(), bias.data(), N, C, OC, pre.data(), true);
    });
    check::report_flops(("matmul_forward+gelu " + name).c_str(), g, flops);
    const float b = check::time_ms(env.stream, 10, [&] {
        matmul_backward(env, dinp.data(), dw.data(), db.data(), scratch.data(), out.data(), inp.data(), w.data(), N, C, OC);
    });
    check::report_flops(("matmul_backward " + name).c_str(), b, 2 * flops);
    DeviceBuffer<floatX> pre_in(size_t(N) * C);  // the backward of a GELU input: the DGELU epilogue on dinp
    CUDA_CHECK(cudaMemset(pre_in.data(), 0, pre_in.bytes()));
    const float dg = check::time_ms(env.stream, 10, [&] {
        matmul_backward(env, dinp.data(), dw.data(), db.data(), scratch.data(), out.data(), inp.data(), w.data(), N, C, OC,
                        {.pre_gelu = pre_in.data()});
    });
    check::report_flops(("matmul_backward+dgelu " + name).c_str(), dg, 2 * flops);
    const float cr = check::time_ms(env.stream, 20, [&] {  // dbias alone: the column reduction over dout
        column_reduce<1>(ColumnOutputs<1>{{db.data()}}, scratch.data(), N, OC, BiasGrad{out.data(), OC}, env.stream);
    });
    check::report_bandwidth(("dbias column reduction " + name).c_str(), cr, double(N) * OC * sizeof(floatX));
    return {f, g, b, dg};
}

// The backward with the bias gradient by the column reduction (default) and by the BGRADB epilogue
// (--bias_grad epilogue), both with dinp and dweight, and the second over the first.
static void time_bias_grad(CudaEnv& env, int N, int C, int OC, const std::string& name) {
    DeviceBuffer<floatX> inp(size_t(N) * C), w(size_t(OC) * C), dout(size_t(N) * OC), dinp(size_t(N) * C);
    DeviceBuffer<float> dw(size_t(OC) * C), db(OC), scratch(matmul_backward_scratch_floats(N, OC));
    for (auto* b : {&inp, &w, &dout}) CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
    CUDA_CHECK(cudaMemset(dw.data(), 0, dw.bytes()));
    CUDA_CHECK(cudaMemset(db.data(), 0, db.bytes()));
    const double flops = 4.0 * N * C * OC;
    float ms[2];
    for (int fuse = 0; fuse <= 1; fuse++) {
        ms[fuse] = check::time_ms(env.stream, 10, [&] {
            matmul_backward(env, dinp.data(), dw.data(), db.data(), scratch.data(), dout.data(), inp.data(), w.data(), N, C,
                            OC, {.fuse_bias_grad = fuse != 0});
        });
        check::report_flops(("matmul_backward+dbias " + std::string(fuse ? "bias epilogue " : "column reduction ") + name)
                                .c_str(), ms[fuse], flops);
    }
    check::report_ratio("matmul_backward+dbias bias epilogue / column reduction " + name, ms[1], ms[0],
                        "--bias_grad epilogue against the default");
}

// The same shape with the algorithms tuned (--matmul_tune true's choice: a fresh cache, tune_matmuls on), and the
// tuned times over the first-choice ones; the cache and the setting are restored to the first choices after.
static void time_shape_tuned(CudaEnv& env, int N, int C, int OC, const char* name) {
    const std::array<float, 4> first = time_shape(env, N, C, OC, name);
    detail::lt_algo_cache().clear();
    env.tune_matmuls = true;
    const std::array<float, 4> tuned = time_shape(env, N, C, OC, std::string(name) + " tuned");
    detail::lt_algo_cache().clear();
    env.tune_matmuls = false;
    const char* what[4] = {"forward", "forward+gelu", "backward", "backward+dgelu"};
    for (int i = 0; i < 4; i++)
        check::report_ratio(std::string("matmul ") + what[i] + " tuned / first " + name, tuned[i], first[i],
                            "the weight gradient keeps its first choice");
}

int main() {
    return check::run_checker("matmul", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 512, 768, 3072);  // GPT-2 fc, fewer rows for the CPU reference
        check_shape(env, ck, 300, 64, 192);    // tiny model qkv, N not a multiple of 8
        const int N = 8 * 1024;
        time_shape_tuned(env, N, 768, 3 * 768, "qkv  (8192x768 -> 2304)");
        time_shape_tuned(env, N, 768, 4 * 768, "fc   (8192x768 -> 3072)");
        time_shape_tuned(env, N, 4 * 768, 768, "proj (8192x3072 -> 768)");
        time_shape_tuned(env, N, 768, 50304, "lm head (8192x768 -> 50304)");
        time_bias_grad(env, 2 * N, 768, 3 * 768, "qkv (16384x768 -> 2304)");
        time_bias_grad(env, 2 * N, 768, 4 * 768, "fc  (16384x768 -> 3072)");
    });
}
