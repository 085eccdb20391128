// Multiple-choice evaluations (HellaSwag and its kind) for eval_gpt: each example is a context and a few
// completions, one of them right; a model picks the completion it finds most likely after the context. Read from
// llm.c's eval file (dev/data/hellaswag.py and mmlu.py write it: magic 20240522) or from JSON Lines in
// HellaSwag's own schema ("ctx", "endings", "label"; plain, .gz or .zst), which are tokenized as llm.c's script
// does: the context as it is, each ending with a space before it, no end-of-text token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmc {

class Gpt2Bpe;

struct ChoiceExample {
    int label = 0;                           // index of the right completion
    std::vector<int> context;                // tokens shared by every completion
    std::vector<std::vector<int>> endings;   // each completion's tokens (at least one each)
};

constexpr int32_t kEvalFileMagic = 20240522;
constexpr int32_t kEvalFileVersion = 1;

// Reads every example (at most `limit` when limit > 0). `bpe` tokenizes JSON Lines (its vocabulary must be the
// model's); an llm.c eval file needs none (pass nullptr), its token ids must be below vocab_size. Throws
// llmc::Error naming the file, and the example or line.
std::vector<ChoiceExample> read_choice_examples(const std::string& path, Gpt2Bpe* bpe, int vocab_size,
                                                size_t limit = 0);

// True when the file is llm.c's binary eval format (by its name: *.bin).
bool is_eval_file(const std::string& path);

}  // namespace llmc
