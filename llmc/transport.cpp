// LocalTransport's out-of-line pieces (see transport.h).
#include "llmc/transport.h"

#include <cstdlib>
#include <string>

#include "llmc/error.h"

namespace llmc {

void Transport::allreduce_mean_bf16(std::span<float>) {
    fail("--grad_wire bf16 is not supported by the " + std::string(name()) + " transport");
}

void LocalTransport::abort(int exit_code) { std::exit(exit_code); }

}  // namespace llmc
