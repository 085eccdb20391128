// GPT-2's tensor table and init (see gpt2_family.h).
#include "llmc/model/gpt2/gpt2_family.h"

#include <cmath>

#include "llmc/base/error.h"
#include "llmc/model/model_init.h"

namespace llmc {

ParamLayout ParamLayout::gpt2(const ModelConfig& c) {
    validate_model_config(c, "model config");
    LLMC_CHECK(c.arch == ModelArch::gpt2, "ParamLayout::gpt2: the config is " + c.describe());
    const size_t C = c.channels, Vp = c.padded_vocab_size, T = c.max_seq_len;
    const std::string h = "h.";
    const KindShape kinds[kNumParamKinds] = {
        {"", "wte.weight", false, {Vp, C}},
        {"", "wpe.weight", false, {T, C}},
        {h, "ln_1.weight", true, {C}},
        {h, "ln_1.bias", true, {C}},
        {h, "attn.c_attn.weight", true, {3 * C, C}},
        {h, "attn.c_attn.bias", true, {3 * C}},
        {h, "attn.c_proj.weight", true, {C, C}},
        {h, "attn.c_proj.bias", true, {C}},
        {h, "ln_2.weight", true, {C}},
        {h, "ln_2.bias", true, {C}},
        {h, "mlp.c_fc.weight", true, {4 * C, C}},
        {h, "mlp.c_fc.bias", true, {4 * C}},
        {h, "mlp.c_proj.weight", true, {C, 4 * C}},
        {h, "mlp.c_proj.bias", true, {C}},
        {"", "ln_f.weight", false, {C}},
        {"", "ln_f.bias", false, {C}},
    };
    return from_kinds(c, kinds);
}

namespace {

TensorInit gpt2_rule(const ParamLayout& layout, const ParamTensor& t) {
    if (!t.is_matrix()) {
        const bool norm_weight = t.kind == ParamKind::ln1w || t.kind == ParamKind::ln2w || t.kind == ParamKind::lnfw;
        return {false, false, norm_weight ? 1.0 : 0.0};
    }
    const bool residual = t.kind == ParamKind::attprojw || t.kind == ParamKind::fcprojw;
    return {true, false, residual ? 0.02 / std::sqrt(2.0 * layout.config.num_layers) : 0.02};
}

}  // namespace

void gpt2_init(const ParamLayout& layout, std::span<float> params, uint64_t seed) {
    init_by_rule(layout, params, seed, gpt2_rule);
}

}  // namespace llmc
