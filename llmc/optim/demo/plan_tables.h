// The host-side tables of a DeMo plan that the CUDA kernels (and the host reference in test/support) read: the DCT
// bases, each tensor's bucket sections and chunk table, the bucket header, the two launch groups, and the scalars
// of a launch. Built once per run from the plan (chunk_plan.h) and the wire format (codec.h).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/model/param_layout.h"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/dct.h"
#include "llmc/optim/optimizer.h"

namespace demo::cm {

// The plan the CPU optimizer builds for a layout, and its per-tensor weight-decay flags.
inline ModelPlan plan_for_layout(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout,
                                 std::vector<uint8_t>* decays = nullptr) {
    std::vector<std::vector<size_t>> shapes;
    std::vector<size_t> offsets;
    if (decays) decays->clear();
    for (const llmc::ParamTensor& t : layout.tensors) {
        shapes.push_back(t.shape);
        offsets.push_back(t.offset);
        if (decays) decays->push_back(llmc::decays(t, config.decay_groups) ? 1 : 0);
    }
    ModelPlan plan = plan_model(shapes, static_cast<size_t>(config.demo.chunk),
                                static_cast<size_t>(config.demo.topk), offsets);
    LLMC_CHECK(plan.num_params == layout.num_params, "DeMo: the layout's tensors do not cover its parameters");
    return plan;
}

// Natural and folded bases of every size a plan uses, back to back (offsets in floats, multiples of 4).
struct BasisTables {
    std::vector<float> natural, folded;
    std::vector<uint32_t> nat_off, fold_off;  // by size n; UINT32_MAX where unused
};

inline std::vector<float> folded_basis(size_t n) {
    const std::vector<float> c = dct_basis(n);
    const int N = static_cast<int>(n), he = (N + 1) / 2, ho = N / 2, ld = ceil4(he);
    std::vector<float> f(static_cast<size_t>(folded_basis_floats(N)), 0.0f);
    for (int r = 0; r < he; r++)
        for (int j = 0; j < he; j++) f[size_t(r) * ld + j] = c[size_t(2 * j) * n + r];
    for (int r = 0; r < ho; r++)
        for (int j = 0; j < ho; j++) f[size_t(he + r) * ld + j] = c[size_t(2 * j + 1) * n + r];
    return f;
}

inline BasisTables build_basis_tables(const ModelPlan& plan) {
    BasisTables b;
    b.nat_off.assign(plan.max_n + 1, UINT32_MAX);
    b.fold_off.assign(plan.max_n + 1, UINT32_MAX);
    auto add = [&b](size_t n) {
        if (b.nat_off[n] != UINT32_MAX) return;
        const std::vector<float> nat = dct_basis(n), fold = folded_basis(n);
        b.nat_off[n] = static_cast<uint32_t>(b.natural.size());
        b.natural.insert(b.natural.end(), nat.begin(), nat.end());
        b.natural.resize(static_cast<size_t>(ceil4(static_cast<int>(b.natural.size()))), 0.0f);
        b.fold_off[n] = static_cast<uint32_t>(b.folded.size());
        b.folded.insert(b.folded.end(), fold.begin(), fold.end());
    };
    for (const TensorPlan& t : plan.tensors) {
        add(t.n1);
        add(t.n2);
    }
    return b;
}

// Byte offsets of one tensor's bucket parts (codec.h): [scales (sign only)] values indices.
struct SectionOffsets {
    size_t scales = 0, values = 0, indices = 0, end = 0;
};
inline std::vector<SectionOffsets> section_offsets(const ModelPlan& plan, WireFormat format) {
    std::vector<SectionOffsets> out(plan.tensors.size());
    size_t pos = kBucketHeaderBytes;
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        SectionOffsets& s = out[t];
        s.scales = pos;
        s.values = pos + (format.values == llmc::DemoValueEncoding::sign ? round_up4(tp.num_chunks * 4) : 0);
        s.indices = pos + value_part_bytes(tp, format.values);
        s.end = s.indices + index_part_bytes(tp, format.indices);
        pos = s.end;
    }
    return out;
}

// The 32 header bytes of every bucket of this plan and format (codec.h).
inline std::array<std::byte, kBucketHeaderBytes> bucket_header(const ModelPlan& plan, WireFormat format) {
    std::array<std::byte, kBucketHeaderBytes> h{};
    auto put = [&h](size_t off, auto v) { std::memcpy(h.data() + off, &v, sizeof(v)); };
    put(0, kBucketMagic);
    put(4, kBucketVersion);
    put(6, static_cast<uint8_t>(format.values));
    put(7, static_cast<uint8_t>(format.indices));
    put(8, static_cast<uint32_t>(plan.tensors.size()));
    put(12, uint32_t{0});
    put(16, static_cast<uint64_t>(plan.total_chunks));
    put(24, plan.fingerprint());
    return h;
}

// decode_bucket's header and size checks, with its messages, for a bucket the host only sees the first 32
// bytes of (the rest stays on the GPU).
inline void check_bucket_header(const ModelPlan& plan, WireFormat format, std::span<const std::byte> header,
                                size_t size, const std::string& who) {
    check_wire_format(plan, format);
    LLMC_CHECK(size >= kBucketHeaderBytes && header.size() >= kBucketHeaderBytes,
               who + ": " + std::to_string(size) + " bytes, shorter than the DeMo bucket header");
    auto load = [&header](size_t off, auto v) {
        std::memcpy(&v, header.data() + off, sizeof(v));
        return v;
    };
    LLMC_CHECK(load(0, uint32_t{}) == kBucketMagic, who + ": not a DeMo bucket (bad magic)");
    const uint16_t version = load(4, uint16_t{});
    LLMC_CHECK(version == kBucketVersion, who + ": DeMo bucket version " + std::to_string(version) +
                                              ", this build reads version " + std::to_string(kBucketVersion));
    const uint8_t vid = load(6, uint8_t{}), iid = load(7, uint8_t{});
    LLMC_CHECK(vid == static_cast<uint8_t>(format.values),
               who + ": value encoding id " + std::to_string(vid) + " but this rank uses " +
                   value_encoding_name(format.values) + " (--demo_values differs between ranks)");
    LLMC_CHECK(iid == static_cast<uint8_t>(format.indices),
               who + ": index encoding id " + std::to_string(iid) + " but this rank uses " +
                   index_encoding_name(format.indices) + " (--demo_indices differs between ranks)");
    const uint32_t ntensors = load(8, uint32_t{});
    const uint64_t nchunks = load(16, uint64_t{});
    LLMC_CHECK(ntensors == plan.tensors.size() && nchunks == plan.total_chunks,
               who + ": " + std::to_string(ntensors) + " tensors / " + std::to_string(nchunks) +
                   " chunks, this rank's plan has " + std::to_string(plan.tensors.size()) + " / " +
                   std::to_string(plan.total_chunks) + " (model or --demo_chunk differs between ranks)");
    LLMC_CHECK(load(24, uint64_t{}) == plan.fingerprint(),
               who + ": chunk plan fingerprint differs from this rank's (model shape, --demo_chunk or "
                     "--demo_topk differs between ranks)");
    const size_t total = bucket_bytes(plan, format);
    LLMC_CHECK(size == total, who + ": " + std::to_string(size) + " bytes, expected " + std::to_string(total) +
                                  " for this rank's plan and encoding");
}

// Everything the kernels (and the host reference) read about a plan.
struct PlanTables {
    ModelPlan plan;
    WireFormat format;
    std::vector<ChunkTensor> tensors;
    BasisTables bases;
    std::vector<SectionOffsets> sections;
    size_t bucket_bytes = 0;
    std::array<std::byte, kBucketHeaderBytes> header{};
    // No transform (--optimizer topk, demo_transform identity): the coefficients are the momentum itself. The
    // bases are built all the same; the kernels (their IDENTITY instantiations) and the host reference skip them.
    bool identity = false;
};

inline PlanTables make_plan_tables(const ModelPlan& plan, WireFormat format, const std::vector<uint8_t>& decays,
                                   bool identity = false) {
    LLMC_CHECK(decays.size() == plan.tensors.size(), "DeMo plan tables: one decay flag per tensor needed");
    check_wire_format(plan, format);
    PlanTables pt;
    pt.plan = plan;
    pt.format = format;
    pt.bases = build_basis_tables(plan);
    pt.sections = section_offsets(plan, format);
    pt.bucket_bytes = bucket_bytes(plan, format);
    pt.header = bucket_header(plan, format);
    pt.identity = identity;
    for (size_t t = 0; t < plan.tensors.size(); t++) {
        const TensorPlan& tp = plan.tensors[t];
        LLMC_CHECK(tp.cols <= UINT32_MAX && tp.chunk_elems <= (size_t{1} << 30),
                   "DeMo: tensor too large for the chunk kernels");
        ChunkTensor c{};
        c.offset = tp.offset;
        c.chunk_offset = tp.chunk_offset;
        c.scales_off = pt.sections[t].scales;
        c.values_off = pt.sections[t].values;
        c.indices_off = pt.sections[t].indices;
        c.cols = static_cast<uint32_t>(tp.cols);
        c.n1 = static_cast<uint32_t>(tp.n1);
        c.n2 = static_cast<uint32_t>(tp.n2);
        c.block_cols = static_cast<uint32_t>(tp.block_cols);
        c.k = static_cast<uint32_t>(tp.k);
        c.index_bytes = static_cast<uint32_t>(tp.index_bytes);
        c.fold1 = pt.bases.fold_off[tp.n1];
        c.fold2 = pt.bases.fold_off[tp.n2];
        c.nat1 = pt.bases.nat_off[tp.n1];
        c.nat2 = pt.bases.nat_off[tp.n2];
        c.decays = decays[t];
        pt.tensors.push_back(c);
    }
    return pt;
}

// The tables of a model's DeMo plan under `cfg` (plan_for_layout, then make_plan_tables; identity from its
// demo_transform).
inline PlanTables plan_tables(const llmc::OptimizerConfig& cfg, const llmc::ParamLayout& layout) {
    std::vector<uint8_t> decays;
    const ModelPlan plan = plan_for_layout(cfg, layout, &decays);
    return make_plan_tables(plan, WireFormat{cfg.demo.values, cfg.demo.indices}, decays,
                            cfg.demo.transform == llmc::DemoTransform::identity);
}

// The tensor table as the kernels get it, in two launch groups: tensors with 64 x 64 chunks first (when the
// plan's chunks are all at most 64 x 64 they get a kernel compiled with every chunk size a constant), then every
// other shape (the kernel for any shape). chunk_offset counts from the start of the tensor's group, so a
// group's launch has one block per chunk of its tensors. Offsets into the buckets and tables are unchanged.
struct LaunchTables {
    std::vector<ChunkTensor> tensors;  // the fixed group, then the general one
    int fixed_tensors = 0;
    uint64_t fixed_chunks = 0, general_chunks = 0;
};
inline LaunchTables launch_tables(const PlanTables& pt) {
    const bool fixed_kernel = pt.plan.max_n <= kFixedChunk;  // same condition as the 256-thread kernels
    LaunchTables lt;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t next = 0;
        for (size_t t = 0; t < pt.tensors.size(); t++) {
            const ChunkTensor& ct = pt.tensors[t];
            const bool fixed = fixed_kernel && ct.n1 == kFixedChunk && ct.n2 == kFixedChunk;
            if (fixed != (pass == 0) || pt.plan.tensors[t].num_chunks == 0) continue;
            ChunkTensor g = ct;
            g.chunk_offset = next;
            lt.tensors.push_back(g);
            next += pt.plan.tensors[t].num_chunks;
        }
        if (pass == 0) {
            lt.fixed_chunks = next;
            lt.fixed_tensors = static_cast<int>(lt.tensors.size());
        } else {
            lt.general_chunks = next;
        }
    }
    return lt;
}

inline int value_id(llmc::DemoValueEncoding e) { return static_cast<int>(e); }
inline int index_id(llmc::DemoIndexEncoding e) { return static_cast<int>(e); }

// The launch scalars the CPU optimizer would use for this config and lr (factors formed in double, as there).
inline CompressParams compress_params(const llmc::OptimizerConfig& cfg, float lr, float clip) {
    CompressParams p;
    p.clip = clip;
    p.decay = cfg.demo.decay;
    p.grad_scale = cfg.demo.momentum == llmc::DemoMomentum::ema
                       ? static_cast<float>(1.0 - static_cast<double>(cfg.demo.decay))
                       : lr;
    p.alpha = cfg.demo.feedback_alpha;
    p.values = value_id(cfg.demo.values);
    p.indices = index_id(cfg.demo.indices);
    return p;
}
inline ApplyParams apply_params(const llmc::OptimizerConfig& cfg, float lr, int world, size_t bucket_bytes) {
    ApplyParams p;
    p.lr = lr;
    p.wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay);
    p.apply_wd = cfg.weight_decay != 0.0f;
    p.values = value_id(cfg.demo.values);
    p.indices = index_id(cfg.demo.indices);
    p.world = world;
    p.bucket_bytes = bucket_bytes;
    p.use_sign = cfg.demo.sign;
    return p;
}

}  // namespace demo::cm
