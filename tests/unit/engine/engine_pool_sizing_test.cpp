// KV pool sizes from a memory budget (engine/pool_sizing.h) against their definition, checked
// here by search rather than by the closed form the code uses: on random budgets, page sizes,
// bytes per token and SWA ratios the pools' bytes ((pages + 1) · page · bytes per token each)
// fit the budget, one more full page would not, and the SWA pool holds floor(ratio · full)
// pages (or the fixed size given); budgets below one page of each pool are kResourceExhausted.
// kv_budget_from_fraction is SGLang's arithmetic: fraction · total − used − weights to load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/engine/pool_sizing.h"

namespace pagoda::engine {
namespace {

int64_t bytes_of(int64_t pages, int64_t page, int64_t per_token) {
  return (pages + 1) * page * per_token;
}

/// The largest full pool (pages) whose pools fit, by binary search over the definition; -1
/// when none does.
int64_t largest_fitting(const PoolBudget& b) {
  const int64_t cap = (int64_t{1} << 30) / b.page_size - 1;
  auto fits = [&](int64_t f) {
    int64_t s = 0;
    if (b.swa_bytes_per_token > 0)
      s = b.swa_pool_tokens > 0 ? b.swa_pool_tokens / b.page_size
                                : static_cast<int64_t>(std::floor(b.swa_full_tokens_ratio *
                                                                  static_cast<double>(f)));
    return bytes_of(f, b.page_size, b.full_bytes_per_token) +
               (b.swa_bytes_per_token > 0 ? bytes_of(s, b.page_size, b.swa_bytes_per_token) : 0) <=
           b.budget_bytes;
  };
  int64_t lo = 0, hi = cap;  // fits(lo) is checked below; find the last f in [0, cap] that fits
  if (!fits(0)) return -1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}

TEST(PoolSizing, RandomBudgetsFillWholePagesAndRespectTheRatio) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int sized = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    SCOPED_TRACE(::testing::Message() << "case " << i);
    PoolBudget b;
    const int32_t pages[] = {1, 16, 64};
    b.page_size = pages[rng() % 3];
    b.budget_bytes = static_cast<int64_t>(std::exp2(10 + 26 * std::uniform_real_distribution<>(0, 1)(rng)));
    const bool swa = rng() % 2;
    const bool all_windowed = swa && rng() % 4 == 0;  // the full pool stores no layer
    b.full_bytes_per_token = all_windowed ? 0 : static_cast<int64_t>(1 + rng() % 200000);
    b.swa_bytes_per_token = swa ? static_cast<int64_t>(1 + rng() % 200000) : 0;
    b.swa_full_tokens_ratio = std::uniform_real_distribution<>(0.05, 1.0)(rng);
    if (swa && rng() % 3 == 0) b.swa_pool_tokens = b.page_size * static_cast<int64_t>(1 + rng() % 2000);
    try {
      const PoolSizes s = size_pools(b);
      ++sized;
      ASSERT_EQ(s.pool_tokens % b.page_size, 0);
      ASSERT_EQ(s.swa_pool_tokens % b.page_size, 0);
      const int64_t full = s.pool_tokens / b.page_size, swa_pages = s.swa_pool_tokens / b.page_size;
      ASSERT_GE(full, 1);
      if (!swa) {
        ASSERT_EQ(s.swa_pool_tokens, 0);
        ASSERT_EQ(full, largest_fitting(b));
        continue;
      }
      ASSERT_GE(swa_pages, 1);
      ASSERT_LE(swa_pages, full);
      ASSERT_LE(bytes_of(full, b.page_size, b.full_bytes_per_token) +
                    bytes_of(swa_pages, b.page_size, b.swa_bytes_per_token),
                b.budget_bytes);
      if (b.swa_pool_tokens > 0) {
        ASSERT_EQ(swa_pages, b.swa_pool_tokens / b.page_size);
      }
      if (all_windowed) {  // ids-only full pool: full = swa / ratio (capped)
        if (b.swa_pool_tokens == 0) {
          ASSERT_EQ(swa_pages, std::min(b.budget_bytes / (b.page_size * b.swa_bytes_per_token) - 1,
                                        (int64_t{1} << 30) / b.page_size - 1));
        }
        ASSERT_EQ(full, std::min<int64_t>(
                            static_cast<int64_t>(std::floor(static_cast<double>(swa_pages) /
                                                            b.swa_full_tokens_ratio)),
                            (int64_t{1} << 30) / b.page_size - 1));
      } else {
        ASSERT_EQ(full, largest_fitting(b));
        if (b.swa_pool_tokens == 0) {
          ASSERT_EQ(swa_pages, std::min(full, static_cast<int64_t>(std::floor(
                                                  b.swa_full_tokens_ratio * static_cast<double>(full)))));
        }
      }
    } catch (const Error& e) {
      ++refused;
      ASSERT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
      // Refused only when no pools of one page each fit (or a fixed SWA pool leaves too little).
      const int64_t f = all_windowed ? 1 : largest_fitting(b);
      if (b.swa_pool_tokens == 0 && !all_windowed) {
        ASSERT_TRUE(f < 1 || (swa && std::floor(b.swa_full_tokens_ratio * static_cast<double>(f)) < 1))
            << e.what();
      }
    }
  }
  std::printf("%d sized, %d refused\n", sized, refused);
  EXPECT_GT(sized, 1000);
  EXPECT_GT(refused, 10);
}

TEST(PoolSizing, BadInputsAreRefusedByName) {
  PoolBudget b{.budget_bytes = 1 << 30, .page_size = 16, .full_bytes_per_token = 4096};
  b.swa_bytes_per_token = 1024;
  b.swa_full_tokens_ratio = 1.5;
  try {
    size_pools(b);
    FAIL() << "a ratio above 1 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("swa_full_tokens_ratio"), std::string::npos) << e.what();
  }
  b.swa_full_tokens_ratio = 0.5;
  b.swa_pool_tokens = int64_t{1} << 29;  // 512 MiB of SWA KV in a 1 GiB budget: no room left
  EXPECT_THROW(size_pools(b), Error);
}

TEST(PoolSizing, FractionLeavesTheRestOfTheStaticShare) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    const int64_t total = int64_t{1} << (30 + rng() % 8);
    const int64_t free = static_cast<int64_t>(rng() % static_cast<uint64_t>(total + 1));
    const int64_t pending = static_cast<int64_t>(rng() % static_cast<uint64_t>(total / 4));
    const double f = std::uniform_real_distribution<>(0.01, 0.99)(rng);
    const double want = f * static_cast<double>(total) - static_cast<double>(total - free) -
                        static_cast<double>(pending);
    const platform::MemoryInfo m{.free_bytes = free, .total_bytes = total};
    if (want < 1) {
      try {
        kv_budget_from_fraction(m, f, pending);
        FAIL() << "no budget left, yet accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
        EXPECT_NE(std::string(e.what()).find("mem_fraction_static"), std::string::npos);
      }
      continue;
    }
    EXPECT_NEAR(static_cast<double>(kv_budget_from_fraction(m, f, pending)), want, 1.0);
  }
  for (double bad : {0.0, 1.0, -0.5, std::nan("")})
    EXPECT_THROW(kv_budget_from_fraction({.free_bytes = 1 << 20, .total_bytes = 1 << 30}, bad, 0),
                 Error);
}

}  // namespace
}  // namespace pagoda::engine
