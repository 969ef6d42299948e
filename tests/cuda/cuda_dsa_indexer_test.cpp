/// The DSA lightning indexer on the GPU (CudaBackend::select_index_topk, kernels/cuda/
/// dsa_indexer.h) at DeepSeek-V3.2's sizes (64 index heads of 128 dims, k 2,048) against the
/// host indexer (attention/dsa.h index_topk_host, f64) over the same pool bytes: two requests of
/// 3,000 and 5,000 cached tokens on shuffled 64-token pages, a decode row each and a 24-token
/// extend. Both round the queries to the key grid; the GPU accumulates in f32 (tensor cores)
/// and selects by radix select, so where the two selections differ, each differing position
/// must score within the f32 tolerance of the host's k-th score (a near tie at the cut);
/// everywhere else the lists are equal, order included.
/// The rest of the device pool is 0xFF (NaN). Then the device path (apply_index_topk) against
/// the host path through the sparse MLA forward. Label "gpu"; the seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_test_common.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/backends/cuda/cuda_backend.h"
#include "pagoda/core/float_convert.h"
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

  // The device path (apply_index_topk: the selection stays on the GPU, written into the step's
  // one sparse plan) attends to what the host path (select_index_topk + set_sparse_topk)
  // selects: the sparse MLA forward of both over random latent rows (every other slot NaN)
  // agrees to bf16 rounding (the rows come in score order, not position order, so the sums'
  // order differs), and twice in a row bit for bit (the second layer reuses the plan).
  constexpr int kRow = 576, kLora = 512, kQHeads = 16;
  {
    std::vector<uint16_t> latent(static_cast<size_t>(dev.num_slots()) * kRow, 0xFFFF);
    for (size_t b = 0; b < rows.size(); ++b)
      for (const int32_t slot : table.read(rows[b], 0, len[b]))
        for (int j = 0; j < kRow; ++j)
          latent[static_cast<size_t>(slot) * kRow + j] = f32_to_bf16_bits(u(rng));
    gpu->allocator().copy_to_device(dev.k_view(LayerId(0)).data(), latent.data(),
                                    latent.size() * 2);
  }
  std::vector<uint16_t> qh(static_cast<size_t>(n) * kQHeads * kRow);
  for (uint16_t& x : qh) x = f32_to_bf16_bits(u(rng));
  const size_t out_elems = static_cast<size_t>(n) * kQHeads * kLora;
  auto qd = platform::make_buffer(gpu->allocator(), qh.size() * 2);
  auto kd = platform::make_buffer(gpu->allocator(), static_cast<size_t>(n) * kRow * 2);
  auto od = platform::make_buffer(gpu->allocator(), out_elems * 2);
  gpu->allocator().copy_to_device(qd.get(), qh.data(), qh.size() * 2);
  const Device d = gpu->device();
  const TensorView qv(qd.get(), DType::kBF16, {n, kQHeads, kRow}, d);
  const TensorView kvw(kd.get(), DType::kBF16, {n, 1, kRow}, d);
  const TensorView ov(od.get(), DType::kBF16, {n, kQHeads, kLora}, d);
  const AttentionLayer spec{.layer_id = LayerId(0),
                            .num_q_heads = kQHeads,
                            .num_kv_heads = 1,
                            .head_dim_qk = kRow,
                            .head_dim_v = kLora,
                            .scaling = 1.f / std::sqrt(192.f),
                            .is_mla = true};
  auto forward = [&] {
    const std::vector<uint16_t> nan(out_elems, 0xFFFF);
    gpu->allocator().copy_to_device(od.get(), nan.data(), out_elems * 2);
    backend.forward(qv, kvw, TensorView(), spec, batch, ov, SaveKv::kNo);
    std::vector<uint16_t> o(out_elems);
    gpu->allocator().copy_to_host(o.data(), od.get(), out_elems * 2);
    return o;
  };
  backend.init_forward_metadata(batch);
  backend.select_index_topk(LayerId(0), iq, kTopk, got, {});
  backend.set_sparse_topk(got, kTopk);
  const std::vector<uint16_t> via_host = forward();
  backend.init_forward_metadata(batch);
  backend.apply_index_topk(LayerId(0), iq, kTopk);
  const std::vector<uint16_t> via_device = forward();
  backend.apply_index_topk(LayerId(0), iq, kTopk);
  const std::vector<uint16_t> again = forward();
  double worst = 0;
  for (size_t i = 0; i < out_elems; ++i) {
    const float h = bf16_bits_to_f32(via_host[i]), g = bf16_bits_to_f32(via_device[i]);
    ASSERT_TRUE(std::isfinite(h) && std::isfinite(g)) << "output " << i;
    ASSERT_NEAR(g, h, 1e-2 + 1e-2 * std::fabs(h))
        << "output " << i << " (row " << i / (kQHeads * kLora) << ")";
    worst = std::max(worst, double(std::fabs(g - h)));
    ASSERT_EQ(again[i], via_device[i]) << "output " << i << ": the second layer differs";
  }
  std::printf("sparse MLA, device vs host selection path: max |diff| %.3g\n", worst);
}

}  // namespace
}  // namespace pagoda::cuda_test
