// Checks of the Hugging Face tokenizer.json encoder (llmc/data/hf_tokenizer.h) that test/e2e/test_hf_tokenizer.sh
// drives against Hugging Face's JavaScript tokenizers (dev/reference/hf_tokenizers_encode.js) as the oracle:
//   check_hf_tokenizer compare [--nfc] TOKENIZER.json ORACLE.jsonl FILE...
//       encodes each file (one oracle line of ids per file, in order), requires token-for-token agreement and
//       decode(encode(x)) == x (x as a standard UTF-8 decoder reads it; with --nfc, for a tokenizer whose
//       normalizer is NFC, x's NFC form), and prints one summary line; on a disagreement, the first differing
//       position with the ids and bytes around it;
//   check_hf_tokenizer write-cases DIR     writes the edge-case documents (one file each) into DIR: hand-written
//                                          ones and 100 random strings of tricky characters (fixed seed);
//   check_hf_tokenizer load TOKENIZER.json loads the file as a program would (for the one-line error checks);
//   check_hf_tokenizer api TOKENIZER.json  vocab_size/eos/token_bytes/decode errors, clones on several threads.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/bpe.h"
#include "llmc/data/hf_tokenizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

namespace {

std::string read_text(const std::string& path) {
    const std::vector<std::byte> raw = llmc::read_whole_file(path);
    return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
}

std::string repaired(const std::string& text) {
    std::string out;
    return llmc::repair_utf8(text, out) ? out : text;
}

// ICU's NFC of valid UTF-8 (what a tokenizer with an NFC normalizer decodes back to).
std::string nfc(const std::string& text) {
    UErrorCode status = U_ZERO_ERROR;
    const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
    std::u16string in(text.size() + 1, u'\0'), out(2 * text.size() + 16, u'\0');
    int32_t length = 0;
    u_strFromUTF8(in.data(), static_cast<int32_t>(in.size()), &length, text.data(), static_cast<int32_t>(text.size()), &status);
    const int32_t normalized = unorm2_normalize(normalizer, in.data(), length, out.data(), static_cast<int32_t>(out.size()), &status);
    std::string result(3 * static_cast<size_t>(normalized) + 4, '\0');
    int32_t bytes = 0;
    u_strToUTF8(result.data(), static_cast<int32_t>(result.size()), &bytes, out.data(), normalized, &status);
    if (U_FAILURE(status)) llmc::fail("ICU NFC failed");
    result.resize(bytes);
    return result;
}

std::string show(std::string_view bytes) {
    std::string out;
    for (unsigned char c : bytes) {
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += static_cast<char>(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        }
    }
    return out;
}

std::string show_ids(const llmc::TextTokenizer& tok, const std::vector<int>& ids, size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < std::min(to, ids.size()); i++) {
        out += std::to_string(ids[i]) + "\"" + (tok.vocab_size() > ids[i] ? show(tok.token_bytes(ids[i])) : "?") + "\" ";
    }
    return out;
}

int compare(bool with_nfc, const std::string& tokenizer_json, const std::string& oracle_path,
            const std::vector<std::string>& files) {
    auto tok = llmc::load_hf_tokenizer(tokenizer_json);
    std::ifstream oracle(oracle_path);
    if (!oracle) llmc::fail(oracle_path + ": cannot open");
    size_t agree = 0, tokens = 0, bytes = 0, round_trips = 0;
    int status = 0;
    std::string line;
    std::vector<int> ours;
    for (const std::string& file : files) {
        if (!std::getline(oracle, line)) llmc::fail(oracle_path + ": fewer lines than files");
        const std::vector<int> expected = nlohmann::json::parse(line).get<std::vector<int>>();
        const std::string text = read_text(file);
        ours.clear();
        tok->encode(text, ours);
        bytes += text.size();
        if (ours == expected) {
            agree++;
            tokens += ours.size();
        } else if (status == 0) {
            size_t at = 0;
            while (at < ours.size() && at < expected.size() && ours[at] == expected[at]) at++;
            std::printf("MISMATCH %s (%s): at token %zu of %zu (oracle %zu)\n  ours:   %s\n  oracle: %s\n",
                        file.c_str(), tokenizer_json.c_str(), at, ours.size(), expected.size(),
                        show_ids(*tok, ours, at > 3 ? at - 3 : 0, at + 6).c_str(),
                        show_ids(*tok, expected, at > 3 ? at - 3 : 0, at + 6).c_str());
            status = 1;
        }
        if (tok->decode(ours) == (with_nfc ? nfc(repaired(text)) : repaired(text))) {
            round_trips++;
        } else if (status == 0) {
            std::printf("ROUND TRIP FAILS %s (%s)\n", file.c_str(), tokenizer_json.c_str());
            status = 1;
        }
    }
    std::printf("%s: %zu/%zu documents agree with the oracle token for token (%zu tokens, %.2f MB); %zu/%zu round "
                "trips exact\n",
                tokenizer_json.c_str(), agree, files.size(), tokens, bytes / 1e6, round_trips, files.size());
    return agree == files.size() && round_trips == files.size() ? status : 1;
}

void write_cases(const std::string& dir) {
    const std::string specials = "<|endoftext|>";
    std::vector<std::pair<std::string, std::string>> cases = {
        {"empty", ""},
        {"invalid_utf8", "ok \xFF\xFE bad \xC3 cut \xE2\x82 lone \x80\x80 overlong \xC0\xAF surrogate \xED\xA0\x80 "
                         "big \xF4\x90\x80\x80 end \xF0\x9F\x98"},
        {"spaces", std::string(300, ' ') + "x" + std::string(7, ' ') + "y \t \t z" + std::string(64, ' ')},
        {"newlines", std::string(200, '\n') + "a\r\n\r\n\r\nb\n \n  \n\t\nc" + std::string(50, '\n') + "  "},
        {"digits", std::string(1001, '7') + " 1234567890 3.14159 1,000,000 ٣٤٥ ½ Ⅻ 2024-12-02"},
        {"emoji", "I ❤️ tokenizers 😀😃😄 👍🏽👍🏿 🇫🇷🇯🇵 ✈️ #️⃣ 🧑‍🚀"},
        {"zwj", "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👩🏽‍💻 coder, a\u200Db\u200Cc \u2060"},
        {"cjk", "日本語のテキスト、中文文本，한국어 텍스트。漢字カタカナひらがな ＡＢＣ１２３ 『引用』"},
        {"combining", "e\u0301 cafe\u0301 Å Å n\u0303o\u0308 \u1100\u1161\u11A8 क्षि ا\u064Bب Z\u0351\u0352\u0353a"},
        {"mixed_scripts", "Привет мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก"},
        {"contractions", "I'm you're he's they've we'll she'd it'S I'M YOU'RE DON'T can't 'twas ''s"},
        {"specials", "a<|endoftext|>b <|endoftext|> c<|begin_of_text|><|end_of_text|>\n<|im_start|>user\nhi"
                     "<|im_end|><|endofprompt|> <|fim_prefix|>x<|reserved_special_token_5|> <|endoftext"},
        {"long_word", std::string(5000, 'a') + " " + std::string(3000, 'x') + "y" + " " +
                          [] { std::string s; for (int i = 0; i < 400; i++) s += "abc"; return s; }()},
        {"base64", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
                   "60e6kgAAAABJRU5ErkJggg== and a url https://example.com/a/b?c=d&e=f#g and path /usr/lib//x"},
        {"punctuation", "Hello,world!!! ... ??? --- ___ \"quoted\" (paren) [bracket] {brace} <angle> @#$%^&*~`|\\/"},
        {"whitespace_kinds", "a\u00A0b\u2003c\u3000d\u2028e\u2029f\u000Bg\u000Ch\u001Ci\u0085j"},
        {"astral", "𝒜𝓁𝓅𝒽𝒶 𝟙𝟚𝟛 𐍈 𓀀 🀄 \U0010FFFD"},
        {"controls", std::string("nul\0inside", 10) + " bell\x07 esc\x1B[0m del\x7F"},
        {"code", "def f(x):\n    return x**2  # square\n\nint main() { return 0; }\n\tif (a && b || !c) {}\r\n"},
    };
    // And 100 random strings over the characters that pre-tokenizers treat differently (fixed seed): cases nobody
    // thought of, such as a contraction after a combining mark or a special token inside a digit run.
    const std::vector<std::string> alphabet = {
        "a", "A", "b", "B", "z", "Z", "s", "S", "t", "T", "d", "D", "m", "M", "l", "L", "r", "R", "e", "E", "v", "V",
        "0", "1", "5", "9", " ", " ", " ", "\n", "\r", "\t", "'", "'", "\u2019", ".", ",", "!", "?", "-", "/", "\\",
        "(", "\"", "#", "_", "\u00E9", "\u00C9", "\u00F1", "\u00DF", "\u017F", "\u0130", "\u0131", "\u01C5",
        "e\u0301", "\u0301", "\u65E5", "\u672C", "\uD55C", "\u3072", "\u30AB", "\U0001F600", "\U0001F44D\U0001F3FD",
        "\U0001F468\u200D\U0001F469", "\u041F", "\u0440", "\u0645", "\u00A0", "\u3000", "\u2028", "\u0663",
        "\u00BD", "\u216B", "<|endoftext|>", "<|im_start|>", "<|end_of_text|>", "<|endofprompt|>"};
    std::mt19937 rng(20261202);
    for (int i = 0; i < 100; i++) {
        const size_t lengths[] = {1, 2, 3, 5, 8, 20, 60, 200};
        const size_t n = lengths[rng() % 8];
        std::string text;
        if (rng() % 5 == 0) {  // a run of one unit first: repeated spaces, digits, emoji, special tokens
            const std::string& unit = alphabet[rng() % alphabet.size()];
            for (size_t r = 2 + rng() % 39; r > 0; r--) text += unit;
        }
        for (size_t k = 0; k < n; k++) text += alphabet[rng() % alphabet.size()];
        char name[32];
        std::snprintf(name, sizeof name, "random_%03d", i);
        cases.emplace_back(name, text);
    }
    for (const auto& [name, text] : cases) {
        std::ofstream out(dir + "/" + name + ".txt", std::ios::binary);
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        if (!out) llmc::fail(dir + "/" + name + ".txt: cannot write");
    }
}

int api(const std::string& tokenizer_json) {
    auto tok = llmc::load_hf_tokenizer(tokenizer_json);
    int failures = 0;
    auto expect = [&](bool ok, const std::string& what) {
        if (!ok) {
            std::printf("FAILED %s: %s\n", tokenizer_json.c_str(), what.c_str());
            failures++;
        }
    };
    const int n = tok->vocab_size();
    bool threw = false;
    try {
        tok->decode(std::vector<int>{n});
    } catch (const llmc::Error& e) {
        threw = std::string(e.what()).find(tokenizer_json) != std::string::npos;
    }
    expect(threw, "decode of id vocab_size() throws naming the file");
    threw = false;
    try {
        tok->token_bytes(-1);
    } catch (const llmc::Error&) {
        threw = true;
    }
    expect(threw, "token_bytes(-1) throws");
    // Every id is either assigned or refused.
    const auto& hf = dynamic_cast<const llmc::HfTokenizer&>(*tok);
    int unassigned = 0;
    for (int id = 0; id < n; id++) {
        if (hf.is_assigned(id)) continue;
        unassigned++;
        threw = false;
        try {
            tok->token_bytes(id);
        } catch (const llmc::Error&) {
            threw = true;
        }
        expect(threw, "token_bytes of unassigned id " + std::to_string(id) + " throws");
    }
    const std::string text = "Hello world, this is a test of clones on threads. 1234 日本語 🙂";
    std::vector<int> reference;
    tok->encode(text, reference);
    expect(tok->decode(reference) == text, "round trip");
    if (tok->eos_token()) {
        std::vector<int> ids;
        tok->encode(tok->token_bytes(*tok->eos_token()), ids);
        expect(ids == std::vector<int>{*tok->eos_token()}, "the EOS text encodes to the EOS id");
    }
    std::vector<std::vector<int>> results(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&, t, clone = tok->clone()] {
            for (int rep = 0; rep < 200; rep++) {
                results[t].clear();
                clone->encode(text, results[t]);
            }
        });
    for (auto& th : threads) th.join();
    for (const auto& r : results) expect(r == reference, "a clone on another thread encodes identically");
    std::printf("%s: vocab_size %d (%d unassigned), eos %s, %zu-token probe, clones agree: %s\n",
                tokenizer_json.c_str(), n, unassigned,
                tok->eos_token() ? std::to_string(*tok->eos_token()).c_str() : "none", reference.size(),
                failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}

int run(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "compare" && argc >= 5 && std::strcmp(argv[2], "--nfc") == 0)
        return compare(true, argv[3], argv[4], std::vector<std::string>(argv + 5, argv + argc));
    if (mode == "compare" && argc >= 4)
        return compare(false, argv[2], argv[3], std::vector<std::string>(argv + 4, argv + argc));
    if (mode == "write-cases" && argc == 3) {
        write_cases(argv[2]);
        return 0;
    }
    if (mode == "load" && argc == 3) {
        auto tok = llmc::load_hf_tokenizer(argv[2]);
        std::printf("%s: vocab_size %d\n", argv[2], tok->vocab_size());
        return 0;
    }
    if (mode == "api" && argc == 3) return api(argv[2]);
    std::fprintf(stderr,
                 "usage: check_hf_tokenizer compare TOKENIZER.json ORACLE.jsonl FILE... | write-cases DIR | "
                 "load TOKENIZER.json | api TOKENIZER.json\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
