// The storage tier: the file backend's round trip, batched exists, crash-safe layout, and a
// corrupt, truncated, foreign or missing page read as a counted miss; then HiCache over it: a
// second cache on the same directory serves the first one's prefixes, and a corrupt page makes
// the prefix stop there (recomputed), never wrong KV.
#include "pagoda/tier/storage.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "pagoda/core/error.h"
#include "pagoda/tier/hicache.h"
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
    make_storage("redis://localhost:6379");
    FAIL() << "redis is not in this build";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
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

TEST(HiCacheStorage, PrefetchPolicies) {
  EXPECT_EQ(parse_prefetch_policy("timeout"), PrefetchPolicy::kTimeout);
  EXPECT_THROW(parse_prefetch_policy("eventually"), Error);
  HiCacheConfig c{.host = {.ratio = 1}, .prefetch = PrefetchPolicy::kBestEffort};
  EXPECT_THROW(c.validate(), Error);
  c = HiCacheConfig{.storage = "file:/tmp/x"};
  EXPECT_THROW(c.validate(), Error);  // storage without a host tier
}

}  // namespace
}  // namespace pagoda::tier
