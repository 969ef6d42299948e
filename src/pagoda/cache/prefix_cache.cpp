#include "pagoda/cache/prefix_cache.h"

#include "pagoda/core/error.h"

namespace pagoda::cache {

void PrefixCache::admit(CacheRequest& req, int64_t max_prefix_len) {
  PAGODA_REQUIRE(!req.last_node.has_node(), kFailedPrecondition,
                 "admit: the request already holds a lock");
  MatchResult m = match_prefix(RadixKey{req.tokens, req.extra_key}, max_prefix_len);
  inc_lock_ref(m.last_node);
  req.cache_protected_len = static_cast<int64_t>(m.slots.size());
  req.prefix_slots = std::move(m.slots);
  req.last_node = m.last_node;
}

void PrefixCache::require_request(const CacheRequest& req, int64_t len) const {
  PAGODA_REQUIRE(table_->in_use(req.req_slot), kFailedPrecondition,
                 "request row {} is not in use", req.req_slot.value());
  PAGODA_REQUIRE(len >= 0 && len <= static_cast<int64_t>(req.tokens.size()) &&
                     len <= table_->max_context_len(),
                 kOutOfRange, "length {} outside [0, min({} tokens, context {})]", len,
                 req.tokens.size(), table_->max_context_len());
  PAGODA_REQUIRE(req.cache_protected_len >= 0 && req.cache_protected_len <= len &&
                     req.cache_protected_len % page_size() == 0,
                 kInvalidArgument,
                 "cache_protected_len {} must be a multiple of page_size {} within [0, {}]",
                 req.cache_protected_len, page_size(), len);
}

}  // namespace pagoda::cache
