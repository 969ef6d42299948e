#include "pagoda/cache/swa_match.h"

#include <algorithm>
#include <vector>

#include "pagoda/core/error.h"

namespace pagoda::cache {

int64_t swa_usable_prefix(std::span<const SlotIndex> slots, const kv::SwaPages& pages,
                          int window_left) {
  PAGODA_REQUIRE(window_left >= 0, kInvalidArgument, "window_left {} < 0", window_left);
  const int64_t n = static_cast<int64_t>(slots.size());
  const int64_t p = pages.page_size();
  const int64_t num_pages = (n + p - 1) / p;
  // missing[k] = pages among the first k of the match without their SWA page.
  std::vector<int64_t> missing(static_cast<size_t>(num_pages) + 1, 0);
  for (int64_t k = 0; k < num_pages; ++k)
    missing[static_cast<size_t>(k) + 1] =
        missing[static_cast<size_t>(k)] + (pages.swa_slot(slots[static_cast<size_t>(k * p)]) < 0);
  auto usable = [&](int64_t m) {
    const int64_t lo = std::max<int64_t>(0, m - window_left);
    if (lo >= m) return true;
    const int64_t first = lo / p, end = (m + p - 1) / p;  // pages covering [lo, m)
    return missing[static_cast<size_t>(end)] == missing[static_cast<size_t>(first)];
  };
  if (usable(n)) return n;
  for (int64_t m = (n - 1) / p * p; m > 0; m -= p)
    if (usable(m)) return m;
  return 0;
}

}  // namespace pagoda::cache
