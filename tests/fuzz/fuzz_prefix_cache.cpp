// libFuzzer target: the property test's scheduler-like operation stream (tests/property/
// cache_workload.h), with every choice taken from the fuzz input. The first two bytes pick the
// page size, the eviction policy and the cache kind. Any model mismatch, failed invariant check,
// unexpected pagoda::Error or sanitizer report is a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cache_workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagoda::testing;
  if (size < 2) return 0;
  static constexpr int32_t kPageSizes[] = {1, 4, 16, 64};
  static constexpr int32_t kPages[] = {96, 40, 20, 12};
  static const char* const kPolicies[] = {"lru", "lfu", "fifo", "priority"};
  const int ps = data[0] % 4;
  WorkloadConfig config{.page_size = kPageSizes[ps],
                        .num_pages = kPages[ps],
                        .max_reqs = 6,
                        .max_context_len = 12 * kPageSizes[ps] + 96,
                        .policy = kPolicies[data[1] % 4],
                        .chunk_cache = (data[0] & 0x40) != 0};
  ByteChoices src(data + 2, size - 2);
  CacheWorkload workload(config);
  try {
    while (!src.exhausted() && workload.steps() < 4000) workload.step(src);
    workload.drain();
  } catch (const WorkloadMismatch& e) {
    std::fprintf(stderr, "fuzz_prefix_cache: %s\n", e.what());
    std::abort();
  }
  return 0;
}
