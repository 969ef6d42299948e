// DeepSeek sparse attention through the host backends' hook (attention/dsa.h): after
// set_sparse_topk a forward of the absorbed MLA attends to exactly the listed positions (an oracle
// written from the math: softmax over the selected keys only), the next forward is dense again,
// for the reference and cpu backends at page sizes 1 / 16 / 64 on shuffled pages, a mixed batch
// (an extend over a prefix and a decode row), rows padded with -1; the check sees a selection
// missing one token (the mutant).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/backends/reference/reference_backend.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"
#include "sparse_oracle.h"
#include "test_seed.h"

namespace pagoda::backends {
namespace {

constexpr int kRank = 32, kRope = 8, kDim = kRank + kRope, kHeads = 4, kTopk = 6;
constexpr float kScaling = 0.15f;

/// out [rows, heads, rank] of softmax(scaling·q·latent) over `seen[row]` positions (f64,
/// sparse_oracle.h).
std::vector<double> sparse_oracle(const std::vector<float>& q,
                                  const std::vector<std::vector<const float*>>& seen) {
  return testing::sparse_mla_oracle(q, kHeads, kDim, kRank, kScaling, seen).out;
}

double max_diff(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return worst;
}

TEST(SparseMla, HostBackendsAttendToExactlyTheSelectedPositions) {
  const pagoda::testing::TestSeed seed;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto platform = platform::make_cpu_platform();
  for (const int page : {1, 16, 64}) {
    for (const bool cpu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (cpu ? "cpu" : "reference") << " page " << page);
      const int pages = 256 / page + 4;
      kv::KvPool pool({.layout = kv::KvLayout::kMla, .num_layers = 1, .num_pages = pages,
                       .page_size = page, .dtype = DType::kF32, .kv_lora_rank = kRank,
                       .rope_dim = kRope, .index_head_dim = 8},
                      platform->allocator());
      kv::ReqToTokenTable table(4, 128);
      const attention::BackendContext ctx{.platform = platform.get(), .kv_pool = &pool,
                                          .req_to_token = &table};
      std::unique_ptr<attention::AttentionBackend> backend;
      if (cpu) {
        backend = std::make_unique<CpuBackend>(ctx);
      } else {
        backend = std::make_unique<ReferenceBackend>(ctx);
      }
      // Request 0: 30 cached + 7 new tokens; request 1: 52 cached + 1 (a decode row), on
      // shuffled pages, every latent row random.
      std::vector<int32_t> page_ids(static_cast<size_t>(pages));
      std::iota(page_ids.begin(), page_ids.end(), 1);
      std::shuffle(page_ids.begin(), page_ids.end(), rng);
      const int lens[2] = {37, 53}, news[2] = {7, 1};
      std::vector<std::vector<SlotIndex>> slots(2);
      attention::ForwardBatch f{.mode = attention::ForwardMode::kMixed, .batch_size = 2};
      for (int b = 0, next = 0; b < 2; ++b) {
        const ReqSlot row = *table.alloc();
        for (int p = 0; p < lens[b]; ++p, ++next)
          slots[b].push_back(page_ids[next / page] * page + next % page);
        next = (next + page - 1) / page * page;
        table.write(row, 0, slots[b]);
        std::vector<float> rows(static_cast<size_t>(lens[b]) * kDim);
        for (float& x : rows) x = normal(rng);
        pool.set_kv(LayerId{0}, slots[b], TensorView(rows.data(), DType::kF32, {lens[b], 1, kDim}),
                    TensorView());
        f.req_pool_indices.push_back(row.value());
        f.seq_lens.push_back(lens[b]);
        f.extend_prefix_lens.push_back(lens[b] - news[b]);
        f.extend_seq_lens.push_back(news[b]);
        for (int p = lens[b] - news[b]; p < lens[b]; ++p) {
          f.positions.push_back(p);
          f.out_cache_loc.push_back(slots[b][p]);
        }
      }
      auto key = [&](int b, int p) {  // the stored latent row of position p of request b
        return static_cast<const float*>(pool.k_view(LayerId{0}).data()) +
               static_cast<int64_t>(slots[b][p]) * kDim;
      };
      backend->init_forward_metadata(f);
      const attention::IndexerMetadata* meta = backend->get_indexer_metadata();
      ASSERT_NE(meta, nullptr);
      const int t = f.num_tokens();
      ASSERT_EQ(meta->row_visible, (std::vector<int32_t>{31, 32, 33, 34, 35, 36, 37, 53}));
      // Each row: 6 random distinct visible positions (row 0: 5 and a -1).
      std::vector<int32_t> topk;
      std::vector<std::vector<const float*>> seen(t), dense(t);
      for (int r = 0; r < t; ++r) {
        const int b = meta->row_request[r];
        std::vector<int32_t> all(static_cast<size_t>(meta->row_visible[r]));
        std::iota(all.begin(), all.end(), 0);
        for (int p : all) dense[r].push_back(key(b, p));
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < kTopk; ++j) {
          const int32_t p = r == 0 && j == 3 ? -1 : all[j];
          topk.push_back(p);
          if (p >= 0) seen[r].push_back(key(b, p));
        }
      }
      std::vector<float> q(static_cast<size_t>(t) * kHeads * kDim), out(q.size() / kDim * kRank);
      for (float& x : q) x = normal(rng);
      const attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = kHeads,
                                            .num_kv_heads = 1, .head_dim_qk = kDim,
                                            .head_dim_v = kRank, .scaling = kScaling,
                                            .is_mla = true};
      const TensorView qv(q.data(), DType::kF32, {t, kHeads, kDim});
      const TensorView ov(out.data(), DType::kF32, {t, kHeads, kRank});
      backend->set_sparse_topk(topk, kTopk);
      backend->forward(qv, TensorView(), TensorView(), layer, f, ov, attention::SaveKv::kNo);
      const double tol = 2e-5;
      EXPECT_LE(max_diff(out, sparse_oracle(q, seen)), tol) << "sparse forward";
      auto missing = seen;  // the mutant: row 1 without one of its selected keys
      missing[1].erase(missing[1].begin() + 2);
      EXPECT_GT(max_diff(out, sparse_oracle(q, missing)), 100 * tol) << "a dropped key unseen";
      // The selection applies to one forward: the next is dense (causal) again.
      backend->forward(qv, TensorView(), TensorView(), layer, f, ov, attention::SaveKv::kNo);
      EXPECT_LE(max_diff(out, sparse_oracle(q, dense)), tol) << "dense forward after";
    }
  }
}

}  // namespace
}  // namespace pagoda::backends
