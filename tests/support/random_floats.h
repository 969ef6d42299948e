#pragma once
/// Random test inputs: n floats drawn uniformly from [lo, hi) with `rng` (seed it from
/// test_seed.h so a failure can be replayed).

#include <cstddef>
#include <random>
#include <vector>

namespace pagoda::testing {

inline std::vector<float> uniform_floats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace pagoda::testing
