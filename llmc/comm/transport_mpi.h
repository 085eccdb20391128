// The MPI backend of the Transport interface (Open MPI from Debian), and the factory the trainers call:
// with MPI compiled in (LLMC_USE_MPI) every process joins MPI_COMM_WORLD — a plain start without mpirun is a
// world of one — otherwise a LocalTransport is returned.
#pragma once
#include <memory>

#include "llmc/comm/transport.h"

namespace llmc {

std::unique_ptr<Transport> make_world_transport(int* argc, char*** argv);

}  // namespace llmc
