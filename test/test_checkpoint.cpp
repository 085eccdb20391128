// Checkpoint plumbing tests: training-state files round-trip exactly and reject corruption, the COMPLETE
// marker decides which checkpoints count, pruning keeps the newest, atomic writes leave no partial file,
// and a resume with a changed fixed key is refused naming the key.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "llmc/checkpoint.h"
#include "llmc/config.h"
#include "llmc/error.h"
#include "llmc/fileio.h"
#include "test/testing.h"

using namespace llmc;

static const std::string kOut = "build/test-tmp/ckpt";

static TrainingState sample_state() {
    TrainingState s;
    s.step = 1234;
    s.world_size = 4;
    s.rank = 2;
    s.data = {3, 1, 77};
    s.sample_rng = {1, 2, 3, 0xFFFFFFFFFFFFFFFFull};
    s.tokens = 987654321;
    s.cumulative_bytes_sent = 5555;
    s.config_json = R"({"batch_size":4})";
    for (int i = 0; i < 1000; i++) s.optimizer_state.push_back(static_cast<std::byte>(i * 7));
    return s;
}

TEST(state_round_trip) {
    std::system(("rm -rf " + kOut + " && mkdir -p " + kOut).c_str());
    const TrainingState s = sample_state();
    const std::string path = kOut + "/state.bin";
    write_training_state(path, s);
    EXPECT(!file_exists(path + ".tmp"));
    const TrainingState r = read_training_state(path);
    EXPECT_EQ(r.step, s.step);
    EXPECT_EQ(r.world_size, s.world_size);
    EXPECT_EQ(r.rank, s.rank);
    EXPECT(r.data == s.data);
    EXPECT(r.sample_rng == s.sample_rng);
    EXPECT_EQ(r.tokens, s.tokens);
    EXPECT_EQ(r.cumulative_bytes_sent, s.cumulative_bytes_sent);
    EXPECT_EQ(r.config_json, s.config_json);
    EXPECT(r.optimizer_state == s.optimizer_state);
}

TEST(corrupt_state_files_are_named) {
    const std::string path = kOut + "/state.bin";
    std::vector<std::byte> bytes = read_whole_file(path);
    const std::string truncated = kOut + "/truncated.bin";
    write_file_atomic(truncated, std::span(bytes.data(), bytes.size() - 10));
    EXPECT_ERROR(read_training_state(truncated), truncated + ": corrupt or truncated");
    const std::string bad = kOut + "/bad.bin";
    bytes[0] = std::byte{0};
    write_file_atomic(bad, bytes);
    EXPECT_ERROR(read_training_state(bad), bad + ": bad magic");
    EXPECT_ERROR(read_training_state(kOut + "/missing.bin"), "missing.bin: cannot open");
}

TEST(atomic_file_removed_without_commit) {
    const std::string path = kOut + "/never.bin";
    {
        AtomicFile f(path);
        f.write("abc", 3);
        EXPECT(file_exists(path + ".tmp"));
    }
    EXPECT(!file_exists(path + ".tmp"));
    EXPECT(!file_exists(path));
}

TEST(only_complete_checkpoints_count_and_prune_keeps_newest) {
    std::system(("rm -rf " + kOut + " && mkdir -p " + kOut).c_str());
    EXPECT(!find_latest_checkpoint(kOut).has_value());
    for (int step : {10, 20, 30}) {
        const std::string dir = checkpoint_dir(kOut, step);
        make_dirs(dir);
        mark_checkpoint_complete({dir, step, 2, "demo"});
    }
    make_dirs(checkpoint_dir(kOut, 40));  // died while saving: no marker
    auto latest = find_latest_checkpoint(kOut);
    EXPECT(latest.has_value());
    EXPECT_EQ(latest->step, int64_t{30});
    EXPECT_EQ(latest->world_size, 2);
    EXPECT_EQ(latest->optimizer, std::string("demo"));
    EXPECT_ERROR(read_checkpoint_info(checkpoint_dir(kOut, 40)), "incomplete checkpoint");
    EXPECT_ERROR(read_checkpoint_info(kOut + "/checkpoints/nope"), "does not exist");
    prune_checkpoints(kOut, 2);
    EXPECT(!file_exists(checkpoint_dir(kOut, 10)));
    EXPECT(file_exists(checkpoint_dir(kOut, 20)));
    EXPECT(file_exists(checkpoint_dir(kOut, 30)));
    EXPECT(file_exists(checkpoint_dir(kOut, 40)));  // incomplete ones are not counted or touched
}

TEST(resume_refuses_changed_fixed_keys) {
    TrainConfig a, b;
    b.batch_size = 8;
    EXPECT_ERROR(check_resume_compatible("ck/state_rank0.bin", config_to_json(a), config_to_json(b)),
                 "ck/state_rank0.bin: --batch_size is 8 here but 4 in the checkpoint");
    TrainConfig c;
    c.steps = 5000;  // extending a run is allowed
    c.lr = 1e-3f;
    check_resume_compatible("x", config_to_json(a), config_to_json(c));
}

TEST_MAIN()
