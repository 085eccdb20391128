// The collective watchdog (llmc/comm/watchdog.h) and its hook in the Transport interface: a collective that
// finishes within --comm_timeout leaves the process alone however long the run lasts between collectives; one
// that does not ends the process with status 1 and a one-line message naming the rank, the collective and the
// limit; 0 turns it off; a world of one starts no watchdog. Each case runs in a forked child, since the
// outcome under test is the end of a process.
#include <chrono>
#include <thread>

#include "llmc/comm/transport.h"
#include "llmc/comm/watchdog.h"
#include "test/support/testing.h"

namespace {

using namespace std::chrono_literals;

void sleep_for_seconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// A two-rank transport whose scalar all-reduce takes `wait` seconds inside a watched scope, as a real one
// does while a peer is late.
class SlowTransport final : public llmc::Transport {
public:
    explicit SlowTransport(double wait, int world = 2) : wait_(wait), world_(world) {}
    std::string_view name() const override { return "slow"; }
    int rank() const override { return 1; }
    int world_size() const override { return world_; }
    void allreduce_mean(std::span<float>) override {}
    void allgather_bytes(std::span<const std::byte>, std::vector<std::byte>&, std::vector<size_t>&, llmc::GatherSizes) override {}
    void allreduce_sum(std::span<double>) override {
        const auto watched = watch("the slow all-reduce");
        sleep_for_seconds(wait_);
    }
    void allreduce_max(std::span<double>) override {}
    void allreduce_or(std::span<uint64_t>) override {}
    void broadcast(std::span<std::byte>, int) override {}
    void barrier() override {}
    [[noreturn]] void abort(int code) override { std::_Exit(code); }

private:
    double wait_;
    int world_;
};

TEST(collectives_within_the_limit_leave_the_process_alone) {
    const testing::ChildOutcome c = testing::run_in_child([] {
        // (margins of 0.7 s against the 1 s limit, so a loaded machine's late wake-ups cannot fail this)
        llmc::CollectiveWatchdog dog(1.0, 0);
        for (int i = 0; i < 4; i++) {  // 4 x 0.3 s watched: longer than the limit in total, never in one scope
            const auto s = dog.watch("a short collective");
            sleep_for_seconds(0.3);
        }
        sleep_for_seconds(1.5);  // unwatched time (compute between collectives) never counts
        {
            const auto outer = dog.watch("outer");
            const auto inner = dog.watch("inner");  // nested: the outer scope is the one timed
        }
        sleep_for_seconds(1.2);
    });
    EXPECT(c.ok && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    EXPECT_EQ(c.stderr_text, std::string());
}

TEST(a_hung_collective_ends_the_process_with_a_message) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EXITS(
        {
            llmc::CollectiveWatchdog dog(0.25, 3);
            const auto s = dog.watch("MPI all-reduce of the gradients");
            sleep_for_seconds(10);
        },
        1, "error (rank 3): MPI all-reduce of the gradients did not complete within 0.25 s (--comm_timeout)");
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  the watchdog ended the child after %.2f s (limit 0.25 s)\n", took);
    EXPECT(took < 3.0);
}

TEST(transport_hook) {
    // set_collective_timeout arms the backends' watch() scopes ...
    EXPECT_EXITS(
        {
            SlowTransport t(10.0);
            t.set_collective_timeout(0.2);
            std::vector<double> v(1);
            t.allreduce_sum(v);
        },
        1, "error (rank 1): the slow all-reduce did not complete within 0.2 s");
    // ... 0 waits forever, and a world of one has no watchdog
    for (auto [timeout, world] : {std::pair{0.0, 2}, std::pair{0.2, 1}}) {
        const testing::ChildOutcome c = testing::run_in_child([timeout, world] {
            SlowTransport t(0.8, world);
            t.set_collective_timeout(timeout);
            std::vector<double> v(1);
            t.allreduce_sum(v);
        });
        EXPECT(c.ok && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    }
    SlowTransport t(0.0);
    t.set_collective_timeout(5.0);
    EXPECT_EQ(t.collective_timeout(), 5.0);
}

}  // namespace

TEST_MAIN()
