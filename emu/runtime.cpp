// The CUDA runtime calls of the trainer, served on the CPU: with this file (and emu_cublas.cpp, emu_nccl.cpp)
// in place of libcudart, libcublas(Lt) and libnccl, and emu/block_emulator.h running the kernels,
// train_gpt.cu and the GPU tests build with g++ and run on a machine without a GPU (`make emu`). The device is
// the CPU: "device memory" is host memory handed out by cudaMalloc, and there is one device, sm_90-like.
//
// Streams are queues (emu_streams.h): launches, asynchronous copies and memsets, products and collectives wait
// in their stream until the host waits for it (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
// cudaFree) or another stream waits for one of its events; then they run in order. The copies follow the CUDA
// rules for what the host may assume: an asynchronous copy from pageable host memory takes its data when called,
// one into pageable memory completes before returning (after the work queued before it on its stream), copies
// and memsets that involve pinned or device memory only are queued, and a synchronous cudaMemcpy / cudaMemset
// runs on the legacy stream, which does not wait for streams created with cudaStreamNonBlocking. So a missing
// synchronization gives the stale data it would give on a GPU (in the worst order a GPU allows).
//
// What the GPU would refuse is refused here too, so host-side mistakes surface on the CPU: a copy or memset
// whose device side is not inside one cudaMalloc allocation, or whose host side is (wrong cudaMemcpyKind),
// fails with cudaErrorInvalidValue; freeing a pointer twice or one that was not allocated fails; launches are
// checked by emu::Launch. Fresh allocations are filled with 0xff bytes (NaN in fp32 and bf16), as the GPU
// promises nothing about them, so a read before the first write shows up as NaN. Device memory is mapped
// inaccessible (mprotect) except while device work runs, so host code that dereferences a device pointer
// stops with a message naming the allocation, as it would crash with a GPU. Stream capture (CUDA graphs) records
// a stream's launches, copies and memsets into a graph instead of queueing them, and a graph launch queues
// copies of them; what a GPU cannot capture fails here too (waiting for the capturing stream, an event recorded
// on it or waited for by it, a copy from or into pageable memory), and ends the capture as invalidated.
// cudaEventQuery, cudaStreamQuery and cudaEventElapsedTime on work that has not run answer cudaErrorNotReady, as
// on a GPU where it has not finished. LLMC_EMU_STREAMS (eager, first_ahead, last_ahead, shuffled) changes when
// work runs, within what stream order and event waits allow (see StreamOrder below): a program whose streams are
// ordered correctly gives the same bits in every order, so the trainer's multi-stream runs are checked in each.
// LLMC_EMU_HOST_WAITS=1 prints at exit how often the host waited for queued device work (a synchronization or a
// copy into pageable memory that had work to wait for), and how many of those waits left the stream they waited
// for with nothing queued: on a GPU such a wait idles that stream for a round trip (the host wakes up, then its
// next launch arrives), while a wait for an event with more work queued behind it on its stream does not. Tests
// count both per training step. (Other streams are not looked at: in the default order their work runs here only
// when something waits for it.) What it cannot catch: a kernel touching host memory, and races inside work that
// overlaps on a GPU (two streams' items here run one after the other, whole, in whichever order).
#include "emu/block_emulator.h"
// block_emulator.h first: the dynamic shared memory arrays below need its EMU_DEFINE_SHARED.
#include <cuda_profiler_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "llmc/base/host_memory.h"

// The kernels' dynamic shared memory (LLMC_DYNAMIC_SHARED): the DeMo kernels', flash attention's and the staged
// classifier's.
EMU_DEFINE_SHARED(demo, smem4)
EMU_DEFINE_SHARED(llmc::flash, flash_smem)
EMU_DEFINE_SHARED(llmc, classifier_smem)

namespace {

enum class Memory { device, pinned_host };
struct Allocation {
    size_t bytes;   // as asked for
    size_t mapped;  // whole pages, as mapped
    Memory kind;
};

// Every live cudaMalloc / cudaMallocHost allocation by base address. Host code of the trainer may run on
// OpenMP threads, so the table is locked.
struct Allocations {
    std::mutex mutex;
    std::map<uintptr_t, Allocation> live;

    // The allocation holding [p, p + bytes), if one does.
    const Allocation* find(const void* p, size_t bytes) {
        const auto a = reinterpret_cast<uintptr_t>(p);
        auto it = live.upper_bound(a);
        if (it == live.begin()) return nullptr;
        --it;
        if (a + bytes > it->first + it->second.bytes || a < it->first) return nullptr;
        if (bytes == 0 && a >= it->first + it->second.bytes) return nullptr;
        return &it->second;
    }
};
Allocations& allocations() {
    static Allocations a;
    return a;
}

cudaError_t& sticky_error() {
    static cudaError_t e = cudaSuccess;
    return e;
}
cudaError_t fail_with(cudaError_t e) {
    sticky_error() = e;
    return e;
}

// Device memory is accessible only while device work runs (DeviceWork scopes nest).
int& device_work_depth() {
    static int depth = 0;
    return depth;
}
void protect(uintptr_t base, const Allocation& a, bool accessible) {
    if (a.kind == Memory::device)
        mprotect(reinterpret_cast<void*>(base), a.mapped, accessible ? PROT_READ | PROT_WRITE : PROT_NONE);
}
struct DeviceWork {
    DeviceWork() {
        if (device_work_depth()++ == 0) set(true);
    }
    ~DeviceWork() {
        if (--device_work_depth() == 0) set(false);
    }
    static void set(bool accessible) {
        std::lock_guard lock(allocations().mutex);
        for (const auto& [base, a] : allocations().live) protect(base, a, accessible);
    }
};

// A fault inside device memory is host code dereferencing a device pointer: say so, then crash as before.
void on_segfault(int sig, siginfo_t* info, void*) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (const auto& [base, a] : allocations().live)  // no lock: the process is about to end
        if (a.kind == Memory::device && addr >= base && addr < base + a.mapped) {
            char msg[256];
            const int n = std::snprintf(msg, sizeof msg,
                                        "emulated device: host code touched device memory at %p (offset %zu of a "
                                        "%zu-byte cudaMalloc allocation); a GPU build crashes here too: copy it "
                                        "with cudaMemcpy first\n",
                                        info->si_addr, size_t(addr - base), a.bytes);
            if (n > 0) (void)!write(2, msg, size_t(n));
            break;
        }
    signal(sig, SIG_DFL);
}
const bool kSegfaultHandlerInstalled = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segfault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, nullptr) == 0;
}();

cudaError_t allocate(void** p, size_t bytes, Memory kind) {
    if (!p) return fail_with(cudaErrorInvalidValue);
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t mapped = (bytes + page - 1) / page * page;  // page-aligned, so also the GPU's 256-byte alignment
    void* mem = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return fail_with(cudaErrorMemoryAllocation);
    // Huge pages where the kernel lends them on request (transparent_hugepage=madvise, Debian's default): the
    // poison below touches every page, and 4 KiB faults made that a quarter of a small test run's time.
    if (mapped >= llmc::kHugePageBytes) (void)madvise(mem, mapped, MADV_HUGEPAGE);
    std::memset(mem, 0xff, mapped);
    const Allocation a{bytes, mapped, kind};
    std::lock_guard lock(allocations().mutex);
    allocations().live[reinterpret_cast<uintptr_t>(mem)] = a;
    if (device_work_depth() == 0) protect(reinterpret_cast<uintptr_t>(mem), a, false);
    *p = mem;
    return cudaSuccess;
}

cudaError_t release(void* p, Memory kind) {
    if (!p) return cudaSuccess;
    std::lock_guard lock(allocations().mutex);
    auto it = allocations().live.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations().live.end() || it->second.kind != kind) return fail_with(cudaErrorInvalidValue);
    const size_t mapped = it->second.mapped;
    allocations().live.erase(it);
    munmap(p, mapped);
    return cudaSuccess;
}

// The kind of the allocation holding [p, p + bytes), if one does.
std::optional<Memory> memory_of(const void* p, size_t bytes) {
    std::lock_guard lock(allocations().mutex);
    const Allocation* a = allocations().find(p, bytes);
    return a ? std::optional<Memory>(a->kind) : std::nullopt;
}
bool is_device(const void* p, size_t bytes) { return memory_of(p, bytes) == Memory::device; }
bool touches_device(const void* p, size_t bytes) { return memory_of(p, bytes ? 1 : 0) == Memory::device; }
bool is_pinned(const void* p, size_t bytes) { return memory_of(p, bytes) == Memory::pinned_host; }

// The side of a copy: device memory must lie inside one allocation; host memory must not be device memory.
bool side_ok(const void* p, size_t bytes, bool device) {
    if (bytes == 0) return true;
    if (!p) return false;
    return device ? is_device(p, bytes) : !touches_device(p, bytes);
}

// Checks a copy's sides against its kind; tells which sides are device memory.
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, bool& dst_dev, bool& src_dev) {
    dst_dev = src_dev = false;
    switch (kind) {
        case cudaMemcpyHostToHost: break;
        case cudaMemcpyHostToDevice: dst_dev = true; break;
        case cudaMemcpyDeviceToHost: src_dev = true; break;
        case cudaMemcpyDeviceToDevice: dst_dev = src_dev = true; break;
        case cudaMemcpyDefault:
            dst_dev = touches_device(dst, bytes);
            src_dev = touches_device(src, bytes);
            break;
        default: return fail_with(cudaErrorInvalidMemcpyDirection);
    }
    if (!side_ok(dst, bytes, dst_dev) || !side_ok(src, bytes, src_dev)) return fail_with(cudaErrorInvalidValue);
    return cudaSuccess;
}

// A memset's range must lie inside one device allocation.
cudaError_t check_memset(void* p, size_t bytes) {
    if (bytes == 0 || is_device(p, bytes)) return cudaSuccess;
    return fail_with(cudaErrorInvalidValue);
}

// A stream: the queue of work not yet run, and how many items were ever queued / have run (an event marks a
// position in that sequence).
struct Stream {
    uint64_t id = 0;  // creation order
    unsigned flags = 0;
    std::deque<emu::StreamWork> queue;
    uint64_t queued = 0, done = 0;
    std::unique_ptr<std::vector<emu::StreamWork>> capture;  // while capturing: the graph's work, in order
    bool capture_invalidated = false;                        // something that cannot be captured was asked for
};
// Every live stream, the legacy (null) stream included, for cudaDeviceSynchronize.
std::set<Stream*>& streams() {
    static std::set<Stream*> all;
    return all;
}
Stream* legacy_stream() {
    static Stream* s = [] {
        auto* legacy = new Stream{};
        streams().insert(legacy);
        return legacy;
    }();
    return s;
}
Stream* stream_of(cudaStream_t s) { return s ? reinterpret_cast<Stream*>(s) : legacy_stream(); }

// Runs a stream's work until `position` items have run (its whole queue for UINT64_MAX).
void run_until(Stream* s, uint64_t position) {
    if (s->done >= position || s->queue.empty()) return;
    DeviceWork device;
    while (s->done < position && !s->queue.empty()) {
        emu::StreamWork work = std::move(s->queue.front());
        s->queue.pop_front();
        s->done++;
        work();
    }
}
void run_all(Stream* s) { run_until(s, UINT64_MAX); }

// Host waits for device work (see the top of the file), reported at exit with LLMC_EMU_HOST_WAITS=1.
struct HostWaits {
    uint64_t count = 0;
    uint64_t idle = 0;  // of count: no device work left queued after the wait
    ~HostWaits() {
        const char* v = std::getenv("LLMC_EMU_HOST_WAITS");
        if (v && std::string(v) == "1")
            std::fprintf(stderr, "emulated device: %llu host waits for device work (%llu left it idle)\n",
                         (unsigned long long)count, (unsigned long long)idle);
    }
};
HostWaits& host_waits() {
    static HostWaits w;
    return w;
}
bool pending(const Stream* s, uint64_t position) { return s->done < position && !s->queue.empty(); }
// Whether any stream has work queued; with legacy_only, any of those the legacy stream waits for.
bool work_queued(bool legacy_only) {
    for (Stream* s : streams())
        if ((!legacy_only || s == legacy_stream() || (s->flags & cudaStreamNonBlocking) == 0) && pending(s, UINT64_MAX))
            return true;
    return false;
}
// A host wait that had work to wait for, once that work ran; `idle`: the stream it waited for has none left.
void count_host_wait(bool idle) {
    host_waits().count++;
    if (idle) host_waits().idle++;
}
// LLMC_EMU_STREAMS: when the other streams' queued work runs at a host wait for a stream, and what a query finds.
//   lazy (default)  nothing runs but what the waited stream's own event waits pull in: every stream runs as late
//                   as the host allows, and a query finds the work not done;
//   eager           every other stream's work runs first (they all ran ahead of the waited one); a query finds
//                   the work done;
//   first_ahead     streams created earlier run ahead of later ones: at a wait for a stream, the earlier streams'
//                   work runs first and the later ones' not at all; a query finds a stream's work done when no
//                   stream ahead of it has work left (last_ahead: the other way round);
//   shuffled[:SEED] the waited stream's work and the others' interleaved a few items at a time in a seeded random
//                   order; a query finds all or part of the work done, at random.
// A GPU may run streams in any of these orders; what stream order and event waits promise is the same in each, so
// a program whose streams are ordered correctly gives the same bits in all (test/emulated/emulated_gpu_checks.py runs the
// multi-stream trainer configurations so). Which order exposes a missing dependency depends on its direction: a
// read that does not wait for a write on another stream shows when the reader runs first (lazy, at a wait for
// the reader), a write that does not wait for a read when the writer does (eager, or the writer's stream ahead).
// Each item still runs whole: two items never overlap here.
enum class StreamOrder { lazy, eager, first_ahead, last_ahead, shuffled };
struct StreamSchedule {
    StreamOrder order = StreamOrder::lazy;
    uint64_t state = 1;
    uint64_t next() {  // splitmix64
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
};
// The value of LLMC_EMU_STREAMS (nothing: lazy).
std::optional<StreamSchedule> parse_stream_order(const std::string& order) {
    StreamSchedule x;
    const std::pair<const char*, StreamOrder> names[] = {{"", StreamOrder::lazy},
                                                         {"lazy", StreamOrder::lazy},
                                                         {"eager", StreamOrder::eager},
                                                         {"first_ahead", StreamOrder::first_ahead},
                                                         {"last_ahead", StreamOrder::last_ahead},
                                                         {"shuffled", StreamOrder::shuffled}};
    for (const auto& [name, value] : names)
        if (order == name) {
            x.order = value;
            return x;
        }
    const std::string seed = order.rfind("shuffled:", 0) == 0 ? order.substr(9) : "";
    if (seed.empty() || seed.size() > 18 || seed.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    x.order = StreamOrder::shuffled;
    x.state = std::stoull(seed);
    return x;
}
StreamSchedule& stream_schedule() {
    static StreamSchedule sched = [] {
        const char* v = std::getenv("LLMC_EMU_STREAMS");
        const std::optional<StreamSchedule> x = parse_stream_order(v ? v : "");
        if (!x) {
            std::fprintf(stderr, "error: LLMC_EMU_STREAMS='%s' is not a stream order: use lazy, eager, first_ahead, "
                                 "last_ahead or shuffled[:SEED]\n", v);
            std::exit(1);
        }
        return *x;
    }();
    return sched;
}
// The streams whose queued work may run before the host waits for it: the non-blocking ones (the legacy stream and
// the blocking streams wait for each other in ways the host waits keep as they are), in creation order.
std::vector<Stream*> reorderable_streams() {
    std::vector<Stream*> out;
    for (Stream* t : streams())
        if ((t->flags & cudaStreamNonBlocking) != 0 && !t->capture) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const Stream* a, const Stream* b) { return a->id < b->id; });
    return out;
}
// Whether stream t runs ahead of stream s in the eager, first_ahead and last_ahead orders.
bool ahead_of(const Stream* t, const Stream* s, StreamOrder order) {
    if (order == StreamOrder::eager) return true;
    if (order == StreamOrder::first_ahead) return t->id < s->id;
    return order == StreamOrder::last_ahead && t->id > s->id;
}
// The other streams' work at a host wait for s up to `position` (LLMC_EMU_STREAMS); s itself is run up to
// `position` here only in the shuffled order, which interleaves it with the others.
void run_other_streams(Stream* s, uint64_t position) {
    StreamSchedule& sched = stream_schedule();
    if (sched.order == StreamOrder::lazy) return;
    if (sched.order != StreamOrder::shuffled) {  // one pass: running work never queues more
        for (Stream* t : reorderable_streams())
            if (t != s && ahead_of(t, s, sched.order)) run_all(t);
        return;
    }
    while (pending(s, position)) {
        std::vector<Stream*> ready = {s};
        for (Stream* t : reorderable_streams())
            if (t != s && !t->queue.empty()) ready.push_back(t);
        Stream* t = ready[sched.next() % ready.size()];
        const uint64_t items = 1 + sched.next() % 4;
        run_until(t, t == s ? std::min(position, t->done + items) : t->done + items);
    }
}
// A query of stream s's progress up to `position` (cudaEventQuery, cudaStreamQuery): the work the order says a GPU
// would have done by now runs first.
void progress_at_query(Stream* s, uint64_t position) {
    StreamSchedule& sched = stream_schedule();
    if (sched.order == StreamOrder::lazy || s->capture || (s->flags & cudaStreamNonBlocking) == 0) return;
    if (sched.order == StreamOrder::shuffled) {
        if (sched.next() % 2 == 0) run_until(s, position);
        else run_until(s, std::min(position, s->done + sched.next() % 4));
        return;
    }
    if (sched.order != StreamOrder::eager)  // first_ahead, last_ahead: held back by a stream ahead with work left
        for (const Stream* t : reorderable_streams())
            if (t != s && !t->queue.empty() && ahead_of(t, s, sched.order)) return;
    run_until(s, position);
}
// The host waits for stream s up to `position` (all its work for UINT64_MAX).
void host_wait(Stream* s, uint64_t position = UINT64_MAX) {
    const bool waits = pending(s, position);
    run_other_streams(s, position);
    run_until(s, position);
    if (waits) count_host_wait(s->queue.empty());
}
void run_device() {
    for (bool again = true; again;) {  // work may make other streams wait: repeat until all are empty
        again = false;
        for (Stream* s : streams()) {
            again = again || !s->queue.empty();
            run_all(s);
        }
    }
}
void run_device_waiting() {
    const bool waits = work_queued(false);
    run_device();
    if (waits) count_host_wait(true);
}
void enqueue(cudaStream_t stream, emu::StreamWork&& work) {
    Stream* s = stream_of(stream);
    if (s->capture) {
        s->capture->push_back(std::move(work));
        return;
    }
    s->queue.push_back(std::move(work));
    s->queued++;
}
// An operation a capturing stream cannot record: the capture is invalidated (cudaStreamEndCapture reports it) and
// the call fails, as on a GPU.
bool refuse_while_capturing(cudaStream_t stream) {
    Stream* s = stream_of(stream);
    if (!s->capture) return false;
    s->capture_invalidated = true;
    return true;
}
// The legacy stream waits for the streams that are not non-blocking before its work runs.
void run_legacy_dependencies() {
    const bool waits = work_queued(true);
    for (Stream* s : streams())
        if (s != legacy_stream() && (s->flags & cudaStreamNonBlocking) == 0) run_all(s);
    run_all(legacy_stream());
    if (waits) count_host_wait(true);
}
void drain_stream(cudaStream_t stream) { run_all(stream_of(stream)); }
const bool kQueuesInstalled = (emu::stream_submit() = &enqueue, emu::stream_drain() = &drain_stream, true);

// An event: a position in one stream's sequence, and when the work before it finished (for elapsed times).
struct Event {
    Stream* stream = nullptr;
    uint64_t position = 0;
    std::chrono::steady_clock::time_point when{};
    bool recorded = false;
    bool timing = true;
};
void run_to_event(const Event* e) {
    if (e->stream) run_until(e->stream, e->position);
}
bool event_done(const Event* e) { return !e->stream || !pending(e->stream, e->position); }

constexpr int kSharedOptin = 227 * 1024;  // an H100's opt-in limit per block

// LLMC_EMU_ORDER=forward|reverse|shuffled|warp: the order every launch runs its blocks' threads in between
// barriers (block_emulator.h's Order; default forward). A kernel that lacks a barrier reads other threads' data
// before it is written in some order, so a run whose results promise determinism must give the same bits in
// each (test/emulated/emulated_gpu_checks.py runs the trainer in all four).
const bool kOrderFromEnvironment = [] {
    const char* v = std::getenv("LLMC_EMU_ORDER");
    if (!v || !*v) return true;
    const std::string order(v);
    emu::Order& o = emu::launch_settings().order;
    if (order == "forward") o = emu::Order::Forward;
    else if (order == "reverse") o = emu::Order::Reverse;
    else if (order == "shuffled") o = emu::Order::Shuffled;
    else if (order == "warp") o = emu::Order::WarpSerial;
    else {
        std::fprintf(stderr, "error: LLMC_EMU_ORDER='%s' is not a thread order: use forward, reverse, shuffled or warp\n", v);
        std::exit(1);
    }
    return true;
}();

}  // namespace

bool emu::set_stream_order(const std::string& order) {
    const std::optional<StreamSchedule> x = parse_stream_order(order);
    if (x) stream_schedule() = *x;
    return x.has_value();
}

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, Memory::device); }
cudaError_t cudaFree(void* p) {
    run_device_waiting();  // cudaFree waits for the device
    return release(p, Memory::device);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocate(p, bytes, Memory::pinned_host); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return allocate(p, bytes, Memory::pinned_host); }
cudaError_t cudaFreeHost(void* p) {
    run_device();
    return release(p, Memory::pinned_host);
}

// On the legacy stream; returns when the copy is done.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    bool dst_dev, src_dev;
    if (bytes == 0) return cudaSuccess;
    if (const cudaError_t e = check_copy(dst, src, bytes, kind, dst_dev, src_dev); e != cudaSuccess) return e;
    run_legacy_dependencies();
    DeviceWork device;
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    bool dst_dev, src_dev;
    if (bytes == 0) return cudaSuccess;
    if (const cudaError_t e = check_copy(dst, src, bytes, kind, dst_dev, src_dev); e != cudaSuccess) return e;
    const bool dst_pageable = !dst_dev && !is_pinned(dst, bytes), src_pageable = !src_dev && !is_pinned(src, bytes);
    if ((dst_pageable || src_pageable) && refuse_while_capturing(stream)) return fail_with(cudaErrorStreamCaptureUnsupported);
    if (dst_pageable) {  // into pageable memory: complete (after the stream's earlier work) before returning
        host_wait(stream_of(stream));
        DeviceWork device;
        std::memmove(dst, src, bytes);
    } else if (src_pageable) {  // from pageable memory: the data is taken now, written in stream order
        auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
        enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    } else {
        enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
    if (const cudaError_t e = check_memset(p, bytes); e != cudaSuccess) return e;
    run_legacy_dependencies();
    DeviceWork device;
    std::memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
    if (const cudaError_t e = check_memset(p, bytes); e != cudaSuccess) return e;
    if (bytes) enqueue(stream, [p, value, bytes] { std::memset(p, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    struct sysinfo info {};
    if (sysinfo(&info) != 0) return fail_with(cudaErrorUnknown);
    if (free_bytes) *free_bytes = size_t(info.freeram) * info.mem_unit;
    if (total_bytes) *total_bytes = size_t(info.totalram) * info.mem_unit;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
    if (!attr) return fail_with(cudaErrorInvalidValue);
    *attr = cudaPointerAttributes{};
    std::lock_guard lock(allocations().mutex);
    const Allocation* a = allocations().find(p, 0);
    attr->type = !a ? cudaMemoryTypeUnregistered : a->kind == Memory::device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->device = 0;
    attr->devicePointer = a ? const_cast<void*>(p) : nullptr;
    attr->hostPointer = a && a->kind == Memory::pinned_host ? const_cast<void*>(p) : nullptr;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return fail_with(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (!device) return fail_with(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail_with(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceSynchronize() {
    run_device_waiting();
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop || device != 0) return fail_with(cudaErrorInvalidValue);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "CPU (block emulator)");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = kSharedOptin;
    size_t free_bytes = 0, total = 0;
    (void)cudaMemGetInfo(&free_bytes, &total);
    prop->totalGlobalMem = total;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (!value || device != 0) return fail_with(cudaErrorInvalidValue);
    switch (attr) {
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSharedOptin; return cudaSuccess;
        case cudaDevAttrMultiProcessorCount: *value = 1; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
        case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
        default: return fail_with(cudaErrorInvalidValue);
    }
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
    if (!kernel) return fail_with(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints (carveout) change nothing here
    if (value < 0 || value > kSharedOptin) return fail_with(cudaErrorInvalidValue);
    for (auto& [k, bytes] : emu::dynamic_shared_limits())
        if (k == kernel) {
            bytes = size_t(value);
            return cudaSuccess;
        }
    emu::dynamic_shared_limits().emplace_back(kernel, size_t(value));
    return cudaSuccess;
}

cudaError_t cudaGetLastError() {
    cudaError_t e = sticky_error();
    if (e == cudaSuccess) e = emu::launch_error();
    sticky_error() = cudaSuccess;
    emu::launch_error() = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return sticky_error() != cudaSuccess ? sticky_error() : emu::launch_error(); }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        default: return "cudaErrorUnknown";
    }
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument (emulated device: a pointer outside its allocation?)";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
        default: return "unknown error";
    }
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (!s) return fail_with(cudaErrorInvalidValue);
    static uint64_t created = 0;
    auto* stream = new Stream{};
    stream->id = ++created;
    stream->flags = flags;
    streams().insert(stream);
    *s = reinterpret_cast<cudaStream_t>(stream);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return fail_with(cudaErrorInvalidResourceHandle);
    Stream* stream = stream_of(s);
    run_all(stream);  // the GPU finishes a destroyed stream's work
    streams().erase(stream);
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (refuse_while_capturing(s)) return fail_with(cudaErrorStreamCaptureUnsupported);
    host_wait(stream_of(s));
    return cudaSuccess;
}
// Work the host has not waited for has not run (see cudaEventQuery).
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (refuse_while_capturing(s)) return fail_with(cudaErrorStreamCaptureUnsupported);
    progress_at_query(stream_of(s), UINT64_MAX);
    return pending(stream_of(s), UINT64_MAX) ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    if (refuse_while_capturing(s)) return fail_with(cudaErrorStreamCaptureUnsupported);
    const Event marker = *reinterpret_cast<Event*>(e);  // the event's position now, not at a later re-record
    enqueue(s, [marker] { run_to_event(&marker); });
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    if (!e) return fail_with(cudaErrorInvalidValue);
    auto* ev = new Event{};
    ev->timing = (flags & cudaEventDisableTiming) == 0;
    *e = reinterpret_cast<cudaEvent_t>(ev);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    delete reinterpret_cast<Event*>(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    if (refuse_while_capturing(s)) return fail_with(cudaErrorStreamCaptureUnsupported);
    auto* ev = reinterpret_cast<Event*>(e);
    ev->stream = stream_of(s);
    ev->recorded = true;
    enqueue(s, [ev] { ev->when = std::chrono::steady_clock::now(); });  // the time the work before it finished
    ev->position = ev->stream->queued;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    const auto* ev = reinterpret_cast<Event*>(e);
    if (ev->stream) host_wait(ev->stream, ev->position);
    return cudaSuccess;
}
// Work the host has not waited for has not run: not ready, which a GPU may answer at any time (and not sticky).
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    const auto* ev = reinterpret_cast<const Event*>(e);
    if (ev->stream) progress_at_query(ev->stream, ev->position);
    return event_done(ev) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    if (!ms || !start || !stop) return fail_with(cudaErrorInvalidValue);
    const auto* a = reinterpret_cast<Event*>(start);
    const auto* b = reinterpret_cast<Event*>(stop);
    if (!a->timing || !b->timing || !a->recorded || !b->recorded) return fail_with(cudaErrorInvalidResourceHandle);
    if (!event_done(a) || !event_done(b)) return cudaErrorNotReady;  // the host has not waited for them (not sticky)
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

// Stream capture: the stream's work goes into a graph (a list of it, in order) until the capture ends; a launched
// graph queues a copy of every item on the launch stream. Only single-stream graphs.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    Stream* stream = stream_of(s);
    if (!s || stream->capture) return fail_with(cudaErrorIllegalState);
    stream->capture = std::make_unique<std::vector<emu::StreamWork>>();
    stream->capture_invalidated = false;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    if (!status) return fail_with(cudaErrorInvalidValue);
    const Stream* stream = stream_of(s);
    *status = !stream->capture              ? cudaStreamCaptureStatusNone
              : stream->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                            : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    if (!graph) return fail_with(cudaErrorInvalidValue);
    Stream* stream = stream_of(s);
    *graph = nullptr;
    if (!stream->capture) return fail_with(cudaErrorIllegalState);
    std::unique_ptr<std::vector<emu::StreamWork>> work = std::move(stream->capture);
    if (stream->capture_invalidated) return fail_with(cudaErrorStreamCaptureInvalidated);
    *graph = reinterpret_cast<cudaGraph_t>(work.release());
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (!exec || !graph) return fail_with(cudaErrorInvalidValue);
    const auto* work = reinterpret_cast<const std::vector<emu::StreamWork>*>(graph);
    *exec = reinterpret_cast<cudaGraphExec_t>(new std::vector<emu::StreamWork>(*work));
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return fail_with(cudaErrorInvalidResourceHandle);
    if (refuse_while_capturing(s)) return fail_with(cudaErrorStreamCaptureUnsupported);
    for (const emu::StreamWork& work : *reinterpret_cast<const std::vector<emu::StreamWork>*>(exec)) {
        emu::StreamWork copy = work;
        enqueue(s, std::move(copy));
    }
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete reinterpret_cast<std::vector<emu::StreamWork>*>(exec);
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete reinterpret_cast<std::vector<emu::StreamWork>*>(graph);
    return cudaSuccess;
}

cudaError_t cudaProfilerStart() { return cudaSuccess; }
cudaError_t cudaProfilerStop() { return cudaSuccess; }

}  // extern "C"
