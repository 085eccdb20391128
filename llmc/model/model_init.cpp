// Seeded initialization shared by the families (see model_init.h).
#include "llmc/model/model_init.h"

#include <algorithm>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/rng.h"
#include "llmc/model/gpt2/gpt2_family.h"
#include "llmc/model/olmo/olmo_family.h"

namespace llmc {

namespace {

uint64_t mix64(uint64_t z) {  // splitmix64 finalizer: decorrelates seeds built from small integers
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

void init_params(const ParamLayout& layout, std::span<float> params, uint64_t seed) {
    if (layout.config.arch == ModelArch::olmo)
        olmo_init(layout, params, seed);
    else
        gpt2_init(layout, params, seed);
}

void init_by_rule(const ParamLayout& layout, std::span<float> params, uint64_t seed,
                  TensorInit (*rule)(const ParamLayout& layout, const ParamTensor& tensor)) {
    LLMC_CHECK(params.size() == layout.num_params, "init_params: a buffer of " + std::to_string(params.size()) +
                                                       " floats for a model of " + std::to_string(layout.num_params));
    const size_t padded_rows_start = static_cast<size_t>(layout.config.vocab_size) * layout.config.channels;
    constexpr size_t kBlock = size_t(1) << 16;
    struct Task { size_t tensor, begin, end; };
    std::vector<Task> tasks;
    for (size_t ti = 0; ti < layout.tensors.size(); ti++)
        for (size_t begin = 0; begin < layout.tensors[ti].numel; begin += kBlock)
            tasks.push_back({ti, begin, std::min(layout.tensors[ti].numel, begin + kBlock)});
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t k = 0; k < tasks.size(); k++) {
        const Task& task = tasks[k];
        const ParamTensor& t = layout.tensors[task.tensor];
        float* p = params.data() + t.offset;
        const TensorInit init = rule(layout, t);
        if (!init.random) {
            std::fill(p + task.begin, p + task.end, static_cast<float>(init.value));
            continue;
        }
        Rng rng(mix64(seed ^ mix64((static_cast<uint64_t>(task.tensor) << 32) | (task.begin / kBlock))));
        for (size_t i = task.begin; i < task.end; i++) {
            double z = rng.normal();
            while (init.truncated && (z > 3.0 || z < -3.0)) z = rng.normal();
            const bool padded_row = t.kind == ParamKind::wte && i >= padded_rows_start;
            p[i] = padded_row ? 0.0f : static_cast<float>(init.value * z);
        }
    }
}

}  // namespace llmc
