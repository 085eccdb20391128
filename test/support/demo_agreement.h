// Agreement checkers between the canonical computation (the kernels and test/support/demo_host_reference.h) and the
// CPU DemoOptimizer, which sums in other orders: the tests and the GPU checkers use them.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llmc/optim/demo/plan_tables.h"
#include "test/support/demo_host_reference.h"

namespace demo::cm {

// ---- agreement with the CPU DemoOptimizer (tests and GPU checkers) -------------------------------------
// The canonical computation and the CPU optimizer sum in different orders, so they agree to float rounding:
//  - the selected index SETS are equal except in chunks where the k-th and (k+1)-th largest |E| are within
//    rounding of each other (near ties, checked with an fp64 recomputation of E);
//  - values agree to a small tolerance relative to the chunk's largest |E| (bf16 may differ by one bf16 ulp
//    where the fp32 value sits on a rounding boundary; sign bits are equal);
//  - momentum agrees to a tolerance relative to the chunk's largest momentum (chunks with other sets excluded);
//  - after apply, parameters are bit-equal except where the decoded update is within rounding of 0 (its sign
//    differs), checked against an fp64 decode.
struct CompressAgreement {
    size_t chunks = 0, set_mismatch = 0, set_mismatch_not_tie = 0;
    size_t items = 0, bf16_ulp_diffs = 0, sign_bit_diffs = 0;
    double max_value_err = 0.0;     // |mine - cpu| / max |value| of the chunk
    double max_scale_err = 0.0;     // sign: relative
    double max_momentum_err = 0.0;  // |mine - cpu| / max |momentum input x| of the chunk, beyond what bf16 1-ulp
                                    // value differences explain
    bool header_equal = false, reencode_equal = false;

    bool ok(double value_tol, double momentum_tol) const {
        return header_equal && reencode_equal && set_mismatch_not_tie == 0 && sign_bit_diffs == 0 &&
               max_value_err <= value_tol && max_scale_err <= value_tol && max_momentum_err <= momentum_tol &&
               bf16_ulp_diffs <= items / 1000 + 2;
    }
    std::string describe() const {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%zu chunks: index sets differ in %zu (%zu not near ties); %zu items: max value err %.2e "
                      "(rel. to chunk max), bf16 1-ulp diffs %zu, sign-bit diffs %zu, max scale err %.2e; "
                      "max momentum err %.2e (rel. to chunk max); header %s, re-encode %s",
                      chunks, set_mismatch, set_mismatch_not_tie, items, max_value_err, bf16_ulp_diffs,
                      sign_bit_diffs, max_scale_err, max_momentum_err, header_equal ? "equal" : "DIFFERS",
                      reencode_equal ? "identical" : "DIFFERS");
        return buf;
    }
};

// E = C1 X C2^T of one chunk in fp64, X the momentum update of `delta_in` / `grads` (in double).
inline std::vector<double> encode_chunk_f64(const ChunkTensor& ct, uint64_t c, const float* delta_in,
                                            const float* grads, const CompressParams& cp) {
    const size_t n1 = ct.n1, n2 = ct.n2;
    const std::vector<double> c1 = dct_basis_f64(n1), c2 = dct_basis_f64(n2);
    const uint64_t origin = chunk_origin(ct, c);
    std::vector<double> x(n1 * n2), y(n1 * n2, 0.0), e(n1 * n2, 0.0);
    for (size_t b = 0; b < n1; b++)
        for (size_t n = 0; n < n2; n++) {
            const uint64_t g = origin + b * ct.cols + n;
            x[b * n2 + n] = double(cp.decay) * delta_in[g] + double(cp.grad_scale) * (double(grads[g]) * cp.clip);
        }
    for (size_t b = 0; b < n1; b++)
        for (size_t k = 0; k < n2; k++)
            for (size_t n = 0; n < n2; n++) y[b * n2 + k] += x[b * n2 + n] * c2[k * n2 + n];
    for (size_t j = 0; j < n1; j++)
        for (size_t b = 0; b < n1; b++)
            for (size_t k = 0; k < n2; k++) e[j * n2 + k] += c1[j * n1 + b] * y[b * n2 + k];
    return e;
}

// mine/cpu: buckets and momentum after compress from the same input momentum `delta_in` and gradient.
inline CompressAgreement compare_compress(const PlanTables& pt, std::span<const std::byte> mine,
                                          std::span<const std::byte> cpu, std::span<const float> momentum_mine,
                                          std::span<const float> momentum_cpu, std::span<const float> delta_in,
                                          std::span<const float> grads, const CompressParams& cp) {
    CompressAgreement a;
    a.chunks = pt.plan.total_chunks;
    a.header_equal = mine.size() >= kBucketHeaderBytes && cpu.size() >= kBucketHeaderBytes &&
                     std::memcmp(mine.data(), cpu.data(), kBucketHeaderBytes) == 0 &&
                     std::memcmp(mine.data(), pt.header.data(), kBucketHeaderBytes) == 0;
    Selection sm, sc;
    decode_bucket(pt.plan, pt.format, mine, sm, "canonical bucket");
    decode_bucket(pt.plan, pt.format, cpu, sc, "CPU bucket");
    std::vector<std::byte> again;
    encode_bucket(pt.plan, pt.format, sm, again);
    a.reencode_equal = again.size() == mine.size() && std::memcmp(again.data(), mine.data(), mine.size()) == 0;
    const bool bf16 = pt.format.values == llmc::DemoValueEncoding::bf16;
    const bool sign = pt.format.values == llmc::DemoValueEncoding::sign;
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const ChunkTensor& ct = pt.tensors[t];
        const TensorPlan& tp = pt.plan.tensors[t];
        for (uint64_t c = 0; c < tp.num_chunks; c++) {
            const size_t s0 = tp.select_offset + c * tp.k;
            bool same = true;
            for (size_t j = 0; j < tp.k; j++) same = same && sm.indices[s0 + j] == sc.indices[s0 + j];
            const uint64_t origin = chunk_origin(ct, c);
            if (!same) {
                a.set_mismatch++;
                // Near tie: every index in one set but not the other has |E| (fp64) within 1e-5 of the chunk
                // maximum from the k-th largest |E|.
                const std::vector<double> e = encode_chunk_f64(ct, c, delta_in.data(), grads.data(), cp);
                std::vector<double> mags(e.size());
                double emax = 0.0;
                for (size_t i = 0; i < e.size(); i++) emax = std::max(emax, mags[i] = std::fabs(e[i]));
                std::vector<double> sorted = mags;
                std::nth_element(sorted.begin(), sorted.begin() + long(tp.k - 1), sorted.end(), std::greater<>());
                const double kth = sorted[tp.k - 1];
                std::vector<uint32_t> im(sm.indices.begin() + long(s0), sm.indices.begin() + long(s0 + tp.k));
                std::vector<uint32_t> ic(sc.indices.begin() + long(s0), sc.indices.begin() + long(s0 + tp.k));
                std::vector<uint32_t> diff;
                std::set_symmetric_difference(im.begin(), im.end(), ic.begin(), ic.end(), std::back_inserter(diff));
                bool tie = true;
                for (uint32_t i : diff) tie = tie && std::fabs(mags[i] - kth) <= 1e-5 * emax + 1e-30;
                if (!tie) a.set_mismatch_not_tie++;
                continue;
            }
            double vmax = 0.0;
            for (size_t j = 0; j < tp.k; j++) vmax = std::max(vmax, std::fabs(double(sc.values[s0 + j])));
            // A bf16 value one ulp apart is subtracted from the momentum too: alpha * |dv| times the largest
            // entry of the 2-D basis (sqrt(2/n1) * sqrt(2/n2)) bounds what that moves any momentum element.
            double flip_allowance = 0.0;
            auto basis_peak = [](uint32_t n) { return n == 1 ? 1.0 : std::sqrt(2.0 / n); };
            const double basis_max = basis_peak(ct.n1) * basis_peak(ct.n2);
            for (size_t j = 0; j < tp.k; j++) {
                a.items++;
                const float vm = sm.values[s0 + j], vc = sc.values[s0 + j];
                if (sign) {
                    a.sign_bit_diffs += (vm < 0.0f) != (vc < 0.0f) ? 1 : 0;
                    continue;
                }
                const double err = std::fabs(double(vm) - vc) / (vmax > 0 ? vmax : 1.0);
                if (bf16 && vm != vc) {
                    // one bf16 ulp apart: a rounding boundary between two fp32 values within tolerance
                    const uint32_t bm = llmc::km::float_to_bits(vm) >> 16, bc = llmc::km::float_to_bits(vc) >> 16;
                    if (bm + 1 == bc || bc + 1 == bm) {
                        a.bf16_ulp_diffs++;
                        flip_allowance += double(cp.alpha) * std::fabs(double(vm) - vc) * basis_max;
                        continue;
                    }
                }
                a.max_value_err = std::max(a.max_value_err, err);
            }
            if (sign) {
                const double scm = sm.scales[tp.chunk_offset + c], scc = sc.scales[tp.chunk_offset + c];
                a.max_scale_err = std::max(a.max_scale_err, std::fabs(scm - scc) / (std::fabs(scc) > 0 ? std::fabs(scc) : 1.0));
            }
            // momentum of the chunk, relative to the largest |x| (momentum before feedback, fp64)
            double xmax = 0.0, err = 0.0;
            for (uint32_t b = 0; b < ct.n1; b++)
                for (uint32_t n = 0; n < ct.n2; n++) {
                    const uint64_t g = origin + uint64_t(b) * ct.cols + n;
                    const double x = double(cp.decay) * delta_in[g] + double(cp.grad_scale) * (double(grads[g]) * cp.clip);
                    xmax = std::max(xmax, std::fabs(x));
                    err = std::max(err, std::fabs(double(momentum_mine[g]) - momentum_cpu[g]));
                }
            a.max_momentum_err = std::max(a.max_momentum_err, std::max(0.0, err - flip_allowance) / (xmax > 0 ? xmax : 1.0));
        }
    }
    return a;
}

struct ApplyAgreement {
    size_t elements = 0, differ = 0, differ_not_near_zero = 0;
    bool ok() const { return differ_not_near_zero == 0 && differ <= elements / 1000 + 2; }
    std::string describe() const {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%zu parameters: %zu differ (sign of a decoded value within rounding of 0: %zu; not: %zu)",
                      elements, differ, differ - differ_not_near_zero, differ_not_near_zero);
        return buf;
    }
};

// mine/cpu: master weights after apply of the same `world` buckets (back to back in `buckets`).
inline ApplyAgreement compare_apply(const PlanTables& pt, std::span<const std::byte> buckets, int world,
                                    std::span<const float> mine, std::span<const float> cpu) {
    ApplyAgreement a;
    a.elements = pt.plan.num_params;
    std::vector<Selection> sel(static_cast<size_t>(world));
    for (int r = 0; r < world; r++)
        decode_bucket(pt.plan, pt.format, buckets.subspan(size_t(r) * pt.bucket_bytes, pt.bucket_bytes), sel[size_t(r)],
                      "bucket " + std::to_string(r));
    for (size_t t = 0; t < pt.tensors.size(); t++) {
        const ChunkTensor& ct = pt.tensors[t];
        const TensorPlan& tp = pt.plan.tensors[t];
        for (uint64_t c = 0; c < tp.num_chunks; c++) {
            const uint64_t origin = chunk_origin(ct, c);
            std::vector<uint64_t> bad;
            for (uint32_t b = 0; b < ct.n1; b++)
                for (uint32_t n = 0; n < ct.n2; n++) {
                    const uint64_t g = origin + uint64_t(b) * ct.cols + n;
                    if (llmc::km::float_to_bits(mine[g]) != llmc::km::float_to_bits(cpu[g])) bad.push_back(uint64_t(b) * ct.n2 + n);
                }
            if (bad.empty()) continue;
            a.differ += bad.size();
            // fp64 decode of the scatter-mean of this chunk
            const size_t n1 = ct.n1, n2 = ct.n2, ne = n1 * n2;
            std::vector<double> sum(ne, 0.0), g(ne, 0.0), y(ne, 0.0), x(ne, 0.0);
            std::vector<int> cnt(ne, 0);
            for (int r = 0; r < world; r++)
                for (size_t j = 0; j < tp.k; j++) {
                    const size_t s = tp.select_offset + c * tp.k + j;
                    sum[sel[size_t(r)].indices[s]] += sel[size_t(r)].values[s];
                    cnt[sel[size_t(r)].indices[s]]++;
                }
            for (size_t i = 0; i < ne; i++) g[i] = cnt[i] ? sum[i] / cnt[i] : 0.0;
            const std::vector<double> c1 = dct_basis_f64(n1), c2 = dct_basis_f64(n2);
            for (size_t b = 0; b < n1; b++)
                for (size_t n = 0; n < n2; n++)
                    for (size_t d = 0; d < n2; d++) y[b * n2 + n] += g[b * n2 + d] * c2[d * n2 + n];
            double xmax = 0.0;
            for (size_t m = 0; m < n1; m++)
                for (size_t n = 0; n < n2; n++) {
                    for (size_t b = 0; b < n1; b++) x[m * n2 + n] += c1[b * n1 + m] * y[b * n2 + n];
                    xmax = std::max(xmax, std::fabs(x[m * n2 + n]));
                }
            for (uint64_t i : bad)
                if (!(std::fabs(x[i]) <= 1e-5 * xmax)) a.differ_not_near_zero++;
        }
    }
    return a;
}

}  // namespace demo::cm
