// The "comm" group's keys (comm_options.h).
#include "llmc/comm/comm_options.h"

#include <string>

#include "llmc/base/error.h"

namespace llmc {

std::vector<Key<CommOptions>> comm_option_keys() {
    return {
        key("transport", &CommOptions::transport,
            "train_gpt: gradients and DeMo buckets over NCCL (nccl) or through pinned host memory and MPI (mpi, for "
            "clusters without NCCL); the CPU trainer always uses MPI",
            {{"nccl", TransportChoice::nccl}, {"mpi", TransportChoice::mpi}}),
        key("mpi_message_bytes", &CommOptions::mpi_message_bytes,
            "the MPI transport's largest message piece, in bytes (below the eager limit, so no piece waits for a "
            "handshake)"),
        key("mpi_reduce_slice", &CommOptions::mpi_reduce_slice,
            "elements per slice of an MPI all-reduce (at most 2^24: its staging buffer)"),
        key("mpi_reduce_jobs", &CommOptions::mpi_reduce_jobs,
            "AdamW-DDP's overlapped MPI all-reduce: starts in flight at once (on a link with a delay one start's "
            "latency passes while another moves)"),
        key("mpi_helper_threads", &CommOptions::mpi_helper_threads,
            "the MPI transport's overlapped all-gather and all-reduce on helper threads (false: posted at the start "
            "and progressed only in the finishing wait)"),
    };
}

void validate_comm_options(const CommOptions& o, const ConfigSources& s) {
    LLMC_CHECK(o.mpi_message_bytes >= 1,
               s.name("mpi_message_bytes") + " must be > 0 (got " + std::to_string(o.mpi_message_bytes) + ")");
    LLMC_CHECK(o.mpi_reduce_slice >= 1 && o.mpi_reduce_slice <= (int64_t{1} << 24),
               s.name("mpi_reduce_slice") + " must be in [1, 16777216] (got " + std::to_string(o.mpi_reduce_slice) +
                   ")");
    LLMC_CHECK(o.mpi_reduce_jobs >= 1 && o.mpi_reduce_jobs <= 64,
               s.name("mpi_reduce_jobs") + " must be in [1, 64] (got " + std::to_string(o.mpi_reduce_jobs) + ")");
}

}  // namespace llmc
