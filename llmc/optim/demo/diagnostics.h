// --demo_diagnostics N: measurements of the DeMo paper's three conjectures on the CPU optimizer's own state, every
// N steps, per group of tensors (embeddings, attention, mlp, vectors): energy compaction of the top-k in the DCT
// against the raw entries and a random orthogonal basis, the persistence and temporal variance of what is sent
// against what is kept, the agreement of the ranks' selections and momenta, and the size of the residual momentum
// that error feedback keeps. They read the state only (training is bit-identical with them on or off) and are
// written as one {"type":"diagnostics",...} line of metrics.jsonl; docs/conjectures.md defines every field.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmc/comm/transport.h"
#include "llmc/model/param_layout.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/dct.h"

namespace demo {

// The group a tensor's diagnostics are summed in, by name and shape: "vectors" (1-D: biases, norms), "embeddings"
// (wte/wpe), "attention" (attn/att_), "mlp" (mlp/ff_), else "other". The one definition of the groups.
std::string diagnostic_group(const llmc::ParamTensor& t);

// Per group, the sums a diagnostics line is made of (each ratio is a ratio of sums: energy-weighted over chunks).
struct GroupSums {
    double energy_total[3] = {0, 0, 0};     // per basis (dct, raw, random): sum of squares of all coefficients
    double energy_topk[3] = {0, 0, 0};      // ... of the k largest |coefficient| of each chunk
    double persist_hits = 0, persist_total = 0;  // chosen at S and S-1 | chosen at S
    double tvar[2] = {0, 0}, tpow[2] = {0, 0};   // sent, residual: sum of Var_t(x), sum of Mean_t(x^2)
    double jaccard = 0, jaccard_n = 0;           // sum over chunks and rank pairs of |A & B| / |A | B|, their count
    double momentum_sq = 0, residual_sq = 0;     // |momentum at compress|^2, |residual after error feedback|^2
};

// Agreement of the ranks' gathered selections, per group: adds each chunk's mean pairwise Jaccard to `sums` and
// returns, per group, the mean over rank pairs of the cosine of their transmitted (dequantized) vectors.
// received[0..world) are the ranks' decoded buckets. Needs no collective: every rank has every bucket.
std::vector<double> transmitted_agreement(const ModelPlan& plan, std::span<const size_t> group_of_tensor,
                                          size_t groups, std::span<const Selection> received, size_t world,
                                          std::vector<GroupSums>& sums);

class DemoDiagnostics {
public:
    // every: N of --demo_diagnostics (> 0); sent: the basis the run selects in.
    DemoDiagnostics(int every, const ModelPlan& plan, const llmc::ParamLayout& layout, BasisKind sent);

    int window() const { return window_; }  // W = min(8, N): steps S-W+1..S of the temporal variance
    bool due(int64_t step) const { return step % every_ == 0; }  // 1-based step numbers
    // Whether compress must copy the momentum before error feedback into capture() at this step.
    bool captures(int64_t step) const { return due(step) || due(step + 1) || in_window(step); }
    std::span<float> capture() { return captured_; }  // sized on first use
    void prepare_capture(size_t num_params) { captured_.resize(num_params); }

    // After compress at a captured step: in the window, accumulates the sent basis's coefficients.
    void observe(int64_t step);
    // Last at a captured step (after report): at the step before a due one, keeps `sel` (what this rank sent) for
    // the due step's persistence.
    void keep_selection(int64_t step, const Selection& sel);
    // At a due step, after the all-gather: every measure, reduced over the ranks (one allreduce_sum of the
    // residual momentum and one of the scalars, neither counted as training traffic), as the metrics line.
    std::string report(int64_t step, const Selection& sel, std::span<const Selection> received, size_t world,
                       std::span<const float> residual, llmc::Transport& transport);

private:
    bool in_window(int64_t step) const;
    // coefficients of captured_ in `bases` (identity: a copy), into out
    void transform(const DctBases& bases, std::vector<float>& out);

    int every_, window_;
    ModelPlan plan_;
    std::vector<size_t> group_of_tensor_;
    std::vector<std::string> group_names_;
    BasisKind sent_;
    DctBases dct_, random_, sent_bases_;
    std::vector<float> captured_, coeffs_;
    std::vector<uint32_t> prev_indices_;  // selection at S-1
    bool have_prev_ = false;
    std::vector<double> sum_, sumsq_;  // window accumulators per coefficient of the sent basis
    int window_count_ = 0;
    BlockScratch scratch_;
};

}  // namespace demo
