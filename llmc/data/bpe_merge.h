// The parts of byte-level BPE that do not depend on where the vocabulary came from: a hash for short byte
// strings, the (left, right) -> (rank, merged) pair table, the rank-ordered merge loop (lowest rank first,
// leftmost on ties, as both tiktoken and Hugging Face's tokenizers merge), and a word cache in flat arenas.
// Shared by GPT-2's encoder (bpe.cpp) and the Hugging Face tokenizer.json encoder (hf_tokenizer.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llmc::bpe {

// A fast 64-bit hash for short byte strings (words, tokens): 8 bytes per multiply, strong enough final mix for
// power-of-two tables.
inline uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t word;
        std::memcpy(&word, s.data() + i, 8);
        h = (h ^ word) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    h = (h ^ tail) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

// bytes -> id over a table of token bytes that its owner keeps, by open addressing over ids, so the keys are the
// table's strings themselves; the ids for which skip(id) holds are left out.
class TokenIndex {
public:
    template <class Skip>
    void build(const std::vector<std::string>& token_bytes, Skip skip) {
        size_t capacity = 1024;
        while (capacity < 2 * token_bytes.size()) capacity *= 2;
        slots_.assign(capacity, -1);
        mask_ = capacity - 1;
        for (size_t id = 0; id < token_bytes.size(); id++) {
            if (skip(id)) continue;
            size_t at = hash_bytes(token_bytes[id]) & mask_;
            while (slots_[at] >= 0) at = (at + 1) & mask_;
            slots_[at] = static_cast<int32_t>(id);
        }
    }
    // The id of `bytes`, or -1; `token_bytes` is the table given to build().
    int find(const std::vector<std::string>& token_bytes, std::string_view bytes) const {
        for (size_t at = hash_bytes(bytes) & mask_;; at = (at + 1) & mask_) {
            const int32_t id = slots_[at];
            if (id < 0 || token_bytes[id] == bytes) return id;
        }
    }

private:
    std::vector<int32_t> slots_;
    uint64_t mask_ = 0;
};

// The first `limit` bytes of `s` for an error message, control bytes as \xHH (UTF-8 stays readable).
inline std::string printable(std::string_view s, size_t limit = 60) {
    std::string out;
    for (unsigned char c : s.substr(0, limit)) {
        if (c >= 0x20 && c != 0x7F) {
            out += static_cast<char>(c);
        } else {
            static constexpr char kHex[] = "0123456789ABCDEF";
            out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
        }
    }
    return out;
}

// GPT-2's reversible byte -> printable code point map (bytes_to_unicode in OpenAI's encoder.py), which spells
// every byte-level vocabulary: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
inline std::array<char32_t, 256> byte_to_unicode() {
    std::array<char32_t, 256> table{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; b++) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; b++) table[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return table;
}

// (left id, right id) -> the merge's rank and the id it makes, by open addressing.
class PairTable {
public:
    struct Slot {
        uint64_t key = kEmpty;
        int32_t merged = -1;
        int32_t rank = 0;
    };

    void reserve(size_t pairs) {
        size_t capacity = 1024;
        while (capacity < 2 * pairs) capacity *= 2;
        slots_.assign(capacity, Slot{});
        mask_ = capacity - 1;
    }
    // Adds or, when the pair is already there, replaces it (a later duplicate wins, as in Hugging Face's loader).
    void set(int left, int right, int merged, int rank) {
        const uint64_t key = pair_key(left, right);
        for (size_t at = pair_hash(key) & mask_;; at = (at + 1) & mask_) {
            Slot& slot = slots_[at];
            if (slot.key == key || slot.key == kEmpty) {
                slot = {key, merged, rank};
                return;
            }
        }
    }
    // The slot for (left, right), or nullptr when they do not merge.
    const Slot* find(int left, int right) const {
        const uint64_t key = pair_key(left, right);
        for (size_t at = pair_hash(key) & mask_;; at = (at + 1) & mask_) {
            const Slot& slot = slots_[at];
            if (slot.key == key) return &slot;
            if (slot.key == kEmpty) return nullptr;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    static uint64_t pair_key(int left, int right) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    }
    static size_t pair_hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20); }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
};

// Merges `ids` in place: repeatedly the adjacent pair of lowest rank, leftmost on ties. Short words (nearly all)
// use flat arrays; long pieces (base64 blobs, long runs of symbols) a heap with lazily invalidated entries, so a
// pathological input costs O(n log n), not O(n^2).
inline void merge(const PairTable& pairs, std::vector<int>& ids) {
    constexpr size_t kShortWord = 96;
    constexpr int32_t kNoRank = INT32_MAX;
    size_t n = ids.size();
    if (n <= kShortWord) {
        std::array<int32_t, kShortWord> rank;
        std::array<int32_t, kShortWord> merged;
        auto set_pair = [&](size_t i) {
            const PairTable::Slot* slot = pairs.find(ids[i], ids[i + 1]);
            rank[i] = slot ? slot->rank : kNoRank;
            merged[i] = slot ? slot->merged : -1;
        };
        for (size_t i = 0; i + 1 < n; i++) set_pair(i);
        while (n > 1) {
            size_t best = 0;
            for (size_t i = 1; i + 1 < n; i++)
                if (rank[i] < rank[best]) best = i;
            if (rank[best] == kNoRank) break;
            ids[best] = merged[best];
            // Pairs right of the merge shift left by one; the two pairs touching the new token are recomputed.
            for (size_t i = best + 1; i + 1 < n; i++) {
                ids[i] = ids[i + 1];
                if (i + 2 < n) {
                    rank[i] = rank[i + 1];
                    merged[i] = merged[i + 1];
                }
            }
            n--;
            if (best + 1 < n) set_pair(best);
            if (best > 0) set_pair(best - 1);
        }
        ids.resize(n);
        return;
    }
    struct Candidate {
        int32_t rank;
        uint32_t left, right;
        int32_t merged;
        bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::vector<uint32_t> next(n), prev(n);
    std::vector<bool> alive(n, true);
    const uint32_t kNone = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? static_cast<uint32_t>(i + 1) : kNone;
        prev[i] = i > 0 ? static_cast<uint32_t>(i - 1) : kNone;
    }
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](uint32_t left) {
        if (left == kNone || next[left] == kNone) return;
        const PairTable::Slot* slot = pairs.find(ids[left], ids[next[left]]);
        if (slot) heap.push({slot->rank, left, next[left], slot->merged});
    };
    for (size_t i = 0; i + 1 < n; i++) push(static_cast<uint32_t>(i));
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        if (!alive[c.left] || next[c.left] != c.right) continue;
        const PairTable::Slot* slot = pairs.find(ids[c.left], ids[c.right]);
        if (!slot || slot->merged != c.merged) continue;  // stale: one side changed since this was pushed
        ids[c.left] = c.merged;
        alive[c.right] = false;
        next[c.left] = next[c.right];
        if (next[c.right] != kNone) prev[next[c.right]] = c.left;
        push(prev[c.left]);
        push(c.left);
    }
    size_t out = 0;
    for (uint32_t i = 0; i != kNone; i = next[i]) ids[out++] = ids[i];
    ids.resize(out);
}

// Piece bytes -> tokens. A slot is one 64-byte cache line holding the hash, a key of up to kInlineKey bytes and up
// to kInlineTokens ids, so a hit on a common word costs one hash and one cache line; longer keys and token lists
// live in flat arenas. Memory is bounded by starting over once the arenas pass kMaxArenaBytes.
class WordCache {
public:
    static constexpr size_t kMaxWordBytes = 64;  // longer pieces are rare; caching them would only churn memory
    static constexpr size_t kMaxArenaBytes = 64u << 20;

    WordCache() { reset(1u << 14); }

    // The cached tokens of `word` (empty when absent: pieces are never empty, so neither are their tokens).
    // Valid until the next call.
    std::span<const int> find(std::string_view word, uint64_t hash) {
        Front& front = front_[(hash >> 40) & (kFrontSize - 1)];
        if (front.key_length == word.size() && front.hash == static_cast<uint32_t>(hash) &&
            std::memcmp(front.key, word.data(), word.size()) == 0)
            return {front.tokens, front.token_count};
        for (size_t at = hash & mask_;; at = (at + 1) & mask_) {
            const Slot& slot = slots_[at];
            if (slot.key_length == 0) return {};
            if (slot.hash == hash && slot.key_length == word.size() && key_equals(slot, word)) {
                const std::span<const int> tokens{
                    slot.token_count <= kInlineTokens ? slot.tokens : tokens_.data() + slot.token_offset,
                    slot.token_count};
                remember(word, hash, tokens);
                return tokens;
            }
        }
    }

    void insert(std::string_view word, uint64_t hash, std::span<const int> tokens) {
        if (word.empty() || word.size() > kMaxWordBytes || tokens.empty() || tokens.size() > 255) return;
        if (keys_.size() + tokens_.size() * sizeof(int) > kMaxArenaBytes) reset(slots_.size());
        if (2 * (used_ + 1) > slots_.size()) grow();
        Slot slot{};
        slot.hash = hash;
        slot.key_length = static_cast<uint8_t>(word.size());
        slot.token_count = static_cast<uint8_t>(tokens.size());
        if (word.size() <= kInlineKey) {
            std::memcpy(slot.key, word.data(), word.size());
        } else {
            const uint32_t offset = static_cast<uint32_t>(keys_.size());
            std::memcpy(slot.key, &offset, sizeof offset);
            keys_.append(word);
        }
        if (tokens.size() <= kInlineTokens) {
            std::copy(tokens.begin(), tokens.end(), slot.tokens);
        } else {
            slot.token_offset = static_cast<uint32_t>(tokens_.size());
            tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
        }
        place(slot);
        used_++;
        remember(word, hash, tokens);
    }

    size_t size() const { return used_; }

private:
    // A direct-mapped front of short, frequent words (512 KB, so it stays in L2): in prose most pieces hit here
    // and never touch the main table, whose slots are cache misses once it holds tens of thousands of words.
    static constexpr size_t kFrontSize = 16384;
    struct Front {
        uint32_t hash = 0;
        uint8_t key_length = 0;  // 0: empty
        uint8_t token_count = 0;
        int tokens[2];
        char key[16];
    };
    static_assert(sizeof(Front) == 32);
    void remember(std::string_view word, uint64_t hash, std::span<const int> tokens) {
        if (word.size() > sizeof(Front::key) || tokens.size() > 2) return;
        Front& front = front_[(hash >> 40) & (kFrontSize - 1)];
        front.hash = static_cast<uint32_t>(hash);
        front.key_length = static_cast<uint8_t>(word.size());
        front.token_count = static_cast<uint8_t>(tokens.size());
        std::copy(tokens.begin(), tokens.end(), front.tokens);
        std::memcpy(front.key, word.data(), word.size());
    }

    static constexpr size_t kInlineTokens = 3;
    static constexpr size_t kInlineKey = 36;
    struct alignas(64) Slot {
        uint64_t hash;
        uint8_t key_length;  // 0 marks an empty slot (pieces are never empty)
        uint8_t token_count;
        uint32_t token_offset;  // into tokens_ when token_count > kInlineTokens
        int tokens[kInlineTokens];
        char key[kInlineKey];   // the key, or its uint32 offset into keys_ when longer than kInlineKey
    };
    static_assert(sizeof(Slot) == 64);

    bool key_equals(const Slot& slot, std::string_view word) const {
        if (word.size() <= kInlineKey) return std::memcmp(slot.key, word.data(), word.size()) == 0;
        uint32_t offset;
        std::memcpy(&offset, slot.key, sizeof offset);
        return std::memcmp(keys_.data() + offset, word.data(), word.size()) == 0;
    }
    void reset(size_t capacity) {
        front_.assign(kFrontSize, Front{});
        slots_.assign(capacity, Slot{});
        mask_ = capacity - 1;
        keys_.clear();
        tokens_.clear();
        used_ = 0;
    }
    void place(const Slot& slot) {
        size_t at = slot.hash & mask_;
        while (slots_[at].key_length != 0) at = (at + 1) & mask_;
        slots_[at] = slot;
    }
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        slots_.assign(old.size() * 2, Slot{});
        mask_ = slots_.size() - 1;
        for (const Slot& slot : old)
            if (slot.key_length != 0) place(slot);
    }

    std::vector<Front> front_;
    std::vector<Slot> slots_;
    size_t mask_ = 0, used_ = 0;
    std::string keys_;
    std::vector<int> tokens_;
};

}  // namespace llmc::bpe
