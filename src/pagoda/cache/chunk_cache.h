#pragma once
/// ChunkCache: the prefix cache used when radix caching is disabled (sglang_spec §4.8). It shares
/// nothing: match_prefix always misses, insert stores nothing, there are no locks and nothing to
/// evict. Chunked prefill still works: cache_unfinished_req hands the request its own slots back
/// as prefix, and cache_finished_req releases the request's pages.

#include "pagoda/cache/prefix_cache.h"

namespace pagoda::cache {

class ChunkCache final : public PrefixCache {
 public:
  ChunkCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table)
      : PrefixCache(allocator, table) {}

  explicit ChunkCache(kv::PageRefs& pages, kv::ReqToTokenTable* table = nullptr)
      : PrefixCache(pages, table) {}

  std::string_view name() const override { return "chunk"; }
  using PrefixCache::match_prefix;
  /// Always empty slots and no node; counts the query.
  PrefixMatch match_prefix(const RadixKey& key, int64_t max_prefix_len,
                           std::vector<SlotIndex>& out) override;
  /// Stores nothing; returns prefix 0 and no node. kRetain retains nothing (the caller keeps its
  /// references); kTransfer frees slots[:L] (the caller handed them over and nothing keeps them).
  InsertResult insert(const RadixKey& key, std::span<const SlotIndex> slots,
                      InsertOptions options = {}) override;
  /// No-ops (any handle accepted).
  void inc_lock_ref(NodeHandle node) override {}
  void dec_lock_ref(NodeHandle node) override {}
  /// Releases row[cache_protected_len : kv_len] (the policy is irrelevant: nothing is stored).
  void cache_finished_req(CacheRequest& req, int64_t kv_len,
                          FinishPolicy policy = FinishPolicy::kInsert) override;
  /// prefix_slots = row[0 : fill_len]; the request keeps owning every page.
  void cache_unfinished_req(CacheRequest& req, int64_t fill_len) override;
  int64_t evict(int64_t num_tokens) override { return 0; }
  int64_t evictable_size() const override { return 0; }
  int64_t protected_size() const override { return 0; }
  const CacheStats& stats() const override { return stats_; }
  void check_integrity() const override {}

 private:
  CacheStats stats_;
};

}  // namespace pagoda::cache
