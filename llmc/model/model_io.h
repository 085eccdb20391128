// Model files: a header of 256 int32 followed by every parameter in ParamLayout::of order.
//   GPT-2: llm.c's format exactly (magic 20240326, version 3 = fp32 or 5 = bf16, max_seq_len, vocab_size,
//     num_layers, num_heads, channels, padded_vocab_size), so llm.c's gpt2_124M.bin and its trainers interoperate
//     with ours.
//   Other families: the same magic with version 6 = fp32 or 7 = bf16 and the same six sizes, then the
//     architecture at [8..15]: family (1 gpt2, 2 olmo), norm (1 affine LayerNorm, 2 LayerNorm without
//     parameters, 3 RMSNorm), activation (1 tanh-GELU, 2 SwiGLU), positions (1 learned, 2 RoPE), RoPE theta (the
//     float's bits), tied embedding (1), biases (0 or 1), the MLP input projection's rows. llm.c refuses such a
//     file by its version; the reader checks every field against what the family builds.
// Every error names the file.
#pragma once
#include <span>
#include <string>

#include "llmc/base/checksum.h"
#include "llmc/model/param_layout.h"
#include "llmc/model/model_config.h"

namespace llmc {

inline constexpr int kModelFileMagic = 20240326;
inline constexpr int kModelVersionFp32 = 3;
inline constexpr int kModelVersionBf16 = 5;
inline constexpr int kModelVersionArchFp32 = 6;
inline constexpr int kModelVersionArchBf16 = 7;

// Reads and validates the header (magic, version, shape, and that the file size is exactly header +
// parameters of that shape).
ModelConfig read_model_config(const std::string& path);

// Loads the parameters into `params` (fp32; a bf16 file is widened). Throws
// "<path>: checkpoint shape L=.. disagrees with config L=.." when the header is not `expected`. With `digest`,
// also returns the file's size and XXH64, hashed as it is read (the header check makes it every byte).
void load_model(const std::string& path, const ModelConfig& expected, std::span<float> params,
                FileDigest* digest = nullptr);

// Writes an fp32 file (version 3 for GPT-2, 6 for the other families) atomically: a crash leaves the previous file in place. Returns the file's
// digest.
FileDigest save_model(const std::string& path, const ModelConfig& config, std::span<const float> params);

}  // namespace llmc
