#pragma once
/// HostTier: the index of the hierarchical cache's host tier (L2). Every entry is one KV page in
/// the host pool, keyed by its chained PageKey (page_key.h), with its parent's key: a trie of
/// pages by prefix. Contract: docs/design/tier.md.
///
/// Ownership: the index holds exactly one reference (in the host PageAllocator) on the host page
/// of each entry. reserve() allocates pages for new entries (the caller then add()s them, which
/// hands the reference to the index, or give_back()s them). Eviction takes unpinned leaves (no
/// child entry in the index) in LRU order, so a prefix shrinks from its end; before it frees a
/// page it calls the before_free hook (the tier controller waits for copies that may still read
/// host pages). Pinned entries (a load-back or storage write in flight) are never evicted.
///
/// Not thread-safe: the scheduler thread owns it.

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/kv/page_allocator.h"
#include "pagoda/tier/page_key.h"

namespace pagoda::tier {

class HostTier {
 public:
  /// Uses (never owns) `pages`, which must outlive the index and start with nothing referenced.
  explicit HostTier(kv::PageAllocator& pages);

  /// Called once before an eviction frees host pages (nullptr: none).
  void set_before_free(std::function<void()> hook) { before_free_ = std::move(hook); }
  /// Called with each evicted entry (key, page) before its page is freed (nullptr: none).
  void set_on_evict(std::function<void(const PageKey&, int32_t)> hook) {
    on_evict_ = std::move(hook);
  }

  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  /// Pages evicted since construction.
  int64_t evicted_pages() const { return evicted_total_; }
  int32_t capacity_pages() const { return pages_->num_pages(); }
  bool contains(const PageKey& key) const { return entries_.count(key) != 0; }
  /// The host page of `key`, or -1.
  int32_t page_of(const PageKey& key) const;
  /// Refreshes the LRU time of `key` (no-op when absent).
  void touch(const PageKey& key);
  /// Pins / unpins an entry against eviction (counted; unpin of an unpinned entry throws
  /// kFailedPrecondition). Both throw kFailedPrecondition for an absent key.
  void pin(const PageKey& key);
  void unpin(const PageKey& key);

  /// Allocates up to `n` host pages, evicting unpinned LRU leaves when the pool is short; fewer
  /// (possibly none) when eviction cannot free enough. The caller owns one reference on each.
  std::vector<int32_t> reserve(int64_t n);
  /// Drops the caller's reference on pages from reserve() that it did not add().
  void give_back(std::span<const int32_t> pages);
  /// Adds an entry: `page` (reserved, the caller's reference passes to the index) holds the KV of
  /// the page keyed `key` whose parent page is `parent`. Throws kInvalidArgument (unchanged) when
  /// `key` is present.
  void add(const PageKey& key, const PageKey& parent, int32_t page);
  /// Evicts up to `n` pages (unpinned leaves, LRU first; a parent may become a leaf and follow);
  /// returns how many were evicted.
  int64_t evict(int64_t n);

  /// Aborts when the index and the allocator disagree: one reference per entry page, distinct
  /// pages, referenced pages == entries, child counts and the leaf set match the entries.
  void check_integrity() const;

 private:
  struct Entry {
    PageKey parent;
    int32_t page = 0;
    int32_t pins = 0;
    uint64_t last_access = 0;
  };
  using LeafKey = std::pair<uint64_t, PageKey>;
  void sync_leaf(const PageKey& key, const Entry& e, bool was_leaf, uint64_t old_time);
  int32_t children_of(const PageKey& key) const {
    auto it = child_count_.find(key);
    return it == child_count_.end() ? 0 : it->second;
  }
  bool evictable(const PageKey& key, const Entry& e) const {
    return e.pins == 0 && children_of(key) == 0;
  }

  kv::PageAllocator* pages_;
  std::function<void()> before_free_;
  std::function<void(const PageKey&, int32_t)> on_evict_;
  std::unordered_map<PageKey, Entry, PageKeyHash> entries_;
  /// Entries naming each key as their parent (the parent itself may be absent: its KV is on the
  /// device, or it was never backed up).
  std::unordered_map<PageKey, int32_t, PageKeyHash> child_count_;
  std::set<LeafKey> leaves_;  ///< evictable entries by (last_access, key)
  uint64_t clock_ = 0;
  int64_t evicted_total_ = 0;
};

}  // namespace pagoda::tier
