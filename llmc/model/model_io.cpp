// Model file reading and writing (see model_io.h).
#include "llmc/model/model_io.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

namespace {

constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

// Parameter count of a shape, computed in 128 bits: a corrupt header (say L = 2^31 - 1) must give a size
// mismatch, not an overflow or an attempt to build a layout of billions of tensors.
unsigned __int128 param_count(const ModelConfig& c) {
    using U = unsigned __int128;
    const U C = c.channels, L = c.num_layers;
    if (c.is_olmo()) return U(c.padded_vocab_size) * C + L * 16 * C * C + (c.norm_has_weight() ? (2 * L + 1) * C : 0);
    return U(c.padded_vocab_size) * C + U(c.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
}

// The architecture fields of a version 6/7 header, as ModelConfig's family builds them.
enum : int32_t { kFamilyField = 8, kNormField, kActivationField, kPositionsField, kRopeThetaField, kTiedField,
                 kBiasesField, kMlpRowsField };

void write_arch_fields(const ModelConfig& c, int32_t* h) {
    h[kFamilyField] = static_cast<int32_t>(c.arch);
    h[kNormField] = !c.norm_has_weight() ? 2 : c.norm == NormKind::rmsnorm ? 3 : 1;
    h[kActivationField] = c.is_olmo() ? 2 : 1;
    h[kPositionsField] = c.learned_positions() ? 1 : 2;
    std::memcpy(&h[kRopeThetaField], &c.rope_theta, sizeof(float));
    if (c.learned_positions()) h[kRopeThetaField] = 0;
    h[kTiedField] = 1;
    h[kBiasesField] = c.has_biases() ? 1 : 0;
    h[kMlpRowsField] = c.mlp_input_rows();
}

// The family, norm and theta of a version 6/7 header; every other architecture field must be what they imply.
void read_arch_fields(const std::string& path, const int32_t* h, ModelConfig& c) {
    LLMC_CHECK(h[kFamilyField] == int32_t(ModelArch::gpt2) || h[kFamilyField] == int32_t(ModelArch::olmo),
               path + ": unknown model family " + std::to_string(h[kFamilyField]) + " in the header (1 gpt2, 2 olmo)");
    c.arch = static_cast<ModelArch>(h[kFamilyField]);
    c.norm = h[kNormField] == 3 ? NormKind::rmsnorm : NormKind::layernorm;
    if (c.is_olmo()) std::memcpy(&c.rope_theta, &h[kRopeThetaField], sizeof(float));
    validate_model_config(c, path);
    int32_t expected[kHeaderInts] = {};
    write_arch_fields(c, expected);
    const char* names[] = {"family", "norm", "activation", "positions", "rope theta", "tied embedding", "biases",
                           "MLP rows"};
    for (int f = kFamilyField; f <= kMlpRowsField; f++)
        LLMC_CHECK(h[f] == expected[f], path + ": header field " + std::to_string(f) + " (" + names[f - kFamilyField] +
                                            ") is " + std::to_string(h[f]) + " where this build's " + arch_name(c.arch) +
                                            " has " + std::to_string(expected[f]) +
                                            ": an architecture this build does not know");
}

struct ModelHeader {
    ModelConfig config;
    int version = 0;
};

// `hash`, when given, gets the header's bytes.
ModelHeader read_header(File& file, Xxh64* hash = nullptr) {
    const std::string& path = file.path();
    const size_t file_size = file.size();
    LLMC_CHECK(file_size >= kHeaderBytes, path + ": truncated: " + std::to_string(file_size) +
                                              " bytes is shorter than the 1024-byte model header");
    int32_t h[kHeaderInts];
    file.read_exact(h, sizeof(h), "model header");
    if (hash) hash->update(h, sizeof(h));
    LLMC_CHECK(h[0] == kModelFileMagic, path + ": bad magic " + std::to_string(h[0]) + " (expected " +
                                            std::to_string(kModelFileMagic) + " for an llm.c model file)");
    LLMC_CHECK(h[1] == kModelVersionFp32 || h[1] == kModelVersionBf16 || h[1] == kModelVersionArchFp32 ||
                   h[1] == kModelVersionArchBf16,
               path + ": unsupported model file version " + std::to_string(h[1]) +
                   " (expected 3 or 6 = fp32, 5 or 7 = bf16)");
    ModelHeader header;
    header.version = h[1];
    header.config.max_seq_len = h[2];
    header.config.vocab_size = h[3];
    header.config.num_layers = h[4];
    header.config.num_heads = h[5];
    header.config.channels = h[6];
    header.config.padded_vocab_size = h[7];
    const bool arch_header = h[1] == kModelVersionArchFp32 || h[1] == kModelVersionArchBf16;
    if (arch_header) read_arch_fields(path, h, header.config);
    validate_model_config(header.config, path);
    const size_t dtype_bytes = h[1] == kModelVersionFp32 || h[1] == kModelVersionArchFp32 ? 4 : 2;
    const unsigned __int128 expected_wide = kHeaderBytes + param_count(header.config) * dtype_bytes;
    LLMC_CHECK(file_size >= expected_wide,
               path + ": truncated: " + std::to_string(file_size) + " bytes, but a " + header.config.describe() +
                   " model needs " +
                   (expected_wide >> 63 ? std::string("more than 2^63") : std::to_string(size_t(expected_wide))));
    const size_t expected = static_cast<size_t>(expected_wide);
    LLMC_CHECK(file_size == expected, path + ": " + std::to_string(file_size - expected) +
                                          " unexpected trailing bytes after the parameters of a " +
                                          header.config.describe() + " model");
    return header;
}

// A NaN or infinite weight would only show later, as a loss of nan (or a run stopped as diverged): named here.
void require_finite(const std::string& path, const ModelConfig& config, std::span<const float> params) {
    const auto bad = std::find_if(params.begin(), params.end(), [](float v) { return !std::isfinite(v); });
    if (bad == params.end()) return;
    const size_t index = static_cast<size_t>(bad - params.begin());
    std::string tensor = "?";
    for (const ParamTensor& t : ParamLayout::of(config).tensors)
        if (index >= t.offset && index < t.offset + t.numel) tensor = t.name;
    fail(path + ": parameter " + std::to_string(index) + " (" + tensor + ") is " + (std::isnan(*bad) ? "nan" : "inf") +
         ": a damaged file, or weights saved after the training diverged");
}

}  // namespace

ModelConfig read_model_config(const std::string& path) {
    require_regular_file(path);
    File file(path, "rb");
    return read_header(file).config;
}

void load_model(const std::string& path, const ModelConfig& expected, std::span<float> params, FileDigest* digest) {
    require_regular_file(path);
    File file(path, "rb");
    Xxh64 hasher;
    Xxh64* hash = digest ? &hasher : nullptr;  // only when asked: hashing a 1B model's 4 GB is not free
    const ModelHeader header = read_header(file, hash);
    LLMC_CHECK(header.config == expected, path + ": checkpoint shape " + header.config.describe() +
                                              " disagrees with config " + expected.describe());
    const size_t numel = ParamLayout::of(expected).num_params;
    LLMC_CHECK(params.size() == numel, path + ": parameter buffer holds " + std::to_string(params.size()) +
                                           " floats, the model has " + std::to_string(numel));
    if (header.version == kModelVersionFp32 || header.version == kModelVersionArchFp32) {
        file.read_exact(params.data(), numel * sizeof(float), "parameters");
        if (hash) {
            hash->update(params.data(), numel * sizeof(float));
            *digest = {hash->length(), hash->digest()};
        }
        require_finite(path, expected, params);
        return;
    }
    // bf16 is the top half of an fp32: widen by shifting into the high 16 bits. Chunked to bound memory.
    constexpr size_t kChunk = size_t(1) << 20;
    std::vector<uint16_t> buffer(std::min(kChunk, numel));
    for (size_t done = 0; done < numel;) {
        const size_t n = std::min(kChunk, numel - done);
        file.read_exact(buffer.data(), n * sizeof(uint16_t), "bf16 parameters");
        if (hash) hash->update(buffer.data(), n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            const uint32_t bits = static_cast<uint32_t>(buffer[i]) << 16;
            std::memcpy(&params[done + i], &bits, sizeof(float));
        }
        done += n;
    }
    if (hash) *digest = {hash->length(), hash->digest()};
    require_finite(path, expected, params);
}

FileDigest save_model(const std::string& path, const ModelConfig& config, std::span<const float> params) {
    const size_t numel = ParamLayout::of(config).num_params;
    LLMC_CHECK(params.size() == numel, path + ": cannot save " + std::to_string(params.size()) +
                                           " floats as a " + config.describe() + " model of " +
                                           std::to_string(numel) + " parameters");
    int32_t h[kHeaderInts] = {};
    h[0] = kModelFileMagic;
    h[1] = config.arch == ModelArch::gpt2 ? kModelVersionFp32 : kModelVersionArchFp32;
    h[2] = config.max_seq_len;
    h[3] = config.vocab_size;
    h[4] = config.num_layers;
    h[5] = config.num_heads;
    h[6] = config.channels;
    h[7] = config.padded_vocab_size;
    if (config.arch != ModelArch::gpt2) write_arch_fields(config, h);
    AtomicFile file(path);
    file.write(h, sizeof(h));
    file.write(params.data(), params.size_bytes());
    return file.commit();
}

}  // namespace llmc
