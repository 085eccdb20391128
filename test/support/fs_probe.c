// An LD_PRELOAD library for the reliability tests: it logs the file-system calls that make a checkpoint durable
// (rename, unlink, rmdir, fsync) and can kill the process just before one of them, so a test can check their order
// and what a kill at that moment leaves.
//   FS_PROBE_LOG=FILE            append "<call> <path>" per call (fsync: the descriptor's path)
//   FS_PROBE_KILL=CALL:SUFFIX    SIGKILL before the first CALL (rename, unlink, fsync) on a path ending in SUFFIX
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void probe(const char* call, const char* path) {
    const char* log = getenv("FS_PROBE_LOG");
    if (log) {
        const int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[2 * PATH_MAX + 32];
            const int n = snprintf(line, sizeof line, "%s %s\n", call, path);
            if (n > 0 && write(fd, line, (size_t)n) < 0) {}
            close(fd);
        }
    }
    const char* kill_at = getenv("FS_PROBE_KILL");
    const char* colon = kill_at ? strchr(kill_at, ':') : NULL;
    if (!colon || (size_t)(colon - kill_at) != strlen(call) || strncmp(kill_at, call, strlen(call)) != 0) return;
    const char* suffix = colon + 1;
    const size_t ls = strlen(suffix), lp = strlen(path);
    if (lp >= ls && strcmp(path + lp - ls, suffix) == 0) raise(SIGKILL);
}

// out: 2 * PATH_MAX bytes
static void at_path(int dirfd, const char* name, char* out) {
    if (name[0] == '/' || dirfd == AT_FDCWD) {
        snprintf(out, 2 * PATH_MAX, "%s", name);
        return;
    }
    char link[64], dir[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    const ssize_t n = readlink(link, dir, sizeof dir - 1);
    dir[n > 0 ? n : 0] = 0;
    snprintf(out, 2 * PATH_MAX, "%s/%s", dir, name);
}

#define NEXT(name, type) ((type)dlsym(RTLD_NEXT, name))

int rename(const char* from, const char* to) {
    probe("rename", to);
    return NEXT("rename", int (*)(const char*, const char*))(from, to);
}

int renameat(int fromfd, const char* from, int tofd, const char* to) {
    char path[2 * PATH_MAX];
    at_path(tofd, to, path);
    probe("rename", path);
    return NEXT("renameat", int (*)(int, const char*, int, const char*))(fromfd, from, tofd, to);
}

int unlink(const char* path) {
    probe("unlink", path);
    return NEXT("unlink", int (*)(const char*))(path);
}

int unlinkat(int dirfd, const char* name, int flags) {
    char path[2 * PATH_MAX];
    at_path(dirfd, name, path);
    probe((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", path);
    return NEXT("unlinkat", int (*)(int, const char*, int))(dirfd, name, flags);
}

int rmdir(const char* path) {
    probe("rmdir", path);
    return NEXT("rmdir", int (*)(const char*))(path);
}

// glibc's remove() unlinks (or removes a directory) without going through the interposable unlink
int remove(const char* path) {
    probe("unlink", path);
    return NEXT("remove", int (*)(const char*))(path);
}

int fsync(int fd) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
    probe("fsync", path);
    return NEXT("fsync", int (*)(int))(fd);
}
