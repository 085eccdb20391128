// The CPU DeMo optimizer (see demo_optimizer.h). compress() makes one parallel pass over the block rows of
// all tensors (n1 rows of a tensor: a row of chunks) and does everything for a block row while it is in
// cache: weight decay, momentum, DCT (small sgemms in the calling thread), top-k, quantization and error
// feedback; the DCT coefficients never go to memory. apply() is one parallel pass over all chunks.
#include "llmc/optim/demo/demo_optimizer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "llmc/optim/demo/plan_tables.h"
#include "llmc/optim/demo/state_format.h"
#include "llmc/base/error.h"

namespace demo {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }

size_t selection_bytes(const Selection& s) {
    return s.indices.capacity() * sizeof(uint32_t) + (s.values.capacity() + s.scales.capacity()) * sizeof(float);
}

// Integer key with the order of |v| (for non-NaN floats the bit pattern of |v| orders like its value).
inline uint32_t magnitude_key(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}


// Number of keys >= t: a branch-free loop the compiler vectorizes.
inline size_t count_at_least(const uint32_t* keys, size_t n, uint32_t t) {
    uint32_t c = 0;
    for (size_t i = 0; i < n; i++) c += keys[i] >= t ? 1u : 0u;
    return c;
}

}  // namespace

void select_topk(std::span<const float> values, size_t k, uint32_t* out, TopkScratch& s) {
    const size_t n = values.size();
    if (k >= n) {
        for (size_t i = 0; i < n; i++) out[i] = static_cast<uint32_t>(i);
        return;
    }
    s.keys.resize(n);
    uint32_t* keys = s.keys.data();
    uint32_t max_key = 0;
    for (size_t i = 0; i < n; i++) {
        keys[i] = magnitude_key(values[i]);
        max_key = std::max(max_key, keys[i]);
    }
    // Binary search over key values for a threshold `lo` that at least k keys reach but not many more:
    // each step is one vectorized counting pass (no data-dependent branches, no histogram stores), and
    // it stops once at most k + slack candidates remain (or the range is one key wide: ties).
    const size_t slack = std::max<size_t>(8, k / 2);
    uint32_t lo = 0, hi = max_key + 1;  // count(>= lo) >= k > count(>= hi)
    size_t at_lo = n;
    while (at_lo > k + slack && hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        const size_t c = count_at_least(keys, n, mid);
        if (c >= k) {
            lo = mid;
            at_lo = c;
        } else {
            hi = mid;
        }
    }
    // Collect the candidates in index order, skipping (vectorized) blocks of 16 without any.
    s.candidates.clear();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint32_t block_max = 0;
        for (size_t j = 0; j < 16; j++) block_max = std::max(block_max, keys[i + j]);
        if (block_max < lo) continue;
        for (size_t j = i; j < i + 16; j++)
            if (keys[j] >= lo) s.candidates.push_back(static_cast<uint32_t>(j));
    }
    for (; i < n; i++)
        if (keys[i] >= lo) s.candidates.push_back(static_cast<uint32_t>(i));
    // Strict total order: larger magnitude first, then lower index. The k smallest under it are the answer.
    auto before = [keys](uint32_t a, uint32_t b) { return keys[a] > keys[b] || (keys[a] == keys[b] && a < b); };
    if (s.candidates.size() > k)
        std::nth_element(s.candidates.begin(), s.candidates.begin() + static_cast<ptrdiff_t>(k),
                         s.candidates.end(), before);
    std::copy(s.candidates.begin(), s.candidates.begin() + static_cast<ptrdiff_t>(k), out);
    std::sort(out, out + k);
}

DemoOptimizer::DemoOptimizer(const llmc::OptimizerConfig& config, const llmc::ParamLayout& layout,
                             llmc::Transport& transport)
    : config_(config), transport_(transport) {
    validate_demo_options(config_);
    plan_ = cm::plan_for_layout(config_, layout, &decays_);
    init();
    if (config_.demo.diagnostics > 0)
        diagnostics_ = std::make_unique<DemoDiagnostics>(config_.demo.diagnostics, plan_, layout, bases_.kind());
}

DemoOptimizer::DemoOptimizer(const llmc::OptimizerConfig& config, ModelPlan plan, std::vector<uint8_t> decays,
                             llmc::Transport& transport)
    : config_(config), transport_(transport), plan_(std::move(plan)), decays_(std::move(decays)) {
    validate_demo_options(config_);
    LLMC_CHECK(decays_.size() == plan_.tensors.size(), "internal: DeMo shard plan and decay flags differ in count");
    init();
}

void DemoOptimizer::init() {
    format_.values = config_.demo.values;
    format_.indices = config_.demo.indices;
    check_wire_format(plan_, format_);
    bases_.set_kind(config_.demo.transform == llmc::DemoTransform::random     ? BasisKind::random
                    : config_.demo.transform == llmc::DemoTransform::identity ? BasisKind::identity
                                                                              : BasisKind::dct);

    for (size_t t = 0; t < plan_.tensors.size(); t++) {
        const TensorPlan& tp = plan_.tensors[t];
        bases_.ensure(tp.n1);
        bases_.ensure(tp.n2);
        for (size_t i = 0; i < tp.block_rows; i++) block_rows_.push_back({t, i});
        max_block_row_ = std::max(max_block_row_, tp.n1 * tp.cols);
        max_block_row_scratch_ = std::max(max_block_row_scratch_, block_row_scratch_elems(tp.cols, tp.n1));
    }
    momentum_.assign(plan_.num_params, 0.0f);
    selection_.resize(plan_);
}

size_t DemoOptimizer::state_bytes() const {
    return momentum_.size() * sizeof(float) + master_.size() * sizeof(float) + pending_.bucket.capacity() +
           bucket_.capacity() + selection_bytes(selection_) + gathered_.capacity();
}

void DemoOptimizer::check_buffers(size_t params, size_t grads, const char* what) const {
    LLMC_CHECK(params == momentum_.size() && grads == momentum_.size(),
               std::string("DeMo ") + what + ": buffers of " + std::to_string(params) + " / " +
                   std::to_string(grads) + " floats, the layout has " + std::to_string(momentum_.size()));
}

void DemoOptimizer::compress(std::span<float> params, std::span<const float> grads, float lr,
                             std::vector<std::byte>& bucket, llmc::StepTimings& timings, float grad_clip_scale) {
    check_buffers(params.size(), grads.size(), "compress");
    const llmc::DemoConfig& dc = config_.demo;
    // Factors are formed in double and rounded once, as the reference's Python floats are.
    const float wd_factor = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
    const bool apply_wd = config_.weight_decay != 0.0f;
    const float decay = dc.decay;
    const float grad_scale =
        dc.momentum == llmc::DemoMomentum::ema ? static_cast<float>(1.0 - static_cast<double>(dc.decay)) : lr;
    const float alpha = dc.feedback_alpha;
    float* p = params.data();
    float* delta = momentum_.data();
    const float* g = grads.data();

    // One pass per block row, while it is in cache: weight decay and momentum (transform), block DCT
    // (transform), per-chunk top-k and quantization (top-k), error feedback (transform). Each thread times
    // its phases; the loop's wall time is split between transform and top-k in proportion.
    const auto t0 = now();
    const int threads = omp_get_max_threads();
    std::vector<double> transform_seconds(static_cast<size_t>(threads), 0.0), topk_seconds(transform_seconds);
#pragma omp parallel
    {
        const size_t tid = static_cast<size_t>(omp_get_thread_num());
        std::vector<float> encoded(max_block_row_), block_scratch(max_block_row_scratch_), chunk(plan_.max_chunk_elems),
            decoded(plan_.max_chunk_elems);
        TopkScratch topk_scratch;
        SparseDecodeScratch decode_scratch;
        double transform_s = 0.0, topk_s = 0.0;
#pragma omp for schedule(dynamic, 1)
        for (size_t item = 0; item < block_rows_.size(); item++) {
            auto phase_start = now();
            const BlockRow& br = block_rows_[item];
            const TensorPlan& tp = plan_.tensors[br.tensor];
            const size_t begin = tp.offset + br.row * tp.n1 * tp.cols, count = tp.n1 * tp.cols;
            if (apply_wd && decays_[br.tensor])
                for (size_t i = begin; i < begin + count; i++) p[i] *= wd_factor;
            if (grad_clip_scale == 1.0f) {
                for (size_t i = begin; i < begin + count; i++) delta[i] = decay * delta[i] + grad_scale * g[i];
            } else {
                for (size_t i = begin; i < begin + count; i++)
                    delta[i] = decay * delta[i] + grad_scale * (g[i] * grad_clip_scale);
            }
            encode_block_row(delta + begin, encoded.data(), tp.cols, tp.n1, tp.n2, bases_, block_scratch.data());
            transform_s += seconds_since(phase_start);

            phase_start = now();
            const size_t first_chunk = br.row * tp.block_cols;
            for (size_t j = 0; j < tp.block_cols; j++) {
                const float* e = encoded.data() + j * tp.n2;
                for (size_t b = 0; b < tp.n1; b++)
                    std::memcpy(&chunk[b * tp.n2], e + b * tp.cols, tp.n2 * sizeof(float));
                const size_t c = first_chunk + j, s = tp.select_offset + c * tp.k;
                uint32_t* idx = selection_.indices.data() + s;
                float* val = selection_.values.data() + s;
                select_topk(std::span<const float>(chunk.data(), tp.chunk_elems), tp.k, idx, topk_scratch);
                for (size_t q = 0; q < tp.k; q++) val[q] = chunk[idx[q]];
                selection_.scales[tp.chunk_offset + c] = quantize_chunk(format_.values, val, tp.k);
            }
            topk_s += seconds_since(phase_start);

            // delta -= alpha * decode(the values as the receivers will see them)
            phase_start = now();
            if (capturing_) std::memcpy(diagnostics_->capture().data() + begin, delta + begin, count * sizeof(float));
            for (size_t j = 0; j < tp.block_cols; j++) {
                const size_t s = tp.select_offset + (first_chunk + j) * tp.k;
                decode_chunk_sparse(bases_.basis(tp.n1), tp.n1, bases_.basis(tp.n2), tp.n2,
                                    std::span<const uint32_t>(selection_.indices.data() + s, tp.k),
                                    std::span<const float>(selection_.values.data() + s, tp.k), decoded.data(),
                                    decode_scratch, bases_.symmetric());
                float* d = delta + begin + j * tp.n2;
                for (size_t b = 0; b < tp.n1; b++) {
                    float* row = d + b * tp.cols;
                    const float* dec = decoded.data() + b * tp.n2;
                    for (size_t n = 0; n < tp.n2; n++) row[n] -= alpha * dec[n];
                }
            }
            transform_s += seconds_since(phase_start);
        }
        transform_seconds[tid] = transform_s;
        topk_seconds[tid] = topk_s;
    }
    const double loop = seconds_since(t0);
    double transform_total = 0.0, topk_total = 0.0;
    for (int t = 0; t < threads; t++) {
        transform_total += transform_seconds[static_cast<size_t>(t)];
        topk_total += topk_seconds[static_cast<size_t>(t)];
    }
    const double busy = transform_total + topk_total;
    timings.transform += busy > 0.0 ? loop * transform_total / busy : loop;
    timings.topk += busy > 0.0 ? loop * topk_total / busy : 0.0;

    // ---- top-k: packing ----
    const auto t1 = now();
    encode_bucket(plan_, format_, selection_, bucket);
    timings.topk += seconds_since(t1);
}

void DemoOptimizer::apply(std::span<const std::byte> all_buckets, std::span<const size_t> offsets,
                          std::span<float> params, float lr, llmc::StepTimings& timings) {
    check_buffers(params.size(), params.size(), "apply");
    LLMC_CHECK(offsets.size() >= 2, "DeMo apply: need offsets for at least one rank");
    const size_t world = offsets.size() - 1;
    for (size_t r = 0; r < world; r++)
        LLMC_CHECK(offsets[r] <= offsets[r + 1] && offsets[r + 1] <= all_buckets.size(),
                   "DeMo apply: bucket offsets of rank " + std::to_string(r) + " out of range");
    const auto t0 = now();
    if (received_.size() < world) received_.resize(world);
    for (size_t r = 0; r < world; r++)
        decode_bucket(plan_, format_, all_buckets.subspan(offsets[r], offsets[r + 1] - offsets[r]), received_[r],
                      "DeMo bucket from rank " + std::to_string(r));

    const size_t max_elems = plan_.max_chunk_elems;
    const bool use_sign = config_.demo.sign;  // --demo_sign false: the decoded update itself
    float* p = params.data();
#pragma omp parallel
    {
        // Dense per-chunk accumulators, reset only where touched.
        std::vector<float> sum(max_elems), decoded(max_elems), mean;
        std::vector<uint32_t> count(max_elems, 0), touched;
        SparseDecodeScratch scratch;
#pragma omp for schedule(dynamic, 8)
        for (size_t gc = 0; gc < plan_.total_chunks; gc++) {
            const TensorPlan& tp = plan_.tensors[plan_.tensor_of_chunk(gc)];
            const size_t c = gc - tp.chunk_offset;
            const size_t s = tp.select_offset + c * tp.k;
            touched.clear();
            for (size_t r = 0; r < world; r++) {  // rank order: a fixed summation order
                const uint32_t* idx = received_[r].indices.data() + s;
                const float* val = received_[r].values.data() + s;
                for (size_t j = 0; j < tp.k; j++) {
                    const uint32_t i = idx[j];
                    if (count[i]++ == 0) {
                        touched.push_back(i);
                        sum[i] = val[j];
                    } else {
                        sum[i] += val[j];
                    }
                }
            }
            mean.resize(touched.size());
            for (size_t q = 0; q < touched.size(); q++) {
                const uint32_t i = touched[q];
                mean[q] = sum[i] / static_cast<float>(count[i]);
                count[i] = 0;
            }
            decode_chunk_sparse(bases_.basis(tp.n1), tp.n1, bases_.basis(tp.n2), tp.n2, touched, mean,
                                decoded.data(), scratch, bases_.symmetric());
            float* pc = p + tp.offset + (c / tp.block_cols) * tp.n1 * tp.cols + (c % tp.block_cols) * tp.n2;
            for (size_t b = 0; b < tp.n1; b++) {
                float* row = pc + b * tp.cols;
                const float* dec = decoded.data() + b * tp.n2;
                if (!use_sign) {
                    for (size_t n = 0; n < tp.n2; n++) row[n] -= lr * dec[n];
                    continue;
                }
                for (size_t n = 0; n < tp.n2; n++) {
                    const float sign = static_cast<float>((dec[n] > 0.0f) - (dec[n] < 0.0f));
                    row[n] -= lr * sign;
                }
            }
        }
    }
    timings.apply += seconds_since(t0);
}

llmc::StepResult DemoOptimizer::step(std::span<float> params, std::span<float> grads, float lr) {
    const auto t0 = now();
    const double norm = llmc::grad_norm(grads);
    const double clip_seconds = seconds_since(t0);
    llmc::StepResult result = step_with_norm(params, grads, lr, norm);
    result.seconds.clip += clip_seconds;
    return result;
}

llmc::StepResult DemoOptimizer::step_with_norm(std::span<float> params, std::span<float> grads, float lr,
                                               double norm) {
    llmc::StepResult result;
    auto t0 = now();
    // Clip the local gradient; the scaling itself is folded into compress's single pass over it.
    result.grad_norm = norm;
    const float scale = llmc::clip_scale(result.grad_norm, config_.grad_clip);
    result.seconds.clip = seconds_since(t0);
    const int64_t step = ++step_;  // 1-based, as the metrics count
    if (config_.demo.delay == 0) {
        capturing_ = diagnostics_ && diagnostics_->captures(step);
        if (capturing_) diagnostics_->prepare_capture(plan_.num_params);
        compress(params, grads, lr, bucket_, result.seconds, scale);
        t0 = now();
        transport_.allgather_bytes(bucket_, gathered_, offsets_, gather_sizes_);
        gather_sizes_ = llmc::next_gather_sizes(offsets_, bucket_.size());
        result.seconds.exchange = seconds_since(t0);
        apply(gathered_, offsets_, params, lr, result.seconds);
        if (capturing_) {
            t0 = now();
            diagnostics_->observe(step);
            if (diagnostics_->due(step))
                result.diagnostics = diagnostics_->report(
                    step, selection_, std::span<const Selection>(received_.data(), offsets_.size() - 1),
                    offsets_.size() - 1, momentum_, transport_);
            diagnostics_->keep_selection(step, selection_);
            capturing_ = false;
            result.seconds.diagnostics += seconds_since(t0);
        }
        return result;
    }
    // --demo_delay 1: the previous round's buckets travelled during this step's forward and backward
    if (eager() && master_.empty()) {
        LLMC_CHECK(!pending_.present, "DeMo: eager delayed updates need set_weights() after load_state()");
        master_.assign(params.begin(), params.end());  // a fresh start: the working weights are the shared ones
    }
    const std::span<float> shared = eager() ? std::span<float>(master_) : params;
    check_buffers(shared.size(), params.size(), "step");
    if (pending_.present) apply_pending_round(shared, result.seconds);
    compress(shared, grads, lr, pending_.bucket, result.seconds, scale);
    pending_.present = true;
    pending_.lr = lr;
    t0 = now();
    transport_.allgather_bytes_start(pending_.bucket, gather_sizes_);
    pending_in_flight_ = true;
    result.seconds.exchange += seconds_since(t0);
    if (eager()) write_working_weights(params, result.seconds);  // while the all-gather runs
    return result;
}

void DemoOptimizer::finish_updates(std::span<float> params, llmc::StepResult& result) {
    if (!pending_.present) return;
    LLMC_CHECK(!eager() || !master_.empty(), "DeMo: eager delayed updates need set_weights() after load_state()");
    const std::span<float> shared = eager() ? std::span<float>(master_) : params;
    check_buffers(shared.size(), params.size(), "finish_updates");
    apply_pending_round(shared, result.seconds);
    pending_.present = false;
    if (eager()) write_working_weights(params, result.seconds);  // no round left: a copy of the shared weights
}

void DemoOptimizer::apply_pending_round(std::span<float> shared, llmc::StepTimings& timings) {
    const auto t0 = now();
    if (!pending_in_flight_) transport_.allgather_bytes_start(pending_.bucket, gather_sizes_);  // load_state's round
    transport_.allgather_bytes_finish(gathered_, offsets_);
    gather_sizes_ = llmc::next_gather_sizes(offsets_, pending_.bucket.size());
    pending_in_flight_ = false;
    timings.exchange += seconds_since(t0);
    apply(gathered_, offsets_, shared, pending_.lr, timings);
}

void DemoOptimizer::write_working_weights(std::span<float> params, llmc::StepTimings& timings) {
    std::copy(master_.begin(), master_.end(), params.begin());
    if (!pending_.present) return;
    const size_t own[2] = {0, pending_.bucket.size()};
    apply(pending_.bucket, own, params, pending_.lr, timings);
}

void DemoOptimizer::set_weights(std::span<float> params) {
    if (!eager()) return;
    check_buffers(params.size(), params.size(), "set_weights");
    master_.assign(params.begin(), params.end());
    llmc::StepTimings unused;
    write_working_weights(params, unused);
}

std::span<float> DemoOptimizer::master_weights(std::span<float> params) {
    return eager() && !master_.empty() ? std::span<float>(master_) : params;
}

// The state blob is written and read by the same functions the CUDA optimizer uses (state_format.h), so
// checkpoints move between the trainers. A pending round is saved as this rank's bucket: the resumed run
// exchanges it again.
void DemoOptimizer::save_state(llmc::ByteWriter& out) const {
    cm::write_state(out, plan_, momentum_, cm::MomentumDomain::spatial, pending_);
}

void DemoOptimizer::load_state(llmc::ByteReader& in) {
    cm::read_state(in, plan_, momentum_, cm::MomentumDomain::spatial, pending_, config_.demo.delay == 1, bucket_bytes());
    pending_in_flight_ = false;
    master_.clear();  // set_weights() brings the checkpoint's weights
}

}  // namespace demo
