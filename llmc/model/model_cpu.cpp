// The CPU model (see model_cpu.h): each family's block built from the layers in cpu_layers.h, and the
// activations, key/value cache and backward that run them.
#include "llmc/model/model_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "llmc/base/error.h"
#include "llmc/base/rope_table.h"
#include "llmc/base/targets.h"
#include "llmc/model/cpu_layers.h"
#include "llmc/model/model_init.h"

namespace llmc {

namespace {

// A per-layer slice of a kind the family may not have (null: then no slice either).
template <class T>
T* at(T* kind, size_t offset) {
    return kind != nullptr ? kind + offset : nullptr;
}

}  // namespace

ModelCpu::ModelCpu(const ModelConfig& config, ModelUse use)
    : config_(config), use_(use), layout_(ParamLayout::of(config)), params_(layout_.num_params, 0.0f),
      grads_(use == ModelUse::training ? layout_.num_params : 0, 0.0f) {
    if (!config.learned_positions())
        rope_table_ = rope_table(config.max_seq_len, config.head_size(), config.rope_theta);
    weights_ = point_weights(layout_, params_.data());
    if (use == ModelUse::training) weight_grads_ = point_weights(layout_, grads_.data());
}

ModelCpu::Weights ModelCpu::point_weights(const ParamLayout& layout, float* base) {
    auto at = [&](ParamKind kind) -> float* {  // null for a kind the family does not have
        return layout.kind_numel[static_cast<int>(kind)] > 0 ? base + layout.kind_offset[static_cast<int>(kind)] : nullptr;
    };
    return Weights{at(ParamKind::wte),      at(ParamKind::wpe),      at(ParamKind::ln1w),    at(ParamKind::ln1b),
                   at(ParamKind::qkvw),     at(ParamKind::qkvb),     at(ParamKind::attprojw),
                   at(ParamKind::attprojb), at(ParamKind::ln2w),     at(ParamKind::ln2b),    at(ParamKind::fcw),
                   at(ParamKind::fcb),      at(ParamKind::fcprojw),  at(ParamKind::fcprojb), at(ParamKind::lnfw),
                   at(ParamKind::lnfb)};
}

void ModelCpu::init_random(uint64_t seed) { init_params(layout_, params_, seed); }

void ModelCpu::zero_padded_vocab_rows(std::span<float> shared) {
    const size_t C = config_.channels;
    const size_t begin = static_cast<size_t>(config_.vocab_size) * C, end = static_cast<size_t>(config_.padded_vocab_size) * C;
    std::fill(weights_.wte + begin, weights_.wte + end, 0.0f);
    if (shared.empty() || shared.data() == params_.data()) return;
    LLMC_CHECK(shared.size() == params_.size(), "zero_padded_vocab_rows: shared weights of another layout");
    std::fill(shared.begin() + static_cast<std::ptrdiff_t>(layout_.kind_offset[int(ParamKind::wte)] + begin),
              shared.begin() + static_cast<std::ptrdiff_t>(layout_.kind_offset[int(ParamKind::wte)] + end), 0.0f);
}

void ModelCpu::zero_grad() {
    LLMC_CHECK(use_ == ModelUse::training, "ModelCpu::zero_grad: an inference model has no gradients");
    float* g = grads_.data();
    const size_t n = grads_.size();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] = 0.0f;
}

void ModelCpu::prepare_activations(int B, int T) {
    const size_t N = static_cast<size_t>(B) * T, L = kept_layers(), C = config_.channels,
                 H = config_.num_heads, Vp = config_.padded_vocab_size, F = config_.mlp_input_rows();
    const size_t att = static_cast<size_t>(B) * H * T * T;
    const size_t swiglu = config_.is_olmo() ? 1 : 0;  // OLMo's backward takes the activation's gradient apart
    const size_t backward = use_ == ModelUse::training ? 1 : 0;  // an inference model's d* views are empty
    // Order and sizes of the views in Activations; laid out twice: once to count, once to point.
    float* Activations::*const members[] = {
        &Activations::encoded,  &Activations::ln1,       &Activations::ln1_mean,  &Activations::ln1_rstd,
        &Activations::qkv,      &Activations::att,       &Activations::atty,      &Activations::residual2,
        &Activations::ln2,      &Activations::ln2_mean,  &Activations::ln2_rstd,  &Activations::fch,
        &Activations::fch_gelu, &Activations::residual3, &Activations::lnf,       &Activations::lnf_mean,
        &Activations::lnf_rstd, &Activations::logits,    &Activations::last_logits, &Activations::logsumexp,
        &Activations::losses,   &Activations::dlogits,   &Activations::dresidual, &Activations::dln,
        &Activations::datty,    &Activations::dqkv,      &Activations::dfch,      &Activations::datt_row,
        &Activations::dfch_act,
    };
    const size_t logit_rows = backward ? N : std::min(N, kClassifierRows);
    const size_t sizes[] = {
        N * C,  L * N * C, L * N,     L * N,     L * N * 3 * C, L * att,   L * N * C,
        L * N * C, L * N * C, L * N,  L * N,     L * N * F, L * N * 4 * C, L * N * C,
        N * C,  N,         N,         logit_rows * Vp, size_t(B) * Vp, N, N,     backward * N * Vp,
        backward * N * C, backward * N * C, backward * N * C, backward * N * 3 * C, backward * N * F,
        backward * B * H * T, backward * swiglu * N * 4 * C,
    };
    static_assert(std::size(members) == std::size(sizes));
    size_t total = 0;
    for (size_t s : sizes) total += cpu::round_up16(s);
    if (total > act_capacity_) {
        act_memory_.reset();  // free the old block before asking for the larger one
        float* block = static_cast<float*>(allocate_large(total * sizeof(float)));
        LLMC_CHECK(block != nullptr, "ModelCpu: cannot allocate " + std::to_string(total * sizeof(float) >> 20) +
                                         " MiB of activations for B=" + std::to_string(B) + " T=" +
                                         std::to_string(T));
        act_memory_.reset(block);
        act_capacity_ = total;
    }
    float* cursor = act_memory_.get();
    for (size_t i = 0; i < std::size(members); i++) {
        acts_.*members[i] = cursor;
        cursor += cpu::round_up16(sizes[i]);
    }
    batch_ = B;
    seq_len_ = T;
    num_tokens_ = N;
}

float ModelCpu::forward(const int* inputs, const int* targets, int B, int T) {
    return run_forward(inputs, targets, B, T, false);
}

float ModelCpu::run_forward(const int* inputs, const int* targets, int B, int T, bool fill_cache) {
    LLMC_CHECK(B > 0 && T > 0, "ModelCpu::forward: batch size and sequence length must be positive (B=" +
                                   std::to_string(B) + " T=" + std::to_string(T) + ")");
    LLMC_CHECK(T <= config_.max_seq_len, "ModelCpu::forward: sequence length T=" + std::to_string(T) +
                                             " exceeds the model's max_seq_len " +
                                             std::to_string(config_.max_seq_len));
    const size_t N = static_cast<size_t>(B) * T;
    const int V = config_.vocab_size;
    for (size_t i = 0; i < N; i++)
        LLMC_CHECK(inputs[i] >= 0 && inputs[i] < V, "ModelCpu::forward: input token id " + std::to_string(inputs[i]) +
                                                        " at position " + std::to_string(i) +
                                                        " is outside the vocabulary [0, " + std::to_string(V) + ")");
    const size_t target_count = targets ? count_targets(targets, N, V, "ModelCpu::forward") : 0;
    prepare_activations(B, T);
    const cpu::SingleThreadedBlas single_threaded_blas;
    inputs_.assign(inputs, inputs + N);
    have_targets_ = targets != nullptr;
    target_count_ = target_count;
    if (have_targets_) targets_.assign(targets, targets + N);

    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 Vp = config_.padded_vocab_size;
    const Weights& w = weights_;
    const Activations& a = acts_;
    const size_t NC = N * C, att_per_layer = static_cast<size_t>(B) * H * T * T;

    // Layer l's activations go to slot s: its own in a training model, the one slot in an inference model (the
    // residual3 a layer reads is overwritten only by that layer's last matmul, which no longer needs it).
    const size_t slots = kept_layers();
    const size_t F = config_.mlp_input_rows();
    cpu::encoder_forward(a.encoded, inputs_.data(), w.wte, w.wpe, B, T, C);
    for (size_t l = 0; l < L; l++) {
        const size_t s = l % slots;
        const float* residual = l == 0 ? a.encoded : a.residual3 + ((l - 1) % slots) * NC;
        float* ln1 = a.ln1 + s * NC;
        float* qkv = a.qkv + s * 3 * NC;
        float* atty = a.atty + s * NC;
        float* residual2 = a.residual2 + s * NC;
        float* ln2 = a.ln2 + s * NC;
        float* fch = a.fch + s * N * F;
        float* fch_gelu = a.fch_gelu + s * 4 * NC;
        norm_forward(ln1, a.ln1_mean + s * N, a.ln1_rstd + s * N, residual, at(w.ln1w, l * C), at(w.ln1b, l * C), N);
        cpu::matmul_forward(qkv, ln1, w.qkvw + l * 3 * C * C, at(w.qkvb, l * 3 * C), nullptr, N, C, 3 * C);
        if (!rope_table_.empty()) cpu::rope_forward(qkv, rope_table_.data(), B, T, C, H);
        if (fill_cache) cache_keys_values(l, qkv, N);
        cpu::attention_forward(atty, a.att + s * att_per_layer, qkv, B, T, C, H);
        cpu::matmul_forward(residual2, atty, w.attprojw + l * C * C, at(w.attprojb, l * C), residual, N, C, C);
        norm_forward(ln2, a.ln2_mean + s * N, a.ln2_rstd + s * N, residual2, at(w.ln2w, l * C), at(w.ln2b, l * C), N);
        cpu::matmul_forward(fch, ln2, w.fcw + l * F * C, at(w.fcb, l * F), nullptr, N, C, F);
        activation_forward(fch_gelu, fch, N);
        cpu::matmul_forward(a.residual3 + s * NC, fch_gelu, w.fcprojw + l * 4 * C * C, at(w.fcprojb, l * C),
                            residual2, N, 4 * C, C);
    }
    norm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + ((L - 1) % slots) * NC, w.lnfw, w.lnfb, N);
    // The classifier, kClassifierRows rows at a time: into their place in a training model's logits (the backward
    // reads them all), into the one block of an inference model's. Both cut the rows alike, so that their bits
    // agree: OpenBLAS rounds a row differently in matrices of different heights (it has kernels for small ones).
    const size_t block = std::min(N, kClassifierRows), Tn = size_t(T);
    for (size_t r0 = 0; r0 < N; r0 += block) {
        const size_t rows = std::min(block, N - r0);
        float* logits = use_ == ModelUse::training ? a.logits + r0 * Vp : a.logits;
        cpu::matmul_forward(logits, a.lnf + r0 * C, w.wte, nullptr, nullptr, rows, C, Vp);
        if (have_targets_)
            cpu::crossentropy_forward(a.losses + r0, a.logsumexp + r0, logits, targets_.data() + r0, rows,
                                 config_.vocab_size, Vp);
        for (size_t b = r0 / Tn; b < size_t(B) && b * Tn + Tn - 1 < r0 + rows; b++)
            std::memcpy(a.last_logits + b * Vp, logits + (b * Tn + Tn - 1 - r0) * Vp, Vp * sizeof(float));
    }
    return have_targets_ ? static_cast<float>(cpu::mean_loss(a.losses, N, target_count_)) : 0.0f;
}

void ModelCpu::prepare_token_cache() {
    if (cache_memory_) return;
    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 T = config_.max_seq_len, Vp = config_.padded_vocab_size;
    float* TokenCache::*const members[] = {
        &TokenCache::keys, &TokenCache::values,  &TokenCache::x,        &TokenCache::residual2, &TokenCache::ln,
        &TokenCache::ln_mean, &TokenCache::ln_rstd, &TokenCache::qkv,   &TokenCache::atty,      &TokenCache::fch,
        &TokenCache::fch_gelu, &TokenCache::att,   &TokenCache::logits,
    };
    const size_t F = config_.mlp_input_rows();
    const size_t sizes[] = {L * T * C, L * T * C, C, C, C, 1, 1, 3 * C, C, F, 4 * C, H * T, Vp};
    static_assert(std::size(members) == std::size(sizes));
    size_t total = 0;
    for (size_t n : sizes) total += cpu::round_up16(n);
    float* block = static_cast<float*>(allocate_large(total * sizeof(float)));
    LLMC_CHECK(block != nullptr, "ModelCpu: cannot allocate " + std::to_string(total * sizeof(float) >> 20) +
                                     " MiB for the key/value cache");
    cache_memory_.reset(block);
    for (size_t i = 0; i < std::size(members); i++) {
        cache_.*members[i] = block;
        block += cpu::round_up16(sizes[i]);
    }
}

std::span<const float> ModelCpu::start_sequence(std::span<const int> tokens) {
    LLMC_CHECK(!tokens.empty(), "ModelCpu::start_sequence: no tokens");
    const int T = static_cast<int>(tokens.size());
    prepare_token_cache();
    cached_tokens_ = 0;  // until the forward has filled the cache
    run_forward(tokens.data(), nullptr, 1, T, true);  // checks T and the token ids
    cached_tokens_ = T;
    return last_logits();
}

void ModelCpu::cache_keys_values(size_t layer, const float* qkv, size_t tokens) {
    const size_t C = config_.channels, max_T = config_.max_seq_len;
    for (size_t t = 0; t < tokens; t++) {
        const float* qkv_row = qkv + t * 3 * C;
        std::memcpy(cache_.keys + (layer * max_T + t) * C, qkv_row + C, C * sizeof(float));
        std::memcpy(cache_.values + (layer * max_T + t) * C, qkv_row + 2 * C, C * sizeof(float));
    }
}

std::span<const float> ModelCpu::continue_sequence(std::span<const int> context, int window) {
    LLMC_CHECK(window >= 1 && window <= config_.max_seq_len && !context.empty(),
               "ModelCpu::continue_sequence: no context, or window " + std::to_string(window) +
                   " outside [1, max_seq_len]");
    if (cached_tokens_ < window) return append(context.back());
    return start_sequence(context.last(std::min(context.size(), static_cast<size_t>(window))));
}

void ModelCpu::truncate_sequence(int n) {
    LLMC_CHECK(n >= 1 && n <= cached_tokens_, "ModelCpu::truncate_sequence: " + std::to_string(n) +
                                                  " is not in [1, " + std::to_string(cached_tokens_) + "]");
    cached_tokens_ = n;
}

std::span<const float> ModelCpu::append(int token) {
    LLMC_CHECK(cached_tokens_ > 0, "ModelCpu::append: needs a start_sequence() first");
    LLMC_CHECK(cached_tokens_ < config_.max_seq_len, "ModelCpu::append: the sequence already holds max_seq_len " +
                                                         std::to_string(config_.max_seq_len) + " tokens");
    LLMC_CHECK(token >= 0 && token < config_.vocab_size,
               "ModelCpu::append: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                   std::to_string(config_.vocab_size) + ")");
    const cpu::SingleThreadedBlas single_threaded_blas;
    const size_t L = config_.num_layers, C = config_.channels, H = config_.num_heads,
                 max_T = config_.max_seq_len, Vp = config_.padded_vocab_size, position = cached_tokens_;
    const Weights& w = weights_;
    const TokenCache& c = cache_;
    const size_t F = config_.mlp_input_rows();
    cpu::encoder_forward(c.x, &token, w.wte, w.wpe ? w.wpe + position * C : nullptr, 1, 1, C);
    for (size_t l = 0; l < L; l++) {
        float* keys = c.keys + l * max_T * C;
        float* values = c.values + l * max_T * C;
        norm_forward(c.ln, c.ln_mean, c.ln_rstd, c.x, at(w.ln1w, l * C), at(w.ln1b, l * C), 1);
        cpu::matmul_forward(c.qkv, c.ln, w.qkvw + l * 3 * C * C, at(w.qkvb, l * 3 * C), nullptr, 1, C, 3 * C);
        if (!rope_table_.empty()) cpu::rope_forward(c.qkv, rope_table_.data(), 1, 1, C, H, position);
        std::memcpy(keys + position * C, c.qkv + C, C * sizeof(float));
        std::memcpy(values + position * C, c.qkv + 2 * C, C * sizeof(float));
        cpu::attention_forward_cached(c.atty, c.att, c.qkv, keys, values, position + 1, C, H);
        cpu::matmul_forward(c.residual2, c.atty, w.attprojw + l * C * C, at(w.attprojb, l * C), c.x, 1, C, C);
        norm_forward(c.ln, c.ln_mean, c.ln_rstd, c.residual2, at(w.ln2w, l * C), at(w.ln2b, l * C), 1);
        cpu::matmul_forward(c.fch, c.ln, w.fcw + l * F * C, at(w.fcb, l * F), nullptr, 1, C, F);
        activation_forward(c.fch_gelu, c.fch, 1);
        cpu::matmul_forward(c.x, c.fch_gelu, w.fcprojw + l * 4 * C * C, at(w.fcprojb, l * C), c.residual2, 1, 4 * C,
                            C);
    }
    norm_forward(c.ln, c.ln_mean, c.ln_rstd, c.x, w.lnfw, w.lnfb, 1);
    cpu::matmul_forward(c.logits, c.ln, w.wte, nullptr, nullptr, 1, C, Vp);
    cached_tokens_++;
    return {c.logits, Vp};
}

void ModelCpu::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, size_t N) const {
    if (config_.norm == NormKind::rmsnorm)
        cpu::rmsnorm_forward(out, rstd, inp, weight, N, config_.channels);
    else
        cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, config_.channels);
}

void ModelCpu::norm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, size_t N) const {
    if (config_.norm == NormKind::rmsnorm)
        cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, config_.channels);
    else
        cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, config_.channels);
}

void ModelCpu::activation_forward(float* out, const float* fch, size_t N) const {
    const size_t hidden = 4 * static_cast<size_t>(config_.channels);
    if (config_.is_olmo())
        cpu::swiglu_forward(out, fch, N, hidden);
    else
        cpu::gelu_forward(out, fch, N * hidden);
}

void ModelCpu::activation_backward(float* dfch, const float* dout, const float* fch, size_t N) const {
    const size_t hidden = 4 * static_cast<size_t>(config_.channels);
    if (config_.is_olmo())
        cpu::swiglu_backward(dfch, dout, fch, N, hidden);
    else
        cpu::gelu_backward(dfch, fch, N * hidden);  // dout is dfch itself
}

void ModelCpu::backward(float loss_scale, const GradsFinal& on_final, std::span<const ParamRange> wte_early) {
    LLMC_CHECK(use_ == ModelUse::training, "ModelCpu::backward: an inference model has no gradients");
    LLMC_CHECK(have_targets_, "ModelCpu::backward: needs a preceding forward() with targets");
    const size_t B = batch_, T = seq_len_, N = num_tokens_, L = config_.num_layers, C = config_.channels,
                 H = config_.num_heads, V = config_.vocab_size, Vp = config_.padded_vocab_size;
    const size_t NC = N * C, att_per_layer = B * H * T * T;
    const Weights& w = weights_;
    const Weights& g = weight_grads_;
    const Activations& a = acts_;
    const cpu::SingleThreadedBlas single_threaded_blas;

    const float dloss = loss_scale_per_target(loss_scale, target_count_);  // the mean over the targets
    cpu::crossentropy_softmax_backward(a.dlogits, a.logits, a.logsumexp, targets_.data(), dloss, N, V, Vp);
    // The classifier's weight gradient before its input gradient, so that the early wte rows travel during the
    // input gradient's product too.
    cpu::matmul_backward(nullptr, g.wte, nullptr, a.dlogits, a.lnf, w.wte, N, C, Vp);
    if (on_final && !wte_early.empty()) {
        LLMC_CHECK(layout_.wte_rows_untouched(wte_early, inputs_),
                   "ModelCpu::backward: an early wte range holds a row this batch's input tokens use");
        on_final(wte_early);
    }
    cpu::matmul_backward(a.dln, nullptr, nullptr, a.dlogits, a.lnf, w.wte, N, C, Vp);
    std::memset(a.dresidual, 0, NC * sizeof(float));
    norm_backward(a.dresidual, g.lnfw, g.lnfb, a.dln, a.residual3 + (L - 1) * NC, w.lnfw, a.lnf_mean, a.lnf_rstd, N);

    const size_t F = config_.mlp_input_rows();
    // dresidual holds the gradient of this layer's output; each sub-block adds its input gradient to it.
    for (size_t l = L; l-- > 0;) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * NC;
        // GPT-2's GELU gradient is taken in place in dfch; SwiGLU's reads its output's gradient from dfch_act
        float* dact = config_.is_olmo() ? a.dfch_act : a.dfch;
        cpu::matmul_backward(dact, g.fcprojw + l * 4 * C * C, at(g.fcprojb, l * C), a.dresidual,
                             a.fch_gelu + l * 4 * NC, w.fcprojw + l * 4 * C * C, N, 4 * C, C);
        activation_backward(a.dfch, dact, a.fch + l * N * F, N);
        cpu::matmul_backward(a.dln, g.fcw + l * F * C, at(g.fcb, l * F), a.dfch, a.ln2 + l * NC, w.fcw + l * F * C, N,
                             C, F);
        norm_backward(a.dresidual, at(g.ln2w, l * C), at(g.ln2b, l * C), a.dln, a.residual2 + l * NC, at(w.ln2w, l * C),
                      a.ln2_mean + l * N, a.ln2_rstd + l * N, N);
        cpu::matmul_backward(a.datty, g.attprojw + l * C * C, at(g.attprojb, l * C), a.dresidual, a.atty + l * NC,
                             w.attprojw + l * C * C, N, C, C);
        cpu::attention_backward(a.dqkv, a.datt_row, a.datty, a.qkv + l * 3 * NC, a.att + l * att_per_layer, B, T, C,
                                H);
        if (!rope_table_.empty()) cpu::rope_backward(a.dqkv, rope_table_.data(), B, T, C, H);
        cpu::matmul_backward(a.dln, g.qkvw + l * 3 * C * C, at(g.qkvb, l * 3 * C), a.dqkv, a.ln1 + l * NC,
                             w.qkvw + l * 3 * C * C, N, C, 3 * C);
        norm_backward(a.dresidual, at(g.ln1w, l * C), at(g.ln1b, l * C), a.dln, residual, at(w.ln1w, l * C),
                      a.ln1_mean + l * N, a.ln1_rstd + l * N, N);
        if (on_final) on_final(layout_.backward_ranges_of_layer(static_cast<int>(l)));
    }
    cpu::encoder_backward(g.wte, g.wpe, a.dresidual, inputs_.data(), B, T, C);
    if (on_final) on_final(layout_.backward_ranges_of_embeddings(wte_early));
}

}  // namespace llmc
