// The tier controller: batched backups, per-layer load-back events consumed through the device
// pool's layer gate, in-order submission (a load never overtakes an earlier backup), and the
// mirroring of every copy to the other tensor-parallel ranks (TierPeers).
#include "pagoda/tier/controller.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "pagoda/core/error.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using testing::kv_matches;
using testing::kv_matches_all;
using testing::small_pool;

std::vector<SlotIndex> slots_of(std::span<const int32_t> pages, int32_t page_size) {
  std::vector<SlotIndex> s;
  for (int32_t p : pages)
    for (int32_t j = 0; j < page_size; ++j) s.push_back(p * page_size + j);
  return s;
}

TEST(TierController, LayerWaitsOnlyForItsOwnPages) {
  constexpr int32_t kPage = 4, kLayers = 5;
  testing::ManualPlatform platform;
  kv::KvPool dev(small_pool(10, kPage, kLayers), platform.allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 2}, platform.pinned_allocator());
  std::vector<int32_t> tokens(3 * kPage);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 11);
  const std::vector<int32_t> host_pages{5, 6, 9}, dev_pages{2, 3, 7};
  testing::write_kv(host.pool(), tokens, 0, slots_of(host_pages, kPage));
  TierController ctl(platform, dev, host);
  ctl.load(host_pages, dev_pages);
  EXPECT_EQ(platform.stream().enqueued, 0u);  // queued, not submitted
  ctl.begin_forward();
  EXPECT_GT(platform.stream().enqueued, 0u);
  EXPECT_EQ(platform.stream().executed, 0u);  // the manual stream has run nothing yet
  const auto slots = slots_of(dev_pages, kPage);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_FALSE(kv_matches(dev, tokens, slots, l)) << "layer " << l << " loaded before its wait";
    dev.wait_layer(LayerId{l});  // what the forward does before layer l's attention
    EXPECT_TRUE(kv_matches(dev, tokens, slots, l)) << "layer " << l;
    if (l + 1 < kLayers) {
      EXPECT_FALSE(kv_matches(dev, tokens, slots, l + 1)) << "layer " << l + 1 << " ran early";
    }
  }
  EXPECT_EQ(platform.waits, kLayers);
  EXPECT_EQ(ctl.stats().load_stalls, kLayers);
  ctl.end_forward();
  dev.wait_layer(LayerId{0});  // no gate: no wait
  EXPECT_EQ(platform.waits, kLayers);
  EXPECT_EQ(ctl.stats().load_pages, 3);
  EXPECT_EQ(ctl.stats().bytes_h2d, 3 * kv::bytes_per_page(dev));
}

TEST(TierController, BackupThenLoadKeepOrder) {
  constexpr int32_t kPage = 2;
  testing::ManualPlatform platform;
  kv::KvPool dev(small_pool(8, kPage), platform.allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 1}, platform.pinned_allocator());
  std::vector<int32_t> tokens{1, 2, 3, 4};
  testing::write_kv(dev, tokens, 0, slots_of(std::vector<int32_t>{1, 2}, kPage));
  TierController ctl(platform, dev, host);
  // Back device pages 1, 2 up to host 3, 4, and load host 3, 4 into device 5, 6 in the same
  // step: the load reads what the backup wrote only because the stream keeps order.
  ctl.backup(std::vector<int32_t>{1, 2}, std::vector<int32_t>{3, 4});
  ctl.load(std::vector<int32_t>{3, 4}, std::vector<int32_t>{5, 6});
  ctl.begin_forward();
  for (int32_t l = 0; l < dev.num_layers(); ++l) dev.wait_layer(LayerId{l});
  ctl.end_forward();
  EXPECT_TRUE(kv_matches_all(dev, tokens, slots_of(std::vector<int32_t>{5, 6}, kPage)));
  EXPECT_TRUE(kv_matches_all(host.pool(), tokens, slots_of(std::vector<int32_t>{3, 4}, kPage)));
  EXPECT_EQ(ctl.stats().backup_batches, 1);
  EXPECT_TRUE(ctl.idle());
}

// quiesce_pages (HiCache's device eviction) waits for the last submission that touched the
// given device pages and for nothing after it: on the manual stream, which runs a copy only
// when something waits for it, the later batch stays queued; a page no copy touched waits for
// nothing; a page with a queued (unsubmitted) copy submits and waits for everything.
TEST(TierController, QuiescePagesWaitsOnlyForTheirCopies) {
  constexpr int32_t kPage = 2;
  testing::ManualPlatform platform;
  kv::KvPool dev(small_pool(10, kPage), platform.allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 1}, platform.pinned_allocator());
  const std::vector<int32_t> a{11, 12, 13, 14}, b{21, 22};
  testing::write_kv(dev, a, 0, slots_of(std::vector<int32_t>{1, 2}, kPage));
  testing::write_kv(dev, b, 0, slots_of(std::vector<int32_t>{7}, kPage));
  TierController ctl(platform, dev, host);
  ctl.backup(std::vector<int32_t>{1, 2}, std::vector<int32_t>{3, 4});
  ctl.flush();  // submission 1
  ctl.backup(std::vector<int32_t>{7}, std::vector<int32_t>{8});
  ctl.flush();  // submission 2
  const uint64_t enqueued = platform.stream().enqueued;
  ASSERT_GT(enqueued, 0u);
  EXPECT_EQ(platform.stream().executed, 0u);
  ctl.quiesce_pages(std::vector<int32_t>{9});  // never copied: nothing runs
  EXPECT_EQ(platform.stream().executed, 0u);
  ctl.quiesce_pages(std::vector<int32_t>{2});
  EXPECT_TRUE(kv_matches_all(host.pool(), a, slots_of(std::vector<int32_t>{3, 4}, kPage)));
  EXPECT_LT(platform.stream().executed, enqueued) << "the later batch ran too";
  EXPECT_FALSE(kv_matches_all(host.pool(), b, slots_of(std::vector<int32_t>{8}, kPage)));
  ctl.quiesce_pages(std::vector<int32_t>{1, 7});
  EXPECT_EQ(platform.stream().executed, enqueued);
  EXPECT_TRUE(kv_matches_all(host.pool(), b, slots_of(std::vector<int32_t>{8}, kPage)));
  // Queued, not submitted: quiesce submits and waits for it.
  ctl.backup(std::vector<int32_t>{7}, std::vector<int32_t>{5});
  EXPECT_FALSE(kv_matches_all(host.pool(), b, slots_of(std::vector<int32_t>{5}, kPage)));
  ctl.quiesce_pages(std::vector<int32_t>{7});
  EXPECT_EQ(platform.stream().executed, platform.stream().enqueued);
  EXPECT_TRUE(kv_matches_all(host.pool(), b, slots_of(std::vector<int32_t>{5}, kPage)));
  EXPECT_TRUE(ctl.idle());
  // A queued backup of the page is submitted and waited for; a queued load-back into another
  // page stays queued (a whole synchronize() would run it too).
  ctl.backup(std::vector<int32_t>{7}, std::vector<int32_t>{6});
  ctl.load(std::vector<int32_t>{3}, std::vector<int32_t>{9});
  ctl.quiesce_pages(std::vector<int32_t>{7});
  EXPECT_TRUE(kv_matches_all(host.pool(), b, slots_of(std::vector<int32_t>{6}, kPage)));
  const std::vector<int32_t> a0(a.begin(), a.begin() + kPage);  // host page 3: a's first page
  EXPECT_FALSE(kv_matches_all(dev, a0, slots_of(std::vector<int32_t>{9}, kPage)));
  EXPECT_FALSE(ctl.idle());
  ctl.synchronize();
  EXPECT_TRUE(kv_matches_all(dev, a0, slots_of(std::vector<int32_t>{9}, kPage)));
}

TEST(TierController, ThreadStreamRandomTraffic) {
  const uint64_t seed = 777;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int32_t kPage = 8;
  auto platform = platform::make_cpu_platform();
  kv::KvPool dev(small_pool(32, kPage), platform->allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 1}, platform->pinned_allocator());
  TierController ctl(*platform, dev, host);
  std::vector<int32_t> tokens(32 * kPage);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 9);
  std::vector<int32_t> pages(32);
  for (int32_t i = 0; i < 32; ++i) pages[static_cast<size_t>(i)] = i + 1;
  testing::write_kv(dev, tokens, 0, slots_of(pages, kPage));
  // Back every page up in random batches, wipe the device, load everything back in random
  // order into a permutation, and check each page's rows.
  std::vector<int32_t> host_pages = pages;
  std::shuffle(host_pages.begin(), host_pages.end(), rng);
  for (size_t b = 0; b < 32; b += 8) {
    ctl.backup(std::span(pages).subspan(b, 8), std::span(host_pages).subspan(b, 8));
    if (rng() % 2) ctl.flush();
  }
  ctl.synchronize();
  dev.fill(0.f);
  std::vector<int32_t> target = pages;
  std::shuffle(target.begin(), target.end(), rng);
  ctl.load(host_pages, target);
  ctl.begin_forward();
  for (int32_t l = 0; l < dev.num_layers(); ++l) dev.wait_layer(LayerId{l});
  ctl.end_forward();
  // Page i's tokens are now in device page target[i].
  EXPECT_TRUE(kv_matches_all(dev, tokens, slots_of(target, kPage)));
  EXPECT_EQ(ctl.stats().backup_pages, 32);
  EXPECT_EQ(ctl.stats().load_pages, 32);
  EXPECT_THROW(ctl.load(std::vector<int32_t>{1}, std::vector<int32_t>{}), Error);
}

/// A second tensor-parallel rank in this process: its own device pool shard (one KV head where
/// rank 0 has two), and, once started, its own host pool and controller, applying the mirrored
/// copies as a follower rank does.
struct PeerRank final : TierPeers {
  PeerRank(platform::Platform& p, const kv::KvPoolConfig& c) : platform(&p), dev(c, p.allocator()) {}
  void tier_start(int32_t host_pages) override {
    host = std::make_unique<kv::HostKvPool>(dev.config(), host_pages, platform->pinned_allocator());
    ctl = std::make_unique<TierController>(*platform, dev, *host);
  }
  void tier_copies(const StepCopies& c, bool sync) override {
    ++messages;
    ctl->backup(c.backup_device, c.backup_host);
    ctl->load(c.load_host, c.load_device);
    if (sync) {
      ++syncs;
      ctl->synchronize();
    }
  }
  platform::Platform* platform;
  kv::KvPool dev;
  std::unique_ptr<kv::HostKvPool> host;
  std::unique_ptr<TierController> ctl;
  int messages = 0, syncs = 0;
};

TEST(TierController, EveryCopyReachesThePeerRankInOrder) {
  const uint64_t seed = 4312;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int32_t kPage = 4, kPages = 24;
  auto platform = platform::make_cpu_platform();
  kv::KvPoolConfig shard = small_pool(kPages, kPage);
  shard.num_kv_heads = 1;
  kv::KvPool dev(small_pool(kPages, kPage), platform->allocator());
  kv::HostKvPool host(dev.config(), {.ratio = 1}, platform->pinned_allocator());
  PeerRank peer(*platform, shard);
  TierController ctl(*platform, dev, host, &peer);
  ASSERT_NE(peer.host, nullptr);
  EXPECT_EQ(peer.host->num_pages(), host.num_pages());
  std::vector<int32_t> tokens(kPages * kPage);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 13);
  std::vector<int32_t> pages(kPages);
  for (int32_t i = 0; i < kPages; ++i) pages[static_cast<size_t>(i)] = i + 1;
  testing::write_kv(dev, tokens, 0, slots_of(pages, kPage));
  testing::write_kv(peer.dev, tokens, 0, slots_of(pages, kPage));
  // Random batches of backups, some submitted by a step, some by a synchronize; then both
  // devices are wiped and everything comes back into a permutation in one step.
  std::vector<int32_t> host_pages = pages;
  std::shuffle(host_pages.begin(), host_pages.end(), rng);
  for (size_t b = 0; b < pages.size(); b += 6) {
    ctl.backup(std::span(pages).subspan(b, 6), std::span(host_pages).subspan(b, 6));
    if (rng() % 2) {
      ctl.begin_forward();
      peer.ctl->begin_forward();  // the peer's forward follows the mirrored copies
      peer.ctl->end_forward();
      ctl.end_forward();
    }
  }
  ctl.synchronize();
  const int messages = peer.messages;
  ctl.synchronize();  // nothing mirrored since the last one: no message
  EXPECT_EQ(peer.messages, messages);
  dev.fill(0.f);
  peer.dev.fill(0.f);
  std::vector<int32_t> target = pages;
  std::shuffle(target.begin(), target.end(), rng);
  ctl.load(host_pages, target);
  ctl.begin_forward();
  peer.ctl->begin_forward();
  for (int32_t l = 0; l < dev.num_layers(); ++l) {
    dev.wait_layer(LayerId{l});
    peer.dev.wait_layer(LayerId{l});
  }
  peer.ctl->end_forward();
  ctl.end_forward();
  // Page i's tokens are now in device page target[i] on both ranks, each with its own heads.
  EXPECT_TRUE(kv_matches_all(dev, tokens, slots_of(target, kPage)));
  EXPECT_TRUE(kv_matches_all(peer.dev, tokens, slots_of(target, kPage)));
  EXPECT_EQ(peer.ctl->stats().backup_pages, kPages);
  EXPECT_EQ(peer.ctl->stats().load_pages, kPages);
  EXPECT_GE(peer.syncs, 1);
}

}  // namespace
}  // namespace pagoda::tier
