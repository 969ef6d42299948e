/// FastDiv (kernels/cuda/fast_div.h), the launch-constant divider the sm90 prefill kernel's
/// schedule and row packing use, against the host's / and %: every dividend below 2^20 for the
/// divisors 1..72 (the GQA group sizes and kv head counts of common models), the dividends around
/// every multiple and power of two up to 2^31 - 1 for the divisors 1..4096, and random dividends
/// for random divisors up to 2^31 - 1. Header-only code: no GPU, no CUDA toolkit. Seed printed;
/// PAGODA_TEST_SEED replays it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/kernels/cuda/fast_div.h"
#include "test_seed.h"

namespace pagoda::kernels::cuda::detail {
namespace {

constexpr int kMaxInt = 2147483647;

/// Fails on the first dividend that div / mod / div_by get wrong (returns false then).
bool check(const FastDiv& f, int x) {
  const int q = x / f.d, r = x % f.d;
  EXPECT_EQ(f.div(x), q) << "d " << f.d << " x " << x << " (m " << f.m << ", l " << f.l << ")";
  EXPECT_EQ(f.mod(x), r) << "d " << f.d << " x " << x;
  EXPECT_EQ(div_by(x, f), q) << "d " << f.d << " x " << x;
  return f.div(x) == q && f.mod(x) == r;
}

TEST(FastDiv, EveryDividendBelow2To20ForSmallDivisors) {
  for (int d = 1; d <= 72; ++d) {
    const FastDiv f = FastDiv::make(d);
    EXPECT_EQ(divisor(f), d);
    for (int x = 0; x < (1 << 20); ++x) {
      if (f.div(x) != x / d || f.mod(x) != x % d) {
        ASSERT_TRUE(check(f, x));
      }
    }
  }
}

TEST(FastDiv, AroundMultiplesAndPowersOfTwo) {
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 30; ++k) {  // large powers of two and their neighbours
    for (int e = -1; e <= 1; ++e) divisors.push_back((1 << k) + e);
  }
  divisors.push_back(kMaxInt);
  for (const int d : divisors) {
    const FastDiv f = FastDiv::make(d);
    const int64_t dd = d;  // d + 1 overflows an int at d = 2^31 - 1
    std::vector<int64_t> xs = {0, 1, 2, dd - 1, dd, dd + 1, kMaxInt - 1, kMaxInt};
    for (int k = 1; k <= 31; ++k) {
      for (int e = -1; e <= 1; ++e) xs.push_back((int64_t(1) << k) + e);
    }
    // The last multiples of d below 2^31, where mulhi(x, m) + x is largest.
    const int64_t top = int64_t(kMaxInt) / d * d;
    for (int64_t j = 0; j < 4; ++j) {
      for (int e = -1; e <= 1; ++e) xs.push_back(top - j * d + e);
    }
    for (const int64_t x : xs) {
      if (x < 0 || x > kMaxInt) continue;
      ASSERT_TRUE(check(f, static_cast<int>(x)));
    }
  }
}

TEST(FastDiv, RandomDividendsAndDivisors) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  for (int c = 0; c < 20000; ++c) {
    // Divisors of every magnitude (log-uniform), dividends uniform in [0, 2^31).
    const int bits = 1 + static_cast<int>(rng() % 31);
    const int d = std::max(1, static_cast<int>(rng() & ((uint32_t(1) << bits) - 1)));
    const FastDiv f = FastDiv::make(d);
    for (int t = 0; t < 50; ++t) {
      const int x = static_cast<int>(rng() & 0x7fffffffu);
      ASSERT_TRUE(check(f, x));
    }
  }
}

}  // namespace
}  // namespace pagoda::kernels::cuda::detail
