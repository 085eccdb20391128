// A trainer's main() (see trainer_main.h).
#include "llmc/run/trainer_main.h"
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/stop_signal.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/comm/transport_virtual.h"

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

namespace {

// --virtual_ranks V: train() on each of the group's V endpoints, one thread each. The first lane to fail reports
// its error (report_fatal_error ends the process, as it ends a real rank) after waking the others; a lane that
// only saw another fail stays silent.
int train_virtual_ranks(const TrainConfig& cfg, Transport& real, const Launch& launch, TrainFunction train) {
    VirtualRanks group(real, cfg.virtual_ranks);
    std::vector<int> status(static_cast<size_t>(cfg.virtual_ranks), 0);
    std::mutex failing;
    std::vector<std::thread> lanes;
    for (int v = 0; v < cfg.virtual_ranks; v++)
        lanes.emplace_back([&, v] {
            try {
                status[static_cast<size_t>(v)] = train(cfg, group.lane(v), launch);
            } catch (const VirtualRanksAborted&) {
                status[static_cast<size_t>(v)] = 1;
            } catch (const std::exception& e) {
                group.abort();
                const std::lock_guard lock(failing);
                status[static_cast<size_t>(v)] = report_fatal_error(e, &group.lane(v));
            }
        });
    for (std::thread& lane : lanes) lane.join();
    for (const int s : status)
        if (s != 0) return s;
    return 0;
}

}  // namespace

int trainer_main(int argc, char** argv, const char* program, TrainFunction train, bool simulates_ranks) {
    const StepReporter::Clock::time_point started = StepReporter::Clock::now();
    std::unique_ptr<Transport> transport;
    try {
        const bool launched_ranks = started_by_mpi_launcher();  // before MPI_Init sets Open MPI's variables
        transport = make_world_transport(&argc, &argv);
        TrainConfig cfg;
        if (!parse_command_line(argc - 1, argv + 1, cfg, program)) return 0;
        const StopSignals stop_signals(!launched_ranks);  // a stop signal now ends the run at a step, with a checkpoint
        const Launch launch{argc, argv, started};
        if (cfg.virtual_ranks == 1) return train(cfg, *transport, launch);
        LLMC_CHECK(simulates_ranks, cfg.sources.name("virtual_ranks") + ": " + program +
                                        " does not simulate ranks yet; use train_gpt_cpu");
        return train_virtual_ranks(cfg, *transport, launch, train);
    } catch (const std::exception& e) {
        return report_fatal_error(e, transport.get());
    }
}

}  // namespace llmc
