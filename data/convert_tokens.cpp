// convert_tokens: converts token files between llm.c's shards and OLMo's memmap token files, both ways, so that
// either trainer's data can be read by the other's tools (OLMo's np.memmap readers, llm.c's loaders) and so that
// data prepared once serves both. The tokens are copied unchanged: a round trip gives the same bytes. Each output
// file is written atomically (a killed run leaves no half-written file).
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/tool_flags.h"
#include "llmc/data/token_files.h"
#include "llmc/data/token_shard.h"

namespace {

constexpr const char* kUsage = R"(usage: convert_tokens --to olmo|llmc --out-dir DIR [options] INPUT...

Converts token files between llm.c shards (a 1024-byte header, uint16 ids) and OLMo token files (raw
little-endian ids, no header, read by OLMo with np.memmap). Each INPUT is a file, a glob or @FILE (a list of
paths, one a line); its format is told by its header (llm.c shards start with the magic 20240520).

  --to olmo          llm.c shards -> OLMo files: DIR/NAME.npy for each NAME.bin (the shard's tokens, in order)
  --to llmc          OLMo files -> llm.c shards: DIR/NAME.bin for each NAME.npy (or NAME_000000.bin,
                     NAME_000001.bin, ... when it holds more than --shard-tokens tokens); ids of 65536 and
                     above do not fit a shard and stop the run
  --memmap-dtype D   the ids' type of the OLMo files written (--to olmo) or read (--to llmc): uint8, uint16,
                     uint32 or uint64 (default uint16)
  --shard-tokens N   most tokens per llm.c shard written (default 100000000)
  --out-dir DIR      where the files go (created if missing)
  --help             print this help

A round trip (llm.c -> OLMo -> llm.c with the same dtype) gives back the same bytes.
)";

struct Options {
    llmc::DataFormat to = llmc::DataFormat::auto_detect;  // auto: not given
    llmc::TokenDtype dtype = llmc::TokenDtype::uint16;
    uint64_t shard_tokens = 100'000'000;
    std::string out_dir;
    std::vector<std::string> inputs;
};

Options parse_args(int argc, char** argv) {
    Options o;
    const auto valued = {"to", "memmap_dtype", "shard_tokens", "out_dir"};
    llmc::for_each_flag(argc, argv, kUsage, {}, valued,
                        [&](const std::string& key, const std::string& flag, const std::string& value) {
        if (key == "to") {
            o.to = llmc::parse_data_format(value, flag);
            LLMC_CHECK(o.to != llmc::DataFormat::auto_detect, flag + ": expected olmo or llmc, got 'auto'");
        } else if (key == "memmap_dtype") {
            o.dtype = llmc::parse_token_dtype(value, flag);
        } else if (key == "shard_tokens") {
            o.shard_tokens = static_cast<uint64_t>(llmc::flag_integer(flag, value, 1, INT32_MAX));
        } else if (key == "out_dir") {
            o.out_dir = value;
        }
    }, [&](const std::string& path) { o.inputs.push_back(path); });
    LLMC_CHECK(o.to != llmc::DataFormat::auto_detect, "--to olmo|llmc is required (see --help)");
    LLMC_CHECK(!o.out_dir.empty(), "--out-dir is required (see --help)");
    LLMC_CHECK(!o.inputs.empty(), "no input files given (see --help)");
    return o;
}

// NAME of DIR/NAME.ext (any extension dropped).
std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

// Refuses an output that would overwrite its input (an OLMo file named *.bin converted in its own directory) or an
// output of another input (two inputs of the same name in different directories).
void claim_output(const std::string& input, const std::string& output, std::set<std::string>& written) {
    std::error_code ec;
    LLMC_CHECK(!std::filesystem::equivalent(input, output, ec), output + ": would overwrite its input " + input);
    LLMC_CHECK(written.insert(output).second, output + ": two inputs convert to this file (" + input +
                                                  " is the second); convert them into different --out-dir");
}

// One llm.c shard -> one OLMo file of o.dtype.
uint64_t shard_to_olmo(const std::string& input, const std::string& output, const Options& o) {
    const size_t tokens = llmc::read_shard_header(input);
    llmc::TokenReader reader(input, llmc::kHeaderBytes, llmc::TokenDtype::uint16);
    llmc::AtomicFile out(output);
    std::vector<int> ids;
    std::vector<uint32_t> chunk;
    std::vector<std::byte> bytes;
    constexpr size_t kChunk = 1 << 22;
    for (size_t done = 0; done < tokens; done += kChunk) {
        ids.resize(std::min(kChunk, tokens - done));
        reader.read(done, ids, 65536);
        chunk.assign(ids.begin(), ids.end());
        bytes.clear();
        llmc::append_token_bytes(chunk, o.dtype, input, done, bytes);
        out.write(bytes.data(), bytes.size());
    }
    out.commit();
    return tokens;
}

// One OLMo file -> llm.c shards of at most o.shard_tokens tokens; returns the shards written.
std::vector<std::string> olmo_to_shards(const std::string& input, const Options& o, std::set<std::string>& written) {
    const size_t tokens = llmc::olmo_file_tokens(input, o.dtype);
    const size_t pieces = (tokens + o.shard_tokens - 1) / o.shard_tokens;
    llmc::TokenReader reader(input, 0, o.dtype);
    std::vector<std::string> outputs;
    std::vector<int> ids;
    std::vector<uint16_t> shard;
    for (size_t piece = 0; piece < pieces; piece++) {
        char suffix[32] = "";
        if (pieces > 1) std::snprintf(suffix, sizeof suffix, "_%06zu", piece);
        const std::string output = o.out_dir + "/" + stem(input) + suffix + ".bin";
        claim_output(input, output, written);
        const size_t first = piece * o.shard_tokens, count = std::min<size_t>(o.shard_tokens, tokens - first);
        ids.resize(count);
        reader.read(first, ids, INT32_MAX);
        shard.resize(count);
        for (size_t i = 0; i < count; i++) {
            LLMC_CHECK(ids[i] <= 65535, input + ": token id " + std::to_string(ids[i]) + " at position " +
                                            std::to_string(first + i) +
                                            " does not fit llm.c's uint16 shards (keep these as OLMo files)");
            shard[i] = static_cast<uint16_t>(ids[i]);
        }
        llmc::write_shard(output, shard);
        outputs.push_back(output);
    }
    return outputs;
}

int run(const Options& o) {
    std::vector<std::string> inputs;
    for (const std::string& spec : o.inputs)
        for (std::string& path : llmc::data_files(spec)) inputs.push_back(std::move(path));
    llmc::make_dirs(o.out_dir);
    std::set<std::string> written;
    for (const std::string& input : inputs) {
        const bool shard = llmc::has_shard_magic(input);
        if (o.to == llmc::DataFormat::olmo) {
            LLMC_CHECK(shard, input + ": not an llm.c shard (no magic 20240520): already an OLMo token file?");
            const std::string output = o.out_dir + "/" + stem(input) + ".npy";
            claim_output(input, output, written);
            const uint64_t tokens = shard_to_olmo(input, output, o);
            std::printf("wrote %s (%llu tokens, %s)\n", output.c_str(), static_cast<unsigned long long>(tokens),
                        llmc::token_dtype_name(o.dtype));
        } else {
            LLMC_CHECK(!shard, input + ": already an llm.c shard (it starts with the magic 20240520)");
            for (const std::string& output : olmo_to_shards(input, o, written))
                std::printf("wrote %s (%zu tokens)\n", output.c_str(), llmc::read_shard_header(output));
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse_args(n, args)); });
}
