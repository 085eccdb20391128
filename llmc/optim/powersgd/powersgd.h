// PowerSGD (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
// Optimization"): a drop-in for AdamW-DDP's all-reduce. Each matrix's gradient travels as a rank-r factorization
// P Q^T found by one step of power iteration, warm-started from last step's Q, with error feedback; everything
// else is all-reduced in full. The averaged approximation, identical on every rank, then goes through AdamW-DDP's
// clip and update, so every rank's weights stay bit-identical.
//
// The step, on every rank (the rule of PyTorch's DDP powerSGD_hook, with the differences noted):
//   A tensor is compressed when it is 2-D (n x m) and k (n + m) < n m, with k = min(n, m, --powersgd_rank);
//   the others (1-D, or too small to gain) are "full" tensors. Per compressed tensor, in layout order:
//     M = g + e                          (g: this rank's gradient; e: its error-feedback buffer, starting at 0)
//     Q = draw(seed, d, tensor index)    (m x k; on the first step, and on every step with warm_start false:
//                                         d = 0 with warm start, else the 0-based step; otherwise last step's Q)
//     Q = orth(Q);  P = M Q              (n x k)
//   all-reduce mean of every P, laid back to back in layout order           (collective 1)
//   per compressed tensor: P = orth(P);  Q = M^T P
//   all-reduce mean of [every Q, then every full tensor's g], layout order   (collective 2)
//   per compressed tensor: g_hat = P Q^T;  e = M - g_hat    (local M minus the averaged approximation)
//   per full tensor: g_hat = the mean of g (no error buffer: torch's hook keeps one, local minus mean, which
//                    averages to 0 over the ranks and so changes the mean only by rounding)
//   clip g_hat by its global norm (--grad_clip, torch.nn.utils.clip_grad_norm_'s rule), then torch.optim.AdamW
//   (--beta1, --beta2, --eps, --weight_decay on --decay_groups; km::adamw_update, AdamW-DDP's arithmetic).
// The all-reduce mean is the transport's: summed in rank order, times 1/W, fp32. Torch sums P without dividing
// (the same after orth up to rounding) and uses QR for k > 2; here Gram-Schmidt at every k.
//
// orth(X), X rows x k row-major: torch's _orthogonalize_gram_schmidt with epsilon kPowerSgdOrthEpsilon, columns
// in order: x_i = x_i / (||x_i|| + eps), then x_c -= (x_i . x_c) x_i for every later column c. Norms and dot
// products are summed in double over the rows in order and rounded to float; the rest is fp32. The epsilon keeps
// a zero column (a zero gradient, a rank-deficient M) at 0 instead of NaN.
//
// draw: a counter-based normal generator, reproducible from this text (dev/reference/powersgd_reference.py):
//   sm(x) = splitmix64's output function of x + 0x9E3779B97F4A7C15 (all arithmetic mod 2^64)
//   key = sm(sm(seed) ^ (d << 32 | tensor index));  element j of Q (row-major, j = row k + col):
//   a = sm(key + 2j), b = sm(key + 2j + 1), u1 = ((a >> 11) + 1) 2^-53, u2 = (b >> 11) 2^-53,
//   z = sqrt(-2 ln u1) cos(2 pi u2) in double, rounded to float.
//
// The matmuls are cpu::gemm (OpenBLAS sgemm single-threaded in one slice per OpenMP thread, the model's own), so
// the bits depend on the thread count only, which every rank shares. Bytes per rank per step under the ring model:
// 2 (W-1)/W x 4 x (sum of n k) + 2 (W-1)/W x 4 x (sum of m k + the full tensors' elements).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "llmc/base/host_memory.h"
#include "llmc/optim/optimizer.h"

namespace llmc {

inline constexpr float kPowerSgdOrthEpsilon = 1e-8f;

// Throws when a powersgd_* option, --beta1, --beta2, --eps or --weight_decay is out of range, naming the key as
// `sources` does (by default: the flag).
void validate_powersgd_options(const OptimizerConfig& config, const ConfigSources& sources = {});

// PowerSGD's entry in the registry of optimizers (optimizers.h).
OptimizerFamily powersgd_family();

// How PowerSGD treats each tensor of a layout for rank r: k = 0 for a full tensor.
struct PowerSgdPlan {
    struct Matrix {
        size_t tensor;  // index in layout.tensors
        size_t rows, cols, k;
        size_t p_offset, q_offset;  // in the P buffer, and in the buffer of Qs and full tensors
    };
    std::vector<Matrix> matrices;
    std::vector<size_t> full;  // tensor indices all-reduced in full
    size_t p_floats = 0;       // collective 1's elements
    size_t q_floats = 0;       // the Qs of collective 2
    size_t full_floats = 0;    // the full tensors of collective 2
};
PowerSgdPlan powersgd_plan(const ParamLayout& layout, int rank);
// Bytes one rank sends per step for `layout` on `world` ranks, as the transport counts them (2 (W-1) b / W for
// each all-reduce of b bytes, in integers).
uint64_t powersgd_bytes_sent(const ParamLayout& layout, int rank, int world);

// The counter-based normal draw of the header comment, element `j` of the Q of tensor `tensor` at draw `d`.
float powersgd_normal(uint64_t seed, uint64_t d, uint64_t tensor, uint64_t j);
// orth(X) of the header comment, in place: X is rows x k, row-major.
void powersgd_orthogonalize(float* x, size_t rows, size_t k, float epsilon = kPowerSgdOrthEpsilon);

class PowerSgd final : public Optimizer {
public:
    // Validates the options (one-line llmc::Error naming the flag); --shard_group_size must be 1.
    PowerSgd(const OptimizerConfig& config, const ParamLayout& layout, Transport& transport);
    std::string_view name() const override { return "powersgd"; }
    // transform: M, Q, P = M Q, orth, Q = M^T P, P Q^T, e; exchange: the two all-reduces; clip; apply: AdamW.
    // `grads` ends holding the averaged approximation before clipping.
    StepResult step(std::span<float> params, std::span<float> grads, float lr) override;
    // Blob: "powersgd", parameter count, rank, tensor count, step count, e, every Q, AdamW's m and v.
    void save_state(ByteWriter& out) const override;
    void load_state(ByteReader& in) override;

    const PowerSgdPlan& plan() const { return plan_; }
    int64_t steps() const { return t_; }
    std::span<const float> error() const { return error_; }

private:
    OptimizerConfig config_;
    const ParamLayout& layout_;
    Transport& transport_;
    PowerSgdPlan plan_;
    LargeVector<float> error_;          // e, flat like the parameters (zero outside compressed tensors); M in a step
    LargeVector<float> p_;              // collective 1's buffer: every P
    LargeVector<float> qf_;             // collective 2's: every Q (kept for the warm start), then the full tensors
    LargeVector<float> m_, v_;          // AdamW's moments
    std::vector<uint8_t> decay_mask_;   // per tensor: 1 if weight decay applies
    int64_t t_ = 0;                     // completed steps (AdamW's bias correction; the draw without warm start)
};

}  // namespace llmc
