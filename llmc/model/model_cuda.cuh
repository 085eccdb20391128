// The model on the GPU, for both families of llmc/model/model_config.h, as llmc/model/model_cpu.h computes them:
//   gpt2: llm.c's GPT-2 (learned positions, pre-LayerNorm blocks with weight and bias, biases in every linear
//         layer, tanh-GELU MLP of 4C);
//   olmo: the DeMo paper's OLMo (RoPE on q and k right after the qkv product, LayerNorm without parameters or
//         RMSNorm with a weight, no biases, SwiGLU MLP whose fc product writes [x | gate] (N, 8C) -> (N, 4C)).
// Both end in a final norm and the tied embedding as the classifier over the padded vocabulary (loss over the
// first vocab_size logits), and are built from the kernels in llmc/cuda/*.cuh; GPT-2's path runs exactly the
// kernels it ran before OLMo existed, so its bits did not change.
//
// Memory, one cudaMalloc per kind (DeviceArena):
//   parameters  floatX, flat in ParamLayout::of order (the checkpoint order), what the kernels read
//   gradients   fp32, same layout (what the optimizers and the all-reduce take); accumulated over micro-steps
//   activations everything the forward keeps for the backward plus backward scratch, sized for the largest
//               (B, T) given at construction; smaller batches (sampling, B=1) reuse the same buffers. OLMo's
//               RoPE table (llmc/base/rope_table.h, the CPU model's floats) lives there too.
// The fp32 master weights and optimizer state belong to the DeviceOptimizer (optimizer_cuda.cuh).
//
// Attention: llmc/cuda/flash_attention.cuh (tensor-core tiles, online softmax, only a log-sum-exp per row kept) where
// it can run (bf16 build, head size 64), else llmc/cuda/attention.cuh (cuBLASLt products and a softmax over the
// stored B x NH x T x T matrices, as llm.c without cuDNN); --attention picks one. Flash drops those matrices
// from the activations (12 x 400 MB for GPT-2 124M at B=16, T=1024) and made that model's step 23-25% shorter
// on an H100 (docs/benchmarks.md). OLMo's RoPE turns q and k in place in the qkv product's output before either
// attention reads it, so both keep the rotated q and k for the backward, and its transpose turns dq and dk back
// after the attention backward.
//
// --cuda_graph (opt-in): a training micro-step's kernels, from the encoder to layer 0's backward, are captured
// into one CUDA graph (at the second micro-step of a shape: the first one, run as usual, settles cuBLASLt's
// algorithm choices) and replayed, so the step's ~340 launches cost one; the batch upload, the encoder backward's
// plan (built on the host from the batch) and the embedding backward stay outside. The same kernels in the same
// order, so the same bits. Not with an optimizer that wants the backward's per-layer reports (AdamW-DDP's
// overlapped all-reduce), which run on the host between kernels.
//
// Precision: activations and parameters floatX (bf16 by default), every reduction and accumulation in fp32,
// gradients fp32. Deterministic: no atomics anywhere (bucketed encoder backward, column reductions for bias and
// norm gradients), so the same inputs give bit-identical gradients on the same GPU.
//
// GPT-2 only (OLMo has no biases and no GELU): --gelu_fusion's cuBLASLt GELU epilogues, and --bias_grad epilogue
// (opt-in; default reduce), where the qkv and fc bias gradients come from cuBLASLt's BGRADB epilogue on their
// weight-gradient products instead of a column reduction that reads dout once more (llmc/cuda/matmul.cuh); the
// projections' bias gradients stay in the LayerNorm backwards, which read that dout anyway.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/rope_table.h"
#include "llmc/base/targets.h"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/cuda_common.cuh"
#include "llmc/cuda/cuda_options.h"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/fused_classifier.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/norms.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/swiglu.cuh"
#include "llmc/model/param_layout.h"

namespace llmc {

// A captured and instantiated CUDA graph (owned), and the micro-step shape it was captured for.
struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    int B = 0, T = 0;
    float dloss = 0.0f;
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() {
        if (exec) (void)cudaGraphExecDestroy(exec);
    }
    bool is_for(int b, int t, float d) const { return B == b && T == t && dloss == d; }
    // Drops the graph; the next one is for (b, t, d).
    void reset(int b, int t, float d) {
        if (exec) (void)cudaGraphExecDestroy(exec);
        exec = nullptr;
        B = b, T = t, dloss = d;
    }
};

// --attention: true for flash. flash where this build or model cannot run it is an error (train_gpt checks it before
// any GPU work); auto takes flash where it can run.
inline bool use_flash_attention(const ModelConfig& config, AttentionChoice choice) {
    if (choice == AttentionChoice::matmul) return false;
    const std::string why = flash_attention_unsupported(config.channels, config.num_heads);
    if (choice == AttentionChoice::automatic) return why.empty();
    LLMC_CHECK(why.empty(), "--attention flash: " + why + "; use --attention auto or matmul");
    return true;
}

// --gelu_fusion as the model's levels: 0 separate GELU kernels, 1 the forward GELU as a cuBLASLt epilogue, 2 the
// backward too (DGELU epilogue on the fcproj dinp). auto: 2 on Hopper (2.4% faster steps than the forward one alone
// on an H100), before it 0, as llm.c (the epilogues were not measured faster there).
inline int gelu_fusion_level(GeluFusion choice, int compute_major) {
    switch (choice) {
        case GeluFusion::none: return 0;
        case GeluFusion::forward: return 1;
        case GeluFusion::both: return 2;
        case GeluFusion::automatic: break;
    }
    return compute_major >= 9 ? 2 : 0;
}

inline flash::FlashDq flash_dq_of(FlashDqMode mode) {
    switch (mode) {
        case FlashDqMode::shares_last: return flash::FlashDq::SharesLast;
        case FlashDqMode::shares_bf16: return flash::FlashDq::SharesBf16;
        case FlashDqMode::atomic: return flash::FlashDq::Atomic;
        case FlashDqMode::shares: break;
    }
    return flash::FlashDq::Shares;
}

class ModelCuda {
public:
    // max_B, max_T: the largest micro-batch forward/forward_backward will see (T <= max_seq_len).
    // `options`: the config's cuda group (attention, flash_dq, gelu_fusion, bias_grad, matmul_tune, cuda_graph).
    ModelCuda(const ModelConfig& config, int max_B, int max_T, CudaEnv& env, const CudaOptions& options = {})
        : config_(config), layout_(ParamLayout::of(config)), env_(env), max_B_(max_B), max_T_(max_T) {
        const int C = config.channels;
        LLMC_CHECK(max_B > 0 && max_T > 0, "ModelCuda: batch and sequence length must be positive");
        LLMC_CHECK(max_T <= config.max_seq_len, "seq_len " + std::to_string(max_T) + " exceeds the model's max_seq_len " +
                                                    std::to_string(config.max_seq_len));
        LLMC_CHECK(C % 8 == 0 && (C / config.num_heads) % 8 == 0,
                   "the CUDA trainer needs channels and head size multiples of 8 (cuBLASLt alignment); got C=" +
                       std::to_string(C) + " heads=" + std::to_string(config.num_heads));
        // OLMo has no GELU to fuse and no biases to take from an epilogue: its MLP is SwiGLU, its products plain
        gelu_fusion_ = config.is_olmo() ? 0 : gelu_fusion_level(options.gelu_fusion, env.props.major);
        flash_attention_ = use_flash_attention(config, options.attention);
        flash_dq_ = flash_dq_of(options.flash_dq);
        env.tune_matmuls = options.matmul_tune;
        cuda_graph_ = options.cuda_graph;
        bias_grad_epilogue_ = config.has_biases() && options.bias_grad == BiasGradMode::epilogue;

        param_mem_.add(&params_, layout_.num_params);
        param_mem_.allocate("parameters (" + std::to_string(layout_.num_params) + " x " + kFloatXName + ")");
        grad_mem_.add(&grads_, layout_.num_params);
        grad_mem_.allocate("gradients (" + std::to_string(layout_.num_params) + " x fp32)");
        grad_mem_.zero(env_.stream);
        CUDA_CHECK(cudaMemsetAsync(params_, 0, layout_.num_params * sizeof(floatX), env_.stream));
        plan_activations();
        if (a_.rope_table) {  // the CPU model's table (its first max_T rows), so both turn q and k by the same floats
            const std::vector<float> table = rope_table(max_T, config.head_size(), config.rope_theta);
            CUDA_CHECK(cudaMemcpy(a_.rope_table, table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
        }
        env_.sync();
    }

    const ModelConfig& config() const { return config_; }
    const ParamLayout& layout() const { return layout_; }
    size_t num_params() const { return layout_.num_params; }
    floatX* params() { return params_; }
    float* grads() { return grads_; }
    size_t activation_bytes() const { return act_mem_.bytes(); }
    int gelu_fusion() const { return gelu_fusion_; }
    bool cuda_graph() const { return cuda_graph_; }
    bool bias_grad_epilogue() const { return bias_grad_epilogue_; }
    bool flash_attention() const { return flash_attention_; }
    const char* attention_name() const {
        if (!flash_attention_) return "matmul";
        if (flash_dq_ == flash::FlashDq::Atomic) return "flash (atomic dQ)";
        if (flash_dq_ == flash::FlashDq::SharesLast) return "flash (dQ shares summed by the last key tile)";
        return flash_dq_ == flash::FlashDq::SharesBf16 ? "flash (bf16 dQ shares)" : "flash";
    }
    int max_batch() const { return max_B_; }
    int max_seq() const { return max_T_; }

    // Starts a new gradient sum: the next forward_backward writes every gradient instead of adding to it (the
    // weight-gradient products with beta 0, the reductions' last stage storing), so no step clears the 500 MB of
    // a GPT-2 124M gradient buffer, and the products skip reading it. Until that backward, grads() holds whatever
    // it held (the trainer stages the starting weights there).
    void zero_grad() { overwrite_grads_ = true; }

    // Runs the model (evaluation: the logits stay intact). Returns the mean loss over the positions with a
    // target (kNoTarget, llmc/base/targets.h, is none: torch's ignore_index), 0 when there are none or targets
    // is null. inputs/targets: B*T token ids in host memory.
    float forward(const int* inputs, const int* targets, int B, int T) {
        const size_t count = stage_batch(inputs, targets, B, T);
        forward_kernels(B, T, targets != nullptr, false, 1.0f);
        target_count_ = count;
        return targets ? mean_loss(B * T, count) : 0.0f;
    }
    // The positions with a target in the last forward() (B*T when none is kNoTarget; 0 without targets).
    size_t target_count() const { return target_count_; }

    // The backward's report of gradient ranges no later kernel of it writes (DeviceOptimizer::on_gradients_final):
    // called on the host while the GPU still runs the backward, once the kernels producing the ranges are queued.
    using GradsFinal = std::function<void(std::span<const ParamRange>)>;

    // One training micro-step: forward, then backward of loss_scale * mean loss (over the positions with a
    // target: each weighs loss_scale / their count, a kNoTarget one 0), ADDING into grads() (call
    // zero_grad() at the start of each optimizer step: the first micro-step after it writes instead; pass
    // 1/grad_accum as loss_scale). Queued without waiting for the GPU, so the host prepares the next micro-step
    // or the optimizer step while the GPU runs this one: the per-row losses follow into pinned memory, and
    // take_losses() returns the mean loss of each micro-step queued.
    // on_final (the last micro-step of an optimizer step): told of every gradient range once, in backward order:
    // `wte_early` once the classifier is done (runs of wte rows no input token touches, so the encoder backward
    // leaves them alone), ln_f and the last layer, each layer down to the first, then the rest of wte (and GPT-2's
    // wpe).
    void queue_forward_backward(const int* inputs, const int* targets, int B, int T, float loss_scale = 1.0f,
                                const GradsFinal& on_final = {}, std::span<const ParamRange> wte_early = {}) {
        LLMC_CHECK(targets != nullptr, "forward_backward needs targets");
        LLMC_CHECK(wte_early.empty() ||
                       layout_.wte_rows_untouched(wte_early, std::span<const int>(inputs, size_t(B) * T)),
                   "forward_backward: an early wte range holds a row this batch's input tokens use");
        const size_t count = stage_batch(inputs, targets, B, T);
        const float dloss = loss_scale_per_target(loss_scale, count);
        const bool accumulate = !overwrite_grads_;
        if (cuda_graph_ && !on_final) {
            forward_backward_layers_graph(B, T, dloss, accumulate);
            plan_.build(inputs, B * T);  // host work overlaps the graph
            plan_.upload(a_.encoder_plan, plan_upload_, env_.stream);
        } else {
            forward_kernels(B, T, true, true, dloss);
            plan_.build(inputs, B * T);  // host work overlaps the GPU's forward
            plan_.upload(a_.encoder_plan, plan_upload_, env_.stream);
            backward_layers(B, T, on_final, accumulate, wte_early);
        }
        backward_embeddings(B, T, on_final, accumulate, wte_early);
        overwrite_grads_ = false;
        queue_losses(B * T, count);
    }
    // The mean loss of each of the first `count` micro-steps queued and not yet taken (all of them by default), in
    // queue order, each summed on the host in row order as forward() does. Waits for the last of them only (nothing
    // is left to wait for after the caller's own wait), not for micro-steps queued after it: the trainer queues
    // the next step's before it reads this step's losses.
    std::vector<float> take_losses(size_t count = SIZE_MAX) {
        count = std::min(count, queued_losses_.size());
        if (count == 0) return {};
        loss_slots_[queued_losses_[count - 1].slot].copied.synchronize();
        std::vector<float> means;
        for (size_t i = 0; i < count; i++) {
            const QueuedLoss q = queued_losses_.front();
            queued_losses_.pop_front();
            means.push_back(mean_of_rows(loss_slots_[q.slot].rows.data(), q.rows, q.targets));
            free_loss_slots_.push_back(q.slot);
        }
        return means;
    }
    // queue_forward_backward, then its mean loss (waits for the GPU).
    float forward_backward(const int* inputs, const int* targets, int B, int T, float loss_scale = 1.0f,
                           const GradsFinal& on_final = {}, std::span<const ParamRange> wte_early = {}) {
        queue_forward_backward(inputs, targets, B, T, loss_scale, on_final, wte_early);
        return take_losses().back();
    }

    // The per-position cross-entropies of the last forward() with targets, on the host; 0 where the target is
    // kNoTarget.
    std::span<const float> losses() const { return host_losses_; }

    // Logits of the last forward() for row (b * T + t), fp32, padded_vocab_size values.
    std::vector<float> logits_row(size_t row) const {
        std::vector<floatX> x(config_.padded_vocab_size);
        CUDA_CHECK(cudaMemcpyAsync(x.data(), a_.logits + row * config_.padded_vocab_size, x.size() * sizeof(floatX),
                                   cudaMemcpyDeviceToHost, env_.stream));
        CUDA_CHECK(cudaStreamSynchronize(env_.stream));
        return host_from_floatX(x);
    }
    // All (B, T, Vp) logits of the last forward(), fp32.
    std::vector<float> logits(int B, int T) const {
        std::vector<floatX> x(size_t(B) * T * config_.padded_vocab_size);
        CUDA_CHECK(cudaMemcpyAsync(x.data(), a_.logits, x.size() * sizeof(floatX), cudaMemcpyDeviceToHost, env_.stream));
        CUDA_CHECK(cudaStreamSynchronize(env_.stream));
        return host_from_floatX(x);
    }
    std::vector<float> download_grads() const {
        std::vector<float> g(layout_.num_params);
        CUDA_CHECK(cudaMemcpyAsync(g.data(), grads_, g.size() * sizeof(float), cudaMemcpyDeviceToHost, env_.stream));
        CUDA_CHECK(cudaStreamSynchronize(env_.stream));
        return g;
    }

    // Keeps the padded rows [vocab_size, padded_vocab_size) of wte at zero in the parameters and in `master`
    // (fp32, same layout; may be null), as llm.c files expect. A sharded step's master weights are the flat range
    // [master_begin, master_begin + master_count) of the layout: the rows inside it are zeroed.
    void zero_padded_vocab_rows(float* master, size_t master_begin = 0, size_t master_count = SIZE_MAX) {
        const size_t C = config_.channels;
        const size_t begin = layout_.kind_offset[int(ParamKind::wte)] + size_t(config_.vocab_size) * C;
        const size_t count = size_t(config_.padded_vocab_size - config_.vocab_size) * C;
        if (count == 0) return;
        CUDA_CHECK(cudaMemsetAsync(params_ + begin, 0, count * sizeof(floatX), env_.stream));
        const size_t lo = std::max(begin, master_begin);
        const size_t hi = std::min(begin + count, master_count == SIZE_MAX ? SIZE_MAX : master_begin + master_count);
        if (master && lo < hi)
            CUDA_CHECK(cudaMemsetAsync(master + (lo - master_begin), 0, (hi - lo) * sizeof(float), env_.stream));
    }

private:
    // A kind's block in the parameters or gradients; null for a kind the family does not have (OLMo's wpe, biases
    // and LayerNorm weights), which the kernels read as "none".
    template <typename T>
    T* at(T* base, ParamKind kind) const {
        return layout_.kind_numel[int(kind)] > 0 ? base + layout_.kind_offset[int(kind)] : nullptr;
    }
    // Tensor of one layer: kind block + layer * per-layer size (null for an absent kind).
    size_t layer_numel(ParamKind kind) const { return layout_.kind_numel[int(kind)] / config_.num_layers; }
    size_t layer_offset(ParamKind kind, int l) const { return layout_.kind_offset[int(kind)] + size_t(l) * layer_numel(kind); }
    template <typename T>
    T* layer(T* base, ParamKind kind, int l) const {
        return layout_.kind_numel[int(kind)] > 0 ? base + layer_offset(kind, l) : nullptr;
    }

    struct Activations {
        floatX *encoded;                       // (N, C)
        floatX *ln1;                           // (L, N, C)
        float *ln1_mean, *ln1_rstd;            // (L, N)
        floatX *qkvr;                          // (L, 3, N, C) q, k, v permuted per head; flash: (L, N, 3C) qkv
        floatX *att;                           // (L, B, NH, T, T); flash: none
        float *lse;                            // flash: (L, B, NH, T) log-sum-exp per attention row
        floatX *atty;                          // (L, N, C)
        floatX *residual2;                     // (L, N, C)
        floatX *ln2;                           // (L, N, C)
        float *ln2_mean, *ln2_rstd;            // (L, N)
        floatX *fch;                           // (L, N, F) the fc product: GPT-2 pre-GELU (F = 4C), OLMo [x | gate]
                                               // (F = 8C; its backward overwrites it with dfch)
        floatX *fch_gelu;                      // (L, N, 4C) the activation: GELU, or OLMo's SwiGLU
        floatX *residual3;                     // (L, N, C)
        floatX *lnf;                           // (N, C)
        float *lnf_mean, *lnf_rstd;            // (N)
        floatX *logits;                        // (N, Vp); dlogits after a training forward
        float *losses;                         // (N)
        floatX *qkv;                           // (N, 3C) forward scratch (clobbered by attention); flash: none
        floatX *btc;                           // (N, C) forward scratch: projection outputs
        floatX *preatt;                        // (B, NH, T, T) forward preatt / backward datt; flash: none
        floatX *dresidual;                     // (N, C) gradient of the residual stream
        floatX *dbtc;                          // (N, C)
        floatX *dbt4c;                         // (N, 4C) dfch (OLMo: d of the activation), then dqkv
        floatX *dqkvr;                         // (3, N, C); flash: none
        floatX *dy;                            // (N, C) attention backward scratch; flash: none
        float *flash_scratch;                  // flash: the backward's delta and dQ sums (flash_attention.cuh)
        float *fscratch;                       // column-reduction partials
        int *inputs, *targets;                 // (N)
        int *encoder_plan;                     // EncoderBackwardPlan::device_ints(N)
        float *rope_table;                     // OLMo: (max_T, hs / 2) {cos, sin} pairs; GPT-2: none
    };

    void plan_activations() {
        const size_t L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
        const size_t N = size_t(max_B_) * max_T_, Vp = config_.padded_vocab_size;
        const size_t att = flash_attention_ ? 0 : size_t(max_B_) * NH * max_T_ * max_T_;
        const size_t matmul_only = flash_attention_ ? 0 : 1;  // buffers only the matmul attention uses
        const size_t flash_only = flash_attention_ ? 1 : 0;
        const size_t F = config_.mlp_input_rows(), olmo_only = config_.is_olmo() ? 1 : 0;
        n_cap_ = N;
        att_cap_ = att;
        auto& m = act_mem_;
        m.add(&a_.encoded, N * C);
        m.add(&a_.ln1, L * N * C);
        m.add(&a_.ln1_mean, L * N);
        m.add(&a_.ln1_rstd, L * N);
        m.add(&a_.qkvr, L * 3 * N * C);
        m.add(&a_.att, L * att);
        m.add(&a_.lse, flash_only * L * N * NH);
        m.add(&a_.atty, L * N * C);
        m.add(&a_.residual2, L * N * C);
        m.add(&a_.ln2, L * N * C);
        m.add(&a_.ln2_mean, L * N);
        m.add(&a_.ln2_rstd, L * N);
        m.add(&a_.fch, L * N * F);
        m.add(&a_.fch_gelu, L * N * 4 * C);
        m.add(&a_.residual3, L * N * C);
        m.add(&a_.lnf, N * C);
        m.add(&a_.lnf_mean, N);
        m.add(&a_.lnf_rstd, N);
        m.add(&a_.logits, N * Vp);
        m.add(&a_.losses, N);
        m.add(&a_.qkv, matmul_only * N * 3 * C);
        m.add(&a_.btc, N * C);
        m.add(&a_.preatt, att);
        m.add(&a_.dresidual, N * C);
        m.add(&a_.dbtc, N * C);
        m.add(&a_.dbt4c, N * 4 * C);
        m.add(&a_.dqkvr, matmul_only * 3 * N * C);
        m.add(&a_.dy, matmul_only * N * C);
        m.add(&a_.flash_scratch, flash_only * flash_attention_backward_scratch_floats(max_B_, max_T_, int(NH), flash_dq_));
        const int Ni = static_cast<int>(N), Ci = static_cast<int>(C);
        size_t fs = layernorm_backward_scratch_floats(Ni, Ci);
        for (int oc : {3 * Ci, Ci, 4 * Ci, int(F)}) fs = std::max(fs, matmul_backward_scratch_floats(Ni, oc));
        if (olmo_only) fs = std::max(fs, rmsnorm_backward_scratch_floats(Ni, Ci));
        m.add(&a_.fscratch, fs);
        m.add(&a_.inputs, N);
        m.add(&a_.targets, N);
        m.add(&a_.encoder_plan, EncoderBackwardPlan::device_ints(Ni));
        m.add(&a_.rope_table, olmo_only * size_t(max_T_) * (C / NH));
        m.allocate("activations (B=" + std::to_string(max_B_) + ", T=" + std::to_string(max_T_) +
                   "; lower --batch_size or --seq_len if this does not fit)");
    }

    // Per-layer slices of the activations (strides use the capacity, so any B*T <= capacity fits).
    floatX* lslice(floatX* base, int l, size_t per_token) const { return base + size_t(l) * n_cap_ * per_token; }
    float* lstat(float* base, int l) const { return base + size_t(l) * n_cap_; }
    float* lse_slice(int l) const { return a_.lse + size_t(l) * n_cap_ * config_.num_heads; }
    // Layer l's activations, as its forward writes them and its backward reads them.
    struct LayerActs {
        const floatX* residual;  // the layer's input stream: the embeddings, or layer l - 1's residual3
        floatX *ln1, *qkvr, *att, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
        float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    };
    LayerActs layer_acts(int l) const {
        const size_t C = size_t(config_.channels);
        return {.residual = l == 0 ? a_.encoded : lslice(a_.residual3, l - 1, C),
                .ln1 = lslice(a_.ln1, l, C),
                .qkvr = lslice(a_.qkvr, l, 3 * C),
                .att = a_.att + size_t(l) * att_cap_,
                .atty = lslice(a_.atty, l, C),
                .residual2 = lslice(a_.residual2, l, C),
                .ln2 = lslice(a_.ln2, l, C),
                .fch = lslice(a_.fch, l, size_t(config_.mlp_input_rows())),
                .fch_gelu = lslice(a_.fch_gelu, l, 4 * C),
                .residual3 = lslice(a_.residual3, l, C),
                .ln1_mean = lstat(a_.ln1_mean, l),
                .ln1_rstd = lstat(a_.ln1_rstd, l),
                .ln2_mean = lstat(a_.ln2_mean, l),
                .ln2_rstd = lstat(a_.ln2_rstd, l)};
    }

    // The batch checked and queued for upload (outside any graph: the copies leave pinned staging buffers).
    // Returns the number of positions with a target (0 without targets).
    size_t stage_batch(const int* inputs, const int* targets, int B, int T) {
        LLMC_CHECK(B > 0 && T > 0 && B <= max_B_ && T <= max_T_ && size_t(B) * T <= n_cap_,
                   "forward: batch " + std::to_string(B) + "x" + std::to_string(T) + " exceeds the allocated " +
                       std::to_string(max_B_) + "x" + std::to_string(max_T_));
        const int V = config_.vocab_size, N = B * T;
        for (int i = 0; i < N; i++)
            LLMC_CHECK(inputs[i] >= 0 && inputs[i] < V,
                       "forward: token id out of range [0, " + std::to_string(V) + ") at position " + std::to_string(i));
        const size_t count = targets ? count_targets(targets, size_t(N), V, "forward") : 0;
        inputs_upload_.upload(a_.inputs, inputs, size_t(N), env_.stream);
        if (targets) targets_upload_.upload(a_.targets, targets, size_t(N), env_.stream);
        return count;
    }

    // ---- Each family's norm: GPT-2's affine LayerNorm (layernorm.cuh, as before OLMo), OLMo's LayerNorm without
    // parameters or RMSNorm (norms.cuh). mean is not kept by RMSNorm; weight and bias are null where absent.

    void norm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                      const floatX* bias, int N) {
        const int C = config_.channels;
        cudaStream_t s = env_.stream;
        if (!config_.is_olmo()) layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, s);
        else if (config_.norm == NormKind::rmsnorm) rmsnorm_forward(out, rstd, inp, weight, N, C, s);
        else layernorm_noaffine_forward(out, mean, rstd, inp, N, C, s);
    }
    // residual = inp1 + inp2 (rounded to floatX), then out = the norm of residual, in one pass.
    void fused_residual_norm_forward(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* inp1,
                                     const floatX* inp2, const floatX* weight, const floatX* bias, int N) {
        const int C = config_.channels;
        cudaStream_t s = env_.stream;
        if (!config_.is_olmo())
            fused_residual_layernorm_forward(residual, out, mean, rstd, inp1, inp2, weight, bias, N, C, s);
        else if (config_.norm == NormKind::rmsnorm)
            fused_residual_rmsnorm_forward(residual, out, rstd, inp1, inp2, weight, N, C, s);
        else
            fused_residual_layernorm_noaffine_forward(residual, out, mean, rstd, inp1, inp2, N, C, s);
    }
    // dinp += the norm's input gradient; its weight (and bias) gradients written or added (accumulate). GPT-2's
    // LayerNorm backward also sums the updated dinp's columns into dinp_sum: the bias gradient of the projection
    // whose output that residual gradient is (null for OLMo, which has no biases).
    void norm_backward(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                       const floatX* weight, const float* mean, const float* rstd, int N, float* dinp_sum,
                       bool accumulate) {
        const int C = config_.channels;
        cudaStream_t s = env_.stream;
        if (!config_.is_olmo())
            layernorm_backward(dinp, dweight, dbias, a_.fscratch, dout, inp, weight, mean, rstd, N, C, s, dinp_sum,
                               accumulate);
        else if (config_.norm == NormKind::rmsnorm)
            rmsnorm_backward(dinp, dweight, a_.fscratch, dout, inp, weight, rstd, N, C, s, accumulate);
        else
            layernorm_noaffine_backward(dinp, dout, inp, mean, rstd, N, C, s);
    }

    // The forward's kernels on the staged batch (the losses too when with_loss: the staged targets; with
    // write_dlogits the logits become their gradient, dloss per position with a target).
    void forward_kernels(int B, int T, bool with_loss, bool write_dlogits, float dloss) {
        const int L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
        const int V = config_.vocab_size, Vp = config_.padded_vocab_size, F = config_.mlp_input_rows();
        const int N = B * T;
        cudaStream_t s = env_.stream;
        floatX* p = params_;

        // OLMo has no wpe (null): the token embeddings alone
        encoder_forward(a_.encoded, a_.inputs, at(p, ParamKind::wte), at(p, ParamKind::wpe), B, T, C, s);
        norm_forward(lslice(a_.ln1, 0, C), lstat(a_.ln1_mean, 0), lstat(a_.ln1_rstd, 0), a_.encoded,
                     layer(p, ParamKind::ln1w, 0), layer(p, ParamKind::ln1b, 0), N);
        for (int l = 0; l < L; l++) {
            const LayerActs la = layer_acts(l);

            // Flash reads qkv from the layer's qkvr slice, which the backward reads too; the matmul attention
            // permutes the qkv scratch into qkvr. OLMo's RoPE turns q and k in place before either reads them.
            floatX* qkv = flash_attention_ ? la.qkvr : a_.qkv;
            matmul_forward(env_, qkv, la.ln1, layer(p, ParamKind::qkvw, l), layer(p, ParamKind::qkvb, l), N, C, 3 * C);
            if (a_.rope_table) rope_forward(qkv, a_.rope_table, B, T, C, NH, s);
            if (flash_attention_)
                flash_attention_forward(env_, la.atty, lse_slice(l), la.qkvr, B, T, C, NH);
            else
                attention_forward(env_, la.atty, la.qkvr, la.att, a_.preatt, a_.qkv, B, T, C, NH);
            matmul_forward(env_, a_.btc, la.atty, layer(p, ParamKind::attprojw, l), layer(p, ParamKind::attprojb, l), N,
                           C, C);
            fused_residual_norm_forward(la.residual2, la.ln2, la.ln2_mean, la.ln2_rstd, la.residual, a_.btc,
                                        layer(p, ParamKind::ln2w, l), layer(p, ParamKind::ln2b, l), N);
            if (config_.is_olmo()) {  // fch = [x | gate] (N, 8C), then silu(gate) * x (N, 4C)
                matmul_forward(env_, la.fch, la.ln2, layer(p, ParamKind::fcw, l), nullptr, N, C, F);
                swiglu_forward(la.fch_gelu, la.fch, N, 4 * C, s);
            } else {  // the GELU as the product's epilogue (--gelu_fusion) or its own kernel
                matmul_forward(env_, la.fch_gelu, la.ln2, layer(p, ParamKind::fcw, l), layer(p, ParamKind::fcb, l), N, C,
                               4 * C, la.fch, gelu_fusion_ >= 1);
            }
            matmul_forward(env_, a_.btc, la.fch_gelu, layer(p, ParamKind::fcprojw, l), layer(p, ParamKind::fcprojb, l),
                           N, 4 * C, C);
            if (l + 1 < L) {
                fused_residual_norm_forward(la.residual3, lslice(a_.ln1, l + 1, C), lstat(a_.ln1_mean, l + 1),
                                            lstat(a_.ln1_rstd, l + 1), la.residual2, a_.btc,
                                            layer(p, ParamKind::ln1w, l + 1), layer(p, ParamKind::ln1b, l + 1), N);
            } else {
                fused_residual_norm_forward(la.residual3, a_.lnf, a_.lnf_mean, a_.lnf_rstd, la.residual2, a_.btc,
                                            at(p, ParamKind::lnfw), at(p, ParamKind::lnfb), N);
            }
        }
        matmul_forward(env_, a_.logits, a_.lnf, at(p, ParamKind::wte), nullptr, N, C, Vp);
        if (with_loss)
            fused_classifier(env_, a_.logits, a_.losses, a_.targets, dloss, N, V, Vp, write_dlogits);
    }

    // --cuda_graph: forward_kernels and backward_layers of a training micro-step, as one graph replayed per
    // shape (B, T, dloss: the classifier's argument, loss_scale over the batch's targets, which OLMo rows keep
    // at B*(T-1)), one for the micro-steps that write the gradients and one for those that add to them; the
    // first micro-step of each runs the kernels directly, the second captures them.
    void forward_backward_layers_graph(int B, int T, float dloss, bool accumulate) {
        StepGraph& sg = step_graphs_[accumulate ? 1 : 0];
        if (!sg.is_for(B, T, dloss)) {
            sg.reset(B, T, dloss);
            forward_kernels(B, T, true, true, dloss);  // a first run: cuBLASLt picks and caches its algorithms
            backward_layers(B, T, {}, accumulate);
            return;
        }
        if (!sg.exec) {
            cudaGraph_t graph = nullptr;
            CUDA_CHECK(cudaStreamBeginCapture(env_.stream, cudaStreamCaptureModeRelaxed));
            forward_kernels(B, T, true, true, dloss);
            backward_layers(B, T, {}, accumulate);
            CUDA_CHECK(cudaStreamEndCapture(env_.stream, &graph));
            const cudaError_t instantiated = cudaGraphInstantiate(&sg.exec, graph, 0);
            (void)cudaGraphDestroy(graph);
            CUDA_CHECK(instantiated);
        }
        CUDA_CHECK(cudaGraphLaunch(sg.exec, env_.stream));
    }

    // The backward from the classifier down to layer 0 (on_final: told of wte_early once the classifier is done,
    // then of each layer's gradients as it is done). accumulate false: every gradient of these layers (and wte's
    // classifier part) written, not added to.
    void backward_layers(int B, int T, const GradsFinal& on_final, bool accumulate,
                         std::span<const ParamRange> wte_early = {}) {
        const int L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
        const int Vp = config_.padded_vocab_size, F = config_.mlp_input_rows();
        const int N = B * T;
        cudaStream_t s = env_.stream;
        floatX* p = params_;
        float* g = grads_;
        float* fs = a_.fscratch;
        CUDA_CHECK(cudaMemsetAsync(a_.dresidual, 0, size_t(N) * C * sizeof(floatX), s));

        // classifier (tied wte): logits hold dlogits. The weight gradient before the input gradient, so that the
        // early wte rows travel during the input gradient's product too.
        matmul_backward(env_, nullptr, at(g, ParamKind::wte), nullptr, fs, a_.logits, a_.lnf, at(p, ParamKind::wte), N,
                        C, Vp, {.accumulate = accumulate});
        if (on_final && !wte_early.empty()) on_final(wte_early);
        matmul_backward(env_, a_.dbtc, nullptr, nullptr, fs, a_.logits, a_.lnf, at(p, ParamKind::wte), N, C, Vp);
        // Each GPT-2 LayerNorm backward also sums its updated dresidual's columns: the bias gradient of the
        // projection whose output that residual gradient is (the last fcproj here, then each layer's attproj and
        // the fcproj below it), which those matmul backwards then skip.
        norm_backward(a_.dresidual, at(g, ParamKind::lnfw), at(g, ParamKind::lnfb), a_.dbtc,
                      lslice(a_.residual3, L - 1, C), at(p, ParamKind::lnfw), a_.lnf_mean, a_.lnf_rstd, N,
                      layer(g, ParamKind::fcprojb, L - 1), accumulate);
        for (int l = L - 1; l >= 0; l--) {
            const LayerActs la = layer_acts(l);

            // MLP: residual3 = residual2 + fcproj(act(fc(ln2(residual2))))
            if (config_.is_olmo()) {
                // the activation's gradient into dbt4c, then SwiGLU's backward writes dfch (N, 8C) over fch, which
                // nothing reads after it (the fc weight gradient takes ln2)
                matmul_backward(env_, a_.dbt4c, layer(g, ParamKind::fcprojw, l), nullptr, fs, a_.dresidual, la.fch_gelu,
                                layer(p, ParamKind::fcprojw, l), N, 4 * C, C, {.accumulate = accumulate});
                swiglu_backward(la.fch, a_.dbt4c, la.fch, N, 4 * C, s);
                matmul_backward(env_, a_.dbtc, layer(g, ParamKind::fcw, l), nullptr, fs, la.fch, la.ln2,
                                layer(p, ParamKind::fcw, l), N, C, F, {.accumulate = accumulate});
            } else {
                // dfch: the DGELU epilogue of this product (--gelu_fusion both), or the product then the GELU backward
                matmul_backward(env_, a_.dbt4c, layer(g, ParamKind::fcprojw, l), nullptr, fs, a_.dresidual, la.fch_gelu,
                                layer(p, ParamKind::fcprojw, l), N, 4 * C, C,
                                {.pre_gelu = la.fch, .fuse_dgelu = gelu_fusion_ >= 2, .accumulate = accumulate});
                matmul_backward(env_, a_.dbtc, layer(g, ParamKind::fcw, l), layer(g, ParamKind::fcb, l), fs, a_.dbt4c,
                                la.ln2, layer(p, ParamKind::fcw, l), N, C, 4 * C,
                                {.fuse_bias_grad = bias_grad_epilogue_, .accumulate = accumulate});
            }
            norm_backward(a_.dresidual, layer(g, ParamKind::ln2w, l), layer(g, ParamKind::ln2b, l), a_.dbtc,
                          la.residual2, layer(p, ParamKind::ln2w, l), la.ln2_mean, la.ln2_rstd, N,
                          layer(g, ParamKind::attprojb, l), accumulate);
            // attention: residual2 = residual + attproj(attention(qkv(ln1(residual))))
            matmul_backward(env_, a_.dbtc, layer(g, ParamKind::attprojw, l), nullptr, fs, a_.dresidual, la.atty,
                            layer(p, ParamKind::attprojw, l), N, C, C, {.accumulate = accumulate});
            if (flash_attention_)
                flash_attention_backward(env_, a_.dbt4c, a_.flash_scratch, a_.dbtc, la.atty, la.qkvr, lse_slice(l), B, T, C,
                                         NH, flash_dq_);
            else
                attention_backward(env_, a_.dbt4c, a_.dqkvr, a_.preatt, a_.dy, a_.dbtc, la.qkvr, la.att, B, T, C, NH);
            // dqkv holds the gradients of the rotated q and k: OLMo turns them back to the qkv product's
            if (a_.rope_table) rope_backward(a_.dbt4c, a_.rope_table, B, T, C, NH, s);
            matmul_backward(env_, a_.dbtc, layer(g, ParamKind::qkvw, l), layer(g, ParamKind::qkvb, l), fs, a_.dbt4c, la.ln1,
                            layer(p, ParamKind::qkvw, l), N, C, 3 * C,
                            {.fuse_bias_grad = bias_grad_epilogue_, .accumulate = accumulate});
            norm_backward(a_.dresidual, layer(g, ParamKind::ln1w, l), layer(g, ParamKind::ln1b, l), a_.dbtc,
                          la.residual, layer(p, ParamKind::ln1w, l), la.ln1_mean, la.ln1_rstd, N,
                          l > 0 ? layer(g, ParamKind::fcprojb, l - 1) : nullptr, accumulate);
            if (on_final) on_final(layout_.backward_ranges_of_layer(l));
        }
    }

    // The embeddings' backward (wte, and GPT-2's wpe, from the residual stream's gradient), with the plan of the
    // batch. accumulate false: wpe written (its rows from T on, positions the batch does not reach, zeroed), wte
    // added to the classifier's part, which backward_layers wrote.
    void backward_embeddings(int B, int T, const GradsFinal& on_final, bool accumulate,
                             std::span<const ParamRange> wte_early = {}) {
        float* g = grads_;
        float* dwpe = at(g, ParamKind::wpe);  // null for OLMo
        encoder_backward(at(g, ParamKind::wte), dwpe, a_.dresidual, plan_, a_.encoder_plan, B, T, config_.channels,
                         env_.stream, accumulate);
        const size_t reached = size_t(T) * config_.channels, wpe_numel = layout_.kind_numel[int(ParamKind::wpe)];
        if (dwpe && !accumulate && reached < wpe_numel)
            CUDA_CHECK(cudaMemsetAsync(dwpe + reached, 0, (wpe_numel - reached) * sizeof(float), env_.stream));
        if (on_final) on_final(layout_.backward_ranges_of_embeddings(wte_early));
    }

    // A queued micro-step's per-row losses into a free pinned slot (one per micro-step queued and not yet taken,
    // each of the batch capacity, kept for reuse once take_losses has read it), an event recorded behind the copy.
    void queue_losses(int N, size_t targets) {
        if (free_loss_slots_.empty()) {
            free_loss_slots_.push_back(loss_slots_.size());
            loss_slots_.push_back(LossSlot{PinnedHostBuffer<float>(n_cap_), CudaEvent()});
        }
        const size_t slot = free_loss_slots_.back();
        free_loss_slots_.pop_back();
        LossSlot& s = loss_slots_[slot];
        CUDA_CHECK(cudaMemcpyAsync(s.rows.data(), a_.losses, size_t(N) * sizeof(float), cudaMemcpyDeviceToHost,
                                   env_.stream));
        s.copied.record(env_.stream);
        queued_losses_.push_back(QueuedLoss{slot, N, targets});
    }
    // Mean of the per-row losses over the `targets` rows with one, summed on the host in a fixed order (a row
    // without a target adds its 0; synchronizes).
    float mean_loss(int N, size_t targets) {
        host_losses_.resize(N);
        CUDA_CHECK(cudaMemcpyAsync(host_losses_.data(), a_.losses, size_t(N) * sizeof(float), cudaMemcpyDeviceToHost, env_.stream));
        CUDA_CHECK(cudaStreamSynchronize(env_.stream));
        return mean_of_rows(host_losses_.data(), N, targets);
    }
    static float mean_of_rows(const float* losses, int N, size_t targets) {
        double sum = 0.0;
        for (int r = 0; r < N; r++) sum += losses[r];
        return static_cast<float>(mean_over_targets(sum, targets));
    }

    ModelConfig config_;
    ParamLayout layout_;
    CudaEnv& env_;
    int max_B_, max_T_;
    size_t n_cap_ = 0, att_cap_ = 0;
    int gelu_fusion_ = 0;
    bool flash_attention_ = false;
    flash::FlashDq flash_dq_ = flash::FlashDq::Shares;
    bool cuda_graph_ = false;
    bool bias_grad_epilogue_ = false;
    StepGraph step_graphs_[2];  // --cuda_graph: the captured micro-step, writing / adding to the gradients
    bool overwrite_grads_ = false;  // zero_grad() was called: the next backward writes the gradients
    DeviceArena param_mem_, grad_mem_, act_mem_;
    floatX* params_ = nullptr;
    float* grads_ = nullptr;
    Activations a_{};
    EncoderBackwardPlan plan_;
    PinnedUpload<int> inputs_upload_, targets_upload_, plan_upload_;
    std::vector<float> host_losses_;
    size_t target_count_ = 0;  // of the last forward()
    struct LossSlot {
        PinnedHostBuffer<float> rows;  // a micro-step's per-row losses
        CudaEvent copied;              // recorded behind their copy
    };
    struct QueuedLoss {
        size_t slot;  // into loss_slots_
        int rows;
        size_t targets;  // the rows with a target
    };
    std::vector<LossSlot> loss_slots_;    // queue_losses' pinned slots
    std::vector<size_t> free_loss_slots_;
    std::deque<QueuedLoss> queued_losses_;  // the micro-steps queued and not yet taken, in queue order
};

}  // namespace llmc
