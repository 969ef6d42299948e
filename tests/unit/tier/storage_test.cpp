// The storage tier: the file backend's round trip, batched exists, crash-safe layout, and a
// corrupt, truncated, foreign or missing page read as a counted miss; then HiCache over it: a
// second cache on the same directory serves the first one's prefixes, and a corrupt page makes
// the prefix stop there (recomputed), never wrong KV.
#include "pagoda/tier/storage.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "pagoda/core/error.h"
#include "pagoda/tier/hicache.h"
#include "redis_server.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

namespace fs = std::filesystem;

/// A fresh directory under the test's temporary root.
std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("pagoda_storage_" + name);
  fs::remove_all(p);
  return p.string();
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

std::string file_of(const std::string& dir, const PageKey& k) { return dir + "/" + k.hex() + ".kvpage"; }

TEST(FileStorage, RoundTripExistsAndCorruption) {
  const uint64_t seed = 99;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const std::string dir = fresh_dir("roundtrip");
  auto st = make_storage("file:" + dir);
  std::vector<PageKey> keys;
  std::vector<std::vector<std::byte>> pages;
  PageKey parent = root_key("");
  for (int i = 0; i < 6; ++i) {
    parent = chain_key(parent, std::vector<int32_t>{i, i + 1});
    keys.push_back(parent);
    pages.push_back(random_bytes(rng, 3000));
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(st->put(keys[static_cast<size_t>(i)], pages[static_cast<size_t>(i)]));
  EXPECT_TRUE(st->put(keys[0], pages[0]));  // present: left alone
  EXPECT_EQ(st->stats().puts, 4);
  EXPECT_EQ(st->stats().put_skipped, 1);
  EXPECT_EQ(st->batch_exists(keys), 4);
  EXPECT_EQ(st->batch_exists(std::span(keys).subspan(2)), 2);
  EXPECT_EQ(st->batch_exists(std::span(keys).subspan(4)), 0);
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().extension(), ".kvpage");

  std::vector<std::byte> out(3000);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(st->get(keys[static_cast<size_t>(i)], out));
    EXPECT_EQ(out, pages[static_cast<size_t>(i)]);
  }
  EXPECT_FALSE(st->get(keys[5], out));  // absent
  EXPECT_EQ(st->stats().get_misses, 1);

  {  // one flipped payload byte
    std::fstream f(file_of(dir, keys[1]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(48 + 1234);
    char c = 0;
    f.read(&c, 1);
    f.seekp(48 + 1234);
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  EXPECT_FALSE(st->get(keys[1], out));
  fs::resize_file(file_of(dir, keys[2]), 100);  // a torn write
  EXPECT_FALSE(st->get(keys[2], out));
  fs::copy_file(file_of(dir, keys[0]), file_of(dir, keys[4]));  // another page's file
  EXPECT_FALSE(st->get(keys[4], out));
  std::vector<std::byte> wrong_size(2999);
  EXPECT_FALSE(st->get(keys[3], wrong_size));  // a page of another geometry
  EXPECT_EQ(st->stats().corrupt_pages, 4);
  // Corrupt pages are removed (a later put stores them again); the good one stays.
  EXPECT_EQ(st->batch_exists(std::span(keys).subspan(1, 1)), 0);
  EXPECT_TRUE(st->put(keys[1], pages[1]));
  EXPECT_TRUE(st->get(keys[1], out));
  EXPECT_EQ(out, pages[1]);
}

TEST(FileStorage, BadSpecsAndDirectories) {
  EXPECT_THROW(make_storage("file:"), Error);
  EXPECT_THROW(make_storage("/tmp/x"), Error);
  try {
    make_storage("s3://bucket/kv");
    FAIL() << "s3 is no backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  for (const char* bad : {"redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
                          "redis://h:12x", "redis://h:1/"})
    EXPECT_THROW(check_storage_spec(bad), Error) << bad;
  for (const char* good : {"redis://h", "redis://10.0.0.5:6380", "redis://h:1/team-a"})
    EXPECT_NO_THROW(check_storage_spec(good)) << good;
  const std::string dir = fresh_dir("file_in_the_way");
  fs::create_directories(dir);
  std::ofstream(dir + "/blocker") << "x";
  EXPECT_THROW(make_storage("file:" + dir + "/blocker/sub"), Error);
}

TEST(FileStorage, WriteFailureIsCountedNotThrown) {
  const std::string dir = fresh_dir("vanishing");
  auto st = make_storage("file:" + dir);
  fs::remove_all(dir);  // the storage goes away under the cache
  std::vector<std::byte> page(64, std::byte{1});
  EXPECT_FALSE(st->put(root_key("x"), page));
  EXPECT_EQ(st->stats().put_errors, 1);
  EXPECT_EQ(st->batch_exists(std::vector<PageKey>{root_key("x")}), 0);
}

TEST(HiCacheStorage, SecondInstanceServesTheFirstOnesPrefixes) {
  std::mt19937_64 rng(3);
  std::vector<int32_t> a(70);
  for (auto& t : a) t = static_cast<int32_t>(rng() % 500);
  const std::string dir = fresh_dir("shared");
  {
    // 16 host pages: the host tier overflows into storage.
    testing::Harness first(32, 4, {.host = {.ratio = 0.5}, .storage = "file:" + dir});
    EXPECT_EQ(first.run(a), 0);
    first.cache.evict(1 << 20);
    first.cache.drain_host();  // everything leaving the host tier is stored
    EXPECT_EQ(first.cache.tier_stats().storage.puts, 17);
  }
  testing::Harness second(32, 4, {.host = {.ratio = 1}, .storage = "file:" + dir});
  a.push_back(1);
  EXPECT_EQ(second.run(a), 68);  // 17 pages from storage, K/V checked in run()
  const TierStats s = second.cache.tier_stats();
  EXPECT_EQ(s.storage_hit_tokens, 68);
  EXPECT_EQ(s.storage.get_hits, 17);

  // A corrupt third page: the third instance gets two pages and recomputes the rest.
  PageKey k = root_key("");
  std::vector<PageKey> keys;
  for (int i = 0; i < 17; ++i) {
    k = chain_key(k, std::span<const int32_t>(a).subspan(static_cast<size_t>(i * 4), 4));
    keys.push_back(k);
  }
  {
    std::fstream f(file_of(dir, keys[2]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  testing::Harness third(32, 4, {.host = {.ratio = 1}, .storage = "file:" + dir});
  EXPECT_EQ(third.run(a), 8);
  EXPECT_EQ(third.cache.tier_stats().storage.corrupt_pages, 1);
  EXPECT_EQ(third.cache.tier_stats().storage_hit_tokens, 8);
}

TEST(HiCacheStorage, PrefetchPolicyConfig) {
  EXPECT_EQ(parse_prefetch_policy("timeout"), PrefetchPolicy::kTimeout);
  EXPECT_EQ(parse_prefetch_policy("best_effort"), PrefetchPolicy::kBestEffort);
  EXPECT_THROW(parse_prefetch_policy("eventually"), Error);
  HiCacheConfig c{.host = {.ratio = 1}, .prefetch = PrefetchPolicy::kBestEffort};
  EXPECT_NO_THROW(c.validate());
  c.prefetch_timeout_base_s = -1;
  EXPECT_THROW(c.validate(), Error);
  c = HiCacheConfig{.storage = "file:/tmp/x"};
  EXPECT_THROW(c.validate(), Error);  // storage without a host tier
}

/// A slow storage: a file backend whose reads wait until the test lets them through (or 10 s
/// pass, so a failing test cannot hang).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int64_t allowed = 0;
  int64_t served = 0;
  void allow(int64_t n) {
    {
      std::lock_guard lock(mu);
      allowed += n;
    }
    cv.notify_all();
  }
};

class GatedStorage final : public StorageBackend {
 public:
  GatedStorage(std::unique_ptr<StorageBackend> inner, Gate& gate)
      : inner_(std::move(inner)), gate_(&gate) {}
  std::string describe() const override { return "gated " + inner_->describe(); }
  int64_t batch_exists(std::span<const PageKey> keys) override {
    return inner_->batch_exists(keys);
  }
  bool get(const PageKey& key, std::span<std::byte> out) override {
    {
      std::unique_lock lock(gate_->mu);
      gate_->cv.wait_for(lock, std::chrono::seconds(10),
                         [&] { return gate_->served < gate_->allowed; });
      ++gate_->served;
    }
    return inner_->get(key, out);
  }
  bool put(const PageKey& key, std::span<const std::byte> data) override {
    return inner_->put(key, data);
  }
  const StorageStats& stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<StorageBackend> inner_;
  Gate* gate_;
};

/// Polls until `pred` holds (at most 10 s).
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The three prefetch policies against a slow storage: the read-ahead runs while the request is
/// queued; best_effort admits with the pages that arrived, wait_complete holds the admission
/// until every page is read, timeout until its deadline, then uses what arrived. The K/V of
/// every admitted page is checked (Harness::run_request).
TEST(HiCacheStorage, PrefetchPoliciesAgainstASlowStorage) {
  std::mt19937_64 rng(5);
  std::vector<int32_t> a(70);
  for (auto& t : a) t = static_cast<int32_t>(rng() % 500);
  const std::string dir = fresh_dir("prefetch");
  {
    testing::Harness first(32, 4, {.host = {.ratio = 0.5}, .storage = "file:" + dir});
    first.run(a);
    first.cache.evict(1 << 20);
    first.cache.drain_host();
  }
  a.push_back(1);  // 71 tokens: 17 pages in storage
  for (const PrefetchPolicy policy :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    SCOPED_TRACE(std::string(prefetch_policy_name(policy)));
    Gate gate;
    const HiCacheConfig config{.host = {.ratio = 1},
                               .storage = "file:" + dir,
                               .prefetch = policy,
                               .prefetch_timeout_base_s = 1.0,
                               .prefetch_timeout_per_1k_tokens_s = 0};
    const auto start = std::chrono::steady_clock::now();
    testing::Harness h(32, 4, config, [&] {
      return std::make_unique<GatedStorage>(make_file_storage(dir), gate);
    });
    cache::CacheRequest req;
    req.tokens = a;
    h.cache.prefetch(req, cache::scheduler_prefix_limit(71));
    EXPECT_EQ(h.cache.tier_stats().prefetch_jobs, 1);
    gate.allow(8);  // one read batch
    ASSERT_TRUE(eventually([&] { return h.cache.prefetch_arrived(req) == 8; }));
    int64_t expect = 17 * 4;
    if (policy == PrefetchPolicy::kBestEffort) {
      EXPECT_TRUE(h.cache.admission_ready(req, false));
      expect = 8 * 4;
    } else if (policy == PrefetchPolicy::kWaitComplete) {
      EXPECT_FALSE(h.cache.admission_ready(req, false));
      gate.allow(100);
      EXPECT_TRUE(h.cache.admission_ready(req, true));
      EXPECT_EQ(h.cache.prefetch_arrived(req), 17);
    } else {
      EXPECT_FALSE(h.cache.admission_ready(req, false));
      EXPECT_TRUE(h.cache.admission_ready(req, true));  // waits for the 1 s deadline
      EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
      EXPECT_EQ(h.cache.prefetch_arrived(req), 8);
      expect = 8 * 4;
    }
    EXPECT_EQ(h.run_request(req, true), expect);
    const TierStats s = h.cache.tier_stats();
    EXPECT_EQ(s.storage_hit_tokens, expect);
    EXPECT_EQ(s.prefetch_pages * 4, expect);
    EXPECT_EQ(s.host_hit_tokens, 0);
    EXPECT_EQ(h.cache.prefetch_arrived(req), -1);  // adopted: the job is gone
    gate.allow(100);                               // the cancelled read-ahead's last batch finishes
  }
}

/// Read-aheads in flight are bounded by the host tier's capacity (adopted pages must find room);
/// a queued request that is dropped (forget) cancels its read-ahead and gives its budget back.
TEST(HiCacheStorage, ReadAheadBudgetAndForget) {
  const std::string dir = fresh_dir("budget");
  testing::Harness h(32, 4, {.host = {.ratio = 1}, .storage = "file:" + dir});  // 32 host pages
  std::vector<cache::CacheRequest> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].tokens.resize(69);  // 17 pages each, none of them anywhere
    for (size_t t = 0; t < 69; ++t) reqs[i].tokens[t] = static_cast<int32_t>(i * 1000 + t);
  }
  const int64_t limit = cache::scheduler_prefix_limit(69);
  h.cache.prefetch(reqs[0], limit);  // 17 pages
  h.cache.prefetch(reqs[1], limit);  // the 15 left
  h.cache.prefetch(reqs[2], limit);  // none left: no read-ahead
  EXPECT_EQ(h.cache.tier_stats().prefetch_jobs, 2);
  EXPECT_EQ(h.cache.prefetch_arrived(reqs[2]), -1);
  h.cache.forget(reqs[0]);
  EXPECT_EQ(h.cache.prefetch_arrived(reqs[0]), -1);
  h.cache.prefetch(reqs[3], limit);
  EXPECT_EQ(h.cache.tier_stats().prefetch_jobs, 3);
  EXPECT_TRUE(h.cache.admission_ready(reqs[3], true));  // wait_complete: the job finishes
  EXPECT_EQ(h.cache.prefetch_arrived(reqs[3]), 0);       // nothing stored
  // Admitted with nothing from storage: the whole prompt is computed.
  EXPECT_EQ(h.run_request(reqs[3], true), 0);
  EXPECT_EQ(h.cache.tier_stats().storage_hit_tokens, 0);
}

/// The Redis backend against a real server: round trip, batches, SET NX, a corrupt value and a
/// full server read as counted misses and errors, a dead server as counted errors (never an
/// exception), and reconnection once it is back.
TEST(RedisStorage, RoundTripCorruptionFullAndDeadServer) {
  try {
    make_storage("redis://127.0.0.1:1/x");
    FAIL() << "nothing listens on port 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  pagoda::testing::RedisServer server({"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  if (!server.available())
    GTEST_SKIP()
        << "redis-server / valkey-server is not installed (scripts/setup.sh installs redis-server)";
  const uint64_t seed = 17;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto st = make_storage(server.url("t1"));
  EXPECT_EQ(st->describe(), server.url("t1"));
  std::vector<PageKey> keys;
  std::vector<std::vector<std::byte>> pages;
  PageKey parent = root_key("");
  for (int i = 0; i < 100; ++i) {
    parent = chain_key(parent, std::vector<int32_t>{i, 7});
    keys.push_back(parent);
    pages.push_back(random_bytes(rng, 4096));
  }
  std::vector<std::span<const std::byte>> data(pages.begin(), pages.begin() + 70);
  EXPECT_EQ(st->batch_put(std::span(keys).first(70), data), 70);  // two pipelined batches
  EXPECT_TRUE(st->put(keys[0], pages[0]));                        // present: left alone
  EXPECT_EQ(st->stats().puts, 70);
  EXPECT_EQ(st->stats().put_skipped, 1);
  EXPECT_EQ(st->batch_exists(keys), 70);
  EXPECT_EQ(st->batch_exists(std::span(keys).subspan(69)), 1);

  std::vector<std::vector<std::byte>> got(70, std::vector<std::byte>(4096));
  std::vector<std::span<std::byte>> outs(got.begin(), got.end());
  EXPECT_EQ(st->batch_get(std::span(keys).first(70), outs), 70);
  for (size_t i = 0; i < 70; ++i) EXPECT_EQ(got[i], pages[i]) << i;
  // Another instance (another prefix) shares nothing; the same prefix shares everything.
  auto other = make_storage(server.url("t2"));
  EXPECT_EQ(other->batch_exists(keys), 0);
  auto same = make_storage(server.url("t1"));
  EXPECT_TRUE(same->get(keys[5], got[0]));
  EXPECT_EQ(got[0], pages[5]);

  // A corrupt value (written by someone else) is a counted miss, deleted, and stops the batch.
  EXPECT_EQ(server.command("SET t1:" + keys[3].hex() + " garbage"), "+OK");
  EXPECT_EQ(st->batch_get(std::span(keys).first(10), std::span(outs).first(10)), 3);
  EXPECT_EQ(st->stats().corrupt_pages, 1);
  EXPECT_EQ(st->batch_exists(std::span(keys).subspan(3, 1)), 0);
  EXPECT_FALSE(st->get(keys[80], got[0]));  // absent
  EXPECT_EQ(st->stats().get_misses, 1);

  // Full (maxmemory, noeviction): puts fail, counted, no exception.
  std::vector<std::span<const std::byte>> rest(pages.begin() + 70, pages.end());
  for (int round = 0; round < 20 && st->stats().put_errors == 0; ++round) {
    std::vector<PageKey> more;
    for (int i = 0; i < 30; ++i)
      more.push_back(chain_key(keys[static_cast<size_t>(i)], std::vector<int32_t>{round}));
    st->batch_put(more, rest);
  }
  EXPECT_GT(st->stats().put_errors, 0);
  EXPECT_GT(st->stats().errors, 0);

  // Dead: every call fails fast and is counted; nothing throws.
  server.kill();
  // A large pipelined write into a connection the server closed raises no SIGPIPE (which would
  // kill the process): it fails and is counted.
  const std::vector<std::byte> big(1 << 20, std::byte{3});
  std::vector<PageKey> big_keys;
  for (int32_t i = 0; i < 8; ++i) big_keys.push_back(chain_key(root_key("big"), std::vector{i}));
  const std::vector<std::span<const std::byte>> big_data(8, big);
  EXPECT_EQ(same->batch_put(big_keys, big_data), 0);
  EXPECT_EQ(same->stats().put_errors, 8);
  const int64_t errors = st->stats().errors;
  EXPECT_EQ(st->batch_exists(keys), 0);
  EXPECT_FALSE(st->get(keys[0], got[0]));
  EXPECT_FALSE(st->put(keys[99], pages[99]));
  EXPECT_GE(st->stats().errors, errors + 3);
  EXPECT_GE(st->stats().put_errors, 1);
}

/// HiCache over Redis: a second cache serves the first one's prefixes from the server.
TEST(RedisStorage, SecondCacheServesTheFirstOnesPrefixes) {
  pagoda::testing::RedisServer server;
  if (!server.available())
    GTEST_SKIP()
        << "redis-server / valkey-server is not installed (scripts/setup.sh installs redis-server)";
  std::mt19937_64 rng(8);
  std::vector<int32_t> a(70);
  for (auto& t : a) t = static_cast<int32_t>(rng() % 500);
  const std::string url = server.url("hc");
  {
    testing::Harness first(32, 4, {.host = {.ratio = 0.5}, .storage = url});
    EXPECT_EQ(first.run(a), 0);
    first.cache.evict(1 << 20);
    first.cache.drain_host();
    EXPECT_EQ(first.cache.tier_stats().storage.puts, 17);
  }
  a.push_back(1);
  testing::Harness second(32, 4, {.host = {.ratio = 1}, .storage = url});
  EXPECT_EQ(second.run(a), 68);  // K/V checked in run()
  EXPECT_EQ(second.cache.tier_stats().storage_hit_tokens, 68);
}

}  // namespace
}  // namespace pagoda::tier
