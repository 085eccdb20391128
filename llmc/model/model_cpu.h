// The model on the CPU in fp32, for every family (model_config.h): a sequential pre-norm decoder whose token
// embedding is also the classifier over the padded vocabulary (the loss only sees the first vocab_size logits).
//   gpt2: llm.c's GPT-2 exactly (learned positions, affine LayerNorm, biases, tanh-GELU MLP of 4C).
//   olmo: the DeMo paper's OLMo (RoPE on q and k, LayerNorm without parameters or RMSNorm, no biases, SwiGLU MLP
//         of 8C -> 4C).
// The layers are cpu_layers.h's: matmuls through OpenBLAS, everything else OpenMP loops whose reductions run in
// a fixed order, so the same inputs and thread count give bit-identical outputs. Parameters and gradients are
// flat buffers in ParamLayout::of order, which is the checkpoint order, so the optimizers and model_io see them
// as they are. Activations (and backward's
// scratch) are one allocation made by the first forward and grown only when a later (B, T) needs more.
// While forward/backward run, OpenBLAS is set to one thread (they split each matmul over OpenMP threads
// themselves); its previous thread count is restored when they return.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "llmc/model/param_layout.h"
#include "llmc/base/host_memory.h"

namespace llmc {

// What a model is for: an inference model (sample_gpt, eval_gpt) has no gradients and no backward scratch,
// keeps one layer's activations, which every layer reuses, instead of all L for the backward, and keeps one
// block of kClassifierRows rows of logits instead of all B*T rows (824 MB for GPT-2 124M at B=4, T=1024).
// zero_grad() and backward() refuse it, grads() and logits() are empty; its forward gives the training model's
// bits (loss, losses(), last_logits()).
enum class ModelUse { training, inference };
// The classifier's matmul runs on blocks of this many rows (positions). For GPT-2 124M's 4096 rows at B=4, T=1024
// on the 2-core VM, blocks of 512 took 5% longer than one matmul, blocks of 128 22% longer.
inline constexpr size_t kClassifierRows = 512;

class ModelCpu {
public:
    explicit ModelCpu(const ModelConfig& config, ModelUse use = ModelUse::training);

    const ParamLayout& layout() const { return layout_; }
    std::span<float> params() { return params_; }
    std::span<float> grads() { return grads_; }

    // The family's seeded init (model_init.h: GPT-2's normal(0, 0.02) scheme, OLMo's mitchell), independent of
    // the thread count.
    void init_random(uint64_t seed);

    // Runs the model on B sequences of T tokens (inputs and targets are B*T row-major token ids). Returns
    // the mean cross-entropy over the positions with a target (a target of kNoTarget, llmc/base/targets.h, is
    // none: torch's ignore_index), 0 when there are none or targets is null. Throws llmc::Error for
    // T > max_seq_len, an input outside [0, vocab_size) or a target neither in it nor kNoTarget.
    float forward(const int* inputs, const int* targets, int B, int T);
    // The positions with a target in the last forward (B*T when none is kNoTarget; 0 without targets).
    size_t target_count() const { return target_count_; }

    void zero_grad();

    // Adds the gradient of loss_scale * (mean loss of the last forward) into grads(), so micro-batches
    // accumulate (pass 1/steps as loss_scale): each position with a target weighs loss_scale / target_count(),
    // one without 0 (a forward without any adds nothing). Needs a preceding forward() with targets. `on_final`,
    // if set, is called on this thread with the gradient ranges nothing later in this backward writes, in the order of
    // ParamLayout::backward_ranges_of_*: `wte_early` once the classifier is done (runs of wte rows the inputs do
    // not touch), each layer's, then the embeddings' others. AdamW-DDP starts their all-reduce.
    using GradsFinal = std::function<void(std::span<const ParamRange>)>;
    void backward(float loss_scale = 1.0f, const GradsFinal& on_final = {}, std::span<const ParamRange> wte_early = {});

    // Size of the activation allocation (forward's tensors and backward's scratch), for memory reports.
    size_t activation_bytes() const { return act_capacity_ * sizeof(float); }

    // (B, T, padded_vocab_size) logits of the last forward; empty for an inference model, which does not keep them.
    std::span<const float> logits() const {
        return {acts_.logits, use_ == ModelUse::training ? num_tokens_ * size_t(config_.padded_vocab_size) : 0};
    }
    // (B, padded_vocab_size): the logits of each sequence's last position in the last forward, for any model.
    std::span<const float> last_logits() const {
        return {acts_.last_logits, size_t(batch_) * size_t(config_.padded_vocab_size)};
    }
    // (B, T) cross-entropy at each position of the last forward with targets, 0 where the target is kNoTarget
    // (forward's loss is their sum over target_count()).
    std::span<const float> losses() const { return {acts_.losses, have_targets_ ? num_tokens_ : 0}; }

    // Inference with a key/value cache, for sampling. start_sequence runs the model on `tokens` (1 to max_seq_len
    // of them, at positions 0..) and keeps every layer's keys and values; append runs it on one more token at the
    // next position from them, instead of on the whole context again (about T times less work at context T). Both
    // return the padded logits of the sequence's last position, valid until the next call of either or of
    // forward(). The cache is an allocation of its own (2 * L * max_seq_len * C floats and one token's
    // activations), made by the first start_sequence. Logits equal forward()'s on the same tokens to float
    // rounding: the matmuls of one row sum in another order than those of T rows.
    std::span<const float> start_sequence(std::span<const int> tokens);
    std::span<const float> append(int token);  // throws when the sequence already holds max_seq_len tokens
    int sequence_length() const { return cached_tokens_; }
    // Keeps the sequence's first n tokens (1 <= n <= sequence_length()): the next append goes to position n. For
    // several continuations of one prompt.
    void truncate_sequence(int n);
    // Sampling's step: the logits after `context`, whose tokens but the last the cache holds (or, once the context
    // outgrew `window` <= max_seq_len, its last `window` tokens but the newest). append() while the cache holds
    // fewer than `window` tokens; after that every position of the window moves by one each token, so its last
    // `window` tokens run whole (start_sequence).
    std::span<const float> continue_sequence(std::span<const int> context, int window);

    // The wte rows past vocab_size back to 0 in the parameters and, when it is another buffer of the same
    // layout (an optimizer's shared weights, Optimizer::master_weights), in `shared` too.
    void zero_padded_vocab_rows(std::span<float> shared = {});

private:
    // Pointers to the per-kind blocks of a flat parameter (or gradient) buffer; null for a kind the family lacks.
    struct Weights {
        float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
            *fcprojb, *lnfw, *lnfb;
    };
    // Views into the single activation allocation (F = config.mlp_input_rows()). Per-layer tensors hold
    // kept_layers() layers back to back.
    // The d* buffers are backward scratch reused by every layer.
    struct Activations {
        float *encoded;                              // (N, C)  token + position embedding
        float *ln1, *ln1_mean, *ln1_rstd;            // (L, N, C), (L, N), (L, N)
        float *qkv;                                  // (L, N, 3C)
        float *att;                                  // (L, B, H, T, T) softmax probabilities (causal part)
        float *atty;                                 // (L, N, C) attention output before the projection
        float *residual2;                            // (L, N, C) residual after attention
        float *ln2, *ln2_mean, *ln2_rstd;            // (L, N, C), (L, N), (L, N)
        float *fch, *fch_gelu;                       // (L, N, F), (L, N, 4C) MLP hidden before / after GELU or SwiGLU
        float *residual3;                            // (L, N, C) residual after the MLP
        float *lnf, *lnf_mean, *lnf_rstd;            // (N, C), (N), (N)
        float *logits;                               // (N, Vp); an inference model's (kClassifierRows, Vp)
        float *last_logits;                          // (B, Vp) each sequence's last position
        float *logsumexp;                            // (N) per row, over the first V logits
        float *losses;                               // (N)
        float *dlogits;                              // (N, Vp)
        float *dresidual;                            // (N, C) gradient flowing down the residual stream
        float *dln;                                  // (N, C) gradient of a LayerNorm output
        float *datty;                                // (N, C)
        float *dqkv;                                 // (N, 3C)
        float *dfch;                                 // (N, F)
        float *datt_row;                             // (B, H, T) one softmax-gradient row per (b, h) task
        float *dfch_act;                             // (N, 4C) SwiGLU's output gradient; empty for GPT-2
    };
    // Views into the key/value cache's allocation: the cache, then one token's activations for append().
    struct TokenCache {
        float *keys, *values;                        // (L, max_seq_len, C)
        float *x, *residual2, *ln, *ln_mean, *ln_rstd;  // (C), (C), (C), (1), (1)
        float *qkv, *atty, *fch, *fch_gelu;          // (3C), (C), (F), (4C)
        float *att;                                  // (H, max_seq_len) one softmax row per head
        float *logits;                               // (Vp)
    };

    static Weights point_weights(const ParamLayout& layout, float* base);
    // Layers whose activations are kept: all for backward; one slot, reused by every layer, for inference.
    size_t kept_layers() const { return use_ == ModelUse::training ? config_.num_layers : 1; }
    void prepare_activations(int B, int T);
    // forward(); with fill_cache, each layer's keys and values also go to the key/value cache (start_sequence).
    float run_forward(const int* inputs, const int* targets, int B, int T, bool fill_cache);
    void cache_keys_values(size_t layer, const float* qkv, size_t tokens);
    void prepare_token_cache();
    // The family's norm (LayerNorm with or without parameters, RMSNorm) and MLP activation (GELU, SwiGLU) on N rows.
    void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      size_t N) const;
    void norm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, size_t N) const;
    void activation_forward(float* out, const float* fch, size_t N) const;
    void activation_backward(float* dfch, const float* dout, const float* fch, size_t N) const;

    ModelConfig config_;
    ModelUse use_;
    ParamLayout layout_;
    LargeVector<float> params_, grads_;
    std::vector<float> rope_table_;  // rope_table of max_seq_len positions; empty for learned positions
    Weights weights_{}, weight_grads_{};

    std::unique_ptr<float[], FreeDeleter> act_memory_;
    size_t act_capacity_ = 0;  // floats in act_memory_
    Activations acts_{};
    int batch_ = 0, seq_len_ = 0;
    size_t num_tokens_ = 0;  // batch_ * seq_len_
    std::vector<int> inputs_, targets_;
    bool have_targets_ = false;
    size_t target_count_ = 0;  // positions of targets_ that are not kNoTarget

    std::unique_ptr<float[], FreeDeleter> cache_memory_;
    TokenCache cache_{};
    int cached_tokens_ = 0;
};

}  // namespace llmc
