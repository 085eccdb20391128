// Benchmark of the data loader: tokens/s of DataLoader::next_batch on llm.c shards and on OLMo token files of
// uint16 and uint32, shuffled (what training reads: an instance or window at a random offset) and in order (what
// validation reads), from the page cache and cold. Reading must not slow training: a GPU eats about 0.4-0.5M
// tokens/s of GPT-2 124M (467k on an H100), so the loader should be far above that. Before each cold pass every
// file is synced and dropped from the page cache (posix_fadvise POSIX_FADV_DONTNEED), and mincore says how much of
// it is still resident, so the output states whether the drop worked (it does not on every file system).
//
//   build/bench/bench_dataloader [--dir DIR] [--mb N] [-B 16] [-T 1024] [--files N] [--keep]
//   build/bench/bench_dataloader --data 'GLOB or @LIST' [--data_format F] [--memmap_dtype D] [-B 16] [-T 1024]
//
// The files (N MB of random ids per format, in --files files) are generated in DIR (default
// /tmp/llmc_bench_dataloader) unless they are there already, and removed at the end unless --keep; --data times
// given files instead (never removed).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/token_files.h"
#include "llmc/data/token_shard.h"

namespace {

constexpr int kVocab = 50257;

struct Options {
    std::string dir = "/tmp/llmc_bench_dataloader";
    size_t mb = 256, files = 4;
    int B = 16, T = 1024;
    bool keep = false;
    std::string data;  // given files instead of generated ones
    llmc::DataFormat format = llmc::DataFormat::auto_detect;
    llmc::TokenDtype dtype = llmc::TokenDtype::uint16;
};

// One set of files timed: generated (a format of each) or given.
struct Set {
    std::string name, spec;
    llmc::DataFormat format;
    llmc::TokenDtype dtype;
    std::vector<std::string> paths;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Set generated_set(const Options& o, const char* name, llmc::DataFormat format, llmc::TokenDtype dtype) {
    const char* ext = format == llmc::DataFormat::llmc ? ".bin" : ".npy";
    Set set{name, o.dir + "/" + name + "_*" + ext, format, dtype, {}};
    for (size_t i = 0; i < o.files; i++) set.paths.push_back(o.dir + "/" + name + "_" + std::to_string(i) + ext);
    return set;
}

// Writes the set's files of random ids below the GPT-2 vocabulary (skipped when present at the right size).
void generate(const Options& o, const Set& f) {
    const size_t bytes_per_file = o.mb * 1000000 / o.files, item = llmc::token_dtype_bytes(f.dtype);
    const size_t tokens = (f.format == llmc::DataFormat::llmc ? bytes_per_file - llmc::kHeaderBytes : bytes_per_file) /
                          item;
    for (size_t i = 0; i < f.paths.size(); i++) {
        const std::string& path = f.paths[i];
        const size_t want = (f.format == llmc::DataFormat::llmc ? llmc::kHeaderBytes : 0) + tokens * item;
        std::error_code ec;
        if (std::filesystem::file_size(path, ec) == want && !ec) continue;
        llmc::Rng rng(1000 + i);
        std::vector<uint32_t> ids(tokens);
        for (uint32_t& id : ids) id = static_cast<uint32_t>(rng.below(kVocab));
        if (f.format == llmc::DataFormat::llmc) {
            llmc::write_shard(path, std::vector<uint16_t>(ids.begin(), ids.end()));
        } else {
            llmc::write_olmo_file(path, ids, f.dtype);
        }
    }
}

// The share of the files' pages in the page cache (mincore on a mapping of each), in [0, 1].
double resident_share(const Set& f) {
    size_t pages = 0, resident = 0;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (const std::string& path : f.paths) {
        const int fd = open(path.c_str(), O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) llmc::fail(path + ": cannot open");
        const size_t n = (static_cast<size_t>(st.st_size) + page - 1) / page;
        void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
        std::vector<unsigned char> in(n);
        if (map == MAP_FAILED || mincore(map, static_cast<size_t>(st.st_size), in.data()) != 0)
            llmc::fail(path + ": mincore failed");
        for (const unsigned char c : in) resident += c & 1;
        pages += n;
        munmap(map, static_cast<size_t>(st.st_size));
        close(fd);
    }
    return pages ? static_cast<double>(resident) / pages : 0.0;
}

void drop_from_cache(const Set& f) {
    for (const std::string& path : f.paths) {
        const int fd = open(path.c_str(), O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);  // dirty pages are not dropped
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

// Reads the whole set once through the page cache (cat > /dev/null).
void warm(const Set& f) {
    std::vector<char> buffer(1 << 20);
    for (const std::string& path : f.paths) {
        const int fd = open(path.c_str(), O_RDONLY);
        while (fd >= 0 && read(fd, buffer.data(), buffer.size()) > 0) {}
        if (fd >= 0) close(fd);
    }
}

// One epoch of next_batch; returns tokens/s (the tokens of the inputs handed out).
double epoch_rate(const Options& o, const Set& f, bool shuffle) {
    llmc::DataLoader dl(f.spec, o.B, o.T, 0, 1, shuffle, 1337, INT32_MAX, f.format, f.dtype);
    const size_t n = static_cast<size_t>(o.B) * o.T;
    std::vector<int> x(n), y(n);
    const uint64_t batches = dl.groups_per_epoch();
    const double start = now();
    for (uint64_t i = 0; i < batches; i++) dl.next_batch(x, y);
    return static_cast<double>(batches * n) / (now() - start);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const auto value = [&]() -> std::string {
            LLMC_CHECK(i + 1 < argc, a + ": missing value");
            return argv[++i];
        };
        if (a == "--dir") o.dir = value();
        else if (a == "--mb") o.mb = std::stoul(value());
        else if (a == "--files") o.files = std::stoul(value());
        else if (a == "-B") o.B = std::stoi(value());
        else if (a == "-T") o.T = std::stoi(value());
        else if (a == "--keep") o.keep = true;
        else if (a == "--data") o.data = value();
        else if (a == "--data_format") o.format = llmc::parse_data_format(value(), a);
        else if (a == "--memmap_dtype") o.dtype = llmc::parse_token_dtype(value(), a);
        else llmc::fail(a + ": unknown flag (--dir DIR --mb N --files N -B N -T N --keep, or --data SPEC "
                            "--data_format F --memmap_dtype D)");
    }
    LLMC_CHECK(o.mb > 0 && o.files > 0 && o.B > 0 && o.T > 0, "bench_dataloader: sizes must be > 0");
    return o;
}

int run(const Options& o) {
    std::vector<Set> sets;
    if (o.data.empty()) {
        llmc::make_dirs(o.dir);
        sets = {generated_set(o, "llmc", llmc::DataFormat::llmc, llmc::TokenDtype::uint16),
                generated_set(o, "olmo_uint16", llmc::DataFormat::olmo, llmc::TokenDtype::uint16),
                generated_set(o, "olmo_uint32", llmc::DataFormat::olmo, llmc::TokenDtype::uint32)};
        std::printf("bench_dataloader: %zu MB per format in %zu files under %s", o.mb, o.files, o.dir.c_str());
    } else {
        const std::vector<std::string> paths = llmc::data_files(o.data);
        const llmc::DataFormat format = llmc::resolve_data_format(paths, o.format, o.data);
        sets = {{llmc::data_format_name(format), o.data, format, o.dtype, paths}};
        std::printf("bench_dataloader: %s (%zu files)", o.data.c_str(), paths.size());
    }
    std::printf(", B=%d T=%d, one rank; M tokens/s of next_batch over one epoch\n", o.B, o.T);
    std::printf("%-12s %-9s %10s %10s  %s\n", "format", "order", "cached", "cold", "page cache before the cold pass");
    for (const Set& f : sets) {
        if (o.data.empty()) generate(o, f);
        for (const bool shuffle : {true, false}) {
            warm(f);
            const double warm_share = resident_share(f);
            const double cached = epoch_rate(o, f, shuffle);
            drop_from_cache(f);
            const double dropped = resident_share(f);
            const double cold = epoch_rate(o, f, shuffle);
            std::printf("%-12s %-9s %10.1f %10.1f  %.0f%% resident warm, %.0f%% after the drop%s\n", f.name.c_str(),
                        shuffle ? "shuffled" : "in order", cached / 1e6, cold / 1e6, 100 * warm_share, 100 * dropped,
                        dropped > 0.05 ? " (the drop did not work: the cold figure is not cold)" : "");
            std::fflush(stdout);
        }
        if (o.data.empty() && !o.keep)
            for (const std::string& path : f.paths) std::filesystem::remove(path);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse(n, args)); });
}
