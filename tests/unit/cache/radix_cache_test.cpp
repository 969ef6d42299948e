#include "pagoda/cache/radix_cache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {
namespace {

using namespace pagoda::cache::testing;

class RadixCacheTest : public ::testing::TestWithParam<int32_t> {
 protected:
  int32_t P() const { return GetParam(); }
  kv::PageAllocator alloc_{64, GetParam()};
  kv::ReqToTokenTable table_{8, 512};
  RadixCache cache_{alloc_, table_};

  void check() {
    alloc_.check_integrity();
    cache_.check_integrity();
    table_.check_integrity();
  }
  /// Allocates whole pages for n tokens (n a multiple of P).
  Slots pages(int64_t n) { return *alloc_.alloc(n); }
};

TEST_P(RadixCacheTest, EmptyTreeMisses) {
  const Tokens t = iota_tokens(20);
  MatchResult m = cache_.match_prefix({t, ""});
  EXPECT_TRUE(m.slots.empty());
  ASSERT_TRUE(m.last_node.has_node());
  EXPECT_EQ(cache_.lock_ref(m.last_node), 1);  // the root
  EXPECT_EQ(cache_.total_size(), 0);
  EXPECT_EQ(cache_.stats().queried_tokens, 20);
  check();
}

TEST_P(RadixCacheTest, InsertIsPageAlignedAndMatchReturnsSlots) {
  const Tokens t = iota_tokens(3 * P() + 1);
  const int64_t stored = (3 * P() + 1) / P() * P();  // 3P, or 4 when P == 1
  Slots s = pages(4 * P());
  EXPECT_EQ(cache_.insert({t, ""}, s), 0);
  EXPECT_EQ(cache_.total_size(), stored);
  EXPECT_EQ(cache_.evictable_size(), stored);
  // The tree holds a reference on the stored pages only.
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 2);
  EXPECT_EQ(alloc_.refcount(PageId(s[3 * P()] / P())), P() == 1 ? 2 : 1);
  MatchResult m = cache_.match_prefix({t, ""});
  EXPECT_EQ(m.slots, Slots(s.begin(), s.begin() + stored));
  // Re-insert reports everything present and retains nothing more.
  EXPECT_EQ(cache_.insert({t, ""}, s), stored);
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 2);
  alloc_.free(s);
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 1);
  check();
}

TEST_P(RadixCacheTest, MatchSplitsInsideANode) {
  const Tokens a = iota_tokens(3 * P());
  Tokens b = a;
  b[2 * P()] = -7;  // diverges at the third page
  Slots s = pages(3 * P());
  cache_.insert({a, ""}, s);
  EXPECT_EQ(cache_.num_nodes(), 1);
  MatchResult m = cache_.match_prefix({b, ""});
  EXPECT_EQ(m.slots, Slots(s.begin(), s.begin() + 2 * P()));
  EXPECT_EQ(cache_.num_nodes(), 2);  // split at the page boundary
  // Divergence inside a page matches only the whole pages before it.
  Tokens c = a;
  c[P() + P() / 2] = -9;
  EXPECT_EQ(static_cast<int64_t>(cache_.match_prefix({c, ""}).slots.size()), P());
  // Inserting b adds a sibling for its third page.
  Slots sb = pages(3 * P());
  EXPECT_EQ(cache_.insert({b, ""}, sb), 2 * P());
  EXPECT_EQ(cache_.total_size(), 4 * P());
  EXPECT_EQ(cache_.match_prefix({b, ""}).slots.back(), sb.back());
  alloc_.free(s);
  alloc_.free(sb);
  check();
}

TEST_P(RadixCacheTest, NamespacesNeverShare) {
  const Tokens t = iota_tokens(2 * P());
  Slots s = pages(2 * P());
  cache_.insert({t, "lora-a"}, s);
  EXPECT_TRUE(cache_.match_prefix({t, ""}).slots.empty());
  EXPECT_TRUE(cache_.match_prefix({t, "lora-b"}).slots.empty());
  EXPECT_EQ(cache_.match_prefix({t, "lora-a"}).slots, s);
  Slots s2 = pages(2 * P());
  EXPECT_EQ(cache_.insert({t, ""}, s2), 0);
  EXPECT_EQ(cache_.match_prefix({t, ""}).slots, s2);
  check();
}

TEST_P(RadixCacheTest, LockProtectsPathAndEvictionFreesPages) {
  const Tokens a = iota_tokens(2 * P());
  Tokens b = a;
  b[P()] = -1;
  Slots sa = pages(2 * P()), sb = pages(2 * P());
  cache_.insert({a, ""}, sa);
  cache_.insert({b, ""}, sb);
  alloc_.free(sa);
  alloc_.free(sb);
  const int64_t free_before = alloc_.available_size();
  MatchResult m = cache_.match_prefix({a, ""});
  cache_.inc_lock_ref(m.last_node);
  EXPECT_EQ(cache_.protected_size(), 2 * P());  // a's leaf and the shared first page
  EXPECT_EQ(cache_.evictable_size(), P());
  check();
  EXPECT_EQ(cache_.evict(100 * P()), P());  // only b's leaf
  EXPECT_EQ(alloc_.available_size(), free_before + P());
  EXPECT_EQ(cache_.match_prefix({a, ""}).slots, sa);
  cache_.dec_lock_ref(m.last_node);
  EXPECT_EQ(cache_.protected_size(), 0);
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.dec_lock_ref(m.last_node); });
  EXPECT_EQ(cache_.evictable_size(), 2 * P());
  EXPECT_EQ(cache_.evict_all(), 2 * P());
  EXPECT_EQ(alloc_.available_size(), 64 * P());
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.inc_lock_ref(m.last_node); });
  expect_error(ErrorCode::kInvalidArgument, [&] { cache_.inc_lock_ref(NodeHandle{}); });
  EXPECT_EQ(cache_.stats().evicted_tokens, 3 * P());
  check();
}

TEST_P(RadixCacheTest, InsertBadSlotsThrowUnchanged) {
  const Tokens t = iota_tokens(2 * P());
  Slots s = pages(2 * P());
  auto bad_foreign = s;
  bad_foreign[P()] = 60 * P();  // a page nobody holds
  for (int i = 1; i < P(); ++i) bad_foreign[P() + i] = 60 * P() + i;
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.insert({t, ""}, bad_foreign); });
  expect_error(ErrorCode::kInvalidArgument, [&] { cache_.insert({t, ""}, Slots(s.begin(), s.begin() + P())); });
  if (P() > 1) {
    auto partial = s;
    std::swap(partial[0], partial[1]);
    expect_error(ErrorCode::kInvalidArgument, [&] { cache_.insert({t, ""}, partial); });
  }
  EXPECT_EQ(cache_.total_size(), 0);
  EXPECT_EQ(cache_.num_nodes(), 0);
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 1);
  check();
}

// sglang_spec §4.2: page 16, fully cached 100-token prompt -> 96 reused, and 40 cached -> 32.
TEST(RadixCacheRules, HundredTokenPromptPage16Reuses96) {
  kv::PageAllocator alloc(64, 16);
  kv::ReqToTokenTable table(4, 256);
  RadixCache cache(alloc, table);
  const Tokens prompt = iota_tokens(100);
  CacheRequest first = make_request(prompt);
  ASSERT_TRUE(prefill(cache, alloc, table, first));
  EXPECT_EQ(first.cache_protected_len, 0);
  cache.cache_finished_req(first, 100);
  table.free(first.req_slot);
  EXPECT_EQ(cache.total_size(), 96);  // 100 page-aligned
  // A request whose whole prompt is cached still computes a token: limit 99 -> 96.
  CacheRequest again = make_request(prompt);
  cache.admit(again, scheduler_prefix_limit(100));
  EXPECT_EQ(again.prefix_slots.size(), 96u);
  EXPECT_EQ(again.cache_protected_len, 96);
  // Tokens 96..99 go to a fresh page (Part 3 of alloc_extend since 96 is aligned).
  auto out = alloc.alloc_extend(std::vector<int32_t>{96}, std::vector<int32_t>{100},
                                std::vector<SlotIndex>{again.prefix_slots.back()});
  ASSERT_TRUE(out);
  EXPECT_EQ((*out)[0] % 16, 0);
  cache.dec_lock_ref(again.last_node);
  alloc.free(*out);
  // Only the first 40 tokens cached: the tree would store 32 and the match returns 32.
  Tokens other = iota_tokens(100, 5000);
  Slots s = *alloc.alloc(48);
  EXPECT_EQ(cache.insert({Tokens(other.begin(), other.begin() + 40), ""}, s), 0);
  EXPECT_EQ(cache.match_prefix({other, ""}, scheduler_prefix_limit(100)).slots.size(), 32u);
  EXPECT_EQ(scheduler_prefix_limit(100, 50), 50);
  EXPECT_EQ(scheduler_prefix_limit(0), 0);
  alloc.free(s);
  cache.check_integrity();
}

TEST_P(RadixCacheTest, FinishedRequestMovesPagesToTreeAndFreesTheRest) {
  const int32_t len = 3 * P() + (P() > 1 ? P() / 2 : 0);  // an unaligned tail when P > 1
  CacheRequest r1 = make_request(iota_tokens(len));
  ASSERT_TRUE(prefill(cache_, alloc_, table_, r1));
  const int64_t used = alloc_.num_referenced_pages();
  cache_.cache_finished_req(r1, len);
  table_.free(r1.req_slot);
  EXPECT_EQ(cache_.total_size(), 3 * P());
  EXPECT_EQ(alloc_.num_referenced_pages(), 3);  // the tail page went back
  EXPECT_EQ(used, P() > 1 ? 4 : 3);
  EXPECT_FALSE(r1.last_node.has_node());
  check();

  // A second request shares the first two pages, then finishes with a duplicate third page.
  Tokens t2 = iota_tokens(len);
  CacheRequest r2 = make_request(t2);
  // Force a duplicate: cap the match at 2 pages so page 3 is recomputed into a fresh page.
  cache_.admit(r2, 2 * P());
  EXPECT_EQ(r2.cache_protected_len, 2 * P());
  EXPECT_EQ(cache_.protected_size(), 2 * P());
  r2.req_slot = *table_.alloc();
  table_.write(r2.req_slot, 0, r2.prefix_slots);
  auto out = *alloc_.alloc_extend(std::vector<int32_t>{2 * P()}, std::vector<int32_t>{len},
                                  Slots{r2.prefix_slots.back()});
  table_.write(r2.req_slot, 2 * P(), out);
  const int64_t free_before = alloc_.available_size();
  cache_.cache_finished_req(r2, len);
  table_.free(r2.req_slot);
  // The duplicate third page and the tail page are free again; the tree is unchanged.
  EXPECT_EQ(alloc_.available_size(), free_before + (P() > 1 ? 2 : 1) * P());
  EXPECT_EQ(cache_.total_size(), 3 * P());
  EXPECT_EQ(cache_.protected_size(), 0);
  check();
}

TEST_P(RadixCacheTest, FinishWithoutInsertFreesOwnPagesOnly) {
  CacheRequest r = make_request(iota_tokens(2 * P()));
  ASSERT_TRUE(prefill(cache_, alloc_, table_, r));
  cache_.cache_finished_req(r, 2 * P(), FinishPolicy::kNoInsert);
  table_.free(r.req_slot);
  EXPECT_EQ(cache_.total_size(), 0);
  EXPECT_EQ(alloc_.available_size(), 64 * P());
  check();
}

TEST_P(RadixCacheTest, ChunkedPrefillKeepsPrivatePartialPage) {
  const int32_t len = 5 * P();
  const int32_t chunk = 2 * P() + (P() > 1 ? 1 : 0);
  CacheRequest r = make_request(iota_tokens(len));
  ASSERT_TRUE(prefill(cache_, alloc_, table_, r, chunk));
  cache_.cache_unfinished_req(r, chunk);
  EXPECT_EQ(r.cache_protected_len, 2 * P());
  EXPECT_EQ(static_cast<int32_t>(r.prefix_slots.size()), chunk);
  EXPECT_EQ(cache_.total_size(), 2 * P());
  EXPECT_EQ(cache_.protected_size(), 2 * P());
  // The row points at the tree's slots for the aligned part.
  auto tree = cache_.match_prefix({r.tokens, ""}, 2 * P()).slots;
  auto row = table_.read(r.req_slot, 0, 2 * P());
  EXPECT_EQ(Slots(row.begin(), row.end()), tree);
  check();
  // Next chunk continues from the private partial page; then the request finishes.
  ASSERT_TRUE(prefill(cache_, alloc_, table_, r, len));
  cache_.cache_unfinished_req(r, len);
  EXPECT_EQ(r.cache_protected_len, len);
  check();
  cache_.cache_finished_req(r, len);
  table_.free(r.req_slot);
  EXPECT_EQ(cache_.total_size(), len);
  EXPECT_EQ(cache_.protected_size(), 0);
  EXPECT_EQ(alloc_.num_referenced_pages(), 5);
  check();
}

TEST_P(RadixCacheTest, CacheReqBadInputThrowsUnchanged) {
  CacheRequest r = make_request(iota_tokens(2 * P()));
  ASSERT_TRUE(prefill(cache_, alloc_, table_, r));
  const int64_t avail = alloc_.available_size();
  expect_error(ErrorCode::kOutOfRange, [&] { cache_.cache_finished_req(r, 2 * P() + 1); });
  expect_error(ErrorCode::kOutOfRange, [&] { cache_.cache_unfinished_req(r, -1); });
  CacheRequest unused = r;
  unused.req_slot = ReqSlot(7);
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.cache_finished_req(unused, 1); });
  if (P() > 1) {
    CacheRequest misaligned = r;
    misaligned.cache_protected_len = 1;
    expect_error(ErrorCode::kInvalidArgument, [&] { cache_.cache_finished_req(misaligned, 2 * P()); });
  }
  EXPECT_EQ(alloc_.available_size(), avail);
  EXPECT_EQ(cache_.total_size(), 0);
  check();
  cache_.cache_finished_req(r, 2 * P());
  // Finishing twice would free the request's pages twice: rejected, nothing changes.
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.cache_finished_req(r, 2 * P()); });
  EXPECT_EQ(cache_.total_size(), 2 * P());
  table_.free(r.req_slot);
  check();
}

TEST_P(RadixCacheTest, HitStatisticsAndEvents) {
  int stored = 0, removed = 0;
  cache_.set_event_listener([&](CacheEvent e, std::span<const int32_t> key,
                                std::span<const SlotIndex> slots) {
    EXPECT_EQ(key.size(), slots.size());
    (e == CacheEvent::kStored ? stored : removed) += static_cast<int>(key.size());
  });
  const Tokens t = iota_tokens(4 * P());
  Slots s = pages(4 * P());
  cache_.insert({t, ""}, s);
  alloc_.free(s);
  cache_.match_prefix({t, ""});
  cache_.match_prefix({iota_tokens(4 * P(), 1), ""});
  EXPECT_EQ(cache_.stats().match_calls, 2);
  EXPECT_EQ(cache_.stats().queried_tokens, 8 * P());
  EXPECT_EQ(cache_.stats().matched_tokens, 4 * P());
  EXPECT_DOUBLE_EQ(cache_.stats().hit_rate(), 0.5);
  EXPECT_EQ(cache_.stats().inserted_tokens, 4 * P());
  cache_.evict_all();
  EXPECT_EQ(stored, 4 * P());
  EXPECT_EQ(removed, 4 * P());
  check();
}

INSTANTIATE_TEST_SUITE_P(PageSizes, RadixCacheTest, ::testing::Values(1, 4, 16),
                         [](const auto& info) { return fmt::format("P{}", info.param); });

}  // namespace
}  // namespace pagoda::cache
