// swa_usable_prefix (the window-aware cut of a prefix match) against a brute-force oracle: the
// longest candidate prefix (the whole match, or a page boundary below it) whose last window of
// positions all still have SWA KV, checked position by position. Random matches over random
// kv::SwaPages states (some pages' window side released), page sizes 1-16, windows 0-70. The
// seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/cache/swa_match.h"
#include "pagoda/core/error.h"
#include "test_seed.h"

namespace pagoda::cache {
namespace {

int64_t oracle(const std::vector<SlotIndex>& slots, const kv::SwaPages& pages, int window_left) {
  const int64_t n = static_cast<int64_t>(slots.size()), p = pages.page_size();
  for (int64_t m = n; m >= 0; --m) {
    if (m != n && m % p != 0) continue;
    bool ok = true;
    for (int64_t q = std::max<int64_t>(0, m - window_left); q < m && ok; ++q)
      ok = pages.swa_slot(slots[static_cast<size_t>(q)]) >= 0;
    if (ok) return m;
  }
  return 0;
}

TEST(SwaMatch, UsablePrefixMatchesTheOracle) {
  const pagoda::testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  int64_t cut = 0, total = 0;
  for (int round = 0; round < 400; ++round) {
    const int32_t page = std::vector<int32_t>{1, 2, 4, 16}[rng() % 4];
    kv::PageAllocator full(64, page), swa(64, page);
    kv::SwaPages pages(full, swa);
    const int32_t k = 1 + static_cast<int32_t>(rng() % 40);
    auto got = pages.alloc_pages(k);
    ASSERT_TRUE(got.has_value());
    std::shuffle(got->begin(), got->end(), rng);  // a match's pages need not be ascending
    for (int32_t pg : *got)
      if (rng() % 4 == 0) pages.release_swa({&pg, 1});
    const int64_t n = static_cast<int64_t>(rng() % (int64_t{k} * page + 1));
    std::vector<SlotIndex> slots;
    for (int64_t q = 0; q < n; ++q)
      slots.push_back((*got)[static_cast<size_t>(q / page)] * page +
                      static_cast<SlotIndex>(q % page));
    const int wl = static_cast<int>(rng() % 71);
    const int64_t want = oracle(slots, pages, wl);
    ASSERT_EQ(swa_usable_prefix(slots, pages, wl), want)
        << "round " << round << " page " << page << " n " << n << " window_left " << wl;
    cut += want < n;
    ++total;
  }
  std::printf("%lld of %lld matches cut back\n", static_cast<long long>(cut),
              static_cast<long long>(total));
  EXPECT_GT(cut, total / 10);  // the workload exercises the cut
}

TEST(SwaMatch, ReleasedWindowCutsTheMatch) {
  kv::PageAllocator full(8, 4), swa(8, 4);
  kv::SwaPages pages(full, swa);
  auto got = pages.alloc_pages(4);  // positions 0..15
  ASSERT_TRUE(got.has_value());
  std::vector<SlotIndex> slots;
  for (int q = 0; q < 16; ++q) slots.push_back((*got)[q / 4] * 4 + q % 4);
  EXPECT_EQ(swa_usable_prefix(slots, pages, 5), 16);
  pages.release_swa({&(*got)[2], 1});                 // positions 8..11 lose their window KV
  EXPECT_EQ(swa_usable_prefix(slots, pages, 5), 8);   // 16 needs 11..15; 12 needs 7..11
  EXPECT_EQ(swa_usable_prefix(slots, pages, 4), 16);  // 16 needs only 12..15
  EXPECT_EQ(swa_usable_prefix(slots, pages, 0), 16);
  pages.release_swa({&(*got)[0], 1});
  EXPECT_EQ(swa_usable_prefix(slots, pages, 5), 0);  // 8 needs 3..7: page 0 is gone
  EXPECT_THROW(swa_usable_prefix(slots, pages, -1), Error);
}

}  // namespace
}  // namespace pagoda::cache
