// The cuBLASLt/cuBLAS subset that llmc/cuda/matmul.cuh (and CudaEnv in llmc/cuda/cuda_common.cuh) calls, computed on the
// CPU, so the CUDA trainer and its tests run under the block emulator (emu/block_emulator.h) without a GPU:
// host code links this file and OpenBLAS (-lopenblas) instead of -lcublasLt -lcublas. "Device memory" is host
// memory; a product is checked when called and runs in its stream's order (emu::submit, emu_streams.h), with
// alpha and beta read at the call, as cuBLAS reads host scalars.
// An independent reference: written from the cuBLASLt documentation, not from our kernels (the GELU below is
// its own formula, not kernel_math.h's).
//  - Column-major: element (i, j) of a matrix with leading dimension ld is at [i + j*ld]; D = alpha op(A) op(B)
//    + beta C, strided-batched when the layouts say so; A/B/C/D in bf16 or fp32, compute and scale in fp32
//    (the product by cblas_sgemm on float copies of the operands; bf16 stores round to nearest even).
//  - Epilogues DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU (bias and aux in D's type, as the defaults are), and
//    BGRADA / BGRADB: the bias gradient, op(A)'s rows (m) or op(B)'s columns (n) summed over k as stored (in
//    double, rounded once to D's type; alpha does not scale it), written to the bias pointer; not batched.
//  - The heuristic reports one algorithm for every valid problem, except where the real library documents
//    that it cannot fuse (bias/aux not 16-byte aligned, aux ld or batch stride not a multiple of 8), and, to
//    drive matmul.cuh's fallbacks in tests: none for any epilogue when LLMC_EMU_CUBLASLT_NO_EPILOGUE is set,
//    none at all when LLMC_EMU_CUBLASLT_NO_ALGO is set (set: non-empty and not "0").
//  - LLMC_EMU_CUBLASLT_COUNTS=1 prints at exit how many products ran with each epilogue, so a test can tell
//    that a path it asked for was taken (a fused epilogue and its fallback may give the same values).
#include <cblas.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include "emu/streams.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

struct cublasContext {
    cudaStream_t stream = nullptr;
};
struct cublasLtContext {
    int unused = 0;
};

namespace {

struct MatmulDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0, aux_stride = 0;
};
struct Layout {
    cudaDataType type;
    int64_t rows, cols, ld;
    int32_t batch = 1;
    int64_t stride = 0;
};
struct Preference {
    uint64_t max_workspace = 0;
    uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D
};

MatmulDesc* get(cublasLtMatmulDesc_t d) { return reinterpret_cast<MatmulDesc*>(d); }
Layout* get(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
Preference* get(cublasLtMatmulPreference_t p) { return reinterpret_cast<Preference*>(p); }

bool env_flag(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool supported_type(cudaDataType t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }
bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }
bool fp32_compute(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
           c == CUBLAS_COMPUTE_32F_FAST_TF32;
}
bool has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool has_bias_grad(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB; }
bool has_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

float bf16_to_float(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest, ties to even; NaN stays (quiet) NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}
float load(const void* p, cudaDataType t, int64_t i) {
    return t == CUDA_R_32F ? static_cast<const float*>(p)[i] : bf16_to_float(static_cast<const uint16_t*>(p)[i]);
}
void store(void* p, cudaDataType t, int64_t i, float v) {
    if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
    else static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
}

// GPT-2's tanh-approximated GELU and its exact derivative, with u = sqrt(2/pi) (x + 0.044715 x^3):
// gelu(x) = 0.5 x (1 + tanh u) and gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'. Evaluated through
// s = 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)) and 1 - s = 1 / (1 + e^(2u)), which are the same values without
// the cancellation of 1 + tanh u in float for negative x (where gelu' is small and its terms nearly cancel).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
float gelu(float x) {
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    return x / (1.0f + std::exp(-2.0f * u));
}
float gelu_grad(float x) {
    if (std::fabs(x) > 40.0f) return x > 0.0f ? 1.0f : 0.0f;  // s is exactly 0 or 1 in float
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    const float s = 1.0f / (1.0f + std::exp(-2.0f * u)), one_minus_s = 1.0f / (1.0f + std::exp(2.0f * u));
    return s * (1.0f + 2.0f * x * one_minus_s * du);
}

// One matrix operand: base pointer, element type, leading dimension and batch stride (in elements).
struct Mat {
    const void* p;
    cudaDataType t;
    int64_t ld, stride;
};
struct Gemm {
    cublasOperation_t ta, tb;
    int64_t m, n, k;
    int64_t batch;
    float alpha, beta;
    Mat a, b, c, d;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0, aux_stride = 0;
};

// Element (row, col) of op(X) for an operand stored as Mat x, op N or T, in batch 0 (bias gradients take no batch).
float op_element(const Mat& x, cublasOperation_t op, int64_t row, int64_t col) {
    return load(x.p, x.t, op == CUBLAS_OP_N ? row + col * x.ld : col + row * x.ld);
}

// A float view of a stored rows x cols matrix: the memory itself when fp32, else a converted copy (ld = rows).
const float* as_float(const Mat& x, int64_t batch, int64_t rows, int64_t cols, std::vector<float>& buf, int64_t& ld) {
    const int64_t base = batch * x.stride;
    if (x.t == CUDA_R_32F) {
        ld = x.ld;
        return static_cast<const float*>(x.p) + base;
    }
    buf.resize(size_t(rows * cols));
    const uint16_t* s = static_cast<const uint16_t*>(x.p) + base;
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) buf[size_t(i + j * rows)] = bf16_to_float(s[i + j * x.ld]);
    ld = rows > 0 ? rows : 1;
    return buf.data();
}

const char* epilogue_name(int e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    }
    return "?";
}

// Products run per epilogue, reported at exit with LLMC_EMU_CUBLASLT_COUNTS=1 (cublasGemmStridedBatchedEx's
// as DEFAULT). Counted when the product runs, in its stream's order.
struct EpilogueCounts {
    std::vector<std::pair<int, uint64_t>> counts;  // (epilogue, products), in first-seen order
    void add(cublasLtEpilogue_t e) {
        for (auto& [epilogue, n] : counts)
            if (epilogue == int(e)) {
                n++;
                return;
            }
        counts.emplace_back(int(e), 1);
    }
    ~EpilogueCounts() {
        const char* v = std::getenv("LLMC_EMU_CUBLASLT_COUNTS");
        if (!v || std::strcmp(v, "1") != 0) return;
        std::fprintf(stderr, "emulated cuBLASLt: products by epilogue:");
        for (const auto& [epilogue, n] : counts)
            std::fprintf(stderr, " %s=%llu", epilogue_name(epilogue), (unsigned long long)n);
        std::fprintf(stderr, "\n");
    }
};
EpilogueCounts& epilogue_counts() {
    static EpilogueCounts c;
    return c;
}

void run_gemm(const Gemm& g) {
    epilogue_counts().add(g.epilogue);
    if (g.m == 0 || g.n == 0) return;
    const bool na = g.ta == CUBLAS_OP_N, nb = g.tb == CUBLAS_OP_N;
    std::vector<float> abuf, bbuf, prod(size_t(g.m * g.n));
    for (int64_t bi = 0; bi < g.batch; bi++) {
        if (g.k > 0) {
            int64_t lda = 0, ldb = 0;
            const float* a = as_float(g.a, bi, na ? g.m : g.k, na ? g.k : g.m, abuf, lda);
            const float* b = as_float(g.b, bi, nb ? g.k : g.n, nb ? g.n : g.k, bbuf, ldb);
            cblas_sgemm(CblasColMajor, na ? CblasNoTrans : CblasTrans, nb ? CblasNoTrans : CblasTrans, int(g.m),
                        int(g.n), int(g.k), g.alpha, a, int(lda), b, int(ldb), 0.0f, prod.data(), int(g.m));
        } else {
            std::fill(prod.begin(), prod.end(), 0.0f);
        }
        void* d = const_cast<void*>(g.d.p);
        const int64_t c_base = bi * g.c.stride, d_base = bi * g.d.stride, aux_base = bi * g.aux_stride;
        for (int64_t j = 0; j < g.n; j++) {
            for (int64_t i = 0; i < g.m; i++) {
                float v = prod[size_t(i + j * g.m)];
                // beta == 0: C is not read (it may hold anything), as in cuBLAS.
                if (g.beta != 0.0f) v += g.beta * load(g.c.p, g.c.t, c_base + i + j * g.c.ld);
                if (has_bias(g.epilogue)) v += load(g.bias, g.d.t, i);
                const int64_t ai = aux_base + i + j * g.aux_ld;
                if (g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                    store(g.aux, g.d.t, ai, v);
                    v = gelu(v);
                } else if (g.epilogue == CUBLASLT_EPILOGUE_DGELU) {
                    v *= gelu_grad(load(g.aux, g.d.t, ai));
                }
                store(d, g.d.t, d_base + i + j * g.d.ld, v);
            }
        }
    }
    if (has_bias_grad(g.epilogue)) {
        const bool from_a = g.epilogue == CUBLASLT_EPILOGUE_BGRADA;
        void* out = const_cast<void*>(g.bias);
        for (int64_t x = 0; x < (from_a ? g.m : g.n); x++) {
            double sum = 0.0;
            for (int64_t p = 0; p < g.k; p++)
                sum += from_a ? op_element(g.a, g.ta, x, p) : op_element(g.b, g.tb, p, x);
            store(out, g.d.t, x, float(sum));
        }
    }
}

// Checks a cuBLASLt problem and states it as a Gemm (without alpha/beta/pointers). INVALID_VALUE for an
// inconsistent description, NOT_SUPPORTED for what cuBLASLt documents it cannot do.
cublasStatus_t lt_problem(const MatmulDesc* op, const Layout* a, const Layout* b, const Layout* c, const Layout* d,
                          Gemm& g) {
    if (!op || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
    if (!fp32_compute(op->compute) || op->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const Layout* l : {a, b, c, d}) {
        if (!supported_type(l->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (l->ld < std::max<int64_t>(1, l->rows) || l->batch < 1) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool na = op->transa == CUBLAS_OP_N, nb = op->transb == CUBLAS_OP_N;
    g.ta = op->transa;
    g.tb = op->transb;
    g.m = d->rows;
    g.n = d->cols;
    g.k = na ? a->cols : a->rows;
    if ((na ? a->rows : a->cols) != g.m || (nb ? b->rows : b->cols) != g.k || (nb ? b->cols : b->rows) != g.n ||
        c->rows != g.m || c->cols != g.n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch) return CUBLAS_STATUS_INVALID_VALUE;
    g.batch = d->batch;
    g.a = {nullptr, a->type, a->ld, a->stride};
    g.b = {nullptr, b->type, b->ld, b->stride};
    g.c = {nullptr, c->type, c->ld, c->stride};
    g.d = {nullptr, d->type, d->ld, d->stride};
    g.epilogue = op->epilogue;
    switch (op->epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU_AUX:
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: case CUBLASLT_EPILOGUE_DGELU: case CUBLASLT_EPILOGUE_BGRADA:
        case CUBLASLT_EPILOGUE_BGRADB: break;
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (has_bias_grad(op->epilogue) && g.batch > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (has_bias(op->epilogue) || has_bias_grad(op->epilogue)) {
        if (!op->bias) return CUBLAS_STATUS_INVALID_VALUE;
        if (!aligned16(op->bias)) return CUBLAS_STATUS_NOT_SUPPORTED;
        g.bias = op->bias;
    }
    if (has_aux(op->epilogue)) {
        if (!op->aux || op->aux_ld < std::max<int64_t>(1, g.m)) return CUBLAS_STATUS_INVALID_VALUE;
        if (!aligned16(op->aux) || op->aux_ld % 8 != 0 || (g.batch > 1 && op->aux_stride % 8 != 0))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        g.aux = op->aux;
        g.aux_ld = op->aux_ld;
        g.aux_stride = op->aux_stride;
    }
    return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
cublasStatus_t set_value(T& field, const void* buf, size_t size) {
    if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

const char* status_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "<unknown cublasStatus_t>";
}

}  // namespace

// ---- cuBLASLt ----

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return status_name(status); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    MatmulDesc* d = new MatmulDesc;
    d->compute = computeType;
    d->scale = scaleType;
    *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete get(desc);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
    MatmulDesc* d = get(desc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
        case CUBLASLT_MATMUL_DESC_TRANSB: {
            cublasOperation_t op{};
            if ((st = set_value(op, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return st;
            if (!valid_op(op)) return CUBLAS_STATUS_INVALID_VALUE;
            (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = op;
            return st;
        }
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(d->epilogue, buf, sizeInBytes);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_value(d->bias, buf, sizeInBytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_value(d->aux, buf, sizeInBytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_value(d->aux_ld, buf, sizeInBytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return set_value(d->aux_stride, buf, sizeInBytes);
        default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!layout || rows > uint64_t(INT32_MAX) || cols > uint64_t(INT32_MAX)) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, int64_t(rows), int64_t(cols), ld});
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete get(layout);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
    Layout* l = get(layout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) return set_value(l->batch, buf, sizeInBytes);
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) return set_value(l->stride, buf, sizeInBytes);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete get(pref);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
    Preference* p = get(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_value(p->max_workspace, buf, sizeInBytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(p->min_align[0], buf, sizeInBytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(p->min_align[1], buf, sizeInBytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(p->min_align[2], buf, sizeInBytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(p->min_align[3], buf, sizeInBytes);
        default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!preference || requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    Gemm g{};
    const cublasStatus_t st = lt_problem(get(operationDesc), get(Adesc), get(Bdesc), get(Cdesc), get(Ddesc), g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (env_flag("LLMC_EMU_CUBLASLT_NO_ALGO") ||
        (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT && env_flag("LLMC_EMU_CUBLASLT_NO_EPILOGUE")))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    // Up to three candidates (numbered in algo.data[0]; every one computes the same products here), so that
    // callers choosing among several (matmul.cuh's LLMC_MATMUL_TUNE) run that code.
    const int count = std::min(requestedAlgoCount, 3);
    for (int i = 0; i < count; i++) {
        heuristicResultsArray[i] = cublasLtMatmulHeuristicResult_t{};
        heuristicResultsArray[i].algo.data[0] = uint64_t(i);
        heuristicResultsArray[i].state = CUBLAS_STATUS_SUCCESS;
        heuristicResultsArray[i].wavesCount = 1.0f;
    }
    *returnAlgoCount = count;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* /*algo*/, void* /*workspace*/,
                              size_t /*workspaceSizeInBytes*/, cudaStream_t stream) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    Gemm g{};
    const cublasStatus_t st = lt_problem(get(computeDesc), get(Adesc), get(Bdesc), get(Cdesc), get(Ddesc), g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    g.alpha = *static_cast<const float*>(alpha);
    g.beta = *static_cast<const float*>(beta);
    if (g.m > 0 && g.n > 0 && (!D || (g.k > 0 && (!A || !B)) || (g.beta != 0.0f && !C)))
        return CUBLAS_STATUS_INVALID_VALUE;
    // In place (C == D) needs one layout for both, as in cuBLASLt.
    if (C == D && (g.c.t != g.d.t || g.c.ld != g.d.ld || g.c.stride != g.d.stride)) return CUBLAS_STATUS_INVALID_VALUE;
    g.a.p = A;
    g.b.p = B;
    g.c.p = C;
    g.d.p = D;
    emu::submit(stream, [g] { run_gemm(g); });
    return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLAS ----

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!workspace && workspaceSizeInBytes > 0) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;  // the CPU products need no workspace
}
const char* cublasGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return status_name(status); }

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t /*algo*/) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool na = transa == CUBLAS_OP_N, nb = transb == CUBLAS_OP_N;
    if (lda < std::max(1, na ? m : k) || ldb < std::max(1, nb ? k : n) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!fp32_compute(computeType) || !supported_type(Atype) || Atype != Btype || !supported_type(Ctype))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
    if (!C || (k > 0 && (!A || !B))) return CUBLAS_STATUS_INVALID_VALUE;
    Gemm g{};
    g.ta = transa;
    g.tb = transb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.batch = batchCount;
    g.alpha = *static_cast<const float*>(alpha);
    g.beta = *static_cast<const float*>(beta);
    g.a = {A, Atype, lda, strideA};
    g.b = {B, Btype, ldb, strideB};
    g.c = {C, Ctype, ldc, strideC};
    g.d = g.c;
    emu::submit(handle->stream, [g] { run_gemm(g); });
    return CUBLAS_STATUS_SUCCESS;
}
