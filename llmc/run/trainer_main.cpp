// A trainer's main() (see trainer_main.h).
#include "llmc/run/trainer_main.h"
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "llmc/base/error.h"
#include "llmc/base/stop_signal.h"
#include "llmc/comm/transport_mpi.h"

namespace llmc {

int report_fatal_error(const std::exception& e, const Transport* transport) {
    const bool user_error = dynamic_cast<const Error*>(&e) != nullptr;
    const bool multi_rank = transport && transport->world_size() > 1;
    const std::string where = multi_rank ? " (rank " + std::to_string(transport->rank()) + ")" : "";
    if (dynamic_cast<const std::bad_alloc*>(&e))
        std::fprintf(stderr, "error%s: out of host memory (%s): the model, the batch or the data are too large for "
                     "this machine (--dry_run prints the model's size)\n", where.c_str(), e.what());
    else
        std::fprintf(stderr, "error%s: %s%s\n", where.c_str(), user_error ? "" : "internal: ", e.what());
    std::fflush(stderr);
    const int status = dynamic_cast<const Diverged*>(&e) ? kDivergedExitStatus : 1;
    // Ranks that hit the same error (a bad flag) all get to say so before mpirun ends the job.
    if (multi_rank) std::_Exit(status);
    return status;
}

int trainer_main(int argc, char** argv, const char* program, TrainFunction train) {
    const StepReporter::Clock::time_point started = StepReporter::Clock::now();
    std::unique_ptr<Transport> transport;
    try {
        const bool launched_ranks = started_by_mpi_launcher();  // before MPI_Init sets Open MPI's variables
        transport = make_world_transport(&argc, &argv);
        TrainConfig cfg;
        if (!parse_command_line(argc - 1, argv + 1, cfg, program)) return 0;
        const StopSignals stop_signals(!launched_ranks);  // a stop signal now ends the run at a step, with a checkpoint
        return train(cfg, *transport, Launch{argc, argv, started});
    } catch (const std::exception& e) {
        return report_fatal_error(e, transport.get());
    }
}

}  // namespace llmc
