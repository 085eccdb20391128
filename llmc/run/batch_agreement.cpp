// The ranks' agreements on a step's batches (see batch_agreement.h).
#include "llmc/run/batch_agreement.h"


namespace llmc {

std::vector<ParamRange> untouched_wte_ranges(Transport& transport, const ParamLayout& layout,
                                             std::span<const int> inputs, size_t max_runs) {
    std::vector<uint64_t> touched = token_row_bitmap(inputs, static_cast<size_t>(layout.config.padded_vocab_size));
    transport.allreduce_or(touched);
    return layout.untouched_wte_rows(touched, max_runs);
}

// The agreement's bitmap: word 0 has bit 0 set by a rank that failed to load; with `rows`, the row bitmap follows.
void batch_agreement_start(Transport& transport, const ParamLayout& layout, bool loaded, bool rows,
                           std::span<const int> last_inputs) {
    std::vector<uint64_t> bits = {loaded ? uint64_t{0} : uint64_t{1}};
    if (rows) {
        const auto touched = token_row_bitmap(loaded ? last_inputs : std::span<const int>(),
                                              static_cast<size_t>(layout.config.padded_vocab_size));
        bits.insert(bits.end(), touched.begin(), touched.end());
    }
    transport.allreduce_or_start(bits);
}

BatchAgreement batch_agreement_finish(Transport& transport, const ParamLayout& layout, bool rows, size_t max_runs) {
    const size_t row_words = rows ? token_row_words(static_cast<size_t>(layout.config.padded_vocab_size)) : 0;
    std::vector<uint64_t> bits(1 + row_words);
    transport.allreduce_or_finish(bits);
    BatchAgreement agreed;
    agreed.all_loaded = bits[0] == 0;
    if (rows && agreed.all_loaded)
        agreed.wte_early = layout.untouched_wte_rows(std::span<const uint64_t>(bits).subspan(1), max_runs);
    return agreed;
}

}  // namespace llmc
