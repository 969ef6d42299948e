#include "pagoda/cache/eviction_policy.h"

#include <gtest/gtest.h>

#include "cache_test_util.h"
#include "pagoda/cache/radix_cache.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {
namespace {

using namespace pagoda::cache::testing;

TEST(EvictionPolicy, KeysAndNames) {
  const NodeStats s{.last_access = 7, .creation = 3, .hit_count = 2, .priority = -1};
  EXPECT_EQ(make_lru_policy()->key(s), (EvictionKey{7, 0}));
  EXPECT_EQ(make_lfu_policy()->key(s), (EvictionKey{2, 7}));
  EXPECT_EQ(make_fifo_policy()->key(s), (EvictionKey{3, 0}));
  EXPECT_EQ(make_priority_policy()->key(s), (EvictionKey{-1, 7}));
  for (auto name : eviction_policy_names()) EXPECT_EQ(make_eviction_policy(name)->name(), name);
  try {
    make_eviction_policy("mru");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lru, lfu, fifo, priority"), std::string::npos);
  }
}

/// Three disjoint sequences a, b, c inserted in that order with a given priority, then a touched
/// by a match and c inserted twice (hit_count 2). Returns which one is evicted first.
char first_victim(std::string_view policy) {
  kv::PageAllocator alloc(16, 2);
  kv::ReqToTokenTable table(2, 16);
  RadixCache cache(alloc, table, make_eviction_policy(policy));
  const Tokens a = iota_tokens(2, 100), b = iota_tokens(2, 200), c = iota_tokens(2, 300);
  const int32_t prio[] = {5, 1, 9};
  const Tokens* seqs[] = {&a, &b, &c};
  for (int i = 0; i < 3; ++i) {
    Slots s = *alloc.alloc(2);
    cache.insert({*seqs[i], ""}, s, InsertOptions{.priority = prio[i]});
    alloc.free(s);
  }
  Slots extra = *alloc.alloc(2);
  cache.insert({c, ""}, extra);  // hit_count of c -> 2
  cache.insert({a, ""}, extra);  // hit_count of a -> 2, and a is the most recent
  alloc.free(extra);
  cache.match_prefix({b, ""});  // b is now the most recently used
  std::vector<SlotIndex> removed;
  cache.set_event_listener([&](CacheEvent e, std::span<const int32_t> key, auto) {
    if (e == CacheEvent::kRemoved) removed.push_back(key[0]);
  });
  cache.evict(1);
  cache.check_integrity();
  return removed.size() == 1 ? static_cast<char>('a' + (removed[0] / 100 - 1)) : '?';
}

TEST(EvictionPolicy, OrderInTheTree) {
  EXPECT_EQ(first_victim("lru"), 'c');       // a touched by insert, b by match; c oldest
  EXPECT_EQ(first_victim("fifo"), 'a');      // created first
  EXPECT_EQ(first_victim("lfu"), 'b');       // hit once, a and c twice
  EXPECT_EQ(first_victim("priority"), 'b');  // lowest priority
}

}  // namespace
}  // namespace pagoda::cache
