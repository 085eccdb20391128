// The ranks' agreements on a step's batches: whether every rank loaded its own, and the wte rows that no rank's last
// micro-batch touches (AdamW-DDP's overlapped all-reduce starts their gradients early).
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "llmc/base/param_range.h"
#include "llmc/comm/transport.h"
#include "llmc/model/param_layout.h"

namespace llmc {

// The overlapped all-reduce's early embedding rows: the runs of wte rows (at most `max_runs`, the longest) that
// no rank's `inputs` (its step's last micro-batch) touch. Their gradients are final once the classifier's weight
// gradient is done (earlier micro-steps finished their encoder backward before it), so their all-reduce can
// travel during the rest of the backward instead of waiting for the encoder's. One host collective (the ranks' row
// bitmaps OR-ed), so every rank reports the same ranges.
std::vector<ParamRange> untouched_wte_ranges(Transport& transport, const ParamLayout& layout,
                                             std::span<const int> inputs, size_t max_runs);
// The ranks' agreement on the batches a step is about to queue, in one split OR whose latency passes while
// something else runs: whether every rank read them (a rank must not queue collectives its peers will not join)
// and, with `rows` (AdamW-DDP's overlapped all-reduce), untouched_wte_ranges of the last batch. train_gpt starts
// it for the step it queues ahead before the step before it runs its optimizer and finishes it after; the CPU
// trainer starts it before the last micro-step's forward and finishes it before its backward. Every rank starts
// and finishes it with the same `rows`; a rank that failed to load passes no inputs.
struct BatchAgreement {
    bool all_loaded = false;
    std::vector<ParamRange> wte_early;  // with `rows`, when all_loaded
};
void batch_agreement_start(Transport& transport, const ParamLayout& layout, bool loaded, bool rows,
                           std::span<const int> last_inputs);
BatchAgreement batch_agreement_finish(Transport& transport, const ParamLayout& layout, bool rows, size_t max_runs);

}  // namespace llmc
