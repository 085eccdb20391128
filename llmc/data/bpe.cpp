// GPT-2 byte-level BPE (see bpe.h): vocabulary loading and cross-checking, UTF-8 repair, the hand-written
// pre-tokenizer, rank-ordered merging and the word cache.
#include "llmc/data/bpe.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <nlohmann/json.hpp>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/bpe_merge.h"
#include "llmc/data/utf8.h"

namespace llmc {

// ---------------------------------------------------------------------------------------------------------------
// UTF-8

namespace {

// Length of the well-formed sequence starting at s[i], or 0 when s[i..] starts an ill-formed one; `ill_formed_length`
// then says how many bytes (>= 1) make up the maximal ill-formed subpart that one U+FFFD replaces.
inline size_t utf8_sequence_length(const unsigned char* s, size_t n, size_t i, size_t& ill_formed_length) {
    const unsigned b = s[i];
    if (b < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;        // overlong
        else if (b == 0xED) hi = 0x9F;   // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0) lo = 0x90;        // overlong
        else if (b == 0xF4) hi = 0x8F;   // above U+10FFFF
    } else {
        ill_formed_length = 1;
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        const size_t at = i + k;
        const unsigned lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (at >= n || s[at] < lo_k || s[at] > hi_k) {
            ill_formed_length = k;
            return 0;
        }
    }
    return need + 1;
}

}  // namespace

bool repair_utf8(std::string_view text, std::string& repaired) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    // Scan 8 bytes at a time while they are ASCII: prose is mostly ASCII and this keeps validation ~free.
    auto skip_valid = [&](size_t from) {
        size_t j = from;
        while (j < n) {
            if (j + 8 <= n) {
                uint64_t word;
                std::memcpy(&word, s + j, 8);
                if ((word & 0x8080808080808080ull) == 0) {
                    j += 8;
                    continue;
                }
            }
            size_t bad_length = 0;
            const size_t len = utf8_sequence_length(s, n, j, bad_length);
            if (len == 0) return j;
            j += len;
        }
        return j;
    };
    i = skip_valid(0);
    if (i == n) return false;
    repaired.clear();
    repaired.reserve(n + 16);
    size_t copied_until = 0;
    while (i < n) {
        size_t bad_length = 0;
        utf8_sequence_length(s, n, i, bad_length);
        repaired.append(text.data() + copied_until, i - copied_until);
        repaired.append("\xEF\xBF\xBD");
        i += bad_length;
        copied_until = i;
        i = skip_valid(i);
    }
    repaired.append(text.data() + copied_until, n - copied_until);
    return true;
}

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenization

namespace {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// JavaScript's \s (ECMAScript WhiteSpace + LineTerminator): TAB VT FF CR LF, U+FEFF, U+2028, U+2029 and every
// Zs code point. Unlike Python's \s it excludes U+001C..U+001F and U+0085.
inline bool is_js_space(char32_t cp, int8_t category) {
    return category == U_SPACE_SEPARATOR || (cp >= 0x09 && cp <= 0x0D) || cp == 0xFEFF || cp == 0x2028 ||
           cp == 0x2029;
}

inline CharClass unicode_class(char32_t cp) {
    const int8_t category = u_charType(static_cast<UChar32>(cp));
    const uint32_t mask = U_MASK(category);
    if (mask & U_GC_L_MASK) return CharClass::kLetter;
    if (mask & U_GC_N_MASK) return CharClass::kNumber;
    if (is_js_space(cp, category)) return CharClass::kSpace;
    return CharClass::kOther;
}

const std::array<CharClass, 128> kAsciiClass = [] {
    std::array<CharClass, 128> table{};
    for (int c = 0; c < 128; c++) table[c] = unicode_class(static_cast<char32_t>(c));
    return table;
}();

inline CharClass class_at(const unsigned char* s, size_t i, size_t& len) {
    if (s[i] < 0x80) {
        len = 1;
        return kAsciiClass[s[i]];
    }
    return unicode_class(utf8::decode(s, i, len));
}

// End of the run of `cls` characters starting at j.
inline size_t run_end(const unsigned char* s, size_t n, size_t j, CharClass cls) {
    while (j < n) {
        size_t len;
        if (class_at(s, j, len) != cls) break;
        j += len;
    }
    return j;
}

// End of the pre-token starting at i. Mirrors the regex alternation in order: contractions, an optional single
// U+0020 followed by a run of letters / numbers / other, then whitespace runs where \s+(?!\S) gives back the
// last whitespace character when non-space follows, so that character (if it is U+0020) can lead the next word.
inline size_t piece_end(const unsigned char* s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        const unsigned char c1 = s[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
        if (i + 2 < n) {
            const unsigned char c2 = s[i + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
        }
    }
    size_t len;
    const CharClass cls = class_at(s, i, len);
    if (cls != CharClass::kSpace) return run_end(s, n, i + len, cls);
    if (s[i] == ' ' && i + 1 < n) {
        size_t next_len;
        const CharClass next = class_at(s, i + 1, next_len);
        if (next != CharClass::kSpace) return run_end(s, n, i + 1 + next_len, next);
    }
    size_t last_start = i, j = i + len;
    while (j < n) {
        size_t l;
        if (class_at(s, j, l) != CharClass::kSpace) break;
        last_start = j;
        j += l;
    }
    if (j == n) return n;
    return last_start > i ? last_start : j;
}

}  // namespace

void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& pieces) {
    std::string repaired;
    LLMC_CHECK(!repair_utf8(text, repaired), "gpt2_pretokenize: text is not valid UTF-8 (repair_utf8 it first)");
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t i = 0; i < text.size();) {
        const size_t j = piece_end(s, text.size(), i);
        pieces.push_back(text.substr(i, j - i));
        i = j;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Vocabulary

namespace {

std::string one_line(std::string message) {
    std::replace(message.begin(), message.end(), '\n', ' ');
    return message;
}

}  // namespace

struct Gpt2Bpe::Vocabulary {
    std::vector<std::string> token_bytes;  // id -> bytes
    std::vector<bool> mergeable;           // the 256 byte tokens and merge results (not EOT, not orphans)
    std::array<int, 256> byte_token{};     // byte -> id of its single-byte token
    int eot = -1;

    // bytes -> id for every token but EOT (which is special, never produced by merging)
    bpe::TokenIndex index;

    void build_index() {
        index.build(token_bytes, [&](size_t id) { return static_cast<int>(id) == eot; });
    }
    int find_token(std::string_view bytes) const { return index.find(token_bytes, bytes); }
    int find_mergeable(std::string_view bytes) const {
        const int id = find_token(bytes);
        return id >= 0 && mergeable[id] ? id : -1;
    }

    // Pair (left id, right id) -> merged id and rank, for every split of every mergeable token into two
    // mergeable tokens. tiktoken merges any adjacent pair whose concatenation is a token (ranked by that token),
    // a superset of vocab.bpe's pairs; using all splits reproduces it exactly. Open addressing over a power-of-two
    // table: lookups are the inner loop of merging.
    bpe::PairTable pairs;
};

namespace {

using Vocabulary = Gpt2Bpe::Vocabulary;
using UnicodeToByte = std::array<int, 512>;
// GPT-2's encoder.json is 1 MB and its vocab.bpe 0.5 MB: a limit that no real vocabulary meets, where a device or a
// pipe that never ends would fill the memory.
constexpr size_t kMaxVocabularyFileBytes = size_t(256) << 20;

// encoder.json keys and vocab.bpe symbols are byte strings spelled through the byte-to-unicode map.
bool unmap_bytes(std::string_view spelled, const UnicodeToByte& unicode_to_byte, std::string& bytes) {
    bytes.clear();
    const auto* s = reinterpret_cast<const unsigned char*>(spelled.data());
    for (size_t i = 0; i < spelled.size();) {
        size_t bad_length;
        const size_t len = utf8_sequence_length(s, spelled.size(), i, bad_length);
        if (len == 0) return false;
        size_t decoded_length;
        const char32_t cp = utf8::decode(s, i, decoded_length);
        if (cp >= unicode_to_byte.size() || unicode_to_byte[cp] < 0) return false;
        bytes += static_cast<char>(unicode_to_byte[cp]);
        i += len;
    }
    return true;
}

using bpe::printable;

// Streams encoder.json's {"token": id, ...} through nlohmann's SAX parser: no DOM of 50k std::map nodes.
class EncoderJsonReader : public nlohmann::json_sax<nlohmann::json> {
public:
    explicit EncoderJsonReader(const std::string& path) : path_(path) {}
    std::vector<std::pair<std::string, int64_t>> entries;
    std::string error;

    bool start_object(size_t) override { return depth_++ == 0 || reject("nested objects"); }
    bool end_object() override {
        depth_--;
        return true;
    }
    bool key(string_t& key) override {
        key_ = std::move(key);
        return true;
    }
    bool number_integer(number_integer_t value) override { return add(value); }
    bool number_unsigned(number_unsigned_t value) override {
        return value <= static_cast<number_unsigned_t>(INT64_MAX) ? add(static_cast<int64_t>(value))
                                                                   : reject("a huge id");
    }
    bool null() override { return reject("null"); }
    bool boolean(bool) override { return reject("a boolean"); }
    bool number_float(number_float_t, const string_t&) override { return reject("a non-integer id"); }
    bool string(string_t&) override { return reject("a string value"); }
    bool binary(binary_t&) override { return reject("binary data"); }
    bool start_array(size_t) override { return reject("an array"); }
    bool end_array() override { return false; }
    bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) override {
        error = one_line(path_ + ": not valid JSON (" + e.what() + ")");
        return false;
    }

private:
    bool add(int64_t id) {
        if (depth_ != 1) return reject("a bare number");
        entries.emplace_back(std::move(key_), id);
        return true;
    }
    bool reject(const std::string& what) {
        if (error.empty())
            error = path_ + ": expected a JSON object mapping token strings to integer ids (GPT-2 encoder.json), found " +
                    what + (key_.empty() ? "" : " at token \"" + printable(key_) + "\"");
        return false;
    }
    std::string path_, key_;
    int depth_ = 0;
};

void load_encoder_json(const std::string& path, const UnicodeToByte& unicode_to_byte, Vocabulary& vocab) {
    const std::vector<std::byte> raw = read_whole_file(path, kMaxVocabularyFileBytes);
    EncoderJsonReader reader(path);
    const char* begin = reinterpret_cast<const char*>(raw.data());
    const bool ok = nlohmann::json::sax_parse(begin, begin + raw.size(), &reader);
    LLMC_CHECK(ok && reader.error.empty(), reader.error.empty() ? path + ": not valid JSON" : reader.error);
    LLMC_CHECK(!reader.entries.empty(), path + ": expected a JSON object mapping token strings to ids (GPT-2 encoder.json)");
    const size_t n = reader.entries.size();
    LLMC_CHECK(n <= (1u << 24), path + ": " + std::to_string(n) + " tokens is implausibly many");
    vocab.token_bytes.assign(n, std::string());
    std::vector<bool> seen(n, false);
    std::string bytes;
    for (const auto& [key, id] : reader.entries) {
        LLMC_CHECK(id >= 0 && static_cast<size_t>(id) < n,
                   path + ": token \"" + printable(key) + "\" has id " + std::to_string(id) + " outside [0, " +
                       std::to_string(n) + ")");
        LLMC_CHECK(!seen[id], path + ": id " + std::to_string(id) + " is used by two tokens");
        seen[id] = true;
        LLMC_CHECK(unmap_bytes(key, unicode_to_byte, bytes),
                   path + ": token \"" + printable(key) + "\" is not spelled with GPT-2's byte-to-unicode map");
        LLMC_CHECK(!bytes.empty(), path + ": empty token string (id " + std::to_string(id) + ")");
        vocab.token_bytes[id] = bytes;
        if (key == "<|endoftext|>") vocab.eot = static_cast<int>(id);
    }
    LLMC_CHECK(vocab.eot >= 0, path + ": no \"<|endoftext|>\" token");
    vocab.build_index();
    for (size_t id = 0; id < n; id++)
        LLMC_CHECK(static_cast<int>(id) == vocab.eot || vocab.find_token(vocab.token_bytes[id]) == static_cast<int>(id),
                   path + ": token \"" + printable(vocab.token_bytes[id]) + "\" appears twice");
}

// Reads the merges and returns, per token id, the rank of the merge that creates it (-1: a byte token or none).
std::vector<int> load_vocab_bpe(const std::string& path, const UnicodeToByte& unicode_to_byte, Vocabulary& vocab) {
    const std::vector<std::byte> raw = read_whole_file(path, kMaxVocabularyFileBytes);
    const std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
    std::vector<int> merge_rank(vocab.token_bytes.size(), -1);
    vocab.mergeable.assign(vocab.token_bytes.size(), false);
    for (int b = 0; b < 256; b++) vocab.mergeable[vocab.byte_token[b]] = true;

    size_t line_start = 0, line_number = 0;
    int rank = 0;
    std::string left, right;
    while (line_start < text.size()) {
        size_t line_end = text.find('\n', line_start);
        if (line_end == std::string_view::npos) line_end = text.size();
        std::string_view line = text.substr(line_start, line_end - line_start);
        line_start = line_end + 1;
        line_number++;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
        const size_t space = line.find(' ');
        LLMC_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                       line.find(' ', space + 1) == std::string_view::npos,
                   path + ": line " + std::to_string(line_number) +
                       ": expected two symbols separated by one space, got \"" + printable(line) + "\"");
        LLMC_CHECK(unmap_bytes(line.substr(0, space), unicode_to_byte, left) &&
                       unmap_bytes(line.substr(space + 1), unicode_to_byte, right),
                   path + ": line " + std::to_string(line_number) +
                       ": symbols are not spelled with GPT-2's byte-to-unicode map");
        const int left_id = vocab.find_token(left), right_id = vocab.find_token(right);
        const int merged_id = vocab.find_token(left + right);
        LLMC_CHECK(left_id >= 0 && right_id >= 0 && merged_id >= 0,
                   path + ": line " + std::to_string(line_number) + ": merge \"" + printable(line) +
                       "\" uses or makes a token missing from encoder.json");
        LLMC_CHECK(vocab.mergeable[left_id] && vocab.mergeable[right_id],
                   path + ": line " + std::to_string(line_number) + ": merge \"" + printable(line) +
                       "\" uses a token no earlier merge creates");
        LLMC_CHECK(!vocab.mergeable[merged_id], path + ": line " + std::to_string(line_number) + ": merge \"" +
                                                    printable(line) + "\" makes a token that already exists");
        merge_rank[merged_id] = rank++;
        vocab.mergeable[merged_id] = true;
    }
    LLMC_CHECK(rank > 0, path + ": no merges (expected GPT-2's vocab.bpe)");
    // A vocab.bpe cut at a line boundary parses fine; the tokens no merge reaches give it away.
    size_t unreachable = 0;
    for (size_t id = 0; id < vocab.mergeable.size(); id++)
        if (!vocab.mergeable[id] && static_cast<int>(id) != vocab.eot) unreachable++;
    LLMC_CHECK(unreachable == 0, path + ": its " + std::to_string(rank) + " merges leave " +
                                     std::to_string(unreachable) +
                                     " tokens of encoder.json unreachable (truncated, or not the matching file)");
    return merge_rank;
}

void build_pair_table(Vocabulary& vocab, const std::vector<int>& merge_rank) {
    size_t total_splits = 0;
    for (size_t id = 0; id < merge_rank.size(); id++)
        if (merge_rank[id] >= 0) total_splits += vocab.token_bytes[id].size() - 1;
    vocab.pairs.reserve(total_splits);
    for (size_t id = 0; id < merge_rank.size(); id++) {
        if (merge_rank[id] < 0) continue;
        const std::string_view bytes = vocab.token_bytes[id];
        for (size_t k = 1; k < bytes.size(); k++) {
            const int left = vocab.find_mergeable(bytes.substr(0, k));
            if (left < 0) continue;
            const int right = vocab.find_mergeable(bytes.substr(k));
            // A pair's concatenation names one token, so no pair is ever set twice.
            if (right >= 0) vocab.pairs.set(left, right, static_cast<int>(id), merge_rank[id]);
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Word cache: piece bytes -> tokens (bpe_merge.h's, shared with the tokenizer.json encoder).

class Gpt2Bpe::WordCache : public bpe::WordCache {};

// ---------------------------------------------------------------------------------------------------------------
// Gpt2Bpe

Gpt2Bpe::Gpt2Bpe(std::shared_ptr<const Vocabulary> vocab)
    : vocab_(std::move(vocab)), cache_(std::make_unique<WordCache>()) {}
Gpt2Bpe::Gpt2Bpe(const Gpt2Bpe& other) : vocab_(other.vocab_), cache_(std::make_unique<WordCache>()) {}
Gpt2Bpe& Gpt2Bpe::operator=(const Gpt2Bpe& other) {
    vocab_ = other.vocab_;
    cache_ = std::make_unique<WordCache>();
    return *this;
}
Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe::~Gpt2Bpe() = default;

Gpt2Bpe Gpt2Bpe::load(const std::string& encoder_json, const std::string& vocab_bpe) {
    const std::array<char32_t, 256> byte_to_unicode = bpe::byte_to_unicode();
    UnicodeToByte unicode_to_byte;
    unicode_to_byte.fill(-1);
    for (int b = 0; b < 256; b++) unicode_to_byte[byte_to_unicode[b]] = b;

    auto vocab = std::make_shared<Vocabulary>();
    load_encoder_json(encoder_json, unicode_to_byte, *vocab);
    for (int b = 0; b < 256; b++) {
        vocab->byte_token[b] = vocab->find_token(std::string(1, static_cast<char>(b)));
        std::string spelled;
        utf8::append(spelled, byte_to_unicode[b]);
        LLMC_CHECK(vocab->byte_token[b] >= 0, encoder_json + ": no token for byte " + std::to_string(b) + " (\"" +
                                                  spelled + "\"); not a byte-level BPE vocabulary");
    }
    const std::vector<int> merge_rank = load_vocab_bpe(vocab_bpe, unicode_to_byte, *vocab);
    build_pair_table(*vocab, merge_rank);
    return Gpt2Bpe(std::move(vocab));
}

void Gpt2Bpe::encode_piece(std::string_view piece, std::vector<int>& out) {
    const Vocabulary& vocab = *vocab_;
    if (piece.size() == 1) {
        out.push_back(vocab.byte_token[static_cast<unsigned char>(piece[0])]);
        return;
    }
    const bool cacheable = piece.size() <= WordCache::kMaxWordBytes;
    const uint64_t hash = cacheable ? bpe::hash_bytes(piece) : 0;
    if (cacheable) {
        const std::span<const int> hit = cache_->find(piece, hash);
        if (!hit.empty()) {
            out.insert(out.end(), hit.begin(), hit.end());
            return;
        }
    }
    std::vector<int>& ids = merge_scratch_;
    // tiktoken emits a piece that is itself a token directly, even where merging would not reach it.
    if (const int whole = vocab.find_mergeable(piece); whole >= 0) {
        ids.assign(1, whole);
    } else {
        ids.resize(piece.size());
        for (size_t i = 0; i < piece.size(); i++) ids[i] = vocab.byte_token[static_cast<unsigned char>(piece[i])];
        bpe::merge(vocab.pairs, ids);  // tiktoken's order: lowest rank first, leftmost on ties
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) cache_->insert(piece, hash, ids);
}

void Gpt2Bpe::encode(std::string_view text, std::vector<int>& out) {
    std::string repaired;
    if (repair_utf8(text, repaired)) text = repaired;
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        const size_t j = piece_end(s, n, i);
        encode_piece(text.substr(i, j - i), out);
        i = j;
    }
}

std::string Gpt2Bpe::decode(std::span<const int> tokens) const {
    std::string text;
    for (const int id : tokens) text += token_bytes(id);
    return text;
}

const std::string& Gpt2Bpe::token_bytes(int id) const {
    LLMC_CHECK(id >= 0 && id < vocab_size(), "GPT-2 BPE: token id " + std::to_string(id) +
                                                 " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    return vocab_->token_bytes[id];
}

const std::vector<std::string>& Gpt2Bpe::all_token_bytes() const { return vocab_->token_bytes; }
int Gpt2Bpe::eot_token() const { return vocab_->eot; }
int Gpt2Bpe::vocab_size() const { return static_cast<int>(vocab_->token_bytes.size()); }
size_t Gpt2Bpe::cached_words() const { return cache_->size(); }

}  // namespace llmc
