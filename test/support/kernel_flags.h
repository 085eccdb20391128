// The config schema's "cuda" group as flags of the GPU test programs (--attention flash, --demo_momentum_domain dct,
// ...): the same keys, values and messages as the trainers', taken out of argv so the programs' own arguments stay.
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "llmc/base/schema.h"
#include "llmc/cuda/cuda_options.h"
#include "llmc/optim/demo/demo_config.h"

namespace testing {

struct KernelFlags {
    llmc::CudaOptions cuda;
    llmc::DemoConfig demo;  // its kernel switches (demo_dct, demo_momentum_domain, demo_kernel_tuning)
};

// Removes every flag of the cuda group and its value from argv (argc shrinks) and returns their settings.
inline KernelFlags take_kernel_flags(int& argc, char** argv) {
    llmc::Schema<KernelFlags> schema;
    schema.add("cuda", +[](KernelFlags& f) -> llmc::CudaOptions& { return f.cuda; }, llmc::cuda_option_keys());
    schema.add("cuda", +[](KernelFlags& f) -> llmc::DemoConfig& { return f.demo; }, llmc::demo_cuda_keys());
    std::vector<const char*> flags;
    int kept = 1;
    for (int i = 1; i < argc; i++) {
        std::string key = argv[i];
        const bool flag = key.starts_with("--");
        key = key.substr(flag ? 2 : 0, key.find('=') == std::string::npos ? std::string::npos : key.find('=') - 2);
        for (char& c : key)
            if (c == '-') c = '_';
        if (!flag || !schema.find(key)) {
            argv[kept++] = argv[i];
            continue;
        }
        flags.push_back(argv[i]);
        if (!std::strchr(argv[i], '=') && i + 1 < argc) flags.push_back(argv[++i]);
    }
    argc = kept;
    KernelFlags out;
    llmc::ConfigSources sources;
    schema.parse_command_line(static_cast<int>(flags.size()), flags.data(), out, sources, argv[0]);
    return out;
}

}  // namespace testing
