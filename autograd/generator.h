#pragma once
/// \file
/// A seedable, counter-based random generator. Element i of a random fill is a
/// pure function of (seed, offset + i), so the same seed gives the same numbers
/// on every run and at every thread count, and fills can run in parallel.
#include <cstdint>

namespace tg {

/// Random numbers as a pure function of (seed, counter); the state is
/// (seed, offset), the next unused counter.
class Generator {
 public:
  /// A generator at offset 0 of `seed`.
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}
  /// Restarts at offset 0 of `seed`.
  void manual_seed(uint64_t seed) { seed_ = seed; offset_ = 0; }
  /// The seed.
  uint64_t seed() const { return seed_; }
  /// The next unused counter. The state is (seed, offset): saving both lets
  /// training resume exactly.
  uint64_t offset() const { return offset_; }
  /// Restores a state saved from seed() and offset().
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }

  /// Reserves n draws; returns the first counter, to be passed to bits().
  uint64_t reserve(uint64_t n) { uint64_t o = offset_; offset_ += n; return o; }
  /// 64 random bits for counter c (SplitMix64 finaliser of seed and c).
  uint64_t bits(uint64_t c) const {
    uint64_t z = seed_ * 0x9e3779b97f4a7c15ULL + c * 0xbf58476d1ce4e5b9ULL + 0x94d049bb133111ebULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ULL;  // second round: seeds that differ by 1 decorrelate
    return z ^ (z >> 32);
  }
  /// Uniform double in [0, 1) for counter c (53 random bits).
  double uniform_at(uint64_t c) const { return static_cast<double>(bits(c) >> 11) * 0x1.0p-53; }

  /// 64 random bits from the next counter.
  uint64_t next_u64() { return bits(reserve(1)); }
  /// Uniform double in [0, 1) from the next counter.
  double uniform() { return uniform_at(reserve(1)); }
  double normal();                                    ///< standard normal (Box-Muller)
  int64_t randint(int64_t low, int64_t high);         ///< uniform in [low, high)

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The generator used when none is passed (seed it with manual_seed).
Generator& default_generator();
/// Seeds default_generator() (restarting it at offset 0).
void manual_seed(uint64_t seed);

}  // namespace tg
