// Shared CUDA plumbing for the kernels in llmc/*.cuh, the GPU trainer and the dev/cuda checkers:
//  - CUDA_CHECK / CUBLAS_CHECK / CUDA_CHECK_LAUNCH: every runtime and cuBLAS call is checked; a failure throws
//    llmc::Error "CUDA error ... at file:line in <call>: <what to do>", which main() prints as one line.
//  - LLMC_LAUNCH: every kernel launch, so that under the block emulator (g++, no GPU) the same host code runs
//    the kernels on the CPU (emu/block_emulator.h; `make emu` builds the trainer that way).
//  - floatX: the storage type of parameters and activations, __nv_bfloat16 by default, float with
//    -DENABLE_FP32 (then every kernel runs in fp32, for tight comparisons with the CPU/PyTorch references).
//  - cuda_device_present(): the no-GPU check every program does first (tests/checkers exit 77 with
//    "SKIP: no CUDA device"; the trainer prints a one-line error).
//  - DeviceBuffer<T>: RAII cudaMalloc/cudaFree. DeviceArena: plan many tensors, then ONE cudaMalloc for all of
//    them (the model has one allocation per kind of memory: parameters, gradients, master weights + optimizer
//    state, activations), as llm.c does.
//  - CudaEnv: the device, the main stream and the cuBLASLt handle + workspace that matmul.cuh uses.
//  - Deterministic column reductions (bias and LayerNorm weight gradients): fixed row splits summed in a fixed
//    order, no atomics, so a run is bit-reproducible.
//  - Vector (128-bit) loads, warp/block reductions, conversions, an event timer.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/kernel_math.h"

namespace llmc {

// ---------------------------------------------------------------------------------------------------------
// Precision
#if defined(ENABLE_FP32)
using floatX = float;
inline constexpr const char* kFloatXName = "fp32";
inline constexpr cudaDataType_t kFloatXCuda = CUDA_R_32F;
#else
using floatX = __nv_bfloat16;
inline constexpr const char* kFloatXName = "bf16";
inline constexpr cudaDataType_t kFloatXCuda = CUDA_R_16BF;
#endif
inline constexpr bool kFloatXIsFloat = std::is_same_v<floatX, float>;

// ---------------------------------------------------------------------------------------------------------
// Error checking
inline std::string cuda_error_advice(cudaError_t err) {
    switch (err) {
        case cudaErrorMemoryAllocation:
            return "out of GPU memory: lower --batch_size or --seq_len, or use a GPU with more memory";
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
            return "no usable CUDA device or driver: check nvidia-smi and the NVIDIA driver version";
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
            return "a kernel accessed invalid memory: rerun under compute-sanitizer to find it";
        case cudaErrorNoKernelImageForDevice:
        case cudaErrorUnsupportedPtxVersion:
            return "this binary has no code for this GPU: rebuild with its arch in CUDA_ARCH (sm_80, sm_90 built)";
        case cudaErrorInvalidConfiguration:
        case cudaErrorInvalidValue:
            return "bad launch or argument (a size too large for this kernel?); rerun with CUDA_LAUNCH_BLOCKING=1";
        default:
            return "rerun with CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) to locate the failing call";
    }
}

[[noreturn]] inline void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
    fail(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") at " + file + ":" +
         std::to_string(line) + " in " + call + ": " + cuda_error_advice(err));
}

inline std::string cublas_error_advice(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "this shape/type/alignment is not supported: keep channels a multiple of 8";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "out of GPU memory inside cuBLAS: lower --batch_size";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "cuBLAS could not start: check the driver (nvidia-smi) and the CUDA libraries";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "this GPU lacks a needed feature (bf16 needs sm_80 or newer)";
        default:
            return "rerun with CUDA_LAUNCH_BLOCKING=1 and CUBLASLT_LOG_LEVEL=2 for details";
    }
}

[[noreturn]] inline void cublas_fail(cublasStatus_t status, const char* call, const char* file, int line) {
    fail(std::string("cuBLAS error ") + cublasGetStatusString(status) + " at " + file + ":" + std::to_string(line) +
         " in " + call + ": " + cublas_error_advice(status));
}

}  // namespace llmc

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        const cudaError_t llmc_err_ = (call);                                             \
        if (llmc_err_ != cudaSuccess) ::llmc::cuda_fail(llmc_err_, #call, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: catches bad launch configurations (asynchronous faults surface at the next sync).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        const cublasStatus_t llmc_status_ = (call);                                               \
        if (llmc_status_ != CUBLAS_STATUS_SUCCESS) ::llmc::cublas_fail(llmc_status_, #call, __FILE__, __LINE__); \
    } while (0)

namespace llmc {

inline constexpr int kWarpSize = 32;

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------------------
// Device presence. Without a driver cudaGetDeviceCount fails (cudaErrorInsufficientDriver / NoDevice): that
// is "no device", not an error. The sticky error state is cleared so later checks are not confused.
inline bool cuda_device_present() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return count > 0;
}

// For tests and checkers: exit 77 (the runner's "skipped") when there is no GPU.
inline void skip_without_cuda_device() {
    if (!cuda_device_present()) {
        std::printf("SKIP: no CUDA device\n");
        std::fflush(stdout);
        std::exit(77);
    }
}

// ---------------------------------------------------------------------------------------------------------
// floatX conversions
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Host-side, bit-exact with the device's round-to-nearest-even (kernel_math.h). Overloads, not `if constexpr`
// (outside templates both branches must compile for both precisions).
inline void host_store(float* dst, float x) { *dst = x; }
inline void host_store(__nv_bfloat16* dst, float x) {
    __nv_bfloat16_raw raw;
    raw.x = km::bf16_bits_rne(x);
    *dst = __nv_bfloat16(raw);
}
inline float host_from_floatX(float x) { return x; }
inline float host_from_floatX(__nv_bfloat16 x) {
    const __nv_bfloat16_raw raw = static_cast<__nv_bfloat16_raw>(x);
    return km::bf16_bits_to_float(raw.x);
}
inline floatX host_to_floatX(float x) {
    floatX r;
    host_store(&r, x);
    return r;
}
// The raw bits of a stored value (bf16: 16 bits; fp32: 32 bits), for bit-exact comparisons.
inline uint32_t storage_bits(float x) { return km::float_to_bits(x); }
inline uint32_t storage_bits(__nv_bfloat16 x) { return static_cast<__nv_bfloat16_raw>(x).x; }

// Stores a float into floatX with stochastic rounding driven by (index, seed); plain store for fp32.
__device__ __forceinline__ void store_stochastic(float* dst, float value, uint64_t, uint32_t) { *dst = value; }
__device__ __forceinline__ void store_stochastic(__nv_bfloat16* dst, float value, uint64_t index, uint32_t seed) {
    __nv_bfloat16_raw raw;
    raw.x = km::bf16_bits_stochastic(value, km::element_noise(index, seed));
    *dst = __nv_bfloat16(raw);
}

// ---------------------------------------------------------------------------------------------------------
// Every vector access of the kernels (8 or 16 bytes, or a 4-byte word of two 16-bit values) names its
// alignment here: a misaligned one faults on the GPU but works on x86, so under the block emulator
// (emu/block_emulator.h) this checks it and the CPU tests catch it.
#if defined(LLMC_BLOCK_EMULATOR)
#define LLMC_REQUIRE_ALIGNED(p, bytes) ::emu::require_aligned((p), (bytes), #p)
#else
#define LLMC_REQUIRE_ALIGNED(p, bytes) ((void)0)
#endif

// The dynamic shared memory array of a kernel (`extern __shared__ type name[]`); the block emulator supplies its
// own definition of the array (EMU_DEFINE_SHARED), so kernels declare it through this macro.
#if defined(LLMC_BLOCK_EMULATOR)
#define LLMC_DYNAMIC_SHARED(type, name) EMU_DYNAMIC_SHARED_DECL(type, name)
#else
#define LLMC_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// A kernel launch: LLMC_LAUNCH(grid, block, shared_bytes, stream, kernel)(arguments...) is
// kernel<<<grid, block, shared_bytes, stream>>>(arguments...) under nvcc. Under the block emulator (g++) it runs
// every block of the grid on the CPU before returning (emu::launch in emu/block_emulator.h), so the host
// wrappers below, the model and the trainer also compile and run on a machine without a GPU.
#if defined(LLMC_BLOCK_EMULATOR)
#define LLMC_LAUNCH(grid, block, shared_bytes, stream, ...) \
    ::emu::launch((grid), (block), (shared_bytes), (stream), __VA_ARGS__, #__VA_ARGS__)
#else
#define LLMC_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif

// 128-bit vectors: N elements of T loaded/stored in one instruction. Pointers must be 16-byte aligned.
template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
    __device__ float f(int i) const { return to_float(v[i]); }
};
template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
    LLMC_REQUIRE_ALIGNED(p, 16);
    return *reinterpret_cast<const Packed128<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& x) {
    LLMC_REQUIRE_ALIGNED(p, 16);
    *reinterpret_cast<Packed128<T>*>(p) = x;
}
using x128 = Packed128<floatX>;

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---------------------------------------------------------------------------------------------------------
// Asynchronous global -> shared copies of BYTES (4 or 16), zero-filled when !valid (the source is not read).
// The emulator performs them only at the issuing thread's wait (emu/block_emulator.h).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async(dst, src, BYTES, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(BYTES),
                     "r"(valid ? BYTES : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#if defined(LLMC_BLOCK_EMULATOR)
    emu::cp_async_wait(PENDING);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Reductions (fixed butterfly order: deterministic)
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
__device__ __forceinline__ km::SoftmaxStat warp_softmax_merge(km::SoftmaxStat s) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        km::SoftmaxStat o;
        o.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
        o.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
        s = km::softmax_stat_merge(s, o);
    }
    return s;
}

// Reduction over the block (blockDim.x a multiple of 32, at most 1024) in a fixed order: each warp's butterfly,
// then one over the warps' results in warp order; every thread gets the result. `shared` holds 32 values. Safe to
// call repeatedly (syncs before reusing the shared slots). `identity` fills the lanes past the last warp.
template <typename T, typename WarpReduce>
__device__ T block_reduce(T v, T* shared, T identity, WarpReduce warp_reduce) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int num_warps = blockDim.x / kWarpSize;
    v = warp_reduce(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    return warp_reduce(lane < num_warps ? shared[lane] : identity);
}
template <typename T>
__device__ T block_sum(T v, T* shared) {
    return block_reduce(v, shared, T(0), [](T x) { return warp_sum(x); });
}
__device__ __forceinline__ float block_max(float v, float* shared) {
    return block_reduce(v, shared, -INFINITY, [](float x) { return warp_max(x); });
}

// ---------------------------------------------------------------------------------------------------------
// RAII device memory
template <typename T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t count, const char* what = "device buffer") { allocate(count, what); }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            release();
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }

    void allocate(size_t count, const char* what = "device buffer") {
        release();
        if (count == 0) return;
        const cudaError_t err = cudaMalloc(&ptr_, count * sizeof(T));
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            ptr_ = nullptr;
            fail(std::string("cudaMalloc of ") + std::to_string(count * sizeof(T) >> 20) + " MiB for " + what +
                 " failed (" + cudaGetErrorString(err) + "): " + cuda_error_advice(err));
        }
        count_ = count;
    }
    void release() {
        if (ptr_) (void)cudaFree(ptr_);  // no throw from destructors
        ptr_ = nullptr;
        count_ = 0;
    }
    T* data() const { return ptr_; }
    size_t size() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }

    void upload(const T* host, size_t count, size_t offset = 0) {
        LLMC_CHECK(offset + count <= count_, "DeviceBuffer::upload out of range");
        CUDA_CHECK(cudaMemcpy(ptr_ + offset, host, count * sizeof(T), cudaMemcpyHostToDevice));
    }
    void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
    std::vector<T> download(size_t count, size_t offset = 0) const {
        LLMC_CHECK(offset + count <= count_, "DeviceBuffer::download out of range");
        std::vector<T> host(count);
        CUDA_CHECK(cudaMemcpy(host.data(), ptr_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    std::vector<T> download() const { return download(count_); }

private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// Pinned (page-locked) host memory for small readbacks: a cudaMemcpyAsync into pageable memory makes the host wait
// for the stream's earlier work, one into pinned memory is queued like a kernel, so several results can be read
// back behind one synchronization.
template <typename T>
class PinnedHostBuffer {
public:
    PinnedHostBuffer() = default;
    explicit PinnedHostBuffer(size_t count) {
        if (count) CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
        count_ = count;
    }
    ~PinnedHostBuffer() {
        if (ptr_) (void)cudaFreeHost(ptr_);
    }
    PinnedHostBuffer(const PinnedHostBuffer&) = delete;
    PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
    PinnedHostBuffer(PinnedHostBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    PinnedHostBuffer& operator=(PinnedHostBuffer&& o) noexcept {
        if (this != &o) {
            if (ptr_) (void)cudaFreeHost(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    T* data() { return ptr_; }
    const T* data() const { return ptr_; }
    size_t size() const { return count_; }

private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// A CUDA event, owned: a point in a stream that the host or another stream can wait for. Without timing (cheaper
// to record); TimedCudaEvent keeps the time. Created on first use, so it can be a member of objects built before
// the device is chosen; waiting for one never recorded returns at once (host) or waits for nothing (a stream).
class CudaEvent {
public:
    CudaEvent() = default;
    ~CudaEvent() {
        if (event_) (void)cudaEventDestroy(event_);
    }
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)), timed_(o.timed_) {}
    CudaEvent& operator=(CudaEvent&& o) noexcept {
        if (this != &o) {
            if (event_) (void)cudaEventDestroy(event_);
            event_ = std::exchange(o.event_, nullptr);
            timed_ = o.timed_;
        }
        return *this;
    }
    void record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(get(), stream)); }
    // Work queued on `stream` from now on starts after the work before the last record().
    void wait_in(cudaStream_t stream) { CUDA_CHECK(cudaStreamWaitEvent(stream, get(), 0)); }
    void synchronize() const {
        if (event_) CUDA_CHECK(cudaEventSynchronize(event_));
    }
    // Whether the work before the last record() has finished (no wait).
    bool done() const {
        if (!event_) return true;
        const cudaError_t status = cudaEventQuery(event_);
        if (status == cudaErrorNotReady) return false;
        CUDA_CHECK(status);
        return true;
    }
    // The handle when it exists, else null: for destructors, which must not create one or fail.
    cudaEvent_t existing() const noexcept { return event_; }

protected:
    explicit CudaEvent(bool timed) : timed_(timed) {}

private:
    cudaEvent_t get() {
        if (!event_) CUDA_CHECK(cudaEventCreateWithFlags(&event_, timed_ ? cudaEventDefault : cudaEventDisableTiming));
        return event_;
    }
    cudaEvent_t event_ = nullptr;
    bool timed_ = false;
};

// A CudaEvent that keeps the time its work finished, for GPU time between two of them.
class TimedCudaEvent : public CudaEvent {
public:
    TimedCudaEvent() : CudaEvent(true) {}
    // Milliseconds from `start`'s last record() to this one's; both must have been recorded and finished.
    float ms_since(const TimedCudaEvent& start) const {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start.existing(), existing()));
        return ms;
    }
};

// Pinned (page-locked) host staging for asynchronous uploads, in two buffers used in turn. upload() waits until
// the upload before the previous one has been consumed (an event recorded after it), copies the data in, and
// enqueues the copy, so the host never overwrites bytes a pending cudaMemcpyAsync still reads. Two buffers let
// the host stage a batch while the copy of the last one may still be queued (the trainer queues the next step's
// micro-step while the GPU runs this one's) without waiting for the GPU.
template <typename T>
class PinnedUpload {
public:
    PinnedUpload() = default;
    ~PinnedUpload() {
        for (Slot& s : slots_)
            if (s.host) (void)cudaFreeHost(s.host);
    }
    PinnedUpload(const PinnedUpload&) = delete;
    PinnedUpload& operator=(const PinnedUpload&) = delete;

    void upload(T* device_dst, const T* src, size_t count, cudaStream_t stream) {
        if (count == 0) return;
        Slot& s = slots_[next_];
        next_ = (next_ + 1) % kSlots;
        s.copied.synchronize();  // this buffer's last copy has completed
        if (count > s.capacity) {
            if (s.host) CUDA_CHECK(cudaFreeHost(s.host));
            s.host = nullptr;
            CUDA_CHECK(cudaMallocHost(&s.host, count * sizeof(T)));
            s.capacity = count;
        }
        std::memcpy(s.host, src, count * sizeof(T));
        CUDA_CHECK(cudaMemcpyAsync(device_dst, s.host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
        s.copied.record(stream);
    }

private:
    static constexpr int kSlots = 2;
    struct Slot {
        T* host = nullptr;
        size_t capacity = 0;
        CudaEvent copied;
    };
    Slot slots_[kSlots];
    int next_ = 0;
};

// One allocation for many tensors: add() every tensor (a pointer slot and an element count), then allocate()
// does a single cudaMalloc and points every slot into it (each tensor 256-byte aligned, enough for cuBLASLt and
// 128-bit loads). The arena owns the memory.
class DeviceArena {
public:
    DeviceArena() = default;
    ~DeviceArena() { release(); }
    DeviceArena(const DeviceArena&) = delete;
    DeviceArena& operator=(const DeviceArena&) = delete;

    template <typename T>
    void add(T** slot, size_t count) {
        LLMC_CHECK(base_ == nullptr, "DeviceArena::add after allocate");
        const size_t offset = bytes_;
        bytes_ += round_up(count * sizeof(T));
        setters_.push_back([slot, offset, count](std::byte* base) { *slot = count ? reinterpret_cast<T*>(base + offset) : nullptr; });
    }
    // `what` names the memory kind in the out-of-memory message ("activations", "parameters"...).
    void allocate(const std::string& what) {
        LLMC_CHECK(base_ == nullptr, "DeviceArena::allocate twice");
        if (bytes_ == 0) return;
        const cudaError_t err = cudaMalloc(&base_, bytes_);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            base_ = nullptr;
            size_t free_b = 0, total_b = 0;
            (void)cudaMemGetInfo(&free_b, &total_b);
            (void)cudaGetLastError();
            fail("cannot allocate " + std::to_string(bytes_ >> 20) + " MiB of GPU memory for " + what + " (" +
                 std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
                 "): " + cuda_error_advice(err));
        }
        for (auto& set : setters_) set(base_);
        setters_.clear();
    }
    void release() {
        if (base_) (void)cudaFree(base_);
        base_ = nullptr;
    }
    void zero(cudaStream_t stream) {
        if (base_) CUDA_CHECK(cudaMemsetAsync(base_, 0, bytes_, stream));
    }
    size_t bytes() const { return bytes_; }
    void* base() const { return base_; }

private:
    static size_t round_up(size_t b) { return (b + 255) & ~size_t(255); }
    std::vector<std::function<void(std::byte*)>> setters_;
    size_t bytes_ = 0;
    std::byte* base_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------
// Device, stream and cuBLASLt context. One per process; matmul.cuh and attention.cuh take it by reference.
struct CudaEnv {
    int device = 0;
    cudaDeviceProp props{};
    cudaStream_t stream = nullptr;
    cublasLtHandle_t lt = nullptr;
    cublasHandle_t blas = nullptr;  // fallback for plain matmuls cuBLASLt finds no algorithm for
    void* workspace = nullptr;
    size_t workspace_bytes = 32u << 20;  // Hopper wants 32 MiB for its best kernels
    // fp32 builds: allow TF32 tensor cores in matmuls (faster, ~1e-3 relative error). Off by default so the
    // fp32 build matches references tightly.
    bool allow_tf32 = false;
    // matmul.cuh: time cuBLASLt's candidate algorithms for each new problem instead of taking its first
    // (--matmul_tune).
    bool tune_matmuls = false;

    explicit CudaEnv(int device_index = 0) : device(device_index) {
        if (!cuda_device_present()) fail("no CUDA device found (cudaGetDeviceCount): this program needs an NVIDIA GPU");
        CUDA_CHECK(cudaSetDevice(device));
        CUDA_CHECK(cudaGetDeviceProperties(&props, device));
        LLMC_CHECK(props.major >= 8, std::string("GPU ") + props.name + " is sm_" + std::to_string(props.major) +
                                         std::to_string(props.minor) + "; bf16 kernels need sm_80 or newer");
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasLtCreate(&lt));
        CUBLAS_CHECK(cublasCreate(&blas));
        CUBLAS_CHECK(cublasSetStream(blas, stream));
        CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
        // The fallback GEMMs share cuBLASLt's workspace: no allocation of cuBLAS's own (none during a CUDA graph
        // capture, --cuda_graph), and one stream orders their use of it.
        CUBLAS_CHECK(cublasSetWorkspace(blas, workspace, workspace_bytes));
    }
    ~CudaEnv() {
        if (workspace) (void)cudaFree(workspace);
        if (blas) (void)cublasDestroy(blas);
        if (lt) (void)cublasLtDestroy(lt);
        if (stream) (void)cudaStreamDestroy(stream);
    }
    CudaEnv(const CudaEnv&) = delete;
    CudaEnv& operator=(const CudaEnv&) = delete;

    void sync() const { CUDA_CHECK(cudaStreamSynchronize(stream)); }
    int num_sms() const { return props.multiProcessorCount; }
    std::string describe() const {
        return std::string(props.name) + " (sm_" + std::to_string(props.major) + std::to_string(props.minor) + ", " +
               std::to_string(props.multiProcessorCount) + " SMs, " + std::to_string(props.totalGlobalMem >> 30) + " GiB)";
    }
};

// Event-based timer on a stream (milliseconds).
class CudaTimer {
public:
    explicit CudaTimer(cudaStream_t stream) : stream_(stream) {}
    void start() { start_.record(stream_); }
    float stop_ms() {
        stop_.record(stream_);
        stop_.synchronize();
        return stop_.ms_since(start_);
    }

private:
    cudaStream_t stream_;
    TimedCudaEvent start_, stop_;
};

// ---------------------------------------------------------------------------------------------------------
// Elementwise conversions
__global__ void convert_float_to_floatX_kernel(floatX* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = from_float<floatX>(src[i]);
}
__global__ void convert_floatX_to_float_kernel(float* dst, const floatX* src, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = to_float(src[i]);
}

inline int grid_stride_blocks(size_t n, int block_size) {
    return static_cast<int>(std::min<size_t>(ceil_div<size_t>(n, size_t(block_size)), 65535u * 4u));
}

// dst = round_to_nearest(src), on the device.
inline void convert_to_floatX(floatX* dst, const float* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    LLMC_LAUNCH(grid_stride_blocks(n, 256), 256, 0, stream, convert_float_to_floatX_kernel)(dst, src, n);
    CUDA_CHECK_LAUNCH();
}
inline void convert_to_float(float* dst, const floatX* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    LLMC_LAUNCH(grid_stride_blocks(n, 256), 256, 0, stream, convert_floatX_to_float_kernel)(dst, src, n);
    CUDA_CHECK_LAUNCH();
}

// Host helpers for tests and checkers.
inline std::vector<floatX> host_to_floatX(const std::vector<float>& v) {
    std::vector<floatX> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = host_to_floatX(v[i]);
    return out;
}
inline std::vector<float> host_from_floatX(const std::vector<floatX>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++) out[i] = host_from_floatX(v[i]);
    return out;
}
// The values a float vector takes after a round trip through floatX (the inputs a kernel actually sees).
inline std::vector<float> round_to_floatX(const std::vector<float>& v) { return host_from_floatX(host_to_floatX(v)); }

// ---------------------------------------------------------------------------------------------------------
// Deterministic column reduction: out_k[c] += sum_r value_k(r, c) for a (rows x cols) grid and NV values per
// element, produced by a functor with `template <int VEC> void load(int r, int c, float (&vals)[NV][VEC]) const`
// (the values of columns c .. c + VEC - 1 of row r) and `bool aligned() const` (its buffers allow 128-bit
// loads). Stage 1: each block owns 32 x VEC columns and one split of kColumnReduceRowsPerSplit rows; threads
// (x = column group, y = 0..7) take every 8th row of the split (8 rows each, their loads issued together), and
// the 8 partial sums per column are added in order. Stage 2: threads (x = column, y = 0..7) add every 8th
// split in order, and the 8 sums are added in order. VEC = x128::size (one 128-bit load per thread and row: a
// warp reads 512
// contiguous bytes of a row instead of 64) when cols and the buffers allow, else 1; every column's sums are the
// same additions in the same order either way, so the two give the same bits. The split size is a constant, so
// results do not depend on the GPU. No atomics anywhere. 64-row splits (GPT-2 124M at B=16, T=1024: 256 splits,
// 768 to 3,072 blocks of 256 threads) keep 8 loads in flight per thread on every SM; 256-row ones gave the
// bias reductions 192 to 768 blocks with 4 loads each (two-thirds of the SMs on one block).
inline constexpr int kColumnReduceRowsPerSplit = 64;
inline constexpr int kColumnReduceThreadsY = 8;
inline constexpr int kColumnReduceRowsPerThread = kColumnReduceRowsPerSplit / kColumnReduceThreadsY;
static_assert(kColumnReduceRowsPerSplit % kColumnReduceThreadsY == 0, "whole rows per thread");

inline size_t column_reduce_scratch_floats(int rows, int cols, int nv) {
    return size_t(ceil_div(rows, kColumnReduceRowsPerSplit)) * size_t(nv) * size_t(cols);
}

// The VEC the launch uses for these columns and this functor.
template <typename F>
inline int column_reduce_vec(int cols, const F& f) {
    return cols % x128::size == 0 && f.aligned() ? x128::size : 1;
}

template <int NV, int VEC, typename F>
__global__ void column_reduce_stage1_kernel(float* partial, int rows, int cols, F f) {
    __shared__ float shared[NV][kColumnReduceThreadsY][VEC][kWarpSize];
    const int c0 = (blockIdx.x * kWarpSize + threadIdx.x) * VEC;  // cols % VEC == 0
    const int split = blockIdx.y;
    const int r0 = split * kColumnReduceRowsPerSplit;
    const int r1 = min(rows, r0 + kColumnReduceRowsPerSplit);
    float acc[NV][VEC];
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < VEC; j++) acc[k][j] = 0.0f;
    // A whole split takes the unguarded loop, whose 8 loads the compiler issues together; a guarded one loads
    // after each bounds test.
    auto add_rows = [&](auto whole) {
#pragma unroll
        for (int i = 0; i < kColumnReduceRowsPerThread; i++) {
            const int r = r0 + int(threadIdx.y) + i * kColumnReduceThreadsY;
            if (!decltype(whole)::value && r >= r1) break;
            float vals[NV][VEC];
            f.template load<VEC>(r, c0, vals);
#pragma unroll
            for (int k = 0; k < NV; k++)
#pragma unroll
                for (int j = 0; j < VEC; j++) acc[k][j] += vals[k][j];
        }
    };
    if (c0 < cols) {
        if (r1 - r0 == kColumnReduceRowsPerSplit) add_rows(std::true_type{});
        else add_rows(std::false_type{});
    }
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < VEC; j++) shared[k][threadIdx.y][j][threadIdx.x] = acc[k][j];
    __syncthreads();
    if (threadIdx.y == 0 && c0 < cols) {
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                float s = 0.0f;
                for (int y = 0; y < kColumnReduceThreadsY; y++) s += shared[k][y][j][threadIdx.x];
                partial[(size_t(split) * NV + k) * cols + c0 + j] = s;
            }
    }
}

template <int NV>
struct ColumnOutputs {
    float* out[NV];  // nullptr: skip that value
};

// grid ceil(cols / 32), block (32, kColumnReduceThreadsY). accumulate: out += the sums, else out = them.
template <int NV>
__global__ void column_reduce_stage2_kernel(ColumnOutputs<NV> outs, const float* partial, int splits, int cols,
                                            bool accumulate) {
    __shared__ float shared[NV][kColumnReduceThreadsY][kWarpSize];
    const int c = blockIdx.x * kWarpSize + threadIdx.x;
    float acc[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) acc[k] = 0.0f;
    if (c < cols)
        for (int sp = threadIdx.y; sp < splits; sp += kColumnReduceThreadsY)
#pragma unroll
            for (int k = 0; k < NV; k++) acc[k] += partial[(size_t(sp) * NV + k) * cols + c];
#pragma unroll
    for (int k = 0; k < NV; k++) shared[k][threadIdx.y][threadIdx.x] = acc[k];
    __syncthreads();
    if (threadIdx.y != 0 || c >= cols) return;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if (outs.out[k] == nullptr) continue;
        float s = 0.0f;
        for (int y = 0; y < kColumnReduceThreadsY; y++) s += shared[k][y][threadIdx.x];
        outs.out[k][c] = accumulate ? outs.out[k][c] + s : s;
    }
}

// Stage 2 of a column reduction whose stage 1 wrote `partial` (splits x NV x cols floats) itself; the outputs get
// the sums added (accumulate) or written.
template <int NV>
void column_reduce_finish(ColumnOutputs<NV> outs, const float* partial, int splits, int cols, cudaStream_t stream,
                          bool accumulate = true) {
    const dim3 block(kWarpSize, kColumnReduceThreadsY);
    LLMC_LAUNCH(ceil_div(cols, kWarpSize), block, 0, stream, column_reduce_stage2_kernel<NV>)(outs, partial, splits, cols,
                                                                                              accumulate);
    CUDA_CHECK_LAUNCH();
}

// The column sums of a (rows, OC) floatX matrix: a linear layer's bias gradient from its dout (matmul_backward;
// layernorm_backward's dinp sums are the same terms).
struct BiasGrad {
    const floatX* dout;
    int OC;
    template <int VEC>
    __device__ void load(int r, int c, float (&v)[1][VEC]) const {
        const floatX* p = dout + size_t(r) * OC + c;
        if constexpr (VEC == 1) {
            v[0][0] = to_float(*p);
        } else {
            static_assert(VEC == x128::size, "scalar or 128-bit");
            const x128 d = load128(p);
#pragma unroll
            for (int j = 0; j < VEC; j++) v[0][j] = d.f(j);
        }
    }
    bool aligned() const { return aligned16(dout); }
};

// `scratch` holds column_reduce_scratch_floats(rows, cols, NV) floats. accumulate: as column_reduce_finish.
template <int NV, typename F>
void column_reduce(ColumnOutputs<NV> outs, float* scratch, int rows, int cols, F f, cudaStream_t stream,
                   bool accumulate = true) {
    if (cols <= 0) return;
    if (rows <= 0) {  // no rows: the sums are zero (stage 2 over no splits writes them)
        if (!accumulate) column_reduce_finish<NV>(outs, scratch, 0, cols, stream, false);
        return;
    }
    const int splits = ceil_div(rows, kColumnReduceRowsPerSplit);
    LLMC_CHECK(splits <= 65535, "column_reduce: too many rows");
    const int vec = column_reduce_vec(cols, f);
    const dim3 grid(ceil_div(cols, kWarpSize * vec), splits);
    const dim3 block(kWarpSize, kColumnReduceThreadsY);
    if (vec > 1) LLMC_LAUNCH(grid, block, 0, stream, column_reduce_stage1_kernel<NV, x128::size, F>)(
        scratch, rows, cols, f);
    else LLMC_LAUNCH(grid, block, 0, stream, column_reduce_stage1_kernel<NV, 1, F>)(scratch, rows, cols, f);
    CUDA_CHECK_LAUNCH();
    column_reduce_finish<NV>(outs, scratch, splits, cols, stream, accumulate);
}

}  // namespace llmc
