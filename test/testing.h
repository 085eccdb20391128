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

#include "llmc/rng.h"

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
// Runs `fn` in a forked child and reports whether it died by abort() with `needle` in what it wrote to
// stderr ("" when so, else what happened): for checks whose failure mode is an abort (the block emulator's).
inline std::string aborts_with(const std::function<void()>& fn, const std::string& needle) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe() failed";
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return "fork() failed";
    if (pid == 0) {
        const rlimit no_core{0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(got));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        return "did not abort (stderr: '" + err + "')";
    if (err.find(needle) == std::string::npos) return "aborted, but stderr '" + err + "' lacks '" + needle + "'";
    return "";
}
}  // namespace testing

// Asserts that `stmt` aborts the process (checked in a forked child) with `needle` on stderr.
#define EXPECT_ABORTS(stmt, needle)                                                                   \
    do {                                                                                              \
        const std::string why_ = testing::aborts_with([&] { stmt; }, needle);                         \
        if (!why_.empty()) testing::report_failure(__FILE__, __LINE__, "EXPECT_ABORTS(" #stmt "): " + why_); \
    } while (0)

#define TEST_MAIN() \
    int main() { return testing::run_all(); }
