// Readers of multiple-choice examples (see multiple_choice.h).
#include "llmc/data/multiple_choice.h"

#include <algorithm>
#include <cstring>

#include "llmc/data/text_tokenizer.h"
#include "llmc/base/byte_stream.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/json_lines.h"

namespace llmc {
namespace {

constexpr uint16_t kStartOfExample = 65535;
// HellaSwag's validation set is 11 MB as JSON Lines: a limit far above any such set, where a device or a pipe that
// never ends would fill the memory.
constexpr size_t kMaxChoicesFileBytes = size_t(256) << 20;

// llm.c's eval file: a header of 256 int32 (magic, version, examples, longest example in bytes), then per example
// the uint16 stream <65535> <bytes of the example> <index> <label> <completions> <n> <context> (<n> <tokens>)...
std::vector<ChoiceExample> read_eval_file(const std::string& path, int vocab_size, size_t limit) {
    const std::vector<std::byte> raw = read_whole_file(path, kMaxChoicesFileBytes);
    LLMC_CHECK(raw.size() >= 1024, path + ": truncated: " + std::to_string(raw.size()) +
                                       " bytes, less than the 1024-byte header of an llm.c eval file");
    int32_t header[256];
    std::memcpy(header, raw.data(), sizeof(header));
    LLMC_CHECK(header[0] == kEvalFileMagic, path + ": bad magic " + std::to_string(header[0]) +
                                                " (an llm.c eval file has " + std::to_string(kEvalFileMagic) + ")");
    LLMC_CHECK(header[1] == kEvalFileVersion, path + ": unsupported eval file version " + std::to_string(header[1]));
    LLMC_CHECK(header[2] > 0, path + ": the header says " + std::to_string(header[2]) + " examples");
    LLMC_CHECK((raw.size() - 1024) % 2 == 0, path + ": an odd number of bytes after the header");
    std::vector<uint16_t> words((raw.size() - 1024) / 2);
    std::memcpy(words.data(), raw.data() + 1024, words.size() * 2);

    const size_t count = static_cast<size_t>(header[2]);
    std::vector<ChoiceExample> examples;
    size_t at = 0;
    for (size_t i = 0; i < count && (limit == 0 || i < limit); i++) {
        const std::string where = path + ": example " + std::to_string(i);
        const size_t begin = at;
        const auto next = [&](const char* what) -> uint16_t {
            LLMC_CHECK(at < words.size(), where + ": truncated: the file ends inside it (reading its " + what + ")");
            return words[at++];
        };
        const auto tokens = [&](const char* what) {
            std::vector<int> out(next(what));
            for (int& t : out) {
                t = next(what);
                LLMC_CHECK(t < vocab_size, where + ": token id " + std::to_string(t) + " in its " + what +
                                               " is outside the model's vocabulary [0, " +
                                               std::to_string(vocab_size) + ")");
            }
            return out;
        };
        LLMC_CHECK(next("marker") == kStartOfExample,
                   where + ": no start-of-example marker 65535 at byte " + std::to_string(1024 + 2 * begin));
        const size_t bytes = next("size");
        (void)next("index");
        ChoiceExample example;
        example.label = next("label");
        const int completions = next("completion count");
        LLMC_CHECK(completions >= 2, where + ": " + std::to_string(completions) + " completions (at least 2)");
        LLMC_CHECK(example.label < completions, where + ": label " + std::to_string(example.label) +
                                                    " is not one of its " + std::to_string(completions) +
                                                    " completions");
        example.context = tokens("context");
        for (int c = 0; c < completions; c++) {
            example.endings.push_back(tokens("completion"));
            LLMC_CHECK(!example.endings.back().empty(), where + ": completion " + std::to_string(c) + " is empty");
        }
        LLMC_CHECK(2 * (at - begin) == bytes, where + ": its size field says " + std::to_string(bytes) +
                                                  " bytes, its fields take " + std::to_string(2 * (at - begin)));
        examples.push_back(std::move(example));
    }
    if (limit == 0 || limit >= count) {
        LLMC_CHECK(at == words.size(), path + ": " + std::to_string(2 * (words.size() - at)) +
                                           " bytes after the last of the header's " + std::to_string(count) +
                                           " examples");
    }
    return examples;
}

// HellaSwag's JSON Lines: {"ctx": "...", "endings": ["...", ...], "label": 2, ...} a line.
std::vector<ChoiceExample> read_json_lines(const std::string& path, TextTokenizer& tokenizer, size_t limit) {
    const std::string content = read_all_content(path, kMaxChoicesFileBytes);
    std::vector<ChoiceExample> examples;
    size_t line_number = 0;
    for (size_t pos = 0; pos < content.size() && (limit == 0 || examples.size() < limit);) {
        size_t end = content.find('\n', pos);
        if (end == std::string::npos) end = content.size();
        const std::string_view line(content.data() + pos, end - pos);
        pos = end + 1;
        line_number++;
        if (is_blank_line(line)) continue;
        const std::string where = path + ":" + std::to_string(line_number);
        const nlohmann::json object = parse_json_object(line, where);
        const auto ctx = object.find("ctx"), endings = object.find("endings"), label = object.find("label");
        LLMC_CHECK(ctx != object.end() && ctx->is_string(), where + ": no string field 'ctx'");
        LLMC_CHECK(endings != object.end() && endings->is_array() && endings->size() >= 2,
                   where + ": no field 'endings' holding at least 2 strings");
        LLMC_CHECK(label != object.end() && label->is_number_integer(),
                   where + ": no integer field 'label' (a test split without labels cannot be scored)");
        ChoiceExample example;
        const long long label_value = label->get<long long>();
        LLMC_CHECK(label_value >= 0 && label_value < static_cast<long long>(endings->size()),
                   where + ": label " + std::to_string(label_value) + " is not one of its " +
                       std::to_string(endings->size()) + " endings");
        example.label = static_cast<int>(label_value);
        tokenizer.encode(ctx->get_ref<const std::string&>(), example.context);
        for (const nlohmann::json& ending : *endings) {
            LLMC_CHECK(ending.is_string(), where + ": an ending that is not a string");
            std::vector<int>& tokens = example.endings.emplace_back();
            std::string text(" ");  // GPT-2 encodes the word boundary with the word that follows it
            text += ending.get_ref<const std::string&>();
            tokenizer.encode(text, tokens);
        }
        examples.push_back(std::move(example));
    }
    LLMC_CHECK(!examples.empty(), path + ": no examples (every line is blank)");
    return examples;
}

}  // namespace

bool is_eval_file(const std::string& path) { return path.ends_with(".bin"); }

void write_eval_file(const std::string& path, std::span<const ChoiceExample> examples) {
    LLMC_CHECK(!examples.empty() && examples.size() < 65536,
               path + ": the eval file format holds 1 to 65,535 examples, not " + std::to_string(examples.size()));
    std::vector<uint16_t> words;
    size_t longest = 0;
    for (size_t i = 0; i < examples.size(); i++) {
        const ChoiceExample& e = examples[i];
        const size_t begin = words.size();
        const auto put_tokens = [&](const std::vector<int>& tokens) {
            words.push_back(static_cast<uint16_t>(tokens.size()));
            for (const int t : tokens) {
                LLMC_CHECK(t >= 0 && t < kStartOfExample, path + ": example " + std::to_string(i) + ": token id " +
                                                              std::to_string(t) + " does not fit the format");
                words.push_back(static_cast<uint16_t>(t));
            }
        };
        words.insert(words.end(), {kStartOfExample, 0, static_cast<uint16_t>(i), static_cast<uint16_t>(e.label),
                                   static_cast<uint16_t>(e.endings.size())});
        put_tokens(e.context);
        for (const std::vector<int>& ending : e.endings) put_tokens(ending);
        const size_t bytes = 2 * (words.size() - begin);
        LLMC_CHECK(bytes < 65536, path + ": example " + std::to_string(i) + " takes " + std::to_string(bytes) +
                                      " bytes, more than the format's 65,535");
        words[begin + 1] = static_cast<uint16_t>(bytes);
        longest = std::max(longest, bytes);
    }
    int32_t header[256] = {};
    header[0] = kEvalFileMagic;
    header[1] = kEvalFileVersion;
    header[2] = static_cast<int32_t>(examples.size());
    header[3] = static_cast<int32_t>(longest);
    std::vector<std::byte> bytes(sizeof(header) + 2 * words.size());
    std::memcpy(bytes.data(), header, sizeof(header));
    std::memcpy(bytes.data() + sizeof(header), words.data(), 2 * words.size());
    write_file_atomic(path, bytes);
}

void check_choices_fit(std::span<const ChoiceExample> examples, size_t row_tokens, const std::string& path) {
    for (size_t i = 0; i < examples.size(); i++) {
        const std::string where = path + ": example " + std::to_string(i);
        LLMC_CHECK(!examples[i].context.empty(), where + ": an empty context (nothing predicts the completions)");
        for (const std::vector<int>& ending : examples[i].endings) {
            LLMC_CHECK(ending.size() < row_tokens, where + ": a completion of " + std::to_string(ending.size()) +
                                                       " tokens does not fit rows of " +
                                                       std::to_string(row_tokens - 1) + " positions");
        }
    }
}

std::vector<ChoiceScore> score_choices(std::span<const ChoiceExample> examples, size_t first, size_t stride,
                                       const ChoiceBatching& batching, const PositionLosses& forward) {
    struct Row {
        size_t slot;                       // into scores
        int completion;
        std::span<const int> context;      // cropped
    };
    std::vector<ChoiceScore> scores;
    std::vector<Row> rows;
    std::vector<size_t> indices;
    for (size_t i = first; i < examples.size(); i += stride) {
        const ChoiceExample& example = examples[i];
        size_t longest = 0;
        for (const std::vector<int>& ending : example.endings) longest = std::max(longest, ending.size());
        ChoiceScore& score = scores.emplace_back();
        const size_t length = example.context.size() + longest;
        score.cropped = length > batching.row_tokens ? length - batching.row_tokens : 0;
        score.sum.assign(example.endings.size(), 0.0);
        const std::span<const int> context = std::span<const int>(example.context).subspan(score.cropped);
        for (size_t c = 0; c < example.endings.size(); c++) rows.push_back({scores.size() - 1, int(c), context});
        indices.push_back(i);
    }
    const auto ending_of = [&](const Row& row) -> const std::vector<int>& {
        return examples[indices[row.slot]].endings[row.completion];
    };
    std::vector<int> inputs, targets, tokens;
    for (size_t begin = 0, end = 0; begin < rows.size(); begin = end) {
        if (batching.pad_rows) {
            end = std::min(rows.size(), begin + batching.rows);
        } else {  // whole examples (at least one), so that a forward's rows are alike in length
            while (end < rows.size()) {
                size_t next = end;
                while (next < rows.size() && rows[next].slot == rows[end].slot) next++;
                if (end > begin && next - begin > static_cast<size_t>(batching.rows)) break;
                end = next;
            }
        }
        int T = batching.T;
        for (size_t r = begin; batching.T == 0 && r < end; r++)
            T = std::max(T, static_cast<int>(rows[r].context.size() + ending_of(rows[r]).size() - 1));
        const int B = batching.pad_rows ? batching.rows : static_cast<int>(end - begin);
        inputs.assign(static_cast<size_t>(B) * T, batching.pad_token);
        targets.assign(inputs.size(), batching.pad_token);
        for (size_t r = begin; r < end; r++) {
            tokens.assign(rows[r].context.begin(), rows[r].context.end());
            tokens.insert(tokens.end(), ending_of(rows[r]).begin(), ending_of(rows[r]).end());
            const size_t offset = (r - begin) * static_cast<size_t>(T);
            for (size_t t = 0; t + 1 < tokens.size(); t++) {
                inputs[offset + t] = tokens[t];
                targets[offset + t] = tokens[t + 1];
            }
        }
        const std::span<const float> losses = forward(inputs.data(), targets.data(), B, T);
        for (size_t r = begin; r < end; r++) {
            const size_t offset = (r - begin) * static_cast<size_t>(T), from = rows[r].context.size() - 1;
            double sum = 0.0;
            for (size_t t = from; t < from + ending_of(rows[r]).size(); t++) sum += losses[offset + t];
            scores[rows[r].slot].sum[rows[r].completion] = sum;
        }
    }
    for (size_t slot = 0; slot < scores.size(); slot++) {
        ChoiceScore& score = scores[slot];
        const ChoiceExample& example = examples[indices[slot]];
        for (size_t c = 0; c < score.sum.size(); c++)
            score.mean.push_back(score.sum[c] / static_cast<double>(example.endings[c].size()));
        score.prediction = static_cast<int>(std::min_element(score.sum.begin(), score.sum.end()) - score.sum.begin());
        score.prediction_norm =
            static_cast<int>(std::min_element(score.mean.begin(), score.mean.end()) - score.mean.begin());
    }
    return scores;
}

std::vector<ChoiceExample> read_choice_examples(const std::string& path, TextTokenizer* tokenizer, int vocab_size,
                                                size_t limit) {
    if (is_eval_file(path)) return read_eval_file(path, vocab_size, limit);
    LLMC_CHECK(tokenizer != nullptr, path + ": JSON Lines examples need a tokenizer");
    return read_json_lines(path, *tokenizer, limit);
}

}  // namespace llmc
