// Bucket encoder/decoder and value quantizers (layout specified in codec.h). Tensors are split into groups
// of 8 chunks so that every group's bit-packed parts (sign bits, 12-bit indices, Elias-Fano chunks of a fixed
// B bits each) start and end on byte boundaries: groups write disjoint bytes and run in parallel without races.
#include "llmc/optim/demo/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "llmc/base/error.h"

namespace demo {

const char* value_encoding_name(llmc::DemoValueEncoding e) {
    switch (e) {
        case llmc::DemoValueEncoding::fp32: return "fp32";
        case llmc::DemoValueEncoding::bf16: return "bf16";
        case llmc::DemoValueEncoding::sign: return "sign";
    }
    return "?";
}

const char* index_encoding_name(llmc::DemoIndexEncoding e) {
    switch (e) {
        case llmc::DemoIndexEncoding::smallest: return "smallest";
        case llmc::DemoIndexEncoding::packed12: return "packed12";
        case llmc::DemoIndexEncoding::entropy: return "entropy";
    }
    return "?";
}

void check_wire_format(const ModelPlan& plan, WireFormat format) {
    if (format.indices == llmc::DemoIndexEncoding::packed12)
        LLMC_CHECK(plan.max_chunk_elems <= kPacked12MaxChunkElems,
                   "--demo_indices packed12 needs chunks of at most 4096 elements, but --demo_chunk " +
                       std::to_string(plan.chunk) + " gives chunks of " + std::to_string(plan.max_chunk_elems));
}

namespace {

size_t value_bytes_unpadded(size_t items, llmc::DemoValueEncoding values) {
    switch (values) {
        case llmc::DemoValueEncoding::fp32: return items * 4;
        case llmc::DemoValueEncoding::bf16: return items * 2;
        case llmc::DemoValueEncoding::sign: return (items + 7) / 8;
    }
    return 0;
}

size_t index_bytes_unpadded(const TensorPlan& t, size_t items, llmc::DemoIndexEncoding indices) {
    switch (indices) {
        case llmc::DemoIndexEncoding::smallest: return items * static_cast<size_t>(t.index_bytes);
        case llmc::DemoIndexEncoding::packed12: return (12 * items + 7) / 8;
        case llmc::DemoIndexEncoding::entropy:
            return t.k == 0 ? 0 : (items / t.k * entropy_chunk_bits(t.chunk_elems, t.k) + 7) / 8;
    }
    return 0;
}

uint8_t value_id(llmc::DemoValueEncoding e) { return static_cast<uint8_t>(e); }
uint8_t index_id(llmc::DemoIndexEncoding e) { return static_cast<uint8_t>(e); }

template <typename T>
void store(std::byte* p, T v) {
    std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T load(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// Where each part of each tensor's section starts inside the bucket.
struct SectionOffsets {
    size_t scales = 0, values = 0, indices = 0, end = 0;
};

std::vector<SectionOffsets> section_offsets(const ModelPlan& plan, WireFormat format) {
    std::vector<SectionOffsets> out(plan.tensors.size());
    size_t pos = kBucketHeaderBytes;
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        SectionOffsets& s = out[t];
        s.scales = pos;
        if (format.values == llmc::DemoValueEncoding::sign) pos += round_up4(tp.num_chunks * 4);
        s.values = pos;
        pos += round_up4(value_bytes_unpadded(tp.selected(), format.values));
        s.indices = pos;
        pos += index_part_bytes(tp, format.indices);
        s.end = pos;
    }
    return out;
}

// ---- the entropy encoding's bit stream (codec.h: stream bit b = bit b%8 of byte b/8) ----
// Writes from a byte boundary into a zeroed buffer, 4 completed bytes at a time (never a byte past the bits
// written, so groups stay disjoint). Invariant between calls: n < 32 pending bits in acc, the bits above them 0.
struct BitWriter {
    uint8_t* p;
    uint64_t acc = 0;
    size_t n = 0;
    void put(uint32_t v, size_t bits) {  // bits <= 32, v < 2^bits
        acc |= static_cast<uint64_t>(v) << n;
        n += bits;
        if (n >= 32) {
            const uint32_t word = static_cast<uint32_t>(acc);
            std::memcpy(p, &word, 4);
            p += 4;
            acc >>= 32;
            n -= 32;
        }
    }
    void zeros(size_t count) {  // whole zero bytes are skipped: the buffer is zeroed
        const size_t total = n + count;
        if (total < 32) {
            n = total;
            return;
        }
        const uint32_t word = static_cast<uint32_t>(acc);
        std::memcpy(p, &word, 4);
        p += 4 + (total - 32) / 8;
        acc = 0;
        n = (total - 32) % 8;
    }
    void unary(size_t gap) {  // `gap` zeros, then a one
        if (gap < 32) {
            put(1u << gap, gap + 1);
        } else {
            zeros(gap);
            put(1, 1);
        }
    }
    void flush() {
        for (size_t b = 0; b < n; b += 8) *p++ = static_cast<uint8_t>(acc >> b);
    }
};

// Reads from a byte boundary up to `end`; bits past `end` read as 0 (the plan's sizes keep every chunk inside).
struct BitReader {
    const uint8_t* p;
    const uint8_t* end;
    uint64_t buf = 0;
    int n = 0;  // valid bits in buf (bits above them may hold the next byte's, which refill ORs in again)
    void refill() {
        if (end - p >= 8) {
            uint64_t w;
            std::memcpy(&w, p, 8);
            buf |= w << n;
            p += (63 - n) >> 3;
            n |= 56;
        } else {
            while (n <= 56 && p < end) {
                buf |= static_cast<uint64_t>(*p++) << n;
                n += 8;
            }
            if (n < 32) n = 32;  // past the end: zeros
        }
    }
    uint32_t get(int bits) {  // bits <= 32
        if (n < bits) refill();
        const uint32_t v = static_cast<uint32_t>(buf & ((uint64_t{1} << bits) - 1));
        buf >>= bits;
        n -= bits;
        return v;
    }
};

// One chunk's Elias-Fano code (x: k strictly ascending indices < U, checked by the caller).
void encode_entropy_chunk(BitWriter& w, const uint32_t* x, size_t k, int l, uint32_t high_max) {
    const uint32_t low_mask = static_cast<uint32_t>((uint64_t{1} << l) - 1);
    if (l > 0)
        for (size_t i = 0; i < k; i++) w.put(x[i] & low_mask, static_cast<size_t>(l));
    uint32_t prev = 0;
    for (size_t i = 0; i < k; i++) {
        const uint32_t h = x[i] >> l;
        w.unary(h - prev);
        prev = h;
    }
    w.zeros(high_max - prev);
}

// Decodes one chunk into x[0..k). Returns 0, or the error bit for a unary part without exactly k ones; range and
// order are checked by the caller.
int decode_entropy_chunk(BitReader& r, uint32_t* x, size_t k, int l, uint32_t high_max) {
    if (l > 0)
        for (size_t i = 0; i < k; i++) x[i] = r.get(l);
    else
        for (size_t i = 0; i < k; i++) x[i] = 0;
    size_t remaining = k + high_max, pos = 0, count = 0;
    while (remaining > 0) {
        const int bits = static_cast<int>(std::min<size_t>(remaining, 32));
        uint32_t word = r.get(bits);
        while (word != 0) {
            if (count == k) return 4;  // more ones than items
            const size_t h = pos + static_cast<size_t>(std::countr_zero(word)) - count;
            x[count] |= static_cast<uint32_t>(h << l);
            count++;
            word &= word - 1;
        }
        pos += static_cast<size_t>(bits);
        remaining -= static_cast<size_t>(bits);
    }
    return count == k ? 0 : 4;
}

struct ChunkGroup {
    uint32_t tensor;
    size_t first, last;  // chunk range [first, last) inside the tensor
};

// Groups of 8 chunks (bit-packed parts of a group then start on a byte boundary, see the file comment).
std::vector<ChunkGroup> chunk_groups(const ModelPlan& plan) {
    constexpr size_t kGroup = 8;
    std::vector<ChunkGroup> groups;
    for (size_t t = 0; t < plan.tensors.size(); t++)
        for (size_t c = 0; c < plan.tensors[t].num_chunks; c += kGroup)
            groups.push_back({static_cast<uint32_t>(t), c, std::min(c + kGroup, plan.tensors[t].num_chunks)});
    return groups;
}

}  // namespace

size_t value_part_bytes(const TensorPlan& t, llmc::DemoValueEncoding values) {
    const size_t scales = values == llmc::DemoValueEncoding::sign ? round_up4(t.num_chunks * 4) : 0;
    return scales + round_up4(value_bytes_unpadded(t.selected(), values));
}

size_t index_part_bytes(const TensorPlan& t, llmc::DemoIndexEncoding indices) {
    return round_up4(index_bytes_unpadded(t, t.selected(), indices));
}

int entropy_low_bits(size_t chunk_elems, size_t k) {
    LLMC_CHECK(k >= 1 && k <= chunk_elems, "entropy_low_bits: need 1 <= k <= chunk elements");
    return static_cast<int>(std::bit_width(chunk_elems / k)) - 1;
}

size_t entropy_chunk_bits(size_t chunk_elems, size_t k) {
    const int l = entropy_low_bits(chunk_elems, k);
    return k * static_cast<size_t>(l) + k + ((chunk_elems - 1) >> l);
}

size_t tensor_section_bytes(const TensorPlan& t, WireFormat format) {
    return value_part_bytes(t, format.values) + index_part_bytes(t, format.indices);
}

size_t bucket_bytes(const ModelPlan& plan, WireFormat format) {
    size_t total = kBucketHeaderBytes;
    for (const TensorPlan& t : plan.tensors) total += tensor_section_bytes(t, format);
    return total;
}

float quantize_chunk(llmc::DemoValueEncoding values, float* vals, size_t k) {
    switch (values) {
        case llmc::DemoValueEncoding::fp32: return 0.0f;
        case llmc::DemoValueEncoding::bf16:
            for (size_t j = 0; j < k; j++) vals[j] = round_to_bf16(vals[j]);
            return 0.0f;
        case llmc::DemoValueEncoding::sign: {
            double sum = 0.0;
            for (size_t j = 0; j < k; j++) sum += std::fabs(static_cast<double>(vals[j]));
            const float scale = static_cast<float>(sum / static_cast<double>(k));
            for (size_t j = 0; j < k; j++) vals[j] = scale == 0.0f ? 0.0f : (vals[j] < 0.0f ? -scale : scale);
            return scale;
        }
    }
    return 0.0f;
}

void encode_bucket(const ModelPlan& plan, WireFormat format, const Selection& sel, std::vector<std::byte>& out) {
    check_wire_format(plan, format);
    LLMC_CHECK(sel.indices.size() == plan.total_selected && sel.values.size() == plan.total_selected &&
                   (format.values != llmc::DemoValueEncoding::sign || sel.scales.size() == plan.total_chunks),
               "encode_bucket: selection does not match the chunk plan");
    const std::vector<SectionOffsets> sections = section_offsets(plan, format);
    const size_t total = sections.empty() ? kBucketHeaderBytes : sections.back().end;
    out.assign(total, std::byte{0});  // zeroed: bit-packed parts are OR-ed in, padding stays 0

    std::byte* h = out.data();
    store<uint32_t>(h + 0, kBucketMagic);
    store<uint16_t>(h + 4, kBucketVersion);
    store<uint8_t>(h + 6, value_id(format.values));
    store<uint8_t>(h + 7, index_id(format.indices));
    store<uint32_t>(h + 8, static_cast<uint32_t>(plan.tensors.size()));
    store<uint32_t>(h + 12, 0);
    store<uint64_t>(h + 16, plan.total_chunks);
    store<uint64_t>(h + 24, plan.fingerprint());

    const std::vector<ChunkGroup> groups = chunk_groups(plan);
    int unordered = 0;  // entropy: a chunk's indices not strictly ascending inside it (a caller's bug)
#pragma omp parallel for schedule(dynamic, 16) reduction(| : unordered)
    for (size_t g = 0; g < groups.size(); g++) {
        const ChunkGroup& grp = groups[g];
        const TensorPlan& tp = plan.tensors[grp.tensor];
        const SectionOffsets& so = sections[grp.tensor];
        const size_t j0 = grp.first * tp.k, j1 = grp.last * tp.k;  // items of this group, tensor-relative
        const uint32_t* idx = sel.indices.data() + tp.select_offset;
        const float* val = sel.values.data() + tp.select_offset;
        std::byte* vals_out = h + so.values;
        switch (format.values) {
            case llmc::DemoValueEncoding::fp32:
                std::memcpy(vals_out + j0 * 4, val + j0, (j1 - j0) * 4);
                break;
            case llmc::DemoValueEncoding::bf16:
                for (size_t j = j0; j < j1; j++) store<uint16_t>(vals_out + 2 * j, bf16_bits(val[j]));
                break;
            case llmc::DemoValueEncoding::sign: {
                const float* scales = sel.scales.data() + tp.chunk_offset;
                for (size_t c = grp.first; c < grp.last; c++) store<float>(h + so.scales + 4 * c, scales[c]);
                auto* bits = reinterpret_cast<uint8_t*>(vals_out);
                for (size_t j = j0; j < j1; j++)
                    if (val[j] < 0.0f) bits[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
                break;
            }
        }
        std::byte* idx_out = h + so.indices;
        if (format.indices == llmc::DemoIndexEncoding::entropy) {
            const int l = entropy_low_bits(tp.chunk_elems, tp.k);
            const uint32_t high_max = static_cast<uint32_t>((tp.chunk_elems - 1) >> l);
            const size_t chunk_bits = entropy_chunk_bits(tp.chunk_elems, tp.k);  // grp.first % 8 == 0: whole bytes
            BitWriter w{reinterpret_cast<uint8_t*>(idx_out) + grp.first * chunk_bits / 8};
            for (size_t c = grp.first; c < grp.last; c++) {
                const uint32_t* x = idx + c * tp.k;
                bool ok = x[tp.k - 1] < tp.chunk_elems;
                for (size_t i = 1; i < tp.k; i++) ok = ok && x[i - 1] < x[i];
                if (!ok) {
                    unordered = 1;
                    break;
                }
                encode_entropy_chunk(w, x, tp.k, l, high_max);
            }
            w.flush();
        } else if (format.indices == llmc::DemoIndexEncoding::packed12) {
            auto* bytes = reinterpret_cast<uint8_t*>(idx_out);
            for (size_t j = j0; j < j1; j++) {
                const size_t bit = 12 * j;
                const uint32_t v = (idx[j] & 0xfffu) << (bit & 7);
                bytes[bit >> 3] |= static_cast<uint8_t>(v);
                bytes[(bit >> 3) + 1] |= static_cast<uint8_t>(v >> 8);
            }
        } else {
            switch (tp.index_bytes) {
                case 1:
                    for (size_t j = j0; j < j1; j++) store<uint8_t>(idx_out + j, static_cast<uint8_t>(idx[j]));
                    break;
                case 2:
                    for (size_t j = j0; j < j1; j++)
                        store<uint16_t>(idx_out + 2 * j, static_cast<uint16_t>(idx[j]));
                    break;
                default: std::memcpy(idx_out + 4 * j0, idx + j0, (j1 - j0) * 4); break;
            }
        }
    }
    LLMC_CHECK(!unordered, "encode_bucket: --demo_indices entropy needs each chunk's indices strictly ascending and "
                           "inside the chunk");
}

void decode_bucket(const ModelPlan& plan, WireFormat format, std::span<const std::byte> bucket, Selection& sel,
                   const std::string& who) {
    check_wire_format(plan, format);
    LLMC_CHECK(bucket.size() >= kBucketHeaderBytes,
               who + ": " + std::to_string(bucket.size()) + " bytes, shorter than the DeMo bucket header");
    const std::byte* h = bucket.data();
    LLMC_CHECK(load<uint32_t>(h + 0) == kBucketMagic, who + ": not a DeMo bucket (bad magic)");
    const uint16_t version = load<uint16_t>(h + 4);
    LLMC_CHECK(version == kBucketVersion, who + ": DeMo bucket version " + std::to_string(version) +
                                              ", this build reads version " + std::to_string(kBucketVersion));
    const uint8_t vid = load<uint8_t>(h + 6), iid = load<uint8_t>(h + 7);
    LLMC_CHECK(vid == value_id(format.values),
               who + ": value encoding id " + std::to_string(vid) + " but this rank uses " +
                   value_encoding_name(format.values) + " (--demo_values differs between ranks)");
    LLMC_CHECK(iid == index_id(format.indices),
               who + ": index encoding id " + std::to_string(iid) + " but this rank uses " +
                   index_encoding_name(format.indices) + " (--demo_indices differs between ranks)");
    const uint32_t ntensors = load<uint32_t>(h + 8);
    const uint64_t nchunks = load<uint64_t>(h + 16);
    LLMC_CHECK(ntensors == plan.tensors.size() && nchunks == plan.total_chunks,
               who + ": " + std::to_string(ntensors) + " tensors / " + std::to_string(nchunks) +
                   " chunks, this rank's plan has " + std::to_string(plan.tensors.size()) + " / " +
                   std::to_string(plan.total_chunks) + " (model or --demo_chunk differs between ranks)");
    LLMC_CHECK(load<uint64_t>(h + 24) == plan.fingerprint(),
               who + ": chunk plan fingerprint differs from this rank's (model shape, --demo_chunk or "
                     "--demo_topk differs between ranks)");
    const std::vector<SectionOffsets> sections = section_offsets(plan, format);
    const size_t total = sections.empty() ? kBucketHeaderBytes : sections.back().end;
    LLMC_CHECK(bucket.size() == total, who + ": " + std::to_string(bucket.size()) + " bytes, expected " +
                                           std::to_string(total) + " for this rank's plan and encoding");

    sel.resize(plan);
    const std::vector<ChunkGroup> groups = chunk_groups(plan);
    // error bits of a corrupt bucket, reported after the parallel loop: 1 an index >= chunk_elems; entropy only:
    // 2 a chunk's indices not strictly ascending, 4 a unary part without exactly k ones, 8 padding bits not 0
    int bad_index = 0;
#pragma omp parallel for schedule(dynamic, 16) reduction(| : bad_index)
    for (size_t g = 0; g < groups.size(); g++) {
        const ChunkGroup& grp = groups[g];
        const TensorPlan& tp = plan.tensors[grp.tensor];
        const SectionOffsets& so = sections[grp.tensor];
        const size_t j0 = grp.first * tp.k, j1 = grp.last * tp.k;
        uint32_t* idx = sel.indices.data() + tp.select_offset;
        float* val = sel.values.data() + tp.select_offset;
        const std::byte* vals_in = h + so.values;
        switch (format.values) {
            case llmc::DemoValueEncoding::fp32:
                std::memcpy(val + j0, vals_in + 4 * j0, (j1 - j0) * 4);
                break;
            case llmc::DemoValueEncoding::bf16:
                for (size_t j = j0; j < j1; j++) val[j] = bf16_to_float(load<uint16_t>(vals_in + 2 * j));
                break;
            case llmc::DemoValueEncoding::sign: {
                float* scales = sel.scales.data() + tp.chunk_offset;
                const auto* bits = reinterpret_cast<const uint8_t*>(vals_in);
                for (size_t c = grp.first; c < grp.last; c++) {
                    const float scale = load<float>(h + so.scales + 4 * c);
                    scales[c] = scale;
                    for (size_t j = c * tp.k; j < (c + 1) * tp.k; j++) {
                        const bool negative = (bits[j >> 3] >> (j & 7)) & 1u;
                        val[j] = scale == 0.0f ? 0.0f : (negative ? -scale : scale);
                    }
                }
                break;
            }
        }
        const std::byte* idx_in = h + so.indices;
        if (format.indices == llmc::DemoIndexEncoding::entropy) {
            const int l = entropy_low_bits(tp.chunk_elems, tp.k);
            const uint32_t high_max = static_cast<uint32_t>((tp.chunk_elems - 1) >> l);
            const size_t chunk_bits = entropy_chunk_bits(tp.chunk_elems, tp.k);
            const auto* part = reinterpret_cast<const uint8_t*>(idx_in);
            BitReader r{part + grp.first * chunk_bits / 8, part + (so.end - so.indices)};
            for (size_t c = grp.first; c < grp.last && bad_index == 0; c++) {
                uint32_t* x = idx + c * tp.k;
                bad_index |= decode_entropy_chunk(r, x, tp.k, l, high_max);
                for (size_t i = 1; i < tp.k; i++) bad_index |= x[i - 1] < x[i] ? 0 : 2;
            }
            if (grp.last == tp.num_chunks) {  // the stream's tail up to the padded end must be 0
                const size_t end_bit = tp.num_chunks * chunk_bits, end_byte = end_bit / 8;
                if (end_bit % 8 != 0 && (part[end_byte] >> (end_bit % 8)) != 0) bad_index |= 8;
                for (size_t b = (end_bit + 7) / 8; b < so.end - so.indices; b++) bad_index |= part[b] != 0 ? 8 : 0;
            }
        } else if (format.indices == llmc::DemoIndexEncoding::packed12) {
            const auto* bytes = reinterpret_cast<const uint8_t*>(idx_in);
            for (size_t j = j0; j < j1; j++) {
                const size_t bit = 12 * j;
                const uint32_t two = bytes[bit >> 3] | (static_cast<uint32_t>(bytes[(bit >> 3) + 1]) << 8);
                idx[j] = (two >> (bit & 7)) & 0xfffu;
            }
        } else {
            switch (tp.index_bytes) {
                case 1:
                    for (size_t j = j0; j < j1; j++) idx[j] = load<uint8_t>(idx_in + j);
                    break;
                case 2:
                    for (size_t j = j0; j < j1; j++) idx[j] = load<uint16_t>(idx_in + 2 * j);
                    break;
                default: std::memcpy(idx + j0, idx_in + 4 * j0, (j1 - j0) * 4); break;
            }
        }
        for (size_t j = j0; j < j1; j++) bad_index |= idx[j] >= tp.chunk_elems ? 1 : 0;
    }
    LLMC_CHECK(!(bad_index & 4), who + ": an entropy-coded chunk whose unary part does not hold exactly k ones "
                                      "(corrupt DeMo bucket)");
    LLMC_CHECK(!(bad_index & 2),
               who + ": entropy-coded indices of a chunk not strictly ascending (corrupt DeMo bucket)");
    LLMC_CHECK(!(bad_index & 1), who + ": coefficient index outside its chunk (corrupt DeMo bucket)");
    LLMC_CHECK(!(bad_index & 8), who + ": entropy-coded indices followed by padding bits that are not 0 (corrupt "
                                      "DeMo bucket)");
}

}  // namespace demo
