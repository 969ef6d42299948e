// MambaRadixCache: the radix cache of a hybrid model keeps recurrent-state snapshots at tree nodes
// (docs/design/state_pool.md "Prefix reuse"). The "model" here is a fingerprint: after running
// tokens[:n] a request's state slot holds a hash of tokens[:n] (spread over exactly
// representable floats in every layer's conv and SSM state), so a restored state names the
// prefix it was taken after. The oracle is a set of the prefixes a snapshot was taken for,
// written from the rules (independently of the tree): with room for every page and snapshot, a
// hit is the longest snapshotted prefix within the scheduler's cap; under pressure, a hit is
// some snapshotted prefix, restored with that prefix's state. Every step also checks the tree,
// the pool and that no state slot is held by nobody.
#include "pagoda/cache/mamba_radix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cache_test_util.h"
#include "test_seed.h"
#include "pagoda/kv/state_pool.h"

namespace pagoda::cache {
namespace {

using testing::expect_error;
using testing::prefill;
using testing::Tokens;

constexpr kv::StateShape kShape{
    .conv_dim = 6, .conv_width = 3, .num_heads = 2, .head_dim = 3, .state_size = 4};
constexpr int32_t kLayers = 2;

uint64_t fingerprint(const Tokens& t, int64_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(t[static_cast<size_t>(i)]) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

/// The "model": the state after tokens[:n] (every float of every layer set).
void write_state(kv::StatePool& pool, int32_t slot, const Tokens& t, int64_t n) {
  const uint64_t h = fingerprint(t, n);
  for (int32_t l = 0; l < kLayers; ++l) {
    float* c = pool.conv_state(l, slot);
    float* s = pool.ssm_state(l, slot);
    for (int64_t i = 0; i < kShape.conv_floats(); ++i)
      c[i] = static_cast<float>((h >> (i % 3 * 20)) & 0xFFFFF) + static_cast<float>(l);
    for (int64_t i = 0; i < kShape.ssm_floats(); ++i)
      s[i] = static_cast<float>((h >> (i % 3 * 20)) & 0xFFFFF) - static_cast<float>(i);
  }
}

bool holds_state(const kv::StatePool& pool, int32_t slot, const Tokens& t, int64_t n) {
  const uint64_t h = fingerprint(t, n);
  for (int32_t l = 0; l < kLayers; ++l) {
    const float* c = pool.conv_state(l, slot);
    const float* s = pool.ssm_state(l, slot);
    for (int64_t i = 0; i < kShape.conv_floats(); ++i)
      if (c[i] != static_cast<float>((h >> (i % 3 * 20)) & 0xFFFFF) + static_cast<float>(l))
        return false;
    for (int64_t i = 0; i < kShape.ssm_floats(); ++i)
      if (s[i] != static_cast<float>((h >> (i % 3 * 20)) & 0xFFFFF) - static_cast<float>(i))
        return false;
  }
  return true;
}

bool is_zero(const kv::StatePool& pool, int32_t slot) {
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int64_t i = 0; i < kShape.conv_floats(); ++i)
      if (pool.conv_state(l, slot)[i] != 0.0f) return false;
    for (int64_t i = 0; i < kShape.ssm_floats(); ++i)
      if (pool.ssm_state(l, slot)[i] != 0.0f) return false;
  }
  return true;
}

struct Fixture {
  Fixture(int32_t page, int32_t pages, int32_t state_slots)
      : alloc(pages, page), table(4, 512), states(kLayers, state_slots, kShape),
        cache(alloc, table, states) {}

  /// Every holder of a state slot known: the snapshots and `request_slot` (-1: none).
  void audit(int32_t request_slot = -1) const {
    cache.check_integrity();
    states.check_integrity();
    std::vector<int32_t> holders = cache.state_slots();
    if (request_slot >= 0) holders.push_back(request_slot);
    EXPECT_TRUE(states.leaked(holders).empty());
  }

  kv::PageAllocator alloc;
  kv::ReqToTokenTable table;
  kv::StatePool states;
  MambaRadixCache cache;
};

/// Runs `req` (admitted, row allocated) to `len` tokens, optionally in chunks of `chunk`
/// (page aligned), snapshotting at each chunk end; then finishes it and frees its row and slot.
void run_and_finish(Fixture& f, CacheRequest& req, int64_t len, int64_t chunk) {
  int64_t done = static_cast<int64_t>(req.prefix_slots.size());
  while (chunk > 0 && len - done > chunk) {
    done += chunk;
    write_state(f.states, req.state_slot, req.tokens, done);
    f.cache.cache_unfinished_req(req, done);
    f.audit(req.state_slot);
  }
  write_state(f.states, req.state_slot, req.tokens, len);
  f.cache.cache_finished_req(req, len);
  f.table.free(req.req_slot);
  f.states.free(req.state_slot);
  req.state_slot = -1;
  f.audit();
}

TEST(MambaRadixCache, HitRestoresTheSnapshotAndCutsBackToIt) {
  for (int32_t page : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "page " << page);
    Fixture f(page, 64, 4);
    CacheRequest a = testing::make_request(testing::iota_tokens(20));
    a.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, a));
    EXPECT_EQ(a.cache_protected_len, 0);
    EXPECT_TRUE(is_zero(f.states, a.state_slot)) << "a miss starts from the zero state";
    run_and_finish(f, a, 20, 0);
    EXPECT_EQ(f.cache.num_states(), 1);
    EXPECT_EQ(f.cache.state_stats().taken, 1);

    // A follow-up turn: the conversation so far, then new tokens. Its hit restores the state.
    Tokens next = a.tokens;
    for (int32_t i = 0; i < 9; ++i) next.push_back(5000 + i);
    CacheRequest b = testing::make_request(next);
    b.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, b));
    EXPECT_EQ(b.cache_protected_len, 20);
    EXPECT_TRUE(holds_state(f.states, b.state_slot, a.tokens, 20));
    EXPECT_EQ(f.cache.state_stats().restored, 1);
    f.audit(b.state_slot);
    run_and_finish(f, b, static_cast<int64_t>(next.size()) - 1, 0);
    // 28 tokens: a snapshot at page 1 and 4 (aligned); the first one stays.
    EXPECT_EQ(f.cache.num_states(), 2);

    // A request that shares 12 tokens only: the tree matches 12, but no node ending at or
    // before 12 has a state, so the hit is cut back to nothing (the split node has none).
    Tokens other(a.tokens.begin(), a.tokens.begin() + 12);
    for (int32_t i = 0; i < 8; ++i) other.push_back(7000 + i);
    CacheRequest c = testing::make_request(other);
    c.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, c));
    EXPECT_EQ(c.cache_protected_len, 0);
    EXPECT_TRUE(is_zero(f.states, c.state_slot));
    run_and_finish(f, c, 20, 0);

    // The whole first conversation again: capped at len - 1 = 19 < 20, and the split node that
    // ends at 19 (or 16 at page 4) has no state: a miss.
    CacheRequest d = testing::make_request(a.tokens);
    d.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, d));
    EXPECT_EQ(d.cache_protected_len, 0);
    run_and_finish(f, d, 20, 0);  // the tokens of a's snapshot: it stays, no new one

    // Evicting the tree gives every snapshot's slot back.
    f.cache.evict(1 << 20);
    EXPECT_EQ(f.cache.num_states(), 0);
    EXPECT_EQ(f.states.num_held(), 0);
    f.audit();
  }
}

TEST(MambaRadixCache, EvictStatesDropsTheLeastRecentlyUsedAndKeepsTheKv) {
  Fixture f(1, 256, 3);
  std::vector<Tokens> convs;
  for (int32_t k = 0; k < 2; ++k) {  // two snapshots: slots 3 - 1 request = 2
    CacheRequest r = testing::make_request(testing::iota_tokens(10, 100 * (k + 1)));
    r.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, r));
    run_and_finish(f, r, 10, 0);
    convs.push_back(r.tokens);
  }
  // Touch the first by a hit; the second becomes the least recently used.
  Tokens t0 = convs[0];
  t0.push_back(1);
  CacheRequest hit = testing::make_request(t0);
  hit.state_slot = f.states.alloc();
  ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, hit));
  EXPECT_EQ(hit.cache_protected_len, 10);
  run_and_finish(f, hit, 10, 0);  // same tokens as conv 0: no new snapshot
  EXPECT_EQ(f.cache.num_states(), 2);
  const int64_t kv = f.cache.total_size();
  EXPECT_EQ(f.cache.evict_states(1), 1);
  EXPECT_EQ(f.cache.state_stats().dropped, 1);
  EXPECT_EQ(f.cache.total_size(), kv) << "dropping a snapshot keeps its KV";
  f.audit();
  for (int32_t k = 0; k < 2; ++k) {
    Tokens t = convs[static_cast<size_t>(k)];
    t.push_back(2);
    CacheRequest r = testing::make_request(t);
    r.state_slot = f.states.alloc();
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, r));
    EXPECT_EQ(r.cache_protected_len, k == 0 ? 10 : 0) << "conversation " << k;
    f.cache.cache_finished_req(r, static_cast<int64_t>(t.size()), FinishPolicy::kNoInsert);
    f.table.free(r.req_slot);
    f.states.free(r.state_slot);
  }
  f.audit();
}

TEST(MambaRadixCache, AdmitNeedsAHeldStateSlotAndChangesNothingWithout) {
  Fixture f(1, 64, 2);
  CacheRequest r = testing::make_request(testing::iota_tokens(8));
  expect_error(ErrorCode::kInvalidArgument, [&] { f.cache.admit(r, 7); });
  r.state_slot = 1;  // in range but free
  expect_error(ErrorCode::kInvalidArgument, [&] { f.cache.admit(r, 7); });
  EXPECT_FALSE(r.last_node.has_node());
  EXPECT_EQ(f.cache.stats().match_calls, 0);
  f.audit();
}

/// A random multi-turn workload: follow-ups of earlier conversations cut at random points,
/// fresh prompts, chunked and unchunked prefills, at pages 1 and 4; `roomy` gives every page and
/// snapshot room (exact hits), else a small KV pool and 3 state slots force evictions.
void random_workload(int32_t page, bool roomy, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "page " << page << (roomy ? " roomy" : " tight"));
  std::mt19937_64 rng(seed);
  Fixture f(page, roomy ? 16384 : 256 / page, roomy ? 4096 : 3);
  std::vector<Tokens> history;
  std::set<Tokens> snapshotted;  // the oracle: prefixes a snapshot was taken for
  auto note = [&](const Tokens& t, int64_t n) {
    if (n > 0 && n % page == 0) snapshotted.insert(Tokens(t.begin(), t.begin() + n));
  };
  int hits = 0;
  for (int it = 0; it < 150; ++it) {
    Tokens t;
    if (!history.empty() && rng() % 4 != 0) {
      // A recent conversation (multi-turn: its follow-up, or a branch of it).
      const Tokens& h = history[history.size() - 1 - rng() % std::min<size_t>(4, history.size())];
      const size_t keep = rng() % 3 == 0 ? rng() % (h.size() + 1) : h.size();
      t.assign(h.begin(), h.begin() + static_cast<int64_t>(keep));
    }
    const int extra = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(rng() % 6));  // collisions
    if (t.size() > 160) t.resize(160);
    CacheRequest r = testing::make_request(t);
    std::optional<int32_t> slot = f.states.try_alloc();
    if (!slot && f.cache.evict_states(1) > 0) slot = f.states.try_alloc();
    ASSERT_TRUE(slot.has_value()) << "a request always finds a slot once snapshots give way";
    r.state_slot = *slot;
    // The KV the request ends with: all its tokens, or all but the last (a finished request's
    // last token is not fed).
    const int64_t len = static_cast<int64_t>(t.size());
    const int64_t end = len > 1 && rng() % 2 == 0 ? len - 1 : len;
    if (f.alloc.available_size() < end + page) f.cache.evict(end + page);
    ASSERT_TRUE(prefill(f.cache, f.alloc, f.table, r, end)) << "iteration " << it;
    const int64_t hit = r.cache_protected_len;
    const int64_t cap = scheduler_prefix_limit(end);
    ASSERT_LE(hit, cap);
    if (hit > 0) {
      ++hits;
      ASSERT_TRUE(snapshotted.contains(Tokens(t.begin(), t.begin() + hit)))
          << "iteration " << it << ": a hit of " << hit << " tokens no snapshot was taken for";
      ASSERT_TRUE(holds_state(f.states, r.state_slot, t, hit)) << "iteration " << it;
    } else {
      ASSERT_TRUE(is_zero(f.states, r.state_slot));
    }
    if (roomy) {
      int64_t want = 0;
      for (int64_t n = cap; n > 0; --n)
        if (snapshotted.contains(Tokens(t.begin(), t.begin() + n))) {
          want = n;
          break;
        }
      ASSERT_EQ(hit, want) << "iteration " << it << ": not the longest snapshotted prefix";
    }
    f.audit(r.state_slot);
    // Run: chunks of 8 (page aligned) half the time.
    const int64_t chunk = rng() % 2 == 0 ? 8 : 0;
    for (int64_t d = hit; chunk > 0 && end - d > chunk;) {
      d += chunk;
      note(t, d);
    }
    note(t, end);
    run_and_finish(f, r, end, chunk);
    history.push_back(t);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Hits over 300 seeds (page 1 / 4): roomy mean 107 / 79, least 85 / 52; tight mean 34 / 35,
  // least 18 / 18 (a bound of 20 failed one seed in ~120). Far below those: a workload that hits.
  EXPECT_GT(hits, roomy ? 30 : 8) << "the workload barely hit";
  if (roomy) EXPECT_EQ(f.cache.state_stats().no_slot, 0);
  else EXPECT_GT(f.cache.state_stats().dropped + f.cache.state_stats().released, 0);
  f.cache.evict(1 << 20);
  f.cache.evict_states(1 << 20);
  EXPECT_EQ(f.states.num_held(), 0);
  EXPECT_EQ(f.alloc.available_size(), int64_t{f.alloc.num_pages()} * page) << "pages leaked";
  f.audit();
}

TEST(MambaRadixCache, RandomWorkloadMatchesTheSnapshotOracle) {
  const pagoda::testing::TestSeed seed(pagoda::testing::process_seed());
  for (int32_t page : {1, 4})
    for (bool roomy : {true, false}) random_workload(page, roomy, seed);
}

}  // namespace
}  // namespace pagoda::cache
