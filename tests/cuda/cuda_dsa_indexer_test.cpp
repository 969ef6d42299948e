/// The DSA lightning indexer on the GPU (CudaBackend::select_index_topk, kernels/cuda/
/// dsa_indexer.h) at DeepSeek-V3.2's sizes (64 index heads of 128 dims, k 2,048) against the
/// host indexer (attention/dsa.h index_topk_host, f64) over the same pool bytes: two requests of
/// 3,000 and 5,000 cached tokens on shuffled 64-token pages, a decode row each and a 24-token
/// extend. The GPU scores in f32 and sorts with a stable radix sort, so where the two
/// selections differ, each differing position must score within the f32 tolerance of the host's
/// k-th score (a near tie at the cut); everywhere else the lists are equal, order included.
/// The rest of the device pool is 0xFF (NaN). Label "gpu"; the seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/backends/cuda/cuda_backend.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/cuda/cuda_platform.h"
#include "pagoda/platform/platform.h"

namespace pagoda::cuda_test {
namespace {

using namespace pagoda::attention;

TEST(CudaDsaIndexer, MatchesTheHostIndexerAtDeepSeekSizes) {
  PAGODA_REQUIRE_GPU();
  const uint64_t seed = 20261207;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int kPage = 64, kDim = 128, kHeads = 64, kTopk = 2048, kExtend = 24;
  const std::vector<int> prefix{3000, 5000};
  // Requests: 0 and 1 decode one token each; request 2 extends 24 tokens over request 1's text.
  std::vector<int> len{prefix[0] + 1, prefix[1] + 1, prefix[1] + kExtend};
  int pages = 0;
  for (int l : len) pages += (l + kPage - 1) / kPage;
  std::vector<int32_t> ids(static_cast<size_t>(pages));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  const kv::KvPoolConfig cfg{.layout = kv::KvLayout::kMla,
                             .num_layers = 1,
                             .num_pages = pages + 2,
                             .page_size = kPage,
                             .dtype = DType::kBF16,
                             .kv_lora_rank = 512,
                             .rope_dim = 64,
                             .index_head_dim = kDim};
  auto cpu = platform::make_cpu_platform();
  kv::KvPool host(cfg, cpu->allocator());
  host.fill_bytes(0xFF);
  kv::ReqToTokenTable table(4, 8192);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  size_t next = 0;
  std::vector<ReqSlot> rows;
  for (size_t b = 0; b < len.size(); ++b) {
    std::vector<int32_t> slots;
    for (int i = 0; i < len[b]; ++i) {
      if (i % kPage == 0) ++next;
      slots.push_back(ids[next - 1] * kPage + i % kPage);
    }
    std::vector<float> keys(slots.size() * kDim);
    for (float& x : keys)
      x = u(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 5) - 2));
    host.set_index_keys(LayerId(0), slots, keys.data());
    rows.push_back(*table.alloc());
    table.write(rows.back(), 0, slots);
  }
  ForwardBatch batch;
  batch.mode = ForwardMode::kMixed;
  batch.batch_size = 3;
  for (int b = 0; b < 3; ++b) {
    const int ext = b == 2 ? kExtend : 1;
    batch.req_pool_indices.push_back(rows[static_cast<size_t>(b)].value());
    batch.seq_lens.push_back(len[static_cast<size_t>(b)]);
    batch.extend_prefix_lens.push_back(len[static_cast<size_t>(b)] - ext);
    batch.extend_seq_lens.push_back(ext);
    for (int i = 0; i < ext; ++i) {
      const int pos = len[static_cast<size_t>(b)] - ext + i;
      batch.positions.push_back(pos);
      batch.out_cache_loc.push_back(table.read(rows[static_cast<size_t>(b)], pos, 1)[0]);
    }
  }
  const int n = batch.num_tokens();
  std::vector<float> q(static_cast<size_t>(n) * kHeads * kDim), w(static_cast<size_t>(n) * kHeads);
  for (float& x : q) x = u(rng);
  for (float& x : w) x = u(rng) / std::sqrt(float(kHeads * kDim));
  const IndexerQuery iq{.q = q.data(), .w = w.data(), .heads = kHeads, .dim = kDim};

  std::vector<int32_t> want(static_cast<size_t>(n) * kTopk), got(want.size());
  std::vector<float> want_s(want.size()), got_s(want.size());
  const IndexerMetadata meta = build_indexer_metadata(batch, table);
  index_topk_host(host, LayerId(0), meta, iq, kTopk, want, want_s);

  auto gpu = platform::make_cuda_platform();
  kv::KvPool dev(cfg, gpu->allocator());
  dev.fill_bytes(0xFF);
  gpu->allocator().copy_to_device(dev.index_data(LayerId(0)), host.index_data(LayerId(0)),
                                  static_cast<size_t>(host.num_slots() * host.index_row_bytes()));
  gpu->synchronize();
  backends::CudaBackend backend(
      BackendContext{.platform = gpu.get(), .kv_pool = &dev, .req_to_token = &table});
  backend.init_forward_metadata(batch);
  backend.select_index_topk(LayerId(0), iq, kTopk, got, got_s);

  int differing_rows = 0;
  for (int t = 0; t < n; ++t) {
    const size_t o = static_cast<size_t>(t) * kTopk;
    const std::vector<int32_t> a(want.begin() + o, want.begin() + o + kTopk);
    const std::vector<int32_t> g(got.begin() + o, got.begin() + o + kTopk);
    for (int i = 0; i < kTopk; ++i) {
      ASSERT_NEAR(got_s[o + i], want_s[o + i], 2e-5 + 2e-5 * std::fabs(want_s[o + i]))
          << "row " << t << " rank " << i;
    }
    if (a == g) continue;
    ++differing_rows;
    const float cut = want_s[o + kTopk - 1];
    std::vector<int32_t> sa(a), sg(g);
    std::sort(sa.begin(), sa.end());
    std::sort(sg.begin(), sg.end());
    std::vector<int32_t> diff;
    std::set_symmetric_difference(sa.begin(), sa.end(), sg.begin(), sg.end(),
                                  std::back_inserter(diff));
    for (int32_t p : diff) {
      // Only positions whose score is a near tie with the cut may swap in or out.
      const auto in_a = std::find(a.begin(), a.end(), p);
      const auto in_g = std::find(g.begin(), g.end(), p);
      const float s = in_a != a.end() ? want_s[o + size_t(in_a - a.begin())]
                                      : got_s[o + size_t(in_g - g.begin())];
      EXPECT_NEAR(s, cut, 4e-5 + 4e-5 * std::fabs(cut)) << "row " << t << " position " << p;
    }
  }
  std::printf("rows %d, rows whose selection differs at a near tie: %d\n", n, differing_rows);
}

}  // namespace
}  // namespace pagoda::cuda_test
