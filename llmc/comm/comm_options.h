// How ranks talk (the schema's "comm" group): the CUDA trainer's transport and the MPI transport's message sizes and
// helper threads. Every rank must agree on them: they decide how a collective is cut into messages.
#pragma once
#include <cstdint>
#include <vector>

#include "llmc/base/schema.h"

namespace llmc {

enum class TransportChoice { nccl, mpi };

struct CommOptions {
    TransportChoice transport = TransportChoice::nccl;
    int mpi_message_bytes = 65536 - 256;      // the largest message piece: 64 KB less room for MPI's own header
    int64_t mpi_reduce_slice = int64_t{1} << 24;  // elements per slice of an all-reduce (64 MB of fp32 staged)
    int mpi_reduce_jobs = 2;                  // overlapped all-reduce starts reduced at the same time
    bool mpi_helper_threads = true;           // the overlapped collectives on helper threads (MPI_THREAD_MULTIPLE)
};

std::vector<Key<CommOptions>> comm_option_keys();
// Throws naming the key as `sources` does when a value is out of range.
void validate_comm_options(const CommOptions& options, const ConfigSources& sources);

}  // namespace llmc
