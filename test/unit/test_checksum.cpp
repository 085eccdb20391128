// Checkpoint checksum tests: XXH64 agrees with `xxhsum -H64` (the xxHash project's own tool, an independent
// implementation) on files of every length class (empty, under a 32-byte stripe, stripes plus 8-, 4- and 1-byte
// tails, megabytes), whatever pieces the bytes are fed in; an atomic write's digest is its file's; a marker's
// file list round-trips; verify_checkpoint_file names a flipped bit, a truncated or swapped file, a file the
// marker does not list, while a marker from before checksums checks nothing; and a state file read with its
// marker is checked on the bytes that are parsed.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/run/checkpoint.h"
#include "llmc/base/checksum.h"
#include "llmc/base/fileio.h"
#include "llmc/base/rng.h"
#include "test/support/testing.h"

using namespace llmc;

static const std::string kOut = "build/test-tmp/checksum";

// The first word `xxhsum -H64 <path>` prints: the file's XXH64 in hex.
static std::string xxhsum(const std::string& path) {
    FILE* p = popen(("xxhsum -H64 '" + path + "' 2>/dev/null").c_str(), "r");
    char word[64] = {};
    const bool got = p && std::fscanf(p, "%63s", word) == 1;
    if (p) pclose(p);
    return got ? word : "";
}

static std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<unsigned char> v(n);
    for (auto& b : v) b = static_cast<unsigned char>(rng.next_u64() >> 56);
    return v;
}

static void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    write_file_atomic(path, std::as_bytes(std::span(bytes.data(), bytes.size())));
}

TEST(xxh64_matches_xxhsum_for_every_length_class) {
    std::system(("rm -rf " + kOut + " && mkdir -p " + kOut).c_str());
    {
        const std::string probe = kOut + "/probe";
        write_bytes(probe, {1, 2, 3});
        if (xxhsum(probe).empty()) {
            testing::report_failure(__FILE__, __LINE__, "xxhsum not found: install xxhash (scripts/install_deps.sh)");
            return;
        }
    }
    for (size_t n : {0, 1, 3, 4, 7, 8, 12, 31, 32, 33, 40, 63, 64, 95, 100, 1000, (1 << 20) + 13, (9 << 20) + 5}) {
        const std::string path = kOut + "/data_" + std::to_string(n);
        const std::vector<unsigned char> bytes = random_bytes(n, 1000 + n);
        write_bytes(path, bytes);
        const FileDigest file = digest_file(path);
        EXPECT_EQ(file.bytes, uint64_t{n});
        EXPECT_EQ(file.hex(), xxhsum(path));
        // The same bytes fed in uneven pieces (1..70 bytes, so pieces cross stripe boundaries every way).
        Xxh64 pieces;
        Rng rng(n);
        for (size_t at = 0; at < n;) {
            const size_t take = std::min<size_t>(n - at, 1 + rng.next_u64() % 70);
            pieces.update(bytes.data() + at, take);
            at += take;
        }
        EXPECT_EQ(pieces.digest(), file.xxh64);
        EXPECT_EQ(pieces.length(), uint64_t{n});
    }
}

TEST(atomic_write_returns_its_files_digest) {
    const std::string path = kOut + "/atomic.bin";
    const std::vector<unsigned char> a = random_bytes(5000, 1), b = random_bytes(77, 2);
    AtomicFile f(path);
    f.write(a.data(), a.size());
    f.write(b.data(), b.size());
    const FileDigest written = f.commit();
    EXPECT(written == digest_file(path));
    EXPECT_EQ(written.bytes, uint64_t{5077});
}

TEST(marker_records_files_and_resume_checks_them) {
    const std::string dir = checkpoint_dir(kOut, 7);
    make_dirs(dir);
    const std::string model = dir + "/model.bin", state = dir + "/state_rank0.bin";
    const std::vector<unsigned char> model_bytes = random_bytes(4096, 3), state_bytes = random_bytes(999, 4);
    CheckpointInfo info{dir, 7, 1, "adamw", {}};
    info.files["model.bin"] = write_file_atomic(model, std::as_bytes(std::span(model_bytes)));
    info.files["state_rank0.bin"] = write_file_atomic(state, std::as_bytes(std::span(state_bytes)));
    mark_checkpoint_complete(info);
    const CheckpointInfo read = read_checkpoint_info(dir);
    EXPECT(read.files == info.files);
    verify_checkpoint_file(read, model);
    verify_checkpoint_file(read, state);

    std::vector<unsigned char> flipped = model_bytes;
    flipped[2000] ^= 0x10;
    write_bytes(model, flipped);
    EXPECT_ERROR(verify_checkpoint_file(read, model), model + ": XXH64 ");
    EXPECT_ERROR(verify_checkpoint_file(read, model), "(the file is corrupt or from another checkpoint)");
    EXPECT_ERROR(verify_checkpoint_file(read, model), "resume an older checkpoint with --resume " + kOut +
                                                          "/checkpoints/step_N");
    write_bytes(model, std::vector<unsigned char>(model_bytes.begin(), model_bytes.end() - 1));
    EXPECT_ERROR(verify_checkpoint_file(read, model),
                 model + ": 4095 bytes, but its checkpoint's marker records 4096 (truncated or replaced)");
    std::remove(model.c_str());
    EXPECT_ERROR(verify_checkpoint_file(read, model), model + ": missing, though its checkpoint's marker lists it");
    EXPECT_ERROR(verify_checkpoint_file(read, dir + "/state_rank1.bin"), "lists no such file");

    // A marker from before checksums: nothing recorded, nothing checked.
    const std::string old_marker = R"({"step":7,"world_size":1,"optimizer":"adamw"})";
    write_file_atomic(dir + "/COMPLETE", std::as_bytes(std::span(old_marker.data(), old_marker.size())));
    const CheckpointInfo old = read_checkpoint_info(dir);
    EXPECT(old.files.empty());
    verify_checkpoint_file(old, state);
}

TEST(state_files_are_checked_as_they_are_read) {
    const std::string dir = checkpoint_dir(kOut, 9);
    make_dirs(dir);
    const std::string path = dir + "/state_rank0.bin";
    TrainingState s;
    s.step = 9;
    s.config_json = "{}";
    s.optimizer_state.assign(3000, std::byte{5});
    CheckpointInfo marker{dir, 9, 1, "adamw", {}};
    marker.files["state_rank0.bin"] = write_training_state(path, s);
    EXPECT(marker.files["state_rank0.bin"] == digest_file(path));
    EXPECT_EQ(read_training_state(path, &marker).optimizer_state.size(), size_t{3000});
    std::vector<std::byte> bytes = read_whole_file(path);
    bytes[bytes.size() - 10] ^= std::byte{0x40};  // inside the optimizer state: parses, but is not what was saved
    write_file_atomic(path, bytes);
    EXPECT_EQ(read_training_state(path).optimizer_state.size(), size_t{3000});
    EXPECT_ERROR(read_training_state(path, &marker), path + ": XXH64 ");
    const CheckpointInfo old_marker{dir, 9, 1, "adamw", {}};  // from before checksums: read, not checked
    EXPECT_EQ(read_training_state(path, &old_marker).step, int64_t{9});
}

TEST(malformed_file_lists_are_refused) {
    const std::string dir = checkpoint_dir(kOut, 8);
    make_dirs(dir);
    for (const char* files : {R"([])", R"({"model.bin":{"bytes":-1,"xxh64":"0123456789abcdef"}})",
                              R"({"model.bin":{"bytes":5,"xxh64":"0123456789ABCDEF"}})",
                              R"({"model.bin":{"bytes":5,"xxh64":"123"}})", R"({"model.bin":{"bytes":5}})"}) {
        const std::string text = std::string(R"({"step":8,"world_size":1,"optimizer":"adamw","files":)") + files + "}";
        write_file_atomic(dir + "/COMPLETE", std::as_bytes(std::span(text.data(), text.size())));
        EXPECT_ERROR(read_checkpoint_info(dir), dir + "/COMPLETE: malformed checkpoint marker (files");
    }
}

TEST_MAIN()
