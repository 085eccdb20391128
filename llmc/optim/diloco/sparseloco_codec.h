// SparseLoCo's wire message as plain host functions (no Transport, no optimizer state), so the CPU optimizer
// (sparseloco.cpp), the tests and a later CUDA port all encode and decode the same bytes with the same arithmetic.
//
// Chunks (DeMo's rule, llmc/optim/chunking.h): a tensor of shape [d0, ..., dm] is a matrix of rows = d0 * ... *
// d(m-1) and cols = dm (a 1-D tensor: one row); its chunks are n1 x n2 blocks with n1 = the largest divisor of rows
// <= chunk (1 for a 1-D tensor: its chunks are pieces of n2) and n2 = the largest divisor of cols <= chunk. Chunk c
// = i * (cols / n2) + j is block (i, j); its local index l = b * n2 + d is element (i n1 + b, j n2 + d). Each chunk
// sends k = min(topk, n1 n2) values: the k largest |x| (ordered by the fp32 bits of |x|, so a NaN ranks first; ties
// to the lower local index), listed in ascending local index. A message lists the tensors in layout order, each
// tensor's chunks in order: that is the order of every array below ("slots").
//
// 2-bit values, per tensor over its m selected values v (templar's TopKCompressor._quantize_values with 4 bins over
// a range of 6 sigma):
//   shift = mean(v) (summed in double in slot order, rounded once to fp32); c_i = fp32(v_i - shift);
//   std = sqrt(sum c_i^2 / (m - 1)) (double, rounded to fp32; 0 when m = 1); scale = fp32(6 * std) / 4, replaced
//   by 1 when it is 0 or not finite; q_i = clamp(rint(fp32(c_i / scale) + 2), 0, 3) (rint: ties to even, as
//   torch.round). With scale = 1.5 std the bins are c < -2.25 std, [-2.25, -0.75) std, [-0.75, 0.75) std and
//   >= 0.75 std (rint's ties move a boundary value to the even code). The codebook is {shift, mean_0 .. mean_3},
//   mean_b = the mean of the c_i with q_i = b (double, rounded to fp32; 0 for an empty bin), and a value decodes
//   to fp32(mean_q + shift). A tensor holding a non-finite selected value sends shift = NaN and all codes 0, so
//   every rank sees NaN (as an fp32 all-reduce would show it).
// fp32 values (the ablation): the selected values as they are, no codebook.
//
// Message bytes: [codebooks: 5 fp32 per tensor, 2-bit only][values: 2-bit codes, 4 per byte, slot i in bits
// 2 (i mod 4) of byte i / 4, or fp32 per slot][indices: 12 bits per slot, slots 2j and 2j+1 in 3 bytes as templar's
// pack_12bit_indices (a = slot 2j, b = slot 2j+1: a & 0xff, (a >> 8) | (b & 0xf) << 4, b >> 4; b = 0 after an odd
// last slot)]. Its size depends only on the layout and the options, so every rank's is the same.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/model/param_layout.h"
#include "llmc/optim/chunking.h"

namespace llmc::sparseloco {

inline constexpr int kBins = 4;                    // 2-bit codes
inline constexpr float kRangeSigmas = 6.0f;        // templar's quantization_range
inline constexpr size_t kCodebookFloats = 1 + kBins;  // shift, then the bin means
inline constexpr size_t kMaxChunk = 64;            // 64 x 64 = 4096 local indices fit 12 bits

struct TensorPlan {
    size_t offset = 0, numel = 0;  // the tensor's place in the flat buffer
    size_t rows = 1, cols = 0;
    size_t n1 = 1, n2 = 1;         // chunk lengths along rows and cols
    size_t block_cols = 0, num_chunks = 0, chunk_elems = 0, k = 0;
    size_t first_slot = 0;         // this tensor's first slot in the message
    size_t slots() const { return num_chunks * k; }
    // Chunk c's local index l as a position in the tensor.
    size_t element(size_t c, size_t l) const {
        const size_t bi = c / block_cols, bj = c % block_cols, b = l / n2, d = l % n2;
        return (bi * n1 + b) * cols + bj * n2 + d;
    }
};

struct Plan {
    std::vector<TensorPlan> tensors;
    size_t total_slots = 0, max_chunk_elems = 0;
    bool two_bit = true;
    size_t codebook_bytes() const { return two_bit ? tensors.size() * kCodebookFloats * sizeof(float) : 0; }
    size_t value_bytes() const { return two_bit ? (total_slots + 3) / 4 : total_slots * sizeof(float); }
    size_t index_bytes() const { return 3 * ((total_slots + 1) / 2); }
    size_t message_bytes() const { return codebook_bytes() + value_bytes() + index_bytes(); }
};

// The plan of `layout` for target chunk length `chunk` (1..kMaxChunk) and `topk` values per chunk (>= 1).
inline Plan make_plan(const ParamLayout& layout, size_t chunk, size_t topk, bool two_bit) {
    LLMC_CHECK(chunk >= 1 && chunk <= kMaxChunk, "--sparseloco_chunk must be in [1, 64] (got " +
                                                     std::to_string(chunk) + ")");
    LLMC_CHECK(topk >= 1, "--sparseloco_topk must be >= 1 (got " + std::to_string(topk) + ")");
    Plan plan;
    plan.two_bit = two_bit;
    for (const ParamTensor& t : layout.tensors) {
        LLMC_CHECK(!t.shape.empty() && t.numel >= 1, "sparseloco: tensor " + t.name + " is empty");
        TensorPlan p;
        p.offset = t.offset;
        p.numel = t.numel;
        p.cols = t.shape.back();
        for (size_t d = 0; d + 1 < t.shape.size(); d++) p.rows *= t.shape[d];
        p.n1 = t.shape.size() == 1 ? 1 : largest_divisor_at_most(p.rows, chunk);
        p.n2 = largest_divisor_at_most(p.cols, chunk);
        p.block_cols = p.cols / p.n2;
        p.num_chunks = (p.rows / p.n1) * p.block_cols;
        p.chunk_elems = p.n1 * p.n2;
        p.k = std::min(topk, p.chunk_elems);
        p.first_slot = plan.total_slots;
        plan.total_slots += p.slots();
        plan.max_chunk_elems = std::max(plan.max_chunk_elems, p.chunk_elems);
        plan.tensors.push_back(p);
    }
    return plan;
}

// ---- bit packing (exact round trips) ----
inline void pack_indices12(std::span<const uint16_t> idx, std::byte* out) {
    for (size_t j = 0; 2 * j < idx.size(); j++) {
        const uint32_t a = idx[2 * j] & 0xfffu, b = 2 * j + 1 < idx.size() ? idx[2 * j + 1] & 0xfffu : 0u;
        out[3 * j] = static_cast<std::byte>(a & 0xffu);
        out[3 * j + 1] = static_cast<std::byte>((a >> 8) | ((b & 0xfu) << 4));
        out[3 * j + 2] = static_cast<std::byte>(b >> 4);
    }
}
inline void unpack_indices12(const std::byte* in, std::span<uint16_t> idx) {
    for (size_t i = 0; i < idx.size(); i++) {
        const size_t j = i / 2;
        const uint32_t b0 = std::to_integer<uint32_t>(in[3 * j]), b1 = std::to_integer<uint32_t>(in[3 * j + 1]),
                       b2 = std::to_integer<uint32_t>(in[3 * j + 2]);
        idx[i] = static_cast<uint16_t>(i % 2 == 0 ? b0 | ((b1 & 0xfu) << 8) : (b1 >> 4) | (b2 << 4));
    }
}
inline void pack_codes2(std::span<const uint8_t> codes, std::byte* out) {
    std::memset(out, 0, (codes.size() + 3) / 4);
    for (size_t i = 0; i < codes.size(); i++)
        out[i / 4] |= static_cast<std::byte>((codes[i] & 3u) << (2 * (i % 4)));
}
inline void unpack_codes2(const std::byte* in, std::span<uint8_t> codes) {
    for (size_t i = 0; i < codes.size(); i++)
        codes[i] = static_cast<uint8_t>((std::to_integer<unsigned>(in[i / 4]) >> (2 * (i % 4))) & 3u);
}

// ---- selection and quantization ----
inline uint32_t magnitude_key(float x) {
    const float a = std::fabs(x);
    uint32_t k;
    std::memcpy(&k, &a, sizeof k);
    return k;
}

// The k slots of chunk c of tensor p over the tensor's values x (p.numel floats), ascending local index, into idx.
// `order` is scratch of at least p.chunk_elems entries. Each element's sort key is its magnitude key above the bits
// of 0xffff - l, so that one descending order of the keys is "larger |x| first, then the lower index": a strict total
// order, the same k on every machine.
inline void select_chunk(const TensorPlan& p, const float* x, size_t c, uint16_t* idx, std::vector<uint64_t>& order) {
    order.resize(p.chunk_elems);
    const float* block = x + p.element(c, 0);
    for (size_t b = 0, l = 0; b < p.n1; b++)
        for (size_t d = 0; d < p.n2; d++, l++)
            order[l] = (static_cast<uint64_t>(magnitude_key(block[b * p.cols + d])) << 16) | (0xffffu - l);
    if (p.k < p.chunk_elems)
        std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(p.k - 1), order.end(),
                         std::greater<uint64_t>());
    for (size_t s = 0; s < p.k; s++) idx[s] = static_cast<uint16_t>(0xffffu - (order[s] & 0xffffu));
    std::sort(idx, idx + p.k);
}

// One tensor's selected values v -> codes and the codebook {shift, mean_0..mean_3} (the rule at the top).
inline void quantize_2bit(std::span<const float> v, uint8_t* codes, float* codebook) {
    const size_t m = v.size();
    bool finite = true;
    double sum = 0.0;
    for (float x : v) {
        finite = finite && std::isfinite(x);
        sum += x;
    }
    if (!finite || m == 0) {
        const float fill = m == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        for (size_t b = 0; b < kCodebookFloats; b++) codebook[b] = fill;
        std::fill(codes, codes + m, uint8_t{0});
        return;
    }
    const float shift = static_cast<float>(sum / static_cast<double>(m));
    double ss = 0.0;
    for (float x : v) {
        const float c = x - shift;
        ss += static_cast<double>(c) * c;
    }
    const float std_dev = m > 1 ? static_cast<float>(std::sqrt(ss / static_cast<double>(m - 1))) : 0.0f;
    float scale = kRangeSigmas * std_dev / static_cast<float>(kBins);
    if (!(scale > 0.0f) || !std::isfinite(scale)) scale = 1.0f;
    double bin_sum[kBins] = {0, 0, 0, 0};
    size_t bin_count[kBins] = {0, 0, 0, 0};
    for (size_t i = 0; i < m; i++) {
        const float c = v[i] - shift;
        const float t = std::nearbyint(c / scale + static_cast<float>(kBins / 2));
        const uint8_t q = static_cast<uint8_t>(std::clamp(t, 0.0f, static_cast<float>(kBins - 1)));
        codes[i] = q;
        bin_sum[q] += c;
        bin_count[q]++;
    }
    codebook[0] = shift;
    for (int b = 0; b < kBins; b++)
        codebook[1 + b] = bin_count[b] > 0 ? static_cast<float>(bin_sum[b] / static_cast<double>(bin_count[b])) : 0.0f;
}
inline float dequantize_2bit(uint8_t code, const float* codebook) { return codebook[1 + code] + codebook[0]; }

// ---- the message ----
// Encodes the top-k of x (the whole flat buffer; e.g. the error feedback) into msg (plan.message_bytes()).
inline void encode(const Plan& plan, std::span<const float> x, std::vector<std::byte>& msg) {
    msg.assign(plan.message_bytes(), std::byte{0});
    std::vector<uint16_t> idx(plan.total_slots);
    std::vector<float> vals(plan.total_slots);
    for (const TensorPlan& p : plan.tensors) {
        const float* xt = x.data() + p.offset;
        // threads only for tensors of many chunks: a parallel region costs more than a few chunks' selection
#pragma omp parallel if (p.num_chunks >= 8)
        {
            std::vector<uint64_t> order;
#pragma omp for schedule(static)
            for (size_t c = 0; c < p.num_chunks; c++) {
                uint16_t* out = idx.data() + p.first_slot + c * p.k;
                select_chunk(p, xt, c, out, order);
                for (size_t s = 0; s < p.k; s++) vals[p.first_slot + c * p.k + s] = xt[p.element(c, out[s])];
            }
        }
    }
    std::byte* values = msg.data() + plan.codebook_bytes();
    if (plan.two_bit) {
        std::vector<uint8_t> codes(plan.total_slots);
        std::vector<float> books(plan.tensors.size() * kCodebookFloats);
        for (size_t ti = 0; ti < plan.tensors.size(); ti++) {
            const TensorPlan& p = plan.tensors[ti];
            quantize_2bit(std::span<const float>(vals).subspan(p.first_slot, p.slots()), codes.data() + p.first_slot,
                          books.data() + ti * kCodebookFloats);
        }
        std::memcpy(msg.data(), books.data(), books.size() * sizeof(float));
        pack_codes2(codes, values);
    } else {
        std::memcpy(values, vals.data(), vals.size() * sizeof(float));
    }
    pack_indices12(idx, values + plan.value_bytes());
}

// One message decoded: every slot's position in the flat buffer and its value.
struct Decoded {
    std::vector<size_t> positions;
    std::vector<float> values;
};

// Throws (naming `who`) when msg is not plan.message_bytes() long or names an index outside its chunk.
inline void decode(const Plan& plan, std::span<const std::byte> msg, Decoded& out, const std::string& who) {
    LLMC_CHECK(msg.size() == plan.message_bytes(), who + ": a SparseLoCo message of " + std::to_string(msg.size()) +
                                                       " bytes, expected " + std::to_string(plan.message_bytes()));
    std::vector<uint16_t> idx(plan.total_slots);
    const std::byte* values = msg.data() + plan.codebook_bytes();
    unpack_indices12(values + plan.value_bytes(), idx);
    out.positions.resize(plan.total_slots);
    out.values.resize(plan.total_slots);
    std::vector<uint8_t> codes;
    std::vector<float> books;
    if (plan.two_bit) {
        codes.resize(plan.total_slots);
        unpack_codes2(values, codes);
        books.resize(plan.tensors.size() * kCodebookFloats);
        std::memcpy(books.data(), msg.data(), books.size() * sizeof(float));
    } else {
        std::memcpy(out.values.data(), values, plan.total_slots * sizeof(float));
    }
    for (size_t ti = 0; ti < plan.tensors.size(); ti++) {
        const TensorPlan& p = plan.tensors[ti];
        for (size_t c = 0; c < p.num_chunks; c++)
            for (size_t s = 0; s < p.k; s++) {
                const size_t slot = p.first_slot + c * p.k + s;
                LLMC_CHECK(idx[slot] < p.chunk_elems, who + ": a SparseLoCo index " + std::to_string(idx[slot]) +
                                                          " outside its chunk of " + std::to_string(p.chunk_elems));
                out.positions[slot] = p.offset + p.element(c, idx[slot]);
                if (plan.two_bit) out.values[slot] = dequantize_2bit(codes[slot], books.data() + ti * kCodebookFloats);
            }
    }
}

// The L2 norm of one tensor's decoded values (double, slot order, rounded to fp32): the scope of the median clip.
inline float tensor_norm(const TensorPlan& p, const Decoded& d) {
    double ss = 0.0;
    for (size_t s = p.first_slot; s < p.first_slot + p.slots(); s++)
        ss += static_cast<double>(d.values[s]) * d.values[s];
    return static_cast<float>(std::sqrt(ss));
}

// torch.median's value of `norms`: the lower middle one (index (W - 1) / 2 of the sorted list; NaN sorts last).
inline float lower_median(std::vector<float> norms) {
    std::sort(norms.begin(), norms.end(), [](float a, float b) { return (!std::isnan(a) && std::isnan(b)) || a < b; });
    return norms[(norms.size() - 1) / 2];
}

// templar's clip: a contribution of norm n is scaled by min(median / (n + 1e-8), 1) (fp32).
inline float clip_factor(float median, float norm) { return std::min(median / (norm + 1e-8f), 1.0f); }

}  // namespace llmc::sparseloco
