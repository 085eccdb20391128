// The optimizers, by the name --optimizer gives: each registers its OptimizerFamily here (one line in
// optimizers.cpp), and the run layer asks this list for the family's checks, warnings and dry-run report.
#pragma once
#include <string>
#include <vector>

#include "llmc/optim/optimizer.h"

namespace llmc {

const std::vector<OptimizerFamily>& optimizer_families();
// Throws naming --optimizer for an unknown name.
const OptimizerFamily& optimizer_family(const std::string& name);
std::vector<std::string> optimizer_names();

}  // namespace llmc
