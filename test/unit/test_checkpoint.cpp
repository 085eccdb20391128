// Checkpoint plumbing tests: training-state files round-trip exactly (version 1 files still read) and reject
// corruption, blobs written or read in place match put_array / get_array, the COMPLETE marker decides which
// checkpoints count (and must name its directory's step), pruning keeps the newest and clears older incomplete
// directories, a state file must match its marker and rank, paths that are no checkpoint are named as such,
// atomic writes leave no partial file, a resume with a changed fixed key is refused naming the key, NaN and inf
// values are counted in every float array of a state blob, corrupt checkpoints are set aside out of every scan,
// and a locked directory names its holder.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "llmc/run/checkpoint.h"
#include "llmc/run/config.h"
#include "llmc/base/dir_lock.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/dataloader.h"
#include "test/support/testing.h"

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
    s.train_data = {4, 3247141, 0x0123456789abcdefull};
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
    EXPECT(r.train_data == s.train_data);
    EXPECT_EQ(r.config_json, s.config_json);
    EXPECT(r.optimizer_state == s.optimizer_state);
}

// A version-1 file (written before the data fingerprint existed), laid out by hand: read with an unknown
// (all zero) fingerprint, everything else as written.
TEST(version_1_state_still_reads) {
    const TrainingState s = sample_state();
    ByteWriter w;
    w.put(uint32_t{0x4C4C5354});
    w.put(uint32_t{1});
    w.put<int64_t>(s.step);
    w.put<int32_t>(s.world_size);
    w.put<int32_t>(s.rank);
    w.put(s.data);
    w.put(s.sample_rng);
    w.put<int64_t>(s.tokens);
    w.put<int64_t>(s.cumulative_bytes_sent);
    w.put_string(s.config_json);
    w.put_array(std::span<const std::byte>(s.optimizer_state));
    const std::string path = kOut + "/v1.bin";
    write_file_atomic(path, w.bytes());
    const TrainingState r = read_training_state(path);
    EXPECT_EQ(r.step, s.step);
    EXPECT(r.train_data == DataFingerprint{});
    EXPECT_EQ(r.config_json, s.config_json);
    EXPECT(r.optimizer_state == s.optimizer_state);
}

// put_array_space / get_array_space: the blob layout of put_array / get_array, the bytes filled or read in place
// (the GPU optimizers' device copies), a wrong length or a short blob refused before anything is read.
TEST(array_space_matches_put_and_get_array) {
    const std::vector<float> values = {1.5f, -2.25f, 3.0f, 1e-30f, 7.0f};
    ByteWriter plain, in_place;
    plain.put<int32_t>(9);
    plain.put_array(std::span<const float>(values));
    in_place.put<int32_t>(9);
    std::byte* slot = in_place.put_array_space<float>(values.size());
    std::memcpy(slot, values.data(), values.size() * sizeof(float));
    EXPECT(plain.bytes() == in_place.bytes());

    ByteReader reader(plain.bytes(), "blob.bin");
    EXPECT_EQ(reader.get<int32_t>("tag"), 9);
    const std::byte* at = reader.get_array_space<float>(values.size(), "values");
    std::vector<float> back(values.size());
    std::memcpy(back.data(), at, back.size() * sizeof(float));
    EXPECT(back == values);
    EXPECT(reader.at_end());

    ByteReader wrong_length(plain.bytes(), "blob.bin");
    wrong_length.get<int32_t>("tag");
    EXPECT_ERROR(wrong_length.get_array_space<float>(4, "values"), "blob.bin: values has 5 elements, expected 4");
    const std::span<const std::byte> cut = std::span<const std::byte>(plain.bytes()).first(plain.bytes().size() - 1);
    ByteReader truncated(cut, "blob.bin");
    truncated.get<int32_t>("tag");
    EXPECT_ERROR(truncated.get_array_space<float>(5, "values"), "blob.bin: corrupt or truncated (values)");
}

TEST(state_must_match_its_marker_and_rank) {
    TrainingState s = sample_state();  // step 1234, rank 2 of 4
    const CheckpointInfo ck{"ck", 1234, 4, "demo", {}};
    check_state_matches_checkpoint("ck/state_rank2.bin", s, ck, 2);
    EXPECT_ERROR(check_state_matches_checkpoint("ck/state_rank1.bin", s, ck, 1),
                 "ck/state_rank1.bin: holds rank 2 of 4 but should hold rank 1 of 4");
    EXPECT_ERROR(check_state_matches_checkpoint("ck/state_rank2.bin", s, {"ck", 1000, 4, "demo", {}}, 2),
                 "ck/state_rank2.bin: holds step 1234 but its checkpoint's marker says 1000");
    s.world_size = 2;
    EXPECT_ERROR(check_state_matches_checkpoint("ck/state_rank2.bin", s, ck, 2), "holds rank 2 of 2");
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
        mark_checkpoint_complete({dir, step, 2, "demo", {}});
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
    EXPECT(file_exists(checkpoint_dir(kOut, 40)));  // incomplete and newer than the newest: not touched
    make_dirs(checkpoint_dir(kOut, 25));               // incomplete and older: a crash's leftover, deleted
    prune_checkpoints(kOut, 0);
    EXPECT(!file_exists(checkpoint_dir(kOut, 25)));
    EXPECT(file_exists(checkpoint_dir(kOut, 20)));     // keep 0 keeps every complete one
    EXPECT(file_exists(checkpoint_dir(kOut, 40)));
    unmark_checkpoint(checkpoint_dir(kOut, 30));       // saving over step 30: incomplete until marked again
    const auto after_unmark = find_latest_checkpoint(kOut);
    EXPECT(after_unmark && after_unmark->step == 20);
    unmark_checkpoint(checkpoint_dir(kOut, 30));       // no marker: nothing to do
    EXPECT_EQ(remove_checkpoints_after(kOut, 20), 2);  // 30 and 40
    EXPECT(file_exists(checkpoint_dir(kOut, 20)) && !file_exists(checkpoint_dir(kOut, 30)) &&
           !file_exists(checkpoint_dir(kOut, 40)));
}

TEST(markers_that_cannot_be_used_are_skipped_and_named) {
    std::system(("rm -rf " + kOut + " && mkdir -p " + kOut).c_str());
    for (int step : {5, 10, 15}) {
        make_dirs(checkpoint_dir(kOut, step));
        mark_checkpoint_complete({checkpoint_dir(kOut, step), step, 1, "adamw", {}});
    }
    auto write_text = [](const std::string& path, const std::string& text) {
        write_file_atomic(path, std::as_bytes(std::span(text.data(), text.size())));
    };
    const std::string wrong_step = checkpoint_dir(kOut, 15) + "/COMPLETE";
    write_text(wrong_step, R"({"step":99,"world_size":1,"optimizer":"adamw"})");
    const std::string typed = checkpoint_dir(kOut, 10) + "/COMPLETE";
    write_text(typed, R"({"step":"10","world_size":1,"optimizer":"adamw"})");
    std::vector<std::string> skipped;
    const auto latest = find_latest_checkpoint(kOut, &skipped);
    EXPECT(latest && latest->step == 5);
    EXPECT_EQ(skipped.size(), size_t{2});
    const std::string both = skipped.size() == 2 ? skipped[0] + "\n" + skipped[1] : "";
    EXPECT(both.find(wrong_step + ": says step 99") != std::string::npos);
    EXPECT(both.find(typed + ": malformed checkpoint marker") != std::string::npos);
    EXPECT_ERROR(read_checkpoint_info(checkpoint_dir(kOut, 10)), typed + ": malformed checkpoint marker");
    EXPECT_ERROR(read_checkpoint_info(kOut), kOut + ": an out_dir, not a checkpoint directory");
    EXPECT_ERROR(read_checkpoint_info(wrong_step), wrong_step + ": not a checkpoint directory (a file");
}

TEST(resume_refuses_changed_fixed_keys) {
    TrainConfig a, b;
    b.batch_size = 8;
    EXPECT_ERROR(check_resume_compatible("ck/state_rank0.bin", config_to_json(a), config_to_json(b)),
                 "ck/state_rank0.bin: batch_size is 8 here (the default) but 4 in the checkpoint");
    // where this run's value came from
    b.sources.set_by_flag("batch_size", "--batch-size");
    const auto origin = [&](const std::string& key) { return b.sources.origin(key); };
    EXPECT_ERROR(check_resume_compatible("ck/state_rank0.bin", config_to_json(a), config_to_json(b), origin),
                 "ck/state_rank0.bin: batch_size is 8 here (--batch-size) but 4 in the checkpoint");
    b.sources.set_by_file("batch_size", "configs/x.json");
    EXPECT_ERROR(check_resume_compatible("ck/state_rank0.bin", config_to_json(a), config_to_json(b), origin),
                 "ck/state_rank0.bin: batch_size is 8 here (configs/x.json) but 4 in the checkpoint");
    TrainConfig c;
    c.steps = 5000;  // extending a run is allowed
    c.lr = 1e-3f;
    check_resume_compatible("x", config_to_json(a), config_to_json(c));
}

TEST(non_finite_floats_are_counted_in_every_float_array) {
    // the oracle: a plain loop over the values that went in
    std::vector<float> a = testing::random_normal(100003, 7, 1.0), b = testing::random_normal(777, 8, 1.0);
    a[0] = NAN, a[5000] = INFINITY, a[100002] = -INFINITY, b[3] = NAN;
    const std::vector<double> ints = {NAN, INFINITY};  // not float arrays: not counted
    ByteWriter w;
    w.put<uint8_t>(1);  // the arrays' bytes start unaligned
    w.put_array(std::span<const float>(a));
    w.put_array(std::span<const double>(ints));
    std::byte* slot = w.put_array_space<float>(b.size());
    std::memcpy(slot, b.data(), b.size() * sizeof(float));
    size_t expected = 0;
    for (const float x : a) expected += !std::isfinite(x);
    for (const float x : b) expected += !std::isfinite(x);
    EXPECT_EQ(expected, size_t{4});
    EXPECT_EQ(w.non_finite_floats(), expected);
    EXPECT_EQ(count_non_finite(a), size_t{3});
    EXPECT_EQ(count_non_finite(std::span<const float>(a).subspan(1, 4999)), size_t{0});
    b[3] = 1.0f;  // put_array_space arrays are scanned as they are now, after the caller filled them
    std::memcpy(slot, b.data(), b.size() * sizeof(float));
    EXPECT_EQ(w.non_finite_floats(), size_t{3});
}

TEST(corrupt_checkpoints_are_set_aside_out_of_every_scan) {
    std::system(("rm -rf " + kOut + " && mkdir -p " + kOut).c_str());
    for (int step : {10, 20}) {
        const std::string dir = checkpoint_dir(kOut, step);
        make_dirs(dir);
        mark_checkpoint_complete({dir, step, 1, "adamw", {}});
    }
    const std::string aside = set_aside_checkpoint(checkpoint_dir(kOut, 20));
    EXPECT_EQ(aside, checkpoint_dir(kOut, 20) + ".corrupt");
    EXPECT(file_exists(aside + "/COMPLETE") && !file_exists(checkpoint_dir(kOut, 20)));
    make_dirs(checkpoint_dir(kOut, 20));
    EXPECT_EQ(set_aside_checkpoint(checkpoint_dir(kOut, 20)), checkpoint_dir(kOut, 20) + ".corrupt.2");
    // set-aside directories are no checkpoints: not found, not pruned, not removed by --overwrite
    std::vector<std::string> skipped;
    const std::vector<CheckpointInfo> left = find_checkpoints(kOut, &skipped);
    EXPECT(left.size() == 1 && left[0].step == 10 && skipped.empty());
    prune_checkpoints(kOut, 1);
    EXPECT_EQ(remove_checkpoints_after(kOut, 0), 1);
    EXPECT(file_exists(aside + "/COMPLETE") && file_exists(checkpoint_dir(kOut, 20) + ".corrupt.2"));
}

TEST(a_locked_directory_names_its_holder) {
    const std::string dir = kOut + "/locked";
    std::system(("rm -rf " + dir).c_str());
    {
        const DirectoryLock lock(dir);  // creates the directory
        EXPECT(is_directory(dir));
        // another process (flock locks are per open file: a second open in this process would conflict too)
        const auto lock_again = [&] {
            try {
                const DirectoryLock again(dir);
            } catch (const Error& e) {
                std::fprintf(stderr, "%s\n", e.what());
                std::exit(1);
            }
            std::exit(0);
        };
        EXPECT_EXITS(lock_again(), 1, dir + ": in use by another run (pid " + std::to_string(getpid()) + " on host ");
    }
    const DirectoryLock after(dir);  // released with its holder
}

TEST_MAIN()
