// Errors a user can act on. Every bad input (file, flag, config key, rank mismatch) throws llmc::Error with a
// one-line message naming the culprit; each program's main() catches it, prints "error: <message>" and exits
// non-zero (aborting the other ranks under MPI). Throwing instead of exit() keeps RAII cleanup (temporary
// checkpoint files are removed) and lets tests assert on the message.
#pragma once
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

namespace llmc {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

// A training run whose loss or gradient norm stopped being finite: the trainers stop with exit status
// kDivergedExitStatus, so that sweeps can tell a diverged run from a failed one.
struct Diverged : Error {
    using Error::Error;
};
inline constexpr int kDivergedExitStatus = 3;

// A single-process tool's main(): run(argc, argv), with any error printed as "error: <message>" and exit
// status 1. (The trainers use llmc/run/trainer_main.h, which also ends the other ranks.)
template <class Run>
int main_reporting_errors(int argc, char** argv, Run run) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}

}  // namespace llmc

// The message expression is only evaluated when the check fails, so it may build strings freely.
#define LLMC_CHECK(cond, message)                 \
    do {                                          \
        if (!(cond)) ::llmc::fail(message);       \
    } while (0)
