// ByteStream: a file read in order through zlib (gzip) or libzstd (Zstandard), or as it is.
#include "llmc/base/byte_stream.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "llmc/base/error.h"

namespace llmc {

Compression compression_of(std::string_view path) {
    if (path.ends_with(".gz")) return Compression::gzip;
    if (path.ends_with(".zst")) return Compression::zstd;
    return Compression::none;
}

std::string_view content_name(std::string_view path) {
    switch (compression_of(path)) {
        case Compression::gzip: return path.substr(0, path.size() - 3);
        case Compression::zstd: return path.substr(0, path.size() - 4);
        case Compression::none: break;
    }
    return path;
}

struct ByteStream::Decoder {
    Decoder(const std::string& path, Compression compression) : path(path), compression(compression) {
        file = std::fopen(path.c_str(), "rb");
        LLMC_CHECK(file != nullptr, path + ": cannot open (" + std::strerror(errno) + ")");
        if (compression == Compression::none) return;
        input.resize(1u << 20);
        if (compression == Compression::gzip) {
            // 16 + MAX_WBITS: gzip framing only (a bare zlib or deflate stream is refused as corrupt)
            if (inflateInit2(&gzip, 16 + MAX_WBITS) != Z_OK) {
                std::fclose(file);
                fail(path + ": cannot start zlib (out of memory?)");
            }
        } else {
            zstd = ZSTD_createDStream();
            if (zstd == nullptr) {
                std::fclose(file);
                fail(path + ": cannot start the Zstandard decoder (out of memory?)");
            }
        }
    }
    ~Decoder() {
        if (compression == Compression::gzip) inflateEnd(&gzip);
        if (zstd != nullptr) ZSTD_freeDStream(zstd);
        std::fclose(file);
    }

    // Refills `input` from the file; sets at_eof when the file has no more.
    void refill() {
        input_size = std::fread(input.data(), 1, input.size(), file);
        input_used = 0;
        LLMC_CHECK(!std::ferror(file), path + ": read error (" + std::strerror(errno) + ")");
        if (input_size == 0) at_eof = true;
    }

    [[noreturn]] void truncated(const char* format) const {
        fail(path + ": truncated " + format + " data (the file ends inside a compressed stream)");
    }

    size_t read_plain(char* out, size_t n) {
        const size_t got = std::fread(out, 1, n, file);
        LLMC_CHECK(!std::ferror(file), path + ": read error (" + std::strerror(errno) + ")");
        return got;
    }

    size_t read_gzip(char* out, size_t n) {
        gzip.next_out = reinterpret_cast<Bytef*>(out);
        gzip.avail_out = static_cast<uInt>(std::min<size_t>(n, UINT32_MAX));
        const size_t wanted = gzip.avail_out;
        while (gzip.avail_out > 0) {
            if (input_used == input_size && !at_eof) refill();
            if (input_used == input_size) {  // the file has ended
                if (!member_open) break;
                truncated("gzip");
            }
            if (!member_open) {  // another member follows the last one (concatenated .gz files)
                if (inflateReset(&gzip) != Z_OK) fail(path + ": zlib reset failed");
                member_open = true;
            }
            gzip.next_in = reinterpret_cast<Bytef*>(input.data() + input_used);
            gzip.avail_in = static_cast<uInt>(input_size - input_used);
            const int status = inflate(&gzip, Z_NO_FLUSH);
            input_used = input_size - gzip.avail_in;
            if (status == Z_STREAM_END) {
                member_open = false;
            } else if (status != Z_OK && status != Z_BUF_ERROR) {
                fail(path + ": corrupt gzip data (zlib: " + (gzip.msg != nullptr ? gzip.msg : zError(status)) +
                     ")");
            }
        }
        return wanted - gzip.avail_out;
    }

    size_t read_zstd(char* out, size_t n) {
        ZSTD_outBuffer output = {out, n, 0};
        while (output.pos < output.size) {
            if (input_used == input_size && !at_eof) refill();
            ZSTD_inBuffer in = {input.data(), input_size, input_used};
            const size_t before = output.pos;
            const size_t hint = ZSTD_decompressStream(zstd, &output, &in);
            if (ZSTD_isError(hint)) {
                fail(path + ": corrupt Zstandard data (" + ZSTD_getErrorName(hint) + ")");
            }
            const bool consumed = in.pos != input_used;
            input_used = in.pos;
            if (hint == 0) frame_open = false;  // a frame ended and all of it was returned
            else if (consumed) frame_open = true;
            if (input_used == input_size && at_eof && output.pos == before) {  // nothing more can come
                if (frame_open) truncated("Zstandard");
                break;
            }
        }
        return output.pos;
    }

    std::string path;
    Compression compression;
    std::FILE* file = nullptr;
    std::vector<char> input;
    size_t input_size = 0, input_used = 0;
    bool at_eof = false;
    z_stream gzip{};
    bool member_open = true;  // an empty .gz file is cut short too: gzip data holds at least one member
    ZSTD_DStream* zstd = nullptr;
    bool frame_open = true;   // likewise one frame
};

ByteStream::ByteStream(const std::string& path)
    : path_(path), decoder_(std::make_unique<Decoder>(path, compression_of(path))) {}

ByteStream::~ByteStream() = default;

size_t ByteStream::read(void* out, size_t n) {
    char* bytes = static_cast<char*>(out);
    size_t got = 0;
    switch (decoder_->compression) {
        case Compression::none: got = decoder_->read_plain(bytes, n); break;
        case Compression::gzip: got = decoder_->read_gzip(bytes, n); break;
        case Compression::zstd: got = decoder_->read_zstd(bytes, n); break;
    }
    position_ += got;
    return got;
}

void ByteStream::skip(uint64_t n) {
    std::vector<char> scratch(static_cast<size_t>(std::min<uint64_t>(n, 1u << 20)));
    for (uint64_t left = n; left > 0;) {
        const size_t got = read(scratch.data(), static_cast<size_t>(std::min<uint64_t>(left, scratch.size())));
        LLMC_CHECK(got > 0, path_ + ": the content ends " + std::to_string(left) + " bytes before the offset " +
                                std::to_string(position_ + left) + " (did the file change while being read?)");
        left -= got;
    }
}

std::string read_all_content(const std::string& path, size_t max_bytes) {
    ByteStream stream(path);
    std::string content;
    for (;;) {
        const size_t used = content.size();
        LLMC_CHECK(used <= max_bytes, path + ": larger than " + std::to_string(max_bytes) + " bytes" +
                                          (compression_of(path) == Compression::none ? "" : " decompressed"));
        content.resize(used + (1u << 20));
        const size_t got = stream.read(content.data() + used, 1u << 20);
        content.resize(used + got);
        if (got == 0) return content;
    }
}

}  // namespace llmc
