// A minimal test harness: EXPECT-style checks that record failures and keep going, so one run reports every
// broken assertion, and a main() that exits 0 (pass), 1 (fail) or 77 (skipped) for test/run_tests.sh.
#pragma once
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "llmc/base/rng.h"

namespace testing {

struct Registry {
    std::vector<std::pair<std::string, std::function<void()>>> tests;
    int failures = 0;
    static Registry& get() {
        static Registry r;
        return r;
    }
};

struct Register {
    Register(const char* name, std::function<void()> fn) { Registry::get().tests.emplace_back(name, std::move(fn)); }
};

// n floats drawn from N(0, scale^2) by llmc::Rng(seed): the tests' random tensors.
inline std::vector<float> random_normal(size_t n, uint64_t seed, double scale) {
    llmc::Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(rng.normal() * scale);
    return v;
}

inline void report_failure(const char* file, int line, const std::string& what) {
    std::fprintf(stderr, "  FAILED %s:%d: %s\n", file, line, what.c_str());
    Registry::get().failures++;
}

// Exit code 77 tells the runner the test cannot run here (no GPU, no root...).
[[noreturn]] inline void skip(const std::string& why) {
    std::printf("SKIP: %s\n", why.c_str());
    std::exit(77);
}

inline int run_all() {
    for (auto& [name, fn] : Registry::get().tests) {
        const int before = Registry::get().failures;
        std::printf("[ RUN  ] %s\n", name.c_str());
        std::fflush(stdout);
        try {
            fn();
        } catch (const std::exception& e) {
            report_failure(name.c_str(), 0, std::string("unexpected exception: ") + e.what());
        }
        std::printf("[ %s ] %s\n", Registry::get().failures == before ? " OK " : "FAIL", name.c_str());
    }
    return Registry::get().failures == 0 ? 0 : 1;
}

}  // namespace testing

#define TEST(name)                                                   \
    static void test_##name();                                       \
    static testing::Register register_##name(#name, test_##name);    \
    static void test_##name()

#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) testing::report_failure(__FILE__, __LINE__, "EXPECT(" #cond ")"); \
    } while (0)

#define EXPECT_EQ(a, b)                                                                                     \
    do {                                                                                                    \
        const auto& va_ = (a);                                                                              \
        const auto& vb_ = (b);                                                                              \
        if (!(va_ == vb_))                                                                                  \
            testing::report_failure(__FILE__, __LINE__, "EXPECT_EQ(" #a ", " #b ")");                       \
    } while (0)

#define EXPECT_NEAR(a, b, tol)                                                                                \
    do {                                                                                                      \
        const double va_ = (a), vb_ = (b);                                                                    \
        if (!(std::fabs(va_ - vb_) <= (tol)))                                                                 \
            testing::report_failure(__FILE__, __LINE__,                                                       \
                                    "EXPECT_NEAR(" #a ", " #b "): " + std::to_string(va_) + " vs " +          \
                                        std::to_string(vb_) + " tol " + std::to_string(tol));                 \
    } while (0)

// Asserts that `stmt` throws llmc::Error whose message contains `needle`.
#define EXPECT_ERROR(stmt, needle)                                                                         \
    do {                                                                                                   \
        bool threw_ = false;                                                                               \
        try {                                                                                              \
            stmt;                                                                                          \
        } catch (const llmc::Error& e_) {                                                                  \
            threw_ = true;                                                                                 \
            if (std::string(e_.what()).find(needle) == std::string::npos)                                  \
                testing::report_failure(__FILE__, __LINE__,                                                \
                                        std::string("error message '") + e_.what() + "' lacks '" + (needle) + "'"); \
        }                                                                                                  \
        if (!threw_) testing::report_failure(__FILE__, __LINE__, "expected llmc::Error from " #stmt);       \
    } while (0)

namespace testing {
// What a forked child running `fn` did: its wait status and what it wrote to stderr.
struct ChildOutcome {
    int status = 0;
    std::string stderr_text;
    bool ok = false;  // false: fork or pipe failed (stderr_text says which)
};
inline ChildOutcome run_in_child(const std::function<void()>& fn) {
    ChildOutcome out;
    int fds[2];
    if (pipe(fds) != 0) return {0, "pipe() failed", false};
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return {0, "fork() failed", false};
    if (pid == 0) {
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char buf[512];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) out.stderr_text.append(buf, size_t(got));
    close(fds[0]);
    waitpid(pid, &out.status, 0);
    out.ok = true;
    return out;
}

// "" when `fn` (run in a forked child) died by abort() with `needle` on stderr, else what happened instead:
// for checks whose failure mode is an abort (the block emulator's).
inline std::string aborts_with(const std::function<void()>& fn, const std::string& needle) {
    const ChildOutcome c = run_in_child(fn);
    if (!c.ok) return c.stderr_text;
    if (!WIFSIGNALED(c.status) || WTERMSIG(c.status) != SIGABRT)
        return "did not abort (stderr: '" + c.stderr_text + "')";
    if (c.stderr_text.find(needle) == std::string::npos)
        return "aborted, but stderr '" + c.stderr_text + "' lacks '" + needle + "'";
    return "";
}

// "" when `fn` (run in a forked child) exited with status `code` and `needle` on stderr, else what happened.
inline std::string exits_with(const std::function<void()>& fn, int code, const std::string& needle) {
    const ChildOutcome c = run_in_child(fn);
    if (!c.ok) return c.stderr_text;
    if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != code)
        return "did not exit with status " + std::to_string(code) + " (wait status " + std::to_string(c.status) +
               ", stderr: '" + c.stderr_text + "')";
    if (c.stderr_text.find(needle) == std::string::npos)
        return "exited, but stderr '" + c.stderr_text + "' lacks '" + needle + "'";
    return "";
}
}  // namespace testing

// Asserts that `stmt` aborts the process (checked in a forked child) with `needle` on stderr.
#define EXPECT_ABORTS(stmt, needle)                                                                   \
    do {                                                                                              \
        const std::string why_ = testing::aborts_with([&] { stmt; }, needle);                         \
        if (!why_.empty()) testing::report_failure(__FILE__, __LINE__, "EXPECT_ABORTS(" #stmt "): " + why_); \
    } while (0)

// Asserts that `stmt` ends the process with exit status `code` (in a forked child) and `needle` on stderr.
#define EXPECT_EXITS(stmt, code, needle)                                                                    \
    do {                                                                                                    \
        const std::string why_ = testing::exits_with([&] { stmt; }, code, needle);                          \
        if (!why_.empty()) testing::report_failure(__FILE__, __LINE__, "EXPECT_EXITS(" #stmt "): " + why_); \
    } while (0)

#define TEST_MAIN() \
    int main() { return testing::run_all(); }
