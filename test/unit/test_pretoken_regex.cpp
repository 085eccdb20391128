// Unit tests of the pre-tokenization regex engine (llmc/data/pretoken_regex.h) against hand-derived matches:
// each construct on its own, the leftmost-first (backtracking) choice among alternatives and quantifier lengths,
// lookahead, case folding, Unicode classes, the real patterns of GPT-2, Llama 3 and GPT-4o on small inputs, and
// the one-line errors for unsupported constructs. The token-level agreement with Hugging Face's tokenizers lives
// in test/e2e/test_hf_tokenizer.sh.
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/data/pretoken_regex.h"
#include "test/support/testing.h"

namespace {

using Pieces = std::vector<std::string>;

Pieces matches(const std::string& pattern, const std::string& text) {
    const auto regex = llmc::PretokenRegex::compile(pattern, "test");
    llmc::PretokenRegex::Scratch scratch;
    std::vector<llmc::PretokenRegex::Span> spans;
    regex->find_all(text, scratch, spans);
    Pieces out;
    for (const auto& s : spans) out.push_back(text.substr(s.begin, s.end - s.begin));
    return out;
}

std::string compile_error(const std::string& pattern) {
    try {
        llmc::PretokenRegex::compile(pattern, "file.json: pre_tokenizer");
    } catch (const llmc::Error& e) {
        return e.what();
    }
    return "";
}

const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

TEST(literals_classes_and_escapes) {
    EXPECT_EQ(matches("ab", "xxabyab"), (Pieces{"ab", "ab"}));
    EXPECT_EQ(matches("[a-c]+", "abcdcba"), (Pieces{"abc", "cba"}));
    EXPECT_EQ(matches("[^a-c]+", "abcdcba"), (Pieces{"d"}));
    EXPECT_EQ(matches(R"(\d+)", "a12b٣4"), (Pieces{"12", "٣4"}));  // \d is Unicode Nd
    EXPECT_EQ(matches(R"(\s+)", "a \t\n\u0085\u3000b"), (Pieces{" \t\n\u0085\u3000"}));  // White_Space
    EXPECT_EQ(matches(R"(\S+)", "ab \xEF\xBB\xBF c"), (Pieces{"ab", "\xEF\xBB\xBF", "c"}));  // U+FEFF is not space
    EXPECT_EQ(matches(R"(\w+)", "héllo_1 wörld!"), (Pieces{"héllo_1", "wörld"}));
    EXPECT_EQ(matches(R"(\x41\u0042\x{43}\.)", "ABC.ABCx"), (Pieces{"ABC."}));
    EXPECT_EQ(matches(R"([\r\n]+)", "a\r\n\nb\n"), (Pieces{"\r\n\n", "\n"}));
    EXPECT_EQ(matches("a.c", "abc a\nc"), (Pieces{"abc"}));  // '.' excludes only \n
    EXPECT_EQ(matches(R"([\-a]+)", "-a-b"), (Pieces{"-a-"}));
    EXPECT_EQ(matches("x{2}|y{1,2}|z{2,}", "xxxyyyzzzz"), (Pieces{"xx", "yy", "y", "zzzz"}));
    EXPECT_EQ(matches("a{,2}b", "aaab"), (Pieces{"aab"}));
    EXPECT_EQ(matches("a{x", "a{x"), (Pieces{"a{x"}));  // '{' that is no quantifier is a literal
    EXPECT_EQ(matches("[一-龥]+", "ab中文cd日本"), (Pieces{"中文", "日本"}));
}

TEST(unicode_properties) {
    EXPECT_EQ(matches(R"(\p{L}+)", "Привет, 世界! ǅx"), (Pieces{"Привет", "世界", "ǅx"}));
    EXPECT_EQ(matches(R"(\p{Lu}+)", "aBCdÉ"), (Pieces{"BC", "É"}));
    EXPECT_EQ(matches(R"(\P{L}+)", "ab12c"), (Pieces{"12"}));
    EXPECT_EQ(matches(R"(\p{^L}+)", "ab12c"), (Pieces{"12"}));
    EXPECT_EQ(matches(R"([\p{L}\p{M}]+)", "e\u0301x y"), (Pieces{"e\u0301x", "y"}));
    EXPECT_EQ(matches(R"(\p{N}+)", "x½Ⅻ9"), (Pieces{"½Ⅻ9"}));
    EXPECT_EQ(matches(R"(\p{P}+)", "a,.!b"), (Pieces{",.!"}));
    EXPECT_EQ(matches(R"(\p{S}+)", "a+$€b"), (Pieces{"+$€"}));
    EXPECT_EQ(matches(R"(\p{Han}+)", "ab中文cd"), (Pieces{"中文"}));
    EXPECT_EQ(matches(R"(\p{L}+)", "x\U0001D49Cy"), (Pieces{"x\U0001D49Cy"}));  // an astral letter
    EXPECT_EQ(matches(R"([^\s\p{L}\p{N}]+)", "a😀👍🏽 b"), (Pieces{"😀👍🏽"}));
}

TEST(leftmost_first_backtracking) {
    // The first alternative that matches wins, not the longest.
    EXPECT_EQ(matches("a|ab", "ab"), (Pieces{"a"}));
    EXPECT_EQ(matches("ab|a", "ab"), (Pieces{"ab"}));
    // Greedy runs give back characters until the rest matches.
    EXPECT_EQ(matches("a+ab", "aaab"), (Pieces{"aaab"}));
    EXPECT_EQ(matches(R"(\s*[\r\n]+)", "  \n  \nx"), (Pieces{"  \n  \n"}));
    // Lazy quantifiers take as little as they can.
    EXPECT_EQ(matches("a+?", "aaa"), (Pieces{"a", "a", "a"}));
    EXPECT_EQ(matches("a*?b", "aab"), (Pieces{"aab"}));
    EXPECT_EQ(matches("(?:ab)+c", "ababcabc"), (Pieces{"ababc", "abc"}));
    EXPECT_EQ(matches("(ab|a)(bc)?", "abc"), (Pieces{"ab"}));
    EXPECT_EQ(matches("(?:a|ab)c", "abc"), (Pieces{"abc"}));  // backtracks into the group
}

TEST(lookahead_and_anchors) {
    EXPECT_EQ(matches(R"(\s+(?!\S))", "a   b"), (Pieces{"  "}));
    EXPECT_EQ(matches(R"(\s+(?!\S)|\s+)", "a   b  "), (Pieces{"  ", " ", "  "}));
    EXPECT_EQ(matches("a(?=b)", "acab"), (Pieces{"a"}));
    EXPECT_EQ(matches("^a", "aa\na"), (Pieces{"a", "a"}));
    EXPECT_EQ(matches("a$", "aa\na"), (Pieces{"a", "a"}));
    EXPECT_EQ(matches(R"(\Aa|a\z)", "aaa"), (Pieces{"a", "a"}));
}

TEST(case_insensitive_groups) {
    EXPECT_EQ(matches("(?i:'s|'re)", "it's THEY'RE 'S"), (Pieces{"'s", "'RE", "'S"}));
    EXPECT_EQ(matches("(?i:[a-c]+)x", "aBCx ABx"), (Pieces{"aBCx", "ABx"}));
    EXPECT_EQ(matches("(?i:[^a])+", "aAbB"), (Pieces{"bB"}));
    EXPECT_EQ(matches("(?i:s)", "ſ"), (Pieces{}));  // ASCII folding only, as Hugging Face's JavaScript port does
}

TEST(real_patterns) {
    EXPECT_EQ(matches(kGpt2, "Hello world's  end\n\n 123abc!!"),
              (Pieces{"Hello", " world", "'s", " ", " end", "\n\n", " 123", "abc", "!!"}));
    EXPECT_EQ(matches(kLlama3, "I'M 12345 don't\r\n\r\n  x ...\n"),
              (Pieces{"I", "'M", " ", "123", "45", " don", "'t", "\r\n\r\n", " ", " x", " ...\n"}));
    EXPECT_EQ(matches(kGpt4o, "HelloWORLD they're CAN'T a/b\n"),
              (Pieces{"Hello", "WORLD", " they're", " CAN'T", " a", "/b", "\n"}));
    EXPECT_EQ(matches(kGpt4o, "x //\n"), (Pieces{"x", " //\n"}));
}

TEST(unsupported_constructs_are_one_line_errors) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"(?<=a)b", "lookbehind"}, {"(?>ab)", "atomic group"}, {"a++", "possessive"}, {R"(\bx)", "word boundary"},
        {R"((a)\1)", "backreference"}, {"[[:alpha:]]", "POSIX"}, {"[a&&b]", "intersection"},
        {R"(\p{Nonsense})", "\\p{Nonsense}"}, {"(?i)a", "inline options"}, {"(a", "unterminated group"},
        {"a)", "unbalanced"}, {"[ab", "unterminated character class"}, {"*a", "nothing to repeat"},
        {"(?:a*)*", "can match empty"}, {R"(\q)", "'\\q'"},
    };
    for (const auto& [pattern, what] : cases) {
        const std::string message = compile_error(pattern);
        EXPECT(message.rfind("file.json: pre_tokenizer: regex ", 0) == 0);
        EXPECT(message.find(what) != std::string::npos);
        EXPECT(message.find('\n') == std::string::npos);
        if (message.find(what) == std::string::npos) std::fprintf(stderr, "  %s -> %s\n", pattern.c_str(), message.c_str());
    }
}

int main() { return testing::run_all(); }
