// The nodes of the sharded step (see topology.h).
#include "llmc/comm/topology.h"

#include <string>
#include <vector>

#include "llmc/base/error.h"

namespace llmc {

int resolve_shard_group_size(Transport& world, int requested) {
    const int w = world.world_size();
    int s = requested;
    if (requested == 0) {  // kShardGroupAuto (optimizer.h; the comm layer does not include it)
        const Transport::HostGroup host = world.host_group();
        // every host must hold the same number of consecutive ranks
        const bool consecutive = host.last_rank - host.first_rank + 1 == host.size &&
                                 world.rank() - host.first_rank == host.index && host.first_rank % host.size == 0;
        std::vector<double> v = {static_cast<double>(host.size), -static_cast<double>(host.size),
                                 consecutive ? 0.0 : 1.0};
        world.allreduce_max(v);
        LLMC_CHECK(v[0] == -v[1] && v[2] == 0.0,
                   "--shard_group_size auto: the hosts hold different numbers of ranks, or a host's ranks are not "
                   "consecutive (launch with mpirun --map-by slot and equal slots per host, or give a number)");
        s = static_cast<int>(v[0]);
    }
    LLMC_CHECK(s >= 1 && w % s == 0, "--shard_group_size " + std::to_string(s) + " does not divide the " +
                                         std::to_string(w) + " ranks (each node must hold the same number)");
    return s;
}

Topology make_topology(Transport& world, int group_size) {
    Topology t;
    t.group_size = group_size;
    t.nodes = world.world_size() / group_size;
    t.node = world.rank() / group_size;
    t.local_rank = world.rank() % group_size;
    t.node_group = world.split(t.node, t.local_rank, Link::intra);
    t.replica_group = world.split(t.local_rank, t.node, Link::inter);
    return t;
}

}  // namespace llmc
