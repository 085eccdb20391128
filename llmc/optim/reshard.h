// Elastic resume: the rule that deals a checkpoint's per-rank optimizer state (DeMo's momenta) written by N ranks out
// to M ranks, shared by the optimizer rooms that support it (OptimizerFamily::reshard_state) and the tests. The rule
// keeps the mean over ranks, which is what DeMo's step averages across ranks (the all-gathered buckets), and makes
// N -> 2N -> N a bit-exact round trip.
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace llmc {

// Which old ranks new rank j of M builds its state from, and how:
//  - M a multiple of N ("copy"): old rank j mod N, copied (each old rank's state goes to M/N new ranks);
//  - N a multiple of M ("mean of N/M"): the mean of old ranks j, j+M, j+2M, ... (N/M of them);
//  - otherwise ("mean of all"): the mean of all N old ranks, on every new rank.
// In real arithmetic each keeps the average over ranks exactly. M == N is "copy" of rank j (a plain resume).
struct ReshardRule {
    std::vector<int> sources;
    std::string name;  // for the "resumed from" line: "copy", "mean of 2", "mean of all 3"
};
inline ReshardRule reshard_rule(int old_world, int new_rank, int new_world) {
    ReshardRule rule;
    if (new_world % old_world == 0) {
        rule.sources = {new_rank % old_world};
        rule.name = "copy of old rank j mod " + std::to_string(old_world);
    } else if (old_world % new_world == 0) {
        for (int r = new_rank; r < old_world; r += new_world) rule.sources.push_back(r);
        rule.name = "mean of old ranks j, j+" + std::to_string(new_world) + ", ... (" +
                    std::to_string(old_world / new_world) + " each)";
    } else {
        for (int r = 0; r < old_world; r++) rule.sources.push_back(r);
        rule.name = "mean of all " + std::to_string(old_world) + " old ranks";
    }
    return rule;
}

// out[i] = the mean of ins[*][i], summed in double in rank order and divided there, then rounded once to fp32: a
// single source is copied bit for bit, and equal sources (a 2N -> N after an N -> 2N) give that value back exactly.
inline void mean_of(std::span<float> out, const std::vector<std::span<const float>>& ins) {
    const double n = static_cast<double>(ins.size());
    for (size_t i = 0; i < out.size(); i++) {
        double s = 0.0;
        for (const std::span<const float>& in : ins) s += in[i];
        out[i] = static_cast<float>(s / n);
    }
}

}  // namespace llmc
