// Elastic resume of DeMo (and --optimizer topk, the same blob): a new rank's state blob from the blobs of a checkpoint
// written by another number of ranks, by llmc/optim/reshard.h's rule applied to the momenta. The blob is read and
// written field by field as state_format.h's write_state lays it out, without the chunk plan: the old ranks' blobs
// must agree on every field but the momentum. Refused: FlexDeMo's sharded blobs and a pending delayed round
// (--demo_delay 1 checkpointed mid-run: its bucket is one rank's share of a round the new ranks cannot redo).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/optim/demo/state_format.h"
#include "llmc/optim/reshard.h"

namespace demo {

struct MomentumBlob {
    uint64_t tensors = 0, numel = 0, chunk = 0, topk = 0, fingerprint = 0;
    uint32_t domain = 0;
    std::vector<float> momentum;
};

inline MomentumBlob read_momentum_blob(llmc::ByteReader in) {
    const std::string& src = in.source();
    const std::string name = in.get_string("optimizer name");
    LLMC_CHECK(name == "demo", src + ": optimizer state '" + name +
                                   "' cannot be redistributed to another number of ranks (FlexDeMo's sharded state, "
                                   "--shard_group_size > 1, is not); resume with the same ranks or --reset_momentum");
    const uint32_t version = in.get<uint32_t>("DeMo state version");
    LLMC_CHECK(version >= 1 && version <= cm::kStateVersion,
               src + ": DeMo state version " + std::to_string(version) + ", this build reads versions 1 to " +
                   std::to_string(cm::kStateVersion));
    MomentumBlob b;
    b.tensors = in.get<uint64_t>("tensor count");
    b.numel = in.get<uint64_t>("parameter count");
    b.chunk = in.get<uint64_t>("chunk");
    b.topk = in.get<uint64_t>("topk");
    b.fingerprint = in.get<uint64_t>("plan fingerprint");
    b.domain = version >= 2 ? in.get<uint32_t>("momentum domain") : 0u;
    b.momentum.resize(b.numel);
    in.get_array(std::span<float>(b.momentum), "DeMo momentum");
    const uint8_t pending = version >= 3 ? in.get<uint8_t>("pending round flag") : 0;
    LLMC_CHECK(pending == 0, src + ": DeMo state holds a delayed round not yet applied (--demo_delay 1, saved "
                                   "mid-run), which cannot be redistributed to another number of ranks; resume "
                                   "from a checkpoint of the run's last step or with --reset_momentum");
    LLMC_CHECK(in.at_end(), src + ": trailing bytes after the DeMo state");
    return b;
}

// OptimizerFamily::reshard_state for demo and topk.
inline std::string reshard_state(int old_world, int new_rank, int new_world,
                                 const std::function<llmc::ByteReader(int)>& old_blob, llmc::ByteWriter& out) {
    const llmc::ReshardRule rule = llmc::reshard_rule(old_world, new_rank, new_world);
    std::vector<MomentumBlob> blobs;
    std::string first;
    for (int r : rule.sources) {
        const llmc::ByteReader reader = old_blob(r);
        blobs.push_back(read_momentum_blob(reader));
        const MomentumBlob& a = blobs.front();
        const MomentumBlob& b = blobs.back();
        if (first.empty()) first = reader.source();
        LLMC_CHECK(a.tensors == b.tensors && a.numel == b.numel && a.chunk == b.chunk && a.topk == b.topk &&
                       a.fingerprint == b.fingerprint && a.domain == b.domain,
                   reader.source() + ": DeMo state of another shape or domain than " + first +
                       "'s (files from different runs?)");
    }
    std::vector<std::span<const float>> ins;
    for (const MomentumBlob& b : blobs) ins.emplace_back(b.momentum);
    const MomentumBlob& h = blobs.front();
    // as cm::write_state lays it out (version 3, no pending round); a mean in either domain is the same, the DCT
    // being linear
    out.put_string("demo");
    out.put<uint32_t>(cm::kStateVersion);
    out.put<uint64_t>(h.tensors);
    out.put<uint64_t>(h.numel);
    out.put<uint64_t>(h.chunk);
    out.put<uint64_t>(h.topk);
    out.put<uint64_t>(h.fingerprint);
    out.put<uint32_t>(h.domain);
    std::vector<float> mean(h.numel);
    llmc::mean_of(mean, ins);
    out.put_array(std::span<const float>(mean));
    out.put<uint8_t>(0);
    return "momenta: " + rule.name;
}

}  // namespace demo
