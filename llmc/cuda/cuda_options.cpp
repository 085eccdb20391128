// The "cuda" group's keys (cuda_options.h).
#include "llmc/cuda/cuda_options.h"

namespace llmc {

std::vector<Key<CudaOptions>> cuda_option_keys() {
    return {
        key("attention", &CudaOptions::attention,
            "train_gpt's attention: flash (tensor-core tiles, online softmax, no T x T matrices; bf16 build, head size "
            "64), matmul (cuBLASLt products and a softmax over stored T x T matrices) or auto (flash where it runs)",
            {{"auto", AttentionChoice::automatic}, {"flash", AttentionChoice::flash},
             {"matmul", AttentionChoice::matmul}}),
        key("flash_dq", &CudaOptions::flash_dq,
            "how the flash backward sums dQ over key tiles: per-pair shares and a second kernel (shares, "
            "deterministic), the same shares summed by the last key tile to write (shares_last, the same bits), the "
            "shares in bf16 (shares_bf16) or fp32 atomic adds (atomic: not bit-reproducible)",
            {{"shares", FlashDqMode::shares}, {"shares_last", FlashDqMode::shares_last},
             {"shares_bf16", FlashDqMode::shares_bf16}, {"atomic", FlashDqMode::atomic}})
            .experimental("the modes other than shares are checked on the emulated device, untimed on a GPU"),
        key("gelu_fusion", &CudaOptions::gelu_fusion,
            "the GELU as cuBLASLt epilogues: none (separate kernels), forward, both (forward and DGELU backward) or "
            "auto (both on sm_90+, none before)",
            {{"auto", GeluFusion::automatic}, {"none", GeluFusion::none}, {"forward", GeluFusion::forward},
             {"both", GeluFusion::both}}),
        key("bias_grad", &CudaOptions::bias_grad,
            "the qkv and fc bias gradients by a column reduction over dout (reduce) or from cuBLASLt's BGRADB "
            "epilogue on their weight-gradient products (epilogue; sums in cuBLASLt's order)",
            {{"reduce", BiasGradMode::reduce}, {"epilogue", BiasGradMode::epilogue}})
            .experimental("checked on the emulated device, untimed on a GPU"),
        key("matmul_tune", &CudaOptions::matmul_tune,
            "each matmul problem's cuBLASLt algorithm the fastest of the heuristic's first 8, timed when first met "
            "(not bit-reproducible across runs), instead of its first choice")
            .experimental("checked on the emulated device, untimed on a GPU"),
        key("cuda_graph", &CudaOptions::cuda_graph,
            "replay each training micro-step's kernels as one captured CUDA graph (the same bits; not with "
            "AdamW-DDP's overlapped all-reduce)")
            .experimental("checked on the emulated device, untimed on a GPU"),
        key("stochastic_rounding", &CudaOptions::stochastic_rounding,
            "the bf16 parameters rounded stochastically from the fp32 master weights (false: to nearest)"),
    };
}

}  // namespace llmc
