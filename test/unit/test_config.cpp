// Config schema tests: JSON files and flags set the same keys, later sources win, help documents exactly the
// parser's keys, numbers in flags are plain decimals, and every kind of bad input gets a one-line error naming the
// flag or file and key, range errors the source that set the value last, floats as the user wrote them.
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/run/config.h"
#include "llmc/base/error.h"
#include "llmc/optim/schedule.h"
#include "llmc/run/dry_run.h"
#include "llmc/run/run_setup.h"
#include "llmc/run/step_reporter.h"
#include "test/support/testing.h"

using namespace llmc;

static bool parse(std::vector<std::string> args, TrainConfig& cfg) {
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return parse_command_line(static_cast<int>(argv.size()), argv.data(), cfg, "test");
}

// The message a fresh config's parse of `args` throws, or "(no error)": for the tests of whole messages.
static std::string parse_error(std::vector<std::string> args) {
    TrainConfig cfg;
    try {
        parse(std::move(args), cfg);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

static std::string write_temp(const std::string& name, const std::string& text) {
    const std::string path = "build/test-tmp/" + name;
    std::system("mkdir -p build/test-tmp");
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return path;
}

TEST(flags_override_defaults) {
    TrainConfig cfg;
    EXPECT(parse({"--lr", "0.001", "--batch_size=8", "--optimizer", "demo", "--shuffle=false", "--num-layers", "3"}, cfg));
    EXPECT_NEAR(cfg.lr, 0.001, 1e-9);
    EXPECT_EQ(cfg.batch_size, 8);
    EXPECT_EQ(cfg.optimizer, std::string("demo"));
    EXPECT_EQ(cfg.shuffle, false);
    EXPECT_EQ(cfg.model.num_layers, 3);
}

TEST(bare_boolean_flag_means_true) {
    TrainConfig cfg;
    cfg.shuffle = false;
    EXPECT(parse({"--shuffle", "--lr", "0.5"}, cfg));
    EXPECT_EQ(cfg.shuffle, true);
    EXPECT_NEAR(cfg.lr, 0.5, 1e-9);
}

TEST(config_file_then_flags_in_order) {
    const std::string path = write_temp("c1.json", R"({"num_layers": 2, "channels": 64, "num_heads": 4, "lr": 0.01, "_comment": "x"})");
    TrainConfig cfg;
    EXPECT(parse({"--lr", "0.5", "--config", path, "--channels", "128"}, cfg));
    EXPECT_NEAR(cfg.lr, 0.01, 1e-9);  // the file came after --lr
    EXPECT_EQ(cfg.model.channels, 128);
    EXPECT_EQ(cfg.model.num_layers, 2);
}

TEST(committed_configs_parse) {
    for (const char* f : {"configs/tiny.json", "configs/small.json", "configs/d12.json", "configs/paper_300m.json",
                          "configs/paper_1b.json", "configs/tiny_olmo.json"}) {
        TrainConfig cfg;
        EXPECT(parse({"--config", f}, cfg));
    }
}

TEST(help_lists_every_key_and_only_those) {
    const std::string help = help_text("prog");
    for (const std::string& key : config_keys()) EXPECT(help.find("--" + key + " ") != std::string::npos);
    // Every --flag mentioned in help must parse (except --help and --config, handled specially).
    size_t pos = 0;
    int flags = 0;
    while ((pos = help.find("\n  --", pos)) != std::string::npos) {
        pos += 5;
        const size_t end = help.find_first_of(" =", pos);
        const std::string key = help.substr(pos, end - pos);
        flags++;
        if (key == "help" || key == "config") continue;
        TrainConfig cfg;
        const std::string json = config_to_json(cfg);
        EXPECT(json.find("\"" + key + "\"") != std::string::npos);
    }
    EXPECT_EQ(flags, static_cast<int>(config_keys().size()) + 2);
}

TEST(json_round_trip_of_resolved_config) {
    TrainConfig a;
    EXPECT(parse({"--lr", "0.003", "--optimizer", "demo", "--demo_topk", "8", "--seq_len", "32"}, a));
    const std::string path = write_temp("rt.json", config_to_json(a));
    TrainConfig b;
    EXPECT(parse({"--config", path}, b));
    EXPECT_EQ(config_to_json(a), config_to_json(b));
}

TEST(bad_flags_are_named) {
    TrainConfig cfg;
    EXPECT_ERROR(parse({"--learning_rate", "1"}, cfg), "--learning_rate: unknown flag");
    EXPECT_ERROR(parse({"--lrr", "1"}, cfg), "did you mean 'lr'");
    EXPECT_ERROR(parse({"--lr", "fast"}, cfg), "--lr: expected a number, got 'fast'");
    EXPECT_ERROR(parse({"--steps", "1.5"}, cfg), "--steps: expected an integer");
    EXPECT_ERROR(parse({"--steps"}, cfg), "--steps: missing value");
    EXPECT_ERROR(parse({"--optimizer", "sgd"}, cfg), "--optimizer: 'sgd' is not one of: adamw, demo, diloco, signum, topk, randomk, sparseloco, powersgd");
    EXPECT_ERROR(parse({"--shuffle=maybe"}, cfg), "--shuffle: expected true or false");
    EXPECT_ERROR(parse({"stray"}, cfg), "unexpected argument 'stray'");
    EXPECT_ERROR(parse({"--seq_len", "2048"}, cfg), "--seq_len 2048 exceeds max_seq_len 1024");
    EXPECT_ERROR(parse({"--batch_size", "0"}, cfg), "--batch_size must be > 0");
    TrainConfig fresh;
    EXPECT_ERROR(parse({"--comm_timeout", "-1"}, fresh), "--comm_timeout must be >= 0");
    TrainConfig fresh2;
    EXPECT_ERROR(parse({"--checkpoint_every", "-2"}, fresh2), "--checkpoint_every must be >= -1");
    EXPECT_ERROR(parse({"--num_heads", "5"}, cfg), "not divisible by num_heads");
    EXPECT_ERROR(parse({"--steps", "99999999999"}, cfg), "out of range");
    EXPECT_ERROR(parse({"--lr", "1e39"}, cfg), "--lr: 1e39 is out of a float's range");  // finite as a double only
    EXPECT_ERROR(parse({"--eps", "1e-50"}, cfg), "--eps: 1e-50 is out of a float's range");  // would become 0
    EXPECT_ERROR(parse({"--config", "--dry_run"}, cfg), "--config: missing value");
    EXPECT_ERROR(parse({"--config="}, cfg), "--config: empty file name");
    EXPECT_ERROR(parse({"--out_dir", "out/\xff"}, cfg), "--out_dir: not valid UTF-8 text");
}

TEST(bad_config_files_are_named) {
    TrainConfig cfg;
    const std::string unknown = write_temp("unknown.json", R"({"num_layer": 2})");
    EXPECT_ERROR(parse({"--config", unknown}, cfg), unknown + ": unknown config key 'num_layer' (did you mean 'num_layers'?)");
    const std::string malformed = write_temp("malformed.json", R"({"num_layers": 2,)");
    EXPECT_ERROR(parse({"--config", malformed}, cfg), malformed + ": malformed JSON");
    const std::string wrong_type = write_temp("type.json", R"({"num_layers": "two"})");
    EXPECT_ERROR(parse({"--config", wrong_type}, cfg), wrong_type + ": key 'num_layers': expected an integer");
    const std::string not_object = write_temp("array.json", R"([1, 2])");
    EXPECT_ERROR(parse({"--config", not_object}, cfg), "expected a JSON object");
    EXPECT_ERROR(parse({"--config", "build/test-tmp/does_not_exist.json"}, cfg), "does_not_exist.json: cannot open");
    const std::string bad_choice = write_temp("choice.json", R"({"demo_values": "fp8"})");
    EXPECT_ERROR(parse({"--config", bad_choice}, cfg), "'fp8' is not one of: fp32, bf16, sign");
    const std::string huge = write_temp("huge.json", R"({"lr": 1e400})");
    EXPECT_ERROR(parse({"--config", huge}, cfg), huge + ": malformed JSON");
    const std::string to_inf = write_temp("inf.json", R"({"lr": 1e39})");
    EXPECT_ERROR(parse({"--config", to_inf}, cfg), to_inf + ": key 'lr': 1e+39 is out of a float's range");
    const std::string wraps = write_temp("u64.json", R"({"checkpoint_every": 18446744073709551615})");
    EXPECT_ERROR(parse({"--config", wraps}, cfg),
                 wraps + ": key 'checkpoint_every': 18446744073709551615 is out of range");
    const std::string twice = write_temp("dup.json", R"({"steps": 5, "_c": {"steps": 1}, "steps": 3})");
    EXPECT_ERROR(parse({"--config", twice}, cfg), twice + ": key 'steps' appears twice");
    const std::string deep =
        write_temp("deep.json", "{\"_c\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
    EXPECT_ERROR(parse({"--config", deep}, cfg), deep + ": JSON nested deeper than 32 levels");
    const std::string nested_ok = write_temp("nested.json", R"({"_c": {"steps": [1, {"a": 2}]}, "steps": 7})");
    TrainConfig fine;
    EXPECT(parse({"--config", nested_ok}, fine) && fine.steps == 7);  // repeated keys below the top level are fine
}

TEST(optimizer_config_maps_choices) {
    TrainConfig cfg;
    EXPECT(parse({"--demo_values", "sign", "--demo_momentum", "ema", "--decay_groups", "all", "--demo_indices", "packed12",
                  "--demo_delay", "1"}, cfg));
    const OptimizerConfig o = cfg.optim;
    EXPECT_EQ(o.demo.delay, 1);
    EXPECT(o.demo.eager);  // the default
    TrainConfig stale;
    EXPECT(parse({"--demo_delay", "1", "--demo_eager", "false"}, stale));
    EXPECT(!stale.optim.demo.eager);
    TrainConfig other;
    EXPECT_ERROR(parse({"--demo_delay", "2"}, other), "--demo_delay must be 0 or 1 (got 2)");
    EXPECT(o.demo.values == DemoValueEncoding::sign);
    EXPECT(o.demo.momentum == DemoMomentum::ema);
    EXPECT(o.decay_groups == DecayGroups::all);
    EXPECT(o.demo.indices == DemoIndexEncoding::packed12);
}

// strtoll and strtod take leading blanks, a '+' and hex (and strtod inf and nan); a flag's number is a plain decimal.
TEST(numbers_in_flags_are_plain_decimals) {
    for (const auto& [flag, bad] : std::vector<std::pair<std::string, std::string>>{
             {"--steps", " 5"}, {"--steps", "+5"}, {"--steps", "5 "}, {"--steps", "0x10"}, {"--steps", ""},
             {"--steps", "-"}, {"--steps", "5e2"}, {"--seed", "\t7"}, {"--lr", "0x1p-10"}, {"--lr", " 0.1"},
             {"--lr", "+0.1"}, {"--lr", "0.1 "}, {"--lr", "inf"}, {"--lr", "-inf"}, {"--lr", "nan"},
             {"--lr", "infinity"}, {"--lr", "."}, {"--lr", "1e"}, {"--lr", "1e+"}, {"--lr", "e5"}, {"--lr", "1,5"}}) {
        const std::string expected = std::string(flag == "--lr" ? "expected a number" : "expected an integer");
        EXPECT_EQ(parse_error({flag, bad}), flag + ": " + expected + ", got '" + bad + "'");
    }
    TrainConfig cfg;
    EXPECT(parse({"--lr", ".5", "--beta1", "0.", "--eps", "1E-6", "--final_lr_frac", "1e+0", "--steps", "-0",
                  "--warmup_steps", "007", "--steps=12", "--seed", "-3"}, cfg));
    EXPECT_EQ(cfg.lr, 0.5f);
    EXPECT_EQ(cfg.optim.adamw.beta1, 0.0f);
    EXPECT_EQ(cfg.optim.adamw.eps, 1e-6f);
    EXPECT_EQ(cfg.final_lr_frac, 1.0f);
    EXPECT_EQ(cfg.warmup_steps, 7);
    EXPECT_EQ(cfg.steps, 12);
    EXPECT_EQ(cfg.seed, int64_t{-3});
    // out of range stays a range error; below a double's range is not silently 0
    EXPECT_EQ(parse_error({"--steps", "-2147483649"}), "--steps: -2147483649 is out of range");
    EXPECT_EQ(parse_error({"--seed", "9223372036854775808"}), "--seed: 9223372036854775808 is out of range");
    EXPECT_EQ(parse_error({"--lr", "1e400"}), "--lr: 1e400 is out of a float's range");
    EXPECT_EQ(parse_error({"--eps", "1e-400"}), "--eps: 1e-400 is out of a float's range");
    // JSON numbers are JSON's (no '+', hex, inf or nan), and a string is no number
    const std::string text = write_temp("text_number.json", R"({"lr": "0.1"})");
    EXPECT_EQ(parse_error({"--config", text}), text + ": key 'lr': expected a number, got \"0.1\"");
    const std::string plus = write_temp("plus_number.json", R"({"steps": +5})");
    EXPECT_ERROR(parse({"--config", plus}, cfg), plus + ": malformed JSON");
    const std::string nan = write_temp("nan_number.json", R"({"lr": NaN})");
    EXPECT_ERROR(parse({"--config", nan}, cfg), nan + ": malformed JSON");
}

// A range error names the source that set the value last: the file and key, or the flag (not a flag nobody gave).
TEST(range_errors_name_the_source_of_the_value) {
    const std::string lr = write_temp("negative_zero_lr.json", R"({"lr": -0.0})");
    EXPECT_EQ(parse_error({"--config", lr}), lr + ": key 'lr' must be > 0 (got -0)");
    EXPECT_EQ(parse_error({"--config", lr, "--lr", "-1"}), "--lr must be > 0 (got -1)");  // the flag came later
    EXPECT_EQ(parse_error({"--lr", "-1", "--config", lr}), lr + ": key 'lr' must be > 0 (got -0)");
    EXPECT_EQ(parse_error({"--config", lr, "--lr", "0.1", "--config", lr}), lr + ": key 'lr' must be > 0 (got -0)");
    EXPECT_EQ(parse_error({"--config", lr, "--eps", "0"}), lr + ": key 'lr' must be > 0 (got -0)");
    EXPECT_EQ(parse_error({"--config", lr, "--lr", "0.1", "--eps", "0"}), "--eps must be > 0 (got 0)");
    EXPECT_EQ(parse_error({"--steps", "0"}), "--steps must be > 0 (got 0)");

    const auto file_error = [](const std::string& name, const std::string& json) {
        const std::string path = write_temp(name, json);
        return std::make_pair(path, parse_error({"--config", "configs/tiny.json", "--config", path}));
    };
    for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
             {R"({"steps": 0})", "key 'steps' must be > 0 (got 0)"},
             {R"({"threads": -1})", "key 'threads' must be >= 0 (got -1)"},
             {R"({"checkpoint_every": -2})",
              "key 'checkpoint_every' must be >= -1 (got -2; 0: only at the end, -1: never)"},
             {R"({"seq_len": 128})", "key 'seq_len' 128 exceeds max_seq_len 64 (configs/tiny.json)"},
             {R"({"final_lr_frac": 1.5})", "key 'final_lr_frac' must be in [0, 1] (got 1.5)"},
             {R"({"comm_timeout": -0.5})", "key 'comm_timeout' must be >= 0 (got -0.5; seconds, 0 waits forever)"},
             {R"({"demo_delay": 2})", "key 'demo_delay' must be 0 or 1 (got 2)"},
             {R"({"out_dir": ""})", "key 'out_dir' must not be empty"},
             // the optimizer's checks (validate_adamw_options, demo::cm::validate_options)
             {R"({"eps": -1e-9})", "key 'eps' must be > 0 (got -1e-9)"},
             {R"({"beta2": 1})", "key 'beta2' must be in [0, 1) (got 1)"},
             {R"({"weight_decay": -0.001})", "key 'weight_decay' must be >= 0 (got -0.001)"},
             {R"({"optimizer": "demo", "demo_topk": 0})", "key 'demo_topk' must be >= 1 (got 0)"},
             {R"({"optimizer": "demo", "demo_chunk": 5000})", "key 'demo_chunk' must be <= 4096 (got 5000)"},
             {R"({"optimizer": "demo", "demo_decay": 1.0000001})",
              "key 'demo_decay' must be in [0, 1) (got 1.0000001)"},
             {R"({"optimizer": "demo", "demo_alpha": 0})", "key 'demo_alpha' must be in (0, 1] (got 0)"},
             {R"({"optimizer": "demo", "weight_decay": -1e-30})", "key 'weight_decay' must be >= 0 (got -1e-30)"},
         }) {
        const auto [path, error] = file_error("range.json", json);
        EXPECT_EQ(error, path + ": " + message);
    }
    // a check that relates several keys names every source of them
    const std::string heads = write_temp("heads.json", R"({"num_heads": 5})");
    EXPECT_EQ(parse_error({"--config", "configs/tiny.json", "--config", heads}),
              "model config (configs/tiny.json, " + heads + "): channels 64 not divisible by num_heads 5");
    EXPECT_EQ(parse_error({"--num_heads", "5"}),
              "model config (--num_heads): channels 768 not divisible by num_heads 5");
    // and after the world size is known: total_batch_size's divisibility
    const std::string total = write_temp("total.json", R"({"total_batch_size": 100})");
    TrainConfig cfg;
    EXPECT(parse({"--config", total}, cfg));
    EXPECT_ERROR(resolve_batch_geometry(cfg, 1), total + ": key 'total_batch_size' 100 is not a multiple of");
    TrainConfig flagged;
    EXPECT(parse({"--config", total, "--total_batch_size", "300"}, flagged));
    EXPECT_ERROR(resolve_batch_geometry(flagged, 1), "--total_batch_size 300 is not a multiple of");
}

// Floats in messages read back as the value given, not std::to_string's six decimals (-1e-9 was "-0.000000").
TEST(floats_in_errors_are_shown_as_given) {
    EXPECT_EQ(parse_error({"--eps", "-1e-9"}), "--eps must be > 0 (got -1e-9)");
    EXPECT_EQ(parse_error({"--lr", "-6e-4"}), "--lr must be > 0 (got -6e-4)");
    EXPECT_EQ(parse_error({"--beta1", "1.0000001"}), "--beta1 must be in [0, 1) (got 1.0000001)");
    EXPECT_EQ(parse_error({"--weight_decay", "-0.1"}), "--weight_decay must be >= 0 (got -0.1)");
    EXPECT_EQ(parse_error({"--warmup_start_frac", "-1e20"}), "--warmup_start_frac must be in [0, 1] (got -1e20)");
    EXPECT_EQ(parse_error({"--time_limit_minutes", "-5"}), "--time_limit_minutes must be >= 0 (got -5; 0: no limit)");
    EXPECT_EQ(parse_error({"--peak_tflops", "-989.4"}),
              "--peak_tflops must be >= 0 (got -989.4; 0: looked up for a known GPU, else no MFU)");
    EXPECT_EQ(parse_error({"--optimizer", "demo", "--demo_decay", "-0.5"}),
              "--demo_decay must be in [0, 1) (got -0.5)");
}

TEST(choices_take_an_eval_file) {
    EXPECT_EQ(parse_error({"--choices", "hellaswag_val.jsonl"}),
              "--choices 'hellaswag_val.jsonl' is not an llm.c eval file (*.bin); eval_gpt --choices reads JSON Lines, "
              "and --write_eval_file makes one");
    EXPECT_EQ(parse_error({"--choices_examples", "-1"}), "--choices_examples must be >= 0 (got -1)");
}

// An unknown key gets the nearest known one; dashes count as underscores (JSON keys take underscores only).
TEST(unknown_keys_suggest_the_nearest) {
    const std::string dashed = write_temp("dashed.json", R"({"total-batch-size": 512})");
    EXPECT_EQ(parse_error({"--config", dashed}),
              dashed + ": unknown config key 'total-batch-size' (did you mean 'total_batch_size'?)");
    const std::string typo = write_temp("dashed_typo.json", R"({"warmup-start-farc": 0.1})");
    EXPECT_EQ(parse_error({"--config", typo}),
              typo + ": unknown config key 'warmup-start-farc' (did you mean 'warmup_start_frac'?)");
    EXPECT_EQ(parse_error({"--warmup-start-farc", "0.1"}),
              "--warmup-start-farc: unknown flag (did you mean 'warmup_start_frac'?) (see --help)");
    // the flag as typed, also in a value's error
    EXPECT_EQ(parse_error({"--total-batch-size", "x"}).substr(0, 20), "--total-batch-size: ");
    EXPECT_EQ(parse_error({"--warmup-steps", "-1"}), "--warmup-steps must be >= 0 (got -1)");
    EXPECT_EQ(parse_error({"--zzzzzzzzzz", "1"}), "--zzzzzzzzzz: unknown flag (see --help)");
    EXPECT_EQ(parse_error({"--x", "1"}), "--x: unknown flag (see --help)");  // 2 edits from 'lr': no typo of it
    EXPECT_EQ(parse_error({"--lt", "1"}), "--lt: unknown flag (did you mean 'lr'?) (see --help)");
}

// Which steps checkpoint (of 6 steps, 0-based): every N-th and the last; 0 only the last; -1 none.
TEST(checkpoint_cadence) {
    auto checkpoints = [](int every) {
        TrainConfig cfg;
        cfg.steps = 6;
        cfg.checkpoint_every = every;
        std::vector<int> at;
        for (int step = 0; step < cfg.steps; step++)
            if (step_duties(cfg, step).checkpoint) at.push_back(step);
        return at;
    };
    EXPECT(checkpoints(4) == std::vector<int>({3, 5}));
    EXPECT(checkpoints(2) == std::vector<int>({1, 3, 5}));
    EXPECT(checkpoints(0) == std::vector<int>({5}));
    EXPECT(checkpoints(-1).empty());
    TrainConfig cfg;
    EXPECT(parse({"--checkpoint_every", "-1"}, cfg) && cfg.checkpoint_every == -1);
}

TEST(lr_schedule_warmup_and_cosine) {
    // Independent oracle: the formulas written out directly.
    const LrSchedule s{1.0f, 10, 110, 0.1f, 0.1f};
    EXPECT_NEAR(s.at(0), 0.1 + 0.9 * 1 / 10.0, 1e-6);
    EXPECT_NEAR(s.at(9), 1.0, 1e-6);
    EXPECT_NEAR(s.at(10), 1.0, 1e-6);
    EXPECT_NEAR(s.at(109), 0.1, 1e-6);
    const double mid = 0.1 + 0.5 * (1 + std::cos(3.141592653589793 * 50 / 99.0)) * 0.9;
    EXPECT_NEAR(s.at(60), mid, 1e-5);
}

TEST(lr_schedule_shapes) {
    // Independent oracle: each shape's formula written out in double, over every step of a 100-step run with 10
    // steps of warmup from 0.1 and a floor of 0.1.
    const auto expected = [](const std::string& shape, int step, double decay_frac) -> double {
        if (step < 10) return 0.1 + 0.9 * (step + 1) / 10.0;
        const double progress = std::min(1.0, (step - 10) / 89.0);  // 0 after warmup, 1 at step 99
        if (shape == "cosine") return 0.1 + 0.9 * 0.5 * (1 + std::cos(3.141592653589793 * progress));
        if (shape == "linear") return 0.1 + 0.9 * (1 - progress);
        if (shape == "constant") return 1.0;
        const int decay_steps = static_cast<int>(std::lround(decay_frac * 100)), start = 100 - decay_steps;
        return step < start ? 1.0 : 1.0 - 0.9 * (step - start + 1) / static_cast<double>(decay_steps);
    };
    for (const std::string shape : {"cosine", "linear", "wsd", "constant"}) {
        for (const float decay_frac : {0.2f, 0.05f, 0.5f}) {
            TrainConfig cfg;
            EXPECT(parse({"--steps", "100", "--lr", "1", "--warmup_steps", "10", "--warmup_start_frac", "0.1",
                          "--final_lr_frac", "0.1", "--lr_schedule", shape.c_str(), "--lr_decay_frac",
                          std::to_string(decay_frac).c_str()},
                         cfg));
            const LrSchedule s = cfg.schedule();
            double worst = 0.0;
            for (int step = 0; step < 100; step++)
                worst = std::max(worst, std::fabs(s.at(step) - expected(shape, step, decay_frac)));
            if (worst > 1e-5) std::printf("  %s, decay_frac %g: off by %g\n", shape.c_str(), decay_frac, worst);
            EXPECT(worst <= 1e-5);
        }
    }
    // wsd's decay: 20 steps at the default fraction, the first one already below lr, the floor at the last step
    TrainConfig cfg;
    EXPECT(parse({"--steps", "100", "--lr", "1", "--warmup_steps", "0", "--lr_schedule", "wsd"}, cfg));
    const LrSchedule wsd = cfg.schedule();
    EXPECT_EQ(wsd.decay_start(), 80);
    EXPECT_EQ(wsd.at(79), 1.0f);
    EXPECT(wsd.at(80) < 1.0f);
    EXPECT_NEAR(wsd.at(99), 0.1, 1e-6);
    EXPECT(config_warnings(cfg).empty());
    // a decay that would begin during warmup gets a warning
    EXPECT(parse({"--steps", "100", "--warmup_steps", "90", "--lr_schedule", "wsd"}, cfg));
    const std::vector<std::string> warnings = config_warnings(cfg);
    EXPECT(warnings.size() == 1 && warnings[0].find("starts at step 80, before warmup ends at step 90") !=
                                       std::string::npos);
    EXPECT_ERROR(parse({"--lr_schedule", "step"}, cfg),
                 "--lr_schedule: 'step' is not one of: cosine, linear, wsd, constant");
    EXPECT_ERROR(parse({"--lr_decay_frac", "1.5"}, cfg), "lr_decay_frac must be in [0, 1] (got 1.5)");
}

// The schema mechanics on a struct of their own: parts bound by accessor, enum keys by name, a group added to twice
// listed together in the order of its first key, notes in --help, fixed keys marked, and the errors of a key.
namespace {
enum class Shade { light, dark };
struct Inner {
    int depth = 3;
    Shade shade = Shade::dark;
};
struct Outer {
    float scale = 0.5f;
    Inner inner;
    std::string name = "x";
};
}  // namespace

TEST(schema_binds_parts_enums_and_groups) {
    Schema<Outer> schema;
    schema.add("first", std::vector<Key<Outer>>{key("scale", &Outer::scale, "a scale")});
    schema.add("second", +[](Outer& o) -> Inner& { return o.inner; },
               std::vector<Key<Inner>>{key("depth", &Inner::depth, "how deep").fixed()});
    schema.add("first", std::vector<Key<Outer>>{key("name", &Outer::name, "a name", {"x", "y"})});
    schema.add("second", +[](Outer& o) -> Inner& { return o.inner; },
               std::vector<Key<Inner>>{key("shade", &Inner::shade, "which shade",
                                           {{"light", Shade::light}, {"dark", Shade::dark}})
                                           .experimental("untimed")});
    EXPECT(schema.keys() == std::vector<std::string>({"scale", "name", "depth", "shade"}));
    EXPECT(schema.find("depth")->fixed_on_resume && !schema.find("shade")->fixed_on_resume);
    Outer o;
    ConfigSources sources;
    std::vector<const char*> argv = {"--depth", "7", "--shade=light", "--name", "y", "--scale", "2.5e-1"};
    EXPECT(schema.parse_command_line(static_cast<int>(argv.size()), argv.data(), o, sources, "t"));
    EXPECT_EQ(o.inner.depth, 7);
    EXPECT(o.inner.shade == Shade::light);
    EXPECT_EQ(o.name, std::string("y"));
    EXPECT_EQ(o.scale, 0.25f);
    EXPECT_EQ(sources.name("shade"), std::string("--shade"));
    EXPECT_EQ(schema.to_json(o).dump(), std::string(R"({"scale":0.25,"name":"y","depth":7,"shade":"light"})"));
    const std::string help = schema.help("t");
    EXPECT(help.find("\nfirst:\n  --scale") != std::string::npos);
    EXPECT(help.find("  --name                     a name (x, y) [default: \"x\"]\n\nsecond:") != std::string::npos);
    EXPECT(help.find("which shade (light, dark) [default: \"dark\"] [experimental: untimed]") != std::string::npos);
    Outer bad;
    const auto error = [&](std::vector<const char*> args) {
        try {
            schema.parse_command_line(static_cast<int>(args.size()), args.data(), bad, sources, "t");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    EXPECT_EQ(error({"--shade", "grey"}), std::string("--shade: 'grey' is not one of: light, dark"));
    EXPECT_EQ(error({"--depth", "2.5"}), std::string("--depth: expected an integer, got '2.5'"));
    EXPECT_EQ(error({"--dept", "2"}), std::string("--dept: unknown flag (did you mean 'depth'?) (see --help)"));
}

TEST_MAIN()
