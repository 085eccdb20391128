// The state file of the PyTorch references (dev/reference/gpt2_reference.py and olmo_reference.py: batch,
// logits, loss, every gradient, then the losses and gradient norms of its AdamW steps) and olmo_reference.py's
// DeMo runs, as the tests that compare with them read them (check_model_vs_torch.cpp on the CPU, gpu_test_gpt2.cu
// and gpu_test_demo.cu on the GPU), and what the GPU tests also share: the check that the reference exists (else
// they skip, naming the command that makes it), a check printer that counts failures, and relative L2 errors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace torch_reference {

inline constexpr int kStateMagic = 20240327;
inline constexpr int kStateVersion = 2;

struct State {
    int B = 0, T = 0, vocab_size = 0, padded_vocab_size = 0, steps = 0;
    float lr = 1e-4f;                  // of the AdamW steps (header[7], float bits; 0 in older files: 1e-4)
    std::vector<int> inputs, targets;  // B*T
    std::vector<float> logits;         // B*T x padded_vocab_size
    float loss = 0.0f;
    std::vector<float> grads, losses, grad_norms;  // num_params; steps; steps
};

// Reads a state file written for a model of num_params parameters; a wrong magic, version, header or size
// (another model, a truncated file) is an llmc::Error naming the file.
inline State read_state(const std::string& path, size_t num_params) {
    llmc::File file(path, "rb");
    const size_t file_size = file.size();
    int32_t h[256];
    file.read_exact(h, sizeof(h), "debug state header");
    LLMC_CHECK(h[0] == kStateMagic && h[1] == kStateVersion,
               path + ": not a version-2 debug state (magic " + std::to_string(h[0]) + ", version " +
                   std::to_string(h[1]) + ")");
    State s;
    s.B = h[2];
    s.T = h[3];
    s.vocab_size = h[4];
    s.padded_vocab_size = h[5];
    s.steps = h[6];
    if (h[7] != 0) std::memcpy(&s.lr, &h[7], sizeof(float));
    LLMC_CHECK(s.B > 0 && s.T > 0 && s.vocab_size > 0 && s.padded_vocab_size >= s.vocab_size && s.steps >= 0,
               path + ": bad debug state header");
    LLMC_CHECK(s.lr > 0.0f && std::isfinite(s.lr), path + ": bad AdamW lr in the debug state header");
    const size_t N = size_t(s.B) * s.T;
    const size_t expected = sizeof(h) + 4 * (2 * N + N * s.padded_vocab_size + 1 + num_params + 2 * size_t(s.steps));
    LLMC_CHECK(file_size == expected, path + ": size " + std::to_string(file_size) + " bytes, expected " +
                                          std::to_string(expected) + " for this model and header");
    auto read = [&](auto& v, size_t n, const char* what) {
        v.resize(n);
        file.read_exact(v.data(), n * sizeof(v[0]), what);
    };
    read(s.inputs, N, "inputs");
    read(s.targets, N, "targets");
    read(s.logits, N * s.padded_vocab_size, "logits");
    file.read_exact(&s.loss, sizeof(float), "loss");
    read(s.grads, num_params, "gradients");
    read(s.losses, s.steps, "step losses");
    read(s.grad_norms, s.steps, "gradient norms");
    return s;
}

inline constexpr int kDemoRunMagic = 20240329;
inline constexpr int kDemoRunVersion = 1;

// A DeMo run of olmo_reference.py (demo_rN.bin): `steps` undelayed steps of `ranks` simulated ranks from
// model.bin, rank r on its own batch at every step; the options, each rank's losses and local gradient norms,
// and the parameters at the end.
struct DemoRun {
    int B = 0, T = 0, vocab_size = 0, padded_vocab_size = 0, steps = 0, ranks = 0, topk = 0, chunk = 0;
    float lr = 0, decay = 0, weight_decay = 0, grad_clip = 0;
    std::vector<std::vector<int>> inputs, targets;  // [rank] -> B*T
    std::vector<float> losses, grad_norms;          // [step * ranks + rank]
    std::vector<float> params;                      // num_params, after the last step
};

inline DemoRun read_demo_run(const std::string& path, size_t num_params) {
    llmc::File file(path, "rb");
    const size_t file_size = file.size();
    int32_t h[256];
    file.read_exact(h, sizeof(h), "DeMo run header");
    LLMC_CHECK(h[0] == kDemoRunMagic && h[1] == kDemoRunVersion,
               path + ": not a version-1 DeMo run (magic " + std::to_string(h[0]) + ", version " +
                   std::to_string(h[1]) + ")");
    DemoRun d;
    d.B = h[2], d.T = h[3], d.vocab_size = h[4], d.padded_vocab_size = h[5], d.steps = h[6], d.ranks = h[7];
    d.topk = h[8], d.chunk = h[9];
    float* floats[4] = {&d.lr, &d.decay, &d.weight_decay, &d.grad_clip};
    for (int i = 0; i < 4; i++) std::memcpy(floats[i], &h[10 + i], sizeof(float));
    LLMC_CHECK(d.B > 0 && d.T > 0 && d.vocab_size > 0 && d.steps > 0 && d.ranks > 0 && d.topk > 0 && d.chunk > 0,
               path + ": bad DeMo run header");
    const size_t N = size_t(d.B) * d.T, SW = size_t(d.steps) * d.ranks;
    const size_t expected = sizeof(h) + 4 * (2 * d.ranks * N + 2 * SW + num_params);
    LLMC_CHECK(file_size == expected, path + ": size " + std::to_string(file_size) + " bytes, expected " +
                                          std::to_string(expected) + " for this model and header");
    auto read = [&](auto& v, size_t n, const char* what) {
        v.resize(n);
        file.read_exact(v.data(), n * sizeof(v[0]), what);
    };
    d.inputs.resize(d.ranks);
    d.targets.resize(d.ranks);
    for (auto& x : d.inputs) read(x, N, "inputs");
    for (auto& y : d.targets) read(y, N, "targets");
    read(d.losses, SW, "losses");
    read(d.grad_norms, SW, "gradient norms");
    read(d.params, num_params, "final parameters");
    return d;
}

// True when <dir>/model.bin and <dir>/state.bin exist; else prints the SKIP line with the command that makes them.
inline bool present(const std::string& dir) {
    if (llmc::file_exists(dir + "/model.bin") && llmc::file_exists(dir + "/state.bin")) return true;
    std::printf("SKIP: no reference files in %s (run /usr/bin/python3 dev/reference/gpt2_reference.py --config tiny "
                "--batch 4 --seq 32 --out-dir %s)\n", dir.c_str(), dir.c_str());
    return false;
}

// Prints one check with its verdict and counts the failures; `width` aligns the verdicts.
class Checks {
public:
    explicit Checks(int width) : width_(width) {}
    void expect(bool ok, const std::string& what) {
        std::printf("  %-*s %s\n", width_, what.c_str(), ok ? "ok" : "FAIL");
        if (!ok) failures_++;
    }
    void fail() { failures_++; }
    int failures() const { return failures_; }
    // Prints PASS or FAIL; the process exit status.
    int finish() const {
        std::printf("%s\n", failures_ == 0 ? "PASS" : "FAIL");
        return failures_ == 0 ? 0 : 1;
    }

private:
    int width_;
    int failures_ = 0;
};

// ||a - b|| / ||b|| (or ||a|| when b is zero)
inline double rel_l2(const float* a, const float* b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        r += double(b[i]) * b[i];
    }
    return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    return rel_l2(a.data(), b.data(), std::min(a.size(), b.size()));
}

}  // namespace torch_reference
