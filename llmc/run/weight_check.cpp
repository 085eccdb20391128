// The cross-rank weight check (see weight_check.h).
#include "llmc/run/weight_check.h"

#include <string>
#include <vector>

#include "llmc/base/checksum.h"
#include "llmc/base/error.h"

namespace llmc {

void check_weights_agree(Transport& transport, std::span<const std::byte> weights, int step) {
    const uint64_t h = digest_bytes(weights).xxh64;
    // a double holds 32 bits exactly: the hash's halves, their max and (negated) min over ranks
    const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
    std::vector<double> v = {hi, lo, -hi, -lo};
    transport.allreduce_max(v);
    LLMC_CHECK(v[0] == -v[2] && v[1] == -v[3],
               "--weight_check_every: the ranks' shared weights differ after step " + std::to_string(step) +
                   " (rank " + std::to_string(transport.rank()) + " hashes " + (FileDigest{0, h}).hex() + ")");
}

}  // namespace llmc
