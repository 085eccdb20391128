// Bucket encoder/decoder and value quantizers (layout specified in codec.h). Tensors are split into groups
// of 8 chunks so that every group's bit-packed parts (sign bits, 12-bit indices) start and end on byte
// boundaries: groups write disjoint bytes and run in parallel without races.
#include "llmc/optim/demo/codec.h"

#include <algorithm>
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
    return indices == llmc::DemoIndexEncoding::packed12 ? (12 * items + 7) / 8
                                                         : items * static_cast<size_t>(t.index_bytes);
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
#pragma omp parallel for schedule(dynamic, 16)
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
        if (format.indices == llmc::DemoIndexEncoding::packed12) {
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
    int bad_index = 0;  // any index >= chunk_elems (a corrupt bucket); reported after the parallel loop
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
        if (format.indices == llmc::DemoIndexEncoding::packed12) {
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
    LLMC_CHECK(!bad_index, who + ": coefficient index outside its chunk (corrupt DeMo bucket)");
}

}  // namespace demo
