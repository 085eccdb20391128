// The DeMo optimizer's state blob (DemoOptimizer's and CudaDemo's save_state / load_state), byte for byte, and the
// conversion of the kernels' 64 x 64 chunks of momentum between the spatial and the DCT domain.
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
#include "llmc/base/fileio.h"
#include "llmc/optim/demo/chunk_math.h"
#include "llmc/optim/demo/chunk_plan.h"
#include "llmc/optim/demo/codec.h"
#include "llmc/optim/demo/dct.h"

namespace demo::cm {

// Where the momentum of the chunks of the CUDA kernels' 64 x 64 launch group (launch_tables: n1 = n2 = 64 and
// no chunk larger than 64) lives: as the reference keeps it, or in the DCT domain, M = C1 m C2^T (the
// dct_momentum tunings of demo_kernels.cuh). Every other chunk is always spatial.
enum class MomentumDomain : uint32_t { spatial = 0, dct64 = 1 };

// Those chunks of `m` from one domain to the other, M = C1 m C2^T or m = C1^T M C2, by the CPU module's block DCT
// (demo::encode_blocks / decode_blocks, fp32 sgemm: within ~3e-7 of the chunk maximum of exact); nothing when
// from == to. Checkpoints, the tests and the kernel lab use it.
inline void convert_momentum(const ModelPlan& plan, std::span<float> m, MomentumDomain from, MomentumDomain to) {
    if (from == to || plan.max_n > kFixedChunk) return;
    DctBases bases;
    bases.ensure(kFixedChunk);
    BlockScratch scratch;
    std::vector<float> out;
    for (const TensorPlan& tp : plan.tensors) {
        if (tp.n1 != kFixedChunk || tp.n2 != kFixedChunk || tp.num_chunks == 0) continue;
        float* x = m.data() + tp.offset;
        out.resize(tp.numel());
        if (to == MomentumDomain::dct64) encode_blocks(x, out.data(), tp.rows, tp.cols, kFixedChunk, kFixedChunk, bases, scratch);
        else decode_blocks(x, out.data(), tp.rows, tp.cols, kFixedChunk, kFixedChunk, bases, scratch);
        std::copy(out.begin(), out.end(), x);
    }
}

// The DemoOptimizer state blob (demo_optimizer.cpp save_state / load_state, CudaDemo's), byte for byte. Version 2
// adds the momentum's domain (version 1 blobs, always spatial, are still read), so a CUDA run keeping it in the
// DCT domain saves it exactly and resumes bit for bit, while read_state hands every reader its own domain.
// Version 3 adds the pending round (a flag, then its lr and bucket when present).
inline constexpr uint32_t kStateVersion = 3;
inline void write_state(llmc::ByteWriter& out, const ModelPlan& plan, std::span<const float> momentum,
                        MomentumDomain domain = MomentumDomain::spatial, const PendingRound& pending = {}) {
    // one allocation for the blob (momentum: 0.5 GB on GPT-2 124M), not a doubling copy after copy
    out.reserve(out.bytes().size() + 256 + momentum.size_bytes() + pending.bucket.size());
    out.put_string("demo");
    out.put<uint32_t>(kStateVersion);
    out.put<uint64_t>(plan.tensors.size());
    out.put<uint64_t>(momentum.size());
    out.put<uint64_t>(plan.chunk);
    out.put<uint64_t>(plan.topk);
    out.put<uint64_t>(plan.fingerprint());
    out.put<uint32_t>(static_cast<uint32_t>(domain));
    out.put_array(momentum);
    out.put<uint8_t>(pending.present ? 1 : 0);
    if (pending.present) {
        out.put<float>(pending.lr);
        out.put_array(std::span<const std::byte>(pending.bucket));
    }
}
// Reads a blob into `momentum`, converted to `want` when it was saved in the other domain, and the pending
// round (none before version 3). A pending round is refused unless `delayed` (--demo_delay 1) and must hold a
// bucket of `bucket_bytes`. `momentum` is a std::vector<float> or an llmc::LargeVector<float>.
template <class FloatVector>
void read_state(llmc::ByteReader& in, const ModelPlan& plan, FloatVector& momentum, MomentumDomain want,
                PendingRound& pending, bool delayed, size_t bucket_bytes) {
    const std::string& src = in.source();
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "demo", src + ": optimizer state is for '" + name + "', not 'demo'");
    const uint32_t version = in.get<uint32_t>("DeMo state version");
    LLMC_CHECK(version >= 1 && version <= kStateVersion, src + ": DeMo state version " + std::to_string(version) +
                                                             ", this build reads versions 1 to " +
                                                             std::to_string(kStateVersion));
    const uint64_t tensors = in.get<uint64_t>("tensor count");
    const uint64_t numel = in.get<uint64_t>("parameter count");
    LLMC_CHECK(tensors == plan.tensors.size() && numel == plan.num_params,
               src + ": DeMo state is for " + std::to_string(tensors) + " tensors / " + std::to_string(numel) +
                   " parameters, this model has " + std::to_string(plan.tensors.size()) + " / " +
                   std::to_string(plan.num_params));
    const uint64_t chunk = in.get<uint64_t>("chunk");
    LLMC_CHECK(chunk == plan.chunk, src + ": DeMo state was saved with --demo_chunk " + std::to_string(chunk) +
                                        ", this run uses " + std::to_string(plan.chunk));
    const uint64_t topk = in.get<uint64_t>("topk");
    LLMC_CHECK(topk == plan.topk, src + ": DeMo state was saved with --demo_topk " + std::to_string(topk) +
                                      ", this run uses " + std::to_string(plan.topk));
    const uint64_t fingerprint = in.get<uint64_t>("plan fingerprint");
    LLMC_CHECK(fingerprint == plan.fingerprint(),
               src + ": DeMo state was saved for tensors of other shapes (chunk plan differs)");
    const uint32_t domain = version >= 2 ? in.get<uint32_t>("momentum domain") : 0u;
    LLMC_CHECK(domain <= 1u, src + ": DeMo state has momentum domain " + std::to_string(domain) + " (0 or 1 expected)");
    FloatVector m(plan.num_params);
    in.get_array(std::span<float>(m), "DeMo momentum");
    PendingRound p;
    if (version >= 3) {
        const uint8_t present = in.get<uint8_t>("pending round flag");
        LLMC_CHECK(present <= 1u, src + ": corrupt or truncated (pending round flag " + std::to_string(present) + ")");
        p.present = present == 1;
    }
    if (p.present) {
        LLMC_CHECK(delayed, src + ": DeMo state holds an update not yet applied (saved with --demo_delay 1); resume "
                                  "with --demo_delay 1");
        p.lr = in.get<float>("pending round lr");
        p.bucket.resize(bucket_bytes);
        in.get_array(std::span<std::byte>(p.bucket), "pending DeMo bucket");
    }
    convert_momentum(plan, m, static_cast<MomentumDomain>(domain), want);
    momentum = std::move(m);
    pending = std::move(p);
}
// The momentum alone (a blob with a pending round is refused).
template <class FloatVector>
void read_state(llmc::ByteReader& in, const ModelPlan& plan, FloatVector& momentum,
                MomentumDomain want = MomentumDomain::spatial) {
    PendingRound none;
    read_state(in, plan, momentum, want, none, false, 0);
}

}  // namespace demo::cm
