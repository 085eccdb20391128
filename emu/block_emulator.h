// Runs CUDA kernel code on the CPU, one thread block at a time, so kernels can be tested on machines without
// a GPU (CI): every CUDA thread is a fiber (its own stack) on the calling OS thread, __syncthreads and the warp
// intrinsics (__shfl_*_sync, __ballot_sync, __reduce_*_sync, __syncwarp, mma.sync m16n8k16 bf16, m16n8k8 tf32 and
// ldmatrix, which kernels reach through wrappers that test LLMC_BLOCK_EMULATOR; cp.async copies are deferred to
// the issuing thread's wait, as late as the hardware may perform them, or with cp_async_eager() performed at
// issue, as early as it may) are cooperative barriers, vector
// accesses are checked for the alignment the GPU demands (require_aligned), and
// dynamic shared memory is a host array (EMU_DEFINE_SHARED) that a test should fill with a poison pattern (e.g.
// 0xff bytes: NaN) before every block, as the GPU leaves it undefined (test/emulated/test_demo_kernels_emu.cpp does).
//
// What it proves: the kernel's indexing, its shared-memory protocol and its arithmetic (g++ compiles the same
// source; fp32 operations round as on the GPU except denormals, which the GPU flushes under --use_fast_math).
// What it checks on the way: a barrier reached by only part of the block or of a warp (divergent
// __syncthreads, or warp intrinsics under divergence) is a deadlock and aborts the run with a message; fibers
// run in a configurable order between barriers (forward, reverse, shuffled with a seed, or one warp at a time:
// Order below), so a missing barrier
// shows up as a difference between orders. What it cannot show: speed, and races inside one barrier interval
// that the fixed interleaving hides.
//
// Use: include this header BEFORE the kernel sources (it provides threadIdx, blockIdx, the intrinsics and the
// min/max overloads device code calls), define the dynamic shared memory array the kernels declare with
// EMU_DEFINE_SHARED(ns, name), then emu::run_block(threads, block_index, grid, order, seed, [&] { kernel(args); })
// for each block of a 1-D launch, or run_block(Dim3 block, Dim3 index, Dim3 grid, ...) for 2-D/3-D blocks and
// grids (thread t of the block is x = t % bx, y = t / bx % by, z = t / (bx by), and warps are 32 consecutive t,
// as on the GPU). Static `__shared__` variables declared inside kernels become one object for the whole block
// (`__shared__` is redefined below), filled with 0xff bytes before every block as a test should fill the
// dynamic array.
// Whole grids: emu::run_grid runs every block of a grid (dynamic shared memory poisoned before each block).
// Whole programs: host code launches through LLMC_LAUNCH (llmc/cuda/cuda_common.cuh), which here becomes emu::launch
// below (the grid queued on its stream, emu_streams.h). With emu/runtime.cpp, emu_cublas.cpp
// and emu_nccl.cpp standing in for the CUDA runtime, cuBLASLt/cuBLAS and NCCL, train_gpt.cu and the GPU tests
// build with g++ (`-include emu/block_emulator.h`, the Makefile's `emu` target) and run on the CPU.
// Compile with -I/usr/local/cuda/include -Wno-attributes (the __device__-style attributes are ignored by g++).
#pragma once
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "emu/streams.h"

namespace emu {

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};

// Forward / Reverse: every runnable thread runs to its next barrier in each round, in thread order or reversed.
// Shuffled: each round a random subset of the warps that can run (at least one) runs, its threads in random
// order, so warps also drift apart across warp barriers. WarpSerial: only the lowest warp that can run does,
// through its warp barriers, until it waits at __syncthreads or ends. The last two make a warp read what other
// warps were to write before they wrote it when a __syncthreads is missing; in the first two any barrier hides
// that, since all threads reach it in the same round.
enum class Order { Forward, Reverse, Shuffled, WarpSerial };

// Fiber switching. On x86-64 a stack switch that saves only the callee-saved general registers (glibc's
// swapcontext also saves the signal mask: two system calls per switch, ~20x slower); elsewhere ucontext. The FP
// control words (MXCSR, x87) are not switched: no kernel changes them, so every fiber runs with the calling
// thread's, and loading them serializes the pipeline (it was 86% of a switch's time). The symbol is weak: every
// translation unit that includes this header defines it (a program whose emulated kernels live in several files
// links them all).
#if defined(__x86_64__)
extern "C" void emu_switch_stack(void** save_sp, void* load_sp);
asm(R"(
    .text
    .weak emu_switch_stack
    .type emu_switch_stack, @function
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stack, .-emu_switch_stack
    .section .note.GNU-stack,"",@progbits
    .text
)");
struct Context {
    void* sp = nullptr;
};
// A context that starts `entry` (which must never return) on the given stack.
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
    auto* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                    // entry starts with rsp = 8 mod 16, as after a call
    *--sp = reinterpret_cast<uint64_t>(entry);    // "return address" of the first switch
    for (int r = 0; r < 6; r++) *--sp = 0;        // rbp rbx r12 r13 r14 r15
    c.sp = sp;
}
inline void switch_context(Context& from, Context& to) { emu_switch_stack(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// The block being run (one at a time).
struct BlockState {
    enum class Wait { None, Block, Warp, Done };
    // An asynchronous global -> shared copy (cp.async) issued by a thread and not yet performed.
    struct AsyncCopy {
        void* dst;
        const void* src;  // null: zero-fill
        size_t bytes;
    };
    struct Fiber {
        Context ctx;
        Wait wait = Wait::None;
        unsigned warp_exchanges = 0;  // warp-wide exchanges (shuffles, votes, ldmatrix, mma) so far
        std::vector<std::vector<AsyncCopy>> copy_groups;  // committed groups, oldest first
        std::vector<AsyncCopy> open_group;                // issued since the last commit
    };
    int threads = 0;
    std::vector<Fiber> fibers;
    std::vector<Dim3> index;  // threadIdx of each linear thread id
    Context scheduler;
    int current = -1;  // linear thread id of the running fiber
    // The round in progress: the thread order, the position reached in it, and which warps run (run_block)
    const std::vector<int>* sequence = nullptr;
    size_t position = 0;
    const std::vector<char>* runs = nullptr;
    std::function<void()> body;
    // Two buffers per warp, used by alternate exchanges (see next_exchange_buffer)
    uint64_t slots[2][32][32];  // per warp: one 64-bit exchange word per lane
    uint32_t mma[2][32][32][6];  // per warp: each lane's A and B fragment registers of an emulated mma.sync
};

inline BlockState*& active_block() {
    static BlockState* b = nullptr;
    return b;
}
inline Dim3& thread_index() {
    static Dim3 d;
    return d;
}
inline Dim3& block_index() {
    static Dim3 d;
    return d;
}
inline Dim3& block_dim() {
    static Dim3 d;
    return d;
}
inline Dim3& grid_dim() {
    static Dim3 d;
    return d;
}

[[noreturn]] inline void fail(const char* what) {
    const Dim3 b = block_index();
    std::fprintf(stderr, "block emulator: %s (block %u,%u,%u)\n", what, b.x, b.y, b.z);
    std::abort();
}

// The GPU faults on a vector access (8 or 16 bytes: float4, Packed128, cp.async, ldmatrix rows) at an address
// that is not a multiple of its size; x86 does not, so kernels reach such accesses through
// LLMC_REQUIRE_ALIGNED (llmc/cuda/cuda_common.cuh), which calls this under the emulator.
inline void require_aligned(const void* p, size_t bytes, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "misaligned %zu-byte access (%s at address %p): a fault on the GPU", bytes, what, p);
        fail(msg);
    }
}

// The next fiber of the round that can run, made the current one; null (current -1) when the round is over.
inline BlockState::Fiber* next_of_round(BlockState& b) {
    const std::vector<int>& sequence = *b.sequence;
    while (b.position < sequence.size()) {
        const int t = sequence[b.position++];
        BlockState::Fiber& f = b.fibers[size_t(t)];
        if (f.wait != BlockState::Wait::None || !(*b.runs)[size_t(t / 32)]) continue;
        b.current = t;
        thread_index() = b.index[size_t(t)];
        return &f;
    }
    b.current = -1;
    return nullptr;
}
// Leaves the current fiber (its wait already set) for the next one of the round, or for the scheduler when the
// round is over: one switch per barrier a thread reaches, not two through the scheduler.
inline void switch_from(BlockState& b, BlockState::Fiber& from) {
    BlockState::Fiber* next = next_of_round(b);
    switch_context(from.ctx, next ? next->ctx : b.scheduler);
}

// Parks the current fiber at a barrier of the given kind and returns when the scheduler releases it.
inline void wait_at(BlockState::Wait kind) {
    BlockState* b = active_block();
    if (!b || b->current < 0) fail("barrier or warp intrinsic outside emu::run_block");
    BlockState::Fiber& f = b->fibers[size_t(b->current)];
    f.wait = kind;
    switch_from(*b, f);
}

inline void fiber_entry() {
    BlockState* b = active_block();
    b->body();
    BlockState::Fiber& f = b->fibers[size_t(b->current)];
    f.wait = BlockState::Wait::Done;
    switch_from(*b, f);
    fail("a finished thread was resumed");
}

// Static `__shared__` variables live in the linker section emu_static_shared (see the __shared__ definition
// below); the linker brackets it with these symbols (weak: a program without such variables has neither).
extern "C" char __start_emu_static_shared[] __attribute__((weak));
extern "C" char __stop_emu_static_shared[] __attribute__((weak));
// Every static __shared__ variable of the program to 0xff bytes (NaN floats, -1 integers) before each block: the
// GPU leaves shared memory undefined, so a kernel must not read one before writing it.
inline void poison_static_shared() {
    char* const start = __start_emu_static_shared;
    char* const stop = __stop_emu_static_shared;
    if (start && stop > start) std::memset(start, 0xff, size_t(stop - start));
}

// Runs `body` as the thread block `block` (blockIdx) of a grid of `grid` blocks (gridDim), with `dim` threads
// (blockDim; their product a multiple of 32, at most 1024: the kernels here use full warps).
inline void run_block(Dim3 dim, Dim3 block, Dim3 grid, Order order, uint32_t seed, const std::function<void()>& body) {
    const uint64_t count = uint64_t(dim.x) * dim.y * dim.z;
    if (count == 0 || count % 32 != 0 || count > 1024) fail("threads must be a multiple of 32, at most 1024");
    if (block.x >= grid.x || block.y >= grid.y || block.z >= grid.z) fail("block index outside the grid");
    const int threads = int(count);
    BlockState b;
    b.threads = threads;
    b.body = body;
    b.fibers.resize(size_t(threads));
    b.index.reserve(size_t(threads));
    for (unsigned z = 0; z < dim.z; z++)
        for (unsigned y = 0; y < dim.y; y++)
            for (unsigned x = 0; x < dim.x; x++) b.index.push_back(Dim3{x, y, z});
    poison_static_shared();
    active_block() = &b;
    block_index() = block;
    block_dim() = dim;
    grid_dim() = grid;
    // One array of stacks, reused by every block (kernel frames are small). Their stride is 64 KiB plus 5 cache
    // lines: with a power-of-two stride every stack's top would fall in the same cache set, and a switch, which
    // reads the top of the next fiber's stack, would miss every time. Left uninitialized, so only the pages the
    // fibers use are ever faulted in (a few KiB of each 64).
    constexpr size_t kStackBytes = 64 * 1024 + 5 * 64;
    static const std::unique_ptr<char[]> stacks(new char[1024 * kStackBytes]);
    for (int t = 0; t < threads; t++)
        make_context(b.fibers[size_t(t)].ctx, stacks.get() + size_t(t) * kStackBytes, kStackBytes, fiber_entry);
    std::vector<int> sequence(static_cast<size_t>(threads));
    std::iota(sequence.begin(), sequence.end(), 0);
    if (order == Order::Reverse) std::reverse(sequence.begin(), sequence.end());
    std::mt19937 rng(seed ^ ((block.x + grid.x * (block.y + grid.y * block.z)) * 2654435761u));
    using Wait = BlockState::Wait;
    // which warps run this round (all but for WarpSerial and Shuffled)
    std::vector<char> runs(size_t(threads / 32), 1);
    for (;;) {
        if (order == Order::Shuffled) std::shuffle(sequence.begin(), sequence.end(), rng);
        bool ran = false;
        if (order == Order::WarpSerial || order == Order::Shuffled) {
            std::vector<int> ready;
            for (int w = 0; w < threads / 32; w++)
                for (int l = 0; l < 32; l++)
                    if (b.fibers[size_t(32 * w + l)].wait == Wait::None) {
                        ready.push_back(w);
                        break;
                    }
            std::fill(runs.begin(), runs.end(), 0);
            if (!ready.empty()) {
                if (order == Order::WarpSerial) {
                    runs[size_t(ready.front())] = 1;
                } else {
                    bool any = false;
                    for (int w : ready) any |= (runs[size_t(w)] = char(rng() & 1)) != 0;
                    if (!any) runs[size_t(ready[rng() % ready.size()])] = 1;
                }
            }
        }
        // the round: each thread that can run, in order, runs to its next barrier and hands over to the next
        // (switch_from); the last one returns here
        b.sequence = &sequence;
        b.runs = &runs;
        b.position = 0;
        if (BlockState::Fiber* first = next_of_round(b)) {
            switch_context(b.scheduler, first->ctx);
            ran = true;
        }
        b.current = -1;
        // release complete barriers
        int done = 0, at_block = 0;
        for (const BlockState::Fiber& f : b.fibers) {
            done += f.wait == Wait::Done;
            at_block += f.wait == Wait::Block;
        }
        if (done == threads) break;
        bool released = false;
        if (at_block == threads) {
            for (BlockState::Fiber& f : b.fibers) f.wait = Wait::None;
            released = true;
        } else {
            for (int w = 0; w < threads / 32; w++) {
                bool all = true;
                for (int l = 0; l < 32; l++) all = all && b.fibers[size_t(32 * w + l)].wait == Wait::Warp;
                if (all) {
                    for (int l = 0; l < 32; l++) b.fibers[size_t(32 * w + l)].wait = Wait::None;
                    released = true;
                }
            }
        }
        if (!ran && !released) {
            if (at_block + done == threads)
                fail("__syncthreads not reached by every thread (some exited or diverged)");
            fail("deadlock: threads wait at different barriers (divergent __syncthreads or warp intrinsic)");
        }
    }
    active_block() = nullptr;
}

// A 1-D block: `threads` threads, blockIdx.x = block of a 1-D grid of `grid` blocks.
inline void run_block(int threads, unsigned block, unsigned grid, Order order, uint32_t seed,
                      const std::function<void()>& body) {
    run_block(Dim3{unsigned(threads), 1, 1}, Dim3{block, 0, 0}, Dim3{grid, 1, 1}, order, seed, body);
}

// Warps are consecutive linear thread ids (threadIdx.x fastest), whatever the block's shape.
inline int lane() { return active_block()->current & 31; }
// A warp-wide exchange publishes each lane's word, waits at one warp barrier, then reads. Successive exchanges
// alternate between two buffers (every lane of a warp makes the same sequence of them), so no second barrier is
// needed before a lane may write again: it writes this buffer next two exchanges on, and the exchange between
// them cannot complete until every lane has finished reading this one.
inline int next_exchange_buffer() {
    BlockState* b = active_block();
    return int(b->fibers[size_t(b->current)].warp_exchanges++ & 1u);
}
inline uint64_t* warp_slots(int buffer) { return active_block()->slots[buffer][active_block()->current >> 5]; }
inline void check_full(unsigned mask) {
    if (mask != 0xffffffffu) fail("only full-warp masks are emulated");
}
template <class T>
uint64_t to_word(T v) {
    static_assert(sizeof(T) <= 8, "exchange words are 64-bit");
    uint64_t w = 0;
    std::memcpy(&w, &v, sizeof(T));
    return w;
}
template <class T>
T from_word(uint64_t w) {
    T v;
    std::memcpy(&v, &w, sizeof(T));
    return v;
}
// Every lane publishes a word, then reads lane src(lane)'s word.
template <class T, class Src>
T exchange(T v, Src src) {
    uint64_t* s = warp_slots(next_exchange_buffer());
    s[lane()] = to_word(v);
    wait_at(BlockState::Wait::Warp);
    return from_word<T>(s[src(lane())]);
}
template <class T, class Op>
T reduce(T v, Op op) {
    uint64_t* s = warp_slots(next_exchange_buffer());
    s[lane()] = to_word(v);
    wait_at(BlockState::Wait::Warp);
    T r = from_word<T>(s[0]);
    for (int l = 1; l < 32; l++) r = op(r, from_word<T>(s[l]));
    return r;
}

// The emulated mma.sync shapes share this: the calling lane publishes its fragment registers (a[0..3], b0, b1)
// to its warp, then adds to its four D elements (D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]; g = lane / 4,
// t = lane % 4) the K products A(w, r, k) * B(w, k, n), which read the warp's registers `w` (w[lane][0..5]).
// The products are exact in double and summed there, then added to d once: the hardware's internal order and
// precision are unspecified, so tests hold results to a tolerance, not to bits.
template <int K, class AOf, class BOf>
inline void warp_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, AOf A, BOf B) {
    BlockState* b = active_block();
    uint32_t(*w)[6] = b->mma[next_exchange_buffer()][b->current >> 5];
    const int me = lane();
    for (int i = 0; i < 4; i++) w[me][i] = a[i];
    w[me][4] = b0;
    w[me][5] = b1;
    wait_at(BlockState::Wait::Warp);
    const int g = me / 4, t = me % 4;
    double sum[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >= 2 ? 8 : 0), n = 2 * t + (i & 1);
        for (int k = 0; k < K; k++) sum[i] += A(w, r, k) * B(w, k, n);
    }
    for (int i = 0; i < 4; i++) d[i] = float(double(d[i]) + sum[i]);
}
inline double float_of_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return double(f);
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling lane: d += A * B, where the warp's 32
// lanes hold A (16 x 16) and B (16 x 8) as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with
// floating point type"): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..][g] (the low half of each register is the lower column / row).
inline void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    auto half = [](uint32_t reg, int hi) { return float_of_bits((hi ? reg >> 16 : reg & 0xffffu) << 16); };
    auto A = [&](uint32_t(*w)[6], int r, int k) {  // the lane and register that hold A[r][k]
        return half(w[(r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k & 1);
    };
    auto B = [&](uint32_t(*w)[6], int k, int n) { return half(w[n * 4 + (k % 8) / 2][k >= 8 ? 5 : 4], k & 1); };
    warp_mma<16>(d, a, b0, b1, A, B);
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the calling lane: d += A * B with A (16 x 8) and B (8 x 8)
// as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k8", .tf32): a[0] = A[g][t], a[1] = A[g+8][t],
// a[2] = A[g][t+4], a[3] = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]. Each operand is an fp32 bit pattern whose
// low 13 bits the tensor cores ignore (masked here).
inline void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    auto tf32 = [](uint32_t reg) { return float_of_bits(reg & 0xffffe000u); };
    auto A = [&](uint32_t(*w)[6], int r, int k) {
        return tf32(w[(r % 8) * 4 + k % 4][(r >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)]);
    };
    auto B = [&](uint32_t(*w)[6], int k, int n) { return tf32(w[n * 4 + k % 4][k >= 4 ? 5 : 4]); };
    warp_mma<8>(d, a, b0, b1, A, B);
}

// cp.async: by default a copy is only recorded when issued and is performed when the issuing thread waits for
// its group (cp.async.wait_group), as late as the hardware may perform it, so a kernel that reads a staged tile
// before waiting for it, or without the barrier that publishes the other threads' copies, reads the poisoned
// shared memory instead. Copies still pending when a thread exits are dropped (the kernel never waited for
// them). With cp_async_eager() set, copies are performed when issued, as early as the hardware may: then a
// kernel that refills a buffer other warps are still reading (a missing barrier before the refill) corrupts
// their reads. Tests run both.
inline bool& cp_async_eager() {
    static bool eager = false;
    return eager;
}
inline BlockState::Fiber& current_fiber() {
    BlockState* b = active_block();
    if (!b || b->current < 0) fail("cp.async outside emu::run_block");
    return b->fibers[size_t(b->current)];
}
inline void perform(const BlockState::AsyncCopy& c) {
    if (c.src) std::memcpy(c.dst, c.src, c.bytes);
    else std::memset(c.dst, 0, c.bytes);
}
inline void cp_async(void* dst, const void* src, size_t bytes, bool valid) {
    require_aligned(dst, bytes, "cp.async shared-memory destination");
    require_aligned(src, bytes, "cp.async global source");  // checked even when !valid: the address is still issued
    const BlockState::AsyncCopy copy{dst, valid ? src : nullptr, bytes};
    BlockState::Fiber& f = current_fiber();
    if (cp_async_eager()) perform(copy);
    else f.open_group.push_back(copy);
}
inline void cp_async_commit() {
    BlockState::Fiber& f = current_fiber();
    f.copy_groups.push_back(std::move(f.open_group));
    f.open_group.clear();
}
// cp.async.wait_group pending: performs all but the newest `pending` committed groups.
inline void cp_async_wait(int pending) {
    BlockState::Fiber& f = current_fiber();
    while (f.copy_groups.size() > size_t(pending)) {
        for (const BlockState::AsyncCopy& c : f.copy_groups.front()) perform(c);
        f.copy_groups.erase(f.copy_groups.begin());
    }
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 for the calling lane: lanes 8i..8i+7 give the addresses of
// rows 0..7 of matrix i (8 consecutive 16-bit elements each); register i of lane l receives, without .trans,
// elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix i, and with .trans (column-major) elements
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4); the first in the low half (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix").
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
    uint64_t* s = warp_slots(next_exchange_buffer());
    const int me = lane();
    require_aligned(row, 16, "ldmatrix row address");
    s[me] = reinterpret_cast<uintptr_t>(row);
    wait_at(BlockState::Wait::Warp);
    auto element = [&](int matrix, int rr, int c) {
        uint16_t v;
        std::memcpy(&v, reinterpret_cast<const uint16_t*>(uintptr_t(s[8 * matrix + rr])) + c, sizeof(v));
        return uint32_t(v);
    };
    const int g = me / 4, t = me % 4;
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = trans ? element(i, 2 * t, g) : element(i, g, 2 * t);
        const uint32_t hi = trans ? element(i, 2 * t + 1, g) : element(i, g, 2 * t + 1);
        r[i] = lo | (hi << 16);
    }
}

// ---- whole launches: LLMC_LAUNCH (llmc/cuda/cuda_common.cuh) ------------------------------------------------------
// Under the emulator LLMC_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...) queues the launch on its
// stream (emu::submit, emu_streams.h; the arguments are copied, as a GPU launch copies them) and, when the
// stream runs, runs every block of the grid one after another, so host code written for the GPU (the kernels'
// host wrappers, the model, the trainer) runs unchanged on the CPU with emu/runtime.cpp as its CUDA
// runtime. A launch the GPU would refuse (an empty grid, too many threads, more dynamic shared memory than the
// kernel was allowed) is refused at once: nothing runs, and cudaGetLastError() reports the error.

// The thread order every launch runs its blocks in (tests may vary it, as for run_block).
struct LaunchSettings {
    Order order = Order::Forward;
    uint32_t seed = 1234;
};
inline LaunchSettings& launch_settings() {
    static LaunchSettings s;
    return s;
}
// The sticky error of the last refused launch (cudaGetLastError returns and clears it).
inline cudaError_t& launch_error() {
    static cudaError_t e = cudaSuccess;
    return e;
}
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), per kernel address; a
// kernel without an entry may take the default 48 KiB.
inline std::vector<std::pair<const void*, size_t>>& dynamic_shared_limits() {
    static std::vector<std::pair<const void*, size_t>> limits;
    return limits;
}
inline size_t dynamic_shared_limit(const void* kernel) {
    for (const auto& [k, bytes] : dynamic_shared_limits())
        if (k == kernel) return bytes;
    return 48 * 1024;
}
// The dynamic shared memory arrays (EMU_DEFINE_SHARED registers each): a launch fills the bytes it asked for
// with 0xff before every block, as the tests do by hand for run_block.
inline std::vector<std::pair<void*, size_t>>& dynamic_shared_arrays() {
    static std::vector<std::pair<void*, size_t>> arrays;
    return arrays;
}
inline bool register_dynamic_shared(void* array, size_t bytes) {
    dynamic_shared_arrays().emplace_back(array, bytes);
    return true;
}

// Every block of a grid, one after another in index order, with the first `shared_bytes` of every registered
// dynamic shared memory array filled with 0xff before each.
inline void run_grid(Dim3 block, Dim3 grid, Order order, uint32_t seed, size_t shared_bytes,
                     const std::function<void()>& body) {
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                for (const auto& [array, bytes] : dynamic_shared_arrays())
                    std::memset(array, 0xff, std::min(bytes, shared_bytes));
                run_block(block, Dim3{x, y, z}, grid, order, seed, body);
            }
}

inline Dim3 launch_dim(const dim3& d) { return Dim3{d.x, d.y, d.z}; }
template <class T>
Dim3 launch_dim(T n) {
    static_assert(std::is_integral_v<T>, "a grid or block size is an integer or a dim3");
    return Dim3{unsigned(n), 1, 1};
}

template <class Kernel>
struct Launch {
    Dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    Kernel* kernel;
    const char* name;

    template <class... Args>
    void operator()(Args... args) const {
        const uint64_t threads = uint64_t(block.x) * block.y * block.z;
        if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || threads == 0 ||
            threads > 1024 || block.z > 64) {
            launch_error() = cudaErrorInvalidConfiguration;
            return;
        }
        if (shared_bytes > dynamic_shared_limit(reinterpret_cast<const void*>(kernel))) {
            launch_error() = cudaErrorInvalidValue;
            return;
        }
        if (threads % 32 != 0) {
            std::fprintf(stderr, "block emulator: %s launched with %llu threads per block; only whole warps are emulated\n",
                         name, static_cast<unsigned long long>(threads));
            std::abort();
        }
        const LaunchSettings settings = launch_settings();
        submit(stream, [launch = *this, settings, args...] {
            run_grid(launch.block, launch.grid, settings.order, settings.seed, launch.shared_bytes,
                     [&] { launch.kernel(args...); });
        });
    }
};

template <class Grid, class Block, class Kernel>
Launch<Kernel> launch(const Grid& grid, const Block& block, size_t shared_bytes, cudaStream_t stream, Kernel* kernel,
                      const char* name) {
    return Launch<Kernel>{launch_dim(grid), launch_dim(block), shared_bytes, stream, kernel, name};
}

}  // namespace emu

// Kernel headers test this to route warp-level matrix instructions (mma.sync) to the emulation above.
#define LLMC_BLOCK_EMULATOR 1

// ---- the CUDA names device code uses ------------------------------------------------------------------------
#define threadIdx (::emu::thread_index())
#define blockIdx (::emu::block_index())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

#define __launch_bounds__(...)

// Shared memory must be one object per block, not one per fiber: a static `__shared__` variable becomes a
// static local (one copy; every fiber runs on the calling OS thread) placed in the section emu_static_shared,
// which run_block poisons before every block. Kernels declare their dynamic array with LLMC_DYNAMIC_SHARED
// (llmc/cuda/cuda_common.cuh), which here is an `extern thread_local` declaration of the array EMU_DEFINE_SHARED
// defines (thread_local because block-scope `extern` cannot be combined with the section attribute).
// The dynamic initializer is needed: g++ 12 calls the TLS init function of a block-scope
// `extern thread_local T a[]` without checking that it exists, and only a dynamic initializer makes it exist.
#undef __shared__
#define __shared__ __attribute__((section("emu_static_shared"))) static
#define EMU_DYNAMIC_SHARED_DECL(type, name) extern thread_local type name[]
namespace emu {
[[gnu::noinline]] inline float4 shared_init() { return float4{0.0f, 0.0f, 0.0f, 0.0f}; }
}  // namespace emu
#define EMU_DEFINE_SHARED(ns, name)                                                                  \
    namespace ns {                                                                                   \
    thread_local float4 name[(228 * 1024) / sizeof(float4)] = {::emu::shared_init()};                \
    [[maybe_unused]] inline const bool name##_emu_registered = ::emu::register_dynamic_shared(name, sizeof(name)); \
    }
#define EMU_SHARED_BYTES (228 * 1024)

inline void __syncthreads() { emu::wait_at(emu::BlockState::Wait::Block); }
// A barrier of the warp (full mask only, as the warp intrinsics).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::check_full(mask);
    emu::wait_at(emu::BlockState::Wait::Warp);
}

template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
    emu::check_full(mask);
    return emu::exchange(v, [delta](int l) { return l >= int(delta) ? l - int(delta) : l; });
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
    emu::check_full(mask);
    return emu::exchange(v, [delta](int l) { return l + int(delta) < 32 ? l + int(delta) : l; });
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    emu::check_full(mask);
    return emu::exchange(v, [lane_mask](int l) { return (l ^ lane_mask) & 31; });
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src) {
    emu::check_full(mask);
    return emu::exchange(v, [src](int) { return src & 31; });
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu::check_full(mask);
    uint64_t* s = emu::warp_slots(emu::next_exchange_buffer());
    s[emu::lane()] = pred ? 1u : 0u;
    emu::wait_at(emu::BlockState::Wait::Warp);
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= unsigned(s[l] & 1u) << l;
    return r;
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
    emu::check_full(mask);
    return emu::reduce(v, [](unsigned a, unsigned b) { return a + b; });
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    emu::check_full(mask);
    return emu::reduce(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
template <class T>
T __ldg(const T* p) {
    return *p;
}
inline void __threadfence() {}
// A product the compiler may not contract into a following addition (-march=native gives g++ FMA, as nvcc's
// default does on the GPU): the call is opaque to the caller.
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
inline void __nanosleep(unsigned) {}
template <class T>
T __ldcg(const T* p) {
    return *p;
}
template <class T>
void __stcg(T* p, T v) {
    *p = v;
}
// One OS thread runs every fiber, so read-modify-write needs no atomicity.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline float atomicAdd(float* p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicOr(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old | v;
    return old;
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = std::min(old, v);
    return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = std::max(old, v);
    return old;
}
template <class T>
T min(T a, T b) {
    return b < a ? b : a;
}
template <class T>
T max(T a, T b) {
    return a < b ? b : a;
}
