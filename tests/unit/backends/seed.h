#pragma once
/// The random seed of a host test: PAGODA_TEST_SEED when set (to re-run a printed seed), else a
/// fresh one. The caller prints it.

#include <cstdint>
#include <cstdlib>
#include <random>

namespace pagoda::test {

inline uint32_t test_seed() {
  if (const char* env = std::getenv("PAGODA_TEST_SEED")) {
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  return std::random_device{}();
}

}  // namespace pagoda::test
