// The mechanics of a config schema. Each part of the program declares its own keys next to its code, over its own
// options struct (Key<S>: a name, a help line, the member it sets); the run layer binds those lists into one
// Schema of its root config struct, from which flags are parsed, JSON config files are read, `--help` is printed
// and the resolved config is written, so all four always agree.
//
// Flags take `--key value` or `--key=value` (dashes equal underscores); booleans also a bare `--key`. Numbers are
// plain decimals (integers -?digits; floats also with a fraction and an exponent): no blanks, no '+', no hex, inf
// or nan. Unknown keys, malformed values and bad choices throw llmc::Error naming the flag, or the file and key.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmc {

// Where each key's current value came from, so that a message about it names what the user wrote: the last
// source that set it (a JSON file, or a flag; a key no source set holds its default).
class ConfigSources {
public:
    void set_by_file(const std::string& key, const std::string& path) { set_by_[key] = {path, ""}; }
    // `typed`: the flag as the user spelled it ("--warmup-steps" for warmup_steps)
    void set_by_flag(const std::string& key, const std::string& typed) { set_by_[key] = {"", typed}; }
    // The file that set `key` last; "" when a flag did or nothing did.
    std::string file(const std::string& key) const;
    // How a message names `key`: "configs/x.json: key 'lr'" when a file set it last, else the flag as typed
    // ("--lr" when nothing set it).
    std::string name(const std::string& key) const;
    // Where `key`'s value came from: the file or the flag as typed that set it last; "" for the default.
    std::string origin(const std::string& key) const;
    // The sources of `keys` that some source set, each once in first-seen order ("configs/tiny.json, --num_heads"),
    // for a check that relates them; "" when all hold their defaults.
    std::string list(const std::vector<std::string>& keys) const;

private:
    struct Source {
        std::string file;  // the config file that set the key last, or "" for a flag
        std::string flag;  // the flag that did, as typed
    };
    std::map<std::string, Source> set_by_;
};

// A float as a message shows it, recognisably what the user typed: the shortest text that reads back as the same
// float, its exponent unpadded (-1e-9 and -0, where std::to_string prints -0.000000 for both).
std::string format_float(float v);
// 319946752 -> "319,946,752".
std::string with_commas(uint64_t v);

// The value readers the keys share; `where` names the flag or the file and key in messages.
namespace schema {
using Json = nlohmann::ordered_json;
int64_t int_from_text(const std::string& text, int64_t lo, int64_t hi, const std::string& where);
float float_from_text(const std::string& text, const std::string& where);
bool bool_from_text(const std::string& text, const std::string& where);
std::string string_from_text(const std::string& text, const std::vector<std::string>& choices, const std::string& where);
int64_t int_from_json(const Json& v, int64_t lo, int64_t hi, const std::string& where);
float float_from_json(const Json& v, const std::string& where);
bool bool_from_json(const Json& v, const std::string& where);
std::string string_from_json(const Json& v, const std::vector<std::string>& choices, const std::string& where);
// The shortest decimal that reads back as this float, so 6e-4 is written as 0.0006.
Json float_to_json(float v);
}  // namespace schema

// What --help, the parser and the run layer know of a key, whatever struct it sets.
struct KeyInfo {
    std::string name, help;
    std::vector<std::string> choices;  // the values a string or enum key takes (empty: any)
    bool is_bool = false;
    std::string note;                  // shown in --help after the default ("experimental: ...")
    bool fixed_on_resume = false;      // a resumed run must have the checkpoint's value
};

// KeyInfo of a key: its name, help line, and the values it takes (strings and enums).
inline KeyInfo key_info(const char* name, const char* help, std::vector<std::string> choices = {}, bool is_bool = false) {
    return KeyInfo{name, help, std::move(choices), is_bool, "", false};
}

// One key of the options struct S.
template <class S>
struct Key : KeyInfo {
    std::function<void(S&, const std::string& text, const std::string& where)> from_text;
    std::function<void(S&, const schema::Json& value, const std::string& where)> from_json;
    std::function<schema::Json(const S&)> to_json;

    // A resumed run must keep this key's value (the model's shape, the data order, the optimizer's state layout).
    Key fixed() && {
        fixed_on_resume = true;
        return std::move(*this);
    }
    // An option that is checked for correctness but not shown to pay: --help says so, with `why`.
    Key experimental(const std::string& why) && {
        note = "experimental: " + why;
        return std::move(*this);
    }
};

template <class S>
Key<S> key(const char* name, int S::*m, const char* help) {
    return {key_info(name, help),
            [m](S& s, const std::string& t, const std::string& w) {
                s.*m = static_cast<int>(schema::int_from_text(t, INT32_MIN, INT32_MAX, w));
            },
            [m](S& s, const schema::Json& v, const std::string& w) {
                s.*m = static_cast<int>(schema::int_from_json(v, INT32_MIN, INT32_MAX, w));
            },
            [m](const S& s) { return schema::Json(s.*m); }};
}
template <class S>
Key<S> key(const char* name, int64_t S::*m, const char* help) {
    return {key_info(name, help),
            [m](S& s, const std::string& t, const std::string& w) { s.*m = schema::int_from_text(t, INT64_MIN, INT64_MAX, w); },
            [m](S& s, const schema::Json& v, const std::string& w) { s.*m = schema::int_from_json(v, INT64_MIN, INT64_MAX, w); },
            [m](const S& s) { return schema::Json(s.*m); }};
}
template <class S>
Key<S> key(const char* name, float S::*m, const char* help) {
    return {key_info(name, help),
            [m](S& s, const std::string& t, const std::string& w) { s.*m = schema::float_from_text(t, w); },
            [m](S& s, const schema::Json& v, const std::string& w) { s.*m = schema::float_from_json(v, w); },
            [m](const S& s) { return schema::float_to_json(s.*m); }};
}
template <class S>
Key<S> key(const char* name, bool S::*m, const char* help) {
    return {key_info(name, help, {}, true),
            [m](S& s, const std::string& t, const std::string& w) { s.*m = schema::bool_from_text(t, w); },
            [m](S& s, const schema::Json& v, const std::string& w) { s.*m = schema::bool_from_json(v, w); },
            [m](const S& s) { return schema::Json(s.*m); }};
}
template <class S>
Key<S> key(const char* name, std::string S::*m, const char* help, std::vector<std::string> choices = {}) {
    return {key_info(name, help, choices),
            [m, choices](S& s, const std::string& t, const std::string& w) {
                s.*m = schema::string_from_text(t, choices, w);
            },
            [m, choices](S& s, const schema::Json& v, const std::string& w) {
                s.*m = schema::string_from_json(v, choices, w);
            },
            [m](const S& s) { return schema::Json(s.*m); }};
}
// An enum key: its values by name, in the order --help lists them.
template <class S, class E>
    requires std::is_enum_v<E>
Key<S> key(const char* name, E S::*m, const char* help, std::vector<std::pair<std::string, E>> names) {
    std::vector<std::string> choices;
    for (const auto& [text, value] : names) choices.push_back(text);
    const auto value_of = [names](const std::string& text) {
        for (const auto& [t, value] : names)
            if (t == text) return value;
        return names.front().second;  // unreachable: the text was checked against the choices
    };
    return {key_info(name, help, choices),
            [m, choices, value_of](S& s, const std::string& t, const std::string& w) {
                s.*m = value_of(schema::string_from_text(t, choices, w));
            },
            [m, choices, value_of](S& s, const schema::Json& v, const std::string& w) {
                s.*m = value_of(schema::string_from_json(v, choices, w));
            },
            [m, names](const S& s) {
                for (const auto& [text, value] : names)
                    if (value == s.*m) return schema::Json(text);
                return schema::Json(nullptr);
            }};
}

// The keys of every part, bound into one root struct and grouped for --help. Untyped underneath (the root is a
// void*), so the parsing is written once, in schema.cpp; Schema<Root> is the typed face.
class SchemaTable {
public:
    struct Entry : KeyInfo {
        std::string group;
        std::function<void(void*, const std::string& text, const std::string& where)> from_text;
        std::function<void(void*, const schema::Json& value, const std::string& where)> from_json;
        std::function<schema::Json(const void*)> to_json;
    };
    const Entry* find(const std::string& name) const;
    std::vector<std::string> keys() const;
    const std::vector<Entry>& entries() const { return entries_; }

protected:
    void add_entry(Entry e);
    void load_file(const std::string& path, void* root, ConfigSources& sources) const;
    // Returns false when --help was given (help printed to stdout).
    bool parse_command_line(int argc, const char* const* argv, void* root, ConfigSources& sources,
                            const std::string& program, const void* defaults) const;
    schema::Json to_json(const void* root) const;
    std::string help(const std::string& program, const void* defaults) const;

private:
    std::string did_you_mean(std::string key) const;
    std::vector<Entry> entries_;
};

template <class Root>
class Schema : public SchemaTable {
public:
    // Adds the keys of the options struct that `part` finds in Root, under `group` (a group may be added to again:
    // its keys are listed together, in the order added).
    template <class S>
    Schema& add(const std::string& group, S& (*part)(Root&), const std::vector<Key<S>>& keys) {
        for (const Key<S>& k : keys) {
            Entry e{k, group, {}, {}, {}};
            e.from_text = [part, f = k.from_text](void* root, const std::string& t, const std::string& w) {
                f(part(*static_cast<Root*>(root)), t, w);
            };
            e.from_json = [part, f = k.from_json](void* root, const schema::Json& v, const std::string& w) {
                f(part(*static_cast<Root*>(root)), v, w);
            };
            e.to_json = [part, f = k.to_json](const void* root) {
                return f(part(*const_cast<Root*>(static_cast<const Root*>(root))));  // part only finds, never writes
            };
            add_entry(std::move(e));
        }
        return *this;
    }
    // Adds keys of Root itself.
    Schema& add(const std::string& group, const std::vector<Key<Root>>& keys) {
        for (const Key<Root>& k : keys) {
            Entry e{k, group, {}, {}, {}};
            e.from_text = [f = k.from_text](void* root, const std::string& t, const std::string& w) {
                f(*static_cast<Root*>(root), t, w);
            };
            e.from_json = [f = k.from_json](void* root, const schema::Json& v, const std::string& w) {
                f(*static_cast<Root*>(root), v, w);
            };
            e.to_json = [f = k.to_json](const void* root) { return f(*static_cast<const Root*>(root)); };
            add_entry(std::move(e));
        }
        return *this;
    }

    void load_file(const std::string& path, Root& root, ConfigSources& sources) const {
        SchemaTable::load_file(path, &root, sources);
    }
    bool parse_command_line(int argc, const char* const* argv, Root& root, ConfigSources& sources,
                            const std::string& program) const {
        const Root defaults{};
        return SchemaTable::parse_command_line(argc, argv, &root, sources, program, &defaults);
    }
    schema::Json to_json(const Root& root) const { return SchemaTable::to_json(&root); }
    std::string help(const std::string& program) const {
        const Root defaults{};
        return SchemaTable::help(program, &defaults);
    }
};

}  // namespace llmc
