// A model's architecture and shape, for every family the trainers build: the family (`arch`), its norm, RoPE's
// theta and the sizes. Both families are decoder-only pre-norm transformers whose classifier is the token
// embedding (tied); what the family fixes is listed by the helpers below, so the layout, the models and the model
// file read the same facts from one place.
#pragma once
#include <string>
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

// gpt2: llm.c's GPT-2 (learned positions, biases, affine LayerNorm, tanh-GELU MLP of 4C).
// olmo: the DeMo paper's OLMo (RoPE, no biases, non-affine LayerNorm or RMSNorm, SwiGLU MLP of 8C -> 4C).
enum class ModelArch : int { gpt2 = 1, olmo = 2 };
// layernorm: GPT-2's is affine (weight and bias), OLMo's has no parameters (the paper's configs); rmsnorm (OLMo
// only) has a weight.
enum class NormKind : int { layernorm = 1, rmsnorm = 2 };

struct ModelConfig {
    ModelArch arch = ModelArch::gpt2;
    NormKind norm = NormKind::layernorm;
    float rope_theta = 10000.0f;  // olmo
    int max_seq_len = 1024;
    int vocab_size = 50257;
    int padded_vocab_size = 50304;
    int num_layers = 12;
    int num_heads = 12;
    int channels = 768;

    bool operator==(const ModelConfig&) const = default;
    // "gpt2 L=12 H=12 C=768 T=1024 V=50257 Vp=50304"; OLMo adds its norm and theta.
    std::string describe() const;

    bool is_olmo() const { return arch == ModelArch::olmo; }
    bool learned_positions() const { return arch == ModelArch::gpt2; }  // wpe; else RoPE on q and k
    bool has_biases() const { return arch == ModelArch::gpt2; }
    bool norm_has_weight() const { return arch == ModelArch::gpt2 || norm == NormKind::rmsnorm; }
    bool norm_has_bias() const { return arch == ModelArch::gpt2; }
    // Rows of the MLP's input projection (fc / ff_proj): GPT-2's 4C, OLMo's 8C = SwiGLU's x and gate halves. Its
    // output projection always reads 4C.
    int mlp_input_rows() const { return (arch == ModelArch::olmo ? 8 : 4) * channels; }
    int head_size() const { return channels / num_heads; }
};

const char* arch_name(ModelArch arch);
const char* norm_name(NormKind norm);

// The model's config keys (the schema's "model" group): its family and shape, which a resumed run keeps.
std::vector<Key<ModelConfig>> model_config_keys();
// The names of those keys, for messages that list where a shape came from.
std::vector<std::string> model_config_key_names();

// Throws llmc::Error naming `what` when the shape is unusable (C not divisible by heads, sizes <= 0,
// padded vocab smaller than vocab, a size over the limits below, RMSNorm for GPT-2, an odd OLMo head size...).
void validate_model_config(const ModelConfig& config, const std::string& what);
constexpr long long kMaxLayers = 4096, kMaxChannels = 1 << 17, kMaxSeqLen = 1 << 24, kMaxVocab = 1 << 24;

}  // namespace llmc
