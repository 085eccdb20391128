// Checked file I/O shared by every reader and writer of the project: RAII FILE handles whose errors name the
// file, exact reads that report truncation, atomic writes (temporary file + fsync + rename, so a crash never
// leaves a half-written checkpoint), and a small byte serializer for optimizer and training state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmc/base/checksum.h"
#include "llmc/base/error.h"
#include "llmc/base/host_memory.h"

namespace llmc {

class File {
public:
    File(const std::string& path, const char* mode);  // throws "<path>: cannot open (<reason>)"
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    File(File&& other) noexcept;

    // Reads exactly n bytes or throws "<path>: truncated: expected N more bytes of <what>".
    void read_exact(void* dst, size_t n, const char* what);
    void write_all(const void* src, size_t n);
    void seek(long offset);          // from the start
    size_t size();                   // total file size in bytes
    void flush_and_sync();           // fflush + fsync; throws on failure (disk full)
    void close();                    // checked fclose
    const std::string& path() const { return path_; }
    FILE* get() { return f_; }

private:
    std::string path_;
    FILE* f_ = nullptr;
};

// Writes `path` atomically: write() goes to "<path>.tmp"; commit() syncs and renames over `path`, and returns
// the digest of everything written (for a checkpoint's marker). Destroyed without commit() (an exception, a
// crash in the writer), the temporary file is removed.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path);
    ~AtomicFile();
    void write(const void* src, size_t n) {
        file_.write_all(src, n);
        hash_.update(src, n);
    }
    FileDigest commit();

private:
    std::string path_, tmp_path_;
    File file_;
    Xxh64 hash_;
    bool committed_ = false;
};

bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
// Removes `path` (nothing to do if it is missing) and syncs its directory, so that the removal reaches the disk
// before anything written after it.
void remove_file_durably(const std::string& path);
// fsync on a directory: the entries created, renamed or removed in it so far reach the disk (a rename is durable
// only once its directory is synced).
void sync_directory(const std::string& dir);
// Throws "<path>: ..." unless path is a regular file: opening a named pipe would wait for a writer forever.
void require_regular_file(const std::string& path);
// A regular file, or a pipe read to its end (--file-list <(...)); more than max_bytes is refused.
std::vector<std::byte> read_whole_file(const std::string& path, size_t max_bytes = SIZE_MAX);
FileDigest write_file_atomic(const std::string& path, std::span<const std::byte> bytes);
// Expands a glob pattern (sorted); throws "<pattern>: no files match" when empty.
std::vector<std::string> glob_files(const std::string& pattern);
void make_dirs(const std::string& path);  // mkdir -p; throws on failure

// Appends plain values and arrays to a byte vector (little-endian host, as every supported machine is).
class ByteWriter {
public:
    template <typename T>
    void put(const T& v) {
        static_assert(std::is_trivially_copyable_v<T>);
        const auto* p = reinterpret_cast<const std::byte*>(&v);
        bytes_.insert(bytes_.end(), p, p + sizeof(T));
    }
    template <typename T>
    void put_array(std::span<const T> v) {
        static_assert(std::is_trivially_copyable_v<T>);
        put<uint64_t>(v.size());
        note_floats<T>(v.size());
        const auto* p = reinterpret_cast<const std::byte*>(v.data());
        bytes_.insert(bytes_.end(), p, p + v.size_bytes());
    }
    // Writes an array's length as put_array does and returns where its count * sizeof(T) bytes go, for the
    // caller to fill (a device-to-host copy straight into the blob). The pointer lasts until the next put.
    template <typename T>
    std::byte* put_array_space(size_t count) {
        static_assert(std::is_trivially_copyable_v<T>);
        put<uint64_t>(count);
        note_floats<T>(count);
        const size_t at = bytes_.size();
        bytes_.resize(at + count * sizeof(T));
        return bytes_.data() + at;
    }
    void put_string(const std::string& s) { put_array(std::span<const char>(s.data(), s.size())); }
    void reserve(size_t bytes) { bytes_.reserve(bytes); }
    LargeVector<std::byte>& bytes() { return bytes_; }
    // How many NaN/inf values the float arrays written so far hold (a checkpoint must not save a diverged
    // optimizer state); one pass over those arrays, which are in memory already.
    size_t non_finite_floats() const;

private:
    template <typename T>
    void note_floats(size_t count) {
        if constexpr (std::is_same_v<T, float>) float_arrays_.push_back({bytes_.size(), count});
    }
    LargeVector<std::byte> bytes_;  // optimizer state blobs: 1 GB for AdamW on GPT-2 124M
    std::vector<std::pair<size_t, size_t>> float_arrays_;  // (byte offset, count) of each float array
};

// How many of `values` are NaN or infinite (OpenMP threads).
size_t count_non_finite(std::span<const float> values);

// Reads what ByteWriter wrote; every read is bounds-checked and a short or inconsistent blob throws
// "<source>: corrupt or truncated (<what>)".
class ByteReader {
public:
    ByteReader(std::span<const std::byte> bytes, std::string source) : bytes_(bytes), source_(std::move(source)) {}
    template <typename T>
    T get(const char* what) {
        static_assert(std::is_trivially_copyable_v<T>);
        T v;
        take(&v, sizeof(T), what);
        return v;
    }
    // Reads an array whose length must equal `expected` (the caller knows the shape).
    template <typename T>
    void get_array(std::span<T> out, const char* what) {
        std::memcpy(out.data(), get_array_space<T>(out.size(), what), out.size_bytes());
    }
    // Reads the length of an array, which must equal `count`, and returns where its bytes are in the blob (for a
    // host-to-device copy straight from it). Valid while the blob is.
    template <typename T>
    const std::byte* get_array_space(size_t count, const char* what) {
        const uint64_t n = get<uint64_t>(what);
        LLMC_CHECK(n == count, source_ + ": " + what + " has " + std::to_string(n) + " elements, expected " +
                                   std::to_string(count));
        LLMC_CHECK(count <= (bytes_.size() - pos_) / sizeof(T), source_ + ": corrupt or truncated (" + what + ")");
        const std::byte* at = bytes_.data() + pos_;
        pos_ += count * sizeof(T);
        return at;
    }
    template <typename T, typename Vector = std::vector<T>>
    Vector get_vector(const char* what) {
        const uint64_t n = get<uint64_t>(what);
        LLMC_CHECK(n <= (bytes_.size() - pos_) / sizeof(T), source_ + ": corrupt or truncated (" + what + ")");
        Vector v(n);
        take(v.data(), n * sizeof(T), what);
        return v;
    }
    std::string get_string(const char* what) {
        auto v = get_vector<char>(what);
        return std::string(v.begin(), v.end());
    }
    bool at_end() const { return pos_ == bytes_.size(); }
    const std::string& source() const { return source_; }

private:
    void take(void* dst, size_t n, const char* what) {
        LLMC_CHECK(n <= bytes_.size() - pos_, source_ + ": corrupt or truncated (" + what + ")");
        std::memcpy(dst, bytes_.data() + pos_, n);
        pos_ += n;
    }
    std::span<const std::byte> bytes_;
    std::string source_;
    size_t pos_ = 0;
};

}  // namespace llmc
