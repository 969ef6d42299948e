// HiCache over real pools: write policies, load-back of an evicted prefix with the KV it had,
// a full host pool, no device room, and clean draining. The KV rows are a function of the token
// prefix (tier_test_util.h), so every admitted prefix is checked against what was computed.
#include "pagoda/tier/hicache.h"

#include <gtest/gtest.h>

#include <random>

#include "pagoda/core/error.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using testing::Harness;
using testing::small_pool;

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 1000);
  return t;
}

TEST(HiCache, WriteThroughLoadsBackEvictedPrefix) {
  for (const int32_t page : {1, 16}) {
    const uint64_t seed = 11 + static_cast<uint64_t>(page);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << page);
    std::mt19937_64 rng(seed);
    Harness h(256 / page, page, {.host = {.ratio = 4}});
    const auto a = random_tokens(rng, 100);
    EXPECT_EQ(h.run(a), 0);
    const int64_t stored = 100 / page * page;
    EXPECT_EQ(h.cache.host().num_entries(), stored / page);  // backed up when stored
    EXPECT_EQ(h.cache.evict(1 << 20), stored);
    h.check();
    EXPECT_EQ(h.cache.total_size(), 0);
    auto b = a;
    const auto tail = random_tokens(rng, 20);
    b.insert(b.end(), tail.begin(), tail.end());
    EXPECT_EQ(h.run(b), stored);  // the whole stored prefix came back from the host
    const TierStats s = h.cache.tier_stats();
    EXPECT_EQ(s.host_hit_tokens, stored);
    EXPECT_EQ(s.device_hit_tokens, 0);
    EXPECT_EQ(s.transfer.load_pages, stored / page);
    EXPECT_EQ(h.cache.stats().matched_tokens, stored);
  }
}

TEST(HiCache, WriteBackCopiesOnlyOnEviction) {
  std::mt19937_64 rng(5);
  Harness h(64, 4, {.host = {.ratio = 2}, .write_policy = WritePolicy::kWriteBack});
  const auto a = random_tokens(rng, 50);
  h.run(a);
  EXPECT_EQ(h.cache.host().num_entries(), 0);
  EXPECT_EQ(h.cache.evict(1 << 20), 48);
  EXPECT_EQ(h.cache.host().num_entries(), 12);
  EXPECT_EQ(h.run(a), 48);
  EXPECT_EQ(h.cache.tier_stats().host_hit_tokens, 48);
}

TEST(HiCache, SelectiveBacksUpAfterThresholdHits) {
  std::mt19937_64 rng(6);
  Harness h(64, 4, {.host = {.ratio = 2}, .write_policy = WritePolicy::kWriteThroughSelective,
                    .selective_threshold = 2});
  const auto a = random_tokens(rng, 41);
  h.run(a);
  EXPECT_EQ(h.cache.host().num_entries(), 0);
  EXPECT_EQ(h.run(a), 40);  // first hit
  EXPECT_EQ(h.cache.host().num_entries(), 0);
  EXPECT_EQ(h.run(a), 40);  // second hit: backed up
  EXPECT_EQ(h.cache.host().num_entries(), 10);
  // Below the threshold a page is dropped on eviction, not backed up.
  const auto b = random_tokens(rng, 21);
  h.run(b);
  h.cache.evict(1 << 20);
  EXPECT_EQ(h.cache.host().num_entries(), 10);
  EXPECT_EQ(h.run(a), 40);
  EXPECT_EQ(h.run(b), 0);
}

TEST(HiCache, FullHostPoolDegradesToDeviceOnly) {
  std::mt19937_64 rng(7);
  // 40 device pages, a host tier of 2 pages.
  Harness h(40, 4, {.host = {.ratio = 0.05}});
  EXPECT_EQ(h.cache.host().capacity_pages(), 2);
  const auto a = random_tokens(rng, 60);
  h.run(a);
  EXPECT_EQ(h.cache.host().num_entries(), 2);
  EXPECT_GT(h.cache.tier_stats().backup_skipped_pages, 0);
  h.cache.evict(1 << 20);
  // At most the two host pages come back (only when they are the prefix's first pages).
  const int64_t pre = h.run(a);
  EXPECT_LE(pre, 8);
  EXPECT_EQ(pre % 4, 0);
}

TEST(HiCache, NoDeviceRoomMeansRecompute) {
  std::mt19937_64 rng(8);
  Harness h(20, 4, {.host = {.ratio = 4}});
  const auto a = random_tokens(rng, 41);
  h.run(a);
  h.cache.evict(1 << 20);
  // Two requests hold most of the device pool (locked, unfinished).
  cache::CacheRequest x, y;
  h.run(random_tokens(rng, 36), &x);
  h.run(random_tokens(rng, 36), &y);
  // 10 host pages but 2 free device pages and nothing evictable: the load-back is skipped.
  cache::CacheRequest r;
  r.tokens = a;
  h.cache.admit(r, 40);
  EXPECT_EQ(r.cache_protected_len, 0);
  h.cache.begin_forward();  // the step's admissions are counted here
  h.cache.end_forward();
  EXPECT_EQ(h.cache.tier_stats().load_skipped_tokens, 40);
  h.cache.dec_lock_ref(r.last_node);
  // An admission the scheduler takes back (unadmit) is not counted.
  const int64_t calls = h.cache.stats().match_calls;
  r = cache::CacheRequest{};
  r.tokens = a;
  h.cache.admit(r, 40);
  h.cache.unadmit(r);
  h.cache.begin_forward();
  h.cache.end_forward();
  EXPECT_EQ(h.cache.stats().match_calls, calls);
  EXPECT_FALSE(r.last_node.has_node());
  for (cache::CacheRequest* r : {&x, &y}) {
    h.cache.cache_finished_req(*r, static_cast<int64_t>(r->tokens.size()));
    h.table.free(r->req_slot);
  }
  h.check();
}

TEST(HiCache, DrainsEveryTier) {
  std::mt19937_64 rng(9);
  Harness h(32, 4, {.host = {.ratio = 3}});
  for (int i = 0; i < 10; ++i) h.run(random_tokens(rng, 10 + rng() % 60));
  h.cache.evict(1 << 20);
  const int64_t host_pages = h.cache.host().num_entries();
  EXPECT_GT(host_pages, 0);
  EXPECT_EQ(h.cache.drain_host(), host_pages);
  h.check();
  EXPECT_EQ(h.alloc.num_free_pages(), h.alloc.num_pages());
  EXPECT_EQ(h.cache.host_pool().pages().num_free_pages(), h.cache.host_pool().pages().num_pages());
}

TEST(HiCache, BadConfigIsAnError) {
  auto platform = platform::make_cpu_platform();
  kv::PageAllocator alloc(8, 4);
  kv::ReqToTokenTable table(2, 64);
  kv::KvPool dev(small_pool(8, 4), platform->allocator());
  EXPECT_THROW(HiCache(alloc, table, dev, *platform, {}), Error);
  EXPECT_THROW(HiCache(alloc, table, dev, *platform, {.host = {.ratio = -1}}), Error);
  EXPECT_THROW(HiCache(alloc, table, dev, *platform, {.host = {.ratio = 1, .bytes = 64}}), Error);
  EXPECT_THROW(parse_write_policy("write_sometimes"), Error);
  EXPECT_EQ(parse_write_policy("write_back"), WritePolicy::kWriteBack);
}

}  // namespace
}  // namespace pagoda::tier
