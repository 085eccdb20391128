// What a run says before it trains: the warnings of legal settings that probably do not do what was meant, and
// --dry_run's report (the warnings, the resolved config, and the chosen optimizer's traffic report).
#pragma once
#include <string>
#include <vector>

#include "llmc/run/config.h"

namespace llmc {

// --dry_run: the config's warnings, the resolved config and the traffic report (for the paper's 64 ranks when run on
// one).
void print_dry_run_report(const TrainConfig& cfg, int world);

// Settings a run accepts that probably do not do what was meant, one line each (without "warning: "):
// lr * weight_decay >= 1 (decoupled weight decay then zeroes or flips the decayed weights each step), warmup_steps >
// steps (the learning rate never reaches its peak) and, with DeMo, a demo_topk above the elements of some tensor's
// chunks (the plan clamps k to them: those chunks send every coefficient), and a time limit or time-based
// checkpoints with --checkpoint_every -1 (no checkpoint is ever written).
std::vector<std::string> config_warnings(const TrainConfig& cfg);
// config_warnings on stderr, "warning: ..." each: the trainers' rank 0 prints them before training, after the
// checks that could still stop the run, and a dry run with its report.
void print_config_warnings(const TrainConfig& cfg);
// For the trainers' banner: the optimizer and what sets its step apart ("demo (applied a step late)").
std::string optimizer_banner(const TrainConfig& cfg);

}  // namespace llmc
