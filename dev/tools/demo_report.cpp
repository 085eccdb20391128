// demo_report: bytes per step per rank of AdamW-DDP versus DeMo (reference wire format and ours) for a GPT-2
// shape or the DeMo paper's OLMo models.
//
//   build/demo_report --paper 300m|1b [--world 64] [--chunk 64]
//   build/demo_report --config model.json     (keys num_layers, num_heads, channels, max_seq_len,
//                                             vocab_size, padded_vocab_size)
//   build/demo_report [--layers 12 --heads 12 --channels 768 --vocab 50257 --padded-vocab 50304
//                      --max-seq-len 1024]    (GPT-2 d12 by default)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "llmc/optim/demo/traffic_report.h"
#include "llmc/base/error.h"
#include "llmc/model/param_layout.h"

namespace {

int parse_int(const std::string& flag, const std::string& value) {
    size_t used = 0;
    int v = 0;
    try {
        v = std::stoi(value, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    LLMC_CHECK(used == value.size() && !value.empty(), flag + " expects an integer, got '" + value + "'");
    return v;
}

llmc::ModelConfig read_config(const std::string& path) {
    std::ifstream in(path);
    LLMC_CHECK(in.good(), path + ": cannot open");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        llmc::fail(path + ": not valid JSON (" + e.what() + ")");
    }
    llmc::ModelConfig c;
    auto get = [&](const char* key, int& field) {
        if (!j.contains(key)) return;
        LLMC_CHECK(j[key].is_number_integer(), path + ": '" + key + "' must be an integer");
        field = j[key].get<int>();
    };
    get("num_layers", c.num_layers);
    get("num_heads", c.num_heads);
    get("channels", c.channels);
    get("max_seq_len", c.max_seq_len);
    get("vocab_size", c.vocab_size);
    get("padded_vocab_size", c.padded_vocab_size);
    return c;
}

int run(int argc, char** argv) {
    llmc::ModelConfig model;  // GPT-2 d12 defaults
    demo::TrafficOptions options;
    std::string paper, config_path;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            std::printf("usage: demo_report [--paper 300m|1b | --config FILE.json | --layers N --heads N "
                        "--channels N --vocab N --padded-vocab N --max-seq-len N] [--world N] [--chunk N]\n");
            return 0;
        }
        LLMC_CHECK(i + 1 < argc, flag + " needs a value");
        const std::string value = argv[++i];
        if (flag == "--paper") paper = value;
        else if (flag == "--config") config_path = value;
        else if (flag == "--layers") model.num_layers = parse_int(flag, value);
        else if (flag == "--heads") model.num_heads = parse_int(flag, value);
        else if (flag == "--channels") model.channels = parse_int(flag, value);
        else if (flag == "--vocab") model.vocab_size = parse_int(flag, value);
        else if (flag == "--padded-vocab") model.padded_vocab_size = parse_int(flag, value);
        else if (flag == "--max-seq-len") model.max_seq_len = parse_int(flag, value);
        else if (flag == "--world") options.world_size = parse_int(flag, value);
        else if (flag == "--chunk") options.chunk = parse_int(flag, value);
        else llmc::fail("unknown option " + flag + " (see --help)");
    }
    LLMC_CHECK(paper.empty() || config_path.empty(), "--paper and --config exclude each other");
    if (!paper.empty()) {
        const std::string d = paper == "1b" ? "2048" : "1024";
        demo::print_traffic_report(std::cout, "paper " + paper + " (OLMo: d_model " + d +
                                                  ", 16 layers, fused QKV, SwiGLU, no biases, tied embedding)",
                                   demo::olmo_paper_shapes(paper), options);
        return 0;
    }
    if (!config_path.empty()) model = read_config(config_path);
    llmc::validate_model_config(model, config_path.empty() ? "model flags" : config_path);
    demo::print_traffic_report(std::cout, model.describe(), demo::model_shapes(model), options);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
