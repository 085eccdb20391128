// UTF-8 helpers shared by the tokenizers (bpe.cpp, hf_tokenizer.cpp, pretoken_regex.cpp): decoding one code point
// of text already known to be valid (repair_utf8 has run), and appending one. Validation itself is repair_utf8's.
#pragma once
#include <cstddef>
#include <string>

namespace llmc::utf8 {

// The code point starting at s[i] of valid UTF-8, and its length in bytes.
inline char32_t decode(const unsigned char* s, size_t i, size_t& len) {
    const unsigned b = s[i];
    if (b < 0x80) {
        len = 1;
        return b;
    }
    if (b < 0xE0) {
        len = 2;
        return ((b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (b < 0xF0) {
        len = 3;
        return ((b & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    len = 4;
    return ((b & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

inline void append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

}  // namespace llmc::utf8
