// The flat-buffer layout (see param_layout.h) and what is common to every family's: the backward's ranges, the
// flops estimate. The families' tables of kinds are in gpt2/ and olmo/.
#include "llmc/model/param_layout.h"

#include <algorithm>
#include <cstdio>

#include "llmc/base/error.h"

namespace llmc {

ParamLayout ParamLayout::of_shapes(const std::vector<std::vector<size_t>>& shapes) {
    ParamLayout layout;
    size_t offset = 0;
    for (size_t i = 0; i < shapes.size(); i++) {
        ParamTensor t;
        char name[32];
        std::snprintf(name, sizeof name, "t%zu", i);  // (std::string "t" + ... trips a GCC 12 -Wrestrict bug)
        t.name = name;
        t.kind = ParamKind::wte;
        t.layer = -1;
        t.offset = offset;
        t.shape = shapes[i];
        t.numel = 1;
        for (size_t d : shapes[i]) t.numel *= d;
        offset += t.numel;
        layout.tensors.push_back(t);
    }
    layout.num_params = offset;
    return layout;
}

std::vector<ParamRange> ParamLayout::backward_ranges_of_layer(int l) const {
    LLMC_CHECK(l >= 0 && l < config.num_layers, "backward_ranges_of_layer: layer " + std::to_string(l) + " out of range");
    std::vector<ParamRange> ranges;
    if (l == config.num_layers - 1)
        for (ParamKind k : {ParamKind::lnfw, ParamKind::lnfb})
            if (kind_numel[int(k)] > 0) ranges.push_back({kind_offset[int(k)], kind_numel[int(k)]});
    for (int k = int(ParamKind::ln1w); k <= int(ParamKind::fcprojb); k++) {
        const size_t per_layer = kind_numel[k] / static_cast<size_t>(config.num_layers);
        if (per_layer > 0) ranges.push_back({kind_offset[k] + static_cast<size_t>(l) * per_layer, per_layer});
    }
    return ranges;
}

std::vector<ParamRange> ParamLayout::backward_ranges_of_embeddings(std::span<const ParamRange> wte_early) const {
    std::vector<ParamRange> ranges;
    size_t next = kind_offset[int(ParamKind::wte)];  // wte's first element not yet covered
    const size_t wte_end = next + kind_numel[int(ParamKind::wte)];
    for (const ParamRange& r : wte_early) {
        LLMC_CHECK(r.offset >= next && r.offset + r.numel <= wte_end,
                   "backward_ranges_of_embeddings: the early wte ranges must lie in wte, in order, without overlap");
        if (r.offset > next) ranges.push_back({next, r.offset - next});
        next = r.offset + r.numel;
    }
    if (next < wte_end) ranges.push_back({next, wte_end - next});
    if (kind_numel[int(ParamKind::wpe)] > 0)
        ranges.push_back({kind_offset[int(ParamKind::wpe)], kind_numel[int(ParamKind::wpe)]});
    return ranges;
}

std::vector<ParamRange> ParamLayout::untouched_wte_rows(std::span<const uint64_t> touched_rows, size_t max_runs) const {
    const size_t rows = static_cast<size_t>(config.padded_vocab_size), C = static_cast<size_t>(config.channels);
    LLMC_CHECK(touched_rows.size() == token_row_words(rows), "untouched_wte_rows: the bitmap has " +
                                                                 std::to_string(touched_rows.size()) +
                                                                 " words, not " +
                                                                 std::to_string(token_row_words(rows)));
    struct Run { size_t row, count; };
    const auto touched = [&](size_t r) { return (touched_rows[r / 64] >> (r % 64)) & 1u; };
    std::vector<Run> runs;
    for (size_t row = 0; row < rows;) {
        if (touched(row)) { row++; continue; }
        size_t end = row + 1;
        while (end < rows && !touched(end)) end++;
        runs.push_back({row, end - row});
        row = end;
    }
    if (runs.size() > max_runs) {
        std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.count > b.count; });
        runs.resize(max_runs);
        std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.row < b.row; });
    }
    std::vector<ParamRange> ranges;
    for (const Run& r : runs) ranges.push_back({kind_offset[int(ParamKind::wte)] + r.row * C, r.count * C});
    return ranges;
}

bool ParamLayout::wte_rows_untouched(std::span<const ParamRange> ranges, std::span<const int> tokens) const {
    const size_t wte = kind_offset[int(ParamKind::wte)], C = static_cast<size_t>(config.channels);
    for (const int t : tokens) {
        const size_t row_offset = wte + static_cast<size_t>(t) * C;
        // the last range starting at or before the row
        const auto after = std::upper_bound(ranges.begin(), ranges.end(), row_offset,
                                            [](size_t offset, const ParamRange& r) { return offset < r.offset; });
        if (after != ranges.begin() && row_offset < std::prev(after)->offset + std::prev(after)->numel) return false;
    }
    return true;
}

double model_flops_per_token(const ParamLayout& layout, int seq_len) {
    const ModelConfig& c = layout.config;
    return 6.0 * static_cast<double>(layout.num_params) +
           6.0 * static_cast<double>(c.num_layers) * c.channels * static_cast<double>(seq_len);
}

std::vector<uint64_t> token_row_bitmap(std::span<const int> tokens, size_t rows) {
    std::vector<uint64_t> bits(token_row_words(rows), 0);
    for (const int t : tokens) {
        LLMC_CHECK(t >= 0 && static_cast<size_t>(t) < rows,
                   "token_row_bitmap: token id " + std::to_string(t) + " outside [0, " + std::to_string(rows) + ")");
        bits[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t % 64);
    }
    return bits;
}

ParamLayout ParamLayout::of(const ModelConfig& config) {
    return config.arch == ModelArch::olmo ? olmo(config) : gpt2(config);
}

ParamLayout ParamLayout::from_kinds(const ModelConfig& c, std::span<const KindShape> kinds) {
    LLMC_CHECK(kinds.size() == kNumParamKinds, "ParamLayout::from_kinds: a table of " + std::to_string(kinds.size()) +
                                                   " kinds, not " + std::to_string(kNumParamKinds));
    ParamLayout layout;
    layout.config = c;
    size_t offset = 0;
    for (int k = 0; k < kNumParamKinds; k++) {
        const KindShape& info = kinds[k];
        layout.kind_offset[k] = offset;
        if (info.shape.empty()) continue;  // the family has no such tensor
        size_t numel = 1;
        for (size_t d : info.shape) numel *= d;
        const size_t copies = info.per_layer ? static_cast<size_t>(c.num_layers) : 1;
        for (size_t l = 0; l < copies; l++) {
            ParamTensor t;
            t.name = info.per_layer ? info.layer_prefix + std::to_string(l) + "." + info.name : info.name;
            t.kind = static_cast<ParamKind>(k);
            t.layer = info.per_layer ? static_cast<int>(l) : -1;
            t.offset = offset;
            t.numel = numel;
            t.shape = info.shape;
            layout.tensors.push_back(std::move(t));
            offset += numel;
        }
        layout.kind_numel[k] = offset - layout.kind_offset[k];
    }
    layout.num_params = offset;
    return layout;
}

const ParamTensor& ParamLayout::find(const std::string& name) const {
    for (const ParamTensor& t : tensors)
        if (t.name == name) return t;
    fail("unknown parameter name '" + name + "'");
}

}  // namespace llmc
