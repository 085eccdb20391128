// llm.c model checkpoints: a header of 256 int32 (magic 20240326, version 3 = fp32 or 5 = bf16, max_seq_len,
// vocab_size, num_layers, num_heads, channels, padded_vocab_size) followed by every parameter in
// ParamLayout::gpt2 order. Files written here load in llm.c and the reverse, so its gpt2_124M.bin and its
// trainers interoperate with ours. Every error names the file.
#pragma once
#include <span>
#include <string>

#include "llmc/base/checksum.h"
#include "llmc/model/gpt2/gpt2_layout.h"

namespace llmc {

inline constexpr int kModelFileMagic = 20240326;
inline constexpr int kModelVersionFp32 = 3;
inline constexpr int kModelVersionBf16 = 5;

// Reads and validates the header (magic, version, shape, and that the file size is exactly header +
// parameters of that shape).
ModelConfig read_model_config(const std::string& path);

// Loads the parameters into `params` (fp32; a bf16 file is widened). Throws
// "<path>: checkpoint shape L=.. disagrees with config L=.." when the header is not `expected`. With `digest`,
// also returns the file's size and XXH64, hashed as it is read (the header check makes it every byte).
void load_model(const std::string& path, const ModelConfig& expected, std::span<float> params,
                FileDigest* digest = nullptr);

// Writes an fp32 (version 3) file atomically: a crash leaves the previous file in place. Returns the file's
// digest.
FileDigest save_model(const std::string& path, const ModelConfig& config, std::span<const float> params);

}  // namespace llmc
