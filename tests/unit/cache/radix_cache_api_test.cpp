// The allocation-free and ownership APIs of RadixCache (issue 14): match into a caller buffer,
// InsertResult, SlotOwnership::kTransfer and its misuse, a cache without a request table or over
// another kv::PageRefs, and memory given back after eviction.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cache_test_util.h"
#include "pagoda/cache/radix_cache.h"
#include "pagoda/core/error.h"
#include "test_seed.h"

namespace pagoda::cache {
namespace {

using namespace pagoda::cache::testing;

class RadixApiTest : public ::testing::TestWithParam<int32_t> {
 protected:
  int32_t P() const { return GetParam(); }
  kv::PageAllocator alloc_{64, GetParam()};
  RadixCache cache_{alloc_};  // no request table

  void check() {
    alloc_.check_integrity();
    cache_.check_integrity();
  }
  Slots pages(int64_t n) { return *alloc_.alloc(n); }
};

TEST_P(RadixApiTest, MatchIntoCallerBufferOverwritesAndReusesCapacity) {
  const Tokens t = iota_tokens(4 * P());
  const Slots s = pages(4 * P());
  cache_.insert({t, ""}, s, {.ownership = SlotOwnership::kTransfer});
  Slots out(100, -7);  // stale content is overwritten
  out.reserve(1000);
  const SlotIndex* data = out.data();
  PrefixMatch m = cache_.match_prefix({t, ""}, kNoPrefixLimit, out);
  EXPECT_EQ(m.length, 4 * P());
  EXPECT_EQ(out, s);
  EXPECT_EQ(out.data(), data) << "a warm buffer must not be reallocated";
  EXPECT_EQ(cache_.node_length(m.last_node), 4 * P());
  // A capped match, a miss and another namespace all overwrite the buffer.
  m = cache_.match_prefix({t, ""}, 3 * P() - 1, out);
  EXPECT_EQ(m.length, 2 * P());
  EXPECT_EQ(out, Slots(s.begin(), s.begin() + 2 * P()));
  m = cache_.match_prefix({iota_tokens(4 * P(), 1), ""}, kNoPrefixLimit, out);
  EXPECT_EQ(m.length, 0);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(cache_.lock_ref(m.last_node), 1);  // the root
  m = cache_.match_prefix({t, "other"}, kNoPrefixLimit, out);
  EXPECT_EQ(m.length, 0);
  EXPECT_TRUE(out.empty());
  // The vector-returning overload agrees.
  EXPECT_EQ(cache_.match_prefix({t, ""}).slots, s);
  check();
}

TEST_P(RadixApiTest, InsertReturnsPrefixLengthAndLastNode) {
  const Tokens a = iota_tokens(4 * P());
  Tokens b = a;
  b[2 * P()] = -1;  // diverges in the third page
  const Slots sa = pages(4 * P());
  InsertResult r = cache_.insert({a, ""}, sa, {.ownership = SlotOwnership::kTransfer});
  EXPECT_EQ(r.prefix_len, 0);
  EXPECT_EQ(r.total_len, 4 * P());
  EXPECT_EQ(cache_.node_length(r.last_node), 4 * P());
  const Slots sb = pages(4 * P());
  r = cache_.insert({b, ""}, sb, {.ownership = SlotOwnership::kTransfer});
  EXPECT_EQ(r.prefix_len, 2 * P());
  EXPECT_EQ(static_cast<int64_t>(r), 2 * P());  // older callers read the prefix length
  EXPECT_EQ(cache_.node_length(r.last_node), 2 * P());  // b's new leaf
  // Re-inserting a prefix ends at the split node; locking it protects exactly that path.
  r = cache_.insert({Tokens(a.begin(), a.begin() + 2 * P()), ""},
                    Slots(sa.begin(), sa.begin() + 2 * P()));
  EXPECT_EQ(r.prefix_len, 2 * P());
  EXPECT_EQ(cache_.node_length(r.last_node), 2 * P());
  cache_.inc_lock_ref(r.last_node);
  EXPECT_EQ(cache_.protected_size(), 2 * P());
  cache_.dec_lock_ref(r.last_node);
  // An empty key ends at the root.
  r = cache_.insert({Tokens{}, ""}, Slots{});
  EXPECT_EQ(cache_.lock_ref(r.last_node), 1);
  check();
}

TEST_P(RadixApiTest, TransferAdoptsNewPagesAndFreesDuplicates) {
  const Tokens t = iota_tokens(4 * P());
  const Slots first = pages(4 * P());
  cache_.insert({t, ""}, first, {.ownership = SlotOwnership::kTransfer});
  // The tree adopted the caller's references: refcount 1, nothing for the caller to free.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(alloc_.refcount(PageId(first[i * P()] / P())), 1);
  // SGLang's flow: the caller computed the same prefix again into fresh pages and inserts them;
  // the tree frees those duplicates itself.
  const int64_t free_before = alloc_.available_size();
  Tokens longer = iota_tokens(6 * P());
  const Slots dup = pages(6 * P());
  const InsertResult r = cache_.insert({longer, ""}, dup, {.ownership = SlotOwnership::kTransfer});
  EXPECT_EQ(r.prefix_len, 4 * P());
  EXPECT_EQ(alloc_.available_size(), free_before - 2 * P());  // only the two new pages stay held
  for (int i = 0; i < 4; ++i) EXPECT_EQ(alloc_.refcount(PageId(dup[i * P()] / P())), 0);
  EXPECT_EQ(alloc_.refcount(PageId(dup[4 * P()] / P())), 1);
  // Misuse: freeing the duplicates again (the habit of the kRetain rule) throws, unchanged.
  expect_error(ErrorCode::kFailedPrecondition, [&] { alloc_.free(dup); });
  EXPECT_EQ(alloc_.available_size(), free_before - 2 * P());
  // Passing the tree's own slots for the prefix (from a match) hands nothing over there.
  Slots mixed = cache_.match_prefix({longer, ""}).slots;
  const Slots tail = pages(2 * P());
  mixed.insert(mixed.end(), tail.begin(), tail.end());
  longer.insert(longer.end(), t.begin(), t.begin() + 2 * P());
  EXPECT_EQ(cache_.insert({longer, ""}, mixed, {.ownership = SlotOwnership::kTransfer}).prefix_len,
            6 * P());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(alloc_.refcount(PageId(mixed[i * P()] / P())), 1);
  check();
  EXPECT_EQ(cache_.evict_all(), 8 * P());
  EXPECT_EQ(alloc_.num_free_pages(), alloc_.num_pages());
  check();
}

TEST_P(RadixApiTest, RetainRuleCallerFreesEverythingAndTheHabitLeaks) {
  const Tokens t = iota_tokens(4 * P());
  const Slots s = pages(4 * P());
  cache_.insert({t, ""}, s);  // kRetain
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 2);
  // The SGLang habit under kRetain (free only the duplicates: none here) leaves the caller's
  // reference: after evicting everything the pages are still held: a leak.
  cache_.evict_all();
  EXPECT_EQ(alloc_.num_referenced_pages(), 4);
  alloc_.free(s);  // the rule: the caller frees all of its slots
  EXPECT_EQ(alloc_.num_referenced_pages(), 0);
  check();
}

TEST_P(RadixApiTest, TransferChecksBeforeAnyChange) {
  const Tokens t = iota_tokens(4 * P());
  const Slots s = pages(4 * P());
  cache_.insert({Tokens(t.begin(), t.begin() + 2 * P()), ""}, Slots(s.begin(), s.begin() + 2 * P()),
                {.ownership = SlotOwnership::kTransfer});
  // A duplicate page that is also named as a new page: caught before the duplicates are freed.
  Slots bad = pages(2 * P());
  bad.insert(bad.end(), bad.begin(), bad.end());
  const int64_t free_before = alloc_.available_size();
  expect_error(ErrorCode::kInvalidArgument, [&] {
    cache_.insert({t, ""}, bad, {.ownership = SlotOwnership::kTransfer});
  });
  EXPECT_EQ(alloc_.available_size(), free_before);
  EXPECT_EQ(alloc_.refcount(PageId(bad[0] / P())), 1);
  EXPECT_EQ(cache_.total_size(), 2 * P());
  // A foreign page in the new part.
  Slots foreign(s.begin(), s.begin() + 2 * P());
  for (int i = 0; i < 2 * P(); ++i) foreign.push_back(60 * P() + i);
  expect_error(ErrorCode::kFailedPrecondition, [&] {
    cache_.insert({t, ""}, foreign, {.ownership = SlotOwnership::kTransfer});
  });
  EXPECT_EQ(cache_.total_size(), 2 * P());
  EXPECT_EQ(cache_.num_nodes(), 1);
  check();
}

TEST_P(RadixApiTest, APageIsStoredInOneNodeOnly) {
  const Tokens a = iota_tokens(2 * P(), 1000);
  const Tokens b = iota_tokens(2 * P(), 5000);
  const Slots s = pages(2 * P());
  cache_.insert({a, ""}, s);
  // The same pages under another key (kRetain), or handed over again (kTransfer): rejected.
  expect_error(ErrorCode::kInvalidArgument, [&] { cache_.insert({b, ""}, s); });
  expect_error(ErrorCode::kInvalidArgument, [&] {
    cache_.insert({b, ""}, s, {.ownership = SlotOwnership::kTransfer});
  });
  EXPECT_EQ(cache_.total_size(), 2 * P());
  EXPECT_EQ(alloc_.refcount(PageId(s[0] / P())), 2);  // the caller's and the tree's
  alloc_.free(s);
  check();
}

TEST_P(RadixApiTest, NoRequestTableMeansNoRequestOperations) {
  CacheRequest req = make_request(iota_tokens(3 * P()));
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.cache_finished_req(req, 0); });
  expect_error(ErrorCode::kFailedPrecondition, [&] { cache_.cache_unfinished_req(req, 0); });
}

TEST_P(RadixApiTest, EvictedNodesGiveTheirMemoryBackAndAreReused) {
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 8; ++i) {
      const Tokens t = iota_tokens(4 * P(), 100 * i + 1);
      cache_.insert({t, ""}, pages(4 * P()), {.ownership = SlotOwnership::kTransfer});
    }
    EXPECT_EQ(cache_.num_nodes(), 8);
    EXPECT_EQ(cache_.evict_all(), 32 * P());
    EXPECT_EQ(alloc_.num_free_pages(), alloc_.num_pages());
    check();
  }
}

TEST_P(RadixApiTest, RunAndScatteredValuesSplitMatchAndEvictExactly) {
  // A node stores its slots only when they are not one run of consecutive pages; both forms must
  // split, match, report events and free exactly the same pages.
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  Slots pool = pages(12 * P());  // pages 1..12, one run
  std::vector<Slots> page_slots;
  for (int i = 0; i < 12; ++i) {
    page_slots.emplace_back(pool.begin() + i * P(), pool.begin() + (i + 1) * P());
  }
  std::shuffle(page_slots.begin() + 6, page_slots.end(), rng);
  Slots run, scattered;
  for (int i = 0; i < 6; ++i) run.insert(run.end(), page_slots[i].begin(), page_slots[i].end());
  for (int i = 6; i < 12; ++i) {
    scattered.insert(scattered.end(), page_slots[i].begin(), page_slots[i].end());
  }
  if (std::equal(scattered.begin() + 1, scattered.end(), scattered.begin(),
                 [](SlotIndex b, SlotIndex a) { return b == a + 1; })) {
    std::swap_ranges(scattered.begin(), scattered.begin() + P(), scattered.end() - P());
  }
  Slots events;
  cache_.set_event_listener([&](CacheEvent e, std::span<const int32_t> key,
                                std::span<const SlotIndex> slots) {
    EXPECT_EQ(key.size(), slots.size());
    if (e == CacheEvent::kRemoved) events.insert(events.end(), slots.begin(), slots.end());
  });
  const Tokens a = iota_tokens(6 * P(), 1);
  const Tokens b = iota_tokens(6 * P(), 50000);
  cache_.insert({a, ""}, run, {.ownership = SlotOwnership::kTransfer});
  cache_.insert({b, ""}, scattered, {.ownership = SlotOwnership::kTransfer});
  check();
  Slots out;
  for (const auto& [key, value] : {std::pair{&a, &run}, std::pair{&b, &scattered}}) {
    // A match ending inside the node splits it; both halves keep their slots.
    Tokens q(key->begin(), key->begin() + 3 * P());
    q.push_back(-5);
    EXPECT_EQ(cache_.match_prefix({q, ""}, kNoPrefixLimit, out).length, 3 * P());
    EXPECT_EQ(out, Slots(value->begin(), value->begin() + 3 * P()));
    EXPECT_EQ(cache_.match_prefix({*key, ""}, kNoPrefixLimit, out).length, 6 * P());
    EXPECT_EQ(out, *value);
    check();
  }
  EXPECT_EQ(cache_.num_nodes(), 4);
  EXPECT_EQ(cache_.evict_all(), 12 * P());
  std::sort(events.begin(), events.end());
  EXPECT_EQ(events, pool);
  EXPECT_EQ(alloc_.num_free_pages(), alloc_.num_pages());
  check();
}

/// A page owner that only counts, as the SGLang harness's fake allocator does.
class CountingPages final : public kv::PageRefs {
 public:
  explicit CountingPages(int32_t page_size) : page_size_(page_size) {}
  int32_t page_size() const override { return page_size_; }
  int32_t num_pages() const override { return 1000; }
  int32_t refcount(PageId) const override { return 1; }
  void retain(std::span<const SlotIndex> s) override { retained += static_cast<int64_t>(s.size()); }
  void free(std::span<const SlotIndex> s) override { freed += static_cast<int64_t>(s.size()); }
  void require_held_runs(std::span<const SlotIndex>) const override {}
  int64_t retained = 0, freed = 0;

 private:
  int32_t page_size_;
};

TEST_P(RadixApiTest, WorksOverAnyPageOwner) {
  CountingPages pages(P());
  RadixCache cache(pages, make_lfu_policy());
  const Tokens t = iota_tokens(4 * P());
  Slots s(static_cast<size_t>(4 * P()));
  for (int i = 0; i < 4 * P(); ++i) s[static_cast<size_t>(i)] = P() + i;
  cache.insert({t, ""}, s);
  EXPECT_EQ(pages.retained, 4 * P());
  Slots out;
  EXPECT_EQ(cache.match_prefix({t, ""}, kNoPrefixLimit, out).length, 4 * P());
  EXPECT_EQ(out, s);
  EXPECT_EQ(cache.evict_all(), 4 * P());
  EXPECT_EQ(pages.freed, 4 * P());
  cache.check_integrity();
}

INSTANTIATE_TEST_SUITE_P(PageSizes, RadixApiTest, ::testing::Values(1, 4, 16),
                         [](const auto& info) { return fmt::format("P{}", info.param); });

}  // namespace
}  // namespace pagoda::cache
