// The CUDA trainer's kernel switches (the schema's "cuda" group): how the model's kernels compute. Plain C++, so the
// shared config schema knows them; train_gpt hands them to the model (llmc/model/model_cuda.cuh) and the
// optimizers once.
// The CPU trainer ignores them, but every rank must agree on them all the same.
#pragma once
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

enum class AttentionChoice { automatic, flash, matmul };  // automatic: flash where this build and model run it
enum class FlashDqMode { shares, shares_last, shares_bf16, atomic };
enum class GeluFusion { automatic, none, forward, both };  // automatic: both on sm_90+, none before
enum class BiasGradMode { reduce, epilogue };

struct CudaOptions {
    AttentionChoice attention = AttentionChoice::automatic;
    FlashDqMode flash_dq = FlashDqMode::shares;
    GeluFusion gelu_fusion = GeluFusion::automatic;
    BiasGradMode bias_grad = BiasGradMode::reduce;
    bool matmul_tune = false;
    bool cuda_graph = false;
    bool stochastic_rounding = true;
};

std::vector<Key<CudaOptions>> cuda_option_keys();

}  // namespace llmc
