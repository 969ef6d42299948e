#include "pagoda/kv/swa_pages.h"

#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::kv {

namespace {

std::vector<PageRun> runs_of(std::span<const int32_t> pages) {
  std::vector<PageRun> runs;
  runs.reserve(pages.size());
  for (int32_t p : pages) runs.push_back(PageRun{.first = p, .count = 1});
  return runs;
}

}  // namespace

SwaPages::SwaPages(PageAllocator& full, PageAllocator& swa)
    : full_(&full), swa_(&swa), map_(static_cast<size_t>(full.num_pages()) + 1, 0) {
  PAGODA_REQUIRE(full.page_size() == swa.page_size(), kInvalidArgument,
                 "SWA pool page size {} differs from the full pool's {}", swa.page_size(),
                 full.page_size());
  PAGODA_REQUIRE(full.num_referenced_pages() == 0 && swa.num_referenced_pages() == 0,
                 kFailedPrecondition, "SwaPages needs two unused allocators");
}

std::optional<std::vector<int32_t>> SwaPages::alloc_pages(int32_t num_pages) {
  PAGODA_REQUIRE(num_pages >= 0, kInvalidArgument, "alloc_pages({}) < 0", num_pages);
  if (full_->num_free_pages() < num_pages || swa_->num_free_pages() < num_pages)
    return std::nullopt;
  const int32_t p = page_size();
  const int64_t tokens = int64_t{num_pages} * p;
  std::optional<std::vector<SlotIndex>> f = full_->alloc(tokens);
  std::optional<std::vector<SlotIndex>> s = swa_->alloc(tokens);
  PAGODA_CHECK(f.has_value() && s.has_value());
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  for (int32_t i = 0; i < num_pages; ++i) {
    const int32_t fp = (*f)[static_cast<size_t>(i) * p] / p;
    map_[static_cast<size_t>(fp)] = (*s)[static_cast<size_t>(i) * p] / p;
    pages[static_cast<size_t>(i)] = fp;
  }
  return pages;
}

bool SwaPages::attach_swa(std::span<const int32_t> full_pages) {
  full_->require_held_pages(runs_of(full_pages));  // rejects a page named twice
  for (int32_t p : full_pages)
    PAGODA_REQUIRE(full_->refcount(PageId{p}) == 1 && !has_swa(p), kFailedPrecondition,
                   "SwaPages::attach_swa: full page {} has {} holders{}", p,
                   full_->refcount(PageId{p}), has_swa(p) ? " and an SWA page already" : "");
  const auto n = static_cast<int64_t>(full_pages.size());
  if (swa_->num_free_pages() < n) return false;
  std::optional<std::vector<SlotIndex>> s = swa_->alloc(n * page_size());
  PAGODA_CHECK(s.has_value());
  for (size_t i = 0; i < full_pages.size(); ++i)
    map_[static_cast<size_t>(full_pages[i])] = (*s)[i * static_cast<size_t>(page_size())] / page_size();
  return true;
}

void SwaPages::move_swa(int32_t from, int32_t to) {
  const int32_t pages[2] = {from, to};
  require_referenced(pages, "move_swa");
  PAGODA_REQUIRE(from != to && has_swa(from) && !has_swa(to) &&
                     full_->refcount(PageId{from}) == 1 && full_->refcount(PageId{to}) == 1 &&
                     swa_->refcount(PageId{swa_page(from)}) == 1,
                 kFailedPrecondition,
                 "SwaPages::move_swa({} -> {}): needs two pages of one holder each, the first "
                 "with an SWA page and the second without",
                 from, to);
  map_[static_cast<size_t>(to)] = map_[static_cast<size_t>(from)];
  map_[static_cast<size_t>(from)] = 0;
}

void SwaPages::require_referenced(std::span<const int32_t> full_pages, const char* what) const {
  for (int32_t p : full_pages)
    PAGODA_REQUIRE(p >= 1 && p <= full_->num_pages() && full_->refcount(PageId{p}) > 0,
                   kFailedPrecondition, "SwaPages::{}: full page {} is not referenced", what, p);
}

void SwaPages::retain(std::span<const int32_t> full_pages, bool with_swa) {
  require_referenced(full_pages, "retain");
  const std::vector<PageRun> full_runs = runs_of(full_pages);
  full_->require_held_pages(full_runs);
  std::vector<int32_t> swa_pages;
  if (with_swa)
    for (int32_t p : full_pages)
      if (has_swa(p)) swa_pages.push_back(swa_page(p));
  const std::vector<PageRun> swa_runs = runs_of(swa_pages);
  swa_->require_held_pages(swa_runs);
  full_->retain_pages(full_runs);
  swa_->retain_pages(swa_runs);
}

void SwaPages::drop_swa(int32_t p) {
  const int32_t s = swa_page(p);
  const PageRun run{.first = s, .count = 1};
  swa_->free_pages({&run, 1});
  if (swa_->refcount(PageId{s}) == 0) map_[static_cast<size_t>(p)] = 0;
}

void SwaPages::release_swa(std::span<const int32_t> full_pages) {
  require_referenced(full_pages, "release_swa");
  std::vector<int32_t> swa_pages;
  for (int32_t p : full_pages) {
    PAGODA_REQUIRE(has_swa(p), kFailedPrecondition,
                   "SwaPages::release_swa: full page {} has no SWA page", p);
    swa_pages.push_back(swa_page(p));
  }
  swa_->require_held_pages(runs_of(swa_pages));  // also rejects a page named twice
  for (int32_t p : full_pages) drop_swa(p);
}

void SwaPages::free(std::span<const int32_t> full_pages, bool with_swa) {
  require_referenced(full_pages, "free");
  full_->require_held_pages(runs_of(full_pages));  // rejects a page named twice
  for (int32_t p : full_pages) {
    PAGODA_REQUIRE(!with_swa || has_swa(p), kFailedPrecondition,
                   "SwaPages::free: full page {} has no SWA page to drop", p);
    // The last full holder cannot leave an SWA holder behind (a holder of the window side
    // always holds the full side too).
    const int32_t swa_left =
        has_swa(p) ? swa_->refcount(PageId{swa_page(p)}) - (with_swa ? 1 : 0) : 0;
    PAGODA_REQUIRE(full_->refcount(PageId{p}) > 1 || swa_left == 0, kFailedPrecondition,
                   "SwaPages::free: full page {} would be freed while its SWA page has {} other "
                   "holder(s)",
                   p, swa_left);
  }
  if (with_swa)
    for (int32_t p : full_pages) drop_swa(p);
  full_->free_pages(runs_of(full_pages));
}

SlotIndex SwaPages::swa_slot(SlotIndex s) const {
  const int32_t p = page_size();
  PAGODA_REQUIRE(s >= p && s < full_->num_slots_total(), kOutOfRange,
                 "slot {} outside the full pool's pages [1, {}]", s, full_->num_pages());
  const int32_t sp = map_[static_cast<size_t>(s / p)];
  return sp == 0 ? -1 : sp * p + s % p;
}

int64_t SwaPages::swa_dead_pages(int64_t kv_len, int window_left, int32_t page_size) {
  PAGODA_REQUIRE(kv_len >= 0 && window_left >= 0 && page_size >= 1, kInvalidArgument,
                 "swa_dead_pages({}, {}, {})", kv_len, window_left, page_size);
  return std::max<int64_t>(0, (kv_len - window_left) / page_size);
}

int64_t SwaPages::swa_live_pages_bound(int window_left, int32_t page_size) {
  PAGODA_REQUIRE(window_left >= 0 && page_size >= 1, kInvalidArgument,
                 "swa_live_pages_bound({}, {})", window_left, page_size);
  return (int64_t{window_left} + page_size) / page_size + 1;
}

void SwaPages::check_holders_share() const {
  for (int32_t p = 1; p <= full_->num_pages(); ++p)
    if (has_swa(p))
      PAGODA_CHECK(swa_->refcount(PageId{swa_page(p)}) == full_->refcount(PageId{p}),
                   "full page {} has {} holders but its SWA page {}", p,
                   full_->refcount(PageId{p}), swa_->refcount(PageId{swa_page(p)}));
}

void SwaPages::check_integrity() const {
  full_->check_integrity();
  swa_->check_integrity();
  std::vector<char> seen(static_cast<size_t>(swa_->num_pages()) + 1, 0);
  int32_t mapped = 0;
  for (int32_t p = 1; p <= full_->num_pages(); ++p) {
    const int32_t s = map_[static_cast<size_t>(p)];
    if (s == 0) continue;
    PAGODA_CHECK(full_->refcount(PageId{p}) > 0);
    PAGODA_CHECK(s >= 1 && s <= swa_->num_pages() && swa_->refcount(PageId{s}) > 0);
    PAGODA_CHECK(!seen[static_cast<size_t>(s)]);
    PAGODA_CHECK(swa_->refcount(PageId{s}) <= full_->refcount(PageId{p}));
    seen[static_cast<size_t>(s)] = 1;
    ++mapped;
  }
  PAGODA_CHECK(mapped == swa_->num_referenced_pages());
}

}  // namespace pagoda::kv

namespace pagoda::kv {

std::vector<PageRun> SwaPageRefs::page_runs(std::span<const SlotIndex> slots) const {
  pages_->full().require_held_runs(slots);  // each page named once, by a run from its start
  std::vector<PageRun> runs;
  for (SlotIndex s : slots)
    if (s % page_size() == 0) runs.push_back(PageRun{.first = s / page_size(), .count = 1});
  return runs;
}

void SwaPageRefs::split(std::span<const PageRun> runs) {
  with_.clear();
  without_.clear();
  for (const PageRun& r : runs)
    for (int32_t p = r.first; p < r.first + r.count; ++p)
      (pages_->has_swa(p) ? with_ : without_).push_back(p);
}

void SwaPageRefs::retain_pages(std::span<const PageRun> runs) {
  pages_->full().require_held_pages(runs);  // before has_swa reads a page id
  split(runs);
  pages_->retain(with_, true);
  pages_->retain(without_, false);
}

void SwaPageRefs::free_pages(std::span<const PageRun> runs) {
  pages_->full().require_held_pages(runs);
  split(runs);
  pages_->free(with_, true);
  pages_->free(without_, false);
}

void SwaPageRefs::retain(std::span<const SlotIndex> slots) {
  retain_pages(page_runs(slots));
}

void SwaPageRefs::free(std::span<const SlotIndex> slots) {
  free_pages(page_runs(slots));
}

}  // namespace pagoda::kv
