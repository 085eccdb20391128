// The metrics' throughput figures: llm.c's flops-per-token estimate against GPT-2 124M's published parameter count,
// the GPU peak table against NVIDIA's datasheet figures, and MFU in the progress line and the JSONL log. (The
// trainers' use of them, tokens/s to model TFLOP/s per rank to MFU, is checked on real runs by
// test/e2e/train_cpu_checks.py and test/emulated/emulated_gpu_checks.py.) And a resume's cut of the log: the lines after the
// resumed step go, a torn last line goes, a bad line before it stays.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/model/param_layout.h"
#include "llmc/run/metrics.h"
#include "test/support/testing.h"

namespace {

TEST(flops_per_token_of_gpt2_124m) {
    const llmc::ParamLayout layout = llmc::ParamLayout::gpt2(llmc::ModelConfig{});  // d12, padded vocab 50304
    // llm.c's train_gpt2 prints num_parameters: 124475904 for this model
    EXPECT_EQ(layout.num_params, size_t{124475904});
    EXPECT_EQ(llmc::model_flops_per_token(layout, 1024), 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
    EXPECT_EQ(llmc::model_flops_per_token(layout, 64), 6.0 * 124475904 + 6.0 * 12 * 768 * 64);
}

TEST(known_peaks_are_the_datasheets_dense_bf16) {
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA H100 80GB HBM3"), 989.4);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA H100 PCIe"), 756.0);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA H200"), 989.4);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA A100 80GB PCIe"), 312.0);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA H100 NVL"), 0.0);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("NVIDIA GeForce RTX 4090"), 0.0);
    EXPECT_EQ(llmc::known_peak_bf16_tflops("CPU (block emulator)"), 0.0);
}

llmc::StepMetrics some_step() {
    llmc::StepMetrics m;
    m.step = 7;
    m.total_steps = 10;
    m.step_seconds = 0.035;
    m.tokens_per_second = 16384 / 0.035;
    m.model_tflops = 375.0;
    return m;
}

TEST(progress_line_shows_mfu_when_known) {
    llmc::StepMetrics m = some_step();
    const std::string without = llmc::format_progress(m);
    EXPECT(without.find("MFU") == std::string::npos);
    EXPECT(without.find("| 468114 tok/s | sent 0 B |") != std::string::npos);
    m.mfu = 375.0 / 989.4;
    const std::string with = llmc::format_progress(m);
    EXPECT(with.find("| 468114 tok/s | MFU 37.9% | sent 0 B |") != std::string::npos);
}

TEST(jsonl_has_model_tflops_and_mfu_when_known) {
    const std::string dir = (std::filesystem::temp_directory_path() / "llmc_test_metrics").string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    {
        llmc::MetricsLog log(dir, -1);
        llmc::StepMetrics m = some_step();
        log.log_step(m);
        m.step = 8;
        m.mfu = 0.25;
        log.log_step(m);
    }
    std::ifstream in(dir + "/metrics.jsonl");
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    const auto a = nlohmann::json::parse(first), b = nlohmann::json::parse(second);
    EXPECT_EQ(a["model_tflops"].get<double>(), 375.0);
    EXPECT(!a.contains("mfu"));
    EXPECT_EQ(b["mfu"].get<double>(), 0.25);
    std::filesystem::remove_all(dir);
}

TEST(resume_cuts_the_log_after_its_step_and_keeps_what_it_cannot_read) {
    const std::string dir = (std::filesystem::temp_directory_path() / "llmc_test_metrics_resume").string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto lines_of = [&] {
        std::ifstream in(dir + "/metrics.jsonl");
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        return lines;
    };
    {
        std::ofstream out(dir + "/metrics.jsonl");
        out << R"({"type":"train","step":1})" "\n" "not json, written by hand\n" R"({"type":"train","step":2})" "\n"
            R"({"type":"val","step":2})" "\n" R"({"type":"train","step":3})" "\n" R"({"type":"train","st)";
    }
    { llmc::MetricsLog log(dir, 2); }
    std::vector<std::string> lines = lines_of();
    EXPECT_EQ(lines.size(), size_t{4});
    EXPECT(lines.size() == 4 && lines[1] == "not json, written by hand" && lines[3] == R"({"type":"val","step":2})");
    {
        std::ofstream out(dir + "/metrics.jsonl", std::ios::app);
        out << R"({"type":"train","st)";  // torn by a crash: the last line
    }
    { llmc::MetricsLog log(dir, 5); }
    EXPECT_EQ(lines_of().size(), size_t{4});
    { llmc::MetricsLog log(dir, -1); }  // a fresh run: a fresh log
    EXPECT_EQ(lines_of().size(), size_t{0});
    std::filesystem::remove_all(dir);
}

}  // namespace

TEST_MAIN()
