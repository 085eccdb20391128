// CollectiveWatchdog (see watchdog.h).
#include "llmc/comm/watchdog.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace llmc {

CollectiveWatchdog::CollectiveWatchdog(double timeout_seconds, int rank)
    : timeout_(timeout_seconds), rank_(rank), thread_([this] { run(); }) {}

CollectiveWatchdog::~CollectiveWatchdog() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
}

CollectiveWatchdog::Scope::Scope(CollectiveWatchdog* watchdog, const char* what) : watchdog_(watchdog) {
    if (watchdog_) watchdog_->begin(what);
}
CollectiveWatchdog::Scope::~Scope() {
    if (watchdog_) watchdog_->end();
}

void CollectiveWatchdog::begin(const char* what) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (depth_++ > 0) return;
        generation_++;
        what_ = what;
        since_ = std::chrono::steady_clock::now();
    }
    changed_.notify_all();
}

void CollectiveWatchdog::end() {
    std::lock_guard<std::mutex> lock(mutex_);
    depth_--;
}

void CollectiveWatchdog::run() {
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
        if (depth_ == 0) {
            changed_.wait(lock, [&] { return stop_ || depth_ > 0; });
            continue;
        }
        const uint64_t watched = generation_;
        const auto deadline = since_ + limit;
        // Wakes when the deadline passes or a new scope opens (an ended one is noticed at the deadline).
        changed_.wait_until(lock, deadline, [&] { return stop_ || generation_ != watched; });
        if (!stop_ && depth_ > 0 && generation_ == watched && std::chrono::steady_clock::now() >= deadline)
            expire(what_);
    }
}

void CollectiveWatchdog::expire(const char* what) const {
    // Written with one write(2): the main thread is blocked inside the collective and may hold stdio locks.
    char line[512];
    const int n = std::snprintf(line, sizeof line,
                                "error (rank %d): %s did not complete within %g s (--comm_timeout): another rank died "
                                "or hangs; exiting so that the launcher ends the job\n",
                                rank_, what, timeout_);
    if (n > 0) (void)!::write(2, line, static_cast<size_t>(n < int(sizeof line) ? n : int(sizeof line) - 1));
    std::_Exit(1);
}

}  // namespace llmc
