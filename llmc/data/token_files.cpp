// Naming, telling apart and reading token files of either format (see token_files.h).
#include "llmc/data/token_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/token_shard.h"

namespace llmc {

namespace {

constexpr const char* kFormatNames[] = {"auto", "llmc", "olmo"};
constexpr const char* kDtypeNames[] = {"uint8", "uint16", "uint32", "uint64"};

std::string choices_of(std::span<const char* const> names) {
    std::string s;
    for (const char* n : names) s += std::string(s.empty() ? "" : ", ") + n;
    return s;
}

// Little-endian `T` items at `bytes` to int, with the largest id seen (a max-reduction vectorises; the first
// offending position is looked for only when the maximum is out of range).
template <class T>
uint64_t convert(const std::byte* bytes, std::span<int> out) {
    T max = 0;
    for (size_t i = 0; i < out.size(); i++) {
        T v;
        std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
        max = std::max(max, v);
        out[i] = static_cast<int>(v);
    }
    return max;
}
template <class T>
uint64_t item_at(const std::byte* bytes, size_t i) {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    return v;
}

}  // namespace

const char* data_format_name(DataFormat format) { return kFormatNames[static_cast<int>(format)]; }
const char* token_dtype_name(TokenDtype dtype) { return kDtypeNames[static_cast<int>(dtype)]; }
size_t token_dtype_bytes(TokenDtype dtype) { return size_t{1} << static_cast<int>(dtype); }
uint64_t token_dtype_max(TokenDtype dtype) {
    return dtype == TokenDtype::uint64 ? UINT64_MAX : (uint64_t{1} << (8 * token_dtype_bytes(dtype))) - 1;
}

DataFormat parse_data_format(const std::string& name, const std::string& where) {
    for (int i = 0; i < 3; i++)
        if (name == kFormatNames[i]) return static_cast<DataFormat>(i);
    fail(where + ": '" + name + "' is not a data format (" + choices_of(kFormatNames) + ")");
}

TokenDtype parse_token_dtype(const std::string& name, const std::string& where) {
    for (int i = 0; i < 4; i++)
        if (name == kDtypeNames[i]) return static_cast<TokenDtype>(i);
    fail(where + ": '" + name + "' is not a token dtype (" + choices_of(kDtypeNames) + ")");
}

std::vector<std::string> data_files(const std::string& spec) {
    if (!spec.starts_with('@')) return glob_files(spec);
    const std::string list = spec.substr(1);
    const std::vector<std::byte> raw = read_whole_file(list, size_t(256) << 20);  // 256 MiB of paths
    const size_t slash = list.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "" : list.substr(0, slash + 1);
    std::vector<std::string> files;
    const std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
    for (size_t start = 0; start < text.size();) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(start, end - start);
        start = end + 1;
        while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
        while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
        if (line.empty() || line.front() == '#') continue;
        const std::string path = line.front() == '/' ? std::string(line) : dir + std::string(line);
        if (path.find_first_of("*?[") == std::string::npos) {
            files.push_back(path);
        } else {
            for (std::string& p : glob_files(path)) files.push_back(std::move(p));
        }
    }
    LLMC_CHECK(!files.empty(), list + ": lists no files (one path or glob a line)");
    return files;
}

bool has_shard_magic(const std::string& path) {
    require_regular_file(path);
    File f(path, "rb");
    int32_t magic = 0;
    return f.size() >= kHeaderBytes && std::fread(&magic, sizeof magic, 1, f.get()) == 1 && magic == kShardMagic;
}

DataFormat resolve_data_format(const std::vector<std::string>& paths, DataFormat format, const std::string& spec) {
    if (format != DataFormat::auto_detect) return format;
    const std::string* shard = nullptr;
    const std::string* raw = nullptr;
    for (const std::string& path : paths) (has_shard_magic(path) ? shard : raw) = &path;  // the last of each kind
    LLMC_CHECK(!shard || !raw, spec + ": mixes llm.c shards (" + *shard + ") and OLMo token files (" + *raw +
                                   "); one format per data set (or set --data_format)");
    return shard ? DataFormat::llmc : DataFormat::olmo;
}

size_t olmo_file_tokens(const std::string& path, TokenDtype dtype) {
    require_regular_file(path);
    struct stat st;
    LLMC_CHECK(stat(path.c_str(), &st) == 0, path + ": cannot open (" + std::strerror(errno) + ")");
    const size_t bytes = static_cast<size_t>(st.st_size), item = token_dtype_bytes(dtype);
    LLMC_CHECK(bytes > 0, path + ": empty token file");
    LLMC_CHECK(bytes % item == 0, path + ": " + std::to_string(bytes) + " bytes is not a whole number of " +
                                      token_dtype_name(dtype) + " tokens (" + std::to_string(item) +
                                      " bytes each; another --memmap_dtype?)");
    return bytes / item;
}

TokenReader::TokenReader(const std::string& path, size_t header_bytes, TokenDtype dtype)
    : path_(path), header_bytes_(header_bytes), dtype_(dtype) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LLMC_CHECK(fd_ >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
}

TokenReader::~TokenReader() {
    if (fd_ >= 0) ::close(fd_);
}

TokenReader::TokenReader(TokenReader&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), header_bytes_(other.header_bytes_),
      dtype_(other.dtype_), bytes_(std::move(other.bytes_)) {}

TokenReader& TokenReader::operator=(TokenReader&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = std::exchange(other.fd_, -1);
        path_ = std::move(other.path_);
        header_bytes_ = other.header_bytes_;
        dtype_ = other.dtype_;
        bytes_ = std::move(other.bytes_);
    }
    return *this;
}

void TokenReader::read(uint64_t first, std::span<int> out, int vocab_size) {
    const size_t item = token_dtype_bytes(dtype_), n = out.size() * item;
    bytes_.resize(n);
    const off_t offset = static_cast<off_t>(header_bytes_ + first * item);
    for (size_t done = 0; done < n;) {
        const ssize_t got = ::pread(fd_, bytes_.data() + done, n - done, offset + static_cast<off_t>(done));
        LLMC_CHECK(got > 0, path_ + ": " + (got == 0 ? "truncated: the file ends at token " +
                                                           std::to_string(first + done / item) + " (did it shrink?)"
                                                     : "read error (" + std::string(std::strerror(errno)) + ")"));
        done += static_cast<size_t>(got);
    }
    const std::byte* b = bytes_.data();
    uint64_t max = 0;
    switch (dtype_) {
        case TokenDtype::uint8: max = convert<uint8_t>(b, out); break;
        case TokenDtype::uint16: max = convert<uint16_t>(b, out); break;
        case TokenDtype::uint32: max = convert<uint32_t>(b, out); break;
        case TokenDtype::uint64: max = convert<uint64_t>(b, out); break;
    }
    if (max < static_cast<uint64_t>(vocab_size)) return;
    for (size_t i = 0; i < out.size(); i++) {
        const uint64_t id = dtype_ == TokenDtype::uint8    ? item_at<uint8_t>(b, i)
                            : dtype_ == TokenDtype::uint16 ? item_at<uint16_t>(b, i)
                            : dtype_ == TokenDtype::uint32 ? item_at<uint32_t>(b, i)
                                                           : item_at<uint64_t>(b, i);
        LLMC_CHECK(id < static_cast<uint64_t>(vocab_size),
                   path_ + ": token id " + std::to_string(id) + " at position " + std::to_string(first + i) +
                       " is out of range (vocab_size " + std::to_string(vocab_size) + ")");
    }
}

void append_token_bytes(std::span<const uint32_t> ids, TokenDtype dtype, const std::string& path, uint64_t first,
                        std::vector<std::byte>& out) {
    const size_t item = token_dtype_bytes(dtype), at = out.size();
    const uint64_t max = token_dtype_max(dtype);
    out.resize(at + ids.size() * item);
    for (size_t i = 0; i < ids.size(); i++) {
        const uint64_t v = ids[i];
        LLMC_CHECK(v <= max, path + ": token id " + std::to_string(v) + " at position " + std::to_string(first + i) +
                                 " does not fit " + token_dtype_name(dtype));
        std::memcpy(out.data() + at + i * item, &v, item);  // the low bytes of a little-endian uint64
    }
}

void write_olmo_file(const std::string& path, std::span<const uint32_t> ids, TokenDtype dtype) {
    AtomicFile f(path);
    std::vector<std::byte> bytes;
    constexpr size_t kChunk = 1 << 20;
    for (size_t done = 0; done < ids.size(); done += kChunk) {
        bytes.clear();
        append_token_bytes(ids.subspan(done, std::min(kChunk, ids.size() - done)), dtype, path, done, bytes);
        f.write(bytes.data(), bytes.size());
    }
    f.commit();
}

}  // namespace llmc
