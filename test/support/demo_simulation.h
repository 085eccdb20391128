// DeMo's data parallelism simulated in one process, the oracle that the real step() is checked against
// (test_demo_optimizer on one rank, test_mpi_optimizers under mpirun): W DemoOptimizer instances, each rank's
// bucket from compress() concatenated by hand as an all-gather would, and apply() on every rank.
#pragma once
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/optimizer.h"
#include "llmc/comm/transport.h"

namespace demo_simulation {

inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

struct SimResult {
    std::vector<std::vector<float>> params_per_step;                  // [step] -> params
    std::vector<std::vector<std::vector<float>>> momentum_per_step;  // [step][rank] -> momentum
    // --demo_delay 1 with eager updates: [step][rank] -> that rank's working weights after the step
    std::vector<std::vector<std::vector<float>>> working_per_step;
    bool ranks_agree = true;
    // --demo_delay 1: the last step's buckets (back to back) and their offsets, gathered and not yet applied
    std::vector<std::byte> pending;
    std::vector<size_t> pending_offsets;
};

// Runs `steps` steps of W simulated ranks (rank r gets grads[step][r], clipped locally to cfg.grad_clip); all
// ranks must end with identical parameters, which are returned with every rank's momentum. With
// cfg.demo.delay == 1 the ranks follow step()'s delayed order: step s first applies the buckets gathered at
// step s-1 (with lrs[s-1]), then compresses (weight decay on the parameters as they are then) with lrs[s]; the
// last round stays unapplied (SimResult::pending). With cfg.demo.eager as well, each rank's working weights
// after step s are the shared ones minus lrs[s] * sign(decode(its own bucket of step s)): apply() on a world
// of that one bucket (SimResult::working_per_step).
inline SimResult simulate(const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout, std::vector<float> params0,
                          const std::vector<std::vector<std::vector<float>>>& grads, const std::vector<float>& lrs) {
    const size_t world = grads.empty() ? 1 : grads[0].size();
    llmc::LocalTransport transport;  // compress() and apply() do not communicate
    std::vector<std::unique_ptr<demo::DemoOptimizer>> opts;
    std::vector<std::vector<float>> params(world, params0);
    for (size_t r = 0; r < world; r++) opts.push_back(std::make_unique<demo::DemoOptimizer>(cfg, layout, transport));
    const bool delayed = cfg.demo.delay == 1, eager = delayed && cfg.demo.eager;
    SimResult res;
    llmc::StepTimings tm;
    for (size_t s = 0; s < grads.size(); s++) {
        if (delayed && s > 0)
            for (size_t r = 0; r < world; r++) opts[r]->apply(res.pending, res.pending_offsets, params[r], lrs[s - 1], tm);
        std::vector<std::byte> all;
        std::vector<size_t> offsets{0};
        for (size_t r = 0; r < world; r++) {
            std::vector<float> g = grads[s][r];
            llmc::clip_grad_norm(g, cfg.grad_clip);
            std::vector<std::byte> bucket;
            opts[r]->compress(params[r], g, lrs[s], bucket, tm);
            all.insert(all.end(), bucket.begin(), bucket.end());
            offsets.push_back(all.size());
        }
        if (eager) {
            std::vector<std::vector<float>> working(params);
            for (size_t r = 0; r < world; r++) {
                const std::span<const std::byte> own(all.data() + offsets[r], offsets[r + 1] - offsets[r]);
                const size_t own_offsets[2] = {0, own.size()};
                opts[r]->apply(own, own_offsets, working[r], lrs[s], tm);
            }
            res.working_per_step.push_back(std::move(working));
        }
        if (delayed) {
            res.pending.swap(all);
            res.pending_offsets.swap(offsets);
        } else {
            for (size_t r = 0; r < world; r++) opts[r]->apply(all, offsets, params[r], lrs[s], tm);
        }
        for (size_t r = 1; r < world; r++) res.ranks_agree = res.ranks_agree && bit_equal(params[r], params[0]);
        res.params_per_step.push_back(params[0]);
        std::vector<std::vector<float>> m;
        for (size_t r = 0; r < world; r++) m.emplace_back(opts[r]->momentum().begin(), opts[r]->momentum().end());
        res.momentum_per_step.push_back(std::move(m));
    }
    return res;
}

}  // namespace demo_simulation
