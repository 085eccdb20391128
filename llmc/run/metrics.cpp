// JSONL metrics log and progress-line formatting (see metrics.h).
#include "llmc/run/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "llmc/base/error.h"
#include "llmc/base/fileio.h"

namespace llmc {

using json = nlohmann::ordered_json;

std::string metrics_path(const std::string& out_dir) { return out_dir + "/metrics.jsonl"; }

MetricsLog::MetricsLog(const std::string& out_dir, int resume_step) : path_(metrics_path(out_dir)) {
    if (resume_step >= 0 && file_exists(path_)) {
        // Keep only lines of steps up to the resumed one (and non-step lines before them).
        std::vector<std::string> kept;
        {
            File in(path_, "rb");
            std::string text(in.size(), '\0');
            in.read_exact(text.data(), text.size(), "metrics");
            std::vector<std::string> lines;
            std::istringstream in_lines(text);
            for (std::string line; std::getline(in_lines, line);)
                if (!line.empty()) lines.push_back(line);
            for (size_t i = 0; i < lines.size(); i++) {
                const json j = json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
                // The last line may be torn by a crash: dropped. A bad line before it is not ours to judge: kept.
                if (j.is_discarded() && i + 1 == lines.size()) break;
                if (!j.is_discarded() && j.contains("step") && j["step"].is_number() &&
                    j["step"].get<long long>() > resume_step)
                    break;
                kept.push_back(lines[i]);
            }
        }
        std::string joined;
        for (const std::string& l : kept) joined += l + "\n";
        write_file_atomic(path_, std::as_bytes(std::span(joined.data(), joined.size())));
    } else if (resume_step < 0 && file_exists(path_)) {
        std::remove(path_.c_str());  // a fresh run starts a fresh log
    }
    f_ = std::fopen(path_.c_str(), "ab");
    LLMC_CHECK(f_ != nullptr, path_ + ": cannot open for appending");
}

MetricsLog::~MetricsLog() {
    if (f_) std::fclose(f_);
}

void MetricsLog::write_line(const std::string& line) {
    LLMC_CHECK(std::fputs((line + "\n").c_str(), f_) >= 0 && std::fflush(f_) == 0,
               path_ + ": write failed (" + std::strerror(errno) + ")");
}

void MetricsLog::log_step(const StepMetrics& m) {
    json j;
    j["type"] = "train";
    j["step"] = m.step;
    j["loss"] = m.loss;
    j["lr"] = m.lr;
    j["grad_norm"] = m.grad_norm;
    j["tokens"] = m.tokens;
    j["step_ms"] = m.step_seconds * 1e3;
    j["compute_ms"] = m.compute_seconds * 1e3;
    j["comm_ms"] = m.comm_seconds * 1e3;
    j["tok_per_s"] = m.tokens_per_second;
    j["model_tflops"] = m.model_tflops;
    if (m.mfu) j["mfu"] = *m.mfu;
    j["bytes_sent"] = m.comm.bytes_sent;
    j["bytes_sent_intra"] = m.comm.bytes_sent_intra;
    j["bytes_sent_inter"] = m.comm.bytes_sent_inter;
    j["bytes_recv"] = m.comm.bytes_recv;
    j["payload_bytes"] = m.comm.payload_bytes;
    j["cum_bytes_sent"] = m.cumulative_bytes_sent;
    j["opt_ms"] = {{"clip", m.optimizer.clip * 1e3},
                   {"transform", m.optimizer.transform * 1e3},
                   {"topk", m.optimizer.topk * 1e3},
                   {"exchange", m.optimizer.exchange * 1e3},
                   {"apply", m.optimizer.apply * 1e3},
                   {"reduce_scatter", m.optimizer.reduce_scatter * 1e3},
                   {"allgather", m.optimizer.allgather * 1e3},
                   {"diagnostics", m.optimizer.diagnostics * 1e3}};
    write_line(j.dump());
}

void MetricsLog::log_val(int step, double val_loss, long long tokens) {
    write_line(json{{"type", "val"}, {"step", step}, {"val_loss", val_loss}, {"tokens", tokens}}.dump());
}

void MetricsLog::log_choices(int step, double acc, double acc_norm, long long examples, long long cropped,
                             long long tokens) {
    write_line(json{{"type", "choices"},    {"step", step},       {"acc", acc},       {"acc_norm", acc_norm},
                    {"examples", examples}, {"cropped", cropped}, {"tokens", tokens}}.dump());
}

void MetricsLog::log_sample(int step, const std::string& text) {
    write_line(json{{"type", "sample"}, {"step", step}, {"text", text}}.dump(-1, ' ', false,
                                                                           json::error_handler_t::replace));
}

void MetricsLog::log_event(const std::string& json_object) { write_line(json_object); }

void MetricsLog::log_diverged(int step, double loss, double grad_norm) {
    std::string why;
    if (!std::isfinite(loss)) why = "loss " + format_value(loss);
    if (!std::isfinite(grad_norm)) why += std::string(why.empty() ? "" : ", ") + "grad_norm " + format_value(grad_norm);
    write_line(
        json{{"type", "diverged"}, {"step", step}, {"loss", loss}, {"grad_norm", grad_norm}, {"why", why}}.dump());
}

void MetricsLog::log_stopped(int step, int total_steps, const std::string& why,
                             const std::optional<std::string>& checkpoint) {
    json j{{"type", "stopped"}, {"step", step}, {"steps", total_steps}, {"why", why}, {"checkpoint", nullptr}};
    if (checkpoint) j["checkpoint"] = *checkpoint;
    write_line(j.dump());
}

std::string format_value(double x) {
    if (std::isnan(x)) return "nan";  // not "-nan"
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", x);
    return text;
}

std::string format_duration(double s) {
    char buf[32];
    const long long t = static_cast<long long>(s + 0.5);
    if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t % 3600 / 60);
    else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
    else std::snprintf(buf, sizeof buf, "%llds", t);
    return buf;
}

std::string format_bytes(double b) {
    char buf[32];
    if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
    else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
    else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f B", b);
    return buf;
}

double known_peak_bf16_tflops(std::string_view name) {
    const auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
    // CUDA's names: "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe" (both 312); "NVIDIA H100 80GB HBM3" (SXM),
    // "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA GH200 480GB". The NVL parts run at other clocks: not listed.
    if (has("NVL")) return 0.0;
    if (has("A100")) return 312.0;
    if (has("H100")) return has("PCIe") ? 756.0 : 989.4;
    if (has("H200")) return 989.4;
    return 0.0;
}

std::string format_progress(const StepMetrics& m) {
    const int width = static_cast<int>(std::to_string(m.total_steps).size());
    char mfu[32] = "";
    if (m.mfu) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", *m.mfu * 100.0);
    // a sharded step's traffic by link: inside the node and across nodes
    std::string sent = format_bytes(static_cast<double>(m.comm.bytes_sent));
    if (m.comm.bytes_sent_intra > 0)
        sent += " (intra " + format_bytes(static_cast<double>(m.comm.bytes_sent_intra)) + ", inter " +
                format_bytes(static_cast<double>(m.comm.bytes_sent_inter)) + ")";
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s%s | sent %s | ETA %s", width,
                  m.step, m.total_steps, m.loss, m.lr, m.grad_norm, m.step_seconds * 1e3, m.tokens_per_second, mfu,
                  sent.c_str(), format_duration(m.eta_seconds).c_str());
    std::string line = buf;
    if (m.optimizer.diagnostics > 0.0) {  // --demo_diagnostics: what the measurements cost this step
        std::snprintf(buf, sizeof buf, " | diagnostics %.1f ms", m.optimizer.diagnostics * 1e3);
        line += buf;
    }
    return line;
}

}  // namespace llmc
