// Implementation of the checked file helpers in fileio.h.
#include "llmc/base/fileio.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>

namespace llmc {

static std::string reason() { return std::strerror(errno); }

File::File(const std::string& path, const char* mode) : path_(path) {
    f_ = std::fopen(path.c_str(), mode);
    LLMC_CHECK(f_ != nullptr, path + ": cannot open (" + reason() + ")");
    struct stat st;
    if (fstat(fileno(f_), &st) == 0 && S_ISDIR(st.st_mode)) {  // Linux opens a directory for reading
        std::fclose(f_);
        f_ = nullptr;
        fail(path + ": is a directory, not a file");
    }
}

File::~File() {
    if (f_) std::fclose(f_);
}

File::File(File&& other) noexcept : path_(std::move(other.path_)), f_(other.f_) { other.f_ = nullptr; }

void File::read_exact(void* dst, size_t n, const char* what) {
    const size_t got = std::fread(dst, 1, n, f_);
    LLMC_CHECK(got == n, path_ + ": truncated: expected " + std::to_string(n - got) + " more bytes of " + what);
}

void File::write_all(const void* src, size_t n) {
    LLMC_CHECK(std::fwrite(src, 1, n, f_) == n, path_ + ": write failed (" + reason() + ")");
}

void File::seek(long offset) {
    LLMC_CHECK(std::fseek(f_, offset, SEEK_SET) == 0, path_ + ": seek failed (" + reason() + ")");
}

size_t File::size() {
    struct stat st;
    LLMC_CHECK(fstat(fileno(f_), &st) == 0, path_ + ": stat failed (" + reason() + ")");
    return static_cast<size_t>(st.st_size);
}

void File::flush_and_sync() {
    LLMC_CHECK(std::fflush(f_) == 0, path_ + ": write failed (" + reason() + ")");
    LLMC_CHECK(fsync(fileno(f_)) == 0, path_ + ": fsync failed (" + reason() + ")");
}

void File::close() {
    FILE* f = f_;
    f_ = nullptr;
    LLMC_CHECK(f && std::fclose(f) == 0, path_ + ": close failed (" + reason() + ")");
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_path_(path + ".tmp"), file_(tmp_path_, "wb") {}

AtomicFile::~AtomicFile() {
    if (!committed_) std::remove(tmp_path_.c_str());
}

FileDigest AtomicFile::commit() {
    file_.flush_and_sync();
    file_.close();
    LLMC_CHECK(std::rename(tmp_path_.c_str(), path_.c_str()) == 0,
               path_ + ": cannot rename temporary file into place (" + reason() + ")");
    committed_ = true;
    return {hash_.length(), hash_.digest()};
}

bool file_exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void remove_file_durably(const std::string& path) {
    if (std::remove(path.c_str()) != 0) {
        LLMC_CHECK(errno == ENOENT, path + ": cannot remove (" + reason() + ")");
        return;
    }
    const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
    sync_directory(dir.empty() ? "/" : dir);
}

void sync_directory(const std::string& dir) {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    LLMC_CHECK(fd >= 0, dir + ": cannot open directory to sync it (" + reason() + ")");
    const bool synced = fsync(fd) == 0;
    const std::string why = synced ? "" : reason();
    close(fd);
    LLMC_CHECK(synced, dir + ": fsync failed (" + why + ")");
}

void require_regular_file(const std::string& path) {
    struct stat st;
    LLMC_CHECK(stat(path.c_str(), &st) == 0, path + ": cannot open (" + reason() + ")");
    LLMC_CHECK(!S_ISDIR(st.st_mode), path + ": is a directory, not a file");
    LLMC_CHECK(S_ISREG(st.st_mode), path + ": not a regular file (a pipe or device?)");
}

std::vector<std::byte> read_whole_file(const std::string& path, size_t max_bytes) {
    File f(path, "rb");
    const std::string too_big = path + ": larger than " + std::to_string(max_bytes) + " bytes";
    struct stat st;
    if (fstat(fileno(f.get()), &st) == 0 && !S_ISREG(st.st_mode)) {  // a pipe (<(...), /dev/stdin): no size
        std::vector<std::byte> bytes;
        std::byte chunk[1 << 16];
        for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, f.get())) > 0;) {
            LLMC_CHECK(got <= max_bytes - bytes.size(), too_big);
            bytes.insert(bytes.end(), chunk, chunk + got);
        }
        LLMC_CHECK(!std::ferror(f.get()), path + ": read failed (" + reason() + ")");
        return bytes;
    }
    LLMC_CHECK(f.size() <= max_bytes, too_big);
    std::vector<std::byte> bytes(f.size());
    f.read_exact(bytes.data(), bytes.size(), "file contents");
    return bytes;
}

FileDigest write_file_atomic(const std::string& path, std::span<const std::byte> bytes) {
    AtomicFile f(path);
    f.write(bytes.data(), bytes.size());
    return f.commit();
}

std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g{};
    const int rc = glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> files;
    if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) files.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    LLMC_CHECK(!files.empty(), pattern + ": no files match");
    std::sort(files.begin(), files.end());
    return files;
}

void make_dirs(const std::string& path) {
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        partial = path.substr(0, pos);
        if (partial.empty()) continue;
        if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
            fail(partial + ": cannot create directory (" + reason() + ")");
    }
    struct stat st;
    LLMC_CHECK(path.empty() || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)),
               path + ": exists and is not a directory");
}

size_t count_non_finite(std::span<const float> values) {
    size_t bad = 0;
    const ptrdiff_t n = static_cast<ptrdiff_t>(values.size());
    const float* v = values.data();
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (ptrdiff_t i = 0; i < n; i++) bad += !std::isfinite(v[i]);
    return bad;
}

size_t ByteWriter::non_finite_floats() const {
    size_t bad = 0;
    for (const auto& [offset, count] : float_arrays_) {
        // the bytes of a put_array_space array may be unaligned for float: copied out in blocks
        const std::byte* at = bytes_.data() + offset;
        if (reinterpret_cast<uintptr_t>(at) % alignof(float) == 0) {
            bad += count_non_finite(std::span(reinterpret_cast<const float*>(at), count));
            continue;
        }
        std::vector<float> block(std::min<size_t>(count, 1 << 20));
        for (size_t done = 0; done < count; done += block.size()) {
            const size_t n = std::min(block.size(), count - done);
            std::memcpy(block.data(), at + done * sizeof(float), n * sizeof(float));
            bad += count_non_finite(std::span(block.data(), n));
        }
    }
    return bad;
}

}  // namespace llmc
