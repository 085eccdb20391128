// Shared optimizer helpers (see optimizer.h).
#include "llmc/optim/optimizer.h"

#include <cmath>
#include <vector>

namespace llmc {

namespace {
// An integer >= 1 or "auto" (kShardGroupAuto), which the JSON config also writes as "auto".
Key<OptimizerConfig> shard_group_size_key() {
    const auto parse = [](const std::string& text, const std::string& where) {
        return text == "auto" ? kShardGroupAuto
                              : static_cast<int>(schema::int_from_text(text, 1, INT32_MAX, where));
    };
    Key<OptimizerConfig> k{
        key_info("shard_group_size",
                 "ranks per node for the sharded step: the node averages gradients over its fast link and splits the "
                 "optimizer state, DeMo (FlexDeMo) or AdamW's all-reduce runs across nodes; 1: flat; auto: the ranks "
                 "that share a host; the world size with AdamW: ZeRO-1"),
        [parse](OptimizerConfig& c, const std::string& t, const std::string& w) { c.shard_group_size = parse(t, w); },
        [parse](OptimizerConfig& c, const schema::Json& v, const std::string& w) {
            c.shard_group_size = v.is_string() ? parse(v.get<std::string>(), w)
                                               : static_cast<int>(schema::int_from_json(v, 1, INT32_MAX, w));
        },
        [](const OptimizerConfig& c) {
            return c.shard_group_size == kShardGroupAuto ? schema::Json("auto") : schema::Json(c.shard_group_size);
        }};
    return std::move(k).fixed();
}
}  // namespace

std::vector<Key<OptimizerConfig>> optimizer_config_keys() {
    return {
        key("weight_decay", &OptimizerConfig::weight_decay, "decoupled weight decay"),
        key("decay_groups", &OptimizerConfig::decay_groups,
            "which tensors decay: 2d (matrices only) or all (the DeMo reference)",
            {{"2d", DecayGroups::matrices}, {"all", DecayGroups::all}}),
        key("grad_clip", &OptimizerConfig::grad_clip, "max gradient L2 norm (<= 0 disables)"),
        shard_group_size_key(),
    };
}

double grad_norm(std::span<const float> g) { return std::sqrt(sum_of_squares(g)); }

double sum_of_squares(std::span<const float> g) {
    // Fixed-size blocks summed in order: the result does not depend on the number of OpenMP threads.
    constexpr size_t kBlock = 1 << 16;
    const size_t nblocks = (g.size() + kBlock - 1) / kBlock;
    std::vector<double> partial(nblocks, 0.0);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblocks; b++) {
        const size_t end = std::min(g.size(), (b + 1) * kBlock);
        double s = 0.0;
        for (size_t i = b * kBlock; i < end; i++) s += static_cast<double>(g[i]) * g[i];
        partial[b] = s;
    }
    double sum = 0.0;
    for (double p : partial) sum += p;
    return sum;
}

float clip_scale(double norm, float max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    return max_norm > 0.0f && coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void clip_by_norm(std::span<float> g, double norm, float max_norm) {
    const float scale = clip_scale(norm, max_norm);
    if (scale == 1.0f) return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < g.size(); i++) g[i] *= scale;
}

double clip_grad_norm(std::span<float> g, float max_norm) {
    const double norm = grad_norm(g);
    clip_by_norm(g, norm, max_norm);
    return norm;
}

}  // namespace llmc
