// Tests of llm.c model checkpoint I/O (bit-exact fp32 round trip, bf16 loading, and rejection of wrong
// magic, version, truncation, trailing bytes and shape mismatch, each naming the file) and of the ModelCpu
// behaviour that needs no reference files: GPT-2 init, input validation, determinism, gradient accumulation,
// the backward's reports of final gradients (with the early wte rows of the overlapped all-reduce) and a
// finite-difference gradient check. The comparison with PyTorch is test_gpt2_vs_torch.
#include <omp.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/model/model_cpu.h"
#include "llmc/model/model_io.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"
#include "test/support/tiny_models.h"

namespace {

using testing::every_family;
using testing::tiny_config;

// A fresh directory for this test process, removed at exit.
struct ScratchDir {
    std::string path;
    ScratchDir() {
        char pattern[] = "/tmp/llmc_test_model_io_XXXXXX";
        if (mkdtemp(pattern) == nullptr) {
            std::perror("mkdtemp");
            std::exit(1);
        }
        path = pattern;
    }
    ~ScratchDir() { std::filesystem::remove_all(path); }
} scratch_dir;

std::string scratch_file(const std::string& name) { return scratch_dir.path + "/" + name; }

std::vector<std::byte> read_bytes(const std::string& path) { return llmc::read_whole_file(path); }
void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
    llmc::File f(path, "wb");
    f.write_all(bytes.data(), bytes.size());
    f.close();
}

std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
    llmc::Rng rng(seed);
    std::vector<int> tokens(n);
    for (int& t : tokens) t = static_cast<int>(rng.below(vocab));
    return tokens;
}

}  // namespace

TEST(save_load_round_trip_is_bit_exact) {
  for (const llmc::ModelConfig& config : every_family()) {
    llmc::ModelCpu model(config);
    model.init_random(7);
    const std::string path = scratch_file("roundtrip.bin");
    const llmc::FileDigest saved = llmc::save_model(path, config, model.params());
    EXPECT_EQ(read_bytes(path).size(), 1024 + 4 * model.layout().num_params);
    EXPECT(!llmc::file_exists(path + ".tmp"));
    EXPECT(llmc::read_model_config(path) == config);
    std::vector<float> loaded(model.layout().num_params, -1.0f);
    llmc::FileDigest digest;
    llmc::load_model(path, config, loaded, &digest);
    EXPECT(std::memcmp(loaded.data(), model.params().data(), loaded.size() * sizeof(float)) == 0);
    // the digests hashed while writing and while reading are the file's (a resume checks the second)
    EXPECT(saved == llmc::digest_file(path));
    EXPECT(digest == llmc::digest_file(path));
  }
}

TEST(load_reads_bf16_files) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu model(config);
    model.init_random(8);
    const std::string fp32_path = scratch_file("for_bf16.bin"), bf16_path = scratch_file("bf16.bin");
    llmc::save_model(fp32_path, config, model.params());
    // Build the version-5 file by hand: same header with version 5, parameters as their top 16 bits.
    std::vector<std::byte> bytes = read_bytes(fp32_path);
    const int32_t version = 5;
    std::memcpy(bytes.data() + 4, &version, 4);
    std::vector<std::byte> out(bytes.begin(), bytes.begin() + 1024);
    std::vector<float> expected(model.layout().num_params);
    for (size_t i = 0; i < expected.size(); i++) {
        uint32_t bits;
        std::memcpy(&bits, &model.params()[i], 4);
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        const auto* p = reinterpret_cast<const std::byte*>(&top);
        out.insert(out.end(), p, p + 2);
        const uint32_t widened = static_cast<uint32_t>(top) << 16;
        std::memcpy(&expected[i], &widened, 4);
    }
    write_bytes(bf16_path, out);
    std::vector<float> loaded(expected.size());
    llmc::FileDigest digest;
    llmc::load_model(bf16_path, config, loaded, &digest);
    EXPECT(std::memcmp(loaded.data(), expected.data(), loaded.size() * sizeof(float)) == 0);
    EXPECT(digest == llmc::digest_bytes(out));
}

TEST(load_rejects_wrong_magic_and_version) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu model(config);
    const std::string good = scratch_file("good.bin");
    llmc::save_model(good, config, model.params());
    std::vector<std::byte> bytes = read_bytes(good);

    const std::string bad_magic = scratch_file("bad_magic.bin");
    std::vector<std::byte> copy = bytes;
    const int32_t token_shard_magic = 20240520;
    std::memcpy(copy.data(), &token_shard_magic, 4);
    write_bytes(bad_magic, copy);
    EXPECT_ERROR(llmc::read_model_config(bad_magic), bad_magic + ": bad magic 20240520");
    std::vector<float> params(model.layout().num_params);
    EXPECT_ERROR(llmc::load_model(bad_magic, config, params), bad_magic + ": bad magic");

    const std::string bad_version = scratch_file("bad_version.bin");
    copy = bytes;
    const int32_t version = 4;
    std::memcpy(copy.data() + 4, &version, 4);
    write_bytes(bad_version, copy);
    EXPECT_ERROR(llmc::read_model_config(bad_version), bad_version + ": unsupported model file version 4");

    EXPECT_ERROR(llmc::read_model_config(scratch_file("missing.bin")), scratch_file("missing.bin") + ": cannot open");
}

TEST(load_rejects_truncated_and_oversized_files) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu model(config);
    const std::string good = scratch_file("good2.bin");
    llmc::save_model(good, config, model.params());
    const std::vector<std::byte> bytes = read_bytes(good);
    std::vector<float> params(model.layout().num_params);

    const std::string short_params = scratch_file("short_params.bin");
    write_bytes(short_params, std::vector<std::byte>(bytes.begin(), bytes.end() - 4));
    EXPECT_ERROR(llmc::read_model_config(short_params), short_params + ": truncated");
    EXPECT_ERROR(llmc::load_model(short_params, config, params), short_params + ": truncated");

    const std::string short_header = scratch_file("short_header.bin");
    write_bytes(short_header, std::vector<std::byte>(bytes.begin(), bytes.begin() + 100));
    EXPECT_ERROR(llmc::read_model_config(short_header), short_header + ": truncated");

    const std::string trailing = scratch_file("trailing.bin");
    std::vector<std::byte> longer = bytes;
    longer.resize(bytes.size() + 8);
    write_bytes(trailing, longer);
    EXPECT_ERROR(llmc::read_model_config(trailing), trailing + ": 8 unexpected trailing bytes");

    // A corrupt header asking for a huge shape is a size mismatch, and an absurd one is over the shape limits: neither
    // an overflow nor a huge allocation.
    const std::string huge_file = scratch_file("huge.bin"), absurd = scratch_file("absurd.bin");
    std::vector<std::byte> corrupt = bytes;
    const int32_t most_layers = llmc::kMaxLayers, absurd_layers = 2147483647;
    std::memcpy(corrupt.data() + 4 * 4, &most_layers, 4);  // num_layers
    write_bytes(huge_file, corrupt);
    EXPECT_ERROR(llmc::read_model_config(huge_file), huge_file + ": truncated");
    std::memcpy(corrupt.data() + 4 * 4, &absurd_layers, 4);
    write_bytes(absurd, corrupt);
    EXPECT_ERROR(llmc::read_model_config(absurd), absurd + ": num_layers 2147483647 is over 4096");
}

TEST(load_rejects_shape_mismatch) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu model(config);
    const std::string path = scratch_file("shape.bin");
    llmc::save_model(path, config, model.params());
    llmc::ModelConfig other = config;
    other.num_layers = 3;
    std::vector<float> params(llmc::ParamLayout::gpt2(other).num_params);
    EXPECT_ERROR(llmc::load_model(path, other, params),
                 path + ": checkpoint shape gpt2 L=2 H=4 C=32 T=16 V=100 Vp=128 disagrees with config gpt2 L=3");
    std::vector<float> too_small(10);
    EXPECT_ERROR(llmc::load_model(path, config, too_small), path + ": parameter buffer holds 10 floats");
    EXPECT_ERROR(llmc::save_model(scratch_file("bad_save.bin"), config, too_small),
                 scratch_file("bad_save.bin") + ": cannot save 10 floats");
}

TEST(init_random_follows_gpt2_and_ignores_thread_count) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu a(config), b(config);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    a.init_random(3);
    omp_set_num_threads(std::max(2, threads));
    b.init_random(3);
    omp_set_num_threads(threads);
    EXPECT(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()) == 0);

    const llmc::ParamLayout& layout = a.layout();
    auto stddev = [&](const llmc::ParamTensor& t, size_t count) {
        double s = 0.0;
        for (size_t i = 0; i < count; i++) s += double(a.params()[t.offset + i]) * a.params()[t.offset + i];
        return std::sqrt(s / count);
    };
    const llmc::ParamTensor& wte = layout.find("wte.weight");
    const size_t real_rows = size_t(config.vocab_size) * config.channels;
    EXPECT_NEAR(stddev(wte, real_rows), 0.02, 0.002);
    bool padded_zero = true;
    for (size_t i = real_rows; i < wte.numel; i++) padded_zero &= a.params()[wte.offset + i] == 0.0f;
    EXPECT(padded_zero);
    const llmc::ParamTensor& fc = layout.find("h.1.mlp.c_fc.weight");
    EXPECT_NEAR(stddev(fc, fc.numel), 0.02, 0.001);
    const llmc::ParamTensor& proj = layout.find("h.0.mlp.c_proj.weight");
    EXPECT_NEAR(stddev(proj, proj.numel), 0.02 / std::sqrt(4.0), 0.0005);
    EXPECT_EQ(a.params()[layout.find("h.1.ln_2.weight").offset], 1.0f);
    EXPECT_EQ(a.params()[layout.find("ln_f.bias").offset], 0.0f);
    EXPECT_EQ(a.params()[layout.find("h.0.attn.c_attn.bias").offset], 0.0f);
    llmc::ModelCpu c(config);
    c.init_random(4);
    EXPECT(std::memcmp(a.params().data(), c.params().data(), a.params().size_bytes()) != 0);
}

TEST(forward_rejects_bad_tokens_and_shapes) {
    const llmc::ModelConfig config = tiny_config();
    llmc::ModelCpu model(config);
    model.init_random(1);
    std::vector<int> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, 5};
    EXPECT(model.forward(tokens.data(), targets.data(), 1, 4) > 0.0f);
    tokens[2] = config.vocab_size;  // a padded-vocabulary id is still invalid input
    EXPECT_ERROR(model.forward(tokens.data(), targets.data(), 1, 4), "input token id 100 at position 2 is outside");
    tokens[2] = -1;
    EXPECT_ERROR(model.forward(tokens.data(), nullptr, 1, 4), "input token id -1");
    tokens[2] = 3;
    targets[3] = 50000;
    EXPECT_ERROR(model.forward(tokens.data(), targets.data(), 1, 4), "target token id 50000 at position 3");
    std::vector<int> long_tokens(2 * 17, 0);
    EXPECT_ERROR(model.forward(long_tokens.data(), nullptr, 2, 17), "T=17 exceeds the model's max_seq_len 16");
    EXPECT_ERROR(model.forward(tokens.data(), nullptr, 0, 4), "must be positive");
    // no targets: no loss, and nothing to differentiate
    EXPECT_EQ(model.forward(tokens.data(), nullptr, 1, 4), 0.0f);
    EXPECT_ERROR(model.backward(), "needs a preceding forward() with targets");
    EXPECT_EQ(model.logits().size(), size_t(4 * config.padded_vocab_size));
}

TEST(forward_backward_are_deterministic_and_accumulate) {
  for (const llmc::ModelConfig& config : every_family()) {
    const int B = 3, T = 16;
    const std::vector<int> tokens = random_tokens(B * T + 1, config.vocab_size, 11);
    llmc::ModelCpu model(config);
    model.init_random(5);

    model.zero_grad();
    const float loss1 = model.forward(tokens.data(), tokens.data() + 1, B, T);
    const std::vector<float> logits1(model.logits().begin(), model.logits().end());
    model.backward();
    const std::vector<float> grads1(model.grads().begin(), model.grads().end());

    // A different shape in between must not leave anything behind.
    model.forward(tokens.data(), tokens.data() + 1, 2, 5);

    model.zero_grad();
    const float loss2 = model.forward(tokens.data(), tokens.data() + 1, B, T);
    model.backward();
    EXPECT_EQ(loss1, loss2);
    EXPECT(std::equal(logits1.begin(), logits1.end(), model.logits().begin()));
    EXPECT(std::memcmp(grads1.data(), model.grads().data(), grads1.size() * sizeof(float)) == 0);

    // Two half-weighted backward passes add up to one full pass. Not bit for bit: a gradient that several
    // rows add to (embeddings) is summed onto a non-zero buffer the second time, in another order.
    model.zero_grad();
    model.forward(tokens.data(), tokens.data() + 1, B, T);
    model.backward(0.5f);
    model.backward(0.5f);
    double max_diff = 0.0, max_grad = 0.0;
    for (size_t i = 0; i < grads1.size(); i++) {
        max_diff = std::max(max_diff, double(std::fabs(grads1[i] - model.grads()[i])));
        max_grad = std::max(max_grad, double(std::fabs(grads1[i])));
    }
    EXPECT(max_grad > 0.0 && max_diff <= 1e-6 * max_grad);

    // Padded logits are computed (zero rows give zero logits) but the padded rows get no gradient.
    const llmc::ParamTensor& wte = model.layout().tensors.front();
    EXPECT(wte.kind == llmc::ParamKind::wte);
    bool padded_grads_zero = true;
    for (size_t i = size_t(config.vocab_size) * config.channels; i < wte.numel; i++)
        padded_grads_zero &= model.grads()[wte.offset + i] == 0.0f;
    EXPECT(padded_grads_zero);
  }
}

// The backward's reports of final gradients (what AdamW-DDP starts all-reducing during the backward): every
// parameter exactly once, the early wte rows first when it is handed some, layers from last to first and then
// the embeddings, and nothing the backward writes after a report: the reported ranges hold at report time what
// they hold once the backward is done. A second (accumulating) backward reports too, with the same contract; the
// gradients equal a backward without reports. The early rows: none; the rows neither this batch's inputs nor
// another "rank's" touch; the two longest such runs.
TEST(backward_reports_each_gradient_once_when_final) {
  for (const llmc::ModelConfig& config : every_family()) {
    const int B = 2, T = 16;
    const std::vector<int> tokens = random_tokens(B * T + 1, config.vocab_size, 13);
    const std::vector<int> other_rank_tokens = random_tokens(B * T, config.vocab_size, 14);
    llmc::ModelCpu model(config), plain(config);
    const llmc::ParamLayout& layout = model.layout();
    std::vector<uint64_t> touched = llmc::token_row_bitmap(std::span(tokens).first(B * T), config.padded_vocab_size);
    const std::vector<uint64_t> other = llmc::token_row_bitmap(other_rank_tokens, config.padded_vocab_size);
    for (size_t w = 0; w < touched.size(); w++) touched[w] |= other[w];
    const std::vector<std::vector<llmc::ParamRange>> early_choices = {
        {}, layout.untouched_wte_rows(touched, SIZE_MAX), layout.untouched_wte_rows(touched, 2)};
    EXPECT(early_choices[1].size() > 2 && early_choices[2].size() == 2);
    for (const std::vector<llmc::ParamRange>& early : early_choices) {
        model.init_random(6);
        plain.init_random(6);
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 0) model.zero_grad(), plain.zero_grad();
            model.forward(tokens.data(), tokens.data() + 1, B, T);
            plain.forward(tokens.data(), tokens.data() + 1, B, T);
            std::vector<int> reports(layout.num_params, 0);
            std::vector<std::pair<llmc::ParamRange, std::vector<float>>> snapshots;
            std::vector<std::vector<llmc::ParamRange>> calls;
            model.backward(
                0.5f,
                [&](std::span<const llmc::ParamRange> ranges) {
                    calls.emplace_back(ranges.begin(), ranges.end());
                    for (const llmc::ParamRange& r : ranges) {
                        for (size_t i = r.offset; i < r.offset + r.numel; i++) reports[i]++;
                        const auto g = model.grads().subspan(r.offset, r.numel);
                        snapshots.push_back({r, std::vector<float>(g.begin(), g.end())});
                    }
                },
                early);
            plain.backward(0.5f);
            EXPECT(std::all_of(reports.begin(), reports.end(), [](int n) { return n == 1; }));
            // one report for the early rows (if any), one per layer, one for the embeddings
            const size_t first_layer = early.empty() ? 0 : 1;
            EXPECT_EQ(calls.size(), first_layer + size_t(config.num_layers + 1));
            if (!early.empty()) {
                EXPECT_EQ(calls[0].size(), early.size());
                for (size_t i = 0; i < early.size() && i < calls[0].size(); i++)
                    EXPECT(calls[0][i].offset == early[i].offset && calls[0][i].numel == early[i].numel);
            }
            // each layer's last range is its MLP output projection's last tensor, layer L-1 first, down to layer
            // 0; then wpe (GPT-2) or wte's rows (OLMo)
            const bool gpt2 = config.arch == llmc::ModelArch::gpt2;
            for (int l = 0; l < config.num_layers && calls.size() == first_layer + config.num_layers + 1; l++) {
                const std::string last = gpt2 ? "h." + std::to_string(l) + ".mlp.c_proj.bias"
                                              : "transformer.blocks." + std::to_string(l) + ".ff_out.weight";
                EXPECT_EQ(calls[first_layer + size_t(config.num_layers - 1 - l)].back().offset,
                          layout.find(last).offset);
            }
            if (gpt2)
                EXPECT_EQ(calls.back().back().offset, layout.find("wpe.weight").offset);
            else  // no wpe: the embeddings' report is wte's rows alone
                EXPECT(calls.back().back().offset + calls.back().back().numel <= layout.tensors.front().numel);
            size_t changed = 0;
            for (const auto& [r, values] : snapshots)
                for (size_t i = 0; i < r.numel; i++) changed += values[i] != model.grads()[r.offset + i];
            EXPECT_EQ(changed, size_t{0});
            EXPECT(std::memcmp(plain.grads().data(), model.grads().data(), layout.num_params * sizeof(float)) == 0);
        }
    }
    // Early rows the batch's inputs touch are refused before anything is reported.
    model.forward(tokens.data(), tokens.data() + 1, B, T);
    const size_t wte = layout.tensors.front().offset, C = config.channels;
    const std::vector<llmc::ParamRange> wrong = {{wte + size_t(tokens[5]) * C, C}};
    bool reported = false;
    EXPECT_ERROR(model.backward(1.0f, [&](std::span<const llmc::ParamRange>) { reported = true; }, wrong),
                 "an early wte range holds a row this batch's input tokens use");
    EXPECT(!reported);
  }
}

// The early wte rows against per-row loops: the untouched runs (all, and the longest few in row order, ties to
// the lower rows), the embeddings' remaining ranges, the check of a batch's tokens against ranges, and the
// bitmap's refusal of an id outside it.
TEST(untouched_wte_rows_match_per_row_loops) {
    llmc::ModelConfig config = tiny_config();
    config.padded_vocab_size = 200;  // not a multiple of 64: the bitmap's last word is partial
    config.vocab_size = 190;
    const llmc::ParamLayout layout = llmc::ParamLayout::gpt2(config);
    const size_t rows = config.padded_vocab_size, C = config.channels, wte = layout.find("wte.weight").offset;
    llmc::Rng rng(21);
    for (int trial = 0; trial < 50; trial++) {
        std::vector<int> tokens(trial % 7 == 0 ? 0 : 1 + rng.below(120));
        for (int& t : tokens) t = static_cast<int>(rng.below(trial % 2 ? rows : 64));  // clustered or spread
        const std::vector<uint64_t> bits = llmc::token_row_bitmap(tokens, rows);
        std::vector<bool> used(rows, false);
        for (const int t : tokens) used[size_t(t)] = true;
        // the runs, by a per-row loop
        std::vector<std::pair<size_t, size_t>> runs;  // (first row, rows)
        for (size_t r = 0; r < rows; r++)
            if (!used[r]) {
                if (!runs.empty() && runs.back().first + runs.back().second == r) runs.back().second++;
                else runs.push_back({r, 1});
            }
        for (const size_t cap : {size_t{0}, size_t{1}, size_t{3}, SIZE_MAX}) {
            std::vector<std::pair<size_t, size_t>> expect = runs;
            if (expect.size() > cap) {
                // the cap longest: repeatedly the longest remaining, the lower first on ties
                std::vector<std::pair<size_t, size_t>> kept, left = runs;
                while (kept.size() < cap) {
                    auto best = left.begin();
                    for (auto it = left.begin(); it != left.end(); ++it)
                        if (it->second > best->second) best = it;
                    kept.push_back(*best);
                    left.erase(best);
                }
                std::sort(kept.begin(), kept.end());
                expect = kept;
            }
            const std::vector<llmc::ParamRange> got = layout.untouched_wte_rows(bits, cap);
            EXPECT_EQ(got.size(), expect.size());
            for (size_t i = 0; i < got.size() && i < expect.size(); i++)
                EXPECT(got[i].offset == wte + expect[i].first * C && got[i].numel == expect[i].second * C);
            EXPECT(layout.wte_rows_untouched(got, tokens));
            // the embeddings' ranges cover wte and wpe exactly once together with the early ones
            std::vector<int> cover(layout.num_params, 0);
            for (const llmc::ParamRange& r : got)
                for (size_t i = r.offset; i < r.offset + r.numel; i++) cover[i]++;
            for (const llmc::ParamRange& r : layout.backward_ranges_of_embeddings(got))
                for (size_t i = r.offset; i < r.offset + r.numel; i++) cover[i]++;
            const size_t wpe_end = layout.find("wpe.weight").offset + layout.find("wpe.weight").numel;
            size_t wrong = 0;
            for (size_t i = 0; i < layout.num_params; i++) wrong += cover[i] != (i >= wte && i < wpe_end ? 1 : 0);
            EXPECT_EQ(wrong, size_t{0});
        }
        // a range over one used row is seen, one next to it is not
        if (!tokens.empty()) {
            const size_t t = size_t(tokens[0]);
            EXPECT(!layout.wte_rows_untouched(std::vector<llmc::ParamRange>{{wte + t * C, C}}, tokens));
            if (t + 1 < rows && !used[t + 1])
                EXPECT(layout.wte_rows_untouched(std::vector<llmc::ParamRange>{{wte + (t + 1) * C, C}}, tokens));
        }
    }
    const std::vector<int> outside = {3, int(rows)};
    EXPECT_ERROR(llmc::token_row_bitmap(outside, rows), "token id 200 outside [0, 200)");
    const std::vector<llmc::ParamRange> backwards = {{wte + 10 * C, C}, {wte, C}};
    EXPECT_ERROR(layout.backward_ranges_of_embeddings(backwards), "in order, without overlap");
    EXPECT_ERROR(layout.untouched_wte_rows(std::vector<uint64_t>(2, 0), 1), "the bitmap has 2 words, not 4");
}

// Central differences on the loss for the largest-gradient entry of every parameter kind: an independent
// check of backward that needs no PyTorch. With h = 1e-2 the truncation error is O(h^2) and fp32 loss noise
// (~1e-6) contributes ~1e-4 to the estimate, so 2% on the largest entries only flags real errors.
TEST(backward_matches_finite_differences) {
  for (const llmc::ModelConfig& config : every_family()) {
    const int B = 2, T = 8;
    const std::vector<int> tokens = random_tokens(B * T + 1, config.vocab_size, 12);
    llmc::ModelCpu model(config);
    model.init_random(9);
    // Non-trivial LayerNorm parameters and biases, so their gradients are not special cases.
    llmc::Rng rng(10);
    for (const llmc::ParamTensor& t : model.layout().tensors)
        if (!t.is_matrix())
            for (size_t i = 0; i < t.numel; i++) model.params()[t.offset + i] += 0.1f * float(rng.normal());
    model.zero_grad();
    model.forward(tokens.data(), tokens.data() + 1, B, T);
    model.backward();
    const std::vector<float> grads(model.grads().begin(), model.grads().end());
    for (const llmc::ParamTensor& t : model.layout().tensors) {
        if (t.layer > 0) continue;  // layer 0 of each kind, plus wte, wpe and ln_f
        size_t best = t.offset;
        for (size_t i = t.offset; i < t.offset + t.numel; i++)
            if (std::fabs(grads[i]) > std::fabs(grads[best])) best = i;
        const float h = 1e-2f, saved = model.params()[best];
        model.params()[best] = saved + h;
        const double plus = model.forward(tokens.data(), tokens.data() + 1, B, T);
        model.params()[best] = saved - h;
        const double minus = model.forward(tokens.data(), tokens.data() + 1, B, T);
        model.params()[best] = saved;
        const double numeric = (plus - minus) / (2.0 * h);
        const double err = std::fabs(numeric - grads[best]) / std::max(std::fabs(double(grads[best])), 1e-3);
        if (err > 0.02)
            testing::report_failure(__FILE__, __LINE__,
                                    config.describe() + " " + t.name + ": analytic " + std::to_string(grads[best]) +
                                        " vs numeric " + std::to_string(numeric));
    }
  }
}

TEST_MAIN()
