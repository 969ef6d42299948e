// The host KV pool: sizing, the page-run copy plan and a device -> host -> device round trip.
#include "pagoda/kv/host_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "pagoda/core/error.h"
#include "tier_test_util.h"

namespace pagoda::tier {
namespace {

using testing::small_pool;

TEST(HostPool, SizeByRatioOrBytes) {
  const kv::KvPoolConfig dev = small_pool(40, 16);
  EXPECT_EQ(kv::host_pool_pages(dev, {.ratio = 2.5}), 100);
  // One page: 3 layers x 16 tokens x (2 heads x 4 dims) x (K + V) x 4 bytes.
  const int64_t page_bytes = 3 * 16 * 8 * 2 * 4;
  EXPECT_EQ(kv::host_pool_pages(dev, {.bytes = page_bytes * 7 + 5}), 7);
  for (const kv::HostPoolSize bad : {kv::HostPoolSize{}, kv::HostPoolSize{.ratio = 1, .bytes = 10},
                                     kv::HostPoolSize{.ratio = -1}, kv::HostPoolSize{.ratio = 0.01},
                                     kv::HostPoolSize{.bytes = page_bytes - 1}}) {
    EXPECT_THROW(kv::host_pool_pages(dev, bad), Error);
  }
  auto platform = platform::make_cpu_platform();
  kv::HostKvPool host(dev, {.ratio = 1.5}, platform->pinned_allocator());
  EXPECT_EQ(host.num_pages(), 60);
  EXPECT_EQ(host.pool().page_size(), 16);
  EXPECT_EQ(host.pages().num_free_pages(), 60);
  EXPECT_EQ(host.total_bytes(), 61 * page_bytes);
}

TEST(HostPool, PageCopyRunsMergeBothSides) {
  // 1,2,3 -> 5,6,7 is one run; 7 -> 2 breaks it; 8 -> 3 joins; 9 -> 9 breaks (dst not next).
  const std::vector<int32_t> src{1, 2, 3, 7, 8, 9}, dst{5, 6, 7, 2, 3, 9};
  const auto runs = kv::page_copy_runs(src, dst);
  ASSERT_EQ(runs.size(), 3u);
  int32_t covered = 0;
  for (const auto& r : runs) {
    for (int32_t i = 0; i < r.count; ++i) {
      EXPECT_EQ(src[static_cast<size_t>(covered)], r.src + i);
      EXPECT_EQ(dst[static_cast<size_t>(covered)], r.dst + i);
      ++covered;
    }
  }
  EXPECT_EQ(covered, 6);
  EXPECT_THROW(kv::page_copy_runs(src, std::vector<int32_t>{1}), Error);
}

TEST(HostPool, RoundTripKeepsEveryLayer) {
  for (const int32_t page_size : {1, 16}) {
    const uint64_t seed = 1000 + static_cast<uint64_t>(page_size);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << page_size);
    std::mt19937_64 rng(seed);
    auto platform = platform::make_cpu_platform();
    kv::KvPool dev(small_pool(12, page_size), platform->allocator());
    kv::HostKvPool host(dev.config(), {.ratio = 2}, platform->pinned_allocator());
    std::vector<int32_t> tokens(static_cast<size_t>(12 * page_size));
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 50);
    std::vector<SlotIndex> slots(tokens.size());
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<SlotIndex>(page_size + i);
    testing::write_kv(dev, tokens, 0, slots);
    // Pages 1..12 -> random distinct host pages, then back to device pages in reverse order.
    std::vector<int32_t> dev_pages(12), host_pages(24);
    for (int32_t i = 0; i < 12; ++i) dev_pages[static_cast<size_t>(i)] = i + 1;
    for (int32_t i = 0; i < 24; ++i) host_pages[static_cast<size_t>(i)] = i + 1;
    std::shuffle(host_pages.begin(), host_pages.end(), rng);
    host_pages.resize(12);
    const kv::CopyFn memcpy_fn = [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
    for (int32_t l = 0; l < dev.num_layers(); ++l)
      kv::copy_layer_pages(dev, host.pool(), LayerId{l}, kv::page_copy_runs(dev_pages, host_pages),
                           memcpy_fn);
    dev.fill(std::nanf(""));
    std::vector<int32_t> back(dev_pages.rbegin(), dev_pages.rend());
    for (int32_t l = 0; l < dev.num_layers(); ++l)
      kv::copy_layer_pages(host.pool(), dev, LayerId{l}, kv::page_copy_runs(host_pages, back),
                           memcpy_fn);
    // Device page back[i] now holds what page dev_pages[i] held: tokens of page i.
    for (size_t i = 0; i < 12; ++i) {
      std::vector<SlotIndex> s;
      for (int32_t j = 0; j < page_size; ++j) s.push_back(back[i] * page_size + j);
      std::vector<SlotIndex> all;
      for (size_t q = 0; q < i; ++q)
        for (int32_t j = 0; j < page_size; ++j) all.push_back(back[q] * page_size + j);
      all.insert(all.end(), s.begin(), s.end());
      EXPECT_TRUE(testing::kv_matches_all(dev, tokens, all)) << "page " << i;
    }
    EXPECT_THROW(kv::copy_layer_pages(dev, host.pool(), LayerId{0},
                                      std::vector<kv::PageCopy>{{.src = 12, .dst = 1, .count = 2}},
                                      memcpy_fn),
                 Error);
  }
}

// DSA pools (MLA with index keys, kv_pool.h): the index rows travel with their page in both
// copy directions and in the storage serialisation, and a pool pair that differs in index width
// is refused. Slots outside the copied pages keep their bytes.
TEST(HostPool, DsaIndexKeysTravelWithTheirPages) {
  for (const int32_t page_size : {1, 16}) {
    const uint64_t seed = 2026120700 + static_cast<uint64_t>(page_size);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << page_size);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    auto platform = platform::make_cpu_platform();
    const kv::KvPoolConfig cfg{.layout = kv::KvLayout::kMla,
                               .num_layers = 2,
                               .num_pages = 6,
                               .page_size = page_size,
                               .dtype = DType::kF32,
                               .kv_lora_rank = 8,
                               .rope_dim = 4,
                               .index_head_dim = 16};
    kv::KvPool dev(cfg, platform->allocator());
    kv::HostKvPool host(cfg, {.ratio = 2}, platform->pinned_allocator());
    EXPECT_EQ(kv::bytes_per_page(host.pool()), 2 * page_size * ((8 + 4) * 4 + 16 + 4));
    const int32_t n = 6 * page_size;  // pages 1..6, every slot
    std::vector<SlotIndex> slots(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = page_size + i;
    std::vector<float> keys(static_cast<size_t>(n) * 16);
    for (int32_t l = 0; l < 2; ++l) {
      for (float& x : keys) x = u(rng) * static_cast<float>(1 + l);
      dev.set_index_keys(LayerId{l}, slots, keys.data());
    }
    auto key_at = [](const kv::KvPool& p, int32_t l, SlotIndex s) {
      std::vector<float> v;
      for (int32_t d = 0; d < 16; ++d) v.push_back(p.index_key_at(LayerId{l}, s, d));
      return v;
    };
    const kv::CopyFn memcpy_fn = [](void* d, const void* s, size_t bytes) {
      std::memcpy(d, s, bytes);
    };
    // Device pages 2, 3, 5 -> host pages 9, 10, 1; host page 4 stays untouched.
    const std::vector<int32_t> from{2, 3, 5}, to{9, 10, 1};
    host.pool().fill_bytes(0x5A);
    for (int32_t l = 0; l < 2; ++l)
      kv::copy_layer_pages(dev, host.pool(), LayerId{l}, kv::page_copy_runs(from, to), memcpy_fn);
    for (int32_t l = 0; l < 2; ++l) {
      for (size_t i = 0; i < from.size(); ++i) {
        for (int32_t j = 0; j < page_size; ++j) {
          EXPECT_EQ(key_at(host.pool(), l, to[i] * page_size + j),
                    key_at(dev, l, from[i] * page_size + j))
              << "layer " << l << " page " << from[i] << " row " << j;
        }
      }
      const uint8_t* untouched = host.pool().index_rows(LayerId{l}) +
                                 int64_t{4} * page_size * host.pool().index_row_bytes();
      for (int64_t b = 0; b < page_size * host.pool().index_row_bytes(); ++b)
        ASSERT_EQ(untouched[b], 0x5A) << "host page 4 was written, layer " << l;
    }
    // The storage serialisation of host page 9 carries the index rows into another pool.
    std::vector<std::byte> record(static_cast<size_t>(kv::bytes_per_page(host.pool())));
    kv::read_page(host.pool(), 9, record);
    kv::HostKvPool other(cfg, {.ratio = 1}, platform->pinned_allocator());
    kv::write_page(other.pool(), 3, record);
    for (int32_t l = 0; l < 2; ++l)
      for (int32_t j = 0; j < page_size; ++j)
        EXPECT_EQ(key_at(other.pool(), l, 3 * page_size + j), key_at(dev, l, 2 * page_size + j));
    // Back to the device after poisoning it: the rows return to their new pages.
    dev.fill_bytes(0xFF);
    for (int32_t l = 0; l < 2; ++l)
      kv::copy_layer_pages(host.pool(), dev, LayerId{l}, kv::page_copy_runs(to, from), memcpy_fn);
    for (int32_t l = 0; l < 2; ++l)
      for (int32_t j = 0; j < page_size; ++j)
        EXPECT_EQ(key_at(dev, l, 5 * page_size + j), key_at(host.pool(), l, page_size + j));
    kv::KvPoolConfig narrower = cfg;
    narrower.index_head_dim = 8;
    kv::KvPool mismatch(narrower, platform->allocator());
    EXPECT_THROW(
        kv::copy_layer_pages(dev, mismatch, LayerId{0}, kv::page_copy_runs(from, to), memcpy_fn),
        Error);
  }
}

}  // namespace
}  // namespace pagoda::tier
