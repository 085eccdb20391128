// The config schema table and everything derived from it (see config.h).
#include "llmc/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <variant>

#include "demo/demo_chunk_math.h"
#include "llmc/adamw.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace llmc {

namespace {

using json = nlohmann::ordered_json;
using Field = std::variant<int TrainConfig::*, int64_t TrainConfig::*, float TrainConfig::*, bool TrainConfig::*,
                           std::string TrainConfig::*, int ModelConfig::*>;

struct Option {
    const char* key;
    Field field;
    const char* help;
    std::vector<std::string> choices = {};  // for string keys with a fixed set of values
};

const std::vector<std::pair<const char*, std::vector<Option>>>& schema() {
    static const std::vector<std::pair<const char*, std::vector<Option>>> groups = {
        {"model",
         {
             {"num_layers", &ModelConfig::num_layers, "transformer blocks"},
             {"num_heads", &ModelConfig::num_heads, "attention heads (must divide channels)"},
             {"channels", &ModelConfig::channels, "model width C"},
             {"max_seq_len", &ModelConfig::max_seq_len, "positions in wpe (checkpoint shape)"},
             {"vocab_size", &ModelConfig::vocab_size, "tokens (GPT-2: 50257)"},
             {"padded_vocab_size", &ModelConfig::padded_vocab_size, "wte rows, padded for speed (50304)"},
         }},
        {"data",
         {
             {"train_data", &TrainConfig::train_data, "glob of llm.c train shards"},
             {"val_data", &TrainConfig::val_data, "glob of llm.c val shards ('' disables validation)"},
             {"tokenizer", &TrainConfig::tokenizer, "llm.c tokenizer decode file, for samples"},
             {"shuffle", &TrainConfig::shuffle, "seeded shuffle of shard and batch order each epoch"},
         }},
        {"batch",
         {
             {"batch_size", &TrainConfig::batch_size, "micro-batch sequences per rank (B)"},
             {"seq_len", &TrainConfig::seq_len, "tokens per sequence (T <= max_seq_len)"},
             {"total_batch_size", &TrainConfig::total_batch_size,
              "tokens per optimizer step over all ranks; a multiple of B*T*ranks (0 = B*T*ranks)"},
         }},
        {"schedule",
         {
             {"steps", &TrainConfig::steps, "optimizer steps"},
             {"lr", &TrainConfig::lr, "peak learning rate"},
             {"warmup_steps", &TrainConfig::warmup_steps, "linear warmup steps"},
             {"warmup_start_frac", &TrainConfig::warmup_start_frac, "warmup starts at this fraction of lr"},
             {"lr_schedule", &TrainConfig::lr_schedule,
              "after warmup: cosine or linear decay to the floor, wsd (lr, then a linear decay over the last "
              "lr_decay_frac of the steps) or constant",
              {"cosine", "linear", "wsd", "constant"}},
             {"final_lr_frac", &TrainConfig::final_lr_frac, "the decay ends at this fraction of lr (the floor)"},
             {"lr_decay_frac", &TrainConfig::lr_decay_frac, "wsd: the share of the steps that decay"},
         }},
        {"optimizer",
         {
             {"optimizer", &TrainConfig::optimizer, "adamw (AdamW-DDP) or demo (DeMo)", {"adamw", "demo"}},
             {"weight_decay", &TrainConfig::weight_decay, "decoupled weight decay"},
             {"decay_groups", &TrainConfig::decay_groups,
              "which tensors decay: 2d (matrices only) or all (the DeMo reference)", {"2d", "all"}},
             {"grad_clip", &TrainConfig::grad_clip, "max gradient L2 norm (<= 0 disables)"},
             {"beta1", &TrainConfig::beta1, "AdamW beta1"},
             {"beta2", &TrainConfig::beta2, "AdamW beta2"},
             {"eps", &TrainConfig::eps, "AdamW epsilon"},
             {"grad_wire", &TrainConfig::grad_wire, "AdamW-DDP gradients on the wire: fp32 or bf16", {"fp32", "bf16"}},
             {"demo_decay", &TrainConfig::demo_decay, "DeMo momentum decay"},
             {"demo_topk", &TrainConfig::demo_topk, "DeMo coefficients sent per chunk"},
             {"demo_chunk", &TrainConfig::demo_chunk, "DeMo chunk length per dimension"},
             {"demo_momentum", &TrainConfig::demo_momentum,
              "DeMo momentum: lr (decay*m + lr*g, reference) or ema (decay*m + (1-decay)*g)", {"lr", "ema"}},
             {"demo_alpha", &TrainConfig::demo_alpha, "DeMo error-feedback strength in (0, 1]"},
             {"demo_values", &TrainConfig::demo_values, "DeMo values on the wire: fp32, bf16 or sign (1 bit)",
              {"fp32", "bf16", "sign"}},
             {"demo_indices", &TrainConfig::demo_indices,
              "DeMo indices on the wire: auto (smallest integer) or packed12", {"auto", "packed12"}},
             {"demo_delay", &TrainConfig::demo_delay,
              "DeMo: 1 applies each step's update at the next step, so the exchange overlaps that step's "
              "compute (0: the reference's order)"},
             {"demo_eager", &TrainConfig::demo_eager,
              "DeMo with --demo_delay 1: each rank takes its own share of an update at once, until the "
              "gathered update lands a step later (false: nothing until then)"},
         }},
        {"output",
         {
             {"val_every", &TrainConfig::val_every, "validation loss every N steps (0 = only at the end)"},
             {"val_batches", &TrainConfig::val_batches,
              "validation batches per rank (at most what each rank's share of the val shards holds)"},
             {"choices", &TrainConfig::choices,
              "llm.c eval file (*.bin: HellaSwag as llm.c's dev/data/hellaswag.py writes it) whose multiple-choice "
              "accuracy each validation also logs ('' = none; eval_gpt --choices scores checkpoints)"},
             {"choices_examples", &TrainConfig::choices_examples, "score the first N examples of --choices (0 = all)"},
             {"sample_every", &TrainConfig::sample_every, "print a text sample every N steps (0 = never)"},
             {"sample_tokens", &TrainConfig::sample_tokens, "tokens per sample"},
             {"out_dir", &TrainConfig::out_dir, "metrics.jsonl, config.json and checkpoints go here"},
             {"checkpoint_every", &TrainConfig::checkpoint_every, "checkpoint every N steps (0 = only at the end, -1 = never)"},
             {"checkpoint_every_minutes", &TrainConfig::checkpoint_every_minutes,
              "also checkpoint at the first step that ends this many minutes after the last checkpoint or the start "
              "(0 = by steps only; nothing with --checkpoint_every -1)"},
             {"keep_checkpoints", &TrainConfig::keep_checkpoints, "complete checkpoints kept (0 = all)"},
             {"resume", &TrainConfig::resume, "'auto' (latest checkpoint in out_dir) or a checkpoint directory"},
             {"reset_momentum", &TrainConfig::reset_momentum,
              "on resume with another world size, start optimizer state afresh"},
             {"overwrite", &TrainConfig::overwrite,
              "delete out_dir's checkpoints of steps after this run's start (without it such a run stops)"},
             {"init_from", &TrainConfig::init_from, "llm.c model file to start from (instead of random init)"},
             {"seed", &TrainConfig::seed, "seed for init, shuffling and sampling"},
             {"threads", &TrainConfig::threads, "OpenMP threads per rank (0 = cores / ranks)"},
             {"comm_timeout", &TrainConfig::comm_timeout,
              "seconds a collective may wait for the other ranks before this rank exits (0 = forever)"},
             {"time_limit_minutes", &TrainConfig::time_limit_minutes,
              "minutes of wall time since the start: the run stops at the last step that leaves time for its "
              "checkpoint, as on a stop signal (0 = no limit)"},
             {"log_every", &TrainConfig::log_every, "progress line every N steps"},
             {"peak_tflops", &TrainConfig::peak_tflops,
              "each rank's peak TFLOP/s, for MFU in the metrics (0: in train_gpt the GPU's dense bf16 peak if known, "
              "else no MFU)"},
             {"dry_run", &TrainConfig::dry_run, "print resolved config and traffic report, then exit"},
         }},
    };
    return groups;
}

const Option* find_option(const std::string& key) {
    for (const auto& [group, options] : schema())
        for (const Option& o : options)
            if (key == o.key) return &o;
    return nullptr;
}

// Suggests the closest key for a misspelled one: at most 3 edits away, and at most half the key's length (so
// '--x' is no typo of 'lr'). Dashes count as underscores: JSON keys take underscores only, and 'total-batch-szie'
// is one typo away from 'total_batch_size', not three.
std::string did_you_mean(std::string key) {
    std::replace(key.begin(), key.end(), '-', '_');
    std::string best;
    size_t best_dist = std::min<size_t>(4, key.size() / 2 + 1);  // the first distance too far
    for (const std::string& candidate : config_keys()) {
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

void check_choice(const Option& o, const std::string& value, const std::string& where) {
    if (o.choices.empty()) return;
    for (const std::string& c : o.choices)
        if (value == c) return;
    std::string list;
    for (const std::string& c : o.choices) list += (list.empty() ? "" : ", ") + c;
    fail(where + ": '" + value + "' is not one of: " + list);
}

// A finite double as the float a config key holds: refused (naming `what`) when it overflows to infinity or a
// non-zero value underflows to zero.
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

// Sets an option from command-line text. `where` names the flag for error messages.
void set_from_text(TrainConfig& cfg, const Option& o, const std::string& text, const std::string& where) {
    auto parse_int = [&](long long lo, long long hi) {
        LLMC_CHECK(is_decimal_integer(text), where + ": expected an integer, got '" + text + "'");
        long long v = 0;
        const std::errc ec = std::from_chars(text.data(), text.data() + text.size(), v).ec;
        LLMC_CHECK(ec == std::errc() && v >= lo && v <= hi, where + ": " + text + " is out of range");
        return v;
    };
    std::visit(
        [&](auto member) {
            using M = decltype(member);
            if constexpr (std::is_same_v<M, int TrainConfig::*>) {
                cfg.*member = static_cast<int>(parse_int(INT32_MIN, INT32_MAX));
            } else if constexpr (std::is_same_v<M, int ModelConfig::*>) {
                cfg.model.*member = static_cast<int>(parse_int(INT32_MIN, INT32_MAX));
            } else if constexpr (std::is_same_v<M, int64_t TrainConfig::*>) {
                cfg.*member = parse_int(INT64_MIN, INT64_MAX);
            } else if constexpr (std::is_same_v<M, float TrainConfig::*>) {
                LLMC_CHECK(is_decimal_float(text), where + ": expected a number, got '" + text + "'");
                double v = 0.0;  // from_chars: the same in every locale
                const std::errc ec = std::from_chars(text.data(), text.data() + text.size(), v).ec;
                LLMC_CHECK(ec == std::errc(), where + ": " + text + " is out of a float's range");  // a double's, even
                cfg.*member = to_float(v, where + ": " + text);
            } else if constexpr (std::is_same_v<M, bool TrainConfig::*>) {
                if (text == "true" || text == "1") cfg.*member = true;
                else if (text == "false" || text == "0") cfg.*member = false;
                else fail(where + ": expected true or false, got '" + text + "'");
            } else {
                check_choice(o, text, where);
                try {  // the resolved config is JSON, which holds text only as UTF-8
                    (void)json(text).dump();
                } catch (const json::exception&) {
                    fail(where + ": not valid UTF-8 text");
                }
                cfg.*member = text;
            }
        },
        o.field);
}

void set_from_json(TrainConfig& cfg, const Option& o, const json& value, const std::string& where) {
    std::visit(
        [&](auto member) {
            using M = decltype(member);
            if constexpr (std::is_same_v<M, int TrainConfig::*> || std::is_same_v<M, int ModelConfig::*> ||
                          std::is_same_v<M, int64_t TrainConfig::*>) {
                LLMC_CHECK(value.is_number_integer(), where + ": expected an integer, got " + value.dump());
                LLMC_CHECK(!value.is_number_unsigned() || value.get<uint64_t>() <= uint64_t(INT64_MAX),
                           where + ": " + value.dump() + " is out of range");  // would wrap around as int64
                const int64_t v = value.get<int64_t>();
                if constexpr (std::is_same_v<M, int64_t TrainConfig::*>) {
                    cfg.*member = v;
                } else {
                    LLMC_CHECK(v >= INT32_MIN && v <= INT32_MAX, where + ": " + value.dump() + " is out of range");
                    if constexpr (std::is_same_v<M, int ModelConfig::*>) cfg.model.*member = static_cast<int>(v);
                    else cfg.*member = static_cast<int>(v);
                }
            } else if constexpr (std::is_same_v<M, float TrainConfig::*>) {
                LLMC_CHECK(value.is_number(), where + ": expected a number, got " + value.dump());
                cfg.*member = to_float(value.get<double>(), where + ": " + value.dump());
            } else if constexpr (std::is_same_v<M, bool TrainConfig::*>) {
                LLMC_CHECK(value.is_boolean(), where + ": expected true or false, got " + value.dump());
                cfg.*member = value.get<bool>();
            } else {
                LLMC_CHECK(value.is_string(), where + ": expected a string, got " + value.dump());
                check_choice(o, value.get<std::string>(), where);
                cfg.*member = value.get<std::string>();
            }
        },
        o.field);
}

json value_to_json(const TrainConfig& cfg, const Option& o) {
    return std::visit(
        [&](auto member) -> json {
            using M = decltype(member);
            if constexpr (std::is_same_v<M, int ModelConfig::*>) {
                return cfg.model.*member;
            } else if constexpr (std::is_same_v<M, float TrainConfig::*>) {
                // The shortest decimal that reads back as this float, so 6e-4 prints as 0.0006.
                char buf[32];
                const auto end = std::to_chars(buf, buf + sizeof buf, cfg.*member).ptr;
                return std::strtod(std::string(buf, end).c_str(), nullptr);
            } else {
                return cfg.*member;
            }
        },
        o.field);
}

bool is_bool_option(const Option& o) { return std::holds_alternative<bool TrainConfig::*>(o.field); }

}  // namespace

std::vector<std::string> config_keys() {
    std::vector<std::string> keys;
    for (const auto& [group, options] : schema())
        for (const Option& o : options) keys.emplace_back(o.key);
    return keys;
}

void load_config_file(const std::string& path, TrainConfig& cfg) {
    LLMC_CHECK(!path.empty(), "--config: empty file name");
    constexpr size_t kMaxConfigBytes = 16u << 20;  // a config is a few hundred bytes; /dev/zero is endless
    const std::vector<std::byte> bytes = read_whole_file(path, kMaxConfigBytes);
    json doc;
    std::vector<std::string> top_keys;
    // A config is flat: deep nesting (which would exhaust the stack) and repeated keys (which JSON parsers
    // resolve silently, each its own way) are refused while parsing.
    const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
        LLMC_CHECK(depth <= 32, path + ": JSON nested deeper than 32 levels (a config is a flat object)");
        if (event == json::parse_event_t::key && depth == 1) {
            const std::string key = parsed.get<std::string>();
            LLMC_CHECK(std::find(top_keys.begin(), top_keys.end(), key) == top_keys.end(),
                       path + ": key '" + key + "' appears twice");
            top_keys.push_back(key);
        }
        return true;
    };
    try {
        doc = json::parse(reinterpret_cast<const char*>(bytes.data()),
                          reinterpret_cast<const char*>(bytes.data()) + bytes.size(), check);
    } catch (const json::exception& e) {  // syntax, and numbers out of range such as 1e400
        fail(path + ": malformed JSON (" + std::string(e.what()) + ")");
    }
    LLMC_CHECK(doc.is_object(), path + ": expected a JSON object of config keys");
    for (const auto& [key, value] : doc.items()) {
        if (key.starts_with("_")) continue;  // "_comment" and the like
        const Option* o = find_option(key);
        LLMC_CHECK(o != nullptr, path + ": unknown config key '" + key + "'" + did_you_mean(key));
        set_from_json(cfg, *o, value, path + ": key '" + key + "'");
        cfg.sources.set_by_file(key, path);
    }
}

bool parse_command_line(int argc, const char* const* argv, TrainConfig& cfg, const std::string& program) {
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
            std::printf("%s", help_text(program).c_str());
            return false;
        }
        const Option* o = key == "config" ? nullptr : find_option(key);
        LLMC_CHECK(key == "config" || o != nullptr, flag + ": unknown flag" + did_you_mean(key) + " (see --help)");
        if (!has_value) {
            const bool next_is_value = i + 1 < argc && !std::string(argv[i + 1]).starts_with("--");
            if (o && is_bool_option(*o) && !next_is_value) {
                value = "true";
            } else {
                LLMC_CHECK(i + 1 < argc && (o || next_is_value), flag + ": missing value");
                value = argv[++i];
            }
        }
        if (key == "config") {
            load_config_file(value, cfg);
        } else {
            set_from_text(cfg, *o, value, flag);
            cfg.sources.set_by_flag(key, flag);
        }
    }
    validate_config(cfg);
    return true;
}

void validate_config(const TrainConfig& c) {
    const ConfigSources& s = c.sources;
    // the shape checks relate several keys: they name every source that set one
    const std::string model_sources =
        s.list({"num_layers", "num_heads", "channels", "max_seq_len", "vocab_size", "padded_vocab_size"});
    validate_model_config(c.model, model_sources.empty() ? "model config" : "model config (" + model_sources + ")");
    const auto at_least = [&](const char* key, long long v, long long min, const std::string& note = "") {
        LLMC_CHECK(v >= min, s.name(key) + (min == 1 ? " must be > 0" : " must be >= " + std::to_string(min)) +
                                 " (got " + std::to_string(v) + (note.empty() ? "" : "; " + note) + ")");
    };
    const auto at_most = [&](const char* key, long long v, long long max, const std::string& note) {
        LLMC_CHECK(v <= max, s.name(key) + " must be <= " + std::to_string(max) + " (got " + std::to_string(v) + "; " +
                                 note + ")");
    };
    const auto in_unit_interval = [&](const char* key, float v) {
        LLMC_CHECK(v >= 0.0f && v <= 1.0f, s.name(key) + " must be in [0, 1] (got " + format_float(v) + ")");
    };
    at_least("batch_size", c.batch_size, 1);
    at_least("seq_len", c.seq_len, 1);
    at_least("steps", c.steps, 1);
    const std::string shape_file = s.file("max_seq_len");
    LLMC_CHECK(c.seq_len <= c.model.max_seq_len,
               s.name("seq_len") + " " + std::to_string(c.seq_len) + " exceeds max_seq_len " +
                   std::to_string(c.model.max_seq_len) + (shape_file.empty() ? "" : " (" + shape_file + ")"));
    at_least("total_batch_size", c.total_batch_size, 0);
    LLMC_CHECK(c.lr > 0.0f, s.name("lr") + " must be > 0 (got " + format_float(c.lr) + ")");
    at_least("warmup_steps", c.warmup_steps, 0);
    in_unit_interval("final_lr_frac", c.final_lr_frac);
    in_unit_interval("warmup_start_frac", c.warmup_start_frac);
    in_unit_interval("lr_decay_frac", c.lr_decay_frac);
    at_least("val_every", c.val_every, 0);
    at_least("val_batches", c.val_batches, 0);
    at_least("choices_examples", c.choices_examples, 0);
    LLMC_CHECK(c.choices.empty() || c.choices.ends_with(".bin"),
               s.name("choices") + " '" + c.choices + "' is not an llm.c eval file (*.bin); eval_gpt --choices "
               "reads JSON Lines, and --write_eval_file makes one");
    at_least("sample_every", c.sample_every, 0);
    at_least("sample_tokens", c.sample_tokens, 0);
    at_most("sample_tokens", c.sample_tokens, kMaxSampleTokens, "sample_gpt's limit too");
    at_least("keep_checkpoints", c.keep_checkpoints, 0);
    at_least("threads", c.threads, 0);
    at_most("threads", c.threads, kMaxThreads, "OpenMP threads per rank");
    at_least("checkpoint_every", c.checkpoint_every, -1, "0: only at the end, -1: never");
    at_least("log_every", c.log_every, 1);
    LLMC_CHECK(c.demo_delay == 0 || c.demo_delay == 1,
               s.name("demo_delay") + " must be 0 or 1 (got " + std::to_string(c.demo_delay) + ")");
    LLMC_CHECK(c.comm_timeout >= 0.0f, s.name("comm_timeout") + " must be >= 0 (got " + format_float(c.comm_timeout) +
                                           "; seconds, 0 waits forever)");
    LLMC_CHECK(c.checkpoint_every_minutes >= 0.0f, s.name("checkpoint_every_minutes") + " must be >= 0 (got " +
                                                       format_float(c.checkpoint_every_minutes) + "; 0: by steps only)");
    LLMC_CHECK(c.time_limit_minutes >= 0.0f, s.name("time_limit_minutes") + " must be >= 0 (got " +
                                                 format_float(c.time_limit_minutes) + "; 0: no limit)");
    LLMC_CHECK(c.peak_tflops >= 0.0f, s.name("peak_tflops") + " must be >= 0 (got " + format_float(c.peak_tflops) +
                                          "; 0: looked up for a known GPU, else no MFU)");
    LLMC_CHECK(!c.out_dir.empty(), s.name("out_dir") + " must not be empty");
    // The optimizer's own checks (its constructor makes them again, naming flags: it sees no sources), here so
    // that a dry run makes them too and a bad value fails before any rank starts work.
    if (c.optimizer == "demo") demo::cm::validate_options(c.optimizer_config(), s);
    else validate_adamw_options(c.optimizer_config(), s);
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

LrSchedule TrainConfig::schedule() const {
    const LrShape shape = lr_schedule == "linear" ? LrShape::linear
                          : lr_schedule == "wsd"  ? LrShape::wsd
                          : lr_schedule == "constant" ? LrShape::constant
                                                      : LrShape::cosine;
    return {lr, warmup_steps, steps, warmup_start_frac, final_lr_frac, shape, lr_decay_frac};
}

OptimizerConfig TrainConfig::optimizer_config() const {
    OptimizerConfig o;
    o.weight_decay = weight_decay;
    o.decay_groups = decay_groups == "all" ? DecayGroups::all : DecayGroups::matrices;
    o.grad_clip = grad_clip;
    o.adamw = {beta1, beta2, eps, grad_wire == "bf16" ? GradWire::bf16 : GradWire::fp32};
    o.demo.decay = demo_decay;
    o.demo.topk = demo_topk;
    o.demo.chunk = demo_chunk;
    o.demo.momentum = demo_momentum == "ema" ? DemoMomentum::ema : DemoMomentum::lr_scaled;
    o.demo.feedback_alpha = demo_alpha;
    o.demo.values = demo_values == "bf16"   ? DemoValueEncoding::bf16
                    : demo_values == "sign" ? DemoValueEncoding::sign
                                            : DemoValueEncoding::fp32;
    o.demo.indices = demo_indices == "packed12" ? DemoIndexEncoding::packed12 : DemoIndexEncoding::smallest;
    o.demo.delay = demo_delay;
    o.demo.eager = demo_eager;
    return o;
}

std::string config_to_json(const TrainConfig& cfg, int indent) {
    json doc = json::object();
    for (const auto& [group, options] : schema())
        for (const Option& o : options) doc[o.key] = value_to_json(cfg, o);
    return doc.dump(indent);
}

std::string help_text(const std::string& program) {
    const TrainConfig defaults;
    std::ostringstream out;
    out << "usage: " << program << " [--config FILE.json]... [--key value | --key=value]...\n\n"
        << "Every key below may appear in a JSON config file (a flat object) or as a flag; later sources\n"
        << "override earlier ones. Booleans accept a bare --key for true. In flags, dashes and underscores\n"
        << "are equal (--total-batch-size); JSON keys take underscores only.\n\n"
        << "  --config FILE.json         load keys from a JSON file (repeatable)\n"
        << "  --help                     print this help and exit\n";
    for (const auto& [group, options] : schema()) {
        out << "\n" << group << ":\n";
        for (const Option& o : options) {
            std::string left = std::string("  --") + o.key;
            left.resize(std::max<size_t>(left.size() + 1, 29), ' ');
            out << left << o.help << " [default: " << value_to_json(defaults, o).dump() << "]\n";
        }
    }
    return out.str();
}

}  // namespace llmc
