// A trainer's main(): the world transport, the command line, the stop signals, and the one-line exit of any error.
#pragma once
#include <exception>

#include "llmc/comm/transport.h"
#include "llmc/run/config.h"
#include "llmc/run/step_reporter.h"

namespace llmc {

// What trainer_main hands a trainer besides its config and transport.
struct Launch {
    int argc;
    char** argv;
    StepReporter::Clock::time_point started;  // when the process started (--time_limit_minutes counts from here)
};

// A trainer's main(): the world transport (MPI under mpirun), the command line (--help prints and returns 0),
// train(), and the one-line exit of report_fatal_error for any error on the way. `simulates_ranks`: with
// --virtual_ranks V above 1, train() runs V times at once in threads, each on a virtual rank's endpoint
// (transport_virtual.h); a trainer that cannot (shared device state) refuses the key.
using TrainFunction = int (*)(TrainConfig cfg, Transport& world, const Launch& launch);
int trainer_main(int argc, char** argv, const char* program, TrainFunction train, bool simulates_ranks = false);

// Prints "error[ (rank r)]: <message>" and ends the process: with several ranks without MPI_Finalize (which
// could wait for ranks blocked in a collective; mpirun then ends the job), else by returning 1 to main.
int report_fatal_error(const std::exception& e, const Transport* transport);

}  // namespace llmc
