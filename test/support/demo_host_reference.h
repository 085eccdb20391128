// The sequential host reference of the DeMo kernels: the canonical computation of chunk_math.h one chunk at a
// time (compress and apply), which the tests and the GPU checkers compare the kernels' buckets, momentum and
// weights with, and demo_config(), how they write their cases. With PlanTables::identity (--optimizer topk) the
// chunk has no transform: the top-k is of the momentum itself and the decode puts the values at their indices.
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

namespace demo::cm {

// A DeMo OptimizerConfig with the given wire and momentum options, weight decay 0.1 and clipping at 1: how the
// tests and GPU checkers write their cases.
inline llmc::OptimizerConfig demo_config(llmc::DemoValueEncoding values, llmc::DemoIndexEncoding indices,
                                         llmc::DemoMomentum momentum = llmc::DemoMomentum::lr_scaled,
                                         float alpha = 1.0f, int topk = 32, int chunk = 64, float weight_decay = 0.1f) {
    llmc::OptimizerConfig c;
    c.weight_decay = weight_decay;
    c.grad_clip = 1.0f;
    c.demo.values = values;
    c.demo.indices = indices;
    c.demo.momentum = momentum;
    c.demo.feedback_alpha = alpha;
    c.demo.topk = topk;
    c.demo.chunk = chunk;
    return c;
}

// ---- host reference: the canonical computation, one chunk at a time ------------------------------------
// Per-thread scratch, laid out as the kernels' shared memory is (same leading dimensions).
struct ChunkScratch {
    std::vector<float> x, fx, z, fz, e, t, as, dec, vals;
    std::vector<uint32_t> keys, idx;
    std::vector<int> seg_start, seg_row;
    std::vector<float> sum;
    std::vector<uint32_t> cnt;
};

// The jobs run as plain loops (any tiling gives the same values: every element's fmaf chain is the same).
inline void run_job_host(const MatmulJob& jb) {
    for (int j = 0; j < jb.J; j++)
        for (int c = 0; c < jb.C; c++) {
            float acc[1][1] = {{0.0f}};
            const int cofs[1] = {c * jb.ics};
            mm_tile<1, 1>(jb.A + j, jb.lda, jb.In, jb.irs, cofs, jb.K, acc);
            jb.out[j * jb.ors + c * jb.ocs] = acc[0][0];
        }
}

// Step 9 on an ascending list: dec (n1 x lde) = C1^T S C2.
inline void decode_list_host(const ChunkDims& d, const float* c1, const float* c2, const uint32_t* idx,
                             const float* val, int count, float* dec, ChunkScratch& s) {
    s.seg_start.clear();
    s.seg_row.clear();
    for (int e = 0; e < count; e++) {
        const int row = static_cast<int>(idx[e] / static_cast<uint32_t>(d.n2));
        if (e == 0 || row != s.seg_row.back()) {
            s.seg_start.push_back(e);
            s.seg_row.push_back(row);
        }
    }
    const int R = static_cast<int>(s.seg_row.size());
    s.seg_start.push_back(count);
    s.t.assign(size_t(std::max(R, 1)) * d.ldt, 0.0f);
    s.as.assign(size_t(std::max(R, 1)) * d.ldas, 0.0f);
    for (int r = 0; r < R; r++) {
        for (int n = 0; n < d.n2; n++)
            s.t[size_t(r) * d.ldt + n] = decode_row_value(idx, val, s.seg_start[r], s.seg_start[r + 1], c2, d.n2, n);
        for (int m = 0; m < d.n1; m++) s.as[size_t(r) * d.ldas + m] = c1[size_t(s.seg_row[r]) * d.n1 + m];
    }
    run_job_host(decode_job(d, s.as.data(), s.t.data(), R, dec));
}

// Step 9 into s.dec (n1 x lde): the inverse DCT of the list, or with no transform (pt.identity) the list's values
// at their indices and zeros elsewhere.
inline void decode_host(const PlanTables& pt, const ChunkTensor& ct, const ChunkDims& d, const uint32_t* idx,
                        const float* val, int count, ChunkScratch& s) {
    s.dec.assign(size_t(d.n1) * d.lde, 0.0f);
    if (pt.identity) {
        for (int e = 0; e < count; e++) s.dec[size_t(idx[e] / ct.n2) * d.lde + idx[e] % ct.n2] = val[e];
        return;
    }
    decode_list_host(d, pt.bases.natural.data() + ct.nat1, pt.bases.natural.data() + ct.nat2, idx, val, count,
                     s.dec.data(), s);
}

// Steps 1-10 for chunk c of tensor `ct`: updates delta (the whole flat momentum buffer) and writes the items
// into `bucket` (the whole bucket; bit-packed parts must start zeroed).
inline void compress_chunk_host(const PlanTables& pt, const ChunkTensor& ct, uint64_t c, float* delta,
                                const float* grads, const CompressParams& cp, uint8_t* bucket, ChunkScratch& s) {
    const ChunkDims d = make_dims(static_cast<int>(ct.n1), static_cast<int>(ct.n2));
    const uint64_t origin = chunk_origin(ct, c);
    const float* fold1 = pt.bases.folded.data() + ct.fold1;
    const float* fold2 = pt.bases.folded.data() + ct.fold2;
    // 1-2: momentum, fold rows
    s.x.assign(size_t(d.elems), 0.0f);
    for (int b = 0; b < d.n1; b++)
        for (int n = 0; n < d.n2; n++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + n;
            s.x[size_t(b) * d.n2 + n] = momentum_update(delta[g], grads[g], cp.clip, cp.decay, cp.grad_scale);
        }
    if (pt.identity) {  // no transform: the coefficients are the momentum
        s.e.assign(size_t(d.n1) * d.lde, 0.0f);
        for (int b = 0; b < d.n1; b++)
            for (int n = 0; n < d.n2; n++) s.e[size_t(b) * d.lde + n] = s.x[size_t(b) * d.n2 + n];
    } else {
        s.fx.assign(size_t(d.n1) * d.ldx, 0.0f);
        for (int n = 0; n < d.n2; n++) {
            for (int r = 0; r < d.he1; r++) s.fx[size_t(r) * d.ldx + n] = fold_even(s.x.data() + n, d.n2, d.n1, r);
            for (int r = 0; r < d.ho1; r++)
                s.fx[size_t(d.he1 + r) * d.ldx + n] = fold_odd(s.x.data() + n, d.n2, d.n1, r);
        }
        // 3: pass 1
        s.z.assign(size_t(d.n1) * d.ldz, 0.0f);
        for (int p = 0; p < 2; p++) run_job_host(pass1_job(d, fold1, s.fx.data(), s.z.data(), p));
        // 4: fold columns
        s.fz.assign(size_t(d.n1) * d.ldf, 0.0f);
        for (int j = 0; j < d.n1; j++) {
            const float* zr = s.z.data() + size_t(j) * d.ldz;
            for (int r = 0; r < d.he2; r++) s.fz[size_t(j) * d.ldf + r] = fold_even(zr, 1, d.n2, r);
            for (int r = 0; r < d.ho2; r++) s.fz[size_t(j) * d.ldf + d.he2 + r] = fold_odd(zr, 1, d.n2, r);
        }
        // 5: pass 2
        s.e.assign(size_t(d.n1) * d.lde, 0.0f);
        for (int p = 0; p < 2; p++) run_job_host(pass2_job(d, fold2, s.fz.data(), s.e.data(), p));
    }
    // 6: top-k
    const uint32_t n = static_cast<uint32_t>(d.elems), k = ct.k;
    s.keys.resize(n);
    uint32_t max_key = 0;
    for (uint32_t i = 0; i < n; i++) {
        s.keys[i] = magnitude_key(s.e[size_t(i / ct.n2) * d.lde + i % ct.n2]);
        max_key = std::max(max_key, s.keys[i]);
    }
    TopkSearch search = topk_search_init(max_key, n);
    while (topk_search_active(search, k)) {
        const uint32_t mid = topk_search_mid(search);
        uint32_t count = 0;
        for (uint32_t i = 0; i < n; i++) count += s.keys[i] >= mid ? 1u : 0u;
        topk_search_update(search, mid, count, k);
    }
    const TopkRule rule = topk_rule(search, k);
    s.idx.assign(k, 0);
    s.vals.assign(k, 0.0f);
    uint32_t greater_before = 0, ties_before = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t key = s.keys[i];
        int pos = -1;
        if (topk_greater(rule, key)) {
            pos = static_cast<int>(greater_before + std::min(ties_before, rule.need));
            greater_before++;
        } else if (topk_tie(rule, key)) {
            if (ties_before < rule.need) pos = static_cast<int>(greater_before + ties_before);
            ties_before++;
        }
        if (pos >= 0) {
            s.idx[size_t(pos)] = i;
            s.vals[size_t(pos)] = s.e[size_t(i / ct.n2) * d.lde + i % ct.n2];
        }
    }
    // 7: quantize
    const float scale = cp.values == kValuesSign ? sign_scale(s.vals.data(), static_cast<int>(k)) : 0.0f;
    for (uint32_t j = 0; j < k; j++) s.vals[j] = dequantize(cp.values, s.vals[j], scale);
    // 8: pack
    const PlainOrWord or_word;
    uint8_t* values = bucket + ct.values_off;
    uint8_t* indices = bucket + ct.indices_off;
    if (cp.values == kValuesSign) store_u32(bucket + ct.scales_off + 4 * c, llmc::km::float_to_bits(scale));
    for (uint32_t j = 0; j < k; j++) {
        const uint64_t item = c * k + j;
        if (cp.values == kValuesSign) put_sign_bit(values, item, s.vals[j], or_word);
        else put_value(values, cp.values, item, s.vals[j]);
        put_index(indices, cp.indices, static_cast<int>(ct.index_bytes), item, s.idx[j], or_word);
    }
    // 9-10: decode what was sent, error feedback
    decode_host(pt, ct, d, s.idx.data(), s.vals.data(), static_cast<int>(k), s);
    for (int b = 0; b < d.n1; b++)
        for (int nn = 0; nn < d.n2; nn++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + nn;
            delta[g] = feedback(s.x[size_t(b) * d.n2 + nn], s.dec[size_t(b) * d.lde + nn], cp.alpha);
        }
}

// Apply for chunk c of tensor `ct` on the fp32 master weights; `buckets` holds ap.world buckets of
// ap.bucket_bytes back to back. Returns kErr* flags (0: fine).
inline uint32_t apply_chunk_host(const PlanTables& pt, const ChunkTensor& ct, uint64_t c, const uint8_t* buckets,
                                 float* master, const ApplyParams& ap, ChunkScratch& s) {
    const ChunkDims d = make_dims(static_cast<int>(ct.n1), static_cast<int>(ct.n2));
    const uint32_t n = static_cast<uint32_t>(d.elems), k = ct.k;
    s.sum.assign(n, 0.0f);
    s.cnt.assign(n, 0);
    uint32_t err = 0;
    for (int r = 0; r < ap.world; r++) {  // rank order: a fixed summation order
        const uint8_t* b = buckets + uint64_t(r) * ap.bucket_bytes;
        const float scale =
            ap.values == kValuesSign ? llmc::km::bits_to_float(load_u32(b + ct.scales_off + 4 * c)) : 0.0f;
        uint32_t prev = 0;
        for (uint32_t j = 0; j < k; j++) {
            const uint64_t item = c * k + j;
            const uint32_t i = get_index(b + ct.indices_off, ap.indices, static_cast<int>(ct.index_bytes), item);
            const float v = get_value(b + ct.values_off, ap.values, item, scale);
            const uint32_t before = prev;  // the previous item's index as sent
            prev = i;
            if (i >= n) {
                err |= kErrIndexRange;
                continue;
            }
            if (j > 0 && i <= before) {  // duplicates would make the sum depend on the thread schedule
                err |= kErrNotAscending;
                continue;
            }
            s.sum[i] = s.cnt[i] == 0 ? v : add_rn(s.sum[i], v);
            s.cnt[i]++;
        }
    }
    s.idx.clear();
    s.vals.clear();
    for (uint32_t i = 0; i < n; i++)
        if (s.cnt[i]) {
            s.idx.push_back(i);
            s.vals.push_back(div_rn(s.sum[i], static_cast<float>(s.cnt[i])));
        }
    decode_host(pt, ct, d, s.idx.data(), s.vals.data(), static_cast<int>(s.idx.size()), s);
    const uint64_t origin = chunk_origin(ct, c);
    for (int b = 0; b < d.n1; b++)
        for (int nn = 0; nn < d.n2; nn++) {
            const uint64_t g = origin + uint64_t(b) * ct.cols + nn;
            master[g] = sign_update(master[g], s.dec[size_t(b) * d.lde + nn], ap.lr, ap.wd_factor,
                                    ap.apply_wd && ct.decays, ap.decay_after, ap.use_sign);
        }
    return err;
}

// Whole-plan drivers (chunks in parallel; each chunk's result does not depend on the thread count).
inline void compress_plan_host(const PlanTables& pt, float* delta, const float* grads, const CompressParams& cp,
                               std::vector<std::byte>& bucket) {
    bucket.assign(pt.bucket_bytes, std::byte{0});
    std::memcpy(bucket.data(), pt.header.data(), kBucketHeaderBytes);
    uint8_t* b = reinterpret_cast<uint8_t*>(bucket.data());
    // Chunks OR bits into words shared with their neighbours: a thread takes runs of 32 chunks of one tensor
    // (32 * k sign bits and 32 * 12 * k index bits are whole words), so two threads never share a word.
    std::vector<std::pair<size_t, uint64_t>> runs;
    for (size_t t = 0; t < pt.tensors.size(); t++)
        for (uint64_t c = 0; c < pt.plan.tensors[t].num_chunks; c += 32) runs.emplace_back(t, c);
#pragma omp parallel
    {
        ChunkScratch s;
#pragma omp for schedule(dynamic, 1)
        for (size_t r = 0; r < runs.size(); r++) {
            const ChunkTensor& ct = pt.tensors[runs[r].first];
            const uint64_t end = std::min<uint64_t>(pt.plan.tensors[runs[r].first].num_chunks, runs[r].second + 32);
            for (uint64_t c = runs[r].second; c < end; c++) compress_chunk_host(pt, ct, c, delta, grads, cp, b, s);
        }
    }
}

inline uint32_t apply_plan_host(const PlanTables& pt, const std::byte* buckets, float* master, const ApplyParams& ap) {
    const int64_t total = static_cast<int64_t>(pt.plan.total_chunks);
    const int ntensors = static_cast<int>(pt.tensors.size());
    uint32_t err = 0;
#pragma omp parallel reduction(| : err)
    {
        ChunkScratch s;
#pragma omp for schedule(dynamic, 8)
        for (int64_t g = 0; g < total; g++) {
            const ChunkTensor& ct = pt.tensors[size_t(tensor_of_chunk(pt.tensors.data(), ntensors, uint64_t(g)))];
            err |= apply_chunk_host(pt, ct, uint64_t(g) - ct.chunk_offset, reinterpret_cast<const uint8_t*>(buckets),
                                    master, ap, s);
        }
    }
    return err;
}

}  // namespace demo::cm
