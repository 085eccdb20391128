// Learning-rate schedule shared by both trainers: linear warmup from warmup_start_frac*lr to lr over warmup_steps
// (step 0 already takes one warmup increment, as llm.c), then one of four shapes down to final_lr_frac*lr:
//   cosine    half a cosine from lr at the end of warmup to the floor at the last step (llm.c, the DeMo paper);
//   linear    a straight line over the same span;
//   wsd       warmup-stable-decay: lr until the last decay_frac of the steps, then a straight line that reaches
//             the floor at the last step (a run can go on at lr and be cooled down later from a checkpoint);
//   constant  lr after warmup.
// A pure function of the step, so resuming needs no schedule state (and may change the shape).
#pragma once
#include <algorithm>
#include <cmath>

namespace llmc {

enum class LrShape { cosine, linear, wsd, constant };

struct LrSchedule {
    float lr;
    int warmup_steps;
    int total_steps;
    float warmup_start_frac;
    float final_lr_frac;
    LrShape shape = LrShape::cosine;
    float decay_frac = 0.2f;  // wsd: the share of total_steps that decays

    // The first step that a wsd schedule decays (it ends at total_steps - 1, at the floor).
    int decay_start() const {
        const int decay_steps = std::max(1, static_cast<int>(std::lround(decay_frac * total_steps)));
        return std::max(0, total_steps - decay_steps);
    }

    float at(int step) const {
        if (step < warmup_steps) {
            const float progress = static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
            return lr * (warmup_start_frac + (1.0f - warmup_start_frac) * progress);
        }
        const float min_lr = lr * final_lr_frac;
        switch (shape) {
            case LrShape::constant:
                return lr;
            case LrShape::wsd: {
                const int start = decay_start();
                if (step < start) return lr;
                const float ratio = static_cast<float>(step - start + 1) / static_cast<float>(total_steps - start);
                return lr - (lr - min_lr) * std::fmin(ratio, 1.0f);
            }
            case LrShape::cosine:
            case LrShape::linear: {
                const int decay_steps = total_steps - 1 - warmup_steps;
                if (decay_steps <= 0) return lr;
                const float ratio =
                    std::fmin(static_cast<float>(step - warmup_steps) / static_cast<float>(decay_steps), 1.0f);
                const float coeff = shape == LrShape::linear ? 1.0f - ratio
                                                              : 0.5f * (1.0f + std::cos(3.14159265358979f * ratio));
                return min_lr + coeff * (lr - min_lr);
            }
        }
        return lr;
    }
};

}  // namespace llmc
