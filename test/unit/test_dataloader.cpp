// Data loader and token shard tests on synthetic shards whose token at global position i is known, so every
// batch can be checked against a direct computation: rank slicing (disjoint, complete), sequential order,
// seeded shuffling (a permutation per epoch, reproducible, seed-dependent), epoch wrap, exact position restore, the
// re-sliced position of an elastic resume,
// one-line errors for bad shards (a directory or a named pipe among them, which must not block), and the
// fingerprint a checkpoint keeps of the shards. OLMo token files are test_olmo_data's.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "llmc/data/dataloader.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/token_shard.h"
#include "test/support/testing.h"

using namespace llmc;

static const std::string kDir = "build/test-tmp/shards";
constexpr int kVocab = 50257;

// Shard s holds tokens (s * 10000 + i) % kVocab for i in [0, n).
static uint16_t token_at(int shard, size_t i) { return static_cast<uint16_t>((shard * 10000 + i) % kVocab); }

static std::vector<size_t> g_shard_sizes;  // sizes of the shards make_shards wrote last

static void make_shards(const std::vector<size_t>& sizes, const std::string& prefix = "synth") {
    g_shard_sizes = sizes;
    std::system(("rm -rf " + kDir + " && mkdir -p " + kDir).c_str());
    for (size_t s = 0; s < sizes.size(); s++) {
        std::vector<uint16_t> tokens(sizes[s]);
        for (size_t i = 0; i < sizes[s]; i++) tokens[i] = token_at(static_cast<int>(s), i);
        char name[64];
        std::snprintf(name, sizeof name, "/%s_train_%06zu.bin", prefix.c_str(), s);
        write_shard(kDir + name, tokens);
    }
}

// Identifies a batch by (shard, window) from its first input token, after checking it is a contiguous window.
static std::pair<int, size_t> identify(const std::vector<int>& x, const std::vector<int>& y, int B, int T) {
    for (int shard = 0; shard < static_cast<int>(g_shard_sizes.size()); shard++) {
        const size_t start = (static_cast<size_t>(x[0]) + kVocab - (shard * 10000) % kVocab) % kVocab;
        if (start % (static_cast<size_t>(B) * T) != 0 || start + x.size() + 1 > g_shard_sizes[shard]) continue;
        bool ok = true;
        for (size_t i = 0; i < x.size() && ok; i++)
            ok = x[i] == token_at(shard, start + i) && y[i] == token_at(shard, start + i + 1);
        if (ok) return {shard, start / (static_cast<size_t>(B) * T)};
    }
    return {-1, 0};
}

TEST(shard_round_trip_and_header) {
    make_shards({1000});
    const std::string path = kDir + "/synth_train_000000.bin";
    EXPECT_EQ(read_shard_header(path), size_t{1000});
    const auto tokens = read_shard(path, kVocab);
    EXPECT_EQ(tokens.size(), size_t{1000});
    EXPECT_EQ(tokens[999], token_at(0, 999));
    // Size on disk is exactly header + 2 bytes per token.
    File f(path, "rb");
    EXPECT_EQ(f.size(), size_t{1024 + 2000});
}

TEST(sequential_single_rank) {
    const int B = 2, T = 8;
    make_shards({16 * 10 + 1, 16 * 3 + 5});  // 10 windows, then 3 windows
    DataLoader dl(kDir + "/synth_train_*.bin", B, T, 0, 1, false, 0, kVocab);
    EXPECT_EQ(dl.groups_per_epoch(), uint64_t{13});
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < 13; i++) {
        dl.next_batch(x, y);
        const auto [shard, window] = identify(x, y, B, T);
        EXPECT_EQ(shard, i < 10 ? 0 : 1);
        EXPECT_EQ(window, static_cast<size_t>(i < 10 ? i : i - 10));
    }
    dl.next_batch(x, y);  // wraps to epoch 1
    EXPECT_EQ(dl.position().epoch, uint64_t{1});
    EXPECT(identify(x, y, B, T) == std::make_pair(0, size_t{0}));
}

TEST(ranks_get_disjoint_complete_slices) {
    const int B = 2, T = 4, world = 3;
    make_shards({8 * 20 + 1, 8 * 7 + 1});  // 20 windows -> 6 groups (2 left over); 7 windows -> 2 groups
    for (bool shuffle : {false, true}) {
        std::set<std::pair<int, size_t>> seen;
        std::vector<std::vector<std::pair<int, size_t>>> per_rank(world);
        for (int r = 0; r < world; r++) {
            DataLoader dl(kDir + "/synth_train_*.bin", B, T, r, world, shuffle, 42, kVocab);
            EXPECT_EQ(dl.groups_per_epoch(), uint64_t{8});
            std::vector<int> x(B * T), y(B * T);
            for (uint64_t g = 0; g < dl.groups_per_epoch(); g++) {
                dl.next_batch(x, y);
                const auto id = identify(x, y, B, T);
                EXPECT(id.first >= 0);
                EXPECT(seen.insert(id).second);  // no window served twice
                per_rank[r].push_back(id);
            }
        }
        EXPECT_EQ(seen.size(), size_t{24});
        if (!shuffle) {
            // Rank r takes window g*world + r of each shard.
            EXPECT(per_rank[1][0] == std::make_pair(0, size_t{1}));
            EXPECT(per_rank[2][5] == std::make_pair(0, size_t{17}));
            EXPECT(per_rank[0][6] == std::make_pair(1, size_t{0}));
        }
    }
}

static std::vector<std::pair<int, size_t>> stream(uint64_t seed, int batches, bool shuffle = true) {
    const int B = 1, T = 8;
    DataLoader dl(kDir + "/synth_train_*.bin", B, T, 0, 1, shuffle, seed, kVocab);
    std::vector<int> x(B * T), y(B * T);
    std::vector<std::pair<int, size_t>> ids;
    for (int i = 0; i < batches; i++) {
        dl.next_batch(x, y);
        ids.push_back(identify(x, y, B, T));
    }
    return ids;
}

TEST(shuffle_is_seeded_permutation_per_epoch) {
    make_shards({8 * 30 + 1, 8 * 30 + 1, 8 * 30 + 1});  // 90 windows per epoch
    const auto a = stream(7, 180), b = stream(7, 180), c = stream(8, 180), plain = stream(7, 90, false);
    EXPECT(a == b);
    EXPECT(a != c);
    const std::vector<std::pair<int, size_t>> epoch0(a.begin(), a.begin() + 90), epoch1(a.begin() + 90, a.end());
    EXPECT(epoch0 != epoch1);
    EXPECT(epoch0 != plain);
    auto sorted0 = epoch0, sorted1 = epoch1, sorted_plain = plain;
    std::sort(sorted0.begin(), sorted0.end());
    std::sort(sorted1.begin(), sorted1.end());
    std::sort(sorted_plain.begin(), sorted_plain.end());
    EXPECT(sorted0 == sorted_plain);  // each epoch visits every window exactly once
    EXPECT(sorted1 == sorted_plain);
}

TEST(position_restores_the_exact_stream) {
    make_shards({8 * 30 + 1, 8 * 11 + 1});
    const int B = 1, T = 8;
    DataLoader a(kDir + "/synth_train_*.bin", B, T, 0, 1, true, 3, kVocab);
    std::vector<int> x(B * T), y(B * T), x2(B * T), y2(B * T);
    for (int i = 0; i < 57; i++) a.next_batch(x, y);  // into epoch 1
    const DataPosition saved = a.position();
    DataLoader b(kDir + "/synth_train_*.bin", B, T, 0, 1, true, 3, kVocab);
    b.set_position(saved);
    for (int i = 0; i < 50; i++) {
        a.next_batch(x, y);
        b.next_batch(x2, y2);
        EXPECT(x == x2 && y == y2);
    }
}

// Elastic resume: 2 ranks read 5 groups, then 3 or 4 ranks (or 1) continue from reslice(); together they read each
// window once, exactly the windows one rank reads uninterrupted (shuffled or not), except the whole-group
// rounding reslice reports (10 windows consumed: 3 or 4 ranks skip 2, to a group boundary at 12).
TEST(reslice_continues_the_stream_on_another_number_of_ranks) {
    make_shards({8 * 40 + 1, 8 * 9 + 1});
    const int B = 1, T = 8;
    for (bool shuffle : {false, true})
        for (int world : {1, 3, 4}) {
            std::vector<std::pair<int, size_t>> read;
            std::vector<int> x(B * T), y(B * T);
            DataPosition saved;
            for (int r = 0; r < 2; r++) {
                DataLoader old(kDir + "/synth_train_*.bin", B, T, r, 2, shuffle, 9, kVocab);
                for (int g = 0; g < 5; g++) {
                    old.next_batch(x, y);
                    read.push_back(identify(x, y, B, T));
                }
                saved = old.position();
            }
            uint64_t skipped = 0;
            for (int r = 0; r < world; r++) {
                DataLoader now(kDir + "/synth_train_*.bin", B, T, r, world, shuffle, 9, kVocab);
                const DataLoader::Reslice s = now.reslice(saved, 2);
                skipped = s.skipped;
                now.set_position(s.position);
                for (int g = 0; g < 6; g++) {
                    now.next_batch(x, y);
                    read.push_back(identify(x, y, B, T));
                }
            }
            EXPECT_EQ(skipped, uint64_t((world - 10 % world) % world));  // up to the next multiple of world
            const std::vector<std::pair<int, size_t>> one = stream(9, static_cast<int>(10 + skipped + 6 * world), shuffle);
            std::set<std::pair<int, size_t>> want(one.begin(), one.end()), got(read.begin(), read.end());
            EXPECT_EQ(got.size(), read.size());  // none twice
            for (uint64_t i = 10; i < 10 + skipped; i++) want.erase(one[i]);
            EXPECT(got == want);
        }
}

// The fingerprint changes with the shards' number, sizes and names, not with their directory or the loader's
// batch geometry, rank or shuffling.
TEST(fingerprint_follows_the_files) {
    make_shards({1000, 2000});
    const DataFingerprint f = DataLoader(kDir + "/synth_train_*.bin", 1, 8, 0, 1, false, 0, kVocab).fingerprint();
    EXPECT(f.shards == 2 && f.tokens == 3000);
    EXPECT(DataLoader(kDir + "/synth_train_*.bin", 2, 16, 1, 2, true, 7, kVocab).fingerprint() == f);
    std::system(("rm -rf " + kDir + "_moved && cp -r " + kDir + " " + kDir + "_moved").c_str());
    EXPECT(DataLoader(kDir + "_moved/synth_train_*.bin", 1, 8, 0, 1, false, 0, kVocab).fingerprint() == f);
    std::system(("rm -rf " + kDir + "_moved").c_str());
    make_shards({1000, 2000}, "other");  // same sizes, other names
    const DataFingerprint renamed = DataLoader(kDir + "/other_train_*.bin", 1, 8, 0, 1, false, 0, kVocab).fingerprint();
    EXPECT(renamed.shards == 2 && renamed.tokens == 3000 && renamed.hash != f.hash);
    make_shards({2000, 1000});           // same names and total, sizes swapped
    EXPECT(DataLoader(kDir + "/synth_train_*.bin", 1, 8, 0, 1, false, 0, kVocab).fingerprint().hash != f.hash);
    make_shards({1000});
    EXPECT(DataLoader(kDir + "/synth_train_*.bin", 1, 8, 0, 1, false, 0, kVocab).fingerprint().shards == 1);
}

TEST(bad_shards_fail_with_file_named) {
    make_shards({100});
    const std::string good = kDir + "/synth_train_000000.bin";
    std::vector<std::byte> bytes = read_whole_file(good);

    const std::string bad_magic = kDir + "/bad_magic.bin";
    auto copy = bytes;
    copy[0] = std::byte{0x01};
    write_file_atomic(bad_magic, copy);
    EXPECT_ERROR(DataLoader(bad_magic, 1, 8, 0, 1, false, 0, kVocab, DataFormat::llmc), bad_magic + ": bad magic");
    // without the magic, --data_format auto takes it for an OLMo token file (test_olmo_data has those)
    EXPECT(DataLoader(bad_magic, 1, 8, 0, 1, false, 0, kVocab).format() == DataFormat::olmo);

    const std::string truncated = kDir + "/truncated.bin";
    write_file_atomic(truncated, std::span(bytes.data(), bytes.size() - 3));
    EXPECT_ERROR(DataLoader(truncated, 1, 8, 0, 1, false, 0, kVocab), truncated + ": truncated shard");

    const std::string tiny = kDir + "/tiny.bin";
    write_file_atomic(tiny, std::span(bytes.data(), 100));
    EXPECT_ERROR(read_shard_header(tiny), tiny + ": truncated shard");

    const std::string out_of_range = kDir + "/oov.bin";
    std::vector<uint16_t> tokens(100, 5);
    tokens[37] = 60000;
    write_shard(out_of_range, tokens);
    DataLoader dl(out_of_range, 1, 64, 0, 1, false, 0, kVocab);
    std::vector<int> x(64), y(64);
    EXPECT_ERROR(dl.next_batch(x, y), out_of_range + ": token id 60000 at position 37 is out of range");

    EXPECT_ERROR(DataLoader(kDir + "/nothing_*.bin", 1, 8, 0, 1, false, 0, kVocab), "nothing_*.bin: no files match");
    const std::string dir = kDir + "/dir.bin", fifo = kDir + "/fifo.bin";
    make_dirs(dir);
    EXPECT(std::system(("mkfifo " + fifo).c_str()) == 0);
    EXPECT_ERROR(DataLoader(dir, 1, 8, 0, 1, false, 0, kVocab), dir + ": is a directory, not a file");
    EXPECT_ERROR(DataLoader(fifo, 1, 8, 0, 1, false, 0, kVocab), fifo + ": not a regular file");
    EXPECT_ERROR(DataLoader(good, 4, 64, 0, 1, false, 0, kVocab), "shards too small");
}

TEST_MAIN()
