// Readers of multiple-choice examples (see multiple_choice.h).
#include "llmc/multiple_choice.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "llmc/bpe.h"
#include "llmc/byte_stream.h"
#include "llmc/error.h"
#include "llmc/fileio.h"

namespace llmc {
namespace {

constexpr uint16_t kStartOfExample = 65535;

// llm.c's eval file: a header of 256 int32 (magic, version, examples, longest example in bytes), then per example
// the uint16 stream <65535> <bytes of the example> <index> <label> <completions> <n> <context> (<n> <tokens>)...
std::vector<ChoiceExample> read_eval_file(const std::string& path, int vocab_size, size_t limit) {
    const std::vector<std::byte> raw = read_whole_file(path);
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
std::vector<ChoiceExample> read_json_lines(const std::string& path, Gpt2Bpe& bpe, size_t limit) {
    const std::string content = read_all_content(path);
    std::vector<ChoiceExample> examples;
    size_t line_number = 0;
    for (size_t pos = 0; pos < content.size() && (limit == 0 || examples.size() < limit);) {
        size_t end = content.find('\n', pos);
        if (end == std::string::npos) end = content.size();
        const std::string_view line(content.data() + pos, end - pos);
        pos = end + 1;
        line_number++;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        const std::string where = path + ":" + std::to_string(line_number);
        nlohmann::json object;
        try {
            object = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            fail(where + ": malformed JSON (" + e.what() + ")");
        }
        LLMC_CHECK(object.is_object(), where + ": expected a JSON object, got " + std::string(object.type_name()));
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
        bpe.encode(ctx->get_ref<const std::string&>(), example.context);
        for (const nlohmann::json& ending : *endings) {
            LLMC_CHECK(ending.is_string(), where + ": an ending that is not a string");
            std::vector<int>& tokens = example.endings.emplace_back();
            std::string text(" ");  // GPT-2 encodes the word boundary with the word that follows it
            text += ending.get_ref<const std::string&>();
            bpe.encode(text, tokens);
        }
        examples.push_back(std::move(example));
    }
    LLMC_CHECK(!examples.empty(), path + ": no examples (every line is blank)");
    return examples;
}

}  // namespace

bool is_eval_file(const std::string& path) { return path.ends_with(".bin"); }

std::vector<ChoiceExample> read_choice_examples(const std::string& path, Gpt2Bpe* bpe, int vocab_size,
                                                size_t limit) {
    if (is_eval_file(path)) return read_eval_file(path, vocab_size, limit);
    LLMC_CHECK(bpe != nullptr, path + ": JSON Lines examples need the GPT-2 tokenizer");
    return read_json_lines(path, *bpe, limit);
}

}  // namespace llmc
