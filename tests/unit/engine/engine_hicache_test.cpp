// The hierarchical KV cache in the engine: a multi-turn workload whose live KV is several times
// the device pool gives the same greedy tokens with the host tier as without it (f32 on the
// CPU), at page sizes 1, 16 and 64, with and without chunked prefill, under retraction; the host
// tier serves hits the device tree lost, and no page leaks in either tier.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <random>

#include "engine_test_util.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/tp.h"
#include "pagoda/model/llama_worker.h"
#include "redis_server.h"

namespace pagoda::engine {
namespace {

using testing::test_model;

struct Turns {
  std::vector<std::vector<int32_t>> outputs;  ///< per request, in submission order
  EngineStats stats;
  int64_t retractions = 0;
  tier::TransferStats drained;  ///< the tier's copies once both caches were drained
};

/// `convs` conversations x `turns` turns: a shared system prompt, each turn appends the previous
/// answer and a new user message. Every turn of every conversation is submitted at once;
/// `after_turn(t)` runs once turn t has finished.
/// `tp` > 1 runs the model over an in-process tensor-parallel group of that many ranks;
/// otherwise `make_worker` builds the worker when given.
Turns run_multiturn(const EngineConfig& cfg, uint64_t seed, int convs, int turns, int max_new,
                    const std::function<void(int)>& after_turn = {}, int tp = 1,
                    const WorkerFactory& make_worker = {}) {
  std::mt19937_64 rng(seed);
  auto rand_tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  };
  const auto system = rand_tokens(40);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(convs), system);
  LocalTpGroup group(tp);
  Engine engine(test_model().model, cfg, nullptr, tp > 1 ? group.factory() : make_worker);
  Turns out;
  for (int t = 0; t < turns; ++t) {
    std::vector<RequestId> ids;
    for (auto& h : history) {
      const auto user = rand_tokens(8 + rng() % 12);
      h.insert(h.end(), user.begin(), user.end());
      ids.push_back(engine.add_request({.prompt = h, .max_new_tokens = max_new, .ignore_eos = true}));
    }
    engine.run_until_idle();
    for (size_t c = 0; c < ids.size(); ++c) {
      const RequestOutput o = engine.output(ids[c]);
      EXPECT_EQ(o.finish_reason, FinishReason::kLength) << o.error;
      history[c].insert(history[c].end(), o.output_ids.begin(), o.output_ids.end());
      out.outputs.push_back(o.output_ids);
      engine.release(ids[c]);
    }
    if (after_turn) after_turn(t);
  }
  out.stats = engine.stats();
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_host_pages(), 0);
  engine.memory().drain_prefix_cache();
  engine.memory().drain_host_cache();
  EXPECT_EQ(engine.memory().free_pages(), engine.memory().total_pages());
  EXPECT_EQ(engine.memory().leaked_host_pages(), 0);
  EXPECT_EQ(group.follower_error(), "");
  out.drained = engine.stats().tier.transfer;
  return out;
}

struct HiCacheCase {
  int32_t page_size;
  int32_t chunk;
  int32_t max_new = 6;  ///< long answers grow the decodes past the pool: retraction
  int turns = 4;
};

class EngineHiCache : public ::testing::TestWithParam<HiCacheCase> {};

TEST_P(EngineHiCache, SameTokensMoreHits) {
  const HiCacheCase c = GetParam();
  const uint64_t seed = 4300 + static_cast<uint64_t>(c.page_size);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << c.page_size << " chunk "
                                    << c.chunk);
  // 6 conversations reach ~40 + 4 x (14 + 6) = 120 tokens each (720 live tokens over a
  // 256-token device pool); with 48-token answers and 3 turns ~230 each, and the decodes
  // retract.
  EngineConfig cfg{.page_size = c.page_size,
                   .pool_tokens = 256,
                   .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = c.chunk},
                   .backend = testing::backend_named("cpu"),
                   .check_integrity = true};
  const Turns device_only = run_multiturn(cfg, seed, 6, c.turns, c.max_new);
  cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 8}};
  const Turns tiered = run_multiturn(cfg, seed, 6, c.turns, c.max_new);
  ASSERT_EQ(device_only.outputs.size(), tiered.outputs.size());
  for (size_t i = 0; i < tiered.outputs.size(); ++i)
    EXPECT_EQ(device_only.outputs[i], tiered.outputs[i]) << "request " << i;
  const EngineStats& s = tiered.stats;
  EXPECT_TRUE(s.hicache);
  EXPECT_GT(s.tier.host_hit_tokens, 0);
  // Every host hit was loaded back (a load for an admission the scheduler took back is wasted).
  EXPECT_GE(s.tier.transfer.load_pages * c.page_size, s.tier.host_hit_tokens);
  // The cache counts exactly the admissions the scheduler kept.
  EXPECT_EQ(s.cache.matched_tokens, s.scheduler.cached_tokens);
  EXPECT_GT(s.scheduler.cached_tokens, device_only.stats.scheduler.cached_tokens);
  EXPECT_EQ(s.cache.matched_tokens, s.tier.device_hit_tokens + s.tier.host_hit_tokens);
  if (c.max_new > 40) {
    EXPECT_GT(s.scheduler.retractions, 0);
  }
  std::printf("page %d chunk %d: cached %lld -> %lld tokens (host %lld), retractions %lld / %lld\n",
              c.page_size, c.chunk, static_cast<long long>(device_only.stats.scheduler.cached_tokens),
              static_cast<long long>(s.scheduler.cached_tokens),
              static_cast<long long>(s.tier.host_hit_tokens),
              static_cast<long long>(device_only.stats.scheduler.retractions),
              static_cast<long long>(s.scheduler.retractions));
}

INSTANTIATE_TEST_SUITE_P(Pages, EngineHiCache,
                         ::testing::Values(HiCacheCase{1, 0}, HiCacheCase{16, 0}, HiCacheCase{16, 32}, HiCacheCase{64, 64},
                                           HiCacheCase{16, 32, 48, 3}),
                         [](const auto& info) {
                           return "page" + std::to_string(info.param.page_size) + "_chunk" +
                                  std::to_string(info.param.chunk) + "_new" +
                                  std::to_string(info.param.max_new);
                         });

TEST(EngineHiCacheSpec, NgramSpeculationGivesTheSameTokens) {
  // n-gram speculation (decode rounds; admissions with load-backs happen in normal steps):
  // the same tokens with and without the host tier, hits from the host tier.
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 256,
                   .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                   .backend = testing::backend_named("cpu"),
                   .check_integrity = true};
  cfg.spec.mode = SpecMode::kNgram;
  const Turns spec_only = run_multiturn(cfg, 4399, 6, 4, 12);
  cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 8}};
  const Turns tiered = run_multiturn(cfg, 4399, 6, 4, 12);
  EXPECT_EQ(spec_only.outputs, tiered.outputs);
  EXPECT_GT(tiered.stats.spec_steps, 0);
  EXPECT_GT(tiered.stats.tier.host_hit_tokens, 0);
}

/// Tensor parallelism: each rank keeps its own head shard of every host page, and the one
/// scheduler-side tier controller mirrors every load-back and backup to the other rank in its
/// own order. Two ranks with the host tier give the same greedy tokens as two ranks without it
/// and as one rank with it (f32), with host hits, under both write-through and write-back (whose
/// device evictions wait for their backups on every rank).
TEST(EngineHiCacheTp, TwoRanksGiveTheTokensOfOneRankAndOfNoTier) {
  const uint64_t seed = 4377;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const auto& [page, policy] :
       {std::pair{16, tier::WritePolicy::kWriteThrough}, std::pair{1, tier::WritePolicy::kWriteBack}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << page << " policy "
                                      << static_cast<int>(policy));
    EngineConfig cfg{.page_size = page,
                     .pool_tokens = 256,
                     .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                     .backend = testing::backend_named("cpu"),
                     .check_integrity = true};
    const Turns no_tier = run_multiturn(cfg, seed, 6, 4, 6, {}, 2);
    cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 8}, .write_policy = policy};
    const Turns one_rank = run_multiturn(cfg, seed, 6, 4, 6, {}, 1);
    const Turns two_ranks = run_multiturn(cfg, seed, 6, 4, 6, {}, 2);
    EXPECT_EQ(no_tier.outputs, two_ranks.outputs);
    EXPECT_EQ(one_rank.outputs, two_ranks.outputs);
    const tier::TierStats& t = two_ranks.stats.tier;
    EXPECT_GT(t.host_hit_tokens, 0);
    EXPECT_GT(t.transfer.load_pages, 0);
    EXPECT_GT(t.transfer.backup_pages, 0);
    EXPECT_EQ(t.host_hit_tokens, one_rank.stats.tier.host_hit_tokens);
    EXPECT_GT(two_ranks.stats.scheduler.cached_tokens, no_tier.stats.scheduler.cached_tokens);
  }
}

/// The overlap scheduler: the tier's copies run on the step thread right before the forward
/// that reads them, after the step in flight, and every eviction waits for the step in flight.
/// The same greedy tokens as the plain loop, with host hits, on 1 and 2 ranks, under
/// write-through (backups of pages a launched step is still writing) and write-back (evictions
/// that copy pages out while the next step is being prepared).
TEST(EngineHiCacheOverlap, SameTokensAsThePlainLoop) {
  const uint64_t seed = 4391;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (const auto& [policy, tp] : {std::pair{tier::WritePolicy::kWriteThrough, 1},
                                   std::pair{tier::WritePolicy::kWriteBack, 1},
                                   std::pair{tier::WritePolicy::kWriteThrough, 2}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " tp " << tp << " policy "
                                      << static_cast<int>(policy));
    EngineConfig cfg{.page_size = 16,
                     .pool_tokens = 256,
                     .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                     .backend = testing::backend_named("cpu"),
                     .check_integrity = true,
                     .hicache = tier::HiCacheConfig{.host = {.ratio = 8}, .write_policy = policy}};
    const Turns plain = run_multiturn(cfg, seed, 6, 4, 6, {}, tp);
    cfg.overlap = true;
    const Turns overlapped = run_multiturn(cfg, seed, 6, 4, 6, {}, tp);
    EXPECT_EQ(plain.outputs, overlapped.outputs);
    EXPECT_GT(overlapped.stats.tier.host_hit_tokens, 0);
    EXPECT_GT(overlapped.stats.tier.transfer.backup_pages, 0);
  }
}

/// The tier peers a worker factory returns with its worker (BuiltWorker::tier_peers, what a
/// tensor-parallel leader is) are the ones the hierarchical cache mirrors its copies to: they
/// are started once with the host pool's page count and get every page the controller backs up
/// or loads back, in the plain loop and in the overlap loop.
class CountingPeers final : public tier::TierPeers {
 public:
  void tier_start(int32_t host_pages) override {
    std::lock_guard<std::mutex> lock(mu_);
    starts.push_back(host_pages);
  }
  void tier_copies(const tier::StepCopies& copies, bool /*sync*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    backup_pages += static_cast<int64_t>(copies.backup_device.size());
    load_pages += static_cast<int64_t>(copies.load_host.size());
  }
  std::vector<int32_t> starts;
  int64_t backup_pages = 0, load_pages = 0;

 private:
  std::mutex mu_;
};

TEST(EngineHiCachePeers, AFactorysTierPeersGetEveryCopy) {
  const uint64_t seed = 4397;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  auto platform = platform::make_cpu_platform();
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " overlap " << overlap);
    CountingPeers peers;
    const WorkerFactory factory = [&](const model::LlamaModel& m, DType dtype,
                                      const model::WorkerConfig& wc, kv::ReqToTokenTable& table) {
      return BuiltWorker(
          std::make_unique<model::LlamaWorker>(m, make_model_ops(*platform, dtype), wc, table),
          &peers);
    };
    EngineConfig cfg{.page_size = 16,
                     .pool_tokens = 256,
                     .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                     .backend = testing::backend_named("cpu"),
                     .check_integrity = true,
                     .hicache = tier::HiCacheConfig{.host = {.ratio = 8}}};
    cfg.overlap = overlap;
    const Turns t = run_multiturn(cfg, seed, 5, 3, 6, {}, 1, factory);
    const tier::TransferStats& copied = t.drained;  // the drains submit what was still queued
    ASSERT_EQ(peers.starts.size(), 1u);
    EXPECT_EQ(peers.starts[0], t.stats.tier.host_capacity_pages);
    EXPECT_GT(copied.load_pages, 0);
    EXPECT_GT(copied.backup_pages, 0);
    EXPECT_EQ(peers.load_pages, copied.load_pages);
    EXPECT_EQ(peers.backup_pages, copied.backup_pages);
  }
}

TEST(EngineHiCacheTp, AStorageTierIsRefusedByName) {
  LocalTpGroup group(2);
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 256,
                   .backend = testing::backend_named("cpu"),
                   .hicache = tier::HiCacheConfig{.host = {.ratio = 2},
                                                  .storage = "file:" + ::testing::TempDir() +
                                                             "/tp_storage"}};
  try {
    Engine engine(test_model().model, cfg, nullptr, group.factory());
    ADD_FAILURE() << "a storage tier with tensor parallelism was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("hicache_storage"), std::string::npos) << e.what();
  }
}

TEST(EngineHiCacheConfig, BadOrUnsupportedCombinationsAreErrors) {
  EngineConfig cfg{.page_size = 16, .pool_tokens = 256};
  cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 2}};
  cfg.radix_cache = false;
  EXPECT_THROW(cfg.validate(), pagoda::Error);
  cfg.radix_cache = true;
  cfg.spec.mode = SpecMode::kDraft;
  EXPECT_THROW(cfg.validate(), pagoda::Error);
  cfg.spec.mode = SpecMode::kNone;
  cfg.hicache.host.ratio = -3;
  EXPECT_THROW(cfg.validate(), pagoda::Error);
  cfg.hicache.host.ratio = 2;
  EXPECT_NO_THROW(cfg.validate());
}

TEST(EngineHiCacheAbort, AbortAfterALoadBackReleasesEverything) {
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 256,
                   .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                   .backend = testing::backend_named("cpu"),
                   .check_integrity = true,
                   .hicache = tier::HiCacheConfig{.host = {.ratio = 4}}};
  Engine engine(test_model().model, cfg);
  std::vector<int32_t> a(150);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>((i * 37) % 251);
  const RequestId first = engine.add_request({.prompt = a, .max_new_tokens = 4});
  engine.run_until_idle();
  engine.memory().drain_prefix_cache();  // a's pages now live only in the host tier
  EXPECT_EQ(engine.stats().pages_cached, 0);
  a.push_back(7);
  const RequestId second = engine.add_request({.prompt = a, .max_new_tokens = 4});
  engine.step();  // admitted with its prefix loaded back, first chunk computed
  EXPECT_GT(engine.stats().tier.host_hit_tokens, 0);
  EXPECT_TRUE(engine.abort(second));
  engine.run_until_idle();
  EXPECT_EQ(engine.output(first).finish_reason, FinishReason::kLength);
  EXPECT_EQ(engine.output(second).finish_reason, FinishReason::kAbort);
  EXPECT_EQ(engine.memory().leaked_pages(), 0);
  EXPECT_EQ(engine.memory().leaked_host_pages(), 0);
}

/// The storage tier shared on a Redis server: a second engine serves the first one's prefixes
/// from it, and a third one with the best_effort prefetch policy (which takes whatever has
/// arrived, so its hits depend on timing) too, all with the same greedy tokens as the
/// device-only run; a server killed mid-run turns into counted errors and recomputation, with
/// the same tokens.
TEST(EngineHiCacheRedis, TwoEnginesShareOneServerAndSurviveItsDeath) {
  pagoda::testing::RedisServer server;
  if (!server.available())
    GTEST_SKIP() << "redis-server / valkey-server is not installed (scripts/setup.sh installs it)";
  const uint64_t seed = 4343;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  EngineConfig cfg{.page_size = 16,
                   .pool_tokens = 256,
                   .scheduler = SchedulerConfig{.max_running_requests = 4, .chunk_size = 32},
                   .backend = testing::backend_named("cpu"),
                   .check_integrity = true};
  const Turns device_only = run_multiturn(cfg, seed, 4, 3, 4);
  // A host tier as large as the device pool: the working set overflows into the server.
  cfg.hicache = tier::HiCacheConfig{.host = {.ratio = 1}, .storage = server.url("shared")};
  const Turns first = run_multiturn(cfg, seed, 4, 3, 4);
  const Turns second = run_multiturn(cfg, seed, 4, 3, 4);
  cfg.hicache.prefetch = tier::PrefetchPolicy::kBestEffort;
  const Turns third = run_multiturn(cfg, seed, 4, 3, 4);
  EXPECT_EQ(device_only.outputs, first.outputs);
  EXPECT_EQ(device_only.outputs, second.outputs);
  EXPECT_EQ(device_only.outputs, third.outputs);
  const tier::TierStats& a = first.stats.tier;
  const tier::TierStats& b = second.stats.tier;
  EXPECT_GT(b.storage_hit_tokens, a.storage_hit_tokens);
  EXPECT_GT(b.prefetch_pages, 0);
  EXPECT_GT(third.stats.tier.prefetch_jobs, 0);
  EXPECT_GT(second.stats.scheduler.cached_tokens, first.stats.scheduler.cached_tokens);
  EXPECT_EQ(a.storage.errors + b.storage.errors + third.stats.tier.storage.errors, 0);
  std::printf(
      "cached prompt tokens: device only %lld, first engine %lld, second engine %lld "
      "(%lld from storage), third (best_effort) %lld (%lld from storage)\n",
      static_cast<long long>(device_only.stats.scheduler.cached_tokens),
      static_cast<long long>(first.stats.scheduler.cached_tokens),
      static_cast<long long>(second.stats.scheduler.cached_tokens),
      static_cast<long long>(b.storage_hit_tokens),
      static_cast<long long>(third.stats.scheduler.cached_tokens),
      static_cast<long long>(third.stats.tier.storage_hit_tokens));

  // The server dies after the first turn: errors are counted, nothing else changes.
  cfg.hicache.storage = server.url("doomed");
  cfg.hicache.prefetch = tier::PrefetchPolicy::kWaitComplete;
  const Turns killed = run_multiturn(cfg, seed, 4, 3, 4, [&](int t) {
    if (t == 0) server.kill();
  });
  EXPECT_EQ(device_only.outputs, killed.outputs);
  EXPECT_GT(killed.stats.tier.storage.errors, 0);
}

}  // namespace
}  // namespace pagoda::engine
