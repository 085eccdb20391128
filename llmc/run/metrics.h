// Per-step metrics: one JSON object per line in <out_dir>/metrics.jsonl (train steps, validation, samples)
// and the human progress line. Only rank 0 writes; the file is flushed every line so a crashed run keeps
// everything up to its last step. On resume the file is truncated back to the resumed step, so the log
// never holds two different histories.
#pragma once
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "llmc/optim/optimizer.h"
#include "llmc/comm/transport.h"

namespace llmc {

struct StepMetrics {
    int step = 0;            // 1-based number of completed optimizer steps
    int total_steps = 0;
    double loss = 0.0;       // mean over ranks and micro-steps
    double lr = 0.0;
    double grad_norm = 0.0;
    double step_seconds = 0.0;     // wall time of the whole step
    double compute_seconds = 0.0;  // forward + backward (+ local optimizer math)
    double comm_seconds = 0.0;     // waiting inside collectives
    double tokens_per_second = 0.0;  // over all ranks
    double model_tflops = 0.0;       // model flops per second of one rank (ModelFlops::per_token), in TFLOP/s
    std::optional<double> mfu;       // model_tflops over the rank's peak, when the peak is known
    long long tokens = 0;          // cumulative tokens over all ranks
    CommCounters comm;             // this step's counters (this rank)
    long long cumulative_bytes_sent = 0;
    StepTimings optimizer;
    double eta_seconds = 0.0;
    std::string diagnostics;  // StepResult::diagnostics: a line written after the step's
};

// <out_dir>/metrics.jsonl: where MetricsLog writes a run's lines.
std::string metrics_path(const std::string& out_dir);

class MetricsLog {
public:
    // Opens <out_dir>/metrics.jsonl for appending; when resume_step >= 0, first drops lines with step > it.
    MetricsLog(const std::string& out_dir, int resume_step);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    void log_step(const StepMetrics& m);
    void log_val(int step, double val_loss, long long tokens);
    void log_choices(int step, double acc, double acc_norm, long long examples, long long cropped, long long tokens);
    void log_sample(int step, const std::string& text);
    void log_event(const std::string& json_object);  // a complete JSON object line
    // {"type":"diverged","step":N,"loss":...,"grad_norm":...,"why":"loss nan"}: the step whose averages were not
    // finite (JSON has no NaN or infinity: those values are null, "why" names them)
    void log_diverged(int step, double loss, double grad_norm);
    // {"type":"stopped","step":N,"steps":M,"why":"SIGTERM","checkpoint":"<dir>" or null}: a stop signal or the
    // time limit ended the run after step N of M (finish_stopped_run); a reader of the metrics sees why
    void log_stopped(int step, int total_steps, const std::string& why, const std::optional<std::string>& checkpoint);

private:
    void write_line(const std::string& line);
    std::string path_;
    FILE* f_ = nullptr;
};

// Model flops utilization as llm.c estimates it: `per_token` flops of a training step per token (forward and
// backward; model_flops_per_token), against each rank's `peak_tflops` (0: unknown, no MFU).
struct ModelFlops {
    double per_token = 0.0;
    double peak_tflops = 0.0;
};
// The dense bf16 tensor-core peak (TFLOP/s, NVIDIA's datasheet figure) of a GPU by its CUDA device name, for the
// GPUs this trainer targets: A100 312, H100 SXM and H200 989.4, H100 PCIe 756; 0 for any other name.
double known_peak_bf16_tflops(std::string_view device_name);

std::string format_progress(const StepMetrics& m);
std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"
std::string format_bytes(double bytes);       // "12.3 MB"
std::string format_value(double x);           // "%.6g": "0.8123", "nan", "inf"

}  // namespace llmc
