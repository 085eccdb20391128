// Checkpoint directory layout, training-state files and the completion marker (see checkpoint.h).
#include "llmc/checkpoint.h"

#include <dirent.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "llmc/error.h"
#include "llmc/fileio.h"

namespace llmc {

namespace {
constexpr uint32_t kStateMagic = 0x4C4C5354;  // "TSLL"
constexpr uint32_t kStateVersion = 1;
using json = nlohmann::ordered_json;
}  // namespace

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
    return out_dir + "/checkpoints/" + name;
}

std::string state_path(const std::string& dir, int rank) { return dir + "/state_rank" + std::to_string(rank) + ".bin"; }
std::string model_path(const std::string& dir) { return dir + "/model.bin"; }

void write_training_state(const std::string& path, const TrainingState& s) {
    ByteWriter w;
    w.put(kStateMagic);
    w.put(kStateVersion);
    w.put<int64_t>(s.step);
    w.put<int32_t>(s.world_size);
    w.put<int32_t>(s.rank);
    w.put(s.data);
    w.put(s.sample_rng);
    w.put<int64_t>(s.tokens);
    w.put<int64_t>(s.cumulative_bytes_sent);
    w.put_string(s.config_json);
    w.put_array(std::span<const std::byte>(s.optimizer_state));
    write_file_atomic(path, w.bytes());
}

TrainingState read_training_state(const std::string& path) {
    const std::vector<std::byte> bytes = read_whole_file(path);
    ByteReader r(bytes, path);
    LLMC_CHECK(r.get<uint32_t>("magic") == kStateMagic, path + ": bad magic (not a training-state file)");
    const uint32_t version = r.get<uint32_t>("version");
    LLMC_CHECK(version == kStateVersion, path + ": unsupported training-state version " + std::to_string(version));
    TrainingState s;
    s.step = r.get<int64_t>("step");
    s.world_size = r.get<int32_t>("world size");
    s.rank = r.get<int32_t>("rank");
    s.data = r.get<DataPosition>("data position");
    s.sample_rng = r.get<std::array<uint64_t, 4>>("rng state");
    s.tokens = r.get<int64_t>("token count");
    s.cumulative_bytes_sent = r.get<int64_t>("byte count");
    s.config_json = r.get_string("config");
    s.optimizer_state = r.get_vector<std::byte>("optimizer state");
    LLMC_CHECK(r.at_end(), path + ": trailing bytes after the training state");
    return s;
}

void mark_checkpoint_complete(const CheckpointInfo& info) {
    const std::string text =
        json{{"step", info.step}, {"world_size", info.world_size}, {"optimizer", info.optimizer}}.dump() + "\n";
    write_file_atomic(info.dir + "/COMPLETE", std::as_bytes(std::span(text.data(), text.size())));
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
    const std::string marker = dir + "/COMPLETE";
    LLMC_CHECK(file_exists(dir), dir + ": checkpoint directory does not exist");
    LLMC_CHECK(file_exists(marker), dir + ": incomplete checkpoint (no COMPLETE marker: the run died while saving it)");
    const std::vector<std::byte> bytes = read_whole_file(marker);
    const json j = json::parse(reinterpret_cast<const char*>(bytes.data()),
                               reinterpret_cast<const char*>(bytes.data()) + bytes.size(), nullptr, false);
    LLMC_CHECK(j.is_object() && j.contains("step") && j.contains("world_size") && j.contains("optimizer"),
               marker + ": malformed checkpoint marker");
    return {dir, j["step"].get<int64_t>(), j["world_size"].get<int>(), j["optimizer"].get<std::string>()};
}

static std::vector<CheckpointInfo> complete_checkpoints(const std::string& out_dir) {
    std::vector<CheckpointInfo> found;
    const std::string root = out_dir + "/checkpoints";
    DIR* d = opendir(root.c_str());
    if (!d) return found;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (!name.starts_with("step_")) continue;
        const std::string dir = root + "/" + name;
        if (!file_exists(dir + "/COMPLETE")) continue;
        try {
            found.push_back(read_checkpoint_info(dir));
        } catch (const Error&) {
            // A malformed marker is treated like a missing one: that checkpoint is not usable.
        }
    }
    closedir(d);
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    return found;
}

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& out_dir) {
    auto all = complete_checkpoints(out_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
}

void prune_checkpoints(const std::string& out_dir, int keep) {
    if (keep <= 0) return;
    auto all = complete_checkpoints(out_dir);
    for (size_t i = 0; i + keep < all.size(); i++) {
        std::error_code ec;
        std::filesystem::remove_all(all[i].dir, ec);
        LLMC_CHECK(!ec, all[i].dir + ": cannot delete old checkpoint (" + ec.message() + ")");
    }
}

void check_resume_compatible(const std::string& path, const std::string& saved_json, const std::string& current_json,
                             const std::vector<std::string>& may_differ) {
    const json saved = json::parse(saved_json, nullptr, false);
    const json current = json::parse(current_json, nullptr, false);
    LLMC_CHECK(saved.is_object(), path + ": checkpointed config is malformed");
    static const char* const kFixed[] = {
        "num_layers", "num_heads", "channels",         "max_seq_len", "vocab_size", "padded_vocab_size",
        "batch_size", "seq_len",   "total_batch_size", "optimizer",   "seed",       "shuffle",
        "train_data", "demo_chunk", "demo_topk",       "demo_values", "demo_indices", "demo_delay"};
    for (const char* key : kFixed) {
        if (!saved.contains(key) || std::find(may_differ.begin(), may_differ.end(), key) != may_differ.end()) continue;
        LLMC_CHECK(saved[key] == current[key], path + ": --" + key + " is " + current[key].dump() + " here but " +
                                                  saved[key].dump() + " in the checkpoint (resume with the same value)");
    }
}

}  // namespace llmc
