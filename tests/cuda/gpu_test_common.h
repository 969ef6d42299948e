#pragma once
// Shared by the GPU test binaries: whether a CUDA device exists, the skip macro (a skipped case
// fails its ctest, tests/cuda/CMakeLists.txt), and the seed override PAGODA_TEST_SEED.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

namespace pagoda::gpu_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// PAGODA_TEST_SEED when set (to re-run a printed seed), else `fallback`.
inline uint64_t test_seed(uint64_t fallback) {
  if (const char* s = std::getenv("PAGODA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return fallback;
}

}  // namespace pagoda::gpu_test

#define PAGODA_REQUIRE_GPU()                                                         \
  do {                                                                               \
    if (!::pagoda::gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device";            \
  } while (0)
