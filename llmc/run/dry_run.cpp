// Warnings and the dry-run report (see dry_run.h).
#include "llmc/run/dry_run.h"

#include <cstdio>
#include <iostream>

#include "llmc/base/schema.h"
#include "llmc/optim/optimizers.h"
#include "llmc/optim/schedule.h"

namespace llmc {

void print_dry_run_report(const TrainConfig& cfg, int world) {
    // (the optimizer's own checks ran in validate_config)
    print_config_warnings(cfg);
    std::printf("%s\n", config_to_json(cfg).c_str());
    const ParamLayout layout = ParamLayout::of(cfg.model);
    std::printf("model %s: %s parameters in %zu tensors\n", cfg.model.describe().c_str(),
                with_commas(layout.num_params).c_str(), layout.tensors.size());
    if (cfg.virtual_ranks > 1)  // each virtual rank is a whole rank: its model, activations and optimizer state
        std::printf("virtual ranks: %d per process, memory ~%d x one rank's (weights + gradients %.1f MB, plus "
                    "activations and optimizer state); the optimizer's update runs once per virtual rank\n",
                    cfg.virtual_ranks, cfg.virtual_ranks, 8.0 * static_cast<double>(layout.num_params) / 1e6);
    std::fflush(stdout);
    // One rank sends nothing; report for the paper's 64 ranks then (mpirun -np N for another count).
    optimizer_family(cfg.optimizer).dry_run_report(std::cout, cfg.optim, layout, world > 1 ? world : 64);
}

std::vector<std::string> config_warnings(const TrainConfig& cfg) {
    std::vector<std::string> warnings;
    // the optimizers' decay factor, in their float arithmetic, at the peak learning rate
    if (const float factor = 1.0f - cfg.lr * cfg.optim.weight_decay; factor <= 0.0f)
        warnings.push_back("lr " + format_float(cfg.lr) + " x weight_decay " + format_float(cfg.optim.weight_decay) +
                           " >= 1: decoupled weight decay multiplies the decayed weights by 1 - lr x weight_decay = " +
                           format_float(factor) + " at the peak learning rate: " +
                           (factor < 0.0f ? "it flips their sign" : "it zeroes them") + " instead of shrinking them");
    if (cfg.warmup_steps > cfg.steps) {
        const LrSchedule schedule = cfg.schedule();
        warnings.push_back("warmup_steps " + std::to_string(cfg.warmup_steps) + " > steps " +
                           std::to_string(cfg.steps) + ": the learning rate is still warming up at the last step, " +
                           "where it reaches " + format_float(schedule.at(cfg.steps - 1)) + ", not lr " +
                           format_float(cfg.lr));
    }
    if (const LrSchedule schedule = cfg.schedule();
        schedule.shape == LrShape::wsd && cfg.warmup_steps <= cfg.steps && schedule.decay_start() < cfg.warmup_steps)
        warnings.push_back("lr_schedule wsd: the decay over the last lr_decay_frac " + format_float(cfg.lr_decay_frac) +
                           " of the steps starts at step " + std::to_string(schedule.decay_start()) +
                           ", before warmup ends at step " + std::to_string(cfg.warmup_steps) +
                           ": the learning rate never stays at lr");
    for (std::string& w : optimizer_family(cfg.optimizer).warnings(cfg.optim, ParamLayout::of(cfg.model)))
        warnings.push_back(std::move(w));
    // DiLoCo syncs at steps divisible by H only: the steps after the last sync never reach the global weights
    const bool rounds = cfg.optimizer == "diloco" || cfg.optimizer == "sparseloco";  // SparseLoCo is a DiLoCo
    if (const int h = cfg.optim.diloco.inner_steps; rounds && h > 0 && cfg.steps % h != 0)
        warnings.push_back("steps " + std::to_string(cfg.steps) + " is not a multiple of diloco_inner_steps " +
                           std::to_string(h) + ": the last " + std::to_string(cfg.steps % h) +
                           " steps end unsynced, and the final model file holds the global weights of step " +
                           std::to_string(cfg.steps - cfg.steps % h));
    if (cfg.checkpoint_every < 0 && cfg.time_limit_minutes > 0.0f)
        warnings.push_back("time_limit_minutes " + format_float(cfg.time_limit_minutes) +
                           " with checkpoint_every -1: the run stops at its limit without a checkpoint to continue from");
    if (cfg.checkpoint_every < 0 && cfg.checkpoint_every_minutes > 0.0f)
        warnings.push_back("checkpoint_every_minutes " + format_float(cfg.checkpoint_every_minutes) +
                           " with checkpoint_every -1: no checkpoint is written");
    return warnings;
}

void print_config_warnings(const TrainConfig& cfg) {
    for (const std::string& warning : config_warnings(cfg)) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    std::fflush(stderr);
}

std::string optimizer_banner(const TrainConfig& cfg) {
    const std::string what = optimizer_family(cfg.optimizer).describe(cfg.optim);
    return what.empty() ? cfg.optimizer : cfg.optimizer + " (" + what + ")";
}

}  // namespace llmc
