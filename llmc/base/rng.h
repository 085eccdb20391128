// Seeded random numbers with state that can be saved and restored exactly (xoshiro256** seeded through
// splitmix64; normals by Box-Muller in double). Used for weight init, data shuffling and sampling, each with
// its own instance, so nothing depends on global state or on the standard library's distributions.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace llmc {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }

    void reseed(uint64_t seed) {
        uint64_t x = seed;
        for (auto& s : state_) {
            x += 0x9E3779B97F4A7C15ull;  // splitmix64
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s = z ^ (z >> 31);
        }
    }

    uint64_t next_u64() {
        const uint64_t result = rotl(state_[1] * 5, 7) * 9;
        const uint64_t t = state_[1] << 17;
        state_[2] ^= state_[0];
        state_[3] ^= state_[1];
        state_[1] ^= state_[2];
        state_[0] ^= state_[3];
        state_[2] ^= t;
        state_[3] = rotl(state_[3], 45);
        return result;
    }

    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)

    // Uniform integer in [0, n), n > 0, without modulo bias.
    uint64_t below(uint64_t n) {
        const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t r;
        do r = next_u64(); while (r >= limit);
        return r % n;
    }

    double normal() {
        double u1;
        do u1 = uniform(); while (u1 <= 0.0);
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

    std::array<uint64_t, 4> state() const { return state_; }
    void set_state(const std::array<uint64_t, 4>& s) { state_ = s; }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<uint64_t, 4> state_{};
};

}  // namespace llmc
