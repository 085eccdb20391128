// Large host arrays (parameters, gradients, optimizer state, activations) on transparent huge pages. Where the
// kernel lends huge pages on request only (transparent_hugepage=madvise, Debian's default), an ordinary
// allocation is faulted in 4 KiB at a time on first touch: GPT-2 124M's weights, gradients and AdamW moments
// alone (2 GB) are 490,000 faults, and a TLB entry per 4 KiB during every pass over them. Allocations of
// 2 MiB or more here are 2 MiB aligned and advised (MADV_HUGEPAGE); smaller ones are plain 64-byte aligned.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#include <sys/mman.h>

namespace llmc {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` bytes (uninitialized), 64-byte aligned, on huge pages when large; release with std::free. nullptr when
// the memory is not there.
inline void* allocate_large(size_t bytes) {
    if (bytes < kHugePageBytes) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without huge pages it is plain memory
#endif
    return p;
}

struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
};

// The allocator of LargeVector: allocate_large for a std::vector.
template <class T>
struct LargeAllocator {
    using value_type = T;
    LargeAllocator() = default;
    template <class U>
    LargeAllocator(const LargeAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        if (n > size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
        void* p = allocate_large(n * sizeof(T));
        if (!p) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) noexcept { std::free(p); }
    friend bool operator==(const LargeAllocator&, const LargeAllocator&) { return true; }
};
template <class T>
using LargeVector = std::vector<T, LargeAllocator<T>>;

}  // namespace llmc
