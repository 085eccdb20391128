// Checks of the emulated device's stream orders (LLMC_EMU_STREAMS, emu/runtime.cpp), on which the
// emulated trainer runs are checked for missing stream dependencies. Two non-blocking streams and small device
// buffers: a read on one stream and a write on the other, with no dependency between them, must come out both ways
// across the orders (lazy: the waited stream's work first; eager: the other stream's first; first_ahead /
// last_ahead: the earlier / later stream's first; shuffled: either, by seed), since that is what a GPU may do;
// with an event dependency they must come out the one way it allows in every order. Queries (cudaEventQuery)
// find queued work done or not as each order says. And the emulated NCCL (emu/nccl.cpp) stops a run
// whose collective's input is written by another stream that does not wait for the collective, in the orders
// where the write runs first, and not when the write waits.
#include <cuda_runtime.h>
#include <nccl.h>

#include <set>
#include <string>
#include <vector>

#include "emu/streams.h"
#include "test/support/testing.h"

namespace {

struct Device {
    cudaStream_t a = nullptr, b = nullptr;
    float* x = nullptr;
    float* y = nullptr;
    cudaEvent_t event = nullptr;
    Device() {
        EXPECT(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
        EXPECT(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
        EXPECT(cudaMalloc(&x, sizeof(float)) == cudaSuccess);
        EXPECT(cudaMalloc(&y, sizeof(float)) == cudaSuccess);
        EXPECT(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
        set(x, 1.0f);
        set(y, -1.0f);
    }
    ~Device() {
        (void)cudaEventDestroy(event);
        (void)cudaFree(x);
        (void)cudaFree(y);
        (void)cudaStreamDestroy(a);
        (void)cudaStreamDestroy(b);
    }
    // b's later work waits for a's work so far (an event)
    void b_waits_for_a() {
        EXPECT(cudaEventRecord(event, a) == cudaSuccess);
        EXPECT(cudaStreamWaitEvent(b, event, 0) == cudaSuccess);
    }
    static void set(float* p, float v) { EXPECT(cudaMemcpy(p, &v, sizeof v, cudaMemcpyHostToDevice) == cudaSuccess); }
    float get(const float* p) {
        float v = 0.0f;
        EXPECT(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost) == cudaSuccess);
        return v;
    }
};

// Stream a copies x (1) into y; stream b clears x; the host waits for b, then a. Without `ordered`, nothing
// orders the two: y is 1 if a's copy ran first, 0 if b's clear did. With it, b waits for an event behind a's copy.
float write_after_read(const std::string& order, bool ordered) {
    EXPECT(emu::set_stream_order(order));
    Device d;
    EXPECT(cudaMemcpyAsync(d.y, d.x, sizeof(float), cudaMemcpyDeviceToDevice, d.a) == cudaSuccess);
    if (ordered) d.b_waits_for_a();
    EXPECT(cudaMemsetAsync(d.x, 0, sizeof(float), d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.a) == cudaSuccess);
    return d.get(d.y);
}

// Stream a clears x; stream b copies x into y; the host waits for b, then a. y is 0 if the clear ran first, 1 if
// not; with `ordered`, b's copy waits for an event behind the clear.
float read_after_write(const std::string& order, bool ordered) {
    EXPECT(emu::set_stream_order(order));
    Device d;
    EXPECT(cudaMemsetAsync(d.x, 0, sizeof(float), d.a) == cudaSuccess);
    if (ordered) d.b_waits_for_a();
    EXPECT(cudaMemcpyAsync(d.y, d.x, sizeof(float), cudaMemcpyDeviceToDevice, d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.a) == cudaSuccess);
    return d.get(d.y);
}

const std::vector<std::string> kOrders = {"lazy", "eager", "first_ahead", "last_ahead"};
const std::vector<std::string> kShuffledSeeds = {"shuffled", "shuffled:1", "shuffled:2", "shuffled:3", "shuffled:4",
                                                 "shuffled:5", "shuffled:6", "shuffled:7", "shuffled:8", "shuffled:9"};

TEST(orders_parse) {
    for (const char* good : {"lazy", "eager", "first_ahead", "last_ahead", "shuffled", "shuffled:0", "shuffled:123456789", ""})
        EXPECT(emu::set_stream_order(good));
    for (const char* bad : {"Lazy", "random", "shuffled:", "shuffled:x", "shuffled:-1", "eager:1"})
        EXPECT(!emu::set_stream_order(bad));
    EXPECT(emu::set_stream_order("lazy"));
}

TEST(unordered_write_after_read_comes_out_both_ways) {
    EXPECT_EQ(write_after_read("lazy", false), 0.0f);  // b waited for first: its clear ran before a's copy
    EXPECT_EQ(write_after_read("eager", false), 1.0f);  // a ran ahead at the wait for b
    EXPECT_EQ(write_after_read("first_ahead", false), 1.0f);  // a, created first, ran ahead of b
    EXPECT_EQ(write_after_read("last_ahead", false), 0.0f);   // b ran ahead of a: a's copy waited for its own wait
    std::set<float> seen;
    for (const std::string& seed : kShuffledSeeds) seen.insert(write_after_read(seed, false));
    EXPECT(seen == std::set<float>({0.0f, 1.0f}));
}

TEST(unordered_read_after_write_comes_out_both_ways) {
    EXPECT_EQ(read_after_write("lazy", false), 1.0f);  // b's copy ran before a's clear
    EXPECT_EQ(read_after_write("eager", false), 0.0f);
    EXPECT_EQ(read_after_write("first_ahead", false), 0.0f);
    EXPECT_EQ(read_after_write("last_ahead", false), 1.0f);
    std::set<float> seen;
    for (const std::string& seed : kShuffledSeeds) seen.insert(read_after_write(seed, false));
    EXPECT(seen == std::set<float>({0.0f, 1.0f}));
}

TEST(event_dependencies_hold_in_every_order) {
    std::vector<std::string> orders = kOrders;
    orders.insert(orders.end(), kShuffledSeeds.begin(), kShuffledSeeds.end());
    for (const std::string& order : orders) {
        EXPECT_EQ(write_after_read(order, true), 1.0f);
        EXPECT_EQ(read_after_write(order, true), 0.0f);
    }
}

// A query runs nothing in the lazy order (the work has not run: not ready), everything it asks about in the eager
// one, and some of it or all in the shuffled one, so repeated queries see it finish.
TEST(queries_follow_the_order) {
    for (const std::string order : {"lazy", "eager", "shuffled:3"}) {
        EXPECT(emu::set_stream_order(order));
        Device d;
        for (int i = 0; i < 8; i++) EXPECT(cudaMemsetAsync(d.x, 0, sizeof(float), d.a) == cudaSuccess);
        EXPECT(cudaEventRecord(d.event, d.a) == cudaSuccess);
        int queries = 0;
        cudaError_t status = cudaErrorNotReady;
        while (queries < 100 && (status = cudaEventQuery(d.event)) == cudaErrorNotReady) queries++;
        if (order == "lazy") EXPECT(status == cudaErrorNotReady);
        if (order == "eager") EXPECT(status == cudaSuccess && queries == 0);
        if (order == "shuffled:3") EXPECT(status == cudaSuccess);
        EXPECT(cudaStreamSynchronize(d.a) == cudaSuccess);
        EXPECT(cudaEventQuery(d.event) == cudaSuccess);
    }
    // both streams with work queued: a stream ahead of the queried one, with work left, holds it back
    for (const std::string order : {"first_ahead", "last_ahead"}) {
        EXPECT(emu::set_stream_order(order));
        Device d;
        EXPECT(cudaMemsetAsync(d.y, 0, sizeof(float), d.b) == cudaSuccess);
        EXPECT(cudaMemsetAsync(d.x, 0, sizeof(float), d.a) == cudaSuccess);
        EXPECT(cudaEventRecord(d.event, d.a) == cudaSuccess);
        EXPECT(cudaEventQuery(d.event) == (order == "first_ahead" ? cudaSuccess : cudaErrorNotReady));
        EXPECT(cudaStreamSynchronize(d.a) == cudaSuccess);
        EXPECT(cudaStreamSynchronize(d.b) == cudaSuccess);
    }
    EXPECT(emu::set_stream_order("lazy"));
}

// Stream a all-reduces x (a world of one: the emulated NCCL reads x at the call and delivers at a's turn); stream b
// clears x, after an event behind the all-reduce if `ordered`; the host waits for b, then a.
void collective_then_write(const std::string& order, bool ordered) {
    EXPECT(emu::set_stream_order(order));
    Device d;
    ncclComm_t comm = nullptr;
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id) == ncclSuccess);
    EXPECT(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    EXPECT(ncclAllReduce(d.x, d.x, 1, ncclFloat32, ncclSum, comm, d.a) == ncclSuccess);
    if (ordered) d.b_waits_for_a();
    EXPECT(cudaMemsetAsync(d.x, 0, sizeof(float), d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.b) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(d.a) == cudaSuccess);
    EXPECT(ncclCommDestroy(comm) == ncclSuccess);
}

TEST(a_write_racing_a_collective_stops_the_run) {
    const char* message = "emulated NCCL: the input of a ncclAllReduce was written before the collective's end";
    // the clear runs before the delivery where b runs first or a lags: lazy (b waited for first) and last_ahead
    EXPECT_EXITS(collective_then_write("lazy", false), 3, message);
    EXPECT_EXITS(collective_then_write("last_ahead", false), 3, message);
    collective_then_write("eager", false);  // the delivery ran first: nothing to see in this order
    for (const std::string& order : kOrders) collective_then_write(order, true);
    for (const std::string& seed : kShuffledSeeds) collective_then_write(seed, true);
    EXPECT(emu::set_stream_order("lazy"));
}

}  // namespace

TEST_MAIN()
