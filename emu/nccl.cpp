// The NCCL calls of llmc/comm/transport_nccl.cuh, served over MPI on the CPU for the emulated device (see
// emu_runtime.cpp): "device" buffers are host memory there, so each collective is the matching blocking MPI
// collective on a duplicate of MPI_COMM_WORLD. A call first runs its stream's queued work (its input is then
// what the GPU would read), exchanges the data at once into a private buffer (ranks issue NCCL calls in the same
// order, as NCCL requires, so running a group's calls one after another gives the group's result), and queues
// the delivery into the output buffer on the stream (emu_streams.h): a reader that does not wait for the
// collective sees the old contents, as on a GPU. The delivery also checks that the input still holds what the
// exchange read: a write to it that the delivery did not precede was not ordered after the collective's end, so
// on a GPU it could change what NCCL sends (the process stops with a message naming the collective). With this,
// `mpirun -np 2 build/emu/train_gpt ...` runs the NCCL transport's code paths (size exchange, grouped
// broadcasts, byte all-gather, average all-reduce, byte counters) without a GPU. Without MPI (USE_MPI=0) only a
// world of one can be set up. For the tests of what a receiver does with damaged data,
// LLMC_EMU_NCCL_CORRUPT=ROOT:OFFSET[:SKIP] inverts byte OFFSET of what every other rank receives from rank ROOT
// (a bad link): from each ncclBroadcast by ROOT and from ROOT's block of each ncclAllGather of bytes (ncclUint8:
// the DeMo buckets, not the size exchange's uint64s), leaving the first SKIP of those collectives intact.
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unistd.h>
#include <vector>

#include "emu/streams.h"
#include "llmc/base/kernel_math.h"

#if defined(LLMC_USE_MPI)
#include <mpi.h>
#endif

struct ncclComm {
    int nranks = 1, rank = 0;
#if defined(LLMC_USE_MPI)
    MPI_Comm mpi = MPI_COMM_NULL;
#endif
};

namespace {

// A collective (`name`): `exchange` fills `result` (sized by the caller) from the input and the other ranks, and
// returns false when MPI fails. It runs as device work at the current end of `stream`'s queue before the call
// returns, so it reads the input where the GPU would (after the work queued before it) and every rank's MPI calls
// meet in the order the hosts issue the collectives; the delivery of `result` into `recv` is queued on the stream.
// The input this rank sends (`send_bytes` at `send`; none for a broadcast's receivers) is kept as the exchange read
// it, and the delivery stops the process if it changed meanwhile: only a write not ordered after the collective
// can run before its delivery (a wait for the collective runs the delivery first).
ncclResult_t collective(const char* name, cudaStream_t stream, const void* send, size_t send_bytes, void* recv,
                        std::shared_ptr<std::vector<char>> result, const std::function<bool(char*)>& exchange) {
    bool ok = true;
    auto sent = std::make_shared<std::vector<char>>();
    emu::submit(stream, [&] {
        if (send_bytes) sent->assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes);
        ok = exchange(result->data());
    });
    emu::drain(stream);
    if (!ok) return ncclSystemError;
    emu::submit(stream, [name, send, sent, recv, result] {
        if (!sent->empty() && std::memcmp(send, sent->data(), sent->size()) != 0) {
            std::fprintf(stderr, "emulated NCCL: the input of a %s was written before the collective's end (a write "
                                 "that does not wait for the collective: on a GPU it races with what NCCL sends)\n",
                         name);
            std::_Exit(3);
        }
        std::memcpy(recv, result->data(), result->size());
    });
    return ncclSuccess;
}

#if defined(LLMC_USE_MPI)
// NCCL's bf16 sum: each partial sum computed in fp32 and rounded to bf16.
void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; i++)
        b[i] = llmc::km::bf16_bits_rne(llmc::km::bf16_bits_to_float(a[i]) + llmc::km::bf16_bits_to_float(b[i]));
}
#endif

size_t type_bytes(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error (emulated NCCL: an MPI call failed)";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return ncclInvalidArgument;
    std::memset(id, 0, sizeof(*id));
    std::snprintf(id->internal, sizeof(id->internal), "emulated-nccl-%d", int(getpid()));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    auto* c = new ncclComm{};
    c->nranks = nranks;
    c->rank = rank;
    if (nranks > 1) {
#if defined(LLMC_USE_MPI)
        int initialized = 0, world = 0, me = 0;
        MPI_Initialized(&initialized);
        if (initialized) {
            MPI_Comm_size(MPI_COMM_WORLD, &world);
            MPI_Comm_rank(MPI_COMM_WORLD, &me);
        }
        if (!initialized || world != nranks || me != rank) {
            delete c;
            return ncclInvalidUsage;  // the emulation maps NCCL ranks onto MPI_COMM_WORLD's
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
#else
        delete c;
        return ncclInvalidUsage;
#endif
    }
    *comm = c;
    return ncclSuccess;
}

// The ranks of `comm` with the same color, ordered by key: MPI_Comm_split of its duplicate (NCCL_SPLIT_NOCOLOR:
// no communicator). The config is ignored (the emulation has no tuning).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
    if (!comm || !newcomm) return ncclInvalidArgument;
    *newcomm = nullptr;
    if (comm->nranks == 1) {
        if (color != NCCL_SPLIT_NOCOLOR) *newcomm = new ncclComm{};
        return ncclSuccess;
    }
#if defined(LLMC_USE_MPI)
    MPI_Comm sub = MPI_COMM_NULL;
    if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &sub) != MPI_SUCCESS)
        return ncclSystemError;
    if (sub == MPI_COMM_NULL) return ncclSuccess;
    auto* c = new ncclComm{};
    MPI_Comm_size(sub, &c->nranks);
    MPI_Comm_rank(sub, &c->rank);
    c->mpi = sub;
    *newcomm = c;
    return ncclSuccess;
#else
    return ncclInvalidUsage;
#endif
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
#if defined(LLMC_USE_MPI)
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
#endif
    delete comm;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    delete comm;  // the MPI world is ended by the caller (Transport::abort)
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!comm || !send || !recv) return ncclInvalidArgument;
    if (op != ncclSum && op != ncclAvg && op != ncclMax) return ncclInvalidArgument;
    // what the transport sends: fp32 / fp64 sums, averages and maxima, bf16 sums (--grad_wire bf16)
    if (type != ncclFloat32 && type != ncclFloat64 && !(type == ncclBfloat16 && op == ncclSum)) return ncclInvalidArgument;
    if (comm->nranks > 1 && count > size_t(0x7fffffff)) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    return collective("ncclAllReduce", stream, send, bytes, recv, std::make_shared<std::vector<char>>(bytes), [=](char* out) {
        std::memcpy(out, send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && type == ncclBfloat16) {
            MPI_Op bf16_sum;
            MPI_Op_create(&bf16_sum_op, /*commute=*/1, &bf16_sum);
            const int rc = MPI_Allreduce(MPI_IN_PLACE, out, int(count), MPI_UINT16_T, bf16_sum, comm->mpi);
            MPI_Op_free(&bf16_sum);
            return rc == MPI_SUCCESS;
        }
        if (comm->nranks > 1 && MPI_Allreduce(MPI_IN_PLACE, out, int(count), type == ncclFloat32 ? MPI_FLOAT : MPI_DOUBLE,
                                              op == ncclMax ? MPI_MAX : MPI_SUM, comm->mpi) != MPI_SUCCESS)
            return false;
#endif
        if (op == ncclAvg) {
            if (type == ncclFloat32)
                for (size_t i = 0; i < count; i++) reinterpret_cast<float*>(out)[i] /= float(comm->nranks);
            else
                for (size_t i = 0; i < count; i++) reinterpret_cast<double*>(out)[i] /= double(comm->nranks);
        }
        return true;
    });
}

// The sum (or average) of every rank's `send` lands in `recv` of `root` alone (the sharded steps' reduce-scatter,
// one reduce per shard in a group); the other ranks' `recv` is untouched. fp32 only: the gradients.
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    if (!comm || !send || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    if (comm->rank == root && !recv) return ncclInvalidArgument;
    if ((op != ncclSum && op != ncclAvg) || type != ncclFloat32) return ncclInvalidArgument;
    if (count > size_t(0x7fffffff)) return ncclInvalidArgument;
    const size_t bytes = count * sizeof(float), delivered = comm->rank == root ? bytes : 0;
    return collective("ncclReduce", stream, send, bytes, recv, std::make_shared<std::vector<char>>(delivered), [=](char* out) {
        std::vector<float> sum(static_cast<const float*>(send), static_cast<const float*>(send) + count);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && count > 0 &&
            MPI_Reduce(comm->rank == root ? MPI_IN_PLACE : sum.data(), comm->rank == root ? sum.data() : nullptr,
                       int(count), MPI_FLOAT, MPI_SUM, root, comm->mpi) != MPI_SUCCESS)
            return false;
#endif
        if (comm->rank != root) return true;
        if (op == ncclAvg)
            for (float& x : sum) x /= float(comm->nranks);
        std::memcpy(out, sum.data(), bytes);
        return true;
    });
}

// LLMC_EMU_NCCL_CORRUPT=ROOT:OFFSET (see the top of the file); root -1 when unset.
struct Corruption {
    int root = -1;
    size_t offset = 0;
    long long skip = 0;  // collectives carrying ROOT's bytes still to leave intact
    // Inverts byte `offset` of `block` (what this rank received from `from`) if the damage applies to it.
    void apply(int from, int me, char* block, size_t bytes) {
        if (from != root || me == root) return;
        if (skip-- > 0) return;
        if (offset < bytes) block[offset] = char(~block[offset]);
    }
};
Corruption& corruption() {
    static Corruption c = [] {
        Corruption parsed;
        const char* v = std::getenv("LLMC_EMU_NCCL_CORRUPT");
        unsigned long long offset = 0;
        long long skip = 0;
        const int fields = v && *v ? std::sscanf(v, "%d:%llu:%lld", &parsed.root, &offset, &skip) : 0;
        if (v && *v && fields < 2) {
            std::fprintf(stderr, "emulated NCCL: LLMC_EMU_NCCL_CORRUPT='%s' is not ROOT:OFFSET[:SKIP]\n", v);
            std::exit(1);
        }
        parsed.offset = size_t(offset);
        parsed.skip = skip;
        return parsed;
    }();
    return c;
}

// A communicator of several ranks exists only with MPI (ncclCommInitRank), so without it these never exchange.
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    if (!comm || !recv || root < 0 || root >= comm->nranks || type_bytes(type) == 0) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    if (bytes > size_t(0x7fffffff)) return ncclInvalidArgument;
    if (comm->rank == root && !send) return ncclInvalidArgument;
    const size_t sent = comm->rank == root ? bytes : 0;
    return collective("ncclBroadcast", stream, send, sent, recv, std::make_shared<std::vector<char>>(bytes), [=](char* out) {
        if (comm->rank == root && bytes) std::memcpy(out, send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && bytes > 0 && MPI_Bcast(out, int(bytes), MPI_BYTE, root, comm->mpi) != MPI_SUCCESS)
            return false;
#endif
        corruption().apply(root, comm->rank, out, bytes);
        return true;
    });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    if (!comm || !send || !recv || type_bytes(type) == 0) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    if (bytes > size_t(0x7fffffff)) return ncclInvalidArgument;
    const auto result = std::make_shared<std::vector<char>>(bytes * size_t(comm->nranks));
    return collective("ncclAllGather", stream, send, bytes, recv, result, [=](char* out) {
        if (bytes) std::memcpy(out + size_t(comm->rank) * bytes, send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && bytes > 0 &&
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, int(bytes), MPI_BYTE, comm->mpi) != MPI_SUCCESS)
            return false;
#endif
        Corruption& corrupt = corruption();
        if (type == ncclUint8 && corrupt.root >= 0 && corrupt.root < comm->nranks)
            corrupt.apply(corrupt.root, comm->rank, out + size_t(corrupt.root) * bytes, bytes);
        return true;
    });
}

}  // extern "C"
