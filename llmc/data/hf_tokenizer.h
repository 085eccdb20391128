// Byte-level BPE tokenizers from Hugging Face's tokenizer.json (GPT-2, Llama 3, Qwen 2/3, GPT-4o, DeepSeek V3,
// GPT-NeoX, ...), encoding as Hugging Face's tokenizers library does with add_special_tokens=False:
//   1. invalid UTF-8 is repaired first (each maximal ill-formed subpart -> U+FFFD, as every standard decoder
//      reads it), so the ids equal those of the text such a decoder sees;
//   2. added tokens are split out (leftmost-longest, honouring lstrip / rstrip / single_word): first those with
//      normalized=false on the raw text, then, after the normalizer (NFC, or a Sequence of NFC), those with
//      normalized=true; each becomes its id;
//   3. the pieces between run through the pre-tokenizer (ByteLevel, Split with a regex or string and any of its
//      five behaviours, Digits, or a Sequence of them ending in ByteLevel), then BPE with the file's merges
//      (lowest rank first, leftmost on ties; with ignore_merges a pre-token that is itself a token is emitted
//      whole), with a word cache.
// Nothing is added around the ids: the post_processor (BOS/EOS templates) and truncation/padding are ignored.
// decode() concatenates the tokens' bytes (a vocab token's through the byte-to-unicode map, an added token's
// content), which is what the ByteLevel decoder gives; a file without a decoder decodes the same way.
// Anything else (WordPiece/Unigram/WordLevel models, dropout, byte_fallback, subword prefixes, other normalizers,
// pre-tokenizers or decoders) is refused when loading with a one-line llmc::Error naming the file and the part.
//
// Regexes follow Oniguruma as Hugging Face's JavaScript port (@huggingface/tokenizers) translates it: \s is
// Unicode White_Space, (?i:..) folds ASCII letters only; the ByteLevel pre-tokenizer's built-in GPT-2 regex uses
// the same \s (the JavaScript port uses JavaScript's \s there, which differs on U+0085 and U+FEFF only).
// Character properties come from ICU (Unicode 15.0 on Debian 12).
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmc/data/text_tokenizer.h"

namespace llmc {

class HfTokenizer final : public TextTokenizer {
public:
    // Loads and checks tokenizer.json; every problem throws llmc::Error naming the file.
    static std::unique_ptr<HfTokenizer> load(const std::string& tokenizer_json);

    void encode(std::string_view text, std::vector<int>& out) override;
    std::string decode(std::span<const int> ids) const override;
    const std::string& token_bytes(int id) const override;
    int vocab_size() const override;
    std::optional<int> eos_token() const override;
    std::unique_ptr<TextTokenizer> clone() const override;
    const std::string& source() const override;

    // Whether `id` is assigned by the file (a vocab entry or an added token).
    bool is_assigned(int id) const override;
    // The pre-tokens `text` (valid UTF-8, no added tokens) splits into before BPE, as raw bytes; for tests.
    std::vector<std::string> pretokenize(std::string_view text);
    size_t cached_words() const;

    struct Model;  // the immutable tables, shared by clones (defined in hf_tokenizer.cpp)
    struct State;  // a clone's own caches and buffers
    explicit HfTokenizer(std::shared_ptr<const Model> model);
    ~HfTokenizer() override;

private:
    void encode_normalized(std::string_view text, std::vector<int>& out);
    void run_stages(size_t stage, std::string_view piece, std::vector<int>& out, std::vector<std::string>* pieces);
    void encode_piece(std::string_view piece, std::vector<int>& out);

    std::shared_ptr<const Model> model_;
    std::unique_ptr<State> state_;
};

}  // namespace llmc
