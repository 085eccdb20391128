// The GPT-2 side of TextTokenizer: an adapter over Gpt2Bpe. The Hugging Face side lives in hf_tokenizer.cpp.
#include "llmc/data/text_tokenizer.h"

#include <cstdio>

#include "llmc/base/error.h"
#include "llmc/data/bpe.h"

namespace llmc {

namespace {

class Gpt2Tokenizer final : public TextTokenizer {
public:
    Gpt2Tokenizer(Gpt2Bpe bpe, std::string source) : bpe_(std::move(bpe)), source_(std::move(source)) {}

    void encode(std::string_view text, std::vector<int>& out) override { bpe_.encode(text, out); }
    std::string decode(std::span<const int> ids) const override { return bpe_.decode(ids); }
    const std::string& token_bytes(int id) const override { return bpe_.token_bytes(id); }
    bool is_assigned(int id) const override { return id >= 0 && id < bpe_.vocab_size(); }
    int vocab_size() const override { return bpe_.vocab_size(); }
    std::optional<int> eos_token() const override { return bpe_.eot_token(); }
    std::unique_ptr<TextTokenizer> clone() const override { return std::make_unique<Gpt2Tokenizer>(bpe_, source_); }
    const std::string& source() const override { return source_; }

private:
    Gpt2Bpe bpe_;
    std::string source_;
};

}  // namespace

bool is_hf_tokenizer_file(const std::string& path) {
    return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

std::unique_ptr<TextTokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe) {
    return std::make_unique<Gpt2Tokenizer>(Gpt2Bpe::load(encoder_json, vocab_bpe), encoder_json);
}

std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& tokenizer_json, const std::string& encoder_json,
                                                   const std::string& vocab_bpe) {
    if (!tokenizer_json.empty()) return load_hf_tokenizer(tokenizer_json);
    return load_gpt2_tokenizer(encoder_json, vocab_bpe);
}

void check_tokenizer_fits(const TextTokenizer& tokenizer, int model_vocab, const std::string& model_file) {
    const int ids = tokenizer.vocab_size();
    LLMC_CHECK(ids <= model_vocab, model_file + ": a vocabulary of " + std::to_string(model_vocab) + " tokens, but " +
                                       tokenizer.source() + " has " + std::to_string(ids) +
                                       " (the model was not trained with this tokenizer)");
    if (model_vocab - ids > ids / 100)
        std::fprintf(stderr, "warning: %s: a vocabulary of %d tokens, %d more than the %d of %s (another tokenizer?)\n",
                     model_file.c_str(), model_vocab, model_vocab - ids, ids, tokenizer.source().c_str());
}

}  // namespace llmc
