// Learning-rate schedule shared by both trainers: linear warmup from warmup_start_frac*lr to lr over
// warmup_steps (step 0 already takes one warmup increment, as llm.c), then cosine decay to final_lr_frac*lr
// at the last step. A pure function of the step, so resuming needs no schedule state.
#pragma once
#include <cmath>

namespace llmc {

struct LrSchedule {
    float lr;
    int warmup_steps;
    int total_steps;
    float warmup_start_frac;
    float final_lr_frac;

    float at(int step) const {
        if (step < warmup_steps) {
            const float progress = static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
            return lr * (warmup_start_frac + (1.0f - warmup_start_frac) * progress);
        }
        const float min_lr = lr * final_lr_frac;
        const int decay_steps = total_steps - 1 - warmup_steps;
        if (decay_steps <= 0) return lr;
        const float ratio = static_cast<float>(step - warmup_steps) / static_cast<float>(decay_steps);
        const float coeff = 0.5f * (1.0f + std::cos(3.14159265358979f * std::fmin(ratio, 1.0f)));
        return min_lr + coeff * (lr - min_lr);
    }
};

}  // namespace llmc
