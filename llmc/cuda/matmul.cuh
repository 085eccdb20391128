// Matmuls through cuBLASLt, for the linear layers (and the batched attention products in attention.cuh).
//  - matmul_lt: the general column-major D = alpha * op(A) op(B) [+ D] [+ bias] [GELU], optionally strided-
//    batched, D in floatX or fp32 (fp32 D with floatX A/B is how weight gradients accumulate into the fp32
//    gradient buffer without rounding through bf16).
//  - matmul_forward: out (N,OC) = inp (N,C) W^T + b for PyTorch-layout W (OC,C), with the bias and optionally
//    the GELU fused as epilogues (pre_gelu keeps the GELU input for the backward).
//  - matmul_backward: dinp = dout W, dweight (+)= dout^T inp (fp32), dbias (+)= column sums of dout: by default a
//    deterministic column reduction (its own pass over dout), or with fuse_bias_grad (--bias_grad epilogue,
//    opt-in) cuBLASLt's BGRADB epilogue on the weight-gradient product, which already reads dout: the sums
//    come out of that product in fp32 (D's type) into scratch and are added to dbias. The epilogue sums in its
//    own order, so the bias gradient's last bits differ from the reduction's (reproducible from run to run
//    for one algorithm). When inp was gelu(pre_gelu), dinp can come out as the gradient of pre_gelu directly
//    (cuBLASLt's DGELU epilogue, saving gelu_backward_inplace's pass over N x OC).
// Every epilogue has one fallback, in matmul_lt: when cuBLASLt cannot fuse it (alignment rules, or no algorithm
// for the problem), matmul_lt_unfused runs the plain product and then the separate bias / GELU kernels; the bias
// gradient's is matmul_backward's column reduction (matmul_lt says it ran nothing).
// The algorithm of each problem is cuBLASLt's heuristic first choice, or with CudaEnv::tune_matmuls
// (--matmul_tune, opt-in) the fastest of its first kTuneCandidates, timed on the problem's own buffers the
// first time the problem is met, for products that overwrite their output (the accumulating weight gradients keep
// the heuristic's: a timing run would add to them). Tuned choices can differ between processes, and with them
// the bits of the products, so a tuned run is not bit-reproducible across runs or a resume.
// Row-major (PyTorch) matrices are column-major transposes; each call below derives its op/ld from that.
// Compute is always fp32 (CUBLAS_COMPUTE_32F); fp32 builds may opt into TF32 through CudaEnv::allow_tf32.
#pragma once
#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>

#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/gelu.cuh"

namespace llmc {

namespace detail {

// Largest power of two (<= 256) dividing the address and, for batched operands, the batch stride in bytes.
inline uint32_t lt_alignment(const void* p, long long stride_bytes) {
    uintptr_t v = reinterpret_cast<uintptr_t>(p) | uintptr_t(256);
    if (stride_bytes) v |= static_cast<uintptr_t>(stride_bytes);
    return static_cast<uint32_t>(v & (~v + 1));
}

// Owns the cuBLASLt descriptors of one call (released even when a check throws).
struct LtDescs {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~LtDescs() {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

// Cache key of a matmul problem (see matmul_lt).
struct LtKey {
    int m, n, k;
    bool ta, tb;
    int batch;
    long long sa, sb, sd;
    int d_type, epilogue, compute;
    uint32_t align_a, align_b, align_d, align_epilogue;
    int64_t workspace;
    auto tie() const {
        return std::tie(m, n, k, ta, tb, batch, sa, sb, sd, d_type, epilogue, compute, align_a, align_b, align_d,
                        align_epilogue, workspace);
    }
    bool operator<(const LtKey& o) const { return tie() < o.tie(); }
};
inline constexpr int kTuneCandidates = 8;  // CudaEnv::tune_matmuls: the heuristic's candidates timed per problem
// One process drives one GPU, so a process-wide cache is enough.
struct LtChoice {
    int found;  // 0: cuBLASLt has nothing for this problem (remembered too)
    cublasLtMatmulHeuristicResult_t heuristic;
};
inline std::map<LtKey, LtChoice>& lt_algo_cache() {
    static std::map<LtKey, LtChoice> cache;
    return cache;
}

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return a && b && x < y + b_bytes && y < x + a_bytes;
}

// The candidate of `candidates` that `run` (one product with the given algorithm) completes fastest, by 3 timed
// runs after a warm-up each; candidates cuBLASLt rejects (state or launch) are passed over. Index 0 when none runs.
template <class Run>
int fastest_candidate(const CudaEnv& env, const cublasLtMatmulHeuristicResult_t* candidates, int count, Run&& run) {
    int best = 0;
    float best_ms = 0.0f;
    CudaTimer timer(env.stream);
    for (int c = 0; c < count; c++) {
        if (candidates[c].state != CUBLAS_STATUS_SUCCESS || candidates[c].workspaceSize > env.workspace_bytes) continue;
        if (run(candidates[c].algo) != CUBLAS_STATUS_SUCCESS) continue;
        timer.start();
        for (int i = 0; i < 3; i++) CUBLAS_CHECK(run(candidates[c].algo));
        const float ms = timer.stop_ms();
        if (best_ms == 0.0f || ms < best_ms) best = c, best_ms = ms;
    }
    return best;
}

inline void lt_set_batch(cublasLtMatrixLayout_t layout, int batch, long long stride) {
    if (batch <= 1) return;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

}  // namespace detail

// out (N rows of OC) += bias (OC): the bias epilogue's work when cuBLASLt cannot fuse it.
__global__ void add_bias_kernel(floatX* out, const floatX* bias, size_t N, int OC) {
    const size_t total = N * size_t(OC);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<floatX>(to_float(out[i]) + to_float(bias[i % OC]));
}

// Whether cuBLASLt's epilogues may be asked for, for an output D of m rows (column-major): the bias vector
// 16-byte aligned, and for the GELU ones (aux = pre_gelu or dgelu_input) D and aux 16-byte aligned with a
// leading dimension that is a multiple of 8.
inline bool lt_epilogue_ok(const void* d, const floatX* bias, const floatX* aux, int m) {
    if (bias && !aligned16(bias)) return false;
    if (aux && (!aligned16(aux) || !aligned16(d) || m % 8 != 0)) return false;
    return true;
}

template <typename TD>
bool matmul_lt(const CudaEnv& env, TD* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
               bool transA, bool transB, bool accumulate, int batch = 1, long long strideA = 0, long long strideB = 0,
               long long strideD = 0, floatX* pre_gelu = nullptr, float alpha = 1.0f,
               const floatX* dgelu_input = nullptr, TD* bias_grad = nullptr);

// The epilogues' work without cuBLASLt's fusion: the product (with the bias epilogue alone where that can
// still be fused), then the bias, GELU or GELU-backward kernels. matmul_lt takes this path by itself whenever
// cuBLASLt cannot fuse (alignment, or no algorithm), so every epilogue request has one answer.
inline void matmul_lt_unfused(const CudaEnv& env, floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m,
                              int n, int k, bool transA, bool transB, bool accumulate, floatX* pre_gelu, float alpha,
                              const floatX* dgelu_input) {
    floatX* product = pre_gelu ? pre_gelu : d;
    const bool bias_fusable = (pre_gelu || dgelu_input) && lt_epilogue_ok(product, bias, nullptr, m);
    matmul_lt<floatX>(env, product, a, b, bias_fusable ? bias : nullptr, m, n, k, transA, transB, accumulate, 1, 0, 0, 0,
                      nullptr, alpha);
    if (bias && !bias_fusable) {
        LLMC_LAUNCH(grid_stride_blocks(size_t(m) * n, 256), 256, 0, env.stream, add_bias_kernel)(
            product, bias, size_t(n), m);
        CUDA_CHECK_LAUNCH();
    }
    if (pre_gelu) gelu_forward(d, pre_gelu, size_t(m) * n, env.stream);
    if (dgelu_input) gelu_backward_inplace(d, dgelu_input, size_t(m) * n, env.stream);
}

// Column-major: D (m x n, ld m) = alpha * op(A) (m x k) * op(B) (k x n) [+ D if accumulate] [+ bias (m)]
// [then GELU, with the pre-GELU values written to pre_gelu (m x n, ld m)]
// [or, with dgelu_input (m x n, ld m): D = gelu'(dgelu_input) * (the product), the GELU backward]
// [or, with bias_grad (n elements of D's type, 16-byte aligned): bias_grad = the column sums of op(B) over k,
// cuBLASLt's BGRADB epilogue; alpha 1, no batch, no other epilogue].
// A is stored (k x m, ld k) when transA else (m x k, ld m); B is (n x k, ld n) when transB else (k x n, ld k).
// Batched: `batch` matrices at strides (in elements) strideA/B/D. TD is floatX or float.
// Returns true. With bias_grad alone it may return false instead, having run nothing: cuBLASLt has no kernel
// with that epilogue for the problem (or bias_grad is misaligned), and the caller sums op(B) itself.
template <typename TD>
bool matmul_lt(const CudaEnv& env, TD* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
               bool transA, bool transB, bool accumulate, int batch, long long strideA, long long strideB,
               long long strideD, floatX* pre_gelu, float alpha, const floatX* dgelu_input, TD* bias_grad) {
    static_assert(std::is_same_v<TD, float> || std::is_same_v<TD, floatX>, "matmul_lt: D must be float or floatX");
    constexpr cudaDataType_t d_type = std::is_same_v<TD, float> ? CUDA_R_32F : kFloatXCuda;
    LLMC_CHECK(m > 0 && n > 0 && k > 0 && batch > 0, "matmul_lt: empty or negative shape m=" + std::to_string(m) +
                                                         " n=" + std::to_string(n) + " k=" + std::to_string(k));
    LLMC_CHECK((!(bias || pre_gelu || dgelu_input) || std::is_same_v<TD, floatX>),
               "matmul_lt: bias/GELU epilogues need a floatX output");
    LLMC_CHECK(!(dgelu_input && (pre_gelu || bias || accumulate || batch > 1)),
               "matmul_lt: the GELU-backward epilogue takes no bias, accumulation, forward GELU or batch");
    LLMC_CHECK(!(pre_gelu && (accumulate || batch > 1)), "matmul_lt: the GELU epilogue takes no accumulation or batch");
    LLMC_CHECK(!(bias && batch > 1), "matmul_lt: the bias epilogue takes no batch");
    LLMC_CHECK(!(bias_grad && (bias || pre_gelu || dgelu_input || batch > 1 || alpha != 1.0f)),
               "matmul_lt: the bias-gradient epilogue takes no other epilogue, batch or alpha");
    const bool wants_epilogue = bias || pre_gelu || dgelu_input;
    if constexpr (std::is_same_v<TD, floatX>) {
        if (wants_epilogue && !lt_epilogue_ok(d, bias, pre_gelu ? pre_gelu : dgelu_input, m)) {
            matmul_lt_unfused(env, d, a, b, bias, m, n, k, transA, transB, accumulate, pre_gelu, alpha, dgelu_input);
            return true;
        }
    }
    if (bias_grad && !aligned16(bias_grad)) return false;
    detail::LtDescs desc;
    const cublasComputeType_t compute =
        (kFloatXIsFloat && env.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.op, compute, CUDA_R_32F));
    const cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));

    if (transA) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, kFloatXCuda, k, m, k));
    else CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, kFloatXCuda, m, k, m));
    if (transB) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, kFloatXCuda, n, k, n));
    else CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, kFloatXCuda, k, n, k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.c, d_type, m, n, m));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, d_type, m, n, m));
    detail::lt_set_batch(desc.a, batch, strideA);
    detail::lt_set_batch(desc.b, batch, strideB);
    detail::lt_set_batch(desc.c, batch, strideD);
    detail::lt_set_batch(desc.d, batch, strideD);

    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (pre_gelu) epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (dgelu_input) epilogue = CUBLASLT_EPILOGUE_DGELU;
    else if (bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    else if (bias_grad) epilogue = CUBLASLT_EPILOGUE_BGRADB;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {  // bias and aux types default to D's type (floatX), which is what we store
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (bias_grad) {  // written in D's type: fp32 for the weight gradients
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_grad,
                                                    sizeof(bias_grad)));
    }
    if (pre_gelu || dgelu_input) {
        const int64_t ld = m;
        const void* aux = pre_gelu ? pre_gelu : dgelu_input;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
        if (batch > 1) {
            const int64_t aux_stride = strideD;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride, sizeof(aux_stride)));
        }
    }

    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
    const size_t ws = env.workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t align_a = detail::lt_alignment(a, strideA * static_cast<long long>(sizeof(floatX)));
    const uint32_t align_b = detail::lt_alignment(b, strideB * static_cast<long long>(sizeof(floatX)));
    const uint32_t align_d = detail::lt_alignment(d, strideD * static_cast<long long>(sizeof(TD)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));

    // The heuristic query costs tens of microseconds of host time; a training step repeats the same few
    // problems, so the chosen algorithm is cached per problem (shape, ops, types, epilogue, alignments).
    const detail::LtKey key{m, n, k, transA, transB, batch, strideA, strideB, strideD, int(d_type), int(epilogue),
                            int(compute), align_a, align_b, align_d,
                            std::min({bias ? detail::lt_alignment(bias, 0) : 256u,
                                      pre_gelu ? detail::lt_alignment(pre_gelu, 0) : 256u,
                                      dgelu_input ? detail::lt_alignment(dgelu_input, 0) : 256u,
                                      bias_grad ? detail::lt_alignment(bias_grad, 0) : 256u}),
                            static_cast<int64_t>(env.workspace_bytes)};
    const float beta = accumulate ? 1.0f : 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(env.lt, desc.op, &alpha, a, desc.a, b, desc.b, &beta, d, desc.c, d, desc.d, &algo,
                              env.workspace, env.workspace_bytes, env.stream);
    };
    auto& cache = detail::lt_algo_cache();
    auto cached = cache.find(key);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    if (cached != cache.end()) {
        heuristic = cached->second.heuristic;
        found = cached->second.found;
    } else {
        // Tuning reruns the product: only where that gives the same output (it overwrites D, reading nothing D is)
        const size_t d_bytes = (size_t(batch - 1) * strideD + size_t(m) * n) * sizeof(TD);
        const size_t a_bytes = (size_t(batch - 1) * strideA + size_t(m) * k) * sizeof(floatX);
        const size_t b_bytes = (size_t(batch - 1) * strideB + size_t(k) * n) * sizeof(floatX);
        const bool tune = env.tune_matmuls && !accumulate && !detail::ranges_overlap(d, d_bytes, a, a_bytes) &&
                          !detail::ranges_overlap(d, d_bytes, b, b_bytes) &&
                          !detail::ranges_overlap(d, d_bytes, dgelu_input, size_t(m) * n * sizeof(floatX));
        cublasLtMatmulHeuristicResult_t candidates[detail::kTuneCandidates]{};
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(env.lt, desc.op, desc.a, desc.b, desc.c, desc.d,
                                                                 desc.pref, tune ? detail::kTuneCandidates : 1,
                                                                 candidates, &found);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;  // "nothing for this configuration"
        else if (st != CUBLAS_STATUS_SUCCESS) cublas_fail(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
        heuristic = candidates[found > 1 ? detail::fastest_candidate(env, candidates, found, run) : 0];
        cache.emplace(key, detail::LtChoice{found, heuristic});
    }
    if constexpr (std::is_same_v<TD, floatX>) {
        if (found == 0 && wants_epilogue) {  // no fused kernel for this problem
            matmul_lt_unfused(env, d, a, b, bias, m, n, k, transA, transB, accumulate, pre_gelu, alpha, dgelu_input);
            return true;
        }
    }
    if (found == 0 && bias_grad) return false;
    if (found == 0 && epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
        // No cuBLASLt kernel for this problem (an unusual alignment): the classic cuBLAS GEMM takes it.
        const float beta0 = accumulate ? 1.0f : 0.0f;
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(env.blas, opA, opB, m, n, k, &alpha, a, kFloatXCuda, transA ? k : m, strideA,
                                                b, kFloatXCuda, transB ? n : k, strideB, &beta0, d, d_type, m, strideD,
                                                batch, compute, CUBLAS_GEMM_DEFAULT));
        return true;
    }
    LLMC_CHECK(found > 0, "cuBLASLt has no algorithm for matmul m=" + std::to_string(m) + " n=" + std::to_string(n) +
                              " k=" + std::to_string(k) + " batch=" + std::to_string(batch) +
                              (bias ? " +bias" : "") + (pre_gelu ? " +gelu" : "") + (dgelu_input ? " +dgelu" : "") +
                              ": keep channels and head sizes multiples of 8 (16-byte aligned rows)");
    CUBLAS_CHECK(run(heuristic.algo));
    return true;
}

// The same, for a problem stated as a km::GemmShape (kernel_math.h).
template <typename TD>
bool matmul_lt(const CudaEnv& env, TD* d, const floatX* a, const floatX* b, const floatX* bias, const km::GemmShape& g,
               bool accumulate, floatX* pre_gelu = nullptr, float alpha = 1.0f, const floatX* dgelu_input = nullptr,
               TD* bias_grad = nullptr) {
    return matmul_lt<TD>(env, d, a, b, bias, g.m, g.n, g.k, g.ta, g.tb, accumulate, g.batch, g.sa, g.sb, g.sd, pre_gelu,
                         alpha, dgelu_input, bias_grad);
}

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC, may be nullptr).
// With pre_gelu: pre_gelu = inp @ weight^T + bias and out = gelu(pre_gelu); the GELU is a cuBLASLt epilogue when
// fuse_gelu (matmul_lt falls back to gelu_forward by itself where cuBLASLt cannot fuse), else gelu_forward.
inline void matmul_forward(const CudaEnv& env, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, floatX* pre_gelu = nullptr, bool fuse_gelu = true) {
    const km::GemmShape g = km::linear_forward_gemm(N, C, OC);
    if (pre_gelu && !fuse_gelu) matmul_lt_unfused(env, out, weight, inp, bias, g.m, g.n, g.k, g.ta, g.tb, false, pre_gelu, 1.0f, nullptr);
    else matmul_lt<floatX>(env, out, weight, inp, bias, g, false, pre_gelu);
}

// At least OC floats (the epilogue's sums) either way.
inline size_t matmul_backward_scratch_floats(int N, int OC) {
    return std::max(column_reduce_scratch_floats(N, OC, 1), size_t(OC));
}

// What matmul_backward does beyond a plain linear layer's gradients added to the buffers (the defaults).
struct MatmulBackwardOptions {
    // (N,C): inp was gelu(pre_gelu), and dinp is then the gradient of pre_gelu instead: cuBLASLt's DGELU epilogue
    // when fuse_dgelu (matmul_lt falls back by itself where cuBLASLt cannot fuse), else the product and
    // gelu_backward_inplace
    const floatX* pre_gelu = nullptr;
    bool fuse_dgelu = true;
    // dbias from the weight-gradient product's BGRADB epilogue (into scratch, then added), where cuBLASLt has that
    // kernel; else the column reduction (--bias_grad)
    bool fuse_bias_grad = false;
    // false: dweight and dbias are written instead of added to (the first micro-step of a step: no zeroed
    // gradient buffer needed, and the product does not read the old dweight)
    bool accumulate = true;
};

// Given dout (N,OC) of out = inp (N,C) @ weight (OC,C)^T + bias:
//   dinp (N,C) = dout @ weight              (overwritten; skipped when dinp is nullptr)
//   dweight (OC,C, fp32) += dout^T @ inp     (accumulated: gradient accumulation over micro-steps)
//   dbias (OC, fp32) += sum over rows of dout (skipped when nullptr; needs `scratch`, see above)
// with the variations of MatmulBackwardOptions.
inline void matmul_backward(const CudaEnv& env, floatX* dinp, float* dweight, float* dbias, float* scratch,
                            const floatX* dout, const floatX* inp, const floatX* weight, int N, int C, int OC,
                            const MatmulBackwardOptions& options = {}) {
    const auto& [pre_gelu, fuse_dgelu, fuse_bias_grad, accumulate] = options;
    const km::GemmShape g = km::linear_dinp_gemm(N, C, OC);
    if (dinp && pre_gelu && !fuse_dgelu)
        matmul_lt_unfused(env, dinp, weight, dout, nullptr, g.m, g.n, g.k, g.ta, g.tb, false, nullptr, 1.0f, pre_gelu);
    else if (dinp)
        matmul_lt<floatX>(env, dinp, weight, dout, nullptr, g, false, nullptr, 1.0f, pre_gelu);
    const km::GemmShape dw = km::linear_dweight_gemm(N, C, OC);
    if (dweight && dbias && fuse_bias_grad &&
        matmul_lt<float>(env, dweight, inp, dout, nullptr, dw, accumulate, nullptr, 1.0f, nullptr, scratch)) {
        column_reduce_finish<1>(ColumnOutputs<1>{{dbias}}, scratch, 1, OC, env.stream, accumulate);  // dbias (+)= sums
        return;
    }
    if (dweight) matmul_lt<float>(env, dweight, inp, dout, nullptr, dw, accumulate);
    if (dbias) column_reduce<1>(ColumnOutputs<1>{{dbias}}, scratch, N, OC, BiasGrad{dout, OC}, env.stream, accumulate);
}

}  // namespace llmc
