#include "pagoda/cache/prefix_cache.h"

#include "pagoda/core/error.h"

namespace pagoda::cache {

MatchResult PrefixCache::match_prefix(const RadixKey& key, int64_t max_prefix_len) {
  MatchResult result;
  result.last_node = match_prefix(key, max_prefix_len, result.slots).last_node;
  return result;
}

kv::ReqToTokenTable& PrefixCache::table() const {
  PAGODA_REQUIRE(table_ != nullptr, kFailedPrecondition,
                 "{} cache built without a request table: cache_*_req and admit need one", name());
  return *table_;
}

void PrefixCache::admit(CacheRequest& req, int64_t max_prefix_len) {
  PAGODA_REQUIRE(!req.last_node.has_node(), kFailedPrecondition,
                 "admit: the request already holds a lock");
  const PrefixMatch m =
      match_prefix(RadixKey{req.tokens, req.extra_key}, max_prefix_len, req.prefix_slots);
  inc_lock_ref(m.last_node);
  req.cache_protected_len = m.length;
  req.last_node = m.last_node;
}

void PrefixCache::unadmit(CacheRequest& req) {
  dec_lock_ref(req.last_node);
  req.last_node = NodeHandle{};
  req.prefix_slots.clear();
  req.cache_protected_len = 0;
}

void PrefixCache::require_request(const CacheRequest& req, int64_t len) const {
  const kv::ReqToTokenTable& tab = table();
  PAGODA_REQUIRE(tab.in_use(req.req_slot), kFailedPrecondition,
                 "request row {} is not in use", req.req_slot.value());
  PAGODA_REQUIRE(len >= 0 && len <= static_cast<int64_t>(req.tokens.size()) &&
                     len <= tab.max_context_len(),
                 kOutOfRange, "length {} outside [0, min({} tokens, context {})]", len,
                 req.tokens.size(), tab.max_context_len());
  PAGODA_REQUIRE(req.cache_protected_len >= 0 && req.cache_protected_len <= len &&
                     req.cache_protected_len % page_size() == 0,
                 kInvalidArgument,
                 "cache_protected_len {} must be a multiple of page_size {} within [0, {}]",
                 req.cache_protected_len, page_size(), len);
}

}  // namespace pagoda::cache
