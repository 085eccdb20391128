// GPT-2 model shape and the layout of its parameters in one flat fp32 buffer, in llm.c's order (all layers of
// one kind contiguous: wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb lnfw
// lnfb). Optimizers see the buffer as a list of named per-layer tensors (nanoGPT names and PyTorch shapes,
// e.g. "h.3.attn.c_attn.weight" [3C, C]), so parameter groups are chosen by name and shape, never by index.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/param_range.h"
#include "llmc/base/schema.h"

namespace llmc {

struct ModelConfig {
    int max_seq_len = 1024;
    int vocab_size = 50257;
    int padded_vocab_size = 50304;
    int num_layers = 12;
    int num_heads = 12;
    int channels = 768;

    bool operator==(const ModelConfig&) const = default;
    std::string describe() const;  // "L=12 H=12 C=768 T=1024 V=50257 Vp=50304"
};

// The model's config keys (the schema's "model" group): its shape, which a resumed run keeps.
std::vector<Key<ModelConfig>> model_config_keys();

enum class ParamKind : int {
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb,
};
inline constexpr int kNumParamKinds = 16;

// One logical tensor of one layer: a view [offset, offset + numel) of the flat buffer.
struct ParamTensor {
    std::string name;            // nanoGPT-style, e.g. "wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias"
    ParamKind kind;
    int layer;                   // -1 for wte, wpe, lnf
    size_t offset;
    size_t numel;
    std::vector<size_t> shape;   // {rows, cols} for matrices (PyTorch Linear: {out, in}), {n} for vectors
    bool is_matrix() const { return shape.size() == 2; }
};

struct ParamLayout {
    ModelConfig config;
    size_t num_params = 0;
    std::array<size_t, kNumParamKinds> kind_offset{};  // where each kind's block starts in the flat buffer
    std::array<size_t, kNumParamKinds> kind_numel{};   // all layers of the kind together
    std::vector<ParamTensor> tensors;                  // per-layer views, in buffer order

    static ParamLayout gpt2(const ModelConfig& config);
    // Tensors "t0", "t1", ... of the given shapes back to back (kind wte, no layer; `config` unused): the
    // awkward layouts the optimizer tests and kernel checkers need.
    static ParamLayout of_shapes(const std::vector<std::vector<size_t>>& shapes);
    const ParamTensor& find(const std::string& name) const;  // throws llmc::Error for an unknown name
    // What a backward finishes, in the order it finishes them (for overlapping the gradient exchange with it):
    // first, if the caller chose some, runs of wte rows that no input token of the micro-batch touches (wte
    // takes the classifier's gradient at the start of the backward, and the encoder's backward adds only to
    // its input tokens' rows); then layer l's twelve tensors (plus ln_f's two for the last layer, whose
    // backward runs first); and once every layer is done the embeddings: wte's other rows and wpe. Over
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
double gpt2_flops_per_token(const ParamLayout& layout, int seq_len);

// The bitmap untouched_wte_rows reads: bit t set for every token id t in `tokens`, `rows` bits in
// token_row_words(rows) words.
std::vector<uint64_t> token_row_bitmap(std::span<const int> tokens, size_t rows);
constexpr size_t token_row_words(size_t rows) { return (rows + 63) / 64; }

// Throws llmc::Error naming `what` when the shape is unusable (C not divisible by heads, sizes <= 0,
// padded vocab smaller than vocab, a size over the limits below...).
void validate_model_config(const ModelConfig& config, const std::string& what);
constexpr long long kMaxLayers = 4096, kMaxChannels = 1 << 17, kMaxSeqLen = 1 << 24, kMaxVocab = 1 << 24;

}  // namespace llmc
