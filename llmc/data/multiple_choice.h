// Multiple-choice evaluations (HellaSwag and its kind) for eval_gpt: each example is a context and a few
// completions, one of them right; a model picks the completion it finds most likely after the context. Read from
// llm.c's eval file (dev/data/hellaswag.py and mmlu.py write it: magic 20240522) or from JSON Lines in
// HellaSwag's own schema ("ctx", "endings", "label"; plain, .gz or .zst), which are tokenized as llm.c's script
// does: the context as it is, each ending with a space before it, no end-of-text token.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace llmc {

class TextTokenizer;

struct ChoiceExample {
    int label = 0;                           // index of the right completion
    std::vector<int> context;                // tokens shared by every completion
    std::vector<std::vector<int>> endings;   // each completion's tokens (at least one each)
};

constexpr int32_t kEvalFileMagic = 20240522;
constexpr int32_t kEvalFileVersion = 1;

// Reads every example (at most `limit` when limit > 0). `tokenizer` tokenizes JSON Lines (its vocabulary must be the
// model's); an llm.c eval file needs none (pass nullptr), its token ids must be below vocab_size. Throws
// llmc::Error naming the file, and the example or line.
std::vector<ChoiceExample> read_choice_examples(const std::string& path, TextTokenizer* tokenizer, int vocab_size,
                                                size_t limit = 0);

// True when the file is llm.c's binary eval format (by its name: *.bin).
bool is_eval_file(const std::string& path);

// Writes examples as llm.c's eval file (atomically), which the trainers' --choices reads. Throws for what the
// format cannot hold (65,535 examples, an example of 64 KiB, token id 65535).
void write_eval_file(const std::string& path, std::span<const ChoiceExample> examples);

// Checks that every example can be scored in rows of at most row_tokens tokens (the model's inputs plus the
// last target): a non-empty context, and each completion short enough to keep at least one context token.
void check_choices_fit(std::span<const ChoiceExample> examples, size_t row_tokens, const std::string& path);

// One example's result: each completion's summed and mean cross-entropy over its tokens, and the least of each.
struct ChoiceScore {
    std::vector<double> sum, mean;
    int prediction = 0, prediction_norm = 0;  // the first of equal losses
    size_t cropped = 0;                       // context tokens dropped from the left to fit row_tokens
};

// How completions become forwards: a row each (context, cropped from the left to row_tokens, then the
// completion), up to `rows` rows to a forward of T positions (0: the batch's longest row, less its last token),
// whole examples to a forward (at least one, however many rows it has). With pad_rows every forward has exactly
// `rows` rows, an example's rows may straddle two forwards (a trainer's fixed shapes). Short and padding rows are
// filled with `pad_token` after their end (inputs and targets), which the causal model's earlier positions never
// see and whose losses are never summed, so its value cannot change a score (the trainers pass --pad_token_id).
struct ChoiceBatching {
    size_t row_tokens = 0;
    int rows = 1, T = 0;
    bool pad_rows = false;
    int pad_token = 0;
};
// forward(inputs, targets, B, T) runs the model and returns its B*T per-position cross-entropies.
using PositionLosses = std::function<std::span<const float>(const int* inputs, const int* targets, int B, int T)>;

// Scores examples first, first + stride, ... (a rank's share), in that order.
std::vector<ChoiceScore> score_choices(std::span<const ChoiceExample> examples, size_t first, size_t stride,
                                       const ChoiceBatching& batching, const PositionLosses& forward);

}  // namespace llmc
