// DirectoryLock (see dir_lock.h).
#include "llmc/base/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

namespace {
std::string holder_line() {
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    char when[64] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
    return "pid " + std::to_string(getpid()) + " on host " + host + ", since " + when;
}

std::string read_holder(int fd) {
    char buf[512];
    const ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    std::string text = got > 0 ? std::string(buf, static_cast<size_t>(got)) : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return text.empty() ? "holder not yet recorded" : text;
}
}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir) {
    make_dirs(dir);
    const std::string path = lock_path(dir);
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    LLMC_CHECK(fd_ >= 0, path + ": cannot open the out_dir's lock file (" + std::strerror(errno) + ")");
    if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        const std::string holder = err == EWOULDBLOCK ? read_holder(fd_) : "";
        close(fd_);
        fd_ = -1;
        LLMC_CHECK(err == EWOULDBLOCK, path + ": cannot lock the out_dir (" + std::strerror(err) + ")");
        fail(dir + ": in use by another run (" + holder + "); wait for it to end, stop it, or use another out_dir");
    }
    const std::string line = holder_line() + "\n";
    // the holder's line is a courtesy for the message above: failing to write it does not stop the run
    if (ftruncate(fd_, 0) == 0) {
        const ssize_t written = pwrite(fd_, line.data(), line.size(), 0);
        (void)written;
    }
}

DirectoryLock::~DirectoryLock() {
    if (fd_ >= 0) close(fd_);  // closing the descriptor releases the lock
}

}  // namespace llmc
