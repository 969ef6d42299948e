#pragma once
// Shared by the GPU test binaries: whether a CUDA device exists, the skip macro, and the seed
// override PAGODA_TEST_SEED.
//
// A GPU test never passes by skipping: under ctest a skipped case fails its test
// (FAIL_REGULAR_EXPRESSION in tests/cuda/CMakeLists.txt), and with PAGODA_REQUIRE_GPU=1 in the
// environment PAGODA_SKIP_GPU_TEST turns the skip itself into a failure (binaries run by hand,
// bench/device/run.sh).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pagoda::gpu_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// True when PAGODA_REQUIRE_GPU is set to anything but "" or "0".
inline bool gpu_required() {
  const char* s = std::getenv("PAGODA_REQUIRE_GPU");
  return s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0;
}

/// PAGODA_TEST_SEED when set (to re-run a printed seed), else `fallback`.
inline uint64_t test_seed(uint64_t fallback) {
  if (const char* s = std::getenv("PAGODA_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return fallback;
}

}  // namespace pagoda::gpu_test

/// Skips the current test with `reason`, or fails it when PAGODA_REQUIRE_GPU=1.
#define PAGODA_SKIP_GPU_TEST(reason)                                                     \
  do {                                                                                   \
    if (::pagoda::gpu_test::gpu_required()) {                                            \
      GTEST_FAIL() << (reason) << " (PAGODA_REQUIRE_GPU=1 turns this skip into a failure)"; \
    }                                                                                    \
    GTEST_SKIP() << (reason);                                                            \
  } while (0)

#define PAGODA_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (!::pagoda::gpu_test::have_gpu()) PAGODA_SKIP_GPU_TEST("no CUDA device");      \
  } while (0)
