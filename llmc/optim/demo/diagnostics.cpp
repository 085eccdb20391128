// --demo_diagnostics (diagnostics.h): the conjectures' measurements on DeMo's state. Every sum runs over chunks in a
// fixed order (per-chunk results first, in parallel, then summed serially), so a line is deterministic for a given
// thread count and rank count.
#include "llmc/optim/demo/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "llmc/base/error.h"
#include "llmc/optim/demo/demo_optimizer.h"

namespace demo {

namespace {

// Flat offset of coefficient (b, d) of chunk c of tp.
inline size_t chunk_elem(const TensorPlan& tp, size_t c, size_t b, size_t d) {
    return tp.offset + ((c / tp.block_cols) * tp.n1 + b) * tp.cols + (c % tp.block_cols) * tp.n2 + d;
}

// |A & B| of two ascending index lists.
size_t intersection(const uint32_t* a, const uint32_t* b, size_t k) {
    size_t i = 0, j = 0, hits = 0;
    while (i < k && j < k) {
        if (a[i] == b[j]) { hits++; i++; j++; }
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return hits;
}

const char* basis_name(BasisKind k) {
    return k == BasisKind::dct ? "dct" : k == BasisKind::random ? "random" : "identity";
}

}  // namespace

std::string diagnostic_group(const llmc::ParamTensor& t) {
    if (t.shape.size() == 1) return "vectors";
    const std::string& n = t.name;
    const auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (has("wte") || has("wpe")) return "embeddings";
    if (has("attn") || has("att_")) return "attention";
    if (has("mlp") || has("ff_")) return "mlp";
    return "other";
}

std::vector<double> transmitted_agreement(const ModelPlan& plan, std::span<const size_t> group_of_tensor,
                                          size_t groups, std::span<const Selection> received, size_t world,
                                          std::vector<GroupSums>& sums) {
    const size_t pairs = world * (world - 1) / 2;
    std::vector<double> dot(groups * pairs, 0.0), sq(groups * world, 0.0), cos(groups, 0.0);
    if (pairs == 0) return cos;
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        const size_t g = group_of_tensor[t];
        for (size_t c = 0; c < tp.num_chunks; c++) {
            const size_t s = tp.select_offset + c * tp.k;
            for (size_t r = 0; r < world; r++)
                for (size_t q = 0; q < tp.k; q++) {
                    const double v = received[r].values[s + q];
                    sq[g * world + r] += v * v;
                }
            size_t p = 0;
            for (size_t a = 0; a < world; a++)
                for (size_t b = a + 1; b < world; b++, p++) {
                    const uint32_t *ia = received[a].indices.data() + s, *ib = received[b].indices.data() + s;
                    const float *va = received[a].values.data() + s, *vb = received[b].values.data() + s;
                    size_t i = 0, j = 0, hits = 0;
                    double d = 0.0;
                    while (i < tp.k && j < tp.k) {
                        if (ia[i] == ib[j]) { d += static_cast<double>(va[i]) * vb[j]; hits++; i++; j++; }
                        else if (ia[i] < ib[j]) i++;
                        else j++;
                    }
                    dot[g * pairs + p] += d;
                    sums[g].jaccard += static_cast<double>(hits) / static_cast<double>(2 * tp.k - hits);
                    sums[g].jaccard_n += 1.0;
                }
        }
    }
    for (size_t g = 0; g < groups; g++) {
        size_t p = 0;
        for (size_t a = 0; a < world; a++)
            for (size_t b = a + 1; b < world; b++, p++) {
                const double den = std::sqrt(sq[g * world + a] * sq[g * world + b]);
                cos[g] += den > 0.0 ? dot[g * pairs + p] / den : 0.0;
            }
        cos[g] /= static_cast<double>(pairs);
    }
    return cos;
}

DemoDiagnostics::DemoDiagnostics(int every, const ModelPlan& plan, const llmc::ParamLayout& layout, BasisKind sent)
    : every_(every), window_(std::min(8, every)), plan_(plan), sent_(sent) {
    LLMC_CHECK(every > 0, "internal: DemoDiagnostics needs N > 0");
    LLMC_CHECK(layout.tensors.size() == plan_.tensors.size(), "internal: diagnostics layout and plan differ");
    for (const llmc::ParamTensor& t : layout.tensors) {
        const std::string g = diagnostic_group(t);
        auto it = std::find(group_names_.begin(), group_names_.end(), g);
        if (it == group_names_.end()) it = group_names_.insert(group_names_.end(), g);
        group_of_tensor_.push_back(static_cast<size_t>(it - group_names_.begin()));
    }
    dct_.set_kind(BasisKind::dct);
    random_.set_kind(BasisKind::random);
    sent_bases_.set_kind(sent);
    for (const TensorPlan& tp : plan_.tensors)
        for (DctBases* b : {&dct_, &random_, &sent_bases_}) {
            b->ensure(tp.n1);
            b->ensure(tp.n2);
        }
}

bool DemoDiagnostics::in_window(int64_t step) const {
    const int64_t r = step % every_;
    return window_ >= 2 && (r == 0 || r >= every_ - window_ + 1);
}

void DemoDiagnostics::transform(const DctBases& bases, std::vector<float>& out) {
    out.resize(captured_.size());
    if (bases.kind() == BasisKind::identity) {
        std::copy(captured_.begin(), captured_.end(), out.begin());
        return;
    }
    for (const TensorPlan& tp : plan_.tensors)
        encode_blocks(captured_.data() + tp.offset, out.data() + tp.offset, tp.rows, tp.cols, tp.n1, tp.n2, bases,
                      scratch_);
}

void DemoDiagnostics::keep_selection(int64_t step, const Selection& sel) {
    if (!due(step + 1)) return;
    prev_indices_ = sel.indices;
    have_prev_ = true;
}

void DemoDiagnostics::observe(int64_t step) {
    if (!in_window(step)) return;
    const int64_t r = step % every_, first = (every_ - window_ + 1) % every_;
    if (r == first || sum_.empty()) {
        sum_.assign(captured_.size(), 0.0);
        sumsq_.assign(captured_.size(), 0.0);
        window_count_ = 0;
    }
    transform(sent_bases_, coeffs_);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < coeffs_.size(); i++) {
        const double x = coeffs_[i];
        sum_[i] += x;
        sumsq_[i] += x * x;
    }
    window_count_++;
}

std::string DemoDiagnostics::report(int64_t step, const Selection& sel, std::span<const Selection> received,
                                    size_t world, std::span<const float> residual, llmc::Transport& transport) {
    const size_t groups = group_names_.size();
    std::vector<GroupSums> sums(groups);

    // Energy compaction: per chunk, the top-k's share of its energy in each basis.
    const size_t chunks = plan_.total_chunks;
    std::vector<double> per_chunk(chunks * 6, 0.0);  // [chunk][basis]: top-k energy, total energy
    for (int b = 0; b < 3; b++) {
        const std::vector<float>* x = &captured_;
        if (b == 0) { transform(dct_, coeffs_); x = &coeffs_; }
        if (b == 2) { transform(random_, coeffs_); x = &coeffs_; }
        const float* data = x->data();
#pragma omp parallel
        {
            std::vector<float> chunk(plan_.max_chunk_elems);
            std::vector<uint32_t> idx(plan_.max_chunk_elems);
            TopkScratch scratch;
#pragma omp for schedule(dynamic, 8)
            for (size_t gc = 0; gc < chunks; gc++) {
                const TensorPlan& tp = plan_.tensors[plan_.tensor_of_chunk(gc)];
                const size_t c = gc - tp.chunk_offset;
                double total = 0.0;
                for (size_t i = 0; i < tp.n1; i++)
                    for (size_t j = 0; j < tp.n2; j++) {
                        const float v = data[chunk_elem(tp, c, i, j)];
                        chunk[i * tp.n2 + j] = v;
                        total += static_cast<double>(v) * v;
                    }
                select_topk(std::span<const float>(chunk.data(), tp.chunk_elems), tp.k, idx.data(), scratch);
                double top = 0.0;
                for (size_t q = 0; q < tp.k; q++) top += static_cast<double>(chunk[idx[q]]) * chunk[idx[q]];
                per_chunk[gc * 6 + b] = top;
                per_chunk[gc * 6 + 3 + b] = total;
            }
        }
    }
    for (size_t t = 0; t < plan_.tensors.size(); t++) {
        const TensorPlan& tp = plan_.tensors[t];
        GroupSums& s = sums[group_of_tensor_[t]];
        for (size_t c = 0; c < tp.num_chunks; c++) {
            const size_t gc = tp.chunk_offset + c;
            for (int b = 0; b < 3; b++) {
                s.energy_topk[b] += per_chunk[gc * 6 + b];
                s.energy_total[b] += per_chunk[gc * 6 + 3 + b];
            }
            const size_t sel_at = tp.select_offset + c * tp.k;
            if (have_prev_) {
                s.persist_hits +=
                    static_cast<double>(intersection(sel.indices.data() + sel_at, prev_indices_.data() + sel_at, tp.k));
                s.persist_total += static_cast<double>(tp.k);
            }
            // Temporal variance over the window, of the coefficients sent at S and of the rest.
            if (window_count_ >= 2) {
                const double w = window_count_;
                double var_all = 0.0, pow_all = 0.0, var_sent = 0.0, pow_sent = 0.0;
                for (size_t i = 0; i < tp.n1; i++)
                    for (size_t j = 0; j < tp.n2; j++) {
                        const size_t e = chunk_elem(tp, c, i, j);
                        const double m = sum_[e] / w, p = sumsq_[e] / w;
                        var_all += std::max(0.0, p - m * m);
                        pow_all += p;
                    }
                for (size_t q = 0; q < tp.k; q++) {
                    const uint32_t f = sel.indices[sel_at + q];
                    const size_t e = chunk_elem(tp, c, f / tp.n2, f % tp.n2);
                    const double m = sum_[e] / w, p = sumsq_[e] / w;
                    var_sent += std::max(0.0, p - m * m);
                    pow_sent += p;
                }
                s.tvar[0] += var_sent;
                s.tpow[0] += pow_sent;
                s.tvar[1] += var_all - var_sent;
                s.tpow[1] += pow_all - pow_sent;
            }
        }
        for (size_t i = tp.offset; i < tp.offset + tp.numel(); i++) {
            s.momentum_sq += static_cast<double>(captured_[i]) * captured_[i];
            s.residual_sq += static_cast<double>(residual[i]) * residual[i];
        }
    }
    have_prev_ = false;
    window_count_ = 0;
    sum_.clear();
    sumsq_.clear();
    const std::vector<double> cos_sent = transmitted_agreement(plan_, group_of_tensor_, groups, received, world, sums);

    // The residual's cosine with the ranks' mean residual: one all-reduce of the residual (in double, so a scalar
    // reduction, which the transport does not count as training traffic).
    std::vector<double> mean(residual.begin(), residual.end());
    transport.allreduce_sum(mean);
    std::vector<double> res_dot(groups, 0.0), mean_sq(groups, 0.0);
    for (size_t t = 0; t < plan_.tensors.size(); t++) {
        const TensorPlan& tp = plan_.tensors[t];
        const size_t g = group_of_tensor_[t];
        for (size_t i = tp.offset; i < tp.offset + tp.numel(); i++) {
            const double m = mean[i] / static_cast<double>(world);
            res_dot[g] += m * residual[i];
            mean_sq[g] += m * m;
        }
    }
    // This rank's sums and cosines, summed over the ranks: every measure is then the ranks' (energy-weighted) mean.
    constexpr size_t kFields = 13;
    std::vector<double> scalars(groups * kFields, 0.0);
    for (size_t g = 0; g < groups; g++) {
        const GroupSums& s = sums[g];
        double* v = scalars.data() + g * kFields;
        for (int b = 0; b < 3; b++) { v[b] = s.energy_topk[b]; v[3 + b] = s.energy_total[b]; }
        v[6] = s.persist_hits;
        v[7] = s.tvar[0]; v[8] = s.tpow[0]; v[9] = s.tvar[1]; v[10] = s.tpow[1];
        v[11] = s.momentum_sq;
        v[12] = s.residual_sq;
    }
    std::vector<double> cos_res(groups, 0.0);
    for (size_t g = 0; g < groups; g++) {
        const double den = std::sqrt(sums[g].residual_sq * mean_sq[g]);
        cos_res[g] = den > 0.0 ? res_dot[g] / den : 0.0;
    }
    scalars.insert(scalars.end(), cos_res.begin(), cos_res.end());
    transport.allreduce_sum(scalars);

    const auto ratio = [](double a, double b) { return b > 0.0 ? a / b : 0.0; };
    const double ranks = static_cast<double>(world);
    nlohmann::ordered_json line;
    line["type"] = "diagnostics";
    line["step"] = step;
    line["transform"] = basis_name(sent_);
    line["ranks"] = world;
    line["window"] = window_;
    nlohmann::ordered_json out_groups = nlohmann::ordered_json::object();
    for (size_t g = 0; g < groups; g++) {
        const double* v = scalars.data() + g * kFields;
        const GroupSums& s = sums[g];
        nlohmann::ordered_json j;
        j["energy_topk_dct"] = ratio(v[0], v[3]);
        j["energy_topk_raw"] = ratio(v[1], v[4]);
        j["energy_topk_random"] = ratio(v[2], v[5]);
        if (s.persist_total > 0.0) j["persistence"] = ratio(v[6], s.persist_total * ranks);
        if (s.tpow[0] + s.tpow[1] > 0.0 || v[8] + v[10] > 0.0) {
            j["tvar_sent"] = ratio(v[7], v[8]);
            j["tvar_residual"] = ratio(v[9], v[10]);
        }
        if (world > 1) {
            j["jaccard"] = ratio(s.jaccard, s.jaccard_n);
            j["cos_sent"] = cos_sent[g];
            j["cos_residual"] = scalars[groups * kFields + g] / ranks;
        }
        j["momentum_norm"] = std::sqrt(v[11] / ranks);
        j["residual_norm"] = std::sqrt(v[12] / ranks);
        j["residual_ratio"] = std::sqrt(ratio(v[12], v[11]));
        out_groups[group_names_[g]] = j;
    }
    line["groups"] = out_groups;
    return line.dump();
}

}  // namespace demo
