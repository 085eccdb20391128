// Benchmark of the Hugging Face tokenizer.json encoder (llmc/data/hf_tokenizer.h) on one thread: load time, then
// encode throughput over a corpus (default: the default corpus, data/cache/docs/documents.txt), first with a fresh
// tokenizer (empty word cache, what one pass of data prep sees, and what dev/bench/bench_hf_tokenizer.sh compares
// with Hugging Face's JavaScript tokenizers, which also start each run cold) and then again with the cache warm.
// Files are read before timing; encode calls only are timed.
//
//   build/bench/bench_hf_tokenizer [--file-list LIST] TOKENIZER.json...
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/hf_tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// This thread's CPU seconds: on a shared machine, less disturbed by other jobs than the wall time.
double thread_cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int run(int argc, char** argv) {
    std::string list = "data/cache/docs/documents.txt";
    std::vector<std::string> tokenizers;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--file-list") == 0 && i + 1 < argc) list = argv[++i];
        else if (argv[i][0] == '-') llmc::fail(std::string("unknown flag ") + argv[i]);
        else tokenizers.push_back(argv[i]);
    }
    LLMC_CHECK(!tokenizers.empty(), "usage: bench_hf_tokenizer [--file-list LIST] TOKENIZER.json...");
    const std::vector<std::byte> list_bytes = llmc::read_whole_file(list);
    std::vector<std::string> texts;
    size_t bytes = 0;
    std::string_view rest(reinterpret_cast<const char*>(list_bytes.data()), list_bytes.size());
    while (!rest.empty()) {
        const size_t nl = rest.find('\n');
        const std::string path(rest.substr(0, nl));
        rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
        if (path.empty()) continue;
        const std::vector<std::byte> raw = llmc::read_whole_file(path);
        texts.emplace_back(reinterpret_cast<const char*>(raw.data()), raw.size());
        bytes += raw.size();
    }
    LLMC_CHECK(!texts.empty(), list + ": no files");
    const double mb = bytes / 1e6;
    std::printf("%zu documents, %.2f MB, 1 thread\n", texts.size(), mb);
    std::vector<int> ids;
    for (const std::string& path : tokenizers) {
        auto start = std::chrono::steady_clock::now();
        auto tokenizer = llmc::load_hf_tokenizer(path);
        const double load_s = seconds_since(start);
        double pass_s[2], pass_cpu[2];
        size_t tokens = 0;
        for (int pass = 0; pass < 2; pass++) {
            tokens = 0;
            const double cpu_start = thread_cpu_seconds();
            start = std::chrono::steady_clock::now();
            for (const std::string& text : texts) {
                ids.clear();
                tokenizer->encode(text, ids);
                tokens += ids.size();
            }
            pass_s[pass] = seconds_since(start);
            pass_cpu[pass] = thread_cpu_seconds() - cpu_start;
        }
        std::printf("%s: load %.3f s; %zu tokens; cold cache %.3f s: %.2f MB/s, %.3f M tokens/s (CPU %.3f s); "
                    "warm cache %.3f s: %.2f MB/s, %.3f M tokens/s (CPU %.3f s)\n",
                    path.c_str(), load_s, tokens, pass_s[0], mb / pass_s[0], tokens / 1e6 / pass_s[0], pass_cpu[0],
                    pass_s[1], mb / pass_s[1], tokens / 1e6 / pass_s[1], pass_cpu[1]);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
