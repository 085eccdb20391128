// LocalTransport's out-of-line pieces (see transport.h).
#include "llmc/transport.h"

#include <cstdlib>

namespace llmc {

void LocalTransport::abort(int exit_code) { std::exit(exit_code); }

}  // namespace llmc
