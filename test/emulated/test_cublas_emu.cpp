// Checks of emu/cublas.cpp, the CPU cuBLASLt/cuBLAS that the emulated CUDA trainer links instead of the
// real libraries. Each product goes through the same calls llmc/cuda/matmul.cuh makes (descriptors, attributes,
// preference, heuristic, matmul) on small odd shapes, over transA/transB, fp32 and bf16 operands, fp32 and bf16 D,
// accumulation in place and from a separate C, alpha != 1, strided batches, padded leading dimensions and each
// epilogue (BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADA, BGRADB), and is compared with a triple loop in double
// written here; cublasGemmStridedBatchedEx likewise. Also: the heuristic's refusals (aux ld not a multiple of 8,
// misaligned bias, a batched bias gradient, LLMC_EMU_CUBLASLT_NO_EPILOGUE / NO_ALGO), and the status codes for bad
// arguments. Elements outside the matrices (ld padding, batch gaps) must come back untouched, and C must not be read
// when beta is 0 (it holds NaN then).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test/support/testing.h"

namespace {

const char* type_name(cudaDataType t) { return t == CUDA_R_32F ? "f32" : "bf16"; }

// A buffer of fp32 or bf16 elements; at() reads the stored value exactly.
struct Tensor {
    cudaDataType t = CUDA_R_32F;
    std::vector<float> f;
    std::vector<__nv_bfloat16> h;
    Tensor(cudaDataType type, size_t n, uint64_t seed, double scale) : t(type) {
        const std::vector<float> v = testing::random_normal(n, seed, scale);
        if (t == CUDA_R_32F) f = v;
        else
            for (float x : v) h.push_back(__float2bfloat16_rn(x));
    }
    void* ptr() { return t == CUDA_R_32F ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
    size_t size() const { return t == CUDA_R_32F ? f.size() : h.size(); }
    double at(size_t i) const { return t == CUDA_R_32F ? double(f[i]) : double(__bfloat162float(h[i])); }
    void set(size_t i, float v) {
        if (t == CUDA_R_32F) f[i] = v;
        else h[i] = __float2bfloat16_rn(v);
    }
};

double gelu_ref(double x) {
    const double s = std::sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
    const double s = std::sqrt(2.0 / 3.14159265358979323846);
    const double t = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Case {
    int m, n, k, batch;
    bool ta, tb;
    cudaDataType ab, d;
    float alpha, beta;
    bool in_place;  // C == D (matmul.cuh's accumulation); else a separate C with its own ld
    cublasLtEpilogue_t epilogue;
    int pad;  // extra rows in every leading dimension (and extra elements between batches) except aux
    std::string name() const {
        return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " batch=" +
               std::to_string(batch) + (ta ? " T" : " N") + (tb ? "T" : "N") + " ab=" + type_name(ab) +
               " d=" + type_name(d) + " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
               (in_place ? " in-place" : "") + " epilogue=" + std::to_string(int(epilogue)) +
               " pad=" + std::to_string(pad);
    }
};

// The operands and expected results of one case, built before the call.
struct Problem {
    Case c;
    int64_t lda, ldb, ldc, ldd, sa, sb, sc, sd;
    Tensor A, B, C, D, bias, aux;
    explicit Problem(const Case& cs)
        : c(cs),
          lda((cs.ta ? cs.k : cs.m) + cs.pad),
          ldb((cs.tb ? cs.n : cs.k) + cs.pad),
          ldc(cs.m + 2 * cs.pad),
          ldd(cs.m + cs.pad),
          sa(cs.batch > 1 ? lda * (cs.ta ? cs.m : cs.k) + cs.pad : 0),
          sb(cs.batch > 1 ? ldb * (cs.tb ? cs.k : cs.n) + cs.pad : 0),
          sc(cs.batch > 1 ? ldc * cs.n + cs.pad : 0),
          sd(cs.batch > 1 ? ldd * cs.n + cs.pad : 0),
          A(cs.ab, size_t(lda * (cs.ta ? cs.m : cs.k) + sa * (cs.batch - 1)), 11, 1.0),
          B(cs.ab, size_t(ldb * (cs.tb ? cs.k : cs.n) + sb * (cs.batch - 1)), 12, 1.0),
          C(cs.d, size_t(ldc * cs.n + sc * (cs.batch - 1)), 13, 2.0),
          D(cs.d, size_t(ldd * cs.n + sd * (cs.batch - 1)), 14, 2.0),
          bias(cs.d, size_t(std::max(cs.m, cs.n)) + 4, 15, 1.0),  // the bias gradient: m or n, then 4 untouched
          aux(cs.d, size_t(cs.m) * cs.n * cs.batch, 16, 2.0) {
        if (cs.in_place) {
            ldc = ldd;
            sc = sd;
        } else if (cs.beta == 0.0f) {
            for (size_t i = 0; i < C.size(); i++) C.set(i, NAN);  // must not be read
        }
    }
    const Tensor& c_in() const { return c.in_place ? D : C; }
    double a(int b, int i, int p) const { return A.at(size_t(b * sa + (c.ta ? p + i * lda : i + p * lda))); }
    double bm(int b, int p, int j) const { return B.at(size_t(b * sb + (c.tb ? j + p * ldb : p + j * ldb))); }
};

bool has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool bias_grad(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB; }
bool gelu_fwd(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

// Compares `after` (D and aux after the call) with the double reference computed from `before`.
void check_result(const Problem& before, const Problem& after, const std::string& what) {
    const Case& c = before.c;
    const double rel = c.d == CUDA_R_32F ? 1e-5 : std::ldexp(1.0, -8);
    const double floor = 1e-6;
    int bad = 0;
    std::string first;
    // `what` names the tensor, (b, i, j) the element (or -1, index, -1 for a flat index).
    auto check = [&](double got, double want, double tol, const char* what, long b, long i, long j) {
        if (!(std::fabs(got - want) <= tol) && bad++ == 0) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s(%ld,%ld,%ld): got %.9g want %.9g tol %.3g", what, b, i, j, got, want, tol);
            first = buf;
        }
    };
    std::vector<bool> inside(after.D.size(), false);
    for (int b = 0; b < c.batch; b++) {
        for (int j = 0; j < c.n; j++) {
            for (int i = 0; i < c.m; i++) {
                double prod = 0, mag = 0;
                for (int p = 0; p < c.k; p++) {
                    const double t = double(c.alpha) * before.a(b, i, p) * before.bm(b, p, j);
                    prod += t;
                    mag += std::fabs(t);
                }
                double pre = prod;
                if (c.beta != 0.0f) {
                    const double cv = double(c.beta) * before.c_in().at(size_t(b * before.sc + i + j * before.ldc));
                    pre += cv;
                    mag += std::fabs(cv);
                }
                if (has_bias(c.epilogue)) {
                    pre += before.bias.at(size_t(i));
                    mag += std::fabs(before.bias.at(size_t(i)));
                }
                const size_t di = size_t(b * before.sd + i + j * before.ldd);
                const size_t ai = size_t(b) * c.m * c.n + i + size_t(j) * c.m;  // aux: ld m, batch stride m*n
                inside[di] = true;
                double want = pre, err = 1e-5 * mag;
                if (gelu_fwd(c.epilogue)) {
                    check(after.aux.at(ai), pre, rel * std::fabs(pre) + err + floor, "aux", b, i, j);
                    want = gelu_ref(pre);
                    err *= 1.2;  // |gelu'| <= 1.13
                } else if (c.epilogue == CUBLASLT_EPILOGUE_DGELU) {
                    const double g = gelu_grad_ref(before.aux.at(ai));
                    want = pre * g;
                    err *= std::fabs(g);
                }
                check(after.D.at(di), want, rel * std::fabs(want) + err + floor, "D", b, i, j);
            }
        }
    }
    for (size_t i = 0; i < inside.size(); i++)
        if (!inside[i] && after.D.at(i) != before.D.at(i))
            check(after.D.at(i), before.D.at(i), 0, "D padding", -1, long(i), -1);
    // the bias gradient: op(A)'s rows or op(B)'s columns summed over k (batch 0: bias gradients are not batched)
    const int grad_len = c.epilogue == CUBLASLT_EPILOGUE_BGRADA ? c.m : c.epilogue == CUBLASLT_EPILOGUE_BGRADB ? c.n : 0;
    for (int x = 0; x < grad_len; x++) {
        double want = 0, mag = 0;
        for (int p = 0; p < c.k; p++) {
            const double t = c.epilogue == CUBLASLT_EPILOGUE_BGRADA ? before.a(0, x, p) : before.bm(0, p, x);
            want += t;
            mag += std::fabs(t);
        }
        check(after.bias.at(size_t(x)), want, rel * std::fabs(want) + 1e-6 * mag + floor, "bias gradient", 0, x, -1);
    }
    for (size_t i = size_t(grad_len); i < after.bias.size(); i++)
        if (after.bias.at(i) != before.bias.at(i)) check(after.bias.at(i), before.bias.at(i), 0, "bias (untouched)", -1, long(i), -1);
    if (!gelu_fwd(c.epilogue))
        for (size_t i = 0; i < after.aux.size(); i++)
            if (after.aux.at(i) != before.aux.at(i)) check(after.aux.at(i), before.aux.at(i), 0, "aux (untouched)", -1, long(i), -1);
    if (bad)
        testing::report_failure(__FILE__, __LINE__,
                                what + " " + c.name() + ": " + std::to_string(bad) + " bad elements, first " + first);
}

#define OK(call) EXPECT_EQ((call), CUBLAS_STATUS_SUCCESS)

// The descriptors of one cuBLASLt call, set up as matmul.cuh's matmul_lt does.
struct LtCall {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    // aux_ld 0: m. aux_stride: m*n.
    LtCall(Problem& p, int64_t aux_ld = 0, const void* bias = nullptr) {
        const Case& cs = p.c;
        OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t opA = cs.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = cs.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
        OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
        OK(cublasLtMatrixLayoutCreate(&a, cs.ab, cs.ta ? cs.k : cs.m, cs.ta ? cs.m : cs.k, p.lda));
        OK(cublasLtMatrixLayoutCreate(&b, cs.ab, cs.tb ? cs.n : cs.k, cs.tb ? cs.k : cs.n, p.ldb));
        OK(cublasLtMatrixLayoutCreate(&c, cs.d, cs.m, cs.n, p.ldc));
        OK(cublasLtMatrixLayoutCreate(&d, cs.d, cs.m, cs.n, p.ldd));
        if (cs.batch > 1) {
            const std::pair<cublasLtMatrixLayout_t, int64_t> ls[] = {{a, p.sa}, {b, p.sb}, {c, p.sc}, {d, p.sd}};
            for (auto [l, stride] : ls) {
                OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cs.batch, sizeof(cs.batch)));
                OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
            }
        }
        OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &cs.epilogue, sizeof(cs.epilogue)));
        if (has_bias(cs.epilogue) || bias_grad(cs.epilogue)) {
            const void* bp = bias ? bias : p.bias.ptr();
            OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
        }
        if (gelu_fwd(cs.epilogue) || cs.epilogue == CUBLASLT_EPILOGUE_DGELU) {
            const void* ap = p.aux.ptr();
            const int64_t ld = aux_ld ? aux_ld : cs.m, stride = int64_t(cs.m) * cs.n;
            OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap)));
            OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
            if (cs.batch > 1)
                OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride, sizeof(stride)));
        }
        OK(cublasLtMatmulPreferenceCreate(&pref));
        const size_t ws = 32 << 20;
        const uint32_t align = 16;
        OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            OK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
    }
    ~LtCall() {
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(d);
        cublasLtMatrixLayoutDestroy(c);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatmulDescDestroy(op);
    }
    // The heuristic's status; *found gets the algorithm count.
    cublasStatus_t heuristic(cublasLtHandle_t lt, cublasLtMatmulHeuristicResult_t* result, int* found) {
        *found = -1;
        return cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, d, pref, 1, result, found);
    }
};

struct Handles {
    cublasLtHandle_t lt = nullptr;
    cublasHandle_t blas = nullptr;
    Handles() {
        OK(cublasLtCreate(&lt));
        OK(cublasCreate(&blas));
        OK(cublasSetStream(blas, nullptr));
    }
    ~Handles() {
        OK(cublasDestroy(blas));
        OK(cublasLtDestroy(lt));
    }
};

void run_lt_case(const Case& cs) {
    Handles h;
    Problem p(cs);
    const Problem before = p;
    LtCall call(p);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = call.heuristic(h.lt, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found != 1 || result.state != CUBLAS_STATUS_SUCCESS) {
        testing::report_failure(__FILE__, __LINE__, "heuristic failed: " + cs.name() + " " + cublasGetStatusString(st));
        return;
    }
    const void* cptr = cs.in_place ? p.D.ptr() : p.C.ptr();
    const cublasStatus_t mst = cublasLtMatmul(h.lt, call.op, &cs.alpha, p.A.ptr(), call.a, p.B.ptr(), call.b, &cs.beta,
                                              cptr, call.c, p.D.ptr(), call.d, &result.algo, nullptr, 0, nullptr);
    if (mst != CUBLAS_STATUS_SUCCESS) {
        testing::report_failure(__FILE__, __LINE__, "cublasLtMatmul failed: " + cs.name() + " " + cublasGetStatusString(mst));
        return;
    }
    check_result(before, p, "cublasLtMatmul");
}

// m, n, k, batch; with m = k, a transpose mishandled in the product gives wrong values instead of a shape error
// or an out-of-bounds read.
const int kShapes[][4] = {{24, 5, 16, 1}, {40, 3, 8, 3}, {16, 7, 16, 2}};

// Calls f(case) for every shape, both transposes of A and B, fp32 and bf16 inputs and outputs, beta 0 and 1; the
// case comes with alpha 1, in place, no epilogue and no padding for f to vary.
template <class F>
void for_each_product(F&& f) {
    for (auto& s : kShapes)
        for (bool ta : {false, true})
            for (bool tb : {false, true})
                for (cudaDataType ab : {CUDA_R_32F, CUDA_R_16BF})
                    for (cudaDataType d : {CUDA_R_32F, CUDA_R_16BF})
                        for (float beta : {0.0f, 1.0f})
                            f(Case{s[0], s[1], s[2], s[3], ta, tb, ab, d, 1.0f, beta, true, CUBLASLT_EPILOGUE_DEFAULT, 0});
}

}  // namespace

TEST(lt_plain_products_match_double_reference) {
    int cases = 0;
    for_each_product([&](Case cs) {
        cs.alpha = cs.ta != cs.tb ? 0.75f : 1.0f;
        for (bool in_place : {true, false})
            for (int pad : {0, 3}) {
                cs.in_place = in_place;
                cs.pad = pad;
                run_lt_case(cs);
                cases++;
            }
    });
    EXPECT_EQ(cases, 384);
}

TEST(lt_epilogues_match_double_reference) {
    for_each_product([](Case cs) {
        cs.alpha = cs.tb ? 1.0f : 1.25f;
        cs.in_place = cs.ta;
        cs.pad = cs.tb ? 0 : 2;
        for (auto epi : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                         CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
            if (bias_grad(epi) && cs.batch > 1) continue;  // refused (heuristic_refuses_what_cublaslt_cannot_fuse)
            cs.epilogue = epi;
            run_lt_case(cs);
        }
    });
}

TEST(lt_larger_product_through_blocked_sgemm) {
    for (cudaDataType t : {CUDA_R_32F, CUDA_R_16BF}) {
        run_lt_case({136, 70, 300, 1, true, false, t, t, 1.0f, 1.0f, true, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 0});
        run_lt_case({200, 33, 129, 2, false, true, t, CUDA_R_32F, 0.5f, 1.0f, true, CUBLASLT_EPILOGUE_DEFAULT, 1});
    }
}

// Ties and near-ties of fp32 -> bf16, through the product A (m x 1) * 1: exactly cuda_bf16.h's rounding.
TEST(bf16_output_rounds_to_nearest_even) {
    Handles h;
    const float e = std::ldexp(1.0f, -8);  // half a bf16 ulp at 1
    std::vector<float> a = {1.0f + e, 1.0f + 3 * e, 1.0f + e + std::ldexp(1.0f, -20), -(1.0f + e), -(1.0f + 3 * e),
                            3.0f + 2 * e, 1e-30f, -2.5e38f};
    const float one = 1.0f, zero = 0.0f;
    std::vector<__nv_bfloat16> d(a.size());
    EXPECT_EQ(cublasGemmStridedBatchedEx(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(a.size()), 1, 1, &one, a.data(),
                                         CUDA_R_32F, int(a.size()), 0, &one, CUDA_R_32F, 1, 0, &zero, d.data(),
                                         CUDA_R_16BF, int(a.size()), 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    for (size_t i = 0; i < a.size(); i++) {
        const float got = __bfloat162float(d[i]), want = __bfloat162float(__float2bfloat16_rn(a[i]));
        if (!(got == want))
            testing::report_failure(__FILE__, __LINE__, "bf16 of " + std::to_string(a[i]) + ": got " +
                                                            std::to_string(got) + " want " + std::to_string(want));
    }
}

TEST(gemm_strided_batched_ex_matches_double_reference) {
    Handles h;
    for_each_product([&](Case cs) {
        cs.alpha = cs.ta ? 0.5f : 1.0f;
        for (int pad : {0, 3}) {
            cs.pad = pad;
            Problem p(cs);
            const Problem before = p;
            const cublasStatus_t st = cublasGemmStridedBatchedEx(
                h.blas, cs.ta ? CUBLAS_OP_T : CUBLAS_OP_N, cs.tb ? CUBLAS_OP_T : CUBLAS_OP_N, cs.m, cs.n, cs.k,
                &cs.alpha, p.A.ptr(), cs.ab, int(p.lda), p.sa, p.B.ptr(), cs.ab, int(p.ldb), p.sb, &cs.beta, p.D.ptr(),
                cs.d, int(p.ldd), p.sd, cs.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            EXPECT_EQ(st, CUBLAS_STATUS_SUCCESS);
            if (st == CUBLAS_STATUS_SUCCESS) check_result(before, p, "cublasGemmStridedBatchedEx");
        }
    });
}

TEST(heuristic_refuses_what_cublaslt_cannot_fuse) {
    Handles h;
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const Case gelu{24, 5, 16, 1, true, false, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_GELU_AUX, 0};
    {
        Problem p(gelu);
        LtCall ok(p);
        EXPECT_EQ(ok.heuristic(h.lt, &r, &found), CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(found, 1);
        LtCall odd_ld(p, 28);  // >= m but not a multiple of 8
        EXPECT_EQ(odd_ld.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
        LtCall short_ld(p, 16);  // fewer than m rows: an invalid description
        EXPECT_EQ(short_ld.heuristic(h.lt, &r, &found), CUBLAS_STATUS_INVALID_VALUE);
        EXPECT_EQ(found, 0);
    }
    for (auto epi : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BGRADB}) {  // the bias vector, or its gradient
        Case bias = gelu;
        bias.epilogue = epi;
        Problem p(bias);
        LtCall misaligned(p, 0, static_cast<const __nv_bfloat16*>(p.bias.ptr()) + 1);
        EXPECT_EQ(misaligned.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
    }
    {
        Case grad = gelu;
        grad.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        grad.batch = 2;
        Problem pb(grad);
        LtCall batched_grad(pb);
        EXPECT_EQ(batched_grad.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
    }
    {
        Case dflt = gelu;
        dflt.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        Problem pd(dflt), pg(gelu);
        LtCall plain(pd), fused(pg);
        setenv("LLMC_EMU_CUBLASLT_NO_EPILOGUE", "1", 1);
        EXPECT_EQ(fused.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
        EXPECT_EQ(plain.heuristic(h.lt, &r, &found), CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(found, 1);
        setenv("LLMC_EMU_CUBLASLT_NO_EPILOGUE", "0", 1);  // "0" means off
        EXPECT_EQ(fused.heuristic(h.lt, &r, &found), CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(found, 1);
        unsetenv("LLMC_EMU_CUBLASLT_NO_EPILOGUE");
        setenv("LLMC_EMU_CUBLASLT_NO_ALGO", "1", 1);
        EXPECT_EQ(plain.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
        setenv("LLMC_EMU_CUBLASLT_NO_ALGO", "", 1);  // empty means off
        EXPECT_EQ(plain.heuristic(h.lt, &r, &found), CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(found, 1);
        unsetenv("LLMC_EMU_CUBLASLT_NO_ALGO");
    }
}

TEST(bad_arguments_get_cublas_status_codes) {
    Handles h;
    cublasLtMatmulDesc_t op = nullptr;
    OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t mode = 0;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)),
              CUBLAS_STATUS_INVALID_VALUE);
    const int64_t wide = CUBLAS_OP_T;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4), CUBLAS_STATUS_INVALID_VALUE);
    OK(cublasLtMatmulDescDestroy(op));
    cublasLtMatrixLayout_t l = nullptr;
    OK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 4));
    const int32_t order = 0;
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)),
              CUBLAS_STATUS_INVALID_VALUE);
    OK(cublasLtMatrixLayoutDestroy(l));
    EXPECT_EQ(cublasLtCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);

    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    {  // inconsistent shapes: D has one column too many
        Case cs{24, 5, 16, 1, false, false, CUDA_R_32F, CUDA_R_32F, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_DEFAULT, 0};
        Problem p(cs);
        LtCall call(p);
        cublasLtMatrixLayout_t wrong = nullptr;
        OK(cublasLtMatrixLayoutCreate(&wrong, CUDA_R_32F, 24, 6, 24));
        EXPECT(cublasLtMatmulAlgoGetHeuristic(h.lt, call.op, call.a, call.b, call.c, wrong, call.pref, 1, &r, &found) !=
               CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(found, 0);
        OK(cublasLtMatrixLayoutDestroy(wrong));
    }
    {  // fp16 is not served
        Case cs{24, 5, 16, 1, false, false, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, false, CUBLASLT_EPILOGUE_DEFAULT, 0};
        Problem p(cs);
        LtCall call(p);
        cublasLtMatrixLayout_t half = nullptr;
        OK(cublasLtMatrixLayoutCreate(&half, CUDA_R_16F, 24, 5, 24));
        EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(h.lt, call.op, call.a, call.b, half, half, call.pref, 1, &r, &found),
                  CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
        OK(cublasLtMatrixLayoutDestroy(half));
        const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
        OK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof(relu)));
        EXPECT_EQ(call.heuristic(h.lt, &r, &found), CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(found, 0);
    }
    float x[16] = {}, one = 1.0f;
    EXPECT_EQ(cublasGemmStridedBatchedEx(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, -1, 4, 4, &one, x, CUDA_R_32F, 4, 0, x,
                                         CUDA_R_32F, 4, 0, &one, x, CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasGemmStridedBatchedEx(h.blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, x, CUDA_R_32F, 3, 0, x,
                                         CUDA_R_32F, 4, 0, &one, x, CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(cublasGemmStridedBatchedEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, x, CUDA_R_32F, 4, 0, x,
                                         CUDA_R_32F, 4, 0, &one, x, CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(cublasSetWorkspace(nullptr, x, sizeof(x)), CUBLAS_STATUS_NOT_INITIALIZED);
    EXPECT_EQ(cublasSetWorkspace(h.blas, nullptr, sizeof(x)), CUBLAS_STATUS_INVALID_VALUE);
    OK(cublasSetWorkspace(h.blas, x, sizeof(x)));
    EXPECT(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("NOT_SUPPORTED") != std::string::npos);
    EXPECT(std::string(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)).find("INVALID_VALUE") != std::string::npos);
}

TEST_MAIN()
