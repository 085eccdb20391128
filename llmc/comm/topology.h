// Nodes of ranks for the sharded step (FlexDeMo, sharded AdamW, ZeRO-1): the world's ranks in consecutive groups of
// S (node n holds ranks n*S .. n*S+S-1, as mpirun places ranks by slot), each rank with two sub-transports: its
// node (the S ranks behind the fast link) and its replica group (the ranks of the other nodes with the same place
// in theirs, which hold the same shard and talk over the slow link).
#pragma once
#include <memory>

#include "llmc/comm/transport.h"

namespace llmc {

struct Topology {
    int group_size = 1;  // S, ranks per node
    int nodes = 1;       // world / S
    int node = 0;        // this rank's node, rank / S
    int local_rank = 0;  // its place in the node, rank % S: the shard it keeps
    std::unique_ptr<Transport> node_group;     // the S ranks of this node (Link::intra)
    std::unique_ptr<Transport> replica_group;  // the `nodes` ranks with this local_rank (Link::inter)
};

// S for `requested` (--shard_group_size; kShardGroupAuto: the ranks sharing this host, which must be the same
// number on every host and consecutive ranks). Collective. Throws a one-line llmc::Error naming
// --shard_group_size when S does not divide the world size or auto finds no such layout.
int resolve_shard_group_size(Transport& world, int requested);

// Splits `world` into nodes of `group_size` (resolved) ranks. Collective; the Topology must be destroyed before
// `world`.
Topology make_topology(Transport& world, int group_size);

}  // namespace llmc
