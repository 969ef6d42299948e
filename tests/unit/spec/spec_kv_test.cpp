// The KV side of a speculative round on a real PageAllocator / ReqToTokenTable / KvPool for page
// sizes 1, 4 and 16: draft slots, moves, freed pages, rollback and move_kv with overlapping pairs.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/spec/spec_kv.h"

namespace pagoda::spec {
namespace {

class SpecKv : public ::testing::TestWithParam<int> {};

TEST_P(SpecKv, RoundsKeepExactlyTheAcceptedPositions) {
  const int page = GetParam();
  const uint64_t seed = 555 + static_cast<uint64_t>(page);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " page " << page);
  std::mt19937_64 rng(seed);
  const int32_t pages = 4096 / page;
  kv::PageAllocator alloc(pages, page);
  kv::ReqToTokenTable table(8, 512);
  // Requests with random committed lengths (their own pages).
  std::vector<SpecSeqKv> seqs;
  for (int b = 0; b < 5; ++b) {
    const int32_t len = 1 + static_cast<int32_t>(rng() % 100);
    const ReqSlot row = *table.alloc();
    const int32_t zero = 0;
    const SlotIndex none = -1;
    auto s = alloc.alloc_extend(std::span(&zero, 1), std::span(&len, 1), std::span(&none, 1));
    ASSERT_TRUE(s.has_value());
    table.write(row, 0, *s);
    seqs.push_back({row, len});
  }
  for (int round = 0; round < 30; ++round) {
    const int32_t extra = 1 + static_cast<int32_t>(rng() % 12);
    const int64_t free_before = alloc.available_size();
    // Rollback: backup, allocate, restore → the allocator is as before.
    const kv::AllocatorState st = alloc.backup_state();
    ASSERT_TRUE(alloc_draft_slots(alloc, table, seqs, extra).has_value());
    alloc.restore_state(st);
    alloc.check_integrity();
    ASSERT_EQ(alloc.available_size(), free_before);

    const auto slots = alloc_draft_slots(alloc, table, seqs, extra);
    ASSERT_TRUE(slots.has_value());
    std::vector<std::vector<int32_t>> kv_nodes;
    std::vector<SlotIndex> want_src, want_dst;
    for (size_t b = 0; b < seqs.size(); ++b) {
      // Row positions [len, len + extra) hold the new slots, in order.
      for (int32_t j = 0; j < extra; ++j)
        ASSERT_EQ(table.row(seqs[b].row)[static_cast<size_t>(seqs[b].kv_len + j)],
                  (*slots)[b * static_cast<size_t>(extra) + static_cast<size_t>(j)]);
      // A random root-to-node path: strictly increasing node ids with node(j) >= j.
      std::vector<int32_t> nodes = {0};
      const int32_t keep = 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(extra));
      for (int32_t j = 1; j < keep; ++j) {
        const int32_t lo = nodes.back() + 1;
        const int32_t hi = extra - (keep - j);  // leave room for the rest of the path
        nodes.push_back(lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1)));
      }
      for (int32_t j = 0; j < keep; ++j) {
        if (nodes[j] == j) continue;
        want_src.push_back((*slots)[b * static_cast<size_t>(extra) + static_cast<size_t>(nodes[j])]);
        want_dst.push_back((*slots)[b * static_cast<size_t>(extra) + static_cast<size_t>(j)]);
      }
      kv_nodes.push_back(nodes);
    }
    const KvMoves m = commit_draft_slots(alloc, seqs, *slots, extra, kv_nodes);
    EXPECT_EQ(m.src, want_src);
    EXPECT_EQ(m.dst, want_dst);
    alloc.check_integrity();
    // Exactly the pages of positions [0, len + keep) stay referenced (one holder each).
    std::set<int32_t> held;
    for (size_t b = 0; b < seqs.size(); ++b) {
      seqs[b].kv_len += static_cast<int32_t>(kv_nodes[b].size());
      for (int32_t p = 0; p < seqs[b].kv_len; ++p)
        held.insert(table.row(seqs[b].row)[static_cast<size_t>(p)] / page);
    }
    ASSERT_EQ(alloc.num_referenced_pages(), static_cast<int32_t>(held.size()));
    for (int32_t p : held) ASSERT_EQ(alloc.refcount(PageId{p}), 1);
  }
  // Releasing every request returns the whole pool: nothing leaked.
  for (const SpecSeqKv& s : seqs)
    alloc.free(table.read(s.row, 0, s.kv_len));
  EXPECT_EQ(alloc.num_free_pages(), pages);
}

TEST_P(SpecKv, ShortPoolAndBadInputChangeNothing) {
  const int page = GetParam();
  kv::PageAllocator alloc(64 / page, page);
  kv::ReqToTokenTable table(2, 128);
  const ReqSlot row = *table.alloc();
  const int32_t zero = 0, len = 40;
  const SlotIndex none = -1;
  auto s = alloc.alloc_extend(std::span(&zero, 1), std::span(&len, 1), std::span(&none, 1));
  ASSERT_TRUE(s.has_value());
  table.write(row, 0, *s);
  const std::vector<SpecSeqKv> seqs = {{row, len}};
  const int64_t before = alloc.available_size();
  EXPECT_FALSE(alloc_draft_slots(alloc, table, seqs, 40).has_value());
  EXPECT_THROW(alloc_draft_slots(alloc, table, seqs, 100), Error);  // overflows the row
  EXPECT_THROW(alloc_draft_slots(alloc, table, seqs, 0), Error);
  EXPECT_EQ(alloc.available_size(), before);
  const auto slots = alloc_draft_slots(alloc, table, seqs, 4);
  ASSERT_TRUE(slots.has_value());
  const std::vector<std::vector<int32_t>> bad = {{1}};  // must start at the root
  EXPECT_THROW(commit_draft_slots(alloc, seqs, *slots, 4, bad), Error);
  const std::vector<std::vector<int32_t>> bad2 = {{0, 0}};  // node below its position
  EXPECT_THROW(commit_draft_slots(alloc, seqs, *slots, 4, bad2), Error);
  alloc.check_integrity();
}

INSTANTIATE_TEST_SUITE_P(Pages, SpecKv, ::testing::Values(1, 4, 16));

TEST(KvPoolMove, OverlappingPairsReadBeforeWrite) {
  auto platform = platform::make_cpu_platform();
  kv::KvPool pool(kv::KvPoolConfig{.num_layers = 2,
                                   .num_pages = 8,
                                   .page_size = 4,
                                   .dtype = DType::kF32,
                                   .num_kv_heads = 2,
                                   .head_dim = 4},
                  platform->allocator());
  const int64_t n = pool.num_slots();
  auto kval = [](int l, int64_t s, int h, int d) { return static_cast<float>(l * 10000 + s * 100 + h * 10 + d); };
  for (int l = 0; l < 2; ++l) {
    for (int64_t s = 0; s < n; ++s) {
      std::vector<float> k(8), v(8);
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 4; ++d) {
          k[h * 4 + d] = kval(l, s, h, d);
          v[h * 4 + d] = -kval(l, s, h, d);
        }
      const SlotIndex slot = static_cast<SlotIndex>(s);
      pool.set_kv(LayerId{l}, std::span(&slot, 1),
                  TensorView(k.data(), DType::kF32, {1, 2, 4}),
                  TensorView(v.data(), DType::kF32, {1, 2, 4}));
    }
  }
  // A cycle 5 → 9 → 13 → 5 plus a plain move 20 → 6.
  const std::vector<SlotIndex> src = {5, 9, 13, 20}, dst = {9, 13, 5, 6};
  pool.move_kv(src, dst);
  for (int l = 0; l < 2; ++l)
    for (size_t i = 0; i < src.size(); ++i)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 4; ++d) {
          EXPECT_EQ(pool.k_at(LayerId{l}, dst[i], h, d), kval(l, src[i], h, d));
          EXPECT_EQ(pool.v_at(LayerId{l}, dst[i], h, d), -kval(l, src[i], h, d));
        }
  EXPECT_EQ(pool.k_at(LayerId{0}, 20, 1, 3), kval(0, 20, 1, 3));  // sources stay
  EXPECT_THROW(pool.move_kv(std::vector<SlotIndex>{1}, std::vector<SlotIndex>{}), Error);
  EXPECT_THROW(pool.move_kv(std::vector<SlotIndex>{1}, std::vector<SlotIndex>{static_cast<SlotIndex>(n)}), Error);
}

}  // namespace
}  // namespace pagoda::spec
