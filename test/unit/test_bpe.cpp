// Unit tests of the GPT-2 BPE (llmc/data/bpe.h) and the tokenizer decode file (llmc/data/tokenizer.h): UTF-8 repair,
// pre-tokenization edge cases, known encodings, round trips, the decode file's validation, and, once
// data/prepare_default.sh has run, round trips of every default-corpus document and a check that the shards hold
// exactly EOT + tokens of each document in order. The token-for-token comparison with js-tiktoken lives in
// test/e2e/test_tokenizer.sh, which also runs this binary after preparing the corpus. Without the prepared GPT-2
// files the vocabulary-free tests still run and the binary exits 77 (skipped).
//
// `test_bpe --load-tokenizer PATH` loads one decode file the way a program would (used by test_tokenizer.sh to
// check the one-line error and exit status of bad files).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/data/bpe.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/token_shard.h"
#include "llmc/data/tokenizer.h"
#include "test/support/testing.h"

namespace {

const std::string kEncoderJson = "data/cache/gpt2/encoder.json";
const std::string kVocabBpe = "data/cache/gpt2/vocab.bpe";
const std::string kDocumentList = "data/cache/docs/documents.txt";
const std::string kDatasetDir = "data/default";

bool have_vocabulary() { return llmc::file_exists(kEncoderJson) && llmc::file_exists(kVocabBpe); }

llmc::Gpt2Bpe& gpt2() {
    static llmc::Gpt2Bpe bpe = llmc::Gpt2Bpe::load(kEncoderJson, kVocabBpe);
    return bpe;
}

std::vector<int> encode(const std::string& text) {
    std::vector<int> out;
    gpt2().encode(text, out);
    return out;
}

std::vector<std::string> pieces_of(const std::string& text) {
    std::vector<std::string_view> views;
    llmc::gpt2_pretokenize(text, views);
    return {views.begin(), views.end()};
}

std::string repaired(const std::string& text) {
    std::string out;
    return llmc::repair_utf8(text, out) ? out : text;
}

std::string temp_path(const std::string& name) { return "/tmp/llmc_test_bpe_" + std::to_string(getpid()) + "_" + name; }

bool one_line_naming(const llmc::Error& e, const std::string& path) {
    const std::string message = e.what();
    return message.find('\n') == std::string::npos && message.find(path) != std::string::npos;
}

std::string read_text(const std::string& path) {
    const std::vector<std::byte> raw = llmc::read_whole_file(path);
    return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
}

std::vector<std::string> corpus_documents() {
    std::vector<std::string> files;
    const std::string list = read_text(kDocumentList);
    size_t start = 0;
    while (start < list.size()) {
        size_t end = list.find('\n', start);
        if (end == std::string::npos) end = list.size();
        if (end > start) files.push_back(list.substr(start, end - start));
        start = end + 1;
    }
    return files;
}

const std::string kFffd = "\xEF\xBF\xBD";

}  // namespace

// ---- vocabulary-free ------------------------------------------------------------------------------------------

TEST(repair_utf8_leaves_valid_text_alone) {
    std::string out = "untouched";
    EXPECT(!llmc::repair_utf8("plain ASCII, caf\xC3\xA9, \xE4\xB8\xAD\xE6\x96\x87, \xF0\x9F\x98\x80", out));
    EXPECT_EQ(out, std::string("untouched"));
    EXPECT(!llmc::repair_utf8("", out));
}

TEST(repair_utf8_replaces_maximal_subparts) {
    EXPECT_EQ(repaired("a\xFF" "b"), "a" + kFffd + "b");                   // byte that never starts a sequence
    EXPECT_EQ(repaired("a\x80\x80"), "a" + kFffd + kFffd);                 // stray continuations, one each
    EXPECT_EQ(repaired("\xC3"), kFffd);                                    // truncated at end of text
    EXPECT_EQ(repaired("\xE2\x82x"), kFffd + "x");                         // truncated 3-byte: one U+FFFD
    EXPECT_EQ(repaired("\xF0\x9F\x98" "A"), kFffd + "A");                  // truncated 4-byte: one U+FFFD
    EXPECT_EQ(repaired("\xC0\x80"), kFffd + kFffd);                        // overlong lead C0 is never valid
    EXPECT_EQ(repaired("\xE0\x80\x80"), kFffd + kFffd + kFffd);            // overlong 3-byte
    EXPECT_EQ(repaired("\xED\xA0\x80"), kFffd + kFffd + kFffd);            // UTF-16 surrogate
    EXPECT_EQ(repaired("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
    EXPECT_EQ(repaired("\xF8\x88\x80\x80\x80"), kFffd + kFffd + kFffd + kFffd + kFffd);
    EXPECT_EQ(repaired("ok \xE4\xB8\xAD\xE4\xB8 end"), "ok \xE4\xB8\xAD" + kFffd + " end");
}

TEST(pretokenize_matches_gpt2_regex) {
    using P = std::vector<std::string>;
    EXPECT_EQ(pieces_of("Hello world"), (P{"Hello", " world"}));
    EXPECT_EQ(pieces_of("it's we'll they're I'd you've I'm don't"),
              (P{"it", "'s", " we", "'ll", " they", "'re", " I", "'d", " you", "'ve", " I", "'m", " don", "'t"}));
    EXPECT_EQ(pieces_of("IT'S"), (P{"IT", "'", "S"}));  // contractions are case-sensitive
    EXPECT_EQ(pieces_of("'sa"), (P{"'s", "a"}));
    EXPECT_EQ(pieces_of("!!!'s"), (P{"!!!'", "s"}));    // a symbol run swallows the apostrophe
    EXPECT_EQ(pieces_of("a   b"), (P{"a", "  ", " b"}));
    EXPECT_EQ(pieces_of("a   \n\nb"), (P{"a", "   \n", "\n", "b"}));
    EXPECT_EQ(pieces_of("x  "), (P{"x", "  "}));
    EXPECT_EQ(pieces_of(" "), (P{" "}));
    EXPECT_EQ(pieces_of("\n\tx"), (P{"\n", "\t", "x"}));
    EXPECT_EQ(pieces_of("abc123 4567x"), (P{"abc", "123", " 4567", "x"}));
    EXPECT_EQ(pieces_of("caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"), (P{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
    EXPECT_EQ(pieces_of("\xE2\x85\xAB" "1"), (P{"\xE2\x85\xAB" "1"}));  // U+216B ROMAN NUMERAL TWELVE is \p{N}
    EXPECT_EQ(pieces_of("a\xC2\xA0" "b"), (P{"a", "\xC2\xA0", "b"}));  // NBSP is \s but not the optional space
    EXPECT_EQ(pieces_of("a\xE3\x80\x80\xE3\x80\x80" "b"), (P{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
    EXPECT_EQ(pieces_of("\xEF\xBB\xBFx"), (P{"\xEF\xBB\xBF", "x"}));  // U+FEFF is \s in JavaScript
    EXPECT_EQ(pieces_of("a\xC2\x85" "b"), (P{"a", "\xC2\x85", "b"}));  // U+0085 is not \s in JavaScript
    EXPECT_EQ(pieces_of("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"), (P{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"}));
    EXPECT_EQ(pieces_of(""), P{});
    EXPECT_ERROR(pieces_of("a\xF0"), "not valid UTF-8");
}

TEST(tokenizer_file_round_trip_and_errors) {
    const std::string path = temp_path("tok.bin");
    const std::vector<std::string> tokens = {"a", "bc", std::string("\x00\xFF", 2), "<|endoftext|>"};
    llmc::write_tokenizer_file(path, tokens, 3);
    const auto decoder = llmc::TokenizerDecoder::load(path);
    EXPECT_EQ(decoder.size(), size_t{4});
    EXPECT_EQ(decoder.eot(), 3);
    for (int i = 0; i < 4; i++) EXPECT_EQ(decoder.decode(i), tokens[i]);
    EXPECT_EQ(decoder.decode(std::vector<int>{1, 0, 1}), std::string("bcabc"));
    EXPECT_ERROR(decoder.decode(4), "outside");
    EXPECT_ERROR(decoder.decode(-1), "outside");

    std::string bytes = read_text(path);
    auto expect_load_error = [&](const std::string& content, const std::string& needle) {
        const std::string bad = temp_path("bad.bin");
        llmc::write_file_atomic(bad, std::as_bytes(std::span(content.data(), content.size())));
        try {
            llmc::TokenizerDecoder::load(bad);
            testing::report_failure(__FILE__, __LINE__, "no error for " + needle);
        } catch (const llmc::Error& e) {
            if (!one_line_naming(e, bad) || std::string(e.what()).find(needle) == std::string::npos)
                testing::report_failure(__FILE__, __LINE__, std::string("unexpected message: ") + e.what());
        }
        std::remove(bad.c_str());
    };
    std::string wrong_magic = bytes;
    wrong_magic[0] ^= 1;
    expect_load_error(wrong_magic, "bad magic");
    std::string wrong_version = bytes;
    wrong_version[4] = 7;
    expect_load_error(wrong_version, "unsupported tokenizer version");
    expect_load_error(bytes.substr(0, bytes.size() - 1), "truncated");
    expect_load_error(bytes.substr(0, 1000), "truncated");
    expect_load_error(bytes + "x", "unexpected bytes");
    std::string zero_length = bytes;
    zero_length[1024] = 0;
    expect_load_error(zero_length, "length 0");
    EXPECT_ERROR(llmc::TokenizerDecoder::load(temp_path("missing.bin")), "cannot open");
    EXPECT_ERROR(llmc::write_tokenizer_file(path, {"a", ""}, 0), "1..255");
    EXPECT_ERROR(llmc::write_tokenizer_file(path, {"a"}, 1), "EOT id");
    std::remove(path.c_str());
}

// ---- with the GPT-2 vocabulary ---------------------------------------------------------------------------------

TEST(gpt2_known_encodings) {
    if (!have_vocabulary()) return;
    EXPECT_EQ(gpt2().vocab_size(), 50257);
    EXPECT_EQ(gpt2().eot_token(), 50256);
    EXPECT_EQ(encode("Hello world"), (std::vector<int>{15496, 995}));
    EXPECT_EQ(encode("Hello world! It's 2024, isn't it?  Yes   \n\n\tok"),
              (std::vector<int>{15496, 995, 0, 632, 338, 48609, 11, 2125, 470, 340, 30, 220, 3363, 220, 220, 220,
                                628, 197, 482}));
    EXPECT_EQ(encode(""), std::vector<int>{});
    const std::vector<int> eot_text = encode("<|endoftext|>");  // plain text, never the special token
    EXPECT(!eot_text.empty());
    for (const int id : eot_text) EXPECT(id != 50256);
    EXPECT_EQ(gpt2().decode(std::vector<int>{50256}), std::string("<|endoftext|>"));
    EXPECT_ERROR(gpt2().decode(std::vector<int>{50257}), "outside the vocabulary");
}

TEST(gpt2_round_trips_and_is_deterministic) {
    if (!have_vocabulary()) return;
    std::mt19937 rng(1234);
    // Code points drawn from ASCII, Latin-1, CJK, emoji and whitespace, joined into random strings.
    const std::vector<std::pair<char32_t, char32_t>> ranges = {
        {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0xFF}, {0x3000, 0x3000}, {0x4E00, 0x4E40}, {0x1F600, 0x1F640}, {0x660, 0x669}};
    for (int trial = 0; trial < 300; trial++) {
        std::string text;
        const int length = static_cast<int>(rng() % 400);
        for (int i = 0; i < length; i++) {
            const auto& [lo, hi] = ranges[rng() % ranges.size()];
            const char32_t cp = lo + rng() % (hi - lo + 1);
            if (cp < 0x80) text += static_cast<char>(cp);
            else if (cp < 0x800) text += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
            else if (cp < 0x10000)
                text += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                         static_cast<char>(0x80 | (cp & 0x3F))};
            else
                text += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
                         static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
        }
        const std::vector<int> tokens = encode(text);
        EXPECT_EQ(gpt2().decode(tokens), text);
        llmc::Gpt2Bpe fresh = gpt2();  // a copy starts with an empty cache: cached and uncached paths agree
        std::vector<int> again;
        fresh.encode(text, again);
        EXPECT_EQ(again, tokens);
    }
    // Long pieces take the heap-based merge; they must still round-trip and agree between runs.
    const std::string long_word(5000, 'a'), long_symbols(3000, '!'), long_digits(2000, '7');
    for (const std::string& text : {long_word, long_symbols, long_digits, std::string(1000, ' ') + "x"}) {
        const std::vector<int> tokens = encode(text);
        EXPECT_EQ(gpt2().decode(tokens), text);
        llmc::Gpt2Bpe fresh = gpt2();
        std::vector<int> again;
        fresh.encode(text, again);
        EXPECT_EQ(again, tokens);
    }
}

TEST(gpt2_invalid_utf8_is_encoded_as_replacement_characters) {
    if (!have_vocabulary()) return;
    std::string all_bytes;
    for (int b = 0; b < 256; b++) all_bytes += static_cast<char>(b);
    const std::vector<int> tokens = encode(all_bytes);
    EXPECT_EQ(gpt2().decode(tokens), repaired(all_bytes));
    EXPECT_EQ(encode("x\xFFy\xE2\x82"), encode("x" + kFffd + "y" + kFffd));
    llmc::Gpt2Bpe fresh = gpt2();
    std::vector<int> again;
    fresh.encode(all_bytes, again);
    EXPECT_EQ(again, tokens);
}

TEST(gpt2_bad_vocabulary_files_name_the_file) {
    if (!have_vocabulary()) return;
    const std::string missing = temp_path("missing_encoder.json");
    try {
        llmc::Gpt2Bpe::load(missing, kVocabBpe);
        testing::report_failure(__FILE__, __LINE__, "no error for a missing encoder.json");
    } catch (const llmc::Error& e) {
        EXPECT(one_line_naming(e, missing));
    }
    const std::string corrupt = temp_path("corrupt_encoder.json");
    for (const std::string& content : {std::string("{\"a\": 0, \"b\": "), std::string("[1, 2]"),
                                       std::string("{\"a\": \"x\"}"), std::string("{\"a\": 1.5}")}) {
        llmc::write_file_atomic(corrupt, std::as_bytes(std::span(content.data(), content.size())));
        try {
            llmc::Gpt2Bpe::load(corrupt, kVocabBpe);
            testing::report_failure(__FILE__, __LINE__, "no error for corrupt encoder.json: " + content);
        } catch (const llmc::Error& e) {
            EXPECT(one_line_naming(e, corrupt));
        }
    }
    const std::string bad_merges = temp_path("vocab.bpe");
    const std::string merges = "#version: 0.2\nh e\nnot-a-merge\n";
    llmc::write_file_atomic(bad_merges, std::as_bytes(std::span(merges.data(), merges.size())));
    try {
        llmc::Gpt2Bpe::load(kEncoderJson, bad_merges);
        testing::report_failure(__FILE__, __LINE__, "no error for a bad vocab.bpe");
    } catch (const llmc::Error& e) {
        EXPECT(one_line_naming(e, bad_merges));
        EXPECT(std::string(e.what()).find("line 3") != std::string::npos);
    }
    std::remove(corrupt.c_str());
    std::remove(bad_merges.c_str());
}

TEST(gpt2_tokenizer_file_matches_vocabulary) {
    if (!have_vocabulary()) return;
    const std::string path = temp_path("gpt2_tokenizer.bin");
    llmc::write_tokenizer_file(path, gpt2().all_token_bytes(), gpt2().eot_token());
    const auto decoder = llmc::TokenizerDecoder::load(path);
    EXPECT_EQ(decoder.size(), size_t{50257});
    EXPECT_EQ(decoder.eot(), 50256);
    for (int id = 0; id < 50257; id++)
        if (decoder.decode(id) != gpt2().token_bytes(id)) {
            testing::report_failure(__FILE__, __LINE__, "token " + std::to_string(id) + " differs");
            break;
        }
    std::remove(path.c_str());
}

// ---- with the prepared default corpus --------------------------------------------------------------------------

TEST(default_corpus_round_trips_and_matches_shards) {
    if (!have_vocabulary() || !llmc::file_exists(kDocumentList)) return;
    const auto decoder = llmc::TokenizerDecoder::load(kDatasetDir + "/tokenizer.bin");
    std::vector<uint16_t> shards = llmc::read_shard(kDatasetDir + "/default_val_000000.bin", 50257);
    for (const std::string& path : llmc::glob_files(kDatasetDir + "/default_train_*.bin")) {
        const std::vector<uint16_t> tokens = llmc::read_shard(path, 50257);
        shards.insert(shards.end(), tokens.begin(), tokens.end());
    }
    size_t position = 0, documents = 0;
    std::vector<int> tokens;
    for (const std::string& path : corpus_documents()) {
        const std::string text = read_text(path);
        tokens.clear();
        gpt2().encode(text, tokens);
        documents++;
        if (gpt2().decode(tokens) != repaired(text) || decoder.decode(tokens) != repaired(text)) {
            testing::report_failure(__FILE__, __LINE__, path + ": decode(encode(text)) != text");
            return;
        }
        bool same = position + 1 + tokens.size() <= shards.size() && shards[position] == 50256;
        for (size_t i = 0; same && i < tokens.size(); i++) same = shards[position + 1 + i] == tokens[i];
        if (!same) {
            testing::report_failure(__FILE__, __LINE__, path + ": shards do not hold EOT + its tokens at position " +
                                                            std::to_string(position));
            return;
        }
        position += 1 + tokens.size();
    }
    EXPECT_EQ(position, shards.size());
    std::printf("  %zu documents, %zu tokens: round trips and shard contents agree\n", documents, position);
}

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "--load-tokenizer") == 0) {
        try {
            const auto decoder = llmc::TokenizerDecoder::load(argv[2]);
            std::printf("%s: %zu tokens, EOT %d\n", argv[2], decoder.size(), decoder.eot());
            return 0;
        } catch (const llmc::Error& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 1;
        }
    }
    if (argc != 1) {
        std::fprintf(stderr, "usage: test_bpe [--load-tokenizer PATH]\n");
        return 2;
    }
    const int status = testing::run_all();
    if (status == 0 && !have_vocabulary()) {
        std::printf("SKIP: vocabulary-free tests passed; GPT-2 files absent (run data/prepare_default.sh)\n");
        return 77;
    }
    return status;
}
