// Command-line flags of the standalone tools (sample_gpt, eval_gpt, prepro_gpt2, convert_tokens), spelled as the
// trainers' flags are: --key value or --key=value, dashes equal to underscores (--top-k), booleans bare or =true/=false,
// numbers as plain decimals. Every problem throws llmc::Error naming the flag as typed.
#pragma once
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>

#include "llmc/base/error.h"

namespace llmc {

// Calls on_flag(key, flag, value) for each flag in argv[1..]: key with underscores, flag as typed (for messages).
// The keys in `booleans` take no value ("true" when bare), those in `valued` take one; any other key is an unknown
// flag, reported as such even where it is the last argument. --help and -h print `usage` and exit 0. Arguments
// that are not flags go to `on_path` (the input files of prepro_gpt2 and convert_tokens), or are an error without it.
using FlagHandler = std::function<void(const std::string& key, const std::string& flag, const std::string& value)>;
using PathHandler = std::function<void(const std::string& path)>;
inline void for_each_flag(int argc, char** argv, const char* usage, std::initializer_list<const char*> booleans,
                          std::initializer_list<const char*> valued, const FlagHandler& on_flag,
                          const PathHandler& on_path = nullptr) {
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (on_path && arg != "-h" && !arg.starts_with("--")) {
            on_path(arg);
            continue;
        }
        LLMC_CHECK(arg.starts_with("--") && arg.size() > 2,
                   "unexpected argument '" + arg + "': flags look like --key value (see --help)");
        std::string key = arg.substr(2), value;
        bool has_value = false;
        if (const size_t eq = key.find('='); eq != std::string::npos) {
            value = key.substr(eq + 1), key = key.substr(0, eq), has_value = true;
        }
        const std::string flag = "--" + key;
        for (char& c : key)
            if (c == '-') c = '_';
        if (key == "help" || key == "h") {
            std::fputs(usage, stdout);
            std::exit(0);
        }
        bool boolean = false, takes_value = false;
        for (const char* b : booleans) boolean = boolean || key == b;
        for (const char* v : valued) takes_value = takes_value || key == v;
        LLMC_CHECK(boolean || takes_value, flag + ": unknown flag (see --help)");
        if (boolean) {
            LLMC_CHECK(!has_value || value == "true" || value == "false", flag + ": takes no value or true/false");
            on_flag(key, flag, !has_value || value == "true" ? "true" : "false");
            continue;
        }
        if (!has_value) {
            LLMC_CHECK(i + 1 < argc, flag + ": missing value (see --help)");
            value = argv[++i];
        }
        on_flag(key, flag, value);
    }
}

inline long long flag_integer(const std::string& flag, const std::string& text, long long min, long long max) {
    long long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    LLMC_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= min && value <= max,
               flag + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                   text + "'");
    return value;
}

inline float flag_number(const std::string& flag, const std::string& text) {
    float value = 0.0f;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    LLMC_CHECK(ec == std::errc() && end == text.data() + text.size() && std::isfinite(value),
               flag + ": expected a number, got '" + text + "'");
    return value;
}

}  // namespace llmc
