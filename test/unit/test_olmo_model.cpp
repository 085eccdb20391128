// The OLMo family's model-layer parts against independent statements of them: the layout against the DeMo
// traffic report's hand-written list of the paper's OLMo tensors and the paper's parameter counts; the mitchell
// init's per-tensor spread, truncation and seeding against its formula; the model file's architecture header
// (what it writes, each corrupted field refused naming it, a family mismatch naming both shapes, a GPT-2 file
// still llm.c's version 3); RoPE's table against the rotation angles written out directly. The forward and
// backward are checked against PyTorch by test_olmo_vs_torch.sh and by finite differences in test_model_io.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/base/rope_table.h"
#include "llmc/model/cpu_layers.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/optim/demo/traffic_report.h"
#include "test/support/testing.h"

namespace {

llmc::ModelConfig paper_config(int channels, int heads) {
    llmc::ModelConfig c;
    c.arch = llmc::ModelArch::olmo;
    c.num_layers = 16;
    c.num_heads = heads;
    c.channels = channels;
    c.max_seq_len = 2048;
    c.vocab_size = 50280;
    c.padded_vocab_size = 50304;
    return c;
}

llmc::ModelConfig small_olmo(llmc::NormKind norm = llmc::NormKind::layernorm) {
    llmc::ModelConfig c;
    c.arch = llmc::ModelArch::olmo;
    c.norm = norm;
    c.num_layers = 3;
    c.num_heads = 4;
    c.channels = 64;
    c.max_seq_len = 32;
    c.vocab_size = 1000;
    c.padded_vocab_size = 1024;
    return c;
}

std::string scratch_file(const std::string& name) {
    static const std::string dir = [] {
        char pattern[] = "/tmp/llmc_test_olmo_XXXXXX";
        if (mkdtemp(pattern) == nullptr) std::exit(1);
        return std::string(pattern);
    }();
    return dir + "/" + name;
}

std::vector<std::byte> read_bytes(const std::string& path) { return llmc::read_whole_file(path); }
void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
    llmc::File f(path, "wb");
    f.write_all(bytes.data(), bytes.size());
    f.close();
}
int32_t header_int(const std::vector<std::byte>& bytes, int i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
}

}  // namespace

TEST(paper_layouts_have_the_papers_tensors_and_counts) {
    for (const auto& [which, channels, heads, params] :
         {std::tuple{"300m", 1024, 8, size_t{319946752}}, std::tuple{"1b", 2048, 16, size_t{1176764416}}}) {
        const llmc::ParamLayout layout = llmc::ParamLayout::of(paper_config(channels, heads));
        EXPECT_EQ(layout.num_params, params);
        // the same multiset of shapes as the traffic report's list (which goes block by block, ours kind by kind)
        std::map<std::vector<size_t>, int> ours, paper;
        for (const llmc::ParamTensor& t : layout.tensors) ours[t.shape]++;
        for (const demo::NamedShape& s : demo::olmo_paper_shapes(which)) paper[s.shape]++;
        EXPECT(ours == paper);
        EXPECT_EQ(layout.tensors.size(), size_t(1 + 4 * 16));  // no norms, no biases, no wpe
        EXPECT_EQ(layout.find("transformer.blocks.3.ff_proj.weight").shape, (std::vector<size_t>{8u * channels, size_t(channels)}));
        EXPECT_EQ(layout.find("transformer.blocks.15.ff_out.weight").shape, (std::vector<size_t>{size_t(channels), 4u * channels}));
    }
    // RMSNorm adds a weight per norm: two per block and the final one
    llmc::ModelConfig rms = paper_config(1024, 8);
    rms.norm = llmc::NormKind::rmsnorm;
    EXPECT_EQ(llmc::ParamLayout::of(rms).num_params, size_t{319946752} + (2 * 16 + 1) * 1024);
    EXPECT_EQ(llmc::ParamLayout::of(rms).find("transformer.blocks.0.attn_norm.weight").numel, size_t(1024));
}

TEST(bad_olmo_shapes_are_refused) {
    llmc::ModelConfig odd_head = small_olmo();
    odd_head.num_heads = 64;  // head size 1
    EXPECT_ERROR(llmc::validate_model_config(odd_head, "x"), "x: RoPE needs an even head size");
    llmc::ModelConfig bad_theta = small_olmo();
    bad_theta.rope_theta = 0.5f;
    EXPECT_ERROR(llmc::validate_model_config(bad_theta, "x"), "x: rope_theta must be");
    llmc::ModelConfig gpt2_rms;
    gpt2_rms.norm = llmc::NormKind::rmsnorm;
    EXPECT_ERROR(llmc::validate_model_config(gpt2_rms, "x"), "x: norm rmsnorm is an olmo option");
}

// Truncating a normal at +-3 sigma leaves a spread of sigma * sqrt(1 - 6 phi(3) / (2 Phi(3) - 1)) = 0.98658 sigma.
TEST(mitchell_init_follows_its_formula) {
    const llmc::ModelConfig config = small_olmo(llmc::NormKind::rmsnorm);
    llmc::ModelCpu a(config), b(config);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    a.init_random(3);
    omp_set_num_threads(std::max(2, threads));
    b.init_random(3);
    omp_set_num_threads(threads);
    EXPECT(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()) == 0);
    const double C = config.channels;
    for (const llmc::ParamTensor& t : a.layout().tensors) {
        const float* w = a.params().data() + t.offset;
        if (!t.is_matrix()) {
            EXPECT(std::all_of(w, w + t.numel, [](float v) { return v == 1.0f; }));
            continue;
        }
        double sigma = 1.0 / std::sqrt(C);
        if (t.name.ends_with("attn_out.weight")) sigma = 1.0 / std::sqrt(2.0 * C * (t.layer + 1));
        if (t.name.ends_with("ff_out.weight")) sigma = 1.0 / std::sqrt(2.0 * 4 * C * (t.layer + 1));
        const size_t n = t.kind == llmc::ParamKind::wte ? size_t(config.vocab_size) * config.channels : t.numel;
        double sum_sq = 0.0, largest = 0.0;
        for (size_t i = 0; i < n; i++) {
            sum_sq += double(w[i]) * w[i];
            largest = std::max(largest, std::fabs(double(w[i])));
        }
        const double spread = std::sqrt(sum_sq / n);
        if (std::fabs(spread / (0.98658 * sigma) - 1.0) > 0.03)
            testing::report_failure(__FILE__, __LINE__, t.name + ": spread " + std::to_string(spread) +
                                                            " for sigma " + std::to_string(sigma));
        EXPECT(largest <= 3.0 * sigma * (1 + 1e-6) && largest > 2.5 * sigma);
        if (t.kind == llmc::ParamKind::wte)
            EXPECT(std::all_of(w + n, w + t.numel, [](float v) { return v == 0.0f; }));
    }
}

TEST(model_files_record_the_architecture) {
    for (const llmc::NormKind norm : {llmc::NormKind::layernorm, llmc::NormKind::rmsnorm}) {
        llmc::ModelConfig config = small_olmo(norm);
        config.rope_theta = 500000.0f;
        llmc::ModelCpu model(config);
        model.init_random(1);
        const std::string path = scratch_file(std::string("olmo_") + llmc::norm_name(norm) + ".bin");
        llmc::save_model(path, config, model.params());
        const std::vector<std::byte> bytes = read_bytes(path);
        EXPECT_EQ(bytes.size(), 1024 + 4 * model.layout().num_params);
        EXPECT_EQ(header_int(bytes, 0), 20240326);
        EXPECT_EQ(header_int(bytes, 1), 6);
        const int32_t norm_code = norm == llmc::NormKind::rmsnorm ? 3 : 2;
        const std::vector<int32_t> arch = {2, norm_code, 2, 2, 0, 1, 0, 8 * config.channels};
        for (int f = 0; f < 8; f++)
            if (f != 4) EXPECT_EQ(header_int(bytes, 8 + f), arch[size_t(f)]);
        float theta;
        std::memcpy(&theta, bytes.data() + 4 * 12, 4);
        EXPECT_EQ(theta, 500000.0f);
        EXPECT(llmc::read_model_config(path) == config);
        std::vector<float> loaded(model.layout().num_params);
        llmc::load_model(path, config, loaded);
        EXPECT(std::memcmp(loaded.data(), model.params().data(), model.params().size_bytes()) == 0);

        // every architecture field corrupted is refused, naming it
        const char* names[] = {"family", "norm", "activation", "positions", "rope theta", "tied embedding", "biases",
                               "MLP rows"};
        for (int f = 0; f < 8; f++) {
            std::vector<std::byte> bad = bytes;
            const int32_t wrong = f == 0 ? 7 : f == 1 ? 9 : f == 4 ? -1 : header_int(bytes, 8 + f) + 5;
            std::memcpy(bad.data() + 4 * (8 + f), &wrong, 4);
            const std::string bad_path = scratch_file("bad_field.bin");
            write_bytes(bad_path, bad);
            EXPECT_ERROR(llmc::read_model_config(bad_path),
                         f == 0 ? bad_path + ": unknown model family 7"
                         : f == 1 || f == 4 ? bad_path + ":"
                                            : bad_path + ": header field " + std::to_string(8 + f) + " (" + names[f] + ")");
        }
        // a file of one family for a config of the other: one line naming the file and both shapes
        llmc::ModelConfig gpt2 = config;
        gpt2.arch = llmc::ModelArch::gpt2;
        gpt2.norm = llmc::NormKind::layernorm;
        std::vector<float> gpt2_params(llmc::ParamLayout::of(gpt2).num_params);
        EXPECT_ERROR(llmc::load_model(path, gpt2, gpt2_params),
                     path + ": checkpoint shape " + config.describe() + " disagrees with config " + gpt2.describe());
        llmc::ModelCpu gpt2_model(gpt2);
        const std::string gpt2_path = scratch_file("gpt2.bin");
        llmc::save_model(gpt2_path, gpt2, gpt2_model.params());
        EXPECT_EQ(header_int(read_bytes(gpt2_path), 1), 3);  // llm.c's version, no architecture fields
        EXPECT_EQ(header_int(read_bytes(gpt2_path), 8), 0);
        EXPECT_ERROR(llmc::load_model(gpt2_path, config, loaded),
                     gpt2_path + ": checkpoint shape " + gpt2.describe() + " disagrees with config " + config.describe());
    }
}

TEST(rope_table_holds_the_rotation_angles) {
    const size_t T = 50, hs = 24;
    const double theta = 10000.0;
    const std::vector<float> table = llmc::rope_table(int(T), int(hs), theta);
    EXPECT_EQ(table.size(), T * hs);
    double worst = 0.0;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < hs / 2; i++) {
            const double angle = double(t) / std::pow(theta, double(2 * i) / double(hs));
            worst = std::max({worst, std::fabs(table[(t * hs / 2 + i) * 2] - std::cos(angle)),
                              std::fabs(table[(t * hs / 2 + i) * 2 + 1] - std::sin(angle))});
        }
    EXPECT(worst <= 6e-8);  // one float rounding of values in [-1, 1]
    // A rotation keeps lengths and its transpose undoes it: forward then backward on the same buffer.
    const size_t C = 2 * hs, H = 2;
    std::vector<float> qkv(T * 3 * C);
    for (size_t i = 0; i < qkv.size(); i++) qkv[i] = float(std::sin(0.37 * double(i)));
    const std::vector<float> original = qkv;
    llmc::cpu::rope_forward(qkv.data(), table.data(), 1, T, C, H);
    EXPECT(std::equal(qkv.begin() + 2 * C, qkv.begin() + 3 * C, original.begin() + 2 * C));  // v untouched
    EXPECT(std::equal(qkv.begin(), qkv.begin() + 3 * C, original.begin()));  // position 0 does not rotate
    EXPECT(!std::equal(qkv.begin() + 3 * C, qkv.begin() + 4 * C, original.begin() + 3 * C));
    llmc::cpu::rope_backward(qkv.data(), table.data(), 1, T, C, H);
    double round_trip = 0.0;
    for (size_t i = 0; i < qkv.size(); i++) round_trip = std::max(round_trip, double(std::fabs(qkv[i] - original[i])));
    EXPECT(round_trip <= 1e-6);
}

TEST_MAIN()
