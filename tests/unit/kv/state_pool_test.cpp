// StatePool (kv/state_pool.h): allocation, reference counts, zeroing on free, snapshot / restore
// with copy_slot, exhaustion, bad input left unchanged, and leak accounting; plus a random
// workload of requests and snapshots against a model of the holders (seed printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kv/state_pool.h"
#include "test_seed.h"

namespace pagoda::kv {
namespace {

constexpr StateShape kStateShape{
    .conv_dim = 6, .conv_width = 3, .num_heads = 2, .head_dim = 3, .state_size = 4};

/// Writes a pattern derived from `tag` into every layer's state of `slot`.
void fill_state(StatePool& pool, int32_t slot, float tag) {
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    float* c = pool.conv_state(l, slot);
    for (int64_t i = 0; i < kStateShape.conv_floats(); ++i) c[i] = tag + 0.25f * l + 0.001f * i;
    float* h = pool.ssm_state(l, slot);
    for (int64_t i = 0; i < kStateShape.ssm_floats(); ++i) h[i] = -tag - 0.5f * l - 0.002f * i;
  }
}

/// Every float of `slot`, all layers, conv then SSM.
std::vector<float> state_contents(const StatePool& pool, int32_t slot) {
  std::vector<float> out;
  for (int32_t l = 0; l < pool.num_layers(); ++l) {
    const float* c = pool.conv_state(l, slot);
    out.insert(out.end(), c, c + kStateShape.conv_floats());
    const float* h = pool.ssm_state(l, slot);
    out.insert(out.end(), h, h + kStateShape.ssm_floats());
  }
  return out;
}

bool state_all_zero(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return x == 0.f; });
}

void expect_state_error(ErrorCode code, auto&& fn) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

TEST(StatePool, AllocFreeZeroesAndReuses) {
  StatePool pool(3, 4, kStateShape);
  EXPECT_EQ(pool.bytes_per_slot(), 3 * (18 + 24) * 4);
  const int32_t a = pool.alloc();
  const int32_t b = pool.alloc();
  EXPECT_NE(a, b);
  EXPECT_TRUE(state_all_zero(state_contents(pool, a)));
  fill_state(pool, a, 1.f);
  fill_state(pool, b, 2.f);
  EXPECT_FALSE(state_all_zero(state_contents(pool, a)));
  // Layers and slots do not alias: b's pattern is intact after writing a.
  const std::vector<float> b_before = state_contents(pool, b);
  fill_state(pool, a, 3.f);
  EXPECT_EQ(state_contents(pool, b), b_before);
  pool.free(a);
  EXPECT_EQ(pool.refcount(a), 0);
  EXPECT_TRUE(state_all_zero(state_contents(pool, a)));
  pool.check_integrity();
  const int32_t c = pool.alloc();  // the freed slot comes back, zeroed
  EXPECT_EQ(c, a);
  EXPECT_TRUE(state_all_zero(state_contents(pool, c)));
  EXPECT_EQ(state_contents(pool, b), b_before);
  pool.check_integrity();
}

TEST(StatePool, RefcountsKeepASharedSlot) {
  StatePool pool(2, 2, kStateShape);
  const int32_t a = pool.alloc();
  fill_state(pool, a, 5.f);
  pool.retain(a);
  EXPECT_EQ(pool.refcount(a), 2);
  pool.free(a);
  EXPECT_EQ(pool.refcount(a), 1);
  EXPECT_FALSE(state_all_zero(state_contents(pool, a)));  // one holder left: contents kept
  pool.free(a);
  EXPECT_TRUE(state_all_zero(state_contents(pool, a)));
  expect_state_error(ErrorCode::kFailedPrecondition, [&] { pool.free(a); });  // double free
  expect_state_error(ErrorCode::kFailedPrecondition, [&] { pool.retain(a); });
  expect_state_error(ErrorCode::kOutOfRange, [&] { pool.free(2); });
  expect_state_error(ErrorCode::kOutOfRange, [&] { pool.free(-1); });
  expect_state_error(ErrorCode::kOutOfRange, [&] { (void)pool.conv_state(2, 0); });
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_integrity();
}

TEST(StatePool, SnapshotAndRestore) {
  StatePool pool(2, 3, kStateShape);
  const int32_t req = pool.alloc();
  fill_state(pool, req, 7.f);
  const std::vector<float> at_prefix = state_contents(pool, req);
  const int32_t node = pool.alloc();  // a radix node's snapshot of the state at the prefix
  pool.copy_slot(req, node);
  EXPECT_EQ(state_contents(pool, node), at_prefix);
  EXPECT_EQ(state_contents(pool, req), at_prefix);   // the source is unchanged
  fill_state(pool, req, 9.f);                        // the request runs on
  EXPECT_EQ(state_contents(pool, node), at_prefix);  // the snapshot is its own copy
  pool.free(req);
  const int32_t hit = pool.alloc();  // a later request hits the prefix: restore
  pool.copy_slot(node, hit);
  EXPECT_EQ(state_contents(pool, hit), at_prefix);
  expect_state_error(ErrorCode::kInvalidArgument, [&] { pool.copy_slot(hit, hit); });
  ASSERT_EQ(pool.num_free(), 1);
  int32_t spare = 0;
  while (pool.refcount(spare) != 0) ++spare;
  expect_state_error(ErrorCode::kFailedPrecondition, [&] { pool.copy_slot(spare, hit); });
  expect_state_error(ErrorCode::kFailedPrecondition, [&] { pool.copy_slot(hit, spare); });
  EXPECT_EQ(state_contents(pool, hit), at_prefix);  // the failed copies changed nothing
  EXPECT_TRUE(state_all_zero(state_contents(pool, spare)));
  pool.check_integrity();
}

TEST(StatePool, ExhaustionAndBadShapes) {
  StatePool pool(1, 2, kStateShape);
  pool.alloc();
  pool.alloc();
  EXPECT_FALSE(pool.try_alloc().has_value());
  try {
    pool.alloc();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_NE(e.message().find("all 2 slots"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.num_held(), 2);
  pool.check_integrity();
  expect_state_error(ErrorCode::kInvalidArgument, [] { StatePool(0, 1, kStateShape); });
  expect_state_error(ErrorCode::kInvalidArgument, [] { StatePool(1, 0, kStateShape); });
  StateShape bad = kStateShape;
  bad.state_size = 0;
  expect_state_error(ErrorCode::kInvalidArgument, [&] { StatePool(1, 1, bad); });
  bad = kStateShape;
  bad.conv_width = 0;  // d_conv 1: no past inputs, legal
  StatePool no_conv(1, 1, bad);
  EXPECT_EQ(no_conv.bytes_per_slot(), 24 * 4);
}

TEST(StatePool, LeakAccounting) {
  StatePool pool(1, 4, kStateShape);
  const int32_t a = pool.alloc(), b = pool.alloc(), c = pool.alloc();
  pool.retain(b);
  const std::vector<int32_t> all{a, b, b, c};
  EXPECT_TRUE(pool.leaked(all).empty());
  const std::vector<int32_t> lost_b{a, b, c};  // one holder of b forgot it
  EXPECT_EQ(pool.leaked(lost_b), std::vector<int32_t>{b});
  const std::vector<int32_t> none;
  std::vector<int32_t> sorted{a, b, c};
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(pool.leaked(none), sorted);
  const std::vector<int32_t> stale{a, b, b, c, c};  // c named twice, held once
  expect_state_error(ErrorCode::kFailedPrecondition, [&] { (void)pool.leaked(stale); });
  const std::vector<int32_t> outside{9};
  expect_state_error(ErrorCode::kOutOfRange, [&] { (void)pool.leaked(outside); });
}

// A random mix of request allocations, node snapshots (retained by a second holder at times),
// restores and frees, against a model holding every slot's expected contents and holders.
TEST(StatePool, RandomWorkloadMatchesModel) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  StatePool pool(2, 8, kStateShape);
  std::vector<int32_t> holders;  // one entry per reference
  std::map<int32_t, float> tag;  // expected contents of held slots (0: zero)
  for (int op = 0; op < 400; ++op) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      std::optional<int32_t> s = pool.try_alloc();
      ASSERT_EQ(s.has_value(), tag.size() < 8u);
      if (!s) continue;
      EXPECT_TRUE(state_all_zero(state_contents(pool, *s)));
      const float t = static_cast<float>(op + 1);
      fill_state(pool, *s, t);
      tag[*s] = t;
      holders.push_back(*s);
    } else if (kind == 1 && !holders.empty()) {
      const int32_t s = holders[rng() % holders.size()];
      if (rng() % 2) {
        pool.retain(s);
        holders.push_back(s);
      } else if (std::optional<int32_t> d = pool.try_alloc()) {
        pool.copy_slot(s, *d);
        tag[*d] = tag[s];
        holders.push_back(*d);
      }
    } else if (!holders.empty()) {
      const size_t i = rng() % holders.size();
      const int32_t s = holders[i];
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
      pool.free(s);
      if (std::count(holders.begin(), holders.end(), s) == 0) tag.erase(s);
    }
    for (const auto& [s, t] : tag) {
      StatePool probe(2, 1, kStateShape);
      const int32_t p = probe.alloc();
      fill_state(probe, p, t);
      ASSERT_EQ(state_contents(pool, s), state_contents(probe, p)) << "slot " << s << " op " << op;
    }
    ASSERT_TRUE(pool.leaked(holders).empty());
    ASSERT_EQ(pool.num_held(), static_cast<int32_t>(tag.size()));
  }
  pool.check_integrity();
  for (int32_t s : holders) pool.free(s);
  EXPECT_EQ(pool.num_free(), 8);
  pool.check_integrity();
}

}  // namespace
}  // namespace pagoda::kv
