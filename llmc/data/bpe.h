// GPT-2 byte-level BPE encoder (the tokenizer of OpenAI's GPT-2 and of llm.c's data), written to agree token for
// token with tiktoken's "gpt2" encoding: GPT-2's pre-tokenization regex (hand-matched over code points, with
// JavaScript's meaning of \p{L}, \p{N} and \s), the byte-to-unicode table of encoder.json / vocab.bpe, and
// merges applied lowest rank first, leftmost on ties, where like tiktoken any adjacent pair whose concatenation
// is a token may merge (not only vocab.bpe's pairs). A per-object word cache makes repeated words cost one hash
// lookup. Invalid UTF-8 is first repaired the way every standard decoder (WHATWG TextDecoder, Python's
// errors="replace", node's Buffer) repairs it, so the tokens equal tiktoken's for the text such a decoder reads;
// round trips are therefore exact for valid UTF-8 only. Character classes come from ICU's u_charType (Unicode
// 15.0 on Debian 12); code points assigned in later Unicode versions count as neither letter, number nor space.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llmc {

// Replaces every maximal ill-formed subsequence of `text` by U+FFFD (EF BF BD), as the Unicode standard's
// "U+FFFD substitution of maximal subparts" (and WHATWG's UTF-8 decoder) prescribes: a byte that cannot start
// a sequence is one U+FFFD; a valid lead followed by fewer valid continuations than it needs is one U+FFFD for
// the lead and the continuations that were valid, and decoding resumes at the offending byte. Overlong forms,
// surrogates (ED A0..BF ..) and code points above U+10FFFF are ill-formed. Returns false (and leaves `repaired`
// untouched) when `text` is already valid, so the common case copies nothing.
bool repair_utf8(std::string_view text, std::string& repaired);

// Splits valid UTF-8 `text` into GPT-2 pre-tokens, i.e. the matches of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Throws llmc::Error on invalid UTF-8. Exposed for tests; encode() runs the same matcher without materializing
// the pieces.
void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

class Gpt2Bpe {
public:
    // Loads and cross-checks encoder.json (token string -> id) and vocab.bpe (merges in rank order); every
    // problem throws llmc::Error naming the file.
    static Gpt2Bpe load(const std::string& encoder_json, const std::string& vocab_bpe);

    // Appends the tokens of `text` to `out`. "<|endoftext|>" inside text is plain text, never the EOT token.
    // Not const because it fills the word cache; copies of a Gpt2Bpe share the (immutable) vocabulary and own
    // separate caches, so give each thread its own copy.
    void encode(std::string_view text, std::vector<int>& out);
    // Concatenated bytes of the tokens (EOT decodes to "<|endoftext|>"); throws on an id outside the vocabulary.
    std::string decode(std::span<const int> tokens) const;

    // The raw bytes of token `id` (what the llm.c tokenizer decode file stores).
    const std::string& token_bytes(int id) const;
    const std::vector<std::string>& all_token_bytes() const;
    int eot_token() const;  // 50256 for GPT-2
    int vocab_size() const; // 50257 for GPT-2

    // Words in the cache; words longer than the cacheable limit are merged every time.
    size_t cached_words() const;

    // Implementation details, defined in bpe.cpp (public only so its internal helpers can name them).
    struct Vocabulary;
    class WordCache;

    Gpt2Bpe(const Gpt2Bpe& other);
    Gpt2Bpe& operator=(const Gpt2Bpe& other);
    Gpt2Bpe(Gpt2Bpe&&) noexcept;
    Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;
    ~Gpt2Bpe();

private:
    explicit Gpt2Bpe(std::shared_ptr<const Vocabulary> vocab);
    void encode_piece(std::string_view piece, std::vector<int>& out);

    std::shared_ptr<const Vocabulary> vocab_;
    std::unique_ptr<WordCache> cache_;
    std::vector<int> merge_scratch_;
};

}  // namespace llmc
