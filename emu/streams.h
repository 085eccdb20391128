// Where the emulated device's asynchronous work goes. Kernel launches (emu::Launch in block_emulator.h),
// cuBLAS(Lt) products (emu_cublas.cpp) and NCCL collectives (emu_nccl.cpp) hand their work, with every argument
// captured by value, to emu::submit. emu/runtime.cpp installs stream queues there: work then runs only
// when the host waits for its stream (cudaStreamSynchronize, an event, a synchronous copy that must see it), in
// stream order, and a stream that waits for an event first runs the other stream up to that event. So host code
// that reads results before waiting for them, reuses a buffer a queued copy still reads, or lets one stream
// consume what another has not finished, gets the stale data it would get on a GPU. Programs without
// emu_runtime.cpp (the kernels' unit tests) run the work at once.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <utility>

namespace emu {

using StreamWork = std::function<void()>;
using StreamSubmit = void (*)(cudaStream_t, StreamWork&&);

inline StreamSubmit& stream_submit() {
    static StreamSubmit submit = nullptr;
    return submit;
}

inline void submit(cudaStream_t stream, StreamWork work) {
    if (StreamSubmit f = stream_submit()) f(stream, std::move(work));
    else work();
}

// Runs everything queued on a stream so far (and what it waits for). The emulated NCCL queues its exchange and
// then runs the stream with this: the MPI exchange itself happens at the call, in the order every rank's host issues the
// collectives (a collective left queued until its stream is waited for could meet a different MPI call on
// another rank and hang, where the GPU's NCCL kernel would have gone ahead), and only the delivery of the
// result into the output buffer is queued on the stream.
using StreamDrain = void (*)(cudaStream_t);
inline StreamDrain& stream_drain() {
    static StreamDrain drain = nullptr;
    return drain;
}
inline void drain(cudaStream_t stream) {
    if (StreamDrain f = stream_drain()) f(stream);
}

// What LLMC_EMU_STREAMS sets (lazy, eager, shuffled or shuffled:SEED; see emu/runtime.cpp), for tests that
// try several orders in one process; false (nothing changed) for anything else. Defined in emu_runtime.cpp.
bool set_stream_order(const std::string& order);

}  // namespace emu
