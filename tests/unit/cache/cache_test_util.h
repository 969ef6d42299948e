#pragma once
// Shared fixture for cache unit tests: an allocator, a req-to-token table and a scheduler-like
// prefill / decode helper that uses the public API only.

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "pagoda/cache/prefix_cache.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::cache::testing {

using Slots = std::vector<SlotIndex>;
using Tokens = std::vector<int32_t>;

inline Tokens iota_tokens(int32_t n, int32_t start = 1000) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

inline CacheRequest make_request(Tokens tokens) {
  CacheRequest r;
  r.tokens = std::move(tokens);
  return r;
}

/// Admits `req` (match capped at len - 1, lock), allocates a row and the extend slots, writes the
/// row. Returns false when the pool is full.
inline bool prefill(PrefixCache& cache, kv::PageAllocator& alloc, kv::ReqToTokenTable& table,
                    CacheRequest& req, int64_t upto = -1) {
  const auto seq = static_cast<int32_t>(upto < 0 ? static_cast<int64_t>(req.tokens.size()) : upto);
  if (!req.req_slot.valid()) {
    cache.admit(req, scheduler_prefix_limit(seq));
    req.req_slot = *table.alloc();
    table.write(req.req_slot, 0, req.prefix_slots);
  }
  const auto pre = static_cast<int32_t>(req.prefix_slots.size());
  const SlotIndex last = pre == 0 ? -1 : req.prefix_slots.back();
  auto out = alloc.alloc_extend(std::vector<int32_t>{pre}, std::vector<int32_t>{seq},
                                std::vector<SlotIndex>{last});
  if (!out) return false;
  table.write(req.req_slot, pre, *out);
  return true;
}

inline void expect_error(ErrorCode code, auto&& f) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

}  // namespace pagoda::cache::testing
