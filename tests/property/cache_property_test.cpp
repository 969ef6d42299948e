// Property test: long random scheduler-like operation streams over the allocator, the request
// table and the prefix caches, checked against the model in cache_workload.h after every step.
// The seed comes from std::random_device unless PAGODA_TEST_SEED is set; it is always printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <fmt/format.h>

#include "cache_workload.h"
#include "test_seed.h"

namespace pagoda::testing {
namespace {

struct Case {
  int32_t page_size;
  int32_t num_pages;
  const char* policy;
  bool chunk_cache;
  int64_t steps;
};

class CacheProperty : public ::testing::TestWithParam<Case> {};

TEST_P(CacheProperty, RandomStreamMatchesModel) {
  const Case c = GetParam();
  const pagoda::testing::TestSeed seed(pagoda::testing::process_seed());  // one for every case
  std::printf("page_size %d, policy %s%s\n", c.page_size, c.policy,
              c.chunk_cache ? ", chunk cache" : "");
  // Each case derives its own stream from the seed, so one PAGODA_TEST_SEED replays every case.
  RandomChoices src(seed ^ (static_cast<uint64_t>(c.page_size) << 40) ^
                    std::hash<std::string>()(c.policy) ^ (c.chunk_cache ? 0x5A5Au : 0u));
  WorkloadConfig config{.page_size = c.page_size,
                        .num_pages = c.num_pages,
                        .max_reqs = 8,
                        .max_context_len = 12 * c.page_size + 96,
                        .policy = c.policy,
                        .chunk_cache = c.chunk_cache};
  CacheWorkload workload(config);
  try {
    for (int64_t i = 0; i < c.steps; ++i) workload.step(src);
    workload.drain();
  } catch (const WorkloadMismatch& e) {
    FAIL() << e.what();
  } catch (const std::exception& e) {
    FAIL() << "unexpected exception at step " << workload.steps() << ": " << e.what();
  }
  const auto& s = workload.stats();
  std::printf("  %lld steps, hit rate %.3f, evicted %lld tokens\n",
              static_cast<long long>(workload.steps()), s.hit_rate(),
              static_cast<long long>(s.evicted_tokens));
  if (!c.chunk_cache) {
    EXPECT_GT(s.matched_tokens, 0) << "the workload never hit the cache; it tests too little";
    EXPECT_GT(s.evicted_tokens, 0) << "the workload never evicted; it tests too little";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Streams, CacheProperty,
    ::testing::Values(Case{1, 160, "lru", false, 10000}, Case{4, 48, "lru", false, 10000},
                      Case{16, 24, "lfu", false, 10000}, Case{64, 20, "priority", false, 10000},
                      Case{4, 40, "fifo", false, 5000}, Case{16, 24, "lru", true, 3000}),
    [](const auto& info) {
      return fmt::format("P{}_{}{}", info.param.page_size, info.param.policy,
                         info.param.chunk_cache ? "_chunk" : "");
    });

}  // namespace
}  // namespace pagoda::testing
