// What every tool that turns text into token ids, and ids back into text, sees: one interface over GPT-2's
// encoder.json/vocab.bpe (llmc/data/bpe.h) and Hugging Face's tokenizer.json (llmc/data/hf_tokenizer.h), so the
// data prep tool, sample_gpt, eval_gpt and the trainers' samples take either file.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llmc {

class TextTokenizer {
public:
    virtual ~TextTokenizer() = default;

    // Appends the ids of `text`, with nothing added around it (no BOS, EOS or post-processor template). Not const:
    // an implementation may fill a word cache; give each thread its own clone().
    virtual void encode(std::string_view text, std::vector<int>& out) = 0;
    // The text of `ids` as raw bytes (not necessarily valid UTF-8 when a multi-byte character is cut); throws
    // llmc::Error for an id outside [0, vocab_size()) or one the file leaves unassigned.
    virtual std::string decode(std::span<const int> ids) const = 0;
    // The bytes token `id` decodes to on its own (a special token: its text), for printing tokens as they come;
    // throws like decode() for an id that is not assigned.
    virtual const std::string& token_bytes(int id) const = 0;
    // Whether the file gives `id` a token (a tokenizer.json may leave ids below vocab_size() unassigned).
    virtual bool is_assigned(int id) const = 0;
    // 1 + the largest id the file assigns; the model's vocab_size must be at least this.
    virtual int vocab_size() const = 0;
    // The end-of-text token the file itself names, if any (a run's eos_token_id takes precedence).
    virtual std::optional<int> eos_token() const = 0;
    // A copy for another thread: shares the immutable tables, owns its caches.
    virtual std::unique_ptr<TextTokenizer> clone() const = 0;
    // The file (or files) it was loaded from, for messages.
    virtual const std::string& source() const = 0;
};

// True when `path` names a Hugging Face tokenizer.json (by its extension, .json) rather than llm.c's files.
bool is_hf_tokenizer_file(const std::string& path);

// GPT-2's tokenizer from encoder.json and vocab.bpe (Gpt2Bpe); problems throw llmc::Error naming the file.
std::unique_ptr<TextTokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);

// A byte-level BPE tokenizer from Hugging Face's tokenizer.json (defined in hf_tokenizer.cpp); a malformed file or
// an unsupported model, normalizer, pre-tokenizer or decoder throws llmc::Error naming the file and the part.
std::unique_ptr<TextTokenizer> load_hf_tokenizer(const std::string& tokenizer_json);

// The tokenizer a tool's flags name: `tokenizer_json` (Hugging Face's tokenizer.json) when not empty, else GPT-2's
// encoder.json and vocab.bpe.
std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& tokenizer_json, const std::string& encoder_json,
                                                   const std::string& vocab_bpe);

// Throws when the tokenizer has ids the model's vocabulary of `model_vocab` lacks, naming `model_file`. A model may
// have more ids than its tokenizer (OLMo rounds 50277 up to 50280); more than 1% more prints a warning, since that
// looks like another tokenizer.
void check_tokenizer_fits(const TextTokenizer& tokenizer, int model_vocab, const std::string& model_file);

}  // namespace llmc
