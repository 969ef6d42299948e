// The DSA indexer metadata of a speculative verify step (attention/dsa.h): each row of a draft
// tree sees the committed prefix and only the draft nodes on its own path (itself and its
// ancestors), as SpecInfo::tree_mask states. Random trees from a printed seed; the oracle walks
// the parents (not the mask the batch carries); the selection checks refuse a draft node off a
// row's path and the gather plan reads exactly the selected slots; sparse_gather_shape is the
// gather plan of every selection the indexer makes, whatever its k.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "pagoda/attention/dsa.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"
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
    // The indexer over random index keys at those slots, k at least every row's visible count:
    // each row keeps exactly the positions it sees (never a draft node off its path), then -1.
    {
      auto platform = platform::make_cpu_platform();
      kv::KvPool pool(kv::KvPoolConfig{.layout = kv::KvLayout::kMla,
                                       .num_layers = 1,
                                       .num_pages = 420,
                                       .page_size = 1,
                                       .dtype = DType::kF32,
                                       .kv_lora_rank = 16,
                                       .rope_dim = 16,
                                       .index_head_dim = 8},
                      platform->allocator());
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (int b = 0; b < bs; ++b) {
        const auto& slots = row_slots[static_cast<size_t>(b)];
        std::vector<float> keys(slots.size() * 8);
        for (float& x : keys) x = u(rng);
        pool.set_index_keys(LayerId(0), slots, keys.data());
      }
      const int n = bs * tree, heads = 2;
      std::vector<float> q(static_cast<size_t>(n * heads * 8)), w(static_cast<size_t>(n * heads));
      for (float& x : q) x = u(rng);
      for (float& x : w) x = u(rng);
      std::vector<int32_t> got(static_cast<size_t>(n * k), -7);
      index_topk_host(pool, LayerId(0), meta,
                      IndexerQuery{.q = q.data(), .w = w.data(), .heads = heads, .dim = 8}, k, got,
                      {});
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> want, sel;
        for (int p = 0; p < meta.row_visible[static_cast<size_t>(r)]; ++p)
          if (meta.sees(r, p)) want.push_back(p);
        for (int j = 0; j < k; ++j) {
          const int32_t p = got[static_cast<size_t>(r * k + j)];
          if (j < static_cast<int>(want.size())) {
            sel.push_back(p);
          } else {
            EXPECT_EQ(p, -1) << "row " << r << " entry " << j;
          }
        }
        std::sort(sel.begin(), sel.end());
        EXPECT_EQ(sel, want) << "row " << r;
        EXPECT_EQ(row_seen(meta, r), static_cast<int32_t>(want.size())) << "row " << r;
      }
      // A k below some rows' counts: the plan of the indexer's selection is the one a device
      // backend plans before it selects (sparse_gather_shape), but for the slots.
      const int k2 = 1 + static_cast<int>(rng() % static_cast<uint64_t>(k));
      std::vector<int32_t> sel2(static_cast<size_t>(n * k2), -7);
      index_topk_host(pool, LayerId(0), meta,
                      IndexerQuery{.q = q.data(), .w = w.data(), .heads = heads, .dim = 8}, k2,
                      sel2, {});
      const PagedPlan gathered = sparse_gather_plan(meta, sel2, k2);
      const PagedPlan shape = sparse_gather_shape(meta, k2);
      EXPECT_EQ(shape.page_size, gathered.page_size);
      EXPECT_EQ(shape.qo_indptr, gathered.qo_indptr) << "k " << k2;
      EXPECT_EQ(shape.kv_indptr, gathered.kv_indptr) << "k " << k2;
      EXPECT_EQ(shape.kv_last_page_len, gathered.kv_last_page_len) << "k " << k2;
      EXPECT_EQ(shape.kv_indices.size(), gathered.kv_indices.size()) << "k " << k2;
      EXPECT_TRUE(std::all_of(shape.kv_indices.begin(), shape.kv_indices.end(),
                              [](int32_t x) { return x == 0; }));
    }
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

TEST(IndexTopkHost, BadArgumentsAreRefusedBeforeAnyWrite) {
  auto platform = platform::make_cpu_platform();
  const kv::KvPoolConfig mla{.layout = kv::KvLayout::kMla,
                             .num_layers = 1,
                             .num_pages = 4,
                             .page_size = 4,
                             .dtype = DType::kF32,
                             .kv_lora_rank = 16,
                             .rope_dim = 16,
                             .index_head_dim = 8};
  kv::KvPool pool(mla, platform->allocator());
  kv::KvPoolConfig plain = mla;
  plain.index_head_dim = 0;
  kv::KvPool no_keys(plain, platform->allocator());
  IndexerMetadata meta;  // two rows of one request, seeing 3 and 4 positions
  meta.row_request = {0, 0};
  meta.row_visible = {3, 4};
  meta.slot_indptr = {0, 4};
  meta.slots = {4, 5, 6, 7};
  meta.max_visible = 4;
  std::vector<float> q(2 * 2 * 8, 0.5f), w(2 * 2, 1.f);
  const IndexerQuery good{.q = q.data(), .w = w.data(), .heads = 2, .dim = 8};
  std::vector<int32_t> topk(2 * 3, -7);
  std::vector<float> scores(2 * 3, 0.f);
  auto refused = [&](const kv::KvPool& p, const IndexerQuery& iq, int k, std::span<int32_t> t,
                     std::span<float> s, const char* what) {
    try {
      index_topk_host(p, LayerId(0), meta, iq, k, t, s);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
    }
    EXPECT_TRUE(std::all_of(topk.begin(), topk.end(), [](int32_t x) { return x == -7; })) << what;
  };
  IndexerQuery wrong_dim = good;
  wrong_dim.dim = 16;
  IndexerQuery no_heads = good;
  no_heads.heads = 0;
  refused(pool, wrong_dim, 3, topk, scores, "a query dim other than the pool's");
  refused(pool, no_heads, 3, topk, scores, "zero heads");
  refused(pool, good, 0, std::span<int32_t>(topk).first(0), {}, "k 0");
  refused(pool, good, 3, std::span<int32_t>(topk).first(5), {}, "a short topk");
  refused(pool, good, 3, topk, std::span<float>(scores).first(4), "a short scores");
  refused(no_keys, good, 3, topk, {}, "a pool without index keys");
  IndexerQuery on_gpu = good;  // the CUDA model ops' queries: a host backend cannot read them
  on_gpu.device = Device::cuda(0);
  refused(pool, on_gpu, 3, topk, scores, "queries in device memory");
  // The same call with good arguments: row 0 keeps its 3 positions, row 1 three of its 4.
  index_topk_host(pool, LayerId(0), meta, good, 3, topk, scores);
  for (int32_t x : topk) EXPECT_GE(x, 0);
}

}  // namespace
}  // namespace pagoda::attention
