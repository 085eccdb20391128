// A small backtracking regex engine over code points, for the pre-tokenization patterns of Hugging Face
// tokenizer.json files (GPT-2, Llama 3, Qwen, GPT-4o's o200k, DeepSeek, ...). Those patterns are written for
// Oniguruma, whose leftmost-first backtracking semantics this engine reproduces; std::regex is both too slow and
// lacks \p{..}. Supported: literals, escapes (\r \n \t \f \v \a \e \xHH \x{H..} \uHHHH, escaped punctuation),
// \s \S (Unicode White_Space) \d \D (Nd) \w \W (Alphabetic, M, Nd, Pc) \h \H, \p{..} \P{..} \p{^..} with general
// categories, scripts, Alphabetic and White_Space, classes [..] with negation and ranges, '.', groups (..) (?:..)
// (?i:..) (ASCII case folding, as Hugging Face's JavaScript port does), alternation, greedy and lazy quantifiers
// ? * + {n} {n,} {n,m} {,m}, lookahead (?=..) (?!..), and the anchors ^ $ (lines) \A \z. Anything else (lookbehind,
// atomic groups, possessive quantifiers, backreferences, \b, class intersections, POSIX brackets, inline flags
// without a group) is refused with a one-line llmc::Error naming the construct.
//
// Speed: each regex precomputes, for every BMP code point, a bit per distinct character class of the pattern, so
// matching reads one 64-bit word per character; alternatives and loops skip branches whose first character
// cannot match.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmc {

class PretokenRegex {
public:
    // A byte range [begin, end) of the searched text.
    struct Span {
        uint32_t begin, end;
        bool operator==(const Span&) const = default;
    };
    // Per-thread buffers for find_all (the decoded text and the backtracking stack).
    struct Scratch {
        std::vector<uint64_t> bits;
        std::vector<uint32_t> offsets;
        struct Frame {
            uint32_t pc, pos, len;
        };
        std::vector<Frame> stack;
    };

    // Compiles `pattern` (UTF-8); a syntax error or an unsupported construct throws llmc::Error whose message
    // starts with `where` (e.g. "tokenizer.json: pre_tokenizer Split") and names the construct and its offset.
    static std::shared_ptr<const PretokenRegex> compile(std::string_view pattern, const std::string& where);

    // Appends the non-empty, non-overlapping, leftmost-first matches in valid UTF-8 `text`, in order (after an
    // empty match the search moves on by one character, as Oniguruma's and JavaScript's global search do).
    void find_all(std::string_view text, Scratch& scratch, std::vector<Span>& matches) const;

    // The source pattern, for messages.
    const std::string& pattern() const { return pattern_; }

    struct Program;
    ~PretokenRegex();
    PretokenRegex(std::string pattern, std::unique_ptr<Program> program);

private:
    std::string pattern_;
    std::unique_ptr<Program> program_;
};

}  // namespace llmc
