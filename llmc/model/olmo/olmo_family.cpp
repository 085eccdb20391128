// OLMo's tensor table and init (see olmo_family.h). Names follow OLMo's modules (transformer.wte,
// transformer.blocks.N.{attn_norm, att_proj, attn_out, ff_norm, ff_proj, ff_out}, transformer.ln_f), so a reader
// of OLMo's checkpoints finds each tensor under the name it knows.
#include "llmc/model/olmo/olmo_family.h"

#include <cmath>

#include "llmc/base/error.h"
#include "llmc/model/model_init.h"

namespace llmc {

ParamLayout ParamLayout::olmo(const ModelConfig& c) {
    validate_model_config(c, "model config");
    LLMC_CHECK(c.arch == ModelArch::olmo, "ParamLayout::olmo: the config is " + c.describe());
    const size_t C = c.channels, Vp = c.padded_vocab_size;
    const std::vector<size_t> norm = c.norm_has_weight() ? std::vector<size_t>{C} : std::vector<size_t>{};
    const std::string b = "transformer.blocks.";
    const KindShape kinds[kNumParamKinds] = {
        {"", "transformer.wte.weight", false, {Vp, C}},
        {"", "", false, {}},  // no wpe: RoPE
        {b, "attn_norm.weight", true, norm},
        {"", "", false, {}},
        {b, "att_proj.weight", true, {3 * C, C}},
        {"", "", false, {}},
        {b, "attn_out.weight", true, {C, C}},
        {"", "", false, {}},
        {b, "ff_norm.weight", true, norm},
        {"", "", false, {}},
        {b, "ff_proj.weight", true, {8 * C, C}},
        {"", "", false, {}},
        {b, "ff_out.weight", true, {C, 4 * C}},
        {"", "", false, {}},
        {"", "transformer.ln_f.weight", false, norm},
        {"", "", false, {}},
    };
    return from_kinds(c, kinds);
}

namespace {

TensorInit olmo_rule(const ParamLayout& layout, const ParamTensor& t) {
    if (!t.is_matrix()) return {false, false, 1.0};  // RMSNorm weights
    const double C = layout.config.channels;
    double std_dev = 1.0 / std::sqrt(C);  // wte, att_proj, ff_proj
    if (t.kind == ParamKind::attprojw || t.kind == ParamKind::fcprojw) {
        const double fan_in = static_cast<double>(t.shape[1]);
        std_dev = 1.0 / std::sqrt(2.0 * fan_in * (t.layer + 1));
    }
    return {true, true, std_dev};
}

}  // namespace

void olmo_init(const ParamLayout& layout, std::span<float> params, uint64_t seed) {
    init_by_rule(layout, params, seed, olmo_rule);
}

}  // namespace llmc
