// The CUDA runtime calls of the trainer, served on the CPU: with this file (and emu_cublas.cpp, emu_nccl.cpp)
// in place of libcudart, libcublas(Lt) and libnccl, and dev/cuda/block_emulator.h running the kernels,
// train_gpt.cu and the GPU tests build with g++ and run on a machine without a GPU (`make emu`). The device is
// the CPU: "device memory" is host memory handed out by cudaMalloc, streams and events are synchronous (a
// kernel or a copy is complete when its call returns), and there is one device, sm_90-like.
//
// What the GPU would refuse is refused here too, so host-side mistakes surface on the CPU: a copy or memset
// whose device side is not inside one cudaMalloc allocation, or whose host side is (wrong cudaMemcpyKind),
// fails with cudaErrorInvalidValue; freeing a pointer twice or one that was not allocated fails; launches are
// checked by emu::Launch. Fresh allocations are filled with 0xff bytes (NaN in fp32 and bf16), as the GPU
// promises nothing about them, so a read before the first write shows up as NaN. What it cannot catch: a
// kernel touching host memory, and anything that depends on asynchrony (a host buffer reused before its copy
// finished).
#include "dev/cuda/block_emulator.h"
// block_emulator.h first: the dynamic shared memory arrays below need its EMU_DEFINE_SHARED.
#include <cuda_profiler_api.h>
#include <sys/sysinfo.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

// The kernels' dynamic shared memory (LLMC_DYNAMIC_SHARED): the DeMo kernels' and flash attention's.
EMU_DEFINE_SHARED(demo, smem4)
EMU_DEFINE_SHARED(llmc::flash, flash_smem)

namespace {

enum class Memory { device, pinned_host };
struct Allocation {
    size_t bytes;
    Memory kind;
};

// Every live cudaMalloc / cudaMallocHost allocation by base address. Host code of the trainer may run on
// OpenMP threads, so the table is locked.
struct Allocations {
    std::mutex mutex;
    std::map<uintptr_t, Allocation> live;

    // The allocation holding [p, p + bytes), if one does.
    const Allocation* find(const void* p, size_t bytes, uintptr_t* base = nullptr) {
        const auto a = reinterpret_cast<uintptr_t>(p);
        auto it = live.upper_bound(a);
        if (it == live.begin()) return nullptr;
        --it;
        if (a + bytes > it->first + it->second.bytes || a < it->first) return nullptr;
        if (bytes == 0 && a >= it->first + it->second.bytes) return nullptr;
        if (base) *base = it->first;
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

cudaError_t allocate(void** p, size_t bytes, Memory kind) {
    if (!p) return fail_with(cudaErrorInvalidValue);
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    const size_t rounded = (bytes + 255) & ~size_t(255);  // the GPU aligns allocations to at least 256 bytes
    void* mem = std::aligned_alloc(256, rounded);
    if (!mem) return fail_with(cudaErrorMemoryAllocation);
    std::memset(mem, 0xff, rounded);
    std::lock_guard lock(allocations().mutex);
    allocations().live[reinterpret_cast<uintptr_t>(mem)] = Allocation{bytes, kind};
    *p = mem;
    return cudaSuccess;
}

cudaError_t release(void* p, Memory kind) {
    if (!p) return cudaSuccess;
    std::lock_guard lock(allocations().mutex);
    auto it = allocations().live.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations().live.end() || it->second.kind != kind) return fail_with(cudaErrorInvalidValue);
    allocations().live.erase(it);
    std::free(p);
    return cudaSuccess;
}

bool is_device(const void* p, size_t bytes) {
    std::lock_guard lock(allocations().mutex);
    const Allocation* a = allocations().find(p, bytes);
    return a && a->kind == Memory::device;
}
bool touches_device(const void* p, size_t bytes) {
    std::lock_guard lock(allocations().mutex);
    const Allocation* a = allocations().find(p, bytes ? 1 : 0);
    return a && a->kind == Memory::device;
}

// The side of a copy: device memory must lie inside one allocation; host memory must not be device memory.
bool side_ok(const void* p, size_t bytes, bool device) {
    if (bytes == 0) return true;
    if (!p) return false;
    return device ? is_device(p, bytes) : !touches_device(p, bytes);
}

cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    bool dst_dev = false, src_dev = false;
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
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t set(void* p, int value, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    if (!is_device(p, bytes)) return fail_with(cudaErrorInvalidValue);
    std::memset(p, value, bytes);
    return cudaSuccess;
}

// Streams and events are tokens; an event remembers when it was recorded.
struct Event {
    std::chrono::steady_clock::time_point when{};
    bool recorded = false;
    bool timing = true;
};
struct Stream {
    unsigned flags = 0;
};

constexpr int kSharedOptin = 227 * 1024;  // an H100's opt-in limit per block

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) { return allocate(p, bytes, Memory::device); }
cudaError_t cudaFree(void* p) { return release(p, Memory::device); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocate(p, bytes, Memory::pinned_host); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return allocate(p, bytes, Memory::pinned_host); }
cudaError_t cudaFreeHost(void* p) { return release(p, Memory::pinned_host); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) { return copy(dst, src, bytes, kind); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
    return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return set(p, value, bytes); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return set(p, value, bytes); }

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
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

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
        default: return "unknown error";
    }
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    if (!s) return fail_with(cudaErrorInvalidValue);
    *s = reinterpret_cast<cudaStream_t>(new Stream{});
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (!s) return fail_with(cudaErrorInvalidValue);
    *s = reinterpret_cast<cudaStream_t>(new Stream{flags});
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return fail_with(cudaErrorInvalidResourceHandle);
    delete reinterpret_cast<Stream*>(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
    return e ? cudaSuccess : fail_with(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    if (!e) return fail_with(cudaErrorInvalidValue);
    *e = reinterpret_cast<cudaEvent_t>(new Event{});
    return cudaSuccess;
}
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
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    if (!e) return fail_with(cudaErrorInvalidResourceHandle);
    auto* ev = reinterpret_cast<Event*>(e);
    ev->when = std::chrono::steady_clock::now();
    ev->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : fail_with(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : fail_with(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    if (!ms || !start || !stop) return fail_with(cudaErrorInvalidValue);
    const auto* a = reinterpret_cast<Event*>(start);
    const auto* b = reinterpret_cast<Event*>(stop);
    if (!a->timing || !b->timing || !a->recorded || !b->recorded) return fail_with(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

cudaError_t cudaProfilerStart() { return cudaSuccess; }
cudaError_t cudaProfilerStop() { return cudaSuccess; }

}  // extern "C"
