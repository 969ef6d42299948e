#pragma once
/// RadixCache: a page-aligned radix tree from token ids (+ namespace) to KV slots, shared between
/// requests (sglang_spec §4). Contract: prefix_cache.h and docs/design/cache.md.
///
/// Structure. Every non-root node holds a key segment and its slots (equal lengths, a positive
/// multiple of page_size, whole pages). Children are keyed by a hash of (namespace, first page of
/// the child's key) and verified on lookup. Node boundaries, splits and matches are page aligned.
/// Locks (inc_lock_ref) count requests whose path runs through a node; a node with lock_ref 0 is
/// evictable, and unlocked childless nodes sit in an ordered set keyed by the EvictionPolicy
/// (O(log n) per update). Nodes come from an internal pool, so stale handles are detected.
///
/// Costs. match_prefix: O(matched tokens) comparisons plus one hash lookup per node; it allocates
/// only the result vector. insert: the same plus the new leaf. evict: O(log n) per leaf.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/cache/eviction_policy.h"
#include "pagoda/cache/prefix_cache.h"

namespace pagoda::cache {

class RadixCache final : public PrefixCache {
 public:
  /// An empty tree over `allocator` (its page_size is the tree's) and `table`. `policy` defaults
  /// to LRU. All three must outlive the cache; the cache never owns pages beyond its references.
  RadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
             std::unique_ptr<EvictionPolicy> policy = nullptr);
  ~RadixCache() override;

  std::string_view name() const override { return "radix"; }
  const EvictionPolicy& policy() const { return *policy_; }
  /// Installs an observer of stored / removed nodes (replaces any previous one; nullptr clears).
  void set_event_listener(CacheEventListener listener) { listener_ = std::move(listener); }

  MatchResult match_prefix(const RadixKey& key, int64_t max_prefix_len = kNoPrefixLimit) override;
  int64_t insert(const RadixKey& key, std::span<const SlotIndex> slots,
                 InsertOptions options = {}) override;
  void inc_lock_ref(NodeHandle node) override;
  void dec_lock_ref(NodeHandle node) override;
  void cache_finished_req(CacheRequest& req, int64_t kv_len,
                          FinishPolicy policy = FinishPolicy::kInsert) override;
  void cache_unfinished_req(CacheRequest& req, int64_t fill_len) override;
  int64_t evict(int64_t num_tokens) override;
  int64_t evictable_size() const override { return evictable_size_; }
  int64_t protected_size() const override { return protected_size_; }
  const CacheStats& stats() const override { return stats_; }
  void check_integrity() const override;

  /// Number of nodes, root excluded.
  int64_t num_nodes() const { return num_nodes_; }
  /// lock_ref of a node (the root reports 1). Throws on a stale handle.
  int32_t lock_ref(NodeHandle node) const;
  /// Evicts every unlocked node; returns the tokens evicted.
  int64_t evict_all() { return evict(std::numeric_limits<int64_t>::max()); }

 private:
  struct EvictEntry {
    EvictionKey key;
    uint64_t id;
    auto operator<=>(const EvictEntry&) const = default;
  };

  PrefixNode* new_node(PrefixNode* parent, int32_t ns);
  void recycle(PrefixNode* node);
  PrefixNode* require_live(NodeHandle handle) const;
  PrefixNode* find_child(const PrefixNode* node, int32_t ns, std::span<const int32_t> page) const;
  uint64_t child_hash(int32_t ns, std::span<const int32_t> first_page) const;
  int64_t matched_pages_len(std::span<const int32_t> a, std::span<const int32_t> b) const;
  PrefixNode* split(PrefixNode* child, int64_t len);
  PrefixNode* match_walk(int32_t ns, std::span<const int32_t> tokens,
                         std::vector<SlotIndex>& out);
  int64_t insert_walk(int32_t ns, std::span<const int32_t> tokens,
                      std::span<const SlotIndex> slots, InsertOptions options);
  void require_whole_pages(std::span<const SlotIndex> slots) const;
  /// Throws kFailedPrecondition unless the request holds its own reference (beyond the tree's)
  /// on every page of `own` (catches a double finish that would drop the tree's reference).
  void require_request_owns(std::span<const SlotIndex> own) const;
  int32_t ns_lookup(std::string_view extra_key) const;
  int32_t ns_intern(std::string_view extra_key);
  int64_t aligned(int64_t len) const { return len / page_size() * page_size(); }
  void touch(PrefixNode* node);
  /// Puts `node` in or out of the evictable-leaf set according to its state, refreshing its key.
  void sync_evictable(PrefixNode* node);
  void emit(CacheEvent event, const PrefixNode* node);

  std::unique_ptr<EvictionPolicy> policy_;
  CacheEventListener listener_;
  std::deque<PrefixNode> node_pool_;
  std::vector<PrefixNode*> free_nodes_;
  PrefixNode* root_ = nullptr;
  std::map<EvictEntry, PrefixNode*> evictable_leaves_;
  std::unordered_map<std::string, int32_t> namespaces_;
  int64_t evictable_size_ = 0;
  int64_t protected_size_ = 0;
  int64_t num_nodes_ = 0;
  uint64_t clock_ = 0;
  uint64_t next_id_ = 1;
  CacheStats stats_;
  std::vector<int32_t> tree_page_refs_;  ///< [num_pages + 1] references the tree holds per page
  std::vector<SlotIndex> scratch_kv_;
  std::vector<SlotIndex> scratch_tree_;
};

}  // namespace pagoda::cache
