#include "pagoda/cache/chunk_cache.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::cache {

PrefixMatch ChunkCache::match_prefix(const RadixKey& key, int64_t max_prefix_len,
                                     std::vector<SlotIndex>& out) {
  PAGODA_REQUIRE(max_prefix_len >= 0, kInvalidArgument, "max_prefix_len {} < 0", max_prefix_len);
  ++stats_.match_calls;
  stats_.queried_tokens += std::min(static_cast<int64_t>(key.tokens.size()), max_prefix_len);
  out.clear();
  return PrefixMatch{};
}

InsertResult ChunkCache::insert(const RadixKey& key, std::span<const SlotIndex> slots,
                                InsertOptions options) {
  const size_t len =
      key.tokens.size() / static_cast<size_t>(page_size()) * static_cast<size_t>(page_size());
  PAGODA_REQUIRE(slots.size() >= len, kInvalidArgument, "insert: {} slots for {} tokens",
                 slots.size(), key.tokens.size());
  if (options.ownership == SlotOwnership::kTransfer) allocator_->free(slots.first(len));
  return InsertResult{};
}

void ChunkCache::cache_finished_req(CacheRequest& req, int64_t kv_len, FinishPolicy policy) {
  require_request(req, kv_len);
  const auto own = table().read(req.req_slot, req.cache_protected_len,
                                kv_len - req.cache_protected_len);
  allocator_->free(own);
  req.last_node = NodeHandle{};
  req.prefix_slots.clear();
  req.cache_protected_len = 0;
}

void ChunkCache::cache_unfinished_req(CacheRequest& req, int64_t fill_len) {
  require_request(req, fill_len);
  const auto row = table().read(req.req_slot, 0, fill_len);
  req.prefix_slots.assign(row.begin(), row.end());
}

}  // namespace pagoda::cache
