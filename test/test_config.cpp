// Config schema tests: JSON files and flags set the same keys, later sources win, help documents exactly the
// parser's keys, and every kind of bad input gets a one-line error naming the flag or file and key.
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/schedule.h"
#include "llmc/train_common.h"
#include "test/testing.h"

using namespace llmc;

static bool parse(std::vector<std::string> args, TrainConfig& cfg) {
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return parse_command_line(static_cast<int>(argv.size()), argv.data(), cfg, "test");
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
    for (const char* f : {"configs/tiny.json", "configs/small.json", "configs/d12.json", "configs/paper_300m_shape.json",
                          "configs/paper_1b_shape.json"}) {
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
    EXPECT_ERROR(parse({"--optimizer", "sgd"}, cfg), "--optimizer: 'sgd' is not one of: adamw, demo");
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
    const OptimizerConfig o = cfg.optimizer_config();
    EXPECT_EQ(o.demo.delay, 1);
    EXPECT(o.demo.eager);  // the default
    TrainConfig stale;
    EXPECT(parse({"--demo_delay", "1", "--demo_eager", "false"}, stale));
    EXPECT(!stale.optimizer_config().demo.eager);
    TrainConfig other;
    EXPECT_ERROR(parse({"--demo_delay", "2"}, other), "--demo_delay must be 0 or 1, got 2");
    EXPECT(o.demo.values == DemoValueEncoding::sign);
    EXPECT(o.demo.momentum == DemoMomentum::ema);
    EXPECT(o.decay_groups == DecayGroups::all);
    EXPECT(o.demo.indices == DemoIndexEncoding::packed12);
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

TEST_MAIN()
