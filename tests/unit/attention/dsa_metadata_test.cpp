// The DSA indexer metadata of a speculative verify step (attention/dsa.h): each row of a draft
// tree sees the committed prefix and only the draft nodes on its own path (itself and its
// ancestors), as SpecInfo::tree_mask states. Random trees from a printed seed; the oracle walks
// the parents (not the mask the batch carries); the selection checks refuse a draft node off a
// row's path and the gather plan reads exactly the selected slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/req_to_token.h"
#include "test_seed.h"

namespace pagoda::attention {
namespace {

TEST(DsaMetadata, VerifyRowsSeeThePrefixAndTheirOwnTreePath) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 20; ++iter) {
    const int tree = 2 + static_cast<int>(rng() % 7), bs = 1 + static_cast<int>(rng() % 3);
    kv::ReqToTokenTable table(4, 64);
    ForwardBatch f;
    f.mode = ForwardMode::kTargetVerify;
    f.batch_size = bs;
    f.spec.num_draft_tokens = tree;
    std::vector<std::vector<int32_t>> parents(static_cast<size_t>(bs));
    std::vector<std::vector<int32_t>> row_slots(static_cast<size_t>(bs));
    for (int b = 0; b < bs; ++b) {
      const int prefix = 1 + static_cast<int>(rng() % 20);
      const ReqSlot row = *table.alloc();
      for (int p = 0; p < prefix + tree; ++p)
        row_slots[static_cast<size_t>(b)].push_back(100 * (b + 1) + p);
      table.write(row, 0, row_slots[static_cast<size_t>(b)]);
      f.req_pool_indices.push_back(row.value());
      f.seq_lens.push_back(prefix);
      f.extend_prefix_lens.push_back(prefix);
      f.extend_seq_lens.push_back(tree);
      auto& par = parents[static_cast<size_t>(b)];
      par.push_back(-1);
      for (int i = 1; i < tree; ++i) par.push_back(static_cast<int32_t>(rng() % uint64_t(i)));
      for (int i = 0; i < tree; ++i) {  // FULL_MASK rows: prefix columns, then the path's nodes
        f.positions.push_back(prefix + i);
        f.out_cache_loc.push_back(row_slots[static_cast<size_t>(b)][static_cast<size_t>(prefix + i)]);
        std::vector<uint8_t> r(static_cast<size_t>(prefix + tree), 0);
        for (int p = 0; p < prefix; ++p) r[static_cast<size_t>(p)] = 1;
        for (int j = i; j >= 0; j = par[static_cast<size_t>(j)]) r[static_cast<size_t>(prefix + j)] = 1;
        f.spec.tree_mask.insert(f.spec.tree_mask.end(), r.begin(), r.end());
      }
    }
    const IndexerMetadata meta = build_indexer_metadata(f, table);
    ASSERT_EQ(static_cast<int>(meta.row_request.size()), bs * tree);
    // The oracle: position p of the request is seen by node i iff p < prefix or p - prefix is i
    // or one of its ancestors.
    auto on_path = [&](int b, int i, int j) {
      for (int n = i; n >= 0; n = parents[static_cast<size_t>(b)][static_cast<size_t>(n)])
        if (n == j) return true;
      return false;
    };
    std::vector<int32_t> topk;
    const int k = *std::max_element(f.seq_lens.begin(), f.seq_lens.end()) + tree;
    int t = 0, off_row = -1, off_pos = -1;
    for (int b = 0; b < bs; ++b) {
      const int prefix = f.seq_lens[static_cast<size_t>(b)];
      for (int i = 0; i < tree; ++i, ++t) {
        std::vector<int32_t> sel;
        for (int p = -2; p <= prefix + tree; ++p) {
          const bool want = p >= 0 && p < prefix + tree && (p < prefix || on_path(b, i, p - prefix));
          ASSERT_EQ(meta.sees(t, p), want) << "request " << b << " node " << i << " position " << p;
          if (want && rng() % 2 == 0) sel.push_back(p);
          if (!want && p >= prefix && p < prefix + tree) {
            off_row = t;
            off_pos = p;
          }
        }
        sel.resize(static_cast<size_t>(k), -1);
        topk.insert(topk.end(), sel.begin(), sel.end());
      }
    }
    // Selections of seen positions plan; the gather plan reads their slots.
    const PagedPlan plan = sparse_gather_plan(meta, topk, k);
    size_t e = 0;
    for (int r = 0; r < bs * tree; ++r) {
      const int b = meta.row_request[static_cast<size_t>(r)];
      for (int j = 0; j < k; ++j) {
        const int32_t pos = topk[static_cast<size_t>(r * k + j)];
        if (pos < 0) continue;
        ASSERT_LT(e, plan.kv_indices.size());
        EXPECT_EQ(plan.kv_indices[e++], row_slots[static_cast<size_t>(b)][static_cast<size_t>(pos)]);
      }
    }
    EXPECT_EQ(e, plan.kv_indices.size());
    if (off_row >= 0) {  // a draft node off the row's path is refused by name
      std::vector<int32_t> bad = topk;
      bad[static_cast<size_t>(off_row * k)] = off_pos;
      for (int j = 1; j < k; ++j)
        if (bad[static_cast<size_t>(off_row * k + j)] == off_pos) bad[static_cast<size_t>(off_row * k + j)] = -1;
      try {
        (void)sparse_gather_plan(meta, bad, k);
        ADD_FAILURE() << "row " << off_row << " selected position " << off_pos << " off its path";
      } catch (const Error& err) {
        EXPECT_EQ(err.code(), ErrorCode::kOutOfRange) << err.what();
      }
    }
  }
}

TEST(DsaMetadata, VerifyTreeMaskOfTheWrongSizeIsRefused) {
  kv::ReqToTokenTable table(2, 16);
  const ReqSlot row = *table.alloc();
  table.write(row, 0, std::vector<int32_t>{1, 2, 3, 4, 5});
  ForwardBatch f{.mode = ForwardMode::kTargetVerify, .batch_size = 1,
                 .req_pool_indices = {row.value()}, .seq_lens = {2},
                 .extend_prefix_lens = {2}, .extend_seq_lens = {3},
                 .positions = {2, 3, 4}, .out_cache_loc = {3, 4, 5}};
  f.spec.num_draft_tokens = 3;
  f.spec.tree_mask.assign(3 * 5 - 1, 1);  // one byte short
  try {
    (void)build_indexer_metadata(f, table);
    ADD_FAILURE() << "a short tree mask was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

}  // namespace
}  // namespace pagoda::attention
