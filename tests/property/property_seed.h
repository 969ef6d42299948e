#pragma once
/// The base seed of a property test run: PAGODA_SEED when set (to replay a printed seed), else a
/// fresh one from std::random_device. The same value for the whole process; the caller prints it.

#include <cstdint>
#include <cstdlib>
#include <random>

namespace pagoda::testing {

inline uint64_t property_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("PAGODA_SEED")) return std::strtoull(env, nullptr, 10);
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) | rd();
  }();
  return seed;
}

}  // namespace pagoda::testing
