#include "pagoda/tier/host_tier.h"

#include <algorithm>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::tier {
namespace {

std::vector<SlotIndex> page_slots(std::span<const int32_t> pages, int32_t page_size) {
  std::vector<SlotIndex> slots;
  slots.reserve(pages.size() * static_cast<size_t>(page_size));
  for (int32_t p : pages)
    for (int32_t i = 0; i < page_size; ++i) slots.push_back(p * page_size + i);
  return slots;
}

}  // namespace

HostTier::HostTier(kv::PageAllocator& pages) : pages_(&pages) {
  PAGODA_REQUIRE(pages.num_referenced_pages() == 0, kInvalidArgument,
                 "HostTier needs an empty host allocator");
}

int32_t HostTier::page_of(const PageKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? -1 : it->second.page;
}

void HostTier::sync_leaf(const PageKey& key, const Entry& e, bool was_leaf, uint64_t old_time) {
  if (was_leaf) leaves_.erase(LeafKey{old_time, key});
  if (evictable(key, e)) leaves_.insert(LeafKey{e.last_access, key});
}

void HostTier::touch(const PageKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  const bool was = evictable(key, e);
  const uint64_t old = e.last_access;
  e.last_access = ++clock_;
  sync_leaf(key, e, was, old);
}

void HostTier::pin(const PageKey& key) {
  auto it = entries_.find(key);
  PAGODA_REQUIRE(it != entries_.end(), kFailedPrecondition, "host tier: pin of absent page {}", key.hex());
  Entry& e = it->second;
  const bool was = evictable(key, e);
  ++e.pins;
  sync_leaf(key, e, was, e.last_access);
}

void HostTier::unpin(const PageKey& key) {
  auto it = entries_.find(key);
  PAGODA_REQUIRE(it != entries_.end(), kFailedPrecondition, "host tier: unpin of absent page {}", key.hex());
  Entry& e = it->second;
  PAGODA_REQUIRE(e.pins > 0, kFailedPrecondition, "host tier: page {} is not pinned", key.hex());
  --e.pins;
  sync_leaf(key, e, false, e.last_access);
}

std::vector<int32_t> HostTier::reserve(int64_t n) {
  PAGODA_REQUIRE(n >= 0, kInvalidArgument, "host tier: reserve({}) < 0", n);
  const int32_t p = pages_->page_size();
  const int64_t free_pages = pages_->num_free_pages();
  if (free_pages < n) evict(n - free_pages);
  const int64_t take = std::min<int64_t>(n, pages_->num_free_pages());
  std::vector<int32_t> out;
  if (take == 0) return out;
  auto slots = pages_->alloc(take * p);
  PAGODA_CHECK(slots.has_value(), "host alloc of {} free pages failed", take);
  out.reserve(static_cast<size_t>(take));
  for (int64_t i = 0; i < take; ++i) out.push_back((*slots)[static_cast<size_t>(i * p)] / p);
  return out;
}

void HostTier::give_back(std::span<const int32_t> pages) {
  if (pages.empty()) return;
  pages_->free(page_slots(pages, pages_->page_size()));
}

void HostTier::add(const PageKey& key, const PageKey& parent, int32_t page) {
  PAGODA_REQUIRE(!contains(key), kInvalidArgument, "host tier: page {} is already present",
                 key.hex());
  PAGODA_REQUIRE(page >= 1 && page <= pages_->num_pages() && pages_->refcount(PageId{page}) == 1,
                 kInvalidArgument, "host tier: page {} is not a reserved host page", page);
  auto pit = entries_.find(parent);
  const bool parent_was = pit != entries_.end() && evictable(parent, pit->second);
  ++child_count_[parent];
  if (pit != entries_.end()) sync_leaf(parent, pit->second, parent_was, pit->second.last_access);
  const Entry e{.parent = parent, .page = page, .pins = 0, .last_access = ++clock_};
  entries_.emplace(key, e);
  sync_leaf(key, e, false, 0);
}

int64_t HostTier::evict(int64_t n) {
  int64_t evicted = 0;
  std::vector<int32_t> freed;
  while (evicted < n && !leaves_.empty()) {
    if (freed.empty() && before_free_) before_free_();
    const PageKey key = leaves_.begin()->second;
    leaves_.erase(leaves_.begin());
    auto it = entries_.find(key);
    PAGODA_CHECK(it != entries_.end(), "host leaf {} without an entry", key.hex());
    const Entry e = it->second;
    if (on_evict_) on_evict_(key, e.page);
    freed.push_back(e.page);
    entries_.erase(it);
    auto cit = child_count_.find(e.parent);
    if (--cit->second == 0) child_count_.erase(cit);
    auto pit = entries_.find(e.parent);
    if (pit != entries_.end()) sync_leaf(e.parent, pit->second, false, pit->second.last_access);
    ++evicted;
  }
  std::sort(freed.begin(), freed.end());
  give_back(freed);
  evicted_total_ += evicted;
  return evicted;
}

void HostTier::check_integrity() const {
  PAGODA_CHECK_EQ(static_cast<int64_t>(pages_->num_referenced_pages()), num_entries());
  std::vector<char> seen(static_cast<size_t>(pages_->num_pages()) + 1, 0);
  std::unordered_map<PageKey, int32_t, PageKeyHash> children;
  size_t leaves = 0;
  for (const auto& [key, e] : entries_) {
    PAGODA_CHECK(e.page >= 1 && e.page <= pages_->num_pages(), "host page {} out of range", e.page);
    PAGODA_CHECK(!seen[static_cast<size_t>(e.page)], "host page {} in two entries", e.page);
    seen[static_cast<size_t>(e.page)] = 1;
    PAGODA_CHECK_EQ(pages_->refcount(PageId{e.page}), 1);
    PAGODA_CHECK_GE(e.pins, 0);
    ++children[e.parent];
    if (evictable(key, e)) {
      ++leaves;
      PAGODA_CHECK(leaves_.count(LeafKey{e.last_access, key}) == 1, "host leaf {} not indexed",
                   key.hex());
    }
  }
  PAGODA_CHECK_EQ(children.size(), child_count_.size());
  for (const auto& [key, n] : children) PAGODA_CHECK_EQ(children_of(key), n);
  PAGODA_CHECK_EQ(leaves, leaves_.size());
}

}  // namespace pagoda::tier
