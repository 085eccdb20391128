// Unit tests of the tokenizer.json encoder (llmc/data/hf_tokenizer.h) on small hand-made files, for what the
// JavaScript oracle of test/e2e/test_hf_tokenizer.sh cannot check (it implements neither every Split behaviour nor
// single_word) and for exact expectations derived by hand from Hugging Face's rules: the five Split behaviours
// and invert, Digits, ByteLevel's add_prefix_space, added tokens with lstrip / rstrip / single_word / normalized
// under NFC, ignore_merges, leftmost merging on equal ranks, both merge formats, ids the file leaves unassigned.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/data/bpe_merge.h"
#include "llmc/data/hf_tokenizer.h"
#include "test/support/testing.h"

namespace {

using json = nlohmann::json;
using Pieces = std::vector<std::string>;
using Ids = std::vector<int>;

std::string spelled(const std::string& bytes) {
    static const auto table = llmc::bpe::byte_to_unicode();
    std::string out;
    for (unsigned char b : bytes) {
        const char32_t cp = table[b];
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }
    return out;
}

// A byte-level file: ids 0..255 are the bytes, 256 "ab" (merge a b), 257 "abc" (no merge makes it), 258 "aa"
// (merge a a); 259..299 unassigned; added tokens from 300.
json base_file() {
    json vocab = json::object();
    for (int b = 0; b < 256; b++) vocab[spelled(std::string(1, static_cast<char>(b)))] = b;
    vocab["ab"] = 256;
    vocab["abc"] = 257;
    vocab["aa"] = 258;
    json file;
    file["version"] = "1.0";
    file["added_tokens"] = json::array();
    file["normalizer"] = nullptr;
    file["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
    file["post_processor"] = nullptr;
    file["decoder"] = {{"type", "ByteLevel"}};
    file["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab},
                     {"merges", json::array({"a b", json::array({"a", "a"})})}};
    return file;
}

json split(json pattern, const std::string& behavior, bool invert = false) {
    return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

json with_stages(json file, std::vector<json> stages) {
    stages.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
    file["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", stages}};
    return file;
}

std::unique_ptr<llmc::HfTokenizer> load(const json& file) {
    static int counter = 0;
    const std::string path = "/tmp/llmc_test_hf_tokenizer_" + std::to_string(getpid()) + "_" +
                             std::to_string(counter++) + ".json";
    std::ofstream(path) << file.dump();
    auto tok = llmc::HfTokenizer::load(path);
    std::remove(path.c_str());
    return tok;
}

Pieces pieces(const json& file, const std::string& text) { return load(file)->pretokenize(text); }

Ids encode(llmc::HfTokenizer& tok, const std::string& text) {
    Ids ids;
    tok.encode(text, ids);
    return ids;
}

Ids bytes_of(const std::string& s) {
    Ids ids;
    for (unsigned char c : s) ids.push_back(c);
    return ids;
}

Ids concat(std::initializer_list<Ids> parts) {
    Ids out;
    for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

}  // namespace

TEST(split_behaviors) {
    const json dash = {{"String", "-"}};
    const std::string text = "a-b--c";
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "Removed")}), text), (Pieces{"a", "b", "c"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "Isolated")}), text), (Pieces{"a", "-", "b", "-", "-", "c"}));
    // A delimiter joins the piece before it, unless that piece is itself a delimiter.
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "MergedWithPrevious")}), text), (Pieces{"a-", "b-", "-", "c"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "MergedWithNext")}), text), (Pieces{"a", "-b", "-", "-c"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "Contiguous")}), text), (Pieces{"a", "-", "b", "--", "c"}));
    // invert: the matches are the content and what lies between them the delimiters.
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "Removed", true)}), text), (Pieces{"-", "-", "-"}));
    const json digits = {{"Regex", "\\d+"}};
    EXPECT_EQ(pieces(with_stages(base_file(), {split(digits, "Isolated")}), "ab12cd3"), (Pieces{"ab", "12", "cd", "3"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {split(digits, "Removed", true)}), "ab12cd3"), (Pieces{"12", "3"}));
    // Stages apply in order, each to the pieces of the one before.
    EXPECT_EQ(pieces(with_stages(base_file(), {split(dash, "Removed"), split(digits, "Isolated")}), "x1-y22"),
              (Pieces{"x", "1", "y", "22"}));
}

TEST(digits_and_byte_level_prefix) {
    const json individual = {{"type", "Digits"}, {"individual_digits", true}};
    const json runs = {{"type", "Digits"}, {"individual_digits", false}};
    EXPECT_EQ(pieces(with_stages(base_file(), {individual}), "ab12c345"), (Pieces{"ab", "1", "2", "c", "3", "4", "5"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {runs}), "ab12c345"), (Pieces{"ab", "12", "c", "345"}));
    EXPECT_EQ(pieces(with_stages(base_file(), {runs}), "x٣٤y"), (Pieces{"x", "٣٤", "y"}));  // char::is_numeric
    json file = base_file();
    file["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    EXPECT_EQ(pieces(file, "hello world"), (Pieces{" hello", " world"}));
    EXPECT_EQ(pieces(file, "  x"), (Pieces{" ", " x"}));  // already starts with a space: nothing added
    // ByteLevel's GPT-2 regex with Oniguruma's \s (White_Space), as Hugging Face's Rust library compiles it:
    // U+0085 is space, U+FEFF is not. (The JavaScript port uses JavaScript's \s there, the other way round.)
    file["pre_tokenizer"]["add_prefix_space"] = false;
    EXPECT_EQ(pieces(file, "x \uFEFFy"), (Pieces{"x", " \uFEFF", "y"}));
    EXPECT_EQ(pieces(file, "a\u0085\u0085b"), (Pieces{"a", "\u0085", "\u0085", "b"}));
}

TEST(merges_and_ignore_merges) {
    auto tok = load(base_file());
    EXPECT_EQ(encode(*tok, "abc"), (Ids{256, 'c'}));  // no merge makes "abc"
    EXPECT_EQ(encode(*tok, "aaa"), (Ids{258, 'a'}));  // equal ranks: the leftmost pair first
    EXPECT_EQ(encode(*tok, "aab"), (Ids{'a', 256}));  // the lowest rank first ("a b" is rank 0), wherever it is
    json file = base_file();
    file["model"]["ignore_merges"] = true;
    auto whole = load(file);
    EXPECT_EQ(encode(*whole, "abc"), (Ids{257}));  // a pre-token that is a token is emitted whole
    EXPECT_EQ(encode(*whole, "abcd"), (Ids{256, 'c', 'd'}));
    EXPECT_EQ(whole->decode(Ids{257, 256}), "abcab");
}

TEST(added_tokens) {
    json file = base_file();
    file["added_tokens"] = json::array({
        {{"id", 300}, {"content", "<x>"}, {"special", true}, {"lstrip", true}, {"rstrip", false}, {"single_word", false},
         {"normalized", false}},
        {{"id", 301}, {"content", "<y>"}, {"special", true}, {"lstrip", false}, {"rstrip", true}, {"single_word", false},
         {"normalized", false}},
        {{"id", 302}, {"content", "w"}, {"special", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", true},
         {"normalized", false}},
        {{"id", 303}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}},
        {{"id", 304}, {"content", "<x>z"}, {"special", true}, {"normalized", false}},
    });
    auto tok = load(file);
    EXPECT_EQ(encode(*tok, "a  <x> b"), concat({bytes_of("a"), {300}, bytes_of(" b")}));  // lstrip eats the spaces
    EXPECT_EQ(encode(*tok, "a <y>  b"), concat({bytes_of("a "), {301}, bytes_of("b")}));  // rstrip
    EXPECT_EQ(encode(*tok, "<x>zq"), concat({{304}, bytes_of("q")}));                     // the longest match
    EXPECT_EQ(encode(*tok, "a w b"), concat({bytes_of("a "), {302}, bytes_of(" b")}));
    EXPECT_EQ(encode(*tok, "aw w"), concat({bytes_of("aw "), {302}}));  // single_word: not inside a word
    EXPECT_EQ(encode(*tok, "x<|endoftext|>"), concat({bytes_of("x"), {303}}));
    EXPECT_EQ(tok->vocab_size(), 305);
    EXPECT(tok->eos_token() == std::optional<int>(303));
    EXPECT_EQ(tok->token_bytes(300), "<x>");
    EXPECT(!tok->is_assigned(280));
    bool threw = false;
    try {
        tok->decode(Ids{280});
    } catch (const llmc::Error&) {
        threw = true;
    }
    EXPECT(threw);
}

TEST(normalized_added_tokens_under_nfc) {
    json file = base_file();
    file["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
    file["added_tokens"] = json::array({
        {{"id", 300}, {"content", "\u00E9"}, {"special", false}, {"normalized", true}},
        {{"id", 301}, {"content", "\u00F1"}, {"special", false}, {"normalized", false}},
    });
    auto tok = load(file);
    // "e" + U+0301 becomes U+00E9 under NFC, where the normalized token matches; "n" + U+0303 becomes U+00F1 too,
    // but a normalized=false token only matches the raw text.
    EXPECT_EQ(encode(*tok, "xe\u0301"), concat({bytes_of("x"), {300}}));
    EXPECT_EQ(encode(*tok, "xn\u0303"), bytes_of("x\u00F1"));
    EXPECT_EQ(encode(*tok, "x\u00F1"), concat({bytes_of("x"), {301}}));
}

TEST(bad_files_name_the_part) {
    auto message = [](const json& file) {
        try {
            load(file);
        } catch (const llmc::Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    json file = base_file();
    file["model"]["continuing_subword_prefix"] = "##";
    EXPECT(message(file).find("model.continuing_subword_prefix: must be null or empty") != std::string::npos);
    file = base_file();
    file["model"]["merges"] = json::array({"a b c"});
    EXPECT(message(file).find("model.merges[0]: expected two tokens") != std::string::npos);
    file = with_stages(base_file(), {split({{"Regex", "(?>a)"}}, "Isolated")});
    EXPECT(message(file).find("atomic group") != std::string::npos);
    file = with_stages(base_file(), {split({{"Regex", "a"}}, "Sideways")});
    EXPECT(message(file).find(".behavior: expected Removed") != std::string::npos);
    file = base_file();
    file["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({
        {{"type", "ByteLevel"}, {"use_regex", false}}, {{"type", "Digits"}}})}};
    EXPECT(message(file).find("Digits after ByteLevel is not supported") != std::string::npos);
    file = base_file();
    file["model"]["vocab"]["zz"] = 256;
    EXPECT(message(file).find("id 256 is used by two tokens") != std::string::npos);
}

int main() { return testing::run_all(); }
