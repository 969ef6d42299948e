#pragma once
/// SwaRadixCache: the window-aware radix cache of a model with sliding-window layers (SGLang's
/// SWARadixCache; docs/design/cache.md §SWA). A RadixCache over kv::SwaPageRefs stores the full
/// pages; each stored full page may also hold its SWA page (kv::SwaPages). The two sides are
/// held and evicted separately:
///  - evict(n) (full side, PrefixCache's) takes whole unlocked leaves, both sides of their pages;
///  - evict_swa(n) releases only the window side of tree pages no lock needs (least recently
///    used first, earlier positions first), leaving them as tombstones: their full KV still
///    serves the full-attention layers of a longer match.
/// A match is cut back (cache::swa_usable_prefix) to the longest page-aligned length m whose
/// window [m - window_left, m) is still on the SWA side, so the first recomputed token reads
/// only resident window KV. A lock (inc_lock_ref, admit) protects the whole path's full side and
/// the window side of the pages covering the last window_left positions of the path (the pages
/// the locking request's next queries read); unlocks release exactly what the lock took.
///
/// Holders: the tree holds both sides of each page it stores (while the SWA side exists); a
/// request's private pages are held by the request and may lose their window side while it runs
/// (SwaPages::release_swa by the scheduler); a page inserted without its window side is stored as
/// a tombstone. Thread rules: not thread-safe; the scheduler thread owns it.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "pagoda/cache/radix_cache.h"
#include "pagoda/kv/swa_pages.h"

namespace pagoda::cache {

class SwaRadixCache final : public PrefixCache {
 public:
  /// An empty tree over `pages` (both pools unused, page size = the tree's) and optionally a
  /// request table; window_left >= 0 is the largest window of the model's sliding layers
  /// (FlashInfer convention). All must outlive the cache.
  SwaRadixCache(kv::SwaPages& pages, kv::ReqToTokenTable* table, int window_left,
                std::unique_ptr<EvictionPolicy> policy = nullptr);

  std::string_view name() const override { return "swa_radix"; }
  int window_left() const { return window_left_; }
  kv::SwaPages& pages() const { return *pages_; }

  using PrefixCache::match_prefix;
  /// RadixCache's match, cut back to where the window KV before the match point is resident.
  PrefixMatch match_prefix(const RadixKey& key, int64_t max_prefix_len,
                           std::vector<SlotIndex>& out) override;
  InsertResult insert(const RadixKey& key, std::span<const SlotIndex> slots,
                      InsertOptions options = {}) override;
  void inc_lock_ref(NodeHandle node) override;
  void dec_lock_ref(NodeHandle node) override;
  void cache_finished_req(CacheRequest& req, int64_t kv_len,
                          FinishPolicy policy = FinishPolicy::kInsert) override;
  void cache_unfinished_req(CacheRequest& req, int64_t fill_len) override;
  int64_t evict(int64_t num_tokens) override { return tree_.evict(num_tokens); }
  int64_t evictable_size() const override { return tree_.evictable_size(); }
  int64_t protected_size() const override { return tree_.protected_size(); }
  const CacheStats& stats() const override;
  void check_integrity() const override;

  /// Releases the window side of up to `num_pages` tree pages that no lock needs; returns how
  /// many were released (their SWA pages are free again).
  int64_t evict_swa(int64_t num_pages);
  /// Tree pages whose window side evict_swa could release now. O(pool pages).
  int64_t swa_evictable_pages() const;
  /// Tree pages that still hold their window side. O(pool pages).
  int64_t swa_tree_pages() const;
  /// Window locks on full page `page` (for tests).
  int32_t swa_lock_ref(int32_t page) const { return swa_lock_[static_cast<size_t>(page)]; }
  /// The full tree (introspection for tests and audits).
  const RadixCache& tree() const { return tree_; }

 private:
  /// Window-locks the SWA pages of the last window_left positions of node's path and records
  /// them under the node's id.
  void lock_window(NodeHandle node);
  /// Undoes one lock_window of the node with id `id`.
  void unlock_window(uint64_t id);
  /// Records that the tree used `page` now; `rank` orders pages of one use (position).
  void stamp(int32_t page, int64_t rank);
  bool swa_evictable(int32_t page) const;
  /// Before storing `slots` (the caller's pages, one holder each) under key: revives every tree
  /// page of the key that lost its window side with the caller's duplicate's window side
  /// (SwaPages::move_swa), so a request that re-reads the tree's pages (cache_unfinished_req)
  /// finds its window resident.
  void revive(const RadixKey& key, std::span<const SlotIndex> slots);

  kv::SwaPages* pages_;
  kv::SwaPageRefs refs_;
  RadixCache tree_;
  int window_left_;
  uint64_t clock_ = 0;
  /// Per full page: (use clock, rank) of its last use by the tree; clock 0 = not in the tree.
  std::vector<std::pair<uint64_t, int64_t>> stamp_;
  std::vector<int32_t> swa_lock_;  ///< per full page: window locks
  /// Node id -> the page lists its window locks took (one per lock still held).
  std::unordered_map<uint64_t, std::vector<std::vector<int32_t>>> locked_;
  CacheStats match_stats_;  ///< match counters (the tree's count the re-matches of a cut)
  mutable CacheStats stats_;
  std::vector<SlotIndex> scratch_;
};

}  // namespace pagoda::cache
