// The model's keys, description and shape checks (see model_config.h).
#include "llmc/model/model_config.h"

#include <cmath>

#include "llmc/base/error.h"

namespace llmc {

const char* arch_name(ModelArch arch) { return arch == ModelArch::olmo ? "olmo" : "gpt2"; }
const char* norm_name(NormKind norm) { return norm == NormKind::rmsnorm ? "rmsnorm" : "layernorm"; }

std::vector<Key<ModelConfig>> model_config_keys() {
    return {
        key("arch", &ModelConfig::arch,
            "model family: gpt2 (llm.c's GPT-2) or olmo (the DeMo paper's OLMo: RoPE, SwiGLU, no biases, tied)",
            {{"gpt2", ModelArch::gpt2}, {"olmo", ModelArch::olmo}}).fixed(),
        key("norm", &ModelConfig::norm,
            "layernorm (GPT-2: affine; OLMo: without parameters, as the paper) or rmsnorm (OLMo, with a weight)",
            {{"layernorm", NormKind::layernorm}, {"rmsnorm", NormKind::rmsnorm}}).fixed(),
        key("rope_theta", &ModelConfig::rope_theta, "olmo: RoPE's base theta").fixed(),
        key("num_layers", &ModelConfig::num_layers, "transformer blocks").fixed(),
        key("num_heads", &ModelConfig::num_heads, "attention heads (must divide channels)").fixed(),
        key("channels", &ModelConfig::channels, "model width C").fixed(),
        key("max_seq_len", &ModelConfig::max_seq_len, "longest sequence (gpt2: positions in wpe)").fixed(),
        key("vocab_size", &ModelConfig::vocab_size, "tokens (GPT-2: 50257, OLMo: 50280)").fixed(),
        key("padded_vocab_size", &ModelConfig::padded_vocab_size, "wte rows, padded for speed (50304)").fixed(),
    };
}

std::vector<std::string> model_config_key_names() {
    std::vector<std::string> names;
    for (const Key<ModelConfig>& k : model_config_keys()) names.push_back(k.name);
    return names;
}

std::string ModelConfig::describe() const {
    std::string s = std::string(arch_name(arch)) + " L=" + std::to_string(num_layers) + " H=" +
                    std::to_string(num_heads) + " C=" + std::to_string(channels) + " T=" + std::to_string(max_seq_len) +
                    " V=" + std::to_string(vocab_size) + " Vp=" + std::to_string(padded_vocab_size);
    if (is_olmo()) s += std::string(" norm=") + norm_name(norm) + " theta=" + format_float(rope_theta);
    return s;
}

void validate_model_config(const ModelConfig& c, const std::string& what) {
    LLMC_CHECK(c.num_layers > 0 && c.num_heads > 0 && c.channels > 0 && c.max_seq_len > 0 && c.vocab_size > 0,
               what + ": model sizes must be positive (" + c.describe() + ")");
    LLMC_CHECK(c.channels % c.num_heads == 0,
               what + ": channels " + std::to_string(c.channels) + " not divisible by num_heads " +
                   std::to_string(c.num_heads));
    LLMC_CHECK(c.padded_vocab_size >= c.vocab_size,
               what + ": padded_vocab_size " + std::to_string(c.padded_vocab_size) + " < vocab_size " +
                   std::to_string(c.vocab_size));
    LLMC_CHECK(c.arch == ModelArch::olmo || c.norm == NormKind::layernorm,
               what + ": norm rmsnorm is an olmo option (GPT-2's LayerNorm is affine)");
    if (c.is_olmo()) {
        LLMC_CHECK(c.head_size() % 2 == 0, what + ": RoPE needs an even head size, got channels/num_heads = " +
                                               std::to_string(c.head_size()));
        LLMC_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f,
                   what + ": rope_theta must be a finite number > 1 (got " + format_float(c.rope_theta) + ")");
    }
    // Far beyond any model's shape, and small enough that every count of parameters or activations fits 64 bits.
    const auto at_most = [&](const char* key, long long value, long long max) {
        LLMC_CHECK(value <= max, what + ": " + key + " " + std::to_string(value) + " is over " + std::to_string(max));
    };
    at_most("num_layers", c.num_layers, kMaxLayers);
    at_most("channels", c.channels, kMaxChannels);
    at_most("max_seq_len", c.max_seq_len, kMaxSeqLen);
    at_most("padded_vocab_size", c.padded_vocab_size, kMaxVocab);
}

}  // namespace llmc
