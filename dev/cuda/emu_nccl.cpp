// The NCCL calls of llmc/transport_nccl.cuh, served over MPI on the CPU for the emulated device (see
// emu_runtime.cpp): "device" buffers are host memory there, so each collective is the matching blocking MPI
// collective on a duplicate of MPI_COMM_WORLD. A call first runs its stream's queued work (its input is then
// what the GPU would read), exchanges the data at once into a private buffer (ranks issue NCCL calls in the same
// order, as NCCL requires, so running a group's calls one after another gives the group's result), and queues
// the delivery into the output buffer on the stream (emu_streams.h): a reader that does not wait for the
// collective sees the old contents, as on a GPU. With this,
// `mpirun -np 2 build/emu/train_gpt ...` runs the NCCL transport's code paths (size exchange, grouped
// broadcasts, average all-reduce, byte counters) without a GPU. Without MPI (USE_MPI=0) only a world of one
// can be set up.
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unistd.h>
#include <vector>

#include "dev/cuda/emu_streams.h"

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

#if defined(LLMC_USE_MPI)
bool mpi_type(ncclDataType_t t, MPI_Datatype* out, size_t* bytes) {
    switch (t) {
        case ncclInt8: *out = MPI_INT8_T; *bytes = 1; return true;
        case ncclUint8: *out = MPI_UINT8_T; *bytes = 1; return true;
        case ncclInt32: *out = MPI_INT32_T; *bytes = 4; return true;
        case ncclUint32: *out = MPI_UINT32_T; *bytes = 4; return true;
        case ncclInt64: *out = MPI_INT64_T; *bytes = 8; return true;
        case ncclUint64: *out = MPI_UINT64_T; *bytes = 8; return true;
        case ncclFloat32: *out = MPI_FLOAT; *bytes = 4; return true;
        case ncclFloat64: *out = MPI_DOUBLE; *bytes = 8; return true;
        default: return false;  // half precision: not needed by the transport
    }
}
#endif

// Runs `exchange` as device work at the current end of `stream`'s queue, before returning: it reads the
// collective's input where the GPU would, after the work queued before it.
void exchange_now(cudaStream_t stream, const std::function<void()>& exchange) {
    emu::submit(stream, exchange);
    emu::drain(stream);
}

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
    if (type != ncclFloat32 && type != ncclFloat64) return ncclInvalidArgument;  // what the transport sends
    if (comm->nranks > 1 && count > size_t(0x7fffffff)) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    auto result = std::make_shared<std::vector<char>>(bytes);
    ncclResult_t status = ncclSuccess;
    exchange_now(stream, [&] {
        std::memcpy(result->data(), send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1) {
            MPI_Datatype mt;
            size_t b;
            mpi_type(type, &mt, &b);
            if (MPI_Allreduce(MPI_IN_PLACE, result->data(), int(count), mt, op == ncclMax ? MPI_MAX : MPI_SUM,
                              comm->mpi) != MPI_SUCCESS)
                status = ncclSystemError;
        }
#endif
    });
    if (status != ncclSuccess) return status;
    if (op == ncclAvg) {
        if (type == ncclFloat32) {
            auto* v = reinterpret_cast<float*>(result->data());
            for (size_t i = 0; i < count; i++) v[i] /= float(comm->nranks);
        } else {
            auto* v = reinterpret_cast<double*>(result->data());
            for (size_t i = 0; i < count; i++) v[i] /= double(comm->nranks);
        }
    }
    emu::submit(stream, [recv, result] { std::memcpy(recv, result->data(), result->size()); });
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    if (!comm || !recv || root < 0 || root >= comm->nranks || type_bytes(type) == 0) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    if (bytes > size_t(0x7fffffff)) return ncclInvalidArgument;
    if (comm->rank == root && !send) return ncclInvalidArgument;
#if !defined(LLMC_USE_MPI)
    if (comm->nranks > 1) return ncclInvalidUsage;
#endif
    auto result = std::make_shared<std::vector<char>>(bytes);
    ncclResult_t status = ncclSuccess;
    exchange_now(stream, [&] {
        if (comm->rank == root && bytes) std::memcpy(result->data(), send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && bytes > 0 && MPI_Bcast(result->data(), int(bytes), MPI_BYTE, root, comm->mpi) != MPI_SUCCESS)
            status = ncclSystemError;
#endif
    });
    if (status != ncclSuccess) return status;
    emu::submit(stream, [recv, result] { std::memcpy(recv, result->data(), result->size()); });
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    if (!comm || !send || !recv || type_bytes(type) == 0) return ncclInvalidArgument;
    const size_t bytes = count * type_bytes(type);
    if (bytes > size_t(0x7fffffff)) return ncclInvalidArgument;
#if !defined(LLMC_USE_MPI)
    if (comm->nranks > 1) return ncclInvalidUsage;
#endif
    auto result = std::make_shared<std::vector<char>>(bytes * size_t(comm->nranks));
    ncclResult_t status = ncclSuccess;
    exchange_now(stream, [&] {
        if (bytes) std::memcpy(result->data() + size_t(comm->rank) * bytes, send, bytes);
#if defined(LLMC_USE_MPI)
        if (comm->nranks > 1 && bytes > 0 &&
            MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, result->data(), int(bytes), MPI_BYTE, comm->mpi) !=
                MPI_SUCCESS)
            status = ncclSystemError;
#endif
    });
    if (status != ncclSuccess) return status;
    emu::submit(stream, [recv, result] { std::memcpy(recv, result->data(), result->size()); });
    return ncclSuccess;
}

}  // extern "C"
