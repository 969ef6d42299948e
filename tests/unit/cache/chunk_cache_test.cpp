#include "pagoda/cache/chunk_cache.h"

#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {
namespace {

using namespace pagoda::cache::testing;

TEST(ChunkCache, SharesNothingAndFreesEverything) {
  kv::PageAllocator alloc(16, 4);
  kv::ReqToTokenTable table(4, 64);
  ChunkCache cache(alloc, table);
  EXPECT_EQ(cache.name(), "chunk");
  CacheRequest r = make_request(iota_tokens(10));
  ASSERT_TRUE(prefill(cache, alloc, table, r));
  EXPECT_TRUE(r.prefix_slots.empty());
  EXPECT_FALSE(r.last_node.has_node());
  EXPECT_EQ(alloc.num_referenced_pages(), 3);
  Slots row(table.row(r.req_slot).begin(), table.row(r.req_slot).begin() + 10);
  EXPECT_EQ(cache.insert({r.tokens, ""}, row), 0);
  EXPECT_EQ(alloc.num_referenced_pages(), 3) << "insert must not retain";
  CacheRequest again = make_request(r.tokens);
  cache.admit(again, 9);
  EXPECT_TRUE(again.prefix_slots.empty());
  EXPECT_EQ(cache.stats().queried_tokens, 18);
  EXPECT_EQ(cache.stats().matched_tokens, 0);
  cache.cache_finished_req(r, 10);
  table.free(r.req_slot);
  EXPECT_EQ(alloc.available_size(), 64);
  EXPECT_EQ(cache.evict(100), 0);
  EXPECT_EQ(cache.total_size(), 0);
  alloc.check_integrity();
}

TEST(ChunkCache, ChunkedPrefillContinuesFromOwnSlots) {
  kv::PageAllocator alloc(16, 4);
  kv::ReqToTokenTable table(4, 64);
  ChunkCache cache(alloc, table);
  CacheRequest r = make_request(iota_tokens(13));
  ASSERT_TRUE(prefill(cache, alloc, table, r, 6));
  cache.cache_unfinished_req(r, 6);
  EXPECT_EQ(r.prefix_slots.size(), 6u);
  EXPECT_EQ(r.cache_protected_len, 0);
  ASSERT_TRUE(prefill(cache, alloc, table, r, 13));
  EXPECT_EQ(alloc.num_referenced_pages(), 4);
  expect_error(ErrorCode::kOutOfRange, [&] { cache.cache_finished_req(r, 14); });
  cache.cache_finished_req(r, 13);
  EXPECT_EQ(alloc.available_size(), 64);
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache.cache_finished_req(r, 13); });
  table.free(r.req_slot);
  alloc.check_integrity();
}

}  // namespace
}  // namespace pagoda::cache
