// Reader and writer of the llm.c tokenizer decode file (see tokenizer.h).
#include "llmc/data/tokenizer.h"

#include <array>
#include <cstring>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

namespace {
constexpr size_t kTokenizerHeaderBytes = 256 * sizeof(uint32_t);
constexpr uint32_t kMaxTokens = 1u << 24;  // far above any real vocabulary; rejects garbage counts early
}  // namespace

TokenizerDecoder TokenizerDecoder::load(const std::string& path) {
    require_regular_file(path);
    const std::vector<std::byte> raw = read_whole_file(path);
    LLMC_CHECK(raw.size() >= kTokenizerHeaderBytes,
               path + ": truncated tokenizer file: " + std::to_string(raw.size()) +
                   " bytes is shorter than the 1024-byte header");
    std::array<uint32_t, 256> header;
    std::memcpy(header.data(), raw.data(), kTokenizerHeaderBytes);
    LLMC_CHECK(header[0] == kTokenizerMagic, path + ": bad magic " + std::to_string(header[0]) +
                                                 " (expected 20240328: not an llm.c tokenizer file)");
    LLMC_CHECK(header[1] == 1 || header[1] == 2,
               path + ": unsupported tokenizer version " + std::to_string(header[1]) + " (expected 1 or 2)");
    const uint32_t count = header[2];
    LLMC_CHECK(count > 0 && count <= kMaxTokens,
               path + ": implausible token count " + std::to_string(count) + " in header");
    const uint32_t eot = header[1] == 1 ? 50256u : header[3];
    LLMC_CHECK(eot < count, path + ": EOT id " + std::to_string(eot) + " is outside the " + std::to_string(count) +
                                " tokens");

    TokenizerDecoder decoder;
    decoder.path_ = path;
    decoder.eot_ = static_cast<int>(eot);
    decoder.offsets_.reserve(count + 1);
    decoder.offsets_.push_back(0);
    decoder.bytes_.reserve(raw.size() - kTokenizerHeaderBytes);
    const char* data = reinterpret_cast<const char*>(raw.data());
    size_t pos = kTokenizerHeaderBytes;
    for (uint32_t i = 0; i < count; i++) {
        LLMC_CHECK(pos < raw.size(), path + ": truncated tokenizer file: ends before token " + std::to_string(i) +
                                         " of " + std::to_string(count));
        const size_t length = static_cast<unsigned char>(data[pos++]);
        LLMC_CHECK(length > 0, path + ": token " + std::to_string(i) + " has length 0 (corrupt tokenizer file)");
        LLMC_CHECK(length <= raw.size() - pos, path + ": truncated tokenizer file: token " + std::to_string(i) +
                                                   " of " + std::to_string(count) + " needs " +
                                                   std::to_string(length) + " bytes, " +
                                                   std::to_string(raw.size() - pos) + " remain");
        decoder.bytes_.append(data + pos, length);
        pos += length;
        decoder.offsets_.push_back(static_cast<uint32_t>(decoder.bytes_.size()));
    }
    LLMC_CHECK(pos == raw.size(), path + ": " + std::to_string(raw.size() - pos) +
                                      " unexpected bytes after the last token (corrupt tokenizer file)");
    return decoder;
}

std::string TokenizerDecoder::decode(int id) const {
    LLMC_CHECK(id >= 0 && static_cast<size_t>(id) < size(), path_ + ": token id " + std::to_string(id) +
                                                                " is outside the " + std::to_string(size()) +
                                                                " tokens of this tokenizer");
    return bytes_.substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

std::string TokenizerDecoder::decode(std::span<const int> ids) const {
    std::string text;
    for (const int id : ids) {
        LLMC_CHECK(id >= 0 && static_cast<size_t>(id) < size(), path_ + ": token id " + std::to_string(id) +
                                                                    " is outside the " + std::to_string(size()) +
                                                                    " tokens of this tokenizer");
        text.append(bytes_, offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    return text;
}

TokenizerDecoder TokenizerDecoder::from_token_bytes(const std::string& source,
                                                   std::span<const std::string> token_bytes, int eot) {
    LLMC_CHECK(!token_bytes.empty() && token_bytes.size() <= kMaxTokens,
               source + ": implausible token count " + std::to_string(token_bytes.size()));
    TokenizerDecoder decoder;
    decoder.path_ = source;
    decoder.eot_ = eot;
    decoder.offsets_.reserve(token_bytes.size() + 1);
    decoder.offsets_.push_back(0);
    for (const std::string& bytes : token_bytes) {
        decoder.bytes_ += bytes;
        decoder.offsets_.push_back(static_cast<uint32_t>(decoder.bytes_.size()));
    }
    return decoder;
}

void write_tokenizer_file(const std::string& path, const std::vector<std::string>& token_bytes, int eot) {
    LLMC_CHECK(!token_bytes.empty() && token_bytes.size() <= kMaxTokens,
               path + ": cannot write a tokenizer of " + std::to_string(token_bytes.size()) + " tokens");
    LLMC_CHECK(eot >= 0 && static_cast<size_t>(eot) < token_bytes.size(),
               path + ": EOT id " + std::to_string(eot) + " is outside the vocabulary");
    std::array<uint32_t, 256> header{};
    header[0] = kTokenizerMagic;
    header[1] = kTokenizerVersion;
    header[2] = static_cast<uint32_t>(token_bytes.size());
    header[3] = static_cast<uint32_t>(eot);
    std::string body;
    for (size_t i = 0; i < token_bytes.size(); i++) {
        const std::string& token = token_bytes[i];
        LLMC_CHECK(!token.empty() && token.size() <= 255,
                   path + ": token " + std::to_string(i) + " is " + std::to_string(token.size()) +
                       " bytes; the format stores 1..255");
        body += static_cast<char>(token.size());
        body += token;
    }
    AtomicFile file(path);
    file.write(header.data(), kTokenizerHeaderBytes);
    file.write(body.data(), body.size());
    file.commit();
}

}  // namespace llmc
