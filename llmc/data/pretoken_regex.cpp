// The pre-tokenization regex engine (see pretoken_regex.h): a parser from Oniguruma syntax to a syntax tree,
// a compiler to a small backtracking program, and its interpreter over per-character class bits.
#include "llmc/data/pretoken_regex.h"

#include <unicode/uchar.h>
#include <unicode/uscript.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>

#include "llmc/base/error.h"
#include "llmc/data/utf8.h"

namespace llmc {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Character classes

// One member of a class: a code point range, a general-category mask, a script or a binary property, possibly
// complemented (\S, \P{L} inside [..]).
struct ClassItem {
    enum Kind : uint8_t { kRange, kCategory, kScript, kWhiteSpace, kAlphabetic, kWord };
    Kind kind = kRange;
    bool negated = false;
    char32_t lo = 0, hi = 0;
    uint32_t mask = 0;  // U_GC_*_MASK bits for kCategory, the UScriptCode for kScript

    bool contains(char32_t cp, uint32_t category_bit) const {
        bool in = false;
        switch (kind) {
        case kRange: in = cp >= lo && cp <= hi; break;
        case kCategory: in = (category_bit & mask) != 0; break;
        case kScript: {
            UErrorCode status = U_ZERO_ERROR;
            in = uscript_getScript(static_cast<UChar32>(cp), &status) == static_cast<UScriptCode>(mask);
            break;
        }
        case kWhiteSpace: in = u_isUWhiteSpace(static_cast<UChar32>(cp)); break;
        case kAlphabetic: in = u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC); break;
        case kWord:
            // Oniguruma's \w as Hugging Face's JavaScript port spells it: Alphabetic, marks, Nd, Pc, and the
            // Latin-1 digits-like ²³¹¼½¾.
            in = u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC) ||
                 (category_bit & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 || cp == 0xB2 || cp == 0xB3 ||
                 cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE);
            break;
        }
        return in != negated;
    }
};

struct CharClass {
    std::vector<ClassItem> items;
    bool negated = false;
    bool ascii_fold = false;  // (?i:..): an ASCII letter also matches when its other case does

    bool raw_contains(char32_t cp, uint32_t category_bit) const {
        for (const ClassItem& item : items)
            if (item.contains(cp, category_bit)) return true;
        return false;
    }
    bool contains(char32_t cp) const { return contains(cp, U_MASK(u_charType(static_cast<UChar32>(cp)))); }
    bool contains(char32_t cp, uint32_t category_bit) const {
        bool in = raw_contains(cp, category_bit);
        if (!in && ascii_fold && cp < 0x80 && ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')) {
            const char32_t other = cp ^ 0x20;
            in = raw_contains(other, U_MASK(u_charType(static_cast<UChar32>(other))));
        }
        return in != negated;
    }
    // Identical classes share one bit.
    std::string key() const {
        std::string k(1, static_cast<char>(negated * 2 + ascii_fold));
        for (const ClassItem& item : items) {
            const uint32_t fields[5] = {item.kind, item.negated, static_cast<uint32_t>(item.lo),
                                        static_cast<uint32_t>(item.hi), item.mask};
            k.append(reinterpret_cast<const char*>(fields), sizeof fields);
        }
        return k;
    }
};

ClassItem range_item(char32_t lo, char32_t hi) {
    ClassItem item;
    item.lo = lo;
    item.hi = hi;
    return item;
}

// Property names compare loosely, as in Oniguruma: case, spaces, '_' and '-' are ignored.
std::string loose_name(std::string_view name) {
    std::string out;
    for (const char c : name)
        if (c != ' ' && c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

bool property_item(std::string_view name, ClassItem& item) {
    static const std::map<std::string, uint32_t> kCategories = {
        {"l", U_GC_L_MASK},   {"letter", U_GC_L_MASK},   {"lu", U_GC_LU_MASK}, {"ll", U_GC_LL_MASK},
        {"lt", U_GC_LT_MASK}, {"lm", U_GC_LM_MASK},      {"lo", U_GC_LO_MASK}, {"lc", U_GC_LC_MASK},
        {"l&", U_GC_LC_MASK}, {"m", U_GC_M_MASK},        {"mark", U_GC_M_MASK}, {"mn", U_GC_MN_MASK},
        {"mc", U_GC_MC_MASK}, {"me", U_GC_ME_MASK},      {"n", U_GC_N_MASK},   {"number", U_GC_N_MASK},
        {"nd", U_GC_ND_MASK}, {"nl", U_GC_NL_MASK},      {"no", U_GC_NO_MASK}, {"p", U_GC_P_MASK},
        {"punctuation", U_GC_P_MASK}, {"pc", U_GC_PC_MASK}, {"pd", U_GC_PD_MASK}, {"ps", U_GC_PS_MASK},
        {"pe", U_GC_PE_MASK}, {"pi", U_GC_PI_MASK},      {"pf", U_GC_PF_MASK}, {"po", U_GC_PO_MASK},
        {"s", U_GC_S_MASK},   {"symbol", U_GC_S_MASK},   {"sm", U_GC_SM_MASK}, {"sc", U_GC_SC_MASK},
        {"sk", U_GC_SK_MASK}, {"so", U_GC_SO_MASK},      {"z", U_GC_Z_MASK},   {"separator", U_GC_Z_MASK},
        {"zs", U_GC_ZS_MASK}, {"zl", U_GC_ZL_MASK},      {"zp", U_GC_ZP_MASK}, {"c", U_GC_C_MASK},
        {"other", U_GC_C_MASK}, {"cc", U_GC_CC_MASK},    {"cf", U_GC_CF_MASK}, {"cs", U_GC_CS_MASK},
        {"co", U_GC_CO_MASK}, {"cn", U_GC_CN_MASK},
    };
    const std::string loose = loose_name(name);
    if (auto it = kCategories.find(loose); it != kCategories.end()) {
        item.kind = ClassItem::kCategory;
        item.mask = it->second;
        return true;
    }
    if (loose == "alphabetic" || loose == "alpha") {
        item.kind = ClassItem::kAlphabetic;
        return true;
    }
    if (loose == "whitespace" || loose == "space") {
        item.kind = ClassItem::kWhiteSpace;
        return true;
    }
    if (loose == "word") {
        item.kind = ClassItem::kWord;
        return true;
    }
    const int script = u_getPropertyValueEnum(UCHAR_SCRIPT, std::string(name).c_str());
    if (script >= 0) {  // UCHAR_INVALID_CODE (-1) for an unknown name
        item.kind = ClassItem::kScript;
        item.mask = static_cast<uint32_t>(script);
        return true;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------------------------
// Syntax tree

constexpr uint32_t kUnbounded = UINT32_MAX;

struct Node {
    enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat, kLook, kAssert };
    enum Anchor : uint8_t { kLineStart, kLineEnd, kTextStart, kTextEnd };
    Kind kind = kEmpty;
    int set = -1;  // class index for kSet
    std::vector<Node> kids;
    uint32_t min = 0, max = 0;  // kRepeat
    bool greedy = true;         // kRepeat
    bool negate = false;        // kLook
    Anchor anchor = kLineStart; // kAssert
};

bool nullable(const Node& node) {
    switch (node.kind) {
    case Node::kEmpty:
    case Node::kLook:
    case Node::kAssert: return true;
    case Node::kSet: return false;
    case Node::kConcat:
        return std::all_of(node.kids.begin(), node.kids.end(), [](const Node& k) { return nullable(k); });
    case Node::kAlt:
        return std::any_of(node.kids.begin(), node.kids.end(), [](const Node& k) { return nullable(k); });
    case Node::kRepeat: return node.min == 0 || nullable(node.kids[0]);
    }
    return true;
}

constexpr uint64_t kAnyFirst = ~uint64_t(0);

// The classes the first character a node consumes can be in (ignoring that the node may consume nothing).
uint64_t first_set(const Node& node) {
    switch (node.kind) {
    case Node::kEmpty:
    case Node::kLook:
    case Node::kAssert: return 0;
    case Node::kSet: return uint64_t(1) << node.set;
    case Node::kConcat: {
        uint64_t mask = 0;
        for (const Node& kid : node.kids) {
            mask |= first_set(kid);
            if (!nullable(kid)) break;  // zero-width and optional parts let the next part start the match
        }
        return mask;
    }
    case Node::kAlt: {
        uint64_t mask = 0;
        for (const Node& kid : node.kids) mask |= first_set(kid);
        return mask;
    }
    case Node::kRepeat: return node.max == 0 ? 0 : first_set(node.kids[0]);
    }
    return kAnyFirst;
}

// The class bits one of which the first character of any match must have; kAnyFirst when a match may be empty.
uint64_t first_mask(const Node& node) { return nullable(node) ? kAnyFirst : first_set(node); }

// ---------------------------------------------------------------------------------------------------------------
// Parser

class Parser {
public:
    Parser(std::string_view pattern, const std::string& where) : where_(where) {
        // The pattern as code points, each with its byte offset for messages.
        const auto* s = reinterpret_cast<const unsigned char*>(pattern.data());
        for (size_t i = 0; i < pattern.size();) {
            char32_t cp = s[i];
            size_t len = 1;
            if (cp >= 0xF0 && i + 3 < pattern.size()) {
                cp = ((cp & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
                len = 4;
            } else if (cp >= 0xE0 && i + 2 < pattern.size()) {
                cp = ((cp & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
                len = 3;
            } else if (cp >= 0xC0 && i + 1 < pattern.size()) {
                cp = ((cp & 0x1F) << 6) | (s[i + 1] & 0x3F);
                len = 2;
            } else if (cp >= 0x80) {
                fail_at(i, "is not valid UTF-8");
            }
            cps_.push_back(cp);
            byte_at_.push_back(static_cast<uint32_t>(i));
            i += len;
        }
        byte_at_.push_back(static_cast<uint32_t>(pattern.size()));
    }

    Node parse() {
        Node root = parse_alt(false);
        if (at_ < cps_.size()) fail_here("unbalanced ')'");
        return root;
    }

    std::vector<CharClass> classes;

private:
    [[noreturn]] void fail_at(size_t byte, const std::string& what) {
        llmc::fail(where_ + ": regex " + what + " at offset " + std::to_string(byte));
    }
    [[noreturn]] void fail_here(const std::string& what) { fail_at(byte_at_[std::min(at_, cps_.size())], what); }
    [[noreturn]] void unsupported(const std::string& construct) {
        fail_here("uses the unsupported construct " + construct);
    }

    bool more() const { return at_ < cps_.size(); }
    char32_t peek(size_t ahead = 0) const { return at_ + ahead < cps_.size() ? cps_[at_ + ahead] : 0; }
    bool lookahead_is(std::u32string_view s) const {
        for (size_t k = 0; k < s.size(); k++)
            if (peek(k) != s[k] || at_ + k >= cps_.size()) return false;
        return true;
    }

    int add_class(CharClass cls) {
        if (fold_) cls.ascii_fold = true;
        const std::string key = cls.key();
        for (size_t i = 0; i < classes.size(); i++)
            if (classes[i].key() == key) return static_cast<int>(i);
        if (classes.size() >= 64) fail_here("has more than 64 distinct character classes (unsupported)");
        classes.push_back(std::move(cls));
        return static_cast<int>(classes.size() - 1);
    }
    Node set_node(CharClass cls) {
        Node node;
        node.kind = Node::kSet;
        node.set = add_class(std::move(cls));
        return node;
    }

    Node parse_alt(bool in_group) {
        Node alt;
        alt.kind = Node::kAlt;
        alt.kids.push_back(parse_concat());
        while (more() && peek() == '|') {
            at_++;
            alt.kids.push_back(parse_concat());
        }
        if (in_group) {
            if (!more() || peek() != ')') fail_here("has an unterminated group");
            at_++;
        }
        return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
    }

    Node parse_concat() {
        Node concat;
        concat.kind = Node::kConcat;
        while (more() && peek() != '|' && peek() != ')') {
            Node atom = parse_atom();
            concat.kids.push_back(parse_quantifiers(std::move(atom)));
        }
        if (concat.kids.empty()) return Node{};
        return concat.kids.size() == 1 ? std::move(concat.kids[0]) : concat;
    }

    // Reads {n}, {n,}, {n,m} or {,m} at the cursor; false (cursor unchanged) when it is a literal '{'.
    bool parse_braces(uint32_t& min, uint32_t& max) {
        size_t k = at_ + 1;
        auto number = [&](uint32_t& value) {
            size_t start = k;
            uint64_t v = 0;
            while (k < cps_.size() && cps_[k] >= '0' && cps_[k] <= '9') v = std::min<uint64_t>(v * 10 + (cps_[k++] - '0'), 100000);
            value = static_cast<uint32_t>(v);
            return k > start;
        };
        uint32_t lo = 0, hi = 0;
        const bool has_lo = number(lo);
        if (k < cps_.size() && cps_[k] == '}') {
            if (!has_lo) return false;
            min = max = lo;
        } else if (k < cps_.size() && cps_[k] == ',') {
            k++;
            const bool has_hi = number(hi);
            if (k >= cps_.size() || cps_[k] != '}' || (!has_lo && !has_hi)) return false;
            min = has_lo ? lo : 0;
            max = has_hi ? hi : kUnbounded;
        } else {
            return false;
        }
        if (max != kUnbounded && max < min) fail_here("has a quantifier {n,m} with m < n");
        at_ = k + 1;
        return true;
    }

    Node parse_quantifiers(Node atom) {
        while (more()) {
            uint32_t min, max;
            const char32_t c = peek();
            if (c == '?') { min = 0; max = 1; at_++; }
            else if (c == '*') { min = 0; max = kUnbounded; at_++; }
            else if (c == '+') { min = 1; max = kUnbounded; at_++; }
            else if (c == '{' && parse_braces(min, max)) {}
            else break;
            bool greedy = true;
            if (more() && peek() == '?') {
                greedy = false;
                at_++;
            } else if (more() && peek() == '+' && c != '{') {
                std::string construct = "'";
                construct += static_cast<char>(c);
                unsupported(construct + "+' (possessive quantifier)");
            }
            if (atom.kind == Node::kLook || atom.kind == Node::kAssert) fail_here("quantifies a zero-width assertion");
            if (max == kUnbounded && nullable(atom)) unsupported("unbounded repetition of a group that can match empty");
            Node rep;
            rep.kind = Node::kRepeat;
            rep.min = min;
            rep.max = max;
            rep.greedy = greedy;
            rep.kids.push_back(std::move(atom));
            atom = std::move(rep);
        }
        return atom;
    }

    Node parse_group() {
        at_++;  // '('
        if (peek() != '?') return parse_alt(true);  // a capturing group: captures do not matter here
        if (lookahead_is(U"?:")) {
            at_ += 2;
            return parse_alt(true);
        }
        if (lookahead_is(U"?=") || lookahead_is(U"?!")) {
            const bool negate = peek(1) == '!';
            at_ += 2;
            Node look;
            look.kind = Node::kLook;
            look.negate = negate;
            look.kids.push_back(parse_alt(true));
            return look;
        }
        if (lookahead_is(U"?i:")) {
            at_ += 3;
            const bool saved = fold_;
            fold_ = true;
            Node inner = parse_alt(true);
            fold_ = saved;
            return inner;
        }
        if (lookahead_is(U"?<=") || lookahead_is(U"?<!")) unsupported("'(?<=' / '(?<!' (lookbehind)");
        if (lookahead_is(U"?>")) unsupported("'(?>' (atomic group)");
        if (lookahead_is(U"?<") || lookahead_is(U"?P<") || lookahead_is(U"?'")) unsupported("a named group");
        if (lookahead_is(U"?#")) unsupported("'(?#' (comment)");
        unsupported("'(?" + std::string(1, static_cast<char>(peek(1) < 0x80 ? peek(1) : '?')) +
                    "' (inline options or an unknown group)");
    }

    uint32_t parse_hex(size_t digits_min, size_t digits_max, char32_t terminator) {
        uint32_t value = 0;
        size_t n = 0;
        while (n < digits_max && more() && std::isxdigit(static_cast<int>(peek() < 0x80 ? peek() : 0))) {
            const char32_t c = cps_[at_++];
            value = value * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
            n++;
        }
        if (n < digits_min) fail_here("has a malformed hexadecimal escape");
        if (terminator) {
            if (!more() || peek() != terminator) fail_here("has a malformed \\x{..} escape");
            at_++;
        }
        if (value > 0x10FFFF) fail_here("has an escape beyond U+10FFFF");
        return value;
    }

    // Parses the escape after '\' (cursor on the letter). Returns true and fills `items` for a class escape
    // (\s, \p{..}, ...), false and sets `literal` for a single character.
    bool parse_escape(std::vector<ClassItem>& items, char32_t& literal, bool in_class) {
        if (!more()) fail_here("ends with a lone '\\'");
        const char32_t c = cps_[at_++];
        ClassItem item;
        switch (c) {
        case 'n': literal = '\n'; return false;
        case 'r': literal = '\r'; return false;
        case 't': literal = '\t'; return false;
        case 'f': literal = '\f'; return false;
        case 'v': literal = '\v'; return false;
        case 'a': literal = 0x07; return false;
        case 'e': literal = 0x1B; return false;
        case 'x':
            if (more() && peek() == '{') {
                at_++;
                literal = parse_hex(1, 8, '}');
            } else {
                literal = parse_hex(1, 2, 0);
            }
            return false;
        case 'u': literal = parse_hex(4, 4, 0); return false;
        case 's': case 'S': item.kind = ClassItem::kWhiteSpace; item.negated = c == 'S'; break;
        case 'd': case 'D': item.kind = ClassItem::kCategory; item.mask = U_GC_ND_MASK; item.negated = c == 'D'; break;
        case 'w': case 'W': item.kind = ClassItem::kWord; item.negated = c == 'W'; break;
        case 'h': case 'H':
            // \H is the complement of three ranges, which a class item cannot express: the caller negates the
            // whole class, so inside [..] only \h is accepted.
            if (c == 'H' && in_class) unsupported("'\\H' inside a class");
            items.push_back(range_item('0', '9'));
            items.push_back(range_item('a', 'f'));
            items.push_back(range_item('A', 'F'));
            return true;
        case 'p': case 'P': {
            if (!more() || peek() != '{') fail_here("has '\\p' without '{'");
            at_++;
            bool negated = c == 'P';
            if (more() && peek() == '^') {
                negated = !negated;
                at_++;
            }
            std::string name;
            while (more() && peek() != '}') {
                if (peek() >= 0x80) fail_here("has a non-ASCII property name");
                name += static_cast<char>(cps_[at_++]);
            }
            if (!more()) fail_here("has an unterminated \\p{..}");
            at_++;
            if (!property_item(name, item)) unsupported("property \\p{" + name + "}");
            item.negated = negated;
            break;
        }
        case 'b': case 'B': unsupported(std::string("'\\") + static_cast<char>(c) + "' (word boundary)");
        case 'A': case 'z': case 'Z': case 'G':
            if (in_class) fail_here("has an anchor inside a class");
            literal = c;  // the caller turns these into assertions
            return false;
        default:
            if (c >= '0' && c <= '9') unsupported("a backreference or octal escape");
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                unsupported(std::string("'\\") + static_cast<char>(c) + "'");
            literal = c;  // escaped punctuation or any other character stands for itself
            return false;
        }
        items.push_back(item);
        return true;
    }

    Node parse_class() {
        at_++;  // '['
        CharClass cls;
        if (more() && peek() == '^') {
            cls.negated = true;
            at_++;
        }
        bool first = true;
        while (true) {
            if (!more()) fail_here("has an unterminated character class");
            char32_t c = peek();
            if (c == ']' && !first) {
                at_++;
                break;
            }
            first = false;
            if (c == '[') {
                if (peek(1) == ':') unsupported("a POSIX bracket expression '[:..:]'");
                unsupported("a nested character class");
            }
            if (c == '&' && peek(1) == '&') unsupported("'&&' (class intersection)");
            char32_t lo;
            at_++;
            if (c == '\\') {
                std::vector<ClassItem> items;
                const bool is_set = parse_escape(items, lo, true);
                if (is_set) {
                    cls.items.insert(cls.items.end(), items.begin(), items.end());
                    if (more() && peek() == '-' && peek(1) != ']') unsupported("a range with a class escape as its end");
                    continue;
                }
            } else {
                lo = c;
            }
            char32_t hi = lo;
            if (more() && peek() == '-' && peek(1) != ']' && at_ + 1 < cps_.size()) {
                at_++;
                char32_t end = cps_[at_++];
                if (end == '\\') {
                    std::vector<ClassItem> items;
                    if (parse_escape(items, end, true)) unsupported("a range with a class escape as its end");
                } else if (end == '[') {
                    unsupported("a nested character class");
                }
                hi = end;
                if (hi < lo) fail_here("has a character range out of order");
            }
            cls.items.push_back(range_item(lo, hi));
        }
        return set_node(std::move(cls));
    }

    Node parse_atom() {
        const char32_t c = peek();
        switch (c) {
        case '(': return parse_group();
        case '[': return parse_class();
        case '.': {
            at_++;
            CharClass cls;
            cls.negated = true;
            cls.items.push_back(range_item('\n', '\n'));
            return set_node(std::move(cls));
        }
        case '^':
        case '$': {
            at_++;
            Node node;
            node.kind = Node::kAssert;
            node.anchor = c == '^' ? Node::kLineStart : Node::kLineEnd;
            return node;
        }
        case '*':
        case '+':
        case '?': fail_here("has a quantifier with nothing to repeat");
        case '\\': {
            at_++;
            std::vector<ClassItem> items;
            char32_t literal = 0;
            const size_t escape_at = at_;
            if (parse_escape(items, literal, false)) {
                CharClass cls;
                cls.items = std::move(items);
                if (cps_[escape_at] == 'H') cls.negated = true;
                return set_node(std::move(cls));
            }
            const char32_t letter = cps_[escape_at];
            if (at_ == escape_at + 1 && (letter == 'A' || letter == 'z' || letter == 'Z' || letter == 'G')) {
                if (letter == 'Z') unsupported("'\\Z'");
                if (letter == 'G') unsupported("'\\G'");
                Node node;
                node.kind = Node::kAssert;
                node.anchor = letter == 'A' ? Node::kTextStart : Node::kTextEnd;
                return node;
            }
            CharClass cls;
            cls.items.push_back(range_item(literal, literal));
            return set_node(std::move(cls));
        }
        default: {
            at_++;
            CharClass cls;
            cls.items.push_back(range_item(c, c));
            return set_node(std::move(cls));
        }
        }
    }

    std::string where_;
    std::vector<char32_t> cps_;
    std::vector<uint32_t> byte_at_;
    size_t at_ = 0;
    bool fold_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Program

enum Op : uint8_t { kClass, kRun, kSplit, kAltSet, kJmp, kMatch, kLook, kAssertOp };

struct Inst {
    Op op;
    uint8_t arg = 0;     // class index (kClass, kRun), negate (kLook), anchor (kAssertOp)
    uint32_t x = 0;      // kSplit: preferred branch; kJmp: target; kLook: body; kAltSet: index into alts
    uint32_t y = 0;      // kSplit: other branch
    uint32_t min = 0, max = 0;  // kRun
    uint64_t first = kAnyFirst; // kSplit: class bits the preferred branch can start with
};

}  // namespace

// One alternative of an alternation: where its code starts and the class bits it can start with.
struct Branch {
    uint32_t pc;
    uint64_t first;
};

struct PretokenRegex::Program {
    std::vector<Inst> code;
    std::vector<std::vector<Branch>> alts;  // kAltSet's alternatives, tried in order
    uint64_t first = kAnyFirst;           // class bits a match can start with
    std::vector<CharClass> classes;
    std::vector<uint64_t> bmp_bits;       // class bits of every code point below U+10000

    uint64_t bits_of(char32_t cp) const {
        if (cp < 0x10000) return bmp_bits[cp];
        uint64_t bits = 0;
        for (size_t i = 0; i < classes.size(); i++)
            if (classes[i].contains(cp)) bits |= uint64_t(1) << i;
        return bits;
    }

    uint32_t emit(Inst inst) {
        code.push_back(inst);
        return static_cast<uint32_t>(code.size() - 1);
    }

    void compile(const Node& node) {
        switch (node.kind) {
        case Node::kEmpty: break;
        case Node::kSet: emit({kClass, static_cast<uint8_t>(node.set)}); break;
        case Node::kConcat:
            for (const Node& kid : node.kids) compile(kid);
            break;
        case Node::kAlt: {
            // One instruction picks the first alternative whose first character can match, without stepping
            // through a chain of splits (the top-level alternations of real patterns have 7-10 branches).
            const uint32_t alt = emit({kAltSet});
            const uint32_t table = static_cast<uint32_t>(alts.size());
            code[alt].x = table;
            alts.emplace_back();
            std::vector<uint32_t> jumps;
            for (const Node& kid : node.kids) {
                const Branch branch{static_cast<uint32_t>(code.size()), first_mask(kid)};
                alts[table].push_back(branch);
                compile(kid);
                jumps.push_back(emit({kJmp}));
            }
            for (const uint32_t j : jumps) code[j].x = static_cast<uint32_t>(code.size());
            break;
        }
        case Node::kRepeat: compile_repeat(node); break;
        case Node::kLook: {
            const uint32_t look = emit({kLook, static_cast<uint8_t>(node.negate)});
            const uint32_t skip = emit({kJmp});
            code[look].x = static_cast<uint32_t>(code.size());
            compile(node.kids[0]);
            emit({kMatch});
            code[skip].x = static_cast<uint32_t>(code.size());
            break;
        }
        case Node::kAssert: emit({kAssertOp, static_cast<uint8_t>(node.anchor)}); break;
        }
    }

    void compile_repeat(const Node& node) {
        const Node& body = node.kids[0];
        if (body.kind == Node::kSet && node.greedy) {
            Inst run{kRun, static_cast<uint8_t>(body.set)};
            run.min = node.min;
            run.max = node.max;
            emit(run);
            return;
        }
        for (uint32_t i = 0; i < node.min; i++) compile(body);
        const uint64_t body_first = first_mask(body);
        if (node.max == kUnbounded) {
            // L: split(body, out); body; jmp L   (lazy: the split prefers out)
            const uint32_t loop = emit({kSplit});
            compile(body);
            const uint32_t back = emit({kJmp});
            code[back].x = loop;
            set_split(loop, loop + 1, static_cast<uint32_t>(code.size()), node.greedy, body_first);
            return;
        }
        std::vector<uint32_t> splits;
        for (uint32_t i = node.min; i < node.max; i++) {
            splits.push_back(emit({kSplit}));
            compile(body);
        }
        const uint32_t out = static_cast<uint32_t>(code.size());
        for (const uint32_t s : splits) set_split(s, s + 1, out, node.greedy, body_first);
    }

    void set_split(uint32_t at, uint32_t body, uint32_t out, bool greedy, uint64_t body_first) {
        code[at].x = greedy ? body : out;
        code[at].y = greedy ? out : body;
        code[at].first = greedy ? body_first : kAnyFirst;
    }
};

namespace {

using Frame = PretokenRegex::Scratch::Frame;
constexpr uint32_t kPlain = UINT32_MAX;

// The first branch from `from` on whose first character `bits` can be (branches.size() when none).
inline uint32_t next_branch(const std::vector<Branch>& branches, uint32_t from, uint64_t bits) {
    const uint32_t n = static_cast<uint32_t>(branches.size());
    while (from < n && !(branches[from].first & bits) && branches[from].first != kAnyFirst) from++;
    return from;
}

// Runs the program from `pc` at character `pos`; returns the end of the first match in backtracking order, or -1.
// The stack above `base` belongs to this call (a lookahead runs as a nested call and leaves nothing behind).
int64_t run(const PretokenRegex::Program& prog, const uint64_t* bits, const uint32_t* offsets, const char* text,
            uint32_t n, uint32_t pc, uint32_t pos, std::vector<Frame>& stack) {
    const size_t base = stack.size();
    const Inst* code = prog.code.data();
    while (true) {
        const Inst& in = code[pc];
        switch (in.op) {
        case kClass:
            if ((bits[pos] >> in.arg) & 1) {  // bits[n] is 0, so the end of text never matches
                pos++;
                pc++;
                continue;
            }
            break;
        case kRun: {
            const uint64_t bit = uint64_t(1) << in.arg;
            const uint32_t limit = in.max == kUnbounded ? n - pos : std::min(in.max, n - pos);
            uint32_t k = 0;
            while (k < limit && (bits[pos + k] & bit)) k++;
            if (k < in.min) break;
            if (k > in.min) stack.push_back({pc, pos, k - 1});
            pos += k;
            pc++;
            continue;
        }
        case kSplit:
            if ((bits[pos] & in.first) || in.first == kAnyFirst) {  // a character in no class has no bits
                stack.push_back({in.y, pos, kPlain});
                pc = in.x;
            } else {
                pc = in.y;
            }
            continue;
        case kAltSet: {
            const std::vector<Branch>& branches = prog.alts[in.x];
            const uint32_t first = next_branch(branches, 0, bits[pos]);
            if (first == branches.size()) break;
            const uint32_t later = next_branch(branches, first + 1, bits[pos]);
            if (later < branches.size()) stack.push_back({pc, pos, later});
            pc = branches[first].pc;
            continue;
        }
        case kJmp: pc = in.x; continue;
        case kMatch: stack.resize(base); return pos;
        case kLook: {
            const bool found = run(prog, bits, offsets, text, n, in.x, pos, stack) >= 0;
            if (found != static_cast<bool>(in.arg)) {
                pc++;
                continue;
            }
            break;
        }
        case kAssertOp: {
            bool ok = false;
            switch (in.arg) {
            case Node::kLineStart: ok = pos == 0 || text[offsets[pos] - 1] == '\n'; break;
            case Node::kLineEnd: ok = pos == n || text[offsets[pos]] == '\n'; break;
            case Node::kTextStart: ok = pos == 0; break;
            case Node::kTextEnd: ok = pos == n; break;
            }
            if (ok) {
                pc++;
                continue;
            }
            break;
        }
        }
        // Backtrack. A frame is a plain (pc, pos), a greedy run to retry one shorter (len: the length to try), or
        // an alternation to resume (len: the next branch whose first character can match).
        if (stack.size() == base) return -1;
        const Frame f = stack.back();
        stack.pop_back();
        pos = f.pos;
        if (f.len == kPlain) {
            pc = f.pc;
        } else if (code[f.pc].op == kRun) {
            if (f.len > code[f.pc].min) stack.push_back({f.pc, f.pos, f.len - 1});
            pos = f.pos + f.len;
            pc = f.pc + 1;
        } else {  // kAltSet
            const std::vector<Branch>& branches = prog.alts[code[f.pc].x];
            const uint32_t later = next_branch(branches, f.len + 1, bits[pos]);
            if (later < branches.size()) stack.push_back({f.pc, f.pos, later});
            pc = branches[f.len].pc;
        }
    }
}

}  // namespace

PretokenRegex::PretokenRegex(std::string pattern, std::unique_ptr<Program> program)
    : pattern_(std::move(pattern)), program_(std::move(program)) {}
PretokenRegex::~PretokenRegex() = default;

std::shared_ptr<const PretokenRegex> PretokenRegex::compile(std::string_view pattern, const std::string& where) {
    Parser parser(pattern, where);
    const Node root = parser.parse();
    auto program = std::make_unique<Program>();
    program->classes = std::move(parser.classes);
    program->compile(root);
    program->emit({kMatch});
    program->first = first_mask(root);
    program->bmp_bits.assign(0x10000, 0);
    for (char32_t cp = 0; cp < 0x10000; cp++) {
        const uint32_t category_bit = U_MASK(u_charType(static_cast<UChar32>(cp)));
        uint64_t bits = 0;
        for (size_t i = 0; i < program->classes.size(); i++)
            if (program->classes[i].contains(cp, category_bit)) bits |= uint64_t(1) << i;
        program->bmp_bits[cp] = bits;
    }
    return std::make_shared<const PretokenRegex>(std::string(pattern), std::move(program));
}

void PretokenRegex::find_all(std::string_view text, Scratch& scratch, std::vector<Span>& matches) const {
    const Program& prog = *program_;
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t size = text.size();
    std::vector<uint64_t>& bits = scratch.bits;
    std::vector<uint32_t>& offsets = scratch.offsets;
    bits.resize(size + 1);
    offsets.resize(size + 1);
    uint32_t n = 0;
    const uint64_t* bmp = prog.bmp_bits.data();
    for (size_t i = 0; i < size;) {
        offsets[n] = static_cast<uint32_t>(i);
        const unsigned b = s[i];
        if (b < 0x80) {
            bits[n++] = bmp[b];
            i++;
            continue;
        }
        size_t len;
        const char32_t cp = utf8::decode(s, i, len);
        i += len;
        bits[n++] = prog.bits_of(cp);
    }
    offsets[n] = static_cast<uint32_t>(size);
    bits[n] = 0;
    for (uint32_t start = 0; start <= n;) {
        if (!(bits[start] & prog.first) && prog.first != kAnyFirst) {
            start++;
            continue;
        }
        const int64_t end = run(prog, bits.data(), offsets.data(), text.data(), n, 0, start, scratch.stack);
        if (end < 0) {
            start++;
        } else if (end == start) {
            start++;  // an empty match: no piece, move on
        } else {
            matches.push_back({offsets[start], offsets[end]});
            start = static_cast<uint32_t>(end);
        }
    }
}

}  // namespace llmc
