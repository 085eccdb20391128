// CollectiveWatchdog: ends this process when one collective has been waiting longer than a time limit.
// A rank that dies is the launcher's business (mpirun ends the job when a process exits abnormally), but a rank
// that hangs without dying (a stopped process, a GPU stuck after a fault, a network partition the transport
// does not report) would keep every other rank blocked in its next collective forever, with the job still
// "running". Every transport wraps its collectives in a Scope; a background thread watches the open one and,
// past the limit, writes one line to stderr and exits with status 1, so mpirun tears the whole job down.
// The limit is --comm_timeout (seconds, 0 = off); it must exceed the longest legitimate wait, such as rank 0
// writing a checkpoint while the others wait at the next step's collective.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace llmc {

class CollectiveWatchdog {
public:
    // timeout_seconds > 0. `rank` names this process in the message.
    CollectiveWatchdog(double timeout_seconds, int rank);
    ~CollectiveWatchdog();
    CollectiveWatchdog(const CollectiveWatchdog&) = delete;
    CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

    // Marks a collective in progress for its lifetime; `what` (a string literal) names it in the message.
    // Scopes may nest: the outermost one is timed. A default-constructed Scope watches nothing.
    class Scope {
    public:
        Scope() = default;
        Scope(CollectiveWatchdog* watchdog, const char* what);
        ~Scope();
        Scope(Scope&& other) noexcept : watchdog_(other.watchdog_) { other.watchdog_ = nullptr; }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
        Scope& operator=(Scope&&) = delete;

    private:
        CollectiveWatchdog* watchdog_ = nullptr;
    };
    Scope watch(const char* what) { return Scope(this, what); }

    double timeout_seconds() const { return timeout_; }

private:
    void begin(const char* what);
    void end();
    void run();
    [[noreturn]] void expire(const char* what) const;

    const double timeout_;
    const int rank_;
    std::mutex mutex_;
    std::condition_variable changed_;
    int depth_ = 0;
    uint64_t generation_ = 0;  // counts outermost scopes, so the thread knows whether the open one is new
    const char* what_ = nullptr;
    std::chrono::steady_clock::time_point since_;
    bool stop_ = false;
    std::thread thread_;  // last: starts after the state above exists
};

}  // namespace llmc
