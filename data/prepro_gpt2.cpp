// prepro_gpt2: turns a corpus of text documents (a text file each, or a line each of a JSON Lines file, the form
// most public pretraining corpora come in, either of them plain, gzip or Zstandard) into llm.c token shards with
// the GPT-2 BPE or a Hugging Face tokenizer.json (--hf-tokenizer), plus the tokenizer the trainer uses to print
// samples, or into OLMo's token files (--out-format olmo: the same tokens and split, raw ids of --memmap-dtype, as
// OLMo's np.memmap reads them). The end-of-text token (GPT-2's 50256, or --eos-token-id) goes before every document; shard 0 is the validation split, the rest are training shards. Documents are
// encoded in parallel, but their tokens are written strictly in command-line order, so the output is identical for
// any --threads. Everything is written into a staging directory first and moved into --out-dir only once the whole
// corpus is encoded and checked, so a failed or killed run leaves the earlier dataset of that name as it was (never
// a mix of old and new shards).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llmc/base/byte_stream.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/base/json_lines.h"
#include "llmc/base/tool_flags.h"
#include "llmc/data/token_files.h"
#include "llmc/data/text_tokenizer.h"
#include "llmc/data/token_shard.h"
#include "llmc/data/tokenizer.h"

namespace {

constexpr const char* kUsage = R"(usage: prepro_gpt2 --encoder encoder.json --vocab vocab.bpe --out-dir DIR --name NAME [options] FILE...
       prepro_gpt2 --hf-tokenizer tokenizer.json --out-dir DIR --name NAME [options] FILE...

Tokenizes each FILE as one document with the GPT-2 BPE or a Hugging Face tokenizer.json (the end-of-text token
before each document: GPT-2's 50256, or --eos-token-id), except that a
FILE named *.jsonl or *.ndjson holds one document per line: each non-blank line is a JSON object whose
string field "text" (see --text-key) is the document. A FILE named *.gz (gzip) or *.zst (Zstandard) is
read decompressed, as what the rest of its name says (a.jsonl.zst: JSON Lines; a.txt.gz: one document);
concatenated members or frames read as one. Documents keep command-line order. Writes
  DIR/NAME_val_000000.bin       validation split (shard 0)
  DIR/NAME_train_000001.bin ... training shards of --shard-tokens tokens (the last one may be shorter)
  DIR/tokenizer.bin             llm.c tokenizer decode file (with --hf-tokenizer: DIR/tokenizer.json, a copy)
(with --out-format olmo: NAME_val_000000.npy, NAME_train_000001.npy, ... instead of the .bin shards).
Invalid UTF-8 in a document is replaced by U+FFFD (maximal-subpart rule, as any standard decoder does).
The files are written into DIR/.NAME.staging and moved into DIR at the end, replacing the earlier
NAME_*.bin shards (those it does not replace are removed); a failed run leaves DIR as it was.

options:
  --hf-tokenizer F   a Hugging Face tokenizer.json (byte-level BPE) instead of --encoder and --vocab; special
                     tokens written in the text become their ids, as Hugging Face's tokenizers encode them
  --eos-token-id N   the id put before each document (default: the tokenizer's <|endoftext|> or <|end_of_text|>)
  --shard-tokens N   tokens per training shard (default 100000000)
  --val-tokens N     validation split = exactly the first N tokens of the token stream (it may end mid-document).
                     Default: the first whole documents that together hold at least 1/20 of the input bytes
                     (at least one document, and at least one document is left for training).
  --threads N        encoding threads (default: number of CPUs)
  --file-list PATH   also read document paths from PATH, one per line (for corpora too big for a command line)
  --text-key KEY     the field of a JSON Lines object that holds the document (default "text")
  --out-format F     llmc (llm.c shards: a header, then uint16 ids; default) or olmo (OLMo's token files: raw
                     ids of --memmap-dtype, no header, no separator added beyond the EOT before each document)
  --memmap-dtype D   uint16 (default) or uint32, the ids' type of --out-format olmo; a tokenizer with ids of
                     65536 and above needs uint32 (llm.c shards cannot hold them)
  --help             print this help
)";

struct Options {
    std::string encoder_json, vocab_bpe, hf_tokenizer, out_dir, name;
    long long eos_token_id = -1;  // -1: the tokenizer's own
    size_t shard_tokens = 100'000'000;
    long long val_tokens = -1;  // -1: whole-document default split
    int threads = 0;
    std::string text_key = "text";
    std::vector<std::string> files;
    bool olmo = false;                                  // --out-format olmo
    llmc::TokenDtype dtype = llmc::TokenDtype::uint16;  // of the OLMo files, or llm.c's
};

bool is_json_lines(const std::string& path) {
    const std::string_view content = llmc::content_name(path);
    return content.ends_with(".jsonl") || content.ends_with(".ndjson");
}

bool is_compressed(const std::string& path) { return llmc::compression_of(path) != llmc::Compression::none; }

void read_file_list(const std::string& path, std::vector<std::string>& files) {
    const std::vector<std::byte> raw = llmc::read_whole_file(path, size_t(256) << 20);  // 256 MiB of paths
    std::string line;
    for (const std::byte b : raw) {
        const char c = static_cast<char>(b);
        if (c != '\n') {
            line += c;
            continue;
        }
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) files.push_back(line);
        line.clear();
    }
    if (!line.empty()) files.push_back(line);
}

Options parse_args(int argc, char** argv) {
    Options options;
    const auto valued = {"encoder",     "vocab",     "hf_tokenizer", "eos_token_id", "out_dir",     "name",
                         "shard_tokens", "val_tokens", "threads",      "file_list",    "text_key",   "out_format",
                         "memmap_dtype"};
    llmc::for_each_flag(argc, argv, kUsage, {}, valued,
                        [&](const std::string& key, const std::string& flag, const std::string& value) {
        if (key == "encoder") options.encoder_json = value;
        else if (key == "vocab") options.vocab_bpe = value;
        else if (key == "hf_tokenizer") options.hf_tokenizer = value;
        else if (key == "eos_token_id") options.eos_token_id = llmc::flag_integer(flag, value, 0, INT32_MAX);
        else if (key == "out_dir") options.out_dir = value;
        else if (key == "name") options.name = value;
        else if (key == "shard_tokens") options.shard_tokens = llmc::flag_integer(flag, value, 1, INT32_MAX);
        else if (key == "val_tokens") options.val_tokens = llmc::flag_integer(flag, value, 1, INT32_MAX);
        else if (key == "threads") options.threads = static_cast<int>(llmc::flag_integer(flag, value, 1, 1024));
        else if (key == "file_list") read_file_list(value, options.files);
        else if (key == "text_key") options.text_key = value;
        else if (key == "out_format") {
            LLMC_CHECK(value == "llmc" || value == "olmo", flag + ": expected llmc or olmo, got '" + value + "'");
            options.olmo = value == "olmo";
        } else if (key == "memmap_dtype") {
            LLMC_CHECK(value == "uint16" || value == "uint32",
                       flag + ": expected uint16 or uint32, got '" + value + "'");
            options.dtype = llmc::parse_token_dtype(value, flag);
        }
    }, [&](const std::string& path) { options.files.push_back(path); });
    if (options.hf_tokenizer.empty()) {
        LLMC_CHECK(!options.encoder_json.empty(), "--encoder is required (or --hf-tokenizer; see --help)");
        LLMC_CHECK(!options.vocab_bpe.empty(), "--vocab is required (or --hf-tokenizer; see --help)");
    } else {
        LLMC_CHECK(options.encoder_json.empty() && options.vocab_bpe.empty(),
                   "--hf-tokenizer excludes --encoder and --vocab (see --help)");
    }
    LLMC_CHECK(!options.out_dir.empty(), "--out-dir is required (see --help)");
    LLMC_CHECK(!options.name.empty() && options.name.find('/') == std::string::npos,
               "--name is required and must not contain '/' (see --help)");
    LLMC_CHECK(!options.files.empty(), "no input documents given (see --help)");
    if (options.threads == 0) options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return options;
}

// Hidden, so that the trainer's NAME_train_*.bin glob never matches a file in it.
std::string staging_dir(const Options& options) { return options.out_dir + "/." + options.name + ".staging"; }

std::string shard_name(const Options& options, bool val, size_t index) {
    char number[16];
    std::snprintf(number, sizeof number, "%06zu", index);
    return options.name + (val ? "_val_" : "_train_") + number + (options.olmo ? ".npy" : ".bin");
}

// Removes the staging directory unless the run published it (an error leaves --out-dir untouched).
class StagingGuard {
public:
    explicit StagingGuard(std::string dir) : dir_(std::move(dir)) {}
    ~StagingGuard() {
        std::error_code ignored;
        if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
    }
    void release() { dir_.clear(); }

private:
    std::string dir_;
};

// Receives documents' tokens in order and cuts them into the validation shard and training shards.
class ShardSink {
public:
    ShardSink(const Options& options, size_t val_documents) : options_(options), val_documents_(val_documents) {}

    void add_document(size_t document_index, std::vector<uint32_t>& tokens) {
        size_t taken = 0;
        if (!val_written_) {
            if (options_.val_tokens < 0) {
                taken = tokens.size();
            } else {
                taken = std::min(tokens.size(), static_cast<size_t>(options_.val_tokens) - val_.size());
            }
            val_.insert(val_.end(), tokens.begin(), tokens.begin() + static_cast<long>(taken));
            const bool val_full = options_.val_tokens < 0 ? document_index + 1 == val_documents_
                                                          : val_.size() == static_cast<size_t>(options_.val_tokens);
            if (val_full) write_val();
        }
        train_.insert(train_.end(), tokens.begin() + static_cast<long>(taken), tokens.end());
        size_t start = 0;
        while (train_.size() - start >= options_.shard_tokens) {
            write_train(std::span<const uint32_t>(train_).subspan(start, options_.shard_tokens));
            start += options_.shard_tokens;
        }
        train_.erase(train_.begin(), train_.begin() + static_cast<long>(start));
    }

    void finish(size_t total_tokens) {
        LLMC_CHECK(val_written_, "the corpus has only " + std::to_string(total_tokens) +
                                     " tokens, not enough for --val-tokens " + std::to_string(options_.val_tokens));
        if (!train_.empty()) write_train(train_);
        LLMC_CHECK(train_tokens_ > 0, "no tokens left for training after the validation split (" +
                                          std::to_string(val_tokens_) + " tokens); lower --val-tokens");
        publish();
    }

    size_t val_tokens() const { return val_tokens_; }
    size_t train_tokens() const { return train_tokens_; }
    size_t train_shards() const { return train_shards_; }

private:
    void write_val() {
        const std::string name = shard_name(options_, true, 0);
        write_file(staging_dir(options_) + "/" + name, val_);
        std::printf("wrote %s/%s (%zu tokens)\n", options_.out_dir.c_str(), name.c_str(), val_.size());
        val_tokens_ = val_.size();
        val_written_ = true;
        std::vector<uint32_t>().swap(val_);
    }
    // The ids fit the output's type: the encoding threads checked them.
    void write_file(const std::string& path, std::span<const uint32_t> tokens) {
        if (options_.olmo) return llmc::write_olmo_file(path, tokens, options_.dtype);
        const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
        llmc::write_shard(path, narrow);
    }
    void write_train(std::span<const uint32_t> tokens) {
        const std::string name = shard_name(options_, false, ++train_shards_);
        write_file(staging_dir(options_) + "/" + name, tokens);
        std::printf("wrote %s/%s (%zu tokens)\n", options_.out_dir.c_str(), name.c_str(), tokens.size());
        std::fflush(stdout);
        train_tokens_ += tokens.size();
    }
    // The earlier NAME_train_/NAME_val_ shards that this run's do not replace: a rerun that yields fewer
    // shards must not leave older ones behind for the data loader's glob to find.
    void remove_stale_shards() {
        for (const bool val : {false, true}) {
            const std::string prefix = options_.name + (val ? "_val_" : "_train_");
            for (const auto& entry : std::filesystem::directory_iterator(options_.out_dir)) {
                const std::string file = entry.path().filename().string();
                if (!file.starts_with(prefix) || !file.ends_with(options_.olmo ? ".npy" : ".bin")) continue;
                const std::string number = file.substr(prefix.size(), file.size() - prefix.size() - 4);
                if (number.size() != 6 || number.find_first_not_of("0123456789") != std::string::npos) continue;
                const unsigned long n = std::stoul(number);
                if (val ? n != 0 : n > train_shards_) {
                    std::filesystem::remove(entry.path());
                    std::printf("removed stale %s\n", entry.path().c_str());
                }
            }
        }
    }
    // Moves the staged files into --out-dir: the stale shards go first, then each file by an atomic rename.
    void publish() {
        remove_stale_shards();
        const std::string staging = staging_dir(options_);
        auto move_in = [&](const std::string& name) {
            const std::string from = staging + "/" + name, to = options_.out_dir + "/" + name;
            LLMC_CHECK(std::rename(from.c_str(), to.c_str()) == 0,
                       to + ": cannot move the new file into place (" + std::strerror(errno) + ")");
        };
        // a dataset has one tokenizer file: the other kind, left by an earlier run, would contradict it
        const bool json = !options_.hf_tokenizer.empty();
        std::filesystem::remove(options_.out_dir + (json ? "/tokenizer.bin" : "/tokenizer.json"));
        move_in(json ? "tokenizer.json" : "tokenizer.bin");
        move_in(shard_name(options_, true, 0));
        for (size_t i = 1; i <= train_shards_; i++) move_in(shard_name(options_, false, i));
        std::filesystem::remove(staging);
    }

    const Options& options_;
    const size_t val_documents_;
    std::vector<uint32_t> val_, train_;
    bool val_written_ = false;
    size_t val_tokens_ = 0, train_tokens_ = 0, train_shards_ = 0;
};

// The tokenizer beside the shards, for the trainers' samples: GPT-2's as llm.c's decode file, a tokenizer.json
// copied as it is (its tokens need not fit the decode file's 1..255 bytes).
void write_tokenizer(const Options& options, const llmc::TextTokenizer& tokenizer, int eos, const std::string& staging) {
    if (options.hf_tokenizer.empty()) {
        std::vector<std::string> bytes;
        for (int id = 0; id < tokenizer.vocab_size(); id++) bytes.push_back(tokenizer.token_bytes(id));
        return llmc::write_tokenizer_file(staging + "/tokenizer.bin", bytes, eos);
    }
    const std::vector<std::byte> json = llmc::read_whole_file(options.hf_tokenizer);
    llmc::AtomicFile out(staging + "/tokenizer.json");
    out.write(json.data(), json.size());
    out.commit();
}

size_t regular_file_size(const std::string& path) {
    struct stat st;
    LLMC_CHECK(stat(path.c_str(), &st) == 0, path + ": cannot open (" + std::strerror(errno) + ")");
    LLMC_CHECK(S_ISREG(st.st_mode), path + ": not a regular file");
    return static_cast<size_t>(st.st_size);
}

// A compressed file's decompressed size (read through once; gzip's own size field is modulo 4 GiB).
size_t content_size(const std::string& path) {
    llmc::ByteStream stream(path);
    std::vector<char> buffer(1u << 20);
    while (stream.read(buffer.data(), buffer.size()) > 0) {}
    return static_cast<size_t>(stream.position());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One document: a whole text file, or the bytes of one line of a JSON Lines file. Sizes and offsets are of the
// decompressed content.
struct Document {
    uint32_t file;    // index into Options::files
    uint32_t bytes;   // of the file, or of the line's JSON
    uint64_t offset;  // of the line in its file (0 for a text file)
    uint64_t line;    // 1-based line number in a JSON Lines file (0 for a text file)
};

// Appends one Document per non-blank line of a JSON Lines file. Only the line breaks are read here; the JSON is
// parsed by the encoding threads.
void index_json_lines(const std::string& path, uint32_t file, std::vector<Document>& documents) {
    llmc::ByteStream stream(path);
    std::vector<char> buffer(1u << 20);
    uint64_t position = 0, line_start = 0, line = 1;
    bool blank = true;
    const auto end_line = [&](uint64_t end) {
        LLMC_CHECK(end - line_start <= UINT32_MAX, path + ":" + std::to_string(line) + ": a line of 4 GiB or more");
        if (!blank) documents.push_back({file, static_cast<uint32_t>(end - line_start), line_start, line});
    };
    for (size_t n; (n = stream.read(buffer.data(), buffer.size())) > 0; position += n) {
        for (size_t i = 0; i < n; i++) {
            const char c = buffer[i];
            if (c == '\n') {
                end_line(position + i);
                line_start = position + i + 1;
                line++;
                blank = true;
            } else if (blank && !llmc::is_blank_char(c)) {
                blank = false;
            }
        }
    }
    end_line(position);
}

// The bytes of a compressed file's content, read in order: the lines of compressed JSON Lines files, which cannot be
// read at an offset as plain ones are. The main thread reads each batch's lines with it before the encoding threads
// start on them (decompressing is 4-10x faster than encoding).
class CompressedLines {
public:
    explicit CompressedLines(const Options& options) : options_(options) {}

    void read(const Document& document, std::string& line) {
        if (!stream_ || file_ != document.file) {
            stream_ = std::make_unique<llmc::ByteStream>(options_.files[document.file]);
            file_ = document.file;
        }
        LLMC_CHECK(document.offset >= stream_->position(), "prepro_gpt2: documents out of order (a bug)");
        stream_->skip(document.offset - stream_->position());
        line.resize(document.bytes);
        for (size_t done = 0; done < document.bytes;) {
            const size_t n = stream_->read(line.data() + done, document.bytes - done);
            LLMC_CHECK(n > 0, stream_->path() + ": the content ends inside line " + std::to_string(document.line) +
                                  " (did the file change while being read?)");
            done += n;
        }
    }

private:
    const Options& options_;
    std::unique_ptr<llmc::ByteStream> stream_;
    uint32_t file_ = 0;
};

// Reads documents' text for one encoding thread; keeps the last JSON Lines file open, since its lines come in order.
class DocumentReader {
public:
    explicit DocumentReader(const Options& options) : options_(options) {}
    DocumentReader(const DocumentReader&) = delete;
    DocumentReader& operator=(const DocumentReader&) = delete;
    ~DocumentReader() {
        if (fd_ >= 0) ::close(fd_);
    }

    // The document's text, valid until the next call. A compressed JSON Lines file's line comes read already.
    std::string_view read(const Document& document, const std::string& compressed_line) {
        const std::string& path = options_.files[document.file];
        if (document.line == 0 && is_compressed(path)) {
            text_ = llmc::read_all_content(path);
            return text_;
        }
        if (document.line == 0) {
            raw_ = llmc::read_whole_file(path);
            return {reinterpret_cast<const char*>(raw_.data()), raw_.size()};
        }
        const std::string where = path + ":" + std::to_string(document.line);
        if (!is_compressed(path)) read_span(path, document.offset, document.bytes);
        const std::string& line = is_compressed(path) ? compressed_line : line_;
        nlohmann::json object = llmc::parse_json_object(line, where);
        const auto field = object.find(options_.text_key);
        LLMC_CHECK(field != object.end() && field->is_string(),
                   where + ": no string field '" + options_.text_key + "' (see --text-key)");
        text_ = std::move(field->get_ref<std::string&>());
        return text_;
    }

private:
    void read_span(const std::string& path, uint64_t offset, uint32_t bytes) {
        if (fd_file_ != path) {
            if (fd_ >= 0) ::close(fd_);
            fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            LLMC_CHECK(fd_ >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
            fd_file_ = path;
        }
        line_.resize(bytes);
        for (size_t done = 0; done < bytes;) {
            const ssize_t n = ::pread(fd_, line_.data() + done, bytes - done, static_cast<off_t>(offset + done));
            LLMC_CHECK(n > 0, path + ": " + (n == 0 ? std::string("the file shrank while being read")
                                                     : "read error (" + std::string(std::strerror(errno)) + ")"));
            done += static_cast<size_t>(n);
        }
    }

    const Options& options_;
    int fd_ = -1;
    std::string fd_file_;
    std::vector<std::byte> raw_;
    std::string line_, text_;
};

int run(const Options& options) {
    const auto start = std::chrono::steady_clock::now();
    LLMC_CHECK(options.files.size() <= UINT32_MAX, "more than 2^32 input files");
    std::vector<Document> documents;
    for (uint32_t file = 0; file < options.files.size(); file++) {
        const std::string& path = options.files[file];
        const size_t size = regular_file_size(path);
        if (is_json_lines(path)) {
            const size_t before = documents.size();
            index_json_lines(path, file, documents);
            LLMC_CHECK(documents.size() > before, path + ": no documents (every line is blank)");
        } else {
            const size_t bytes = is_compressed(path) ? content_size(path) : size;
            LLMC_CHECK(bytes <= UINT32_MAX, path + ": a document of 4 GiB or more");
            documents.push_back({file, static_cast<uint32_t>(bytes), 0, 0});
        }
    }
    const size_t n_docs = documents.size();
    size_t total_bytes = 0;
    for (const Document& d : documents) total_bytes += d.bytes;

    size_t val_documents = 0;
    if (options.val_tokens < 0) {
        if (n_docs == 1 && documents[0].line > 0) {  // a JSON Lines line: what is wrong with it comes first
            std::string line;
            if (is_compressed(options.files[documents[0].file])) CompressedLines(options).read(documents[0], line);
            DocumentReader(options).read(documents[0], line);
        }
        LLMC_CHECK(n_docs >= 2, "the default validation split needs at least 2 documents (one for each split); "
                                "pass --val-tokens N to split a single document");
        size_t covered = 0;
        while (val_documents < n_docs - 1 && (val_documents == 0 || covered * 20 < total_bytes))
            covered += documents[val_documents++].bytes;
    }

    const std::unique_ptr<llmc::TextTokenizer> tokenizer =
        llmc::load_text_tokenizer(options.hf_tokenizer, options.encoder_json, options.vocab_bpe);
    const int vocab_size = tokenizer->vocab_size();
    LLMC_CHECK(options.eos_token_id >= 0 || tokenizer->eos_token(),
               tokenizer->source() + ": names no end-of-text token; pass --eos-token-id");
    const int eos = options.eos_token_id >= 0 ? static_cast<int>(options.eos_token_id) : *tokenizer->eos_token();
    LLMC_CHECK(eos < vocab_size, "--eos-token-id " + std::to_string(eos) + " is not an id of " +
                                     tokenizer->source() + " (" + std::to_string(vocab_size) + " tokens)");
    // ids of 65536 and above fit only OLMo files of uint32: refused before hours of encoding, and each id is checked
    // again as it is encoded
    const uint64_t max_id = options.olmo ? llmc::token_dtype_max(options.dtype) : 65535;
    const std::string no_fit = std::string(" does not fit ") +
                               (options.olmo ? std::string("OLMo files' ") + llmc::token_dtype_name(options.dtype)
                                             : std::string("llm.c shards' uint16")) +
                               " ids; use " + (options.olmo ? "" : "--out-format olmo ") + "--memmap-dtype uint32";
    LLMC_CHECK(static_cast<uint64_t>(vocab_size) - 1 <= max_id,
               tokenizer->source() + ": " + std::to_string(vocab_size) + " tokens: id " +
                   std::to_string(vocab_size - 1) + no_fit);
    const double load_seconds = seconds_since(start);
    const auto encode_start = std::chrono::steady_clock::now();
    llmc::make_dirs(options.out_dir);
    const std::string staging = staging_dir(options);
    std::filesystem::remove_all(staging);  // left by a killed run
    llmc::make_dirs(staging);
    StagingGuard staging_guard(staging);
    write_tokenizer(options, *tokenizer, eos, staging);

    const size_t n_threads = std::min(static_cast<size_t>(options.threads), n_docs);
    std::vector<std::unique_ptr<llmc::TextTokenizer>> encoders;  // clones share the vocabulary, own their caches
    for (size_t t = 0; t < n_threads; t++) encoders.push_back(tokenizer->clone());
    ShardSink sink(options, val_documents);
    const auto eot = static_cast<uint32_t>(eos);
    // Batches bound the memory held by encoded-but-unwritten documents on large corpora.
    constexpr size_t kBatchBytes = 64u << 20;
    size_t total_tokens = 0;
    CompressedLines compressed_lines(options);
    for (size_t batch_begin = 0; batch_begin < n_docs;) {
        size_t batch_end = batch_begin, batch_bytes = 0;
        while (batch_end < n_docs &&
               (batch_end == batch_begin || batch_bytes + documents[batch_end].bytes <= kBatchBytes))
            batch_bytes += documents[batch_end++].bytes;
        std::vector<std::string> lines(batch_end - batch_begin);
        for (size_t doc = batch_begin; doc < batch_end; doc++) {
            const Document& document = documents[doc];
            if (document.line > 0 && is_compressed(options.files[document.file]))
                compressed_lines.read(document, lines[doc - batch_begin]);
        }
        std::vector<std::vector<uint32_t>> encoded(batch_end - batch_begin);
        std::atomic<size_t> next_doc{batch_begin};
        std::exception_ptr first_error;
        std::mutex error_mutex;
        auto worker = [&](llmc::TextTokenizer& encoder) {
            std::vector<int> ids;
            DocumentReader reader(options);
            try {
                for (size_t doc = next_doc++; doc < batch_end; doc = next_doc++) {
                    ids.clear();
                    encoder.encode(reader.read(documents[doc], lines[doc - batch_begin]), ids);
                    std::vector<uint32_t>& out = encoded[doc - batch_begin];
                    out.reserve(ids.size() + 1);
                    out.push_back(eot);
                    for (const int id : ids) {
                        LLMC_CHECK(static_cast<uint64_t>(id) <= max_id,
                                   options.files[documents[doc].file] + ": token id " + std::to_string(id) + no_fit);
                        out.push_back(static_cast<uint32_t>(id));
                    }
                }
            } catch (...) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (!first_error) first_error = std::current_exception();
                next_doc = batch_end;  // stop the other workers early
            }
        };
        std::vector<std::thread> threads;
        for (size_t t = 1; t < n_threads; t++) threads.emplace_back(worker, std::ref(*encoders[t]));
        worker(*encoders[0]);
        for (auto& thread : threads) thread.join();
        if (first_error) std::rethrow_exception(first_error);
        for (size_t doc = batch_begin; doc < batch_end; doc++) {
            std::vector<uint32_t>& tokens = encoded[doc - batch_begin];
            total_tokens += tokens.size();
            sink.add_document(doc, tokens);
            std::vector<uint32_t>().swap(tokens);
        }
        batch_begin = batch_end;
    }
    sink.finish(total_tokens);
    staging_guard.release();
    const double encode_seconds = seconds_since(encode_start);
    const double megabytes = static_cast<double>(total_bytes) / 1e6;
    std::printf("wrote %s/%s (%d tokens, end-of-text %d)\n", options.out_dir.c_str(),
                options.hf_tokenizer.empty() ? "tokenizer.bin" : "tokenizer.json", vocab_size, eos);
    std::printf("prepro_gpt2: %zu documents, %.2f MB -> %zu tokens (val %zu, train %zu in %zu %s); "
                "%.3f s with %zu threads: %.1f MB/s, %.2f M tokens/s (+ %.3f s loading the vocabulary)\n",
                n_docs, megabytes, total_tokens, sink.val_tokens(), sink.train_tokens(), sink.train_shards(),
                sink.train_shards() == 1 ? "shard" : "shards",
                encode_seconds, n_threads, megabytes / encode_seconds,
                static_cast<double>(total_tokens) / 1e6 / encode_seconds, load_seconds);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return llmc::main_reporting_errors(argc, argv, [](int n, char** args) { return run(parse_args(n, args)); });
}
