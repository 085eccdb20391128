// The data loader on OLMo token files, against a reference written here with plain loops (np.memmap's semantics:
// a file of `bytes` holds bytes / itemsize little-endian ids, and bytes // (itemsize * T) instances of T tokens,
// the remainder dropped; files in the order given). Checked: every row a rank gets is its reference instance
// (inputs = the instance, targets = the instance shifted by one with -1 last), for all four dtypes; the ranks'
// instances disjoint and, without shuffle, exactly order[(g*world + r)*B + b]; shuffling a seeded permutation per
// epoch that reaches the remainder too; an exact resume through set_position; list files; the fingerprint following
// format and dtype; format detection; and a one-line error naming the file for each bad file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/dataloader.h"
#include "llmc/data/token_shard.h"
#include "test/support/testing.h"

using namespace llmc;

static const std::string kDir = "build/test-tmp/olmo_data";
constexpr int kVocab = 50280;  // the NeoX vocabulary of the paper's configs

static void fresh_dir() { std::system(("rm -rf " + kDir + " && mkdir -p " + kDir).c_str()); }

// The id at position i of file f: distinct across files and positions modulo the vocabulary (and 251 for uint8), so
// a row's content tells which instance it is.
static uint64_t id_at(int f, uint64_t i, uint64_t vocab) { return (f * 7919 + i * 104729 + i / 3) % vocab; }

// A raw token file written byte by byte, little-endian, as numpy's tofile() writes an array of that dtype.
static void write_raw(const std::string& path, const std::vector<uint64_t>& ids, size_t itemsize) {
    FILE* f = std::fopen(path.c_str(), "wb");
    for (const uint64_t v : ids)
        for (size_t b = 0; b < itemsize; b++) std::fputc(static_cast<int>((v >> (8 * b)) & 0xff), f);
    std::fclose(f);
}

struct RefFile {
    std::string path;
    std::vector<uint64_t> ids;
};
using Row = std::vector<int>;

// Files f = 0.. of the given token counts, named part-<f>.npy (sorted as written).
static std::vector<RefFile> make_files(const std::vector<size_t>& tokens, size_t itemsize, uint64_t vocab,
                                       const std::string& prefix = "part") {
    fresh_dir();
    std::vector<RefFile> files;
    for (size_t f = 0; f < tokens.size(); f++) {
        RefFile r{kDir + "/" + prefix + "-" + std::to_string(f) + ".npy", {}};
        for (size_t i = 0; i < tokens[f]; i++) r.ids.push_back(id_at(static_cast<int>(f), i, vocab));
        write_raw(r.path, r.ids, itemsize);
        files.push_back(std::move(r));
    }
    return files;
}

// The reference: instance k of a file is ids[k*T, (k+1)*T) for k < size // T.
static std::vector<Row> instances(const RefFile& f, int T) {
    std::vector<Row> out;
    for (size_t k = 0; (k + 1) * T <= f.ids.size(); k++)
        out.emplace_back(f.ids.begin() + k * T, f.ids.begin() + (k + 1) * T);
    return out;
}

// Checks one batch row against its instance: inputs are the instance, targets the instance shifted, -1 last.
static bool row_is(const std::vector<int>& x, const std::vector<int>& y, int b, int T, const Row& want) {
    for (int t = 0; t < T; t++) {
        if (x[b * T + t] != want[t]) return false;
        if (y[b * T + t] != (t + 1 < T ? want[t + 1] : -1)) return false;
    }
    return true;
}

static TokenDtype dtype_of(size_t itemsize) {
    return itemsize == 1 ? TokenDtype::uint8 : itemsize == 2 ? TokenDtype::uint16 : itemsize == 4 ? TokenDtype::uint32
                                                                                                  : TokenDtype::uint64;
}

// Without shuffle, one rank: the instances of each file in order, B a batch, leftovers of a file skipped, for every
// dtype (uint8 with a vocabulary of 251, the others with ids above 65535 where they can hold them).
TEST(sequential_rows_are_the_memmap_instances) {
    const int B = 2, T = 8;
    for (const size_t itemsize : {1, 2, 4, 8}) {
        const uint64_t vocab = itemsize == 1 ? 251 : itemsize == 2 ? kVocab : 128256;  // Llama 3's above 65535
        // 10 instances and 3 tokens over; 5 instances exactly; 7 instances and T-1 over
        const auto files = make_files({10 * T + 3, 5 * T, 7 * T + T - 1}, itemsize, vocab);
        DataLoader dl(kDir + "/part-*.npy", B, T, 0, 1, false, 0, static_cast<int>(vocab), DataFormat::olmo,
                      dtype_of(itemsize));
        EXPECT(dl.format() == DataFormat::olmo);
        EXPECT_EQ(dl.groups_per_epoch(), uint64_t{5 + 2 + 3});
        EXPECT_EQ(dl.total_tokens(), uint64_t{10 * T + 3 + 5 * T + 7 * T + T - 1});
        std::vector<int> x(B * T), y(B * T);
        bool all = true;
        for (int epoch = 0; epoch < 2; epoch++)
            for (const RefFile& f : files) {
                const std::vector<Row> want = instances(f, T);
                for (size_t g = 0; g < want.size() / B; g++) {
                    dl.next_batch(x, y);
                    for (int b = 0; b < B; b++) all = all && row_is(x, y, b, T, want[g * B + b]);
                }
            }
        EXPECT(all);
        EXPECT_EQ(dl.position().epoch, uint64_t{1});
    }
}

// Rank r takes instances (g*world + r)*B + b of each file's group g; together the ranks read every instance of
// the whole groups once.
TEST(ranks_take_their_own_instances) {
    const int B = 2, T = 4, world = 3;
    const auto files = make_files({6 * 5 * T + 2 * T, 6 * T + 1}, 2, kVocab);  // 5 groups + 2 over; 1 group + 1 token
    std::set<Row> every;
    for (const RefFile& f : files)
        for (const Row& r : instances(f, T)) every.insert(r);
    for (const bool shuffle : {false, true}) {
        std::map<Row, int> served;  // row -> times served
        for (int r = 0; r < world; r++) {
            DataLoader dl(kDir + "/part-*.npy", B, T, r, world, shuffle, 42, kVocab, DataFormat::olmo);
            EXPECT_EQ(dl.groups_per_epoch(), uint64_t{6});
            std::vector<int> x(B * T), y(B * T);
            size_t group = 0;
            for (const RefFile& f : files) {
                const std::vector<Row> want = instances(f, T);
                for (size_t g = 0; g < want.size() / (world * B); g++, group++) {
                    dl.next_batch(x, y);
                    for (int b = 0; b < B; b++) {
                        const Row row(x.begin() + b * T, x.begin() + (b + 1) * T);
                        served[row]++;
                        // no shuffle: exactly the instance the rule names; shuffled (the files too): an instance
                        if (!shuffle) EXPECT(row_is(x, y, b, T, want[(g * world + r) * B + b]));
                        else EXPECT(every.count(row) == 1 && row_is(x, y, b, T, row));
                    }
                }
            }
            EXPECT_EQ(group, size_t{6});
        }
        size_t twice = 0;
        for (const auto& [row, n] : served) twice += n != 1;
        EXPECT_EQ(served.size(), size_t{6 * world * B});  // disjoint across ranks: 36 distinct instances
        EXPECT_EQ(twice, size_t{0});
    }
}

static std::vector<Row> stream(uint64_t seed, int batches, int world = 1, int rank = 0) {
    const int B = 2, T = 4;
    DataLoader dl(kDir + "/part-*.npy", B, T, rank, world, true, seed, kVocab, DataFormat::olmo);
    std::vector<int> x(B * T), y(B * T);
    std::vector<Row> rows;
    for (int i = 0; i < batches; i++) {
        dl.next_batch(x, y);
        for (int b = 0; b < B; b++) rows.emplace_back(x.begin() + b * T, x.begin() + (b + 1) * T);
    }
    return rows;
}

// A seeded permutation per epoch, of all of a file's instances: the remainder that does not fill a group is read in
// some epoch too (OLMo's own shuffle reaches every instance).
TEST(shuffle_is_seeded_and_reaches_every_instance) {
    const int T = 4;
    const auto files = make_files({11 * T, 9 * T + 3}, 2, kVocab);  // 5 + 4 groups of 2, 1 + 1 instances over
    const auto a = stream(7, 9 * 12), b = stream(7, 9 * 12), c = stream(8, 9 * 12);
    EXPECT(a == b);
    EXPECT(a != c);
    std::set<Row> all;
    for (const RefFile& f : files)
        for (const Row& r : instances(f, T)) all.insert(r);
    EXPECT_EQ(all.size(), size_t{20});
    const std::vector<Row> epoch0(a.begin(), a.begin() + 18), epoch1(a.begin() + 18, a.begin() + 36);
    EXPECT(epoch0 != epoch1);
    EXPECT_EQ(std::set<Row>(epoch0.begin(), epoch0.end()).size(), size_t{18});  // no instance twice in an epoch
    EXPECT(std::set<Row>(a.begin(), a.end()) == all);  // 12 epochs: every instance, the 2 over included
}

TEST(position_restores_the_exact_stream) {
    make_files({30 * 4, 13 * 4 + 1, 8 * 4}, 4, kVocab);
    const int B = 2, T = 4, world = 2;
    for (int rank = 0; rank < world; rank++) {
        DataLoader a(kDir + "/part-*.npy", B, T, rank, world, true, 3, kVocab, DataFormat::olmo, TokenDtype::uint32);
        std::vector<int> x(B * T), y(B * T), x2(B * T), y2(B * T);
        for (int i = 0; i < 17; i++) a.next_batch(x, y);  // into epoch 1 (12 groups an epoch)
        const DataPosition saved = a.position();
        EXPECT_EQ(saved.epoch, uint64_t{1});
        DataLoader b(kDir + "/part-*.npy", B, T, rank, world, true, 3, kVocab, DataFormat::olmo, TokenDtype::uint32);
        b.set_position(saved);
        bool same = true;
        for (int i = 0; i < 30; i++) {
            a.next_batch(x, y);
            b.next_batch(x2, y2);
            same = same && x == x2 && y == y2;
        }
        EXPECT(same);
    }
}

// @FILE: paths in the order listed (not sorted), relative to the list's directory, comments and blank lines
// skipped, globs expanded.
TEST(list_files_keep_their_order) {
    const int B = 1, T = 4;
    const auto files = make_files({2 * T, 3 * T, 4 * T}, 2, kVocab);
    const std::string list = kDir + "/paths.txt";
    const std::string text = "# Dolma-like list\npart-2.npy\n\n  part-0.npy  \r\n" +
                             std::filesystem::absolute(files[1].path).string() + "\n";
    write_file_atomic(list, std::as_bytes(std::span(text.data(), text.size())));
    DataLoader dl("@" + list, B, T, 0, 1, false, 0, kVocab, DataFormat::auto_detect);
    EXPECT(dl.format() == DataFormat::olmo);
    EXPECT_EQ(dl.num_shards(), size_t{3});
    std::vector<int> x(B * T), y(B * T);
    bool in_order = true;
    for (const int f : {2, 0, 1})
        for (const Row& want : instances(files[f], T)) {
            dl.next_batch(x, y);
            in_order = in_order && row_is(x, y, 0, T, want);
        }
    EXPECT(in_order);
    const std::string globbed = kDir + "/glob.txt", glob_text = "part-[12].npy\n";
    write_file_atomic(globbed, std::as_bytes(std::span(glob_text.data(), glob_text.size())));
    EXPECT_EQ(DataLoader("@" + globbed, B, T, 0, 1, false, 0, kVocab).num_shards(), size_t{2});
    const std::string empty = kDir + "/empty.txt", comment = "# nothing\n\n";
    write_file_atomic(empty, std::as_bytes(std::span(comment.data(), comment.size())));
    EXPECT_ERROR(DataLoader("@" + empty, B, T, 0, 1, false, 0, kVocab), empty + ": lists no files");
    const std::string missing = kDir + "/missing.txt", gone = "part-9.npy\n";
    write_file_atomic(missing, std::as_bytes(std::span(gone.data(), gone.size())));
    EXPECT_ERROR(DataLoader("@" + missing, B, T, 0, 1, false, 0, kVocab), kDir + "/part-9.npy: cannot open");
    EXPECT_ERROR(DataLoader("@" + kDir + "/nope.txt", B, T, 0, 1, false, 0, kVocab), "nope.txt: cannot open");
}

// auto: a file with the shard header is an llm.c shard (its windows of B*T+1, as with --data_format llmc), any
// other an OLMo file; the same shard read as OLMo is other data to the fingerprint.
TEST(format_detection_and_fingerprint) {
    fresh_dir();
    std::vector<uint16_t> tokens(200);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<uint16_t>(i * 7 % 50000);
    const std::string shard = kDir + "/s_000000.bin";
    write_shard(shard, tokens);
    DataLoader as_llmc(shard, 2, 8, 0, 1, false, 0, kVocab, DataFormat::llmc);
    DataLoader detected(shard, 2, 8, 0, 1, false, 0, kVocab);
    EXPECT(detected.format() == DataFormat::llmc);
    EXPECT(detected.fingerprint() == as_llmc.fingerprint());
    std::vector<int> x(16), y(16), x2(16), y2(16);
    as_llmc.next_batch(x, y);
    detected.next_batch(x2, y2);
    EXPECT(x == x2 && y == y2 && x[0] == 0 && y[15] == tokens[16]);  // a window of B*T+1: no -1 target
    // an llm.c run ignores the dtype: same stream, same fingerprint
    EXPECT(DataLoader(shard, 2, 8, 0, 1, false, 0, kVocab, DataFormat::llmc, TokenDtype::uint32).fingerprint() ==
           as_llmc.fingerprint());
    // read as raw tokens it is an OLMo file of 712 ids (the header's 512 among them)
    DataLoader raw(shard, 2, 8, 0, 1, false, 0, kVocab, DataFormat::olmo);
    EXPECT(raw.fingerprint() != as_llmc.fingerprint());
    EXPECT_EQ(raw.total_tokens(), uint64_t{712});

    const auto files = make_files({64, 128}, 2, kVocab);
    const DataFingerprint u16 = DataLoader(kDir + "/part-*.npy", 1, 8, 0, 1, false, 0, kVocab).fingerprint();
    EXPECT(u16.shards == 2 && u16.tokens == 192);
    EXPECT(DataLoader(kDir + "/part-*.npy", 2, 4, 1, 2, true, 9, kVocab, DataFormat::olmo).fingerprint() == u16);
    const DataFingerprint u8 =
        DataLoader(kDir + "/part-*.npy", 1, 8, 0, 1, false, 0, 256, DataFormat::olmo, TokenDtype::uint8).fingerprint();
    EXPECT(u8.shards == 2 && u8.tokens == 384 && u8.hash != u16.hash);
}

// Expects `make` to throw a one-line llmc::Error containing every needle.
template <class F>
static void expect_one_line_error(F make, const std::vector<std::string>& needles) {
    try {
        make();
        testing::report_failure(__FILE__, __LINE__, "expected an error containing " + needles[0]);
    } catch (const Error& e) {
        const std::string what = e.what();
        bool ok = what.find('\n') == std::string::npos;
        for (const std::string& n : needles) ok = ok && what.find(n) != std::string::npos;
        if (!ok) testing::report_failure(__FILE__, __LINE__, "message '" + what + "' lacks '" + needles[0] + "'");
    }
}

TEST(bad_files_fail_with_the_file_named) {
    fresh_dir();
    const std::string odd = kDir + "/odd.npy", empty = kDir + "/empty.npy", small = kDir + "/small.npy";
    write_raw(odd, {1, 2, 3}, 1);  // 3 bytes: not whole uint16 items
    write_raw(empty, {}, 2);
    write_raw(small, {1, 2, 3, 4, 5}, 2);  // 5 tokens: less than one instance of 8
    expect_one_line_error([&] { DataLoader(odd, 1, 1, 0, 1, false, 0, kVocab, DataFormat::olmo); },
                          {odd + ": 3 bytes is not a whole number of uint16 tokens", "--memmap_dtype"});
    expect_one_line_error([&] { DataLoader(odd, 1, 1, 0, 1, false, 0, kVocab, DataFormat::olmo, TokenDtype::uint64); },
                          {odd + ": 3 bytes is not a whole number of uint64 tokens"});
    expect_one_line_error([&] { DataLoader(empty, 1, 1, 0, 1, false, 0, kVocab); }, {empty + ": empty token file"});
    expect_one_line_error([&] { DataLoader(small, 1, 8, 0, 1, false, 0, kVocab); },
                          {small + ": 5 tokens, fewer than one instance of seq_len 8"});
    // files that hold instances, but no file a group of ranks*B of them
    write_raw(small, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 2);
    expect_one_line_error([&] { DataLoader(small, 2, 4, 0, 3, false, 0, kVocab); },
                          {small + ": files too small: no file holds ranks*B = 6 instances of seq_len 4"});

    // an id at or above the vocabulary: the file and the token's position in it
    const std::string oov = kDir + "/oov.npy";
    std::vector<uint64_t> ids(64, 5);
    ids[37] = 70000;
    write_raw(oov, ids, 4);
    DataLoader dl(oov, 2, 8, 0, 1, false, 0, kVocab, DataFormat::olmo, TokenDtype::uint32);
    std::vector<int> x(16), y(16);
    dl.next_batch(x, y);  // instances 0 and 1: positions 0-15
    dl.next_batch(x, y);  // 16-31
    expect_one_line_error([&] { dl.next_batch(x, y); },
                          {oov + ": token id 70000 at position 37 is out of range (vocab_size 50280)"});
    // shuffled: read an instance at a time, the position is still the file's
    DataLoader shuffled(oov, 1, 8, 0, 1, true, 5, kVocab, DataFormat::olmo, TokenDtype::uint32);
    bool thrown = false;
    for (int i = 0; i < 8 && !thrown; i++) try {
            shuffled.next_batch(std::span(x).first(8), std::span(y).first(8));
        } catch (const Error& e) {
            thrown = std::string(e.what()).find(oov + ": token id 70000 at position 37 ") != std::string::npos;
        }
    EXPECT(thrown);

    // one format a set: a file of each named
    const std::string shard = kDir + "/mix_000.bin", raw = kDir + "/mix_001.bin";
    write_shard(shard, std::vector<uint16_t>(100, 3));
    write_raw(raw, std::vector<uint64_t>(600, 3), 2);  // longer than a header: its first bytes are no magic
    expect_one_line_error([&] { DataLoader(kDir + "/mix_*.bin", 1, 8, 0, 1, false, 0, kVocab); },
                          {"mix_*.bin: mixes llm.c shards (" + shard + ") and OLMo token files (" + raw + ")"});
    // --data_format llmc on an OLMo file: the shard's error; a truncated shard under auto: the shard's error too
    expect_one_line_error([&] { DataLoader(raw, 1, 8, 0, 1, false, 0, kVocab, DataFormat::llmc); },
                          {raw + ": bad magic"});
    std::vector<std::byte> bytes = read_whole_file(shard);
    const std::string truncated = kDir + "/truncated.bin";
    write_file_atomic(truncated, std::span(bytes.data(), bytes.size() - 2));
    expect_one_line_error([&] { DataLoader(truncated, 1, 8, 0, 1, false, 0, kVocab); },
                          {truncated + ": truncated shard"});
}

TEST_MAIN()
