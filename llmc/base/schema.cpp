// Config schema mechanics (see schema.h): value readers, sources, JSON files, flags and --help.
#include "llmc/base/schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

namespace schema {

namespace {

// A finite double as a float: refused (naming `what`) when it overflows to infinity or a non-zero value underflows
// to zero.
float to_float(double v, const std::string& what) {
    const float f = static_cast<float>(v);
    LLMC_CHECK(std::isfinite(f) && (f != 0.0f || v == 0.0), what + " is out of a float's range");
    return f;
}

// Numbers in flags are plain decimals, as a user writes them (strtoll and strtod would also take leading blanks, a
// '+', hex and, for floats, inf and nan): an integer is an optional '-' and digits; a float may add a fraction and
// an exponent (6e-4, .5, 1., -0.1).
bool is_decimal_integer(std::string_view s) {
    const size_t start = s.starts_with('-') ? 1 : 0;
    return s.size() > start && std::all_of(s.begin() + start, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_decimal_float(std::string_view s) {
    size_t i = s.starts_with('-') ? 1 : 0;
    const auto digits = [&] {
        const size_t from = i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') i++;
        return i - from;
    };
    size_t mantissa_digits = digits();
    if (i < s.size() && s[i] == '.') {
        i++;
        mantissa_digits += digits();
    }
    if (mantissa_digits == 0) return false;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
        if (digits() == 0) return false;
    }
    return i == s.size();
}

void check_choice(const std::vector<std::string>& choices, const std::string& value, const std::string& where) {
    if (choices.empty()) return;
    for (const std::string& c : choices)
        if (value == c) return;
    std::string list;
    for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
    fail(where + ": '" + value + "' is not one of: " + list);
}

}  // namespace

int64_t int_from_text(const std::string& text, int64_t lo, int64_t hi, const std::string& where) {
    LLMC_CHECK(is_decimal_integer(text), where + ": expected an integer, got '" + text + "'");
    long long v = 0;
    const std::errc ec = std::from_chars(text.data(), text.data() + text.size(), v).ec;
    LLMC_CHECK(ec == std::errc() && v >= lo && v <= hi, where + ": " + text + " is out of range");
    return v;
}

float float_from_text(const std::string& text, const std::string& where) {
    LLMC_CHECK(is_decimal_float(text), where + ": expected a number, got '" + text + "'");
    double v = 0.0;  // from_chars: the same in every locale
    const std::errc ec = std::from_chars(text.data(), text.data() + text.size(), v).ec;
    LLMC_CHECK(ec == std::errc(), where + ": " + text + " is out of a float's range");  // a double's, even
    return to_float(v, where + ": " + text);
}

bool bool_from_text(const std::string& text, const std::string& where) {
    if (text == "true" || text == "1") return true;
    if (text == "false" || text == "0") return false;
    fail(where + ": expected true or false, got '" + text + "'");
}

std::string string_from_text(const std::string& text, const std::vector<std::string>& choices,
                             const std::string& where) {
    check_choice(choices, text, where);
    try {  // the resolved config is JSON, which holds text only as UTF-8
        (void)Json(text).dump();
    } catch (const Json::exception&) {
        fail(where + ": not valid UTF-8 text");
    }
    return text;
}

int64_t int_from_json(const Json& v, int64_t lo, int64_t hi, const std::string& where) {
    LLMC_CHECK(v.is_number_integer(), where + ": expected an integer, got " + v.dump());
    LLMC_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX),
               where + ": " + v.dump() + " is out of range");  // would wrap around as int64
    const int64_t i = v.get<int64_t>();
    LLMC_CHECK(i >= lo && i <= hi, where + ": " + v.dump() + " is out of range");
    return i;
}

float float_from_json(const Json& v, const std::string& where) {
    LLMC_CHECK(v.is_number(), where + ": expected a number, got " + v.dump());
    return to_float(v.get<double>(), where + ": " + v.dump());
}

bool bool_from_json(const Json& v, const std::string& where) {
    LLMC_CHECK(v.is_boolean(), where + ": expected true or false, got " + v.dump());
    return v.get<bool>();
}

std::string string_from_json(const Json& v, const std::vector<std::string>& choices, const std::string& where) {
    LLMC_CHECK(v.is_string(), where + ": expected a string, got " + v.dump());
    check_choice(choices, v.get<std::string>(), where);
    return v.get<std::string>();
}

Json float_to_json(float v) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    return std::strtod(std::string(buf, end).c_str(), nullptr);
}

}  // namespace schema

using schema::Json;

void SchemaTable::add_entry(Entry e) {
    LLMC_CHECK(find(e.name) == nullptr, "internal: config key '" + e.name + "' declared twice");
    // keep each group's keys together, in the order of the group's first key
    auto at = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->group == e.group) at = it + 1;
    entries_.insert(at, std::move(e));
}

const SchemaTable::Entry* SchemaTable::find(const std::string& name) const {
    for (const Entry& e : entries_)
        if (e.name == name) return &e;
    return nullptr;
}

std::vector<std::string> SchemaTable::keys() const {
    std::vector<std::string> names;
    for (const Entry& e : entries_) names.push_back(e.name);
    return names;
}

// Suggests the closest key for a misspelled one: at most 3 edits away, and at most half the key's length (so
// '--x' is no typo of 'lr'). Dashes count as underscores: JSON keys take underscores only, and 'total-batch-szie'
// is one typo away from 'total_batch_size', not three.
std::string SchemaTable::did_you_mean(std::string key) const {
    std::replace(key.begin(), key.end(), '-', '_');
    std::string best;
    size_t best_dist = std::min<size_t>(4, key.size() / 2 + 1);  // the first distance too far
    for (const Entry& e : entries_) {
        const std::string& candidate = e.name;
        std::vector<size_t> row(candidate.size() + 1);
        for (size_t j = 0; j <= candidate.size(); j++) row[j] = j;
        for (size_t i = 1; i <= key.size(); i++) {
            size_t prev = row[0];
            row[0] = i;
            for (size_t j = 1; j <= candidate.size(); j++) {
                const size_t cur = row[j];
                row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (key[i - 1] != candidate[j - 1])});
                prev = cur;
            }
        }
        if (row.back() < best_dist) best_dist = row.back(), best = candidate;
    }
    return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

void SchemaTable::load_file(const std::string& path, void* root, ConfigSources& sources) const {
    LLMC_CHECK(!path.empty(), "--config: empty file name");
    constexpr size_t kMaxConfigBytes = 16u << 20;  // a config is a few hundred bytes; /dev/zero is endless
    const std::vector<std::byte> bytes = read_whole_file(path, kMaxConfigBytes);
    Json doc;
    std::vector<std::string> top_keys;
    // A config is flat: deep nesting (which would exhaust the stack) and repeated keys (which JSON parsers
    // resolve silently, each its own way) are refused while parsing.
    const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
        LLMC_CHECK(depth <= 32, path + ": JSON nested deeper than 32 levels (a config is a flat object)");
        if (event == Json::parse_event_t::key && depth == 1) {
            const std::string key = parsed.get<std::string>();
            LLMC_CHECK(std::find(top_keys.begin(), top_keys.end(), key) == top_keys.end(),
                       path + ": key '" + key + "' appears twice");
            top_keys.push_back(key);
        }
        return true;
    };
    try {
        doc = Json::parse(reinterpret_cast<const char*>(bytes.data()),
                          reinterpret_cast<const char*>(bytes.data()) + bytes.size(), check);
    } catch (const Json::exception& e) {  // syntax, and numbers out of range such as 1e400
        fail(path + ": malformed JSON (" + std::string(e.what()) + ")");
    }
    LLMC_CHECK(doc.is_object(), path + ": expected a JSON object of config keys");
    for (const auto& [key, value] : doc.items()) {
        if (key.starts_with("_")) continue;  // "_comment" and the like
        const Entry* e = find(key);
        LLMC_CHECK(e != nullptr, path + ": unknown config key '" + key + "'" + did_you_mean(key));
        e->from_json(root, value, path + ": key '" + key + "'");
        sources.set_by_file(key, path);
    }
}

bool SchemaTable::parse_command_line(int argc, const char* const* argv, void* root, ConfigSources& sources,
                                     const std::string& program, const void* defaults) const {
    for (int i = 0; i < argc; i++) {
        std::string arg = argv[i];
        LLMC_CHECK(arg.starts_with("--") && arg.size() > 2,
                   "unexpected argument '" + arg + "': flags look like --key value (see --help)");
        std::string key = arg.substr(2), value;
        bool has_value = false;
        if (const size_t eq = key.find('='); eq != std::string::npos) {
            value = key.substr(eq + 1);
            key = key.substr(0, eq);
            has_value = true;
        }
        const std::string flag = "--" + key;  // as typed, for messages
        for (char& c : key)
            if (c == '-') c = '_';  // --total-batch-size == --total_batch_size
        if (key == "help" || key == "h") {
            std::printf("%s", help(program, defaults).c_str());
            return false;
        }
        const Entry* e = key == "config" ? nullptr : find(key);
        LLMC_CHECK(key == "config" || e != nullptr, flag + ": unknown flag" + did_you_mean(key) + " (see --help)");
        if (!has_value) {
            const bool next_is_value = i + 1 < argc && !std::string(argv[i + 1]).starts_with("--");
            if (e && e->is_bool && !next_is_value) {
                value = "true";
            } else {
                LLMC_CHECK(i + 1 < argc && (e || next_is_value), flag + ": missing value");
                value = argv[++i];
            }
        }
        if (key == "config") {
            load_file(value, root, sources);
        } else {
            e->from_text(root, value, flag);
            sources.set_by_flag(key, flag);
        }
    }
    return true;
}

Json SchemaTable::to_json(const void* root) const {
    Json doc = Json::object();
    for (const Entry& e : entries_) doc[e.name] = e.to_json(root);
    return doc;
}

std::string SchemaTable::help(const std::string& program, const void* defaults) const {
    std::ostringstream out;
    out << "usage: " << program << " [--config FILE.json]... [--key value | --key=value]...\n\n"
        << "Every key below may appear in a JSON config file (a flat object) or as a flag; later sources\n"
        << "override earlier ones. Booleans accept a bare --key for true. In flags, dashes and underscores\n"
        << "are equal (--total-batch-size); JSON keys take underscores only.\n\n"
        << "  --config FILE.json         load keys from a JSON file (repeatable)\n"
        << "  --help                     print this help and exit\n";
    std::string group;
    for (const Entry& e : entries_) {
        if (e.group != group) out << "\n" << (group = e.group) << ":\n";
        std::string left = "  --" + e.name;
        left.resize(std::max<size_t>(left.size() + 1, 29), ' ');
        std::string help_line = e.help;
        if (!e.choices.empty() && e.help.find(e.choices.front()) == std::string::npos) {
            help_line += " (";
            for (size_t c = 0; c < e.choices.size(); c++) help_line += (c ? ", " : "") + e.choices[c];
            help_line += ")";
        }
        out << left << help_line << " [default: " << e.to_json(defaults).dump() << "]";
        if (!e.note.empty()) out << " [" << e.note << "]";
        out << "\n";
    }
    return out.str();
}

std::string ConfigSources::file(const std::string& key) const {
    const auto it = set_by_.find(key);
    return it == set_by_.end() ? "" : it->second.file;
}

std::string ConfigSources::name(const std::string& key) const {
    const std::string source = origin(key);
    if (source.empty()) return "--" + key;
    return file(key).empty() ? source : source + ": key '" + key + "'";
}

std::string ConfigSources::origin(const std::string& key) const {
    const auto it = set_by_.find(key);
    if (it == set_by_.end()) return "";
    return it->second.file.empty() ? it->second.flag : it->second.file;
}

std::string ConfigSources::list(const std::vector<std::string>& keys) const {
    std::vector<std::string> seen;
    for (const std::string& key : keys) {
        const std::string source = origin(key);
        if (source.empty()) continue;
        if (std::find(seen.begin(), seen.end(), source) == seen.end()) seen.push_back(source);
    }
    std::string out;
    for (const std::string& source : seen) out += (out.empty() ? "" : ", ") + source;
    return out;
}

std::string with_commas(uint64_t v) {
    const std::string digits = std::to_string(v);
    std::string s;
    for (size_t i = 0; i < digits.size(); i++) {
        if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
        s.push_back(digits[i]);
    }
    return s;
}

std::string format_float(float v) {
    char buf[32];
    std::string text(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    // to_chars pads the exponent to two digits and signs it (1e-09, 1e+20); people write 1e-9 and 1e20
    if (const size_t e = text.find('e'); e != std::string::npos) {
        size_t digits = e + 1;
        if (text[digits] == '+') text.erase(digits, 1);
        else if (text[digits] == '-') digits++;
        while (digits + 1 < text.size() && text[digits] == '0') text.erase(digits, 1);
    }
    return text;
}

}  // namespace llmc
