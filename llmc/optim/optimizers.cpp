// The registry of optimizers (see optimizers.h).
#include "llmc/optim/optimizers.h"

#include "llmc/base/error.h"
#include "llmc/optim/adamw/adamw.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "llmc/optim/demo/randomk.h"
#include "llmc/optim/diloco/diloco.h"
#include "llmc/optim/diloco/sparseloco.h"
#include "llmc/optim/signum/signum.h"
#include "llmc/optim/powersgd/powersgd.h"

namespace llmc {

const std::vector<OptimizerFamily>& optimizer_families() {
    static const std::vector<OptimizerFamily> families = {adamw_family(), demo::demo_family(), diloco_family(),
                                                          signum_family(), demo::topk_family(),
                                                          demo::randomk_family(), sparseloco_family(), powersgd_family()};
    return families;
}

const OptimizerFamily& optimizer_family(const std::string& name) {
    for (const OptimizerFamily& f : optimizer_families())
        if (f.name == name) return f;
    fail("--optimizer: '" + name + "' is not an optimizer");
}

std::vector<std::string> optimizer_names() {
    std::vector<std::string> names;
    for (const OptimizerFamily& f : optimizer_families()) names.push_back(f.name);
    return names;
}

}  // namespace llmc
