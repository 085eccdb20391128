// VirtualRanks (llmc/comm/transport_virtual.h) over a world of one process: V lanes in threads against reference
// arithmetic written out here (the MPI transport's: sums in rank order, then times 1/W; bf16 rounding of each value
// and of every partial sum), the all-gather's offsets and bytes, a broadcast from a lane other than 0, the ring byte
// counts of a W-rank world, and an abort that wakes the lanes waiting for a lane that is gone.
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "llmc/base/kernel_math.h"
#include "llmc/comm/transport_virtual.h"
#include "test/support/testing.h"

namespace {

using llmc::Transport;
using llmc::VirtualRanks;

// body(v, endpoint) on each of V lanes at once.
void on_lanes(VirtualRanks& group, const std::function<void(int, Transport&)>& body) {
    std::vector<std::thread> lanes;
    for (int v = 0; v < group.lanes(); v++) lanes.emplace_back([&, v] { body(v, group.lane(v)); });
    for (std::thread& t : lanes) t.join();
}

constexpr int V = 3;
constexpr size_t N = 1000;

TEST(means_sum_in_rank_order) {
    llmc::LocalTransport real;
    VirtualRanks group(real, V);
    std::vector<std::vector<float>> in, fp32(V), bf16(V);
    for (int v = 0; v < V; v++) in.push_back(testing::random_normal(N, 10 + static_cast<uint64_t>(v), 1.0));
    on_lanes(group, [&](int v, Transport& t) {
        EXPECT_EQ(t.rank(), v);
        EXPECT_EQ(t.world_size(), V);
        fp32[v] = in[v];
        t.allreduce_mean(fp32[v]);
        bf16[v] = in[v];
        t.allreduce_mean_bf16(bf16[v]);
    });
    namespace km = llmc::km;
    const float inv = 1.0f / static_cast<float>(V);
    bool fp32_ok = true, bf16_ok = true;
    for (size_t i = 0; i < N; i++) {
        float s = in[0][i];
        uint16_t b = km::bf16_bits_rne(in[0][i]);
        for (int r = 1; r < V; r++) {
            s = s + in[r][i];
            b = km::bf16_bits_rne(km::bf16_bits_to_float(b) + km::bf16_bits_to_float(km::bf16_bits_rne(in[r][i])));
        }
        for (int v = 0; v < V; v++) {
            fp32_ok = fp32_ok && fp32[v][i] == s * inv;
            bf16_ok = bf16_ok && bf16[v][i] == km::bf16_bits_to_float(b) * inv;
        }
    }
    EXPECT(fp32_ok);
    EXPECT(bf16_ok);
    // each lane counts a rank of a 3-rank ring: 2 (W-1)/W of the buffer each way
    const llmc::CommCounters c = group.lane(1).counters();
    EXPECT_EQ(c.bytes_sent, 2 * 2 * N * 4 / 3 + 2 * 2 * N * 2 / 3);
    EXPECT_EQ(c.payload_bytes, N * 4 + N * 2);
}

TEST(gather_broadcast_and_small_reductions) {
    llmc::LocalTransport real;
    VirtualRanks group(real, V);
    std::vector<std::vector<std::byte>> all(V);
    std::vector<std::vector<size_t>> offsets(V);
    std::vector<std::vector<std::byte>> bcast(V, std::vector<std::byte>(5));
    std::vector<double> sums(V), maxes(V);
    on_lanes(group, [&](int v, Transport& t) {
        std::vector<std::byte> mine(static_cast<size_t>(v) + 1, std::byte(v + 1));  // lane v: v + 1 bytes of v + 1
        t.allgather_bytes(mine, all[v], offsets[v], llmc::GatherSizes::exchange);
        if (v == 2) std::fill(bcast[v].begin(), bcast[v].end(), std::byte(42));
        t.broadcast(bcast[v], 2);
        std::vector<double> x = {0.1 * (v + 1)}, y = {static_cast<double>(v)};
        t.allreduce_sum(x);
        t.allreduce_max(y);
        sums[v] = x[0];
        maxes[v] = y[0];
    });
    const std::vector<size_t> expect_offsets = {0, 1, 3, 6};
    const std::vector<std::byte> expect_all = {std::byte(1), std::byte(2), std::byte(2),
                                               std::byte(3), std::byte(3), std::byte(3)};
    for (int v = 0; v < V; v++) {
        EXPECT(offsets[v] == expect_offsets);
        EXPECT(all[v] == expect_all);
        EXPECT(bcast[v] == std::vector<std::byte>(5, std::byte(42)));
        EXPECT_EQ(sums[v], (0.1 + 0.2) + 0.3);
        EXPECT_EQ(maxes[v], 2.0);
    }
    // ring all-gather of sizes 1, 2, 3 seen from rank 1: receives 6 - 2, sends 6 - 3 (all but its successor's)
    EXPECT_EQ(group.lane(1).counters().bytes_recv, 4u);
    EXPECT_EQ(group.lane(1).counters().bytes_sent, 3u);
}

TEST(an_abort_wakes_the_waiting_lanes) {
    llmc::LocalTransport real;
    VirtualRanks group(real, V);
    std::vector<int> aborted(V, 0);
    on_lanes(group, [&](int v, Transport& t) {
        if (v == 1) {  // a lane that fails before the barrier, as a lane that throws does in trainer_main
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            group.abort();
            return;
        }
        try {
            t.barrier();
        } catch (const llmc::VirtualRanksAborted&) {
            aborted[v] = 1;
        }
    });
    EXPECT_EQ(aborted[0], 1);
    EXPECT_EQ(aborted[2], 1);
    EXPECT_ERROR(group.lane(0).barrier(), "another virtual rank");
}

}  // namespace

TEST_MAIN()
