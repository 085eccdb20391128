// An exclusive lock on a directory (flock on <dir>/.lock), held while the object lives: a run's out_dir belongs to
// one trainer at a time, so a requeued job started while the old one still runs cannot resume its checkpoints,
// rewrite its metrics or prune its saves. The kernel drops the lock when the holder dies, however it dies.
#pragma once
#include <string>

namespace llmc {

class DirectoryLock {
public:
    // Creates `dir` when missing and takes the lock, or throws "<dir>: in use by another run (pid P on host H,
    // since T); ..." naming the holder, which records itself in the lock file.
    explicit DirectoryLock(const std::string& dir);
    ~DirectoryLock();
    DirectoryLock(const DirectoryLock&) = delete;
    DirectoryLock& operator=(const DirectoryLock&) = delete;

    static std::string lock_path(const std::string& dir) { return dir + "/.lock"; }

private:
    int fd_ = -1;
};

}  // namespace llmc
