// Corrupt DeMo buckets for the apply kernels' error flags, shared by the CPU test that runs the kernels in the
// block emulator (test/emulated/test_demo_kernels_emu.cpp) and the GPU checker (dev/cuda/demo_apply.cu), so both hold the
// kernels to the same cases. A small plan whose 48 x 50 chunks take u16 indices; two ranks send the same valid
// bucket except for one corruption: rank 1's item 1 points outside its chunk, or rank 0's item 1 repeats item 0.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llmc/optim/demo/plan_tables.h"
#include "llmc/optim/demo/state_format.h"
#include "test/support/demo_agreement.h"
#include "test/support/demo_host_reference.h"
#include "llmc/model/param_layout.h"

namespace demo_corrupt {

namespace cm = demo::cm;

inline llmc::OptimizerConfig config() {
    return cm::demo_config(llmc::DemoValueEncoding::fp32, llmc::DemoIndexEncoding::smallest,
                           llmc::DemoMomentum::lr_scaled, 1.0f, 4);
}
inline llmc::ParamLayout layout() { return llmc::ParamLayout::of_shapes({{96, 50}}); }  // 48 x 50 chunks

struct Case {
    const char* what;
    std::vector<std::byte> buckets;  // 2 ranks, back to back
    uint32_t flag;                   // the error bit the apply kernel must set
    uint32_t rank;                   // and the rank it must name
};

// `bucket`: a valid bucket of plan `pt` (from config() and layout()).
inline std::vector<Case> cases(const cm::PlanTables& pt, const std::vector<std::byte>& bucket) {
    auto two_ranks = [&] {
        std::vector<std::byte> two = bucket;
        two.insert(two.end(), bucket.begin(), bucket.end());
        return two;
    };
    const size_t idx = pt.tensors[0].indices_off;
    std::vector<Case> out;
    Case outside{"index outside its chunk (rank 1)", two_ranks(), cm::kErrIndexRange, 1};
    cm::store_u16(reinterpret_cast<uint8_t*>(outside.buckets.data()) + pt.bucket_bytes + idx + 2, 48 * 50);
    out.push_back(outside);
    Case repeated{"repeated index (rank 0)", two_ranks(), cm::kErrNotAscending, 0};
    uint8_t* rank0 = reinterpret_cast<uint8_t*>(repeated.buckets.data()) + idx;
    cm::store_u16(rank0 + 2, cm::load_u16(rank0));
    out.push_back(repeated);
    return out;
}

}  // namespace demo_corrupt
