// DeMo's wire format: ONE bucket per rank per step holding every tensor's selected DCT coefficients, plus
// the value quantizers (bf16, sign) whose output the sender also uses for its error feedback, so the
// residual it keeps is exactly what the receivers did not get. Pure host code: the CUDA kernels must write
// and read the same bytes, so this header is the specification (they implement smallest and packed12 indices;
// train_gpt refuses entropy).
//
// Byte layout (version 1; all integers and floats little-endian):
//   header, 32 bytes:
//     off  0  u32  magic 0x424D4544 (the bytes "DEMB")
//     off  4  u16  version = 1
//     off  6  u8   value encoding: 0 fp32, 1 bf16, 2 sign
//     off  7  u8   index encoding: 0 smallest (u8/u16/u32 by chunk size), 1 packed12, 2 entropy
//     off  8  u32  number of tensors
//     off 12  u32  reserved, 0
//     off 16  u64  total number of chunks over all tensors
//     off 24  u64  plan fingerprint (ModelPlan::fingerprint: every tensor's rows, cols, n1, n2, k)
//   then one section per tensor, in plan (= parameter) order. S = num_chunks * k items; item j belongs to
//   chunk j / k (chunks in row-major block order); inside a chunk the sender writes its k items in
//   ascending index order (smallest and packed12 decoders do not rely on it; entropy requires it, strictly
//   ascending, which distinct top-k indices sorted are). Each part below starts at a 4-byte aligned
//   offset from the start of the bucket and is zero-padded to a multiple of 4 bytes:
//     scales   (sign only)  num_chunks x f32: per chunk, mean |value| of its k selected coefficients
//     values   fp32: S x f32 | bf16: S x u16 (the high half of the fp32 after round-to-nearest-even) |
//              sign: ceil(S/8) bytes, bit j = item j is negative (bit j lives in byte j/8 at bit j%8)
//     indices  smallest: S x u8, u16 or u32, the smallest width that holds chunk_elems - 1 (TensorPlan::
//              index_bytes) | packed12: ceil(12 S / 8) bytes, item j in stream bits [12j, 12j+12) with
//              stream bit b = bit b%8 of byte b/8 (valid only when every chunk has <= 4096 elements) |
//              entropy: Elias-Fano per chunk (below), ceil(num_chunks * B / 8) bytes
// Entropy (Elias-Fano) indices. For chunks of U = chunk_elems elements and k <= U items: l = floor(log2(
//   floor(U / k))) low bits (0 when U < 2k), H = (U - 1) >> l (the largest high part), and each chunk takes
//   exactly B = k * l + k + H bits, so the bucket size stays a function of the plan (the all-gather needs no
//   size exchange). One continuous bit stream per tensor, stream bit b = bit b%8 of byte b/8 (as packed12);
//   chunk c owns stream bits [c B, (c + 1) B); for its ascending indices x_0 < ... < x_{k-1}, at offsets from c B:
//     first  the low parts: x_i mod 2^l in bits [i l, (i + 1) l), least significant bit first;
//     then   the high parts in unary, k + H bits: bit h_i + i is 1 for h_i = x_i >> l, every other bit 0
//            (k ones, H zeros; the zeros before the i-th one number h_i).
//   The bits after the last chunk up to the 4-byte padding are 0. Decoding refuses a chunk whose unary part
//   does not hold exactly k ones, an index >= U, indices not strictly ascending, or padding bits that are not 0.
//   Size: B / k < log2(U / k) + 3 bits per index, against the bound log2(C(U, k)) / k >= log2(U / k) of any
//   code for a k-subset (dev/bench/bench_demo_indices.cpp measures both).
// A decoded sign item is +scale or -scale of its chunk (a zero value is sent as +scale: one bit has no
// zero; a chunk whose scale is 0 decodes to zeros).
//
// Decoding checks magic, version, both encodings, tensor and chunk counts, the fingerprint, the exact
// total size and every index < chunk_elems (entropy: and the checks above), and throws llmc::Error naming the
// bucket otherwise (a rank running a different model, --demo_chunk, --demo_topk or encoding is detected, not
// misread).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/base/kernel_math.h"
#include "llmc/optim/optimizer.h"

namespace demo {

inline constexpr uint32_t kBucketMagic = 0x424D4544u;  // "DEMB"
inline constexpr uint16_t kBucketVersion = 1;
inline constexpr size_t kBucketHeaderBytes = 32;
inline constexpr size_t kPacked12MaxChunkElems = 4096;

struct WireFormat {
    llmc::DemoValueEncoding values = llmc::DemoValueEncoding::fp32;
    llmc::DemoIndexEncoding indices = llmc::DemoIndexEncoding::smallest;
};

const char* value_encoding_name(llmc::DemoValueEncoding e);  // "fp32", "bf16", "sign"
const char* index_encoding_name(llmc::DemoIndexEncoding e);  // "smallest", "packed12", "entropy"

// Throws llmc::Error naming --demo_indices when packed12 is asked for a plan with chunks > 4096 elements.
void check_wire_format(const ModelPlan& plan, WireFormat format);

// ---- sizes (used by the optimizer, the traffic report and the tests) ----
inline size_t round_up4(size_t n) { return (n + 3) & ~size_t{3}; }
size_t value_part_bytes(const TensorPlan& t, llmc::DemoValueEncoding values);   // incl. scales and padding
size_t index_part_bytes(const TensorPlan& t, llmc::DemoIndexEncoding indices);  // incl. padding
// The entropy encoding's low bits l and bits per chunk B for chunks of `chunk_elems` elements and k items.
int entropy_low_bits(size_t chunk_elems, size_t k);
size_t entropy_chunk_bits(size_t chunk_elems, size_t k);
size_t tensor_section_bytes(const TensorPlan& t, WireFormat format);
size_t bucket_bytes(const ModelPlan& plan, WireFormat format);
// The reference's wire volume for the same selections: int64 index + fp32 value per coefficient.
inline size_t reference_bytes(const ModelPlan& plan) { return plan.total_selected * (8 + 4); }

// ---- value quantization ----
// Round-to-nearest-even to bf16, returned as its 16 bits / as the fp32 it decodes to. NaN stays NaN. The
// bit-level implementation is the one the CUDA kernels use (llmc/base/kernel_math.h), so both sides agree.
inline uint16_t bf16_bits(float f) { return llmc::km::bf16_bits_rne(f); }
inline float bf16_to_float(uint16_t h) { return llmc::km::bf16_bits_to_float(h); }
inline float round_to_bf16(float f) { return llmc::km::round_bf16(f); }

// Replaces the k values of one chunk by what a receiver will decode, in place. Returns the chunk's scale
// for the sign encoding (mean |value|, summed in double in index order, rounded once to fp32), else 0.
float quantize_chunk(llmc::DemoValueEncoding values, float* vals, size_t k);

// Everything one rank sends, expanded: item s = plan.tensors[t].select_offset + c * k + j.
struct Selection {
    std::vector<uint32_t> indices;  // total_selected chunk-local flat indices
    std::vector<float> values;      // total_selected values, already quantized (what receivers decode)
    std::vector<float> scales;      // total_chunks per-chunk scales (sign encoding), else unused
    void resize(const ModelPlan& plan) {
        indices.resize(plan.total_selected);
        values.resize(plan.total_selected);
        scales.resize(plan.total_chunks);
    }
};

// Writes the bucket for `sel` (values must already be quantized with the same encoding). `out` is resized
// to bucket_bytes(plan, format).
void encode_bucket(const ModelPlan& plan, WireFormat format, const Selection& sel, std::vector<std::byte>& out);

// Reads a bucket written by encode_bucket for the same plan and format into `sel` (resized). `who` names
// the bucket in error messages (e.g. "DeMo bucket from rank 3").
void decode_bucket(const ModelPlan& plan, WireFormat format, std::span<const std::byte> bucket, Selection& sel,
                   const std::string& who);

// A delayed DeMo round (--demo_delay 1): compressed and sent, not yet applied. A checkpoint keeps this rank's
// bucket of it and its learning rate; the resumed run exchanges the buckets again and applies the round first.
struct PendingRound {
    bool present = false;
    float lr = 0.0f;
    std::vector<std::byte> bucket;
};

}  // namespace demo
