// The layout of a model's parameters in one flat fp32 buffer, all layers of one kind contiguous, in llm.c's order
// (wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb lnfw lnfb); a family without a
// kind (OLMo has no wpe, no biases, no norm weights unless RMSNorm) has none of it. Optimizers see the buffer as a
// list of named per-layer tensors with PyTorch shapes (GPT-2: nanoGPT's names, "h.3.attn.c_attn.weight" [3C, C];
// OLMo: OLMo's, "transformer.blocks.3.att_proj.weight" [3C, C]), so parameter groups are chosen by name and
// shape, never by index.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/param_range.h"
#include "llmc/model/model_config.h"

namespace llmc {

// GPT-2's kinds; OLMo's tensors take the kind of the same place in the block: att_proj qkvw, attn_out attprojw,
// ff_proj fcw (8C rows), ff_out fcprojw, attn_norm / ff_norm / ln_f (RMSNorm's weights) ln1w / ln2w / lnfw.
enum class ParamKind : int {
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb,
};
inline constexpr int kNumParamKinds = 16;

// One logical tensor of one layer: a view [offset, offset + numel) of the flat buffer.
struct ParamTensor {
    std::string name;            // e.g. "wte.weight", "h.0.attn.c_attn.weight", "transformer.blocks.0.ff_out.weight"
    ParamKind kind;
    int layer;                   // -1 for wte, wpe, lnf
    size_t offset;
    size_t numel;
    std::vector<size_t> shape;   // {rows, cols} for matrices (PyTorch Linear: {out, in}), {n} for vectors
    bool is_matrix() const { return shape.size() == 2; }
};

// One kind's tensor in a family's table: its name (after `layer_prefix` and the layer number for a per-layer
// kind) and the shape of one copy; an empty shape means the family has no such tensor.
struct KindShape {
    std::string layer_prefix, name;
    bool per_layer = false;
    std::vector<size_t> shape;
};

struct ParamLayout {
    ModelConfig config;
    size_t num_params = 0;
    std::array<size_t, kNumParamKinds> kind_offset{};  // where each kind's block starts in the flat buffer
    std::array<size_t, kNumParamKinds> kind_numel{};   // all layers of the kind together
    std::vector<ParamTensor> tensors;                  // per-layer views, in buffer order

    static ParamLayout of(const ModelConfig& config);  // the layout of config.arch's family
    static ParamLayout gpt2(const ModelConfig& config);
    static ParamLayout olmo(const ModelConfig& config);
    // The layout of a table of kNumParamKinds kinds, in kind order: what gpt2() and olmo() build from.
    static ParamLayout from_kinds(const ModelConfig& config, std::span<const KindShape> kinds);
    // Tensors "t0", "t1", ... of the given shapes back to back (kind wte, no layer; `config` unused): the
    // awkward layouts the optimizer tests and kernel checkers need.
    static ParamLayout of_shapes(const std::vector<std::vector<size_t>>& shapes);
    const ParamTensor& find(const std::string& name) const;  // throws llmc::Error for an unknown name
    // What a backward finishes, in the order it finishes them (for overlapping the gradient exchange with it):
    // first, if the caller chose some, runs of wte rows that no input token of the micro-batch touches (wte
    // takes the classifier's gradient at the start of the backward, and the encoder's backward adds only to
    // its input tokens' rows); then layer l's tensors (plus ln_f's for the last layer, whose backward runs
    // first); and once every layer is done the embeddings: wte's other rows and wpe. Over
    // `wte_early`, the layers from last to first and then the embeddings, every parameter appears exactly once.
    std::vector<ParamRange> backward_ranges_of_layer(int l) const;
    std::vector<ParamRange> backward_ranges_of_embeddings(std::span<const ParamRange> wte_early = {}) const;
    // The runs of wte rows whose bit is clear in `touched_rows` (a bitmap of padded_vocab_size rows, 64 per word:
    // the rows some rank's input tokens use), as ranges of the flat buffer in row order: at most `max_runs` of
    // them, the longest (ties: the lower rows), for a transport that pays per range.
    std::vector<ParamRange> untouched_wte_rows(std::span<const uint64_t> touched_rows, size_t max_runs) const;
    // True when no token id in `tokens` has its wte row inside one of `ranges` (sorted, as untouched_wte_rows
    // gives them): the backward's check of the early rows it is handed.
    bool wte_rows_untouched(std::span<const ParamRange> ranges, std::span<const int> tokens) const;
};

// llm.c's estimate of a training step's flops per token for `layout`'s model at sequence length `seq_len`
// (Kaplan et al. 2020, section 2.1, times three for the backward): 6 N for the parameters (N counts every one,
// the padded vocabulary's rows included) + 6 L C T for attention's products over the T positions.
double model_flops_per_token(const ParamLayout& layout, int seq_len);

// The bitmap untouched_wte_rows reads: bit t set for every token id t in `tokens`, `rows` bits in
// token_row_words(rows) words.
std::vector<uint64_t> token_row_bitmap(std::span<const int> tokens, size_t rows);
constexpr size_t token_row_words(size_t rows) { return (rows + 63) / 64; }

}  // namespace llmc
