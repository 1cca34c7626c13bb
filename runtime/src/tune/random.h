#pragma once

// The tuner's random numbers: splitmix64, whose values are the same on every
// platform and standard library (std::uniform_real_distribution's are not),
// so that a seed makes the same trials everywhere. Its state is one integer,
// kept in the experiment's record.

#include <cstdint>

namespace trainrun::tune {

class Random {
 public:
  explicit Random(uint64_t state) : state_(state) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1), from 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n) { return next() % n; }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace trainrun::tune
