// Hugging Face tokenizer.json byte-level BPE (see hf_tokenizer.h): loading and checking the file into shared
// immutable tables, then encoding (added tokens, normalizer, pre-tokenizer stages, BPE with a word cache) and
// decoding.
#include "llmc/data/hf_tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/bpe.h"
#include "llmc/data/bpe_merge.h"
#include "llmc/data/pretoken_regex.h"
#include "llmc/data/utf8.h"

namespace llmc {

using json = nlohmann::json;

namespace {

// Real tokenizer.json files are 2-12 MB; the limit only stops a device or an endless pipe from filling memory.
constexpr size_t kMaxFileBytes = size_t(1) << 30;
constexpr int kMaxVocabulary = 1 << 24;

// ---------------------------------------------------------------------------------------------------------------
// UTF-8 helpers (the text is valid UTF-8 once repaired)

// The code point that ends just before byte `end` (> 0), and its start.
inline char32_t decode_before(const unsigned char* s, size_t end, size_t& start) {
    start = end - 1;
    while (start > 0 && (s[start] & 0xC0) == 0x80) start--;
    size_t len;
    return utf8::decode(s, start, len);
}

inline bool is_white_space(char32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }
// Rust's char::is_alphanumeric() || '_': what single_word added tokens must not touch.
inline bool is_word_char(char32_t cp) {
    return cp == '_' || (U_MASK(u_charType(static_cast<UChar32>(cp))) & (U_GC_L_MASK | U_GC_N_MASK)) != 0;
}
inline bool is_numeric(char32_t cp) { return (U_MASK(u_charType(static_cast<UChar32>(cp))) & U_GC_N_MASK) != 0; }

using bpe::printable;

std::string one_line(std::string message) {
    std::replace(message.begin(), message.end(), '\n', ' ');
    return message;
}

// ---------------------------------------------------------------------------------------------------------------
// Pipeline parts

struct AddedToken {
    std::string content;
    int id = -1;
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest matching of added tokens: candidates bucketed by first byte, longest first.
struct AddedMatcher {
    std::array<std::vector<const AddedToken*>, 256> by_first_byte;
    bool empty = true;

    void add(const AddedToken* token) {
        by_first_byte[static_cast<unsigned char>(token->content[0])].push_back(token);
        empty = false;
    }
    void finish() {
        for (auto& bucket : by_first_byte)
            std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
                return a->content.size() > b->content.size();
            });
    }
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Stage {
    enum Kind { kSplit, kByteLevel, kDigits } kind = kSplit;
    std::shared_ptr<const PretokenRegex> regex;  // Split {Regex}, or ByteLevel's GPT-2 regex when use_regex
    std::string literal;                         // Split {String}
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool individual_digits = false;
};

// GPT-2's pre-tokenization regex, which the ByteLevel pre-tokenizer applies when use_regex is true.
const char* kByteLevelRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct HfTokenizer::Model {
    std::string path;
    std::vector<std::string> token_bytes;  // id -> bytes ("" and !assigned for ids the file leaves unassigned)
    std::vector<bool> assigned;
    std::array<int, 256> byte_token{};     // byte -> id of the token spelling it
    bpe::PairTable pairs;
    bool ignore_merges = false;
    bool nfc = false;
    std::vector<AddedToken> added;
    AddedMatcher raw_added, normalized_added;
    std::vector<Stage> stages;
    std::optional<int> eos;

    // bytes -> id of the byte-level vocab tokens (ignore_merges' whole-word lookup)
    bpe::TokenIndex index;
    std::vector<bool> indexed;

    void build_index() {
        index.build(token_bytes, [&](size_t id) { return !indexed[id]; });
    }
    int find_token(std::string_view bytes) const { return index.find(token_bytes, bytes); }
};

struct HfTokenizer::State {
    bpe::WordCache cache;
    std::vector<int> merge_scratch;
    struct StageScratch {
        PretokenRegex::Scratch regex;
        std::vector<PretokenRegex::Span> spans;
        struct Piece {
            uint32_t begin, end;
            bool is_match;
        };
        std::vector<Piece> pieces;
        std::string prefixed;
    };
    std::vector<StageScratch> stages;
    std::u16string utf16_in, utf16_out;  // NFC buffers
};

// ---------------------------------------------------------------------------------------------------------------
// Loading

namespace {

class Loader {
public:
    explicit Loader(const std::string& path) : path_(path) {}

    [[noreturn]] void fail(const std::string& what) const { llmc::fail(one_line(path_ + ": " + what)); }

    const json& field(const json& object, const char* name, const std::string& where) const {
        if (!object.is_object()) fail(where + ": expected an object");
        const auto it = object.find(name);
        if (it == object.end()) fail(where + "." + name + ": missing");
        return *it;
    }
    // The field's value, or nullptr when it is absent or null.
    const json* optional(const json& object, const char* name) const {
        const auto it = object.find(name);
        return it == object.end() || it->is_null() ? nullptr : &*it;
    }
    bool flag(const json& object, const char* name, bool fallback, const std::string& where) const {
        const json* value = optional(object, name);
        if (!value) return fallback;
        if (!value->is_boolean()) fail(where + "." + name + ": expected true or false");
        return value->get<bool>();
    }
    std::string type_of(const json& object, const std::string& where) const {
        if (!object.is_object()) fail(where + ": expected an object");
        const json* type = optional(object, "type");
        if (!type || !type->is_string()) fail(where + ".type: missing or not a string");
        return type->get<std::string>();
    }

    void load(HfTokenizer::Model& model) {
        const std::vector<std::byte> raw = read_whole_file(path_, kMaxFileBytes);
        json root;
        try {
            const char* begin = reinterpret_cast<const char*>(raw.data());
            root = json::parse(begin, begin + raw.size());
        } catch (const json::exception& e) {
            fail(std::string("not valid JSON (") + e.what() + ")");
        }
        if (!root.is_object()) fail("expected a JSON object (a Hugging Face tokenizer.json)");
        model.path = path_;
        load_model(field(root, "model", "tokenizer"), model);
        if (const json* added = optional(root, "added_tokens")) load_added(*added, model);
        if (const json* normalizer = optional(root, "normalizer")) load_normalizer(*normalizer, "normalizer", model);
        load_pre_tokenizer(root, model);
        if (const json* decoder = optional(root, "decoder")) check_decoder(*decoder, "decoder");
        // The post_processor only adds BOS/EOS-style tokens around the text: encode() adds nothing, by design.
        model.build_index();
        for (const AddedToken& token : model.added)
            if (token.content == "<|endoftext|>" || token.content == "<|end_of_text|>") {
                model.eos = token.id;
                break;
            }
    }

private:
    void grow_to(HfTokenizer::Model& model, int64_t id, const std::string& where) {
        if (id < 0 || id >= kMaxVocabulary) fail(where + ": id " + std::to_string(id) + " is outside [0, 2^24)");
        if (static_cast<size_t>(id) >= model.token_bytes.size()) {
            model.token_bytes.resize(id + 1);
            model.assigned.resize(id + 1, false);
            model.indexed.resize(id + 1, false);
        }
    }

    void load_model(const json& m, HfTokenizer::Model& model) {
        if (!m.is_object()) fail("model: expected an object");
        std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
        if (type.empty()) {
            if (!m.contains("merges")) fail("model.type: missing (and no merges: not a BPE model)");
            type = "BPE";
        }
        if (type != "BPE") fail("model type " + type + " is not supported (byte-level BPE only)");
        if (optional(m, "dropout")) fail("model.dropout: must be null (BPE dropout is not supported)");
        for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
            const json* value = optional(m, name);
            if (value && (!value->is_string() || !value->get<std::string>().empty()))
                fail(std::string("model.") + name + ": must be null or empty (byte-level BPE only)");
        }
        if (flag(m, "byte_fallback", false, "model")) fail("model.byte_fallback: true is not supported (byte-level BPE only)");
        model.ignore_merges = flag(m, "ignore_merges", false, "model");

        const std::array<char32_t, 256> byte_to_unicode = bpe::byte_to_unicode();
        std::array<int, 512> unicode_to_byte;
        unicode_to_byte.fill(-1);
        for (int b = 0; b < 256; b++) unicode_to_byte[byte_to_unicode[b]] = b;

        const json& vocab = field(m, "vocab", "model");
        if (!vocab.is_object()) fail("model.vocab: expected an object mapping token strings to ids");
        // Keys are views of the DOM's strings, which outlive this function's use of them.
        std::unordered_map<std::string_view, int> id_of;
        id_of.reserve(vocab.size() * 2);
        std::string bytes;
        for (auto entry = vocab.begin(); entry != vocab.end(); ++entry) {
            const std::string& key = entry.key();  // the object's own key: id_of may keep a view of it
            const json& value = entry.value();
            if (!value.is_number_integer()) fail("model.vocab: token \"" + printable(key) + "\" has a non-integer id");
            const int64_t id = value.get<int64_t>();
            grow_to(model, id, "model.vocab: token \"" + printable(key) + "\"");
            if (model.assigned[id]) fail("model.vocab: id " + std::to_string(id) + " is used by two tokens");
            // A token spelled with the byte-to-unicode map decodes to those bytes; any other (e.g. a special token
            // left in the vocab) to its own UTF-8, as Hugging Face's ByteLevel decoder falls back to.
            bool mapped = !key.empty();
            bytes.clear();
            const auto* s = reinterpret_cast<const unsigned char*>(key.data());
            for (size_t i = 0; i < key.size() && mapped;) {
                size_t len;
                const char32_t cp = utf8::decode(s, i, len);
                if (cp >= unicode_to_byte.size() || unicode_to_byte[cp] < 0) mapped = false;
                else bytes += static_cast<char>(unicode_to_byte[cp]);
                i += len;
            }
            model.token_bytes[id] = mapped ? bytes : key;
            model.assigned[id] = true;
            model.indexed[id] = mapped;
            id_of.emplace(key, static_cast<int>(id));
        }
        if (id_of.empty()) fail("model.vocab: empty");
        for (int b = 0; b < 256; b++) {
            std::string spelled;
            utf8::append(spelled, byte_to_unicode[b]);
            const auto it = id_of.find(spelled);
            // Bytes that never occur in (repaired) UTF-8 may lack a token, as C0, C1 and F5..FF do in GPT-NeoX's.
            const bool never_in_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
            if (it == id_of.end() && !never_in_utf8)
                fail("model.vocab: no token for byte " + std::to_string(b) + " (\"" + spelled +
                     "\"); not a byte-level BPE vocabulary");
            model.byte_token[b] = it == id_of.end() ? -1 : it->second;
        }

        const json& merges = field(m, "merges", "model");
        if (!merges.is_array()) fail("model.merges: expected an array");
        model.pairs.reserve(merges.size());
        std::string_view left, right;
        std::string joined;
        for (size_t rank = 0; rank < merges.size(); rank++) {
            const json& merge = merges[rank];
            const std::string where = "model.merges[" + std::to_string(rank) + "]";
            if (merge.is_string()) {
                const std::string& line = merge.get_ref<const std::string&>();
                const size_t space = line.find(' ');
                if (space == std::string::npos || space == 0 || space + 1 >= line.size() ||
                    line.find(' ', space + 1) != std::string::npos)
                    fail(where + ": expected two tokens separated by one space, got \"" + printable(line) + "\"");
                left = std::string_view(line).substr(0, space);
                right = std::string_view(line).substr(space + 1);
            } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
                left = merge[0].get_ref<const std::string&>();
                right = merge[1].get_ref<const std::string&>();
            } else {
                fail(where + ": expected \"a b\" or [\"a\", \"b\"]");
            }
            joined.assign(left);
            joined += right;
            const auto l = id_of.find(left), r = id_of.find(right), merged = id_of.find(joined);
            if (l == id_of.end() || r == id_of.end() || merged == id_of.end())
                fail(where + ": merge \"" + printable(left) + " " + printable(right) +
                     "\" uses or makes a token missing from model.vocab");
            model.pairs.set(l->second, r->second, merged->second, static_cast<int>(rank));
        }
    }

    void load_added(const json& added, HfTokenizer::Model& model) {
        if (!added.is_array()) fail("added_tokens: expected an array");
        for (size_t i = 0; i < added.size(); i++) {
            const std::string where = "added_tokens[" + std::to_string(i) + "]";
            const json& t = added[i];
            const json& content = field(t, "content", where);
            const json& id = field(t, "id", where);
            if (!content.is_string() || content.get_ref<const std::string&>().empty())
                fail(where + ".content: expected a non-empty string");
            if (!id.is_number_integer()) fail(where + ".id: expected an integer");
            AddedToken token;
            token.content = content.get<std::string>();
            std::string repaired;
            if (repair_utf8(token.content, repaired)) fail(where + ".content: not valid UTF-8");
            token.id = static_cast<int>(id.get<int64_t>());
            grow_to(model, id.get<int64_t>(), where + ".id");
            const bool special = flag(t, "special", false, where);
            token.lstrip = flag(t, "lstrip", false, where);
            token.rstrip = flag(t, "rstrip", false, where);
            token.single_word = flag(t, "single_word", false, where);
            token.normalized = flag(t, "normalized", !special, where);
            model.token_bytes[token.id] = token.content;
            model.assigned[token.id] = true;
            model.added.push_back(std::move(token));
        }
        // Later entries with the same content replace earlier ones (a map, as in Hugging Face's loaders).
        for (size_t i = 0; i < model.added.size(); i++) {
            const AddedToken& token = model.added[i];
            bool shadowed = false;
            for (size_t j = i + 1; j < model.added.size() && !shadowed; j++)
                shadowed = model.added[j].content == token.content;
            if (shadowed) continue;
            (token.normalized ? model.normalized_added : model.raw_added).add(&token);
        }
        model.raw_added.finish();
        model.normalized_added.finish();
    }

    void load_normalizer(const json& n, const std::string& where, HfTokenizer::Model& model) {
        const std::string type = type_of(n, where);
        if (type == "NFC") {
            model.nfc = true;
        } else if (type == "Sequence") {
            const json& list = field(n, "normalizers", where);
            if (!list.is_array()) fail(where + ".normalizers: expected an array");
            for (size_t i = 0; i < list.size(); i++)
                load_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", model);
        } else {
            fail(where + " " + type + " is not supported (NFC or a Sequence of NFC only)");
        }
    }

    void load_stage(const json& p, const std::string& where, HfTokenizer::Model& model) {
        const std::string type = type_of(p, where);
        Stage stage;
        if (type == "Sequence") {
            const json& list = field(p, "pretokenizers", where);
            if (!list.is_array()) fail(where + ".pretokenizers: expected an array");
            for (size_t i = 0; i < list.size(); i++)
                load_stage(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", model);
            return;
        }
        if (!model.stages.empty() && model.stages.back().kind == Stage::kByteLevel)
            fail(where + ": " + type + " after ByteLevel is not supported (ByteLevel must come last)");
        if (type == "ByteLevel") {
            stage.kind = Stage::kByteLevel;
            stage.add_prefix_space = flag(p, "add_prefix_space", false, where);
            if (flag(p, "use_regex", true, where)) stage.regex = PretokenRegex::compile(kByteLevelRegex, path_ + ": " + where);
        } else if (type == "Split") {
            stage.kind = Stage::kSplit;
            const json& pattern = field(p, "pattern", where);
            if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
                stage.regex = PretokenRegex::compile(pattern["Regex"].get<std::string>(), path_ + ": " + where);
            } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
                stage.literal = pattern["String"].get<std::string>();
            } else {
                fail(where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
            }
            const json& behavior = field(p, "behavior", where);
            const std::string b = behavior.is_string() ? behavior.get<std::string>() : "";
            if (b == "Removed") stage.behavior = Behavior::kRemoved;
            else if (b == "Isolated") stage.behavior = Behavior::kIsolated;
            else if (b == "MergedWithPrevious") stage.behavior = Behavior::kMergedWithPrevious;
            else if (b == "MergedWithNext") stage.behavior = Behavior::kMergedWithNext;
            else if (b == "Contiguous") stage.behavior = Behavior::kContiguous;
            else fail(where + ".behavior: expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
            stage.invert = flag(p, "invert", false, where);
        } else if (type == "Digits") {
            stage.kind = Stage::kDigits;
            stage.individual_digits = flag(p, "individual_digits", false, where);
        } else {
            fail(where + " " + type + " is not supported (ByteLevel, Split, Digits or a Sequence of them)");
        }
        model.stages.push_back(std::move(stage));
    }

    void load_pre_tokenizer(const json& root, HfTokenizer::Model& model) {
        const json* p = optional(root, "pre_tokenizer");
        if (!p) fail("pre_tokenizer: missing or null (byte-level BPE needs a ByteLevel pre-tokenizer)");
        load_stage(*p, "pre_tokenizer", model);
        if (model.stages.empty() || model.stages.back().kind != Stage::kByteLevel)
            fail("pre_tokenizer: no ByteLevel step (byte-level BPE only)");
    }

    void check_decoder(const json& d, const std::string& where) {
        const std::string type = type_of(d, where);
        if (type == "ByteLevel") return;
        if (type == "Sequence") {
            const json& list = field(d, "decoders", where);
            if (!list.is_array()) fail(where + ".decoders: expected an array");
            for (size_t i = 0; i < list.size(); i++) check_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]");
            return;
        }
        fail(where + " " + type + " is not supported (ByteLevel only)");
    }

    std::string path_;
};

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& tokenizer_json) {
    auto model = std::make_shared<Model>();
    Loader(tokenizer_json).load(*model);
    return std::make_unique<HfTokenizer>(std::move(model));
}

std::unique_ptr<TextTokenizer> load_hf_tokenizer(const std::string& tokenizer_json) {
    return HfTokenizer::load(tokenizer_json);
}

HfTokenizer::HfTokenizer(std::shared_ptr<const Model> model) : model_(std::move(model)), state_(std::make_unique<State>()) {
    state_->stages.resize(model_->stages.size());
}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<TextTokenizer> HfTokenizer::clone() const { return std::make_unique<HfTokenizer>(model_); }
const std::string& HfTokenizer::source() const { return model_->path; }
int HfTokenizer::vocab_size() const { return static_cast<int>(model_->token_bytes.size()); }
std::optional<int> HfTokenizer::eos_token() const { return model_->eos; }
size_t HfTokenizer::cached_words() const { return state_->cache.size(); }

bool HfTokenizer::is_assigned(int id) const {
    return id >= 0 && id < vocab_size() && model_->assigned[id];
}

const std::string& HfTokenizer::token_bytes(int id) const {
    LLMC_CHECK(is_assigned(id), model_->path + ": token id " + std::to_string(id) +
                                    (id >= 0 && id < vocab_size() ? " is not assigned by the file"
                                                                  : " is outside [0, " + std::to_string(vocab_size()) + ")"));
    return model_->token_bytes[id];
}

std::string HfTokenizer::decode(std::span<const int> ids) const {
    std::string text;
    for (const int id : ids) text += token_bytes(id);
    return text;
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding

namespace {

// Splits `text` on the added tokens of `matcher` and calls emit(piece, -1) for the text between them and
// emit({}, id) for each token, as Hugging Face's AddedVocabulary does: leftmost-longest, a single_word token only
// where no word character touches it, and lstrip / rstrip taking the white space beside it into the token.
template <class Emit>
void split_added(const AddedMatcher& matcher, std::string_view text, Emit emit) {
    if (matcher.empty) {
        emit(text, -1);
        return;
    }
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        const auto& bucket = matcher.by_first_byte[s[i]];
        const AddedToken* found = nullptr;
        for (const AddedToken* token : bucket) {
            const size_t len = token->content.size();
            if (len > n - i || std::memcmp(s + i, token->content.data(), len) != 0) continue;
            if (token->single_word) {
                size_t at;
                if (i > 0 && is_word_char(decode_before(s, i, at))) continue;
                size_t l;
                if (i + len < n && is_word_char(utf8::decode(s, i + len, l))) continue;
            }
            found = token;
            break;
        }
        if (!found) {
            i++;
            continue;
        }
        size_t start = i, end = i + found->content.size();
        if (found->lstrip)
            while (start > last) {
                size_t before;
                if (!is_white_space(decode_before(s, start, before))) break;
                start = before;
            }
        if (found->rstrip)
            while (end < n) {
                size_t len;
                if (!is_white_space(utf8::decode(s, end, len))) break;
                end += len;
            }
        if (start > last) emit(text.substr(last, start - last), -1);
        emit(std::string_view(), found->id);
        last = i = end;
    }
    if (last < n) emit(text.substr(last), -1);
}

// NFC of valid UTF-8 `text` into `out`; false (out untouched) when it is already NFC for certain: no code point
// at or above U+0300 (lead bytes >= 0xCC) can be changed or combined with by NFC.
bool nfc(std::string_view text, std::string& out, std::u16string& a, std::u16string& b) {
    bool maybe = false;
    for (const char c : text)
        if (static_cast<unsigned char>(c) >= 0xCC) {
            maybe = true;
            break;
        }
    if (!maybe) return false;
    UErrorCode status = U_ZERO_ERROR;
    const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
    LLMC_CHECK(U_SUCCESS(status), "ICU: no NFC normalizer");
    a.resize(text.size() + 1);
    int32_t length = 0;
    u_strFromUTF8(a.data(), static_cast<int32_t>(a.size()), &length, text.data(), static_cast<int32_t>(text.size()),
                  &status);
    LLMC_CHECK(U_SUCCESS(status), "ICU: UTF-8 -> UTF-16 failed");
    if (unorm2_quickCheck(normalizer, a.data(), length, &status) == UNORM_YES && U_SUCCESS(status)) return false;
    status = U_ZERO_ERROR;
    b.resize(2 * static_cast<size_t>(length) + 16);
    int32_t normalized = unorm2_normalize(normalizer, a.data(), length, b.data(), static_cast<int32_t>(b.size()), &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
        status = U_ZERO_ERROR;
        b.resize(normalized + 1);
        normalized = unorm2_normalize(normalizer, a.data(), length, b.data(), static_cast<int32_t>(b.size()), &status);
    }
    LLMC_CHECK(U_SUCCESS(status), "ICU: NFC normalization failed");
    out.resize(3 * static_cast<size_t>(normalized) + 4);
    int32_t bytes = 0;
    u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &bytes, b.data(), normalized, &status);
    LLMC_CHECK(U_SUCCESS(status), "ICU: UTF-16 -> UTF-8 failed");
    out.resize(bytes);
    return true;
}

using Piece = HfTokenizer::State::StageScratch::Piece;

// Hugging Face's SplitDelimiterBehavior over pieces that cover the text (is_match: a delimiter), in place.
void apply_behavior(Behavior behavior, std::vector<Piece>& pieces) {
    std::vector<Piece> out;
    switch (behavior) {
    case Behavior::kIsolated: return;
    case Behavior::kRemoved:
        std::erase_if(pieces, [](const Piece& p) { return p.is_match; });
        return;
    case Behavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const Piece& p : pieces) {
            if (p.is_match && !previous_match && !out.empty()) out.back().end = p.end;
            else out.push_back(p);
            previous_match = p.is_match;
        }
        break;
    }
    case Behavior::kMergedWithNext: {
        bool previous_match = false;
        for (size_t k = pieces.size(); k-- > 0;) {
            const Piece& p = pieces[k];
            if (p.is_match && !previous_match && !out.empty()) out.back().begin = p.begin;
            else out.push_back(p);
            previous_match = p.is_match;
        }
        std::reverse(out.begin(), out.end());
        break;
    }
    case Behavior::kContiguous: {
        bool previous_match = false;
        for (const Piece& p : pieces) {
            if (p.is_match == previous_match && !out.empty()) out.back().end = p.end;
            else out.push_back(p);
            previous_match = p.is_match;
        }
        break;
    }
    }
    pieces.swap(out);
}

}  // namespace

void HfTokenizer::encode(std::string_view text, std::vector<int>& out) {
    const Model& model = *model_;
    State& state = *state_;
    std::string repaired;
    if (repair_utf8(text, repaired)) text = repaired;
    split_added(model.raw_added, text, [&](std::string_view piece, int id) {
        if (id >= 0) {
            out.push_back(id);
            return;
        }
        std::string normalized;
        if (model.nfc && nfc(piece, normalized, state.utf16_in, state.utf16_out)) piece = normalized;
        split_added(model.normalized_added, piece, [&](std::string_view inner, int inner_id) {
            if (inner_id >= 0) out.push_back(inner_id);
            else run_stages(0, inner, out, nullptr);
        });
    });
}

std::vector<std::string> HfTokenizer::pretokenize(std::string_view text) {
    std::vector<std::string> pieces;
    std::vector<int> unused;
    run_stages(0, text, unused, &pieces);
    return pieces;
}

void HfTokenizer::run_stages(size_t k, std::string_view piece, std::vector<int>& out, std::vector<std::string>* pieces) {
    if (piece.empty()) return;
    const Model& model = *model_;
    if (k == model.stages.size()) {
        if (pieces) pieces->emplace_back(piece);
        else encode_piece(piece, out);
        return;
    }
    const Stage& stage = model.stages[k];
    State::StageScratch& scratch = state_->stages[k];
    if (stage.kind == Stage::kByteLevel && stage.add_prefix_space && piece[0] != ' ') {
        // Re-enter with the prefixed text (a local: the call reuses this stage's scratch); it starts with ' ',
        // so the prefix is not added twice.
        std::string prefixed = " ";
        prefixed += piece;
        run_stages(k, prefixed, out, pieces);
        return;
    }
    const auto* s = reinterpret_cast<const unsigned char*>(piece.data());
    std::vector<Piece>& parts = scratch.pieces;
    parts.clear();
    if (stage.kind == Stage::kDigits) {
        // Digits is a split on char::is_numeric: runs of digits, each digit alone when individual_digits.
        size_t i = 0;
        while (i < piece.size()) {
            size_t len;
            const bool digit = is_numeric(utf8::decode(s, i, len));
            size_t j = i + len;
            if (!digit || !stage.individual_digits)
                while (j < piece.size()) {
                    size_t l;
                    if (is_numeric(utf8::decode(s, j, l)) != digit) break;
                    j += l;
                }
            parts.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(j), digit});
            i = j;
        }
    } else {
        std::vector<PretokenRegex::Span>& spans = scratch.spans;
        spans.clear();
        if (stage.regex) {
            stage.regex->find_all(piece, scratch.regex, spans);
        } else if (!stage.literal.empty()) {
            for (size_t at = piece.find(stage.literal); at != std::string_view::npos;
                 at = piece.find(stage.literal, at + stage.literal.size()))
                spans.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(at + stage.literal.size())});
        }
        uint32_t prev = 0;
        for (const auto& span : spans) {
            if (span.begin > prev) parts.push_back({prev, span.begin, stage.invert});
            parts.push_back({span.begin, span.end, !stage.invert});
            prev = span.end;
        }
        if (prev < piece.size()) parts.push_back({prev, static_cast<uint32_t>(piece.size()), stage.invert});
        if (stage.kind == Stage::kSplit) apply_behavior(stage.behavior, parts);
        // ByteLevel's regex isolates its matches (and keeps what lies between, which its regex never leaves).
    }
    for (const Piece& p : parts) run_stages(k + 1, piece.substr(p.begin, p.end - p.begin), out, pieces);
}

void HfTokenizer::encode_piece(std::string_view piece, std::vector<int>& out) {
    const Model& model = *model_;
    if (piece.size() == 1) {
        out.push_back(model.byte_token[static_cast<unsigned char>(piece[0])]);
        return;
    }
    bpe::WordCache& cache = state_->cache;
    const bool cacheable = piece.size() <= bpe::WordCache::kMaxWordBytes;
    const uint64_t hash = cacheable ? bpe::hash_bytes(piece) : 0;
    if (cacheable) {
        const std::span<const int> hit = cache.find(piece, hash);
        if (!hit.empty()) {
            out.insert(out.end(), hit.begin(), hit.end());
            return;
        }
    }
    std::vector<int>& ids = state_->merge_scratch;
    const int whole = model.ignore_merges ? model.find_token(piece) : -1;
    if (whole >= 0) {
        ids.assign(1, whole);
    } else {
        ids.resize(piece.size());
        for (size_t i = 0; i < piece.size(); i++) ids[i] = model.byte_token[static_cast<unsigned char>(piece[i])];
        bpe::merge(model.pairs, ids);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) cache.insert(piece, hash, ids);
}

}  // namespace llmc
