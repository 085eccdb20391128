// The layers of the CPU model (model_cpu.h) as forward/backward pairs in fp32, for every family: token and
// position embedding, LayerNorm (affine or without parameters), RMSNorm, bias-optional matmuls, causal attention,
// RoPE, tanh-GELU, SwiGLU and the classifier's cross-entropy. All buffers are row-major; weights have PyTorch
// Linear's layout (out_features, in_features). Each is deterministic for a given thread count (cpu_layers.cpp).
#pragma once
#include <cstddef>

extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int);

namespace llmc::cpu {

// Rounds activation sub-buffers to whole cache lines so every tensor starts 64-byte aligned.
constexpr size_t round_up16(size_t n) { return (n + 15) / 16 * 16; }

// OpenBLAS (Debian's default build) keeps its own pthread pool, whose idle workers spin and yield for a while after
// each call, while OpenMP's idle workers spin after each parallel loop: alternating the two, as a forward pass does
// hundreds of times, makes them fight over the same cores (measured: up to 2x slower). So forward/backward run
// OpenBLAS single-threaded inside OpenMP's own threads and put the library's thread count back when they return.
class SingleThreadedBlas {
public:
    SingleThreadedBlas() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
    ~SingleThreadedBlas() { openblas_set_num_threads(saved_); }
    SingleThreadedBlas(const SingleThreadedBlas&) = delete;
    SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

private:
    int saved_;
};

// out = wte[token] (+ wpe[position] unless wpe is null); the backward adds into dwte (and dwpe unless null).
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, size_t B, size_t T, size_t C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, size_t B, size_t T, size_t C);

// LayerNorm over C, eps 1e-5; weight and bias null: without parameters. The backward adds into dinp, and into
// dweight and dbias unless they are null.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       size_t N, size_t C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, size_t N, size_t C);

// RMSNorm over C with a weight, eps 1e-5: out = x / sqrt(mean x^2 + eps) * weight. The backward adds into dinp and
// dweight.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, size_t N, size_t C);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, size_t N, size_t C);

// C(M, N) = op(A) op(B) + beta C, row-major, one slice of the larger output dimension per OpenMP thread.
void gemm(bool trans_a, bool trans_b, size_t M, size_t N, size_t K, const float* A, size_t lda, const float* B,
          size_t ldb, float beta, float* C, size_t ldc);
// out(N, OC) = [residual +] inp(N, IC) @ weight(OC, IC)^T [+ bias] (null skips either).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, const float* residual,
                    size_t N, size_t IC, size_t OC);
// dinp = dout @ weight (overwritten); dweight += dout^T @ inp; dbias += column sums of dout. Null skips a part.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, size_t N, size_t IC, size_t OC);

// Causal self-attention, scale 1/sqrt(head size), on qkv rows q | k | v (each C wide, head h at columns h*hs..).
// att keeps the (B, H, T, T) softmax probabilities for the backward, which overwrites dqkv.
void attention_forward(float* out, float* att, const float* qkv, size_t B, size_t T, size_t C, size_t H);
// One query against T cached keys and values ((T, C) rows each): attention_forward's last row, for sampling.
void attention_forward_cached(float* out, float* att, const float* q, const float* keys, const float* values,
                              size_t T, size_t C, size_t H);
void attention_backward(float* dqkv, float* datt_row, const float* dout, const float* qkv, const float* att,
                        size_t B, size_t T, size_t C, size_t H);

// Rotates q and k of each qkv row in place (GPT-NeoX rotate-half: pair (x[i], x[i + hs/2]) of each head), rows
// at positions position0 + (row % T). The backward applies the transpose to dq and dk of dqkv.
// `table` is llmc/base/rope_table.h's, which the CUDA kernels use too.
void rope_forward(float* qkv, const float* table, size_t B, size_t T, size_t C, size_t H, size_t position0 = 0);
void rope_backward(float* dqkv, const float* table, size_t B, size_t T, size_t C, size_t H);

// tanh-approximated GELU; the backward multiplies d by GELU'(inp) in place.
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* d, const float* inp, size_t n);

// SwiGLU: inp rows hold x then gate (each `width` wide), out = x * silu(gate). The backward writes dinp.
void swiglu_forward(float* out, const float* inp, size_t N, size_t width);
void swiglu_backward(float* dinp, const float* dout, const float* inp, size_t N, size_t width);

// Per row: logsumexp over the first V of Vp logits and the loss at the target; a row whose target is kNoTarget
// (llmc/base/targets.h) gets loss 0 (its logsumexp is still written).
void crossentropy_forward(float* losses, float* logsumexp, const float* logits, const int* targets, size_t N,
                          size_t V, size_t Vp);
// The N losses summed in order, divided by `count` (the rows with a target); 0 when count is 0.
double mean_loss(const float* losses, size_t N, size_t count);
// dlogits = dloss * (softmax - onehot(target)) over the first V columns, 0 in the padding; all zeros in a row
// whose target is kNoTarget.
void crossentropy_softmax_backward(float* dlogits, const float* logits, const float* logsumexp, const int* targets,
                                   float dloss, size_t N, size_t V, size_t Vp);

}  // namespace llmc::cpu
