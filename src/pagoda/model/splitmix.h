#pragma once
/// SplitMix64: a tiny random generator that gives identical numbers on every platform (the std
/// distributions do not), for seeded random weights (weights.cpp, eagle_head.cpp).

#include <cmath>
#include <cstdint>
#include <vector>

namespace pagoda::model {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  /// Standard normal (Box-Muller).
  double normal() {
    const double u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// n normals of mean `mean` and standard deviation `sd`, as floats.
  std::vector<float> normals(int64_t n, double mean, double sd) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(mean + sd * normal());
    return v;
  }

 private:
  uint64_t state_;
};

}  // namespace pagoda::model
