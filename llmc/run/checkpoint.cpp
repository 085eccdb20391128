// Checkpoint directory layout, training-state files and the completion marker (see checkpoint.h).
#include "llmc/run/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "llmc/run/config.h"
#include "llmc/base/error.h"
#include "llmc/base/fileio.h"
#include "llmc/data/text_tokenizer.h"
#include "llmc/model/model_io.h"

namespace llmc {

namespace {
constexpr uint32_t kStateMagic = 0x4C4C5354;  // "TSLL"
constexpr uint32_t kStateVersion = 2;  // 2 added the training shards' fingerprint; 1 is still read
constexpr const char* kSetAsideSuffix = ".corrupt";
using json = nlohmann::ordered_json;
}  // namespace

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
    return out_dir + "/checkpoints/" + name;
}

std::string state_path(const std::string& dir, int rank) { return dir + "/state_rank" + std::to_string(rank) + ".bin"; }
std::string model_path(const std::string& dir) { return dir + "/" + kModelFileName; }

FileDigest write_training_state(const std::string& path, const TrainingState& s) {
    ByteWriter w;
    w.reserve(sizeof(TrainingState) + s.config_json.size() + s.optimizer_state.size());
    w.put(kStateMagic);
    w.put(kStateVersion);
    w.put<int64_t>(s.step);
    w.put<int32_t>(s.world_size);
    w.put<int32_t>(s.rank);
    w.put(s.data);
    w.put(s.sample_rng);
    w.put<int64_t>(s.tokens);
    w.put<int64_t>(s.cumulative_bytes_sent);
    w.put(s.train_data);
    w.put_string(s.config_json);
    w.put_array(std::span<const std::byte>(s.optimizer_state));
    return write_file_atomic(path, w.bytes());
}

TrainingState read_training_state(const std::string& path, const CheckpointInfo* marker) {
    std::vector<std::byte> bytes;
    bool read = false;
    if (marker) verify_checkpoint_file(*marker, path, [&] {
        bytes = read_whole_file(path);
        read = true;
        return digest_bytes(bytes);
    });
    if (!read) bytes = read_whole_file(path);  // no marker, or one from before checksums
    ByteReader r(bytes, path);
    LLMC_CHECK(r.get<uint32_t>("magic") == kStateMagic, path + ": bad magic (not a training-state file)");
    const uint32_t version = r.get<uint32_t>("version");
    LLMC_CHECK(version == 1 || version == kStateVersion,
               path + ": unsupported training-state version " + std::to_string(version));
    TrainingState s;
    s.step = r.get<int64_t>("step");
    s.world_size = r.get<int32_t>("world size");
    s.rank = r.get<int32_t>("rank");
    s.data = r.get<DataPosition>("data position");
    s.sample_rng = r.get<std::array<uint64_t, 4>>("rng state");
    s.tokens = r.get<int64_t>("token count");
    s.cumulative_bytes_sent = r.get<int64_t>("byte count");
    if (version >= 2) s.train_data = r.get<DataFingerprint>("training data fingerprint");
    s.config_json = r.get_string("config");
    s.optimizer_state = r.get_vector<std::byte, LargeVector<std::byte>>("optimizer state");
    LLMC_CHECK(r.at_end(), path + ": trailing bytes after the training state");
    return s;
}

void mark_checkpoint_complete(const CheckpointInfo& info) {
    json files = json::object();
    for (const auto& [name, digest] : info.files) files[name] = {{"bytes", digest.bytes}, {"xxh64", digest.hex()}};
    const std::string text =
        json{{"step", info.step}, {"world_size", info.world_size}, {"optimizer", info.optimizer}, {"files", files}}
            .dump() +
        "\n";
    write_file_atomic(info.dir + "/COMPLETE", std::as_bytes(std::span(text.data(), text.size())));
}

void unmark_checkpoint(const std::string& dir) { remove_file_durably(dir + "/COMPLETE"); }

CheckpointInfo read_checkpoint_info(const std::string& dir) {
    const std::string marker = dir + "/COMPLETE";
    LLMC_CHECK(file_exists(dir), dir + ": checkpoint directory does not exist");
    LLMC_CHECK(is_directory(dir), dir + ": not a checkpoint directory (a file; give the directory that holds it)");
    if (!file_exists(marker) && is_directory(dir + "/checkpoints"))
        fail(dir + ": an out_dir, not a checkpoint directory (resume one of " + dir +
             "/checkpoints/step_*, or --resume auto with --out_dir " + dir + ")");
    LLMC_CHECK(file_exists(marker), dir + ": incomplete checkpoint (no COMPLETE marker: the run died while saving it)");
    const std::vector<std::byte> bytes = read_whole_file(marker);
    const json j = json::parse(reinterpret_cast<const char*>(bytes.data()),
                               reinterpret_cast<const char*>(bytes.data()) + bytes.size(), nullptr, false);
    const bool valid = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                       j["step"].get<int64_t>() >= 0 && j["step"].get<int64_t>() <= INT32_MAX &&
                       j.contains("world_size") && j["world_size"].is_number_integer() &&
                       j["world_size"].get<int64_t>() >= 1 && j["world_size"].get<int64_t>() <= INT32_MAX &&
                       j.contains("optimizer") && j["optimizer"].is_string();
    LLMC_CHECK(valid, marker + ": malformed checkpoint marker");
    CheckpointInfo info{dir, j["step"].get<int64_t>(), j["world_size"].get<int>(),
                        j["optimizer"].get<std::string>(), {}};
    if (j.contains("files")) {
        LLMC_CHECK(j["files"].is_object(), marker + ": malformed checkpoint marker (files)");
        for (const auto& [name, entry] : j["files"].items()) {
            const std::string bad = marker + ": malformed checkpoint marker (files: " + name + ")";
            LLMC_CHECK(entry.is_object() && entry.contains("bytes") && entry["bytes"].is_number_unsigned() &&
                           entry.contains("xxh64") && entry["xxh64"].is_string(),
                       bad);
            const std::string hex = entry["xxh64"].get<std::string>();
            LLMC_CHECK(hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string::npos, bad);
            info.files[name] = {entry["bytes"].get<uint64_t>(), std::stoull(hex, nullptr, 16)};
        }
    }
    return info;
}

void verify_checkpoint_file(const CheckpointInfo& ck, const std::string& path,
                            const std::function<FileDigest()>& digest) {
    if (ck.files.empty()) return;  // a marker written before checksums
    const std::string name = path.substr(path.find_last_of('/') + 1);
    const auto expected = ck.files.find(name);
    if (expected == ck.files.end())
        throw CorruptCheckpointFile(path + ": its checkpoint's marker " + ck.dir +
                                    "/COMPLETE lists no such file (a file from another checkpoint?)");
    const std::string older = "resume an older checkpoint with --resume " + ck.dir.substr(0, ck.dir.rfind('/')) +
                              "/step_N, or retrain";
    if (!file_exists(path))
        throw CorruptCheckpointFile(path + ": missing, though its checkpoint's marker lists it", older);
    const FileDigest found = digest ? digest() : digest_file(path);
    if (found.bytes != expected->second.bytes)
        throw CorruptCheckpointFile(path + ": " + std::to_string(found.bytes) +
                                        " bytes, but its checkpoint's marker records " +
                                        std::to_string(expected->second.bytes) + " (truncated or replaced)",
                                    older);
    if (found.xxh64 != expected->second.xxh64)
        throw CorruptCheckpointFile(path + ": XXH64 " + found.hex() + ", but its checkpoint's marker records " +
                                        expected->second.hex() + " (the file is corrupt or from another checkpoint)",
                                    older);
}

namespace {
// The step_* directories under <out_dir>/checkpoints with the step their name gives, in no particular order.
std::vector<std::pair<std::string, int64_t>> step_dirs(const std::string& out_dir) {
    std::vector<std::pair<std::string, int64_t>> dirs;
    const std::string root = out_dir + "/checkpoints";
    DIR* d = opendir(root.c_str());
    if (!d) return dirs;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (!name.starts_with("step_") || name.find(kSetAsideSuffix) != std::string::npos) continue;
        char* end = nullptr;
        const long long step = std::strtoll(name.c_str() + 5, &end, 10);
        dirs.push_back({root + "/" + name, end != name.c_str() + 5 && *end == 0 ? step : -1});
    }
    closedir(d);
    return dirs;
}

struct Scan {
    std::vector<CheckpointInfo> complete;          // by step
    std::vector<std::pair<std::string, int64_t>> incomplete;
    std::vector<std::string> skipped;              // complete-looking directories that cannot be used, and why
};
Scan scan_checkpoints(const std::string& out_dir) {
    Scan scan;
    for (const auto& [dir, step] : step_dirs(out_dir)) {
        if (!file_exists(dir + "/COMPLETE")) {
            scan.incomplete.push_back({dir, step});
            continue;
        }
        try {
            const CheckpointInfo info = read_checkpoint_info(dir);
            if (info.step == step) scan.complete.push_back(info);
            else scan.skipped.push_back(dir + "/COMPLETE: says step " + std::to_string(info.step) +
                                        ", not the directory's; skipped");
        } catch (const Error& e) {
            scan.skipped.push_back(std::string(e.what()) + "; skipped");
        }
    }
    std::sort(scan.complete.begin(), scan.complete.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    return scan;
}

void remove_dir(const std::string& dir, const char* what) {
    if (is_directory(dir)) unmark_checkpoint(dir);  // first and durably: a kill midway leaves it incomplete
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    LLMC_CHECK(!ec, dir + ": cannot delete " + what + " (" + ec.message() + ")");
}
}  // namespace

std::vector<CheckpointInfo> find_checkpoints(const std::string& out_dir, std::vector<std::string>* skipped) {
    Scan scan = scan_checkpoints(out_dir);
    if (skipped) *skipped = std::move(scan.skipped);
    return std::move(scan.complete);
}

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped) {
    std::vector<CheckpointInfo> all = find_checkpoints(out_dir, skipped);
    if (all.empty()) return std::nullopt;
    return std::move(all.back());
}

std::string set_aside_checkpoint(const std::string& dir) {
    std::string to = dir + kSetAsideSuffix;
    for (int n = 2; file_exists(to); n++) to = dir + kSetAsideSuffix + "." + std::to_string(n);
    LLMC_CHECK(std::rename(dir.c_str(), to.c_str()) == 0,
               dir + ": cannot rename the corrupt checkpoint to " + to + " (" + std::strerror(errno) + ")");
    sync_directory(dir.substr(0, dir.rfind('/')));
    return to;
}

void prune_checkpoints(const std::string& out_dir, int keep) {
    const Scan scan = scan_checkpoints(out_dir);
    if (scan.complete.empty()) return;
    for (const auto& [dir, step] : scan.incomplete)
        if (step >= 0 && step < scan.complete.back().step) remove_dir(dir, "an incomplete checkpoint");
    if (keep <= 0) return;
    for (size_t i = 0; i + keep < scan.complete.size(); i++) remove_dir(scan.complete[i].dir, "old checkpoint");
}

int remove_checkpoints_after(const std::string& out_dir, int64_t after) {
    int removed = 0;
    for (const auto& [dir, step] : step_dirs(out_dir))
        if (step > after) {  // a step_* name that is no number (step -1) is not ours: left alone
            remove_dir(dir, "a checkpoint of another run");
            removed++;
        }
    return removed;
}

void check_state_matches_checkpoint(const std::string& path, const TrainingState& s, const CheckpointInfo& ck, int rank) {
    LLMC_CHECK(s.step == ck.step, path + ": holds step " + std::to_string(s.step) + " but its checkpoint's marker says " +
                                      std::to_string(ck.step) + " (a file from another checkpoint?)");
    LLMC_CHECK(s.world_size == ck.world_size && s.rank == rank,
               path + ": holds rank " + std::to_string(s.rank) + " of " + std::to_string(s.world_size) +
                   " but should hold rank " + std::to_string(rank) + " of " + std::to_string(ck.world_size) +
                   " (a file from another checkpoint or rank?)");
}

void check_resume_compatible(const std::string& path, const std::string& saved_json, const std::string& current_json,
                             const std::function<std::string(const std::string&)>& origin,
                             const std::vector<std::string>& may_differ) {
    const json saved = json::parse(saved_json, nullptr, false);
    const json current = json::parse(current_json, nullptr, false);
    LLMC_CHECK(saved.is_object(), path + ": checkpointed config is malformed");
    for (const std::string& key : fixed_on_resume_keys()) {  // the schema marks them
        if (!saved.contains(key) || std::find(may_differ.begin(), may_differ.end(), key) != may_differ.end()) continue;
        if (saved[key] == current[key]) continue;
        const std::string from = origin ? origin(key) : "";
        fail(path + ": " + key + " is " + current[key].dump() + " here (" + (from.empty() ? "the default" : from) +
             ") but " + saved[key].dump() + " in the checkpoint (resume with the same value)");
    }
}

ModelSource resolve_model_source(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    LLMC_CHECK(!ec && fs::exists(status), path + ": no such file or directory");
    if (!fs::is_directory(status)) return {path, std::nullopt};
    std::string dir = path;
    if (!fs::exists(model_path(dir))) {
        LLMC_CHECK(fs::is_directory(dir + "/checkpoints"),
                   path + ": neither a model file, a checkpoint directory (with " + kModelFileName +
                       ") nor a run directory (with checkpoints/)");
        const std::optional<CheckpointInfo> latest = find_latest_checkpoint(dir);
        LLMC_CHECK(latest.has_value(), path + ": no complete checkpoint under checkpoints/");
        dir = latest->dir;
    }
    if (!fs::exists(dir + "/COMPLETE")) {  // model.bin is written atomically: whole, but not checked against a marker
        std::fprintf(stderr, "warning: %s has no COMPLETE marker (a checkpoint whose save did not finish?): its %s is "
                     "read without a checksum\n", dir.c_str(), kModelFileName);
        return {model_path(dir), std::nullopt};
    }
    return {model_path(dir), read_checkpoint_info(dir)};
}

void load_model_source(const ModelSource& source, const ModelConfig& config, std::span<float> params) {
    FileDigest digest;
    load_model(source.file, config, params, &digest);
    if (!source.checkpoint) return;
    const auto recorded = source.checkpoint->files.find(kModelFileName);  // none in markers from before checksums
    LLMC_CHECK(recorded == source.checkpoint->files.end() || recorded->second == digest,
               source.file + ": XXH64 " + digest.hex() + " (" + std::to_string(digest.bytes) +
                   " bytes), but its checkpoint's marker records " + recorded->second.hex() + " (" +
                   std::to_string(recorded->second.bytes) +
                   " bytes): the file is corrupt or from another checkpoint; use an older one");
}

RunSettings read_run_settings(const std::string& model_file) {
    namespace fs = std::filesystem;
    RunSettings settings;
    const fs::path checkpoint = fs::path(model_file).parent_path();  // <out_dir>/checkpoints/step_N
    if (checkpoint.parent_path().filename() != "checkpoints") return settings;
    const fs::path record = checkpoint.parent_path().parent_path() / "config.json";
    std::error_code ec;
    if (!fs::is_regular_file(record, ec)) return settings;
    settings.record = record.string();
    const std::vector<std::byte> bytes = read_whole_file(settings.record, size_t(64) << 20);
    const json j = json::parse(reinterpret_cast<const char*>(bytes.data()),
                               reinterpret_cast<const char*>(bytes.data()) + bytes.size(), nullptr, false);
    LLMC_CHECK(j.is_object(), settings.record + ": not a JSON object (a run's config.json)");
    const auto integer = [&](const char* key) -> std::optional<int> {
        if (!j.contains(key)) return std::nullopt;
        LLMC_CHECK(j[key].is_number_integer(), settings.record + ": key '" + key + "' is not an integer");
        return j[key].get<int>();
    };
    const auto text = [&](const char* key) -> std::optional<std::string> {
        if (!j.contains(key)) return std::nullopt;
        LLMC_CHECK(j[key].is_string(), settings.record + ": key '" + key + "' is not a string");
        return j[key].get<std::string>();
    };
    settings.eos_token_id = integer("eos_token_id");
    settings.pad_token_id = integer("pad_token_id");
    settings.tokenizer = text("tokenizer");
    const std::string where = settings.record + ": key ";
    if (const auto f = text("data_format")) settings.data_format = parse_data_format(*f, where + "'data_format'");
    if (const auto d = text("memmap_dtype")) settings.memmap_dtype = parse_token_dtype(*d, where + "'memmap_dtype'");
    return settings;
}

std::string run_tokenizer_json(const RunSettings& run) {
    return run.tokenizer && is_hf_tokenizer_file(*run.tokenizer) ? *run.tokenizer : "";
}

}  // namespace llmc
