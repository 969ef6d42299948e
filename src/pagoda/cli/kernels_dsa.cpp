// `pagoda kernels --op dsa-decode` (kernels_dsa.h).
#include "pagoda/cli/kernels_dsa.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "pagoda/attention/backend.h"
#include "pagoda/attention/dsa.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/registry.h"
#include "pagoda/backends/builtin.h"
#include "pagoda/cli/kernel_clock.h"
#include "pagoda/core/error.h"
#include "pagoda/core/float_convert.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::cli {
namespace {

constexpr int kLoraRank = 512, kRopeDim = 64;

/// Fills `bytes` of `dst` (on `alloc`'s device) by repeating `block` (host).
void tile_fill(platform::Allocator& alloc, void* dst, size_t bytes,
               const std::vector<uint8_t>& block) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t at = 0; at < bytes; at += block.size())
    alloc.copy_to_device(d + at, block.data(), std::min(block.size(), bytes - at));
}

/// `n` random values in [-1, 1) stored as `dtype` (f32 or bf16) bytes.
std::vector<uint8_t> random_values(size_t n, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<uint8_t> out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) write_from_f32(out.data(), dtype, i, uni(rng));
  return out;
}

platform::DeviceBuffer upload(platform::Platform& p, const std::vector<uint8_t>& host) {
  auto buf = platform::make_buffer(p.allocator(), std::max<size_t>(host.size(), 16));
  p.allocator().copy_to_device(buf.get(), host.data(), host.size());
  return buf;
}

}  // namespace

void run_dsa_kernels(const DsaKernelArgs& a) {
  PAGODA_REQUIRE(a.batch >= 1 && a.kv_len >= 2 && a.q_heads >= 1 && a.page_size >= 1 &&
                     a.index_heads >= 1 && a.index_dim >= kRopeDim && a.topk >= 1 && a.iters >= 1 &&
                     a.warmup >= 0,
                 kInvalidArgument,
                 "kernels --op dsa-decode: batch, kv-len (>= 2), q-heads, page size, index heads, "
                 "topk, iters must be positive and index-dim >= {} (got {}, {}, {}, {}, {}, {}, "
                 "{}, {})",
                 kRopeDim, a.batch, a.kv_len, a.q_heads, a.page_size, a.index_heads, a.index_dim,
                 a.topk, a.iters);
  PAGODA_REQUIRE(a.kv_dtype == DType::kBF16 || a.kv_dtype == DType::kF32, kInvalidArgument,
                 "kernels --op dsa-decode: --kv-dtype must be bf16 or f32 (got {})", a.kv_dtype);
  const int64_t pages_per_seq = (int64_t{a.kv_len} + a.page_size - 1) / a.page_size;
  const int64_t num_pages = pages_per_seq * a.batch + 1;
  const int64_t row = kLoraRank + kRopeDim, es = static_cast<int64_t>(dtype_size(a.kv_dtype));
  const double pool_gib = static_cast<double>((num_pages + 1) * a.page_size) *
                          static_cast<double>(row * es + a.index_dim + 4) / (1ull << 30);
  PAGODA_REQUIRE(pool_gib <= 48.0, kResourceExhausted,
                 "kernels --op dsa-decode: the pool needs {:.1f} GiB (limit 48)", pool_gib);

  const backends::BackendSelection selection{.attention = a.backend};
  std::unique_ptr<platform::Platform> plat = engine::make_platform_for(selection);
  omp_set_num_threads(a.threads);
  kv::KvPoolConfig pc{.layout = kv::KvLayout::kMla,
                      .num_layers = 1,
                      .num_pages = static_cast<int32_t>(num_pages),
                      .page_size = a.page_size,
                      .dtype = a.kv_dtype};
  pc.kv_lora_rank = kLoraRank;
  pc.rope_dim = kRopeDim;
  pc.index_head_dim = a.index_dim;
  kv::KvPool pool(pc, plat->allocator());
  const LayerId layer(0);
  std::mt19937_64 rng(20261207);
  // Latent rows: a 16 MiB random block repeated; index keys: 4,096 random keys repeated.
  tile_fill(plat->allocator(), pool.k_view(layer).data(),
            static_cast<size_t>(pool.num_slots() * row * es),
            random_values(static_cast<size_t>((16 << 20) / es), a.kv_dtype, rng));
  {
    std::normal_distribution<float> normal(0.f, 1.f);
    const int64_t rb = pool.index_row_bytes();
    std::vector<uint8_t> block(static_cast<size_t>(4096 * rb));
    std::vector<float> key(static_cast<size_t>(a.index_dim));
    for (int64_t t = 0; t < 4096; ++t) {
      for (float& x : key) x = normal(rng);
      kv::quantize_index_key(key.data(), a.index_dim, block.data() + t * rb);
    }
    tile_fill(plat->allocator(), pool.index_data(layer), static_cast<size_t>(pool.num_slots() * rb),
              block);
  }

  // Each sequence on its own shuffled pages.
  std::vector<int32_t> pages(static_cast<size_t>(num_pages - 1));
  std::iota(pages.begin(), pages.end(), 1);
  std::shuffle(pages.begin(), pages.end(), rng);
  kv::ReqToTokenTable table(a.batch, a.kv_len + a.page_size);
  attention::ForwardBatch batch;
  batch.mode = attention::ForwardMode::kDecode;
  batch.batch_size = a.batch;
  for (int b = 0; b < a.batch; ++b) {
    const ReqSlot r = *table.alloc();
    std::vector<SlotIndex> slots(static_cast<size_t>(a.kv_len));
    for (int i = 0; i < a.kv_len; ++i)
      slots[static_cast<size_t>(i)] =
          pages[static_cast<size_t>(b * pages_per_seq + i / a.page_size)] * a.page_size +
          i % a.page_size;
    table.write(r, 0, slots);
    batch.req_pool_indices.push_back(r.value());
    batch.seq_lens.push_back(a.kv_len);
    batch.positions.push_back(a.kv_len - 1);
    batch.out_cache_loc.push_back(slots.back());
  }

  attention::BackendRegistry registry;
  backends::register_builtin_backends(registry);
  attention::BackendRequirements req{.page_size = a.page_size,
                                     .head_dim_qk = static_cast<int>(row),
                                     .head_dim_v = kLoraRank,
                                     .q_dtype = a.kv_dtype,
                                     .kv_dtype = a.kv_dtype,
                                     .mla = true,
                                     .dsa = true,
                                     .dsa_indexer = true};
  req.device = plat->device().is_cuda() ? "cuda" : "cpu";
  auto backend = backends::make_backend(
      registry, selection, req, {.platform = plat.get(), .kv_pool = &pool, .req_to_token = &table});
  const attention::AttentionLayer spec{.layer_id = layer,
                                       .num_q_heads = a.q_heads,
                                       .num_kv_heads = 1,
                                       .head_dim_qk = static_cast<int>(row),
                                       .head_dim_v = kLoraRank,
                                       .scaling = 1.f / std::sqrt(192.f),
                                       .is_mla = true};
  const Device dev = plat->device();
  const int64_t B = a.batch;
  auto q = upload(*plat, random_values(static_cast<size_t>(B * a.q_heads * row), a.kv_dtype, rng));
  auto knew = upload(*plat, random_values(static_cast<size_t>(B * row), a.kv_dtype, rng));
  auto out =
      platform::make_buffer(plat->allocator(), static_cast<size_t>(B * a.q_heads * kLoraRank * es));
  auto iq = upload(
      *plat, random_values(static_cast<size_t>(B * a.index_heads * a.index_dim), DType::kF32, rng));
  auto iw = upload(*plat, random_values(static_cast<size_t>(B * a.index_heads), DType::kF32, rng));
  const TensorView q_v(q.get(), a.kv_dtype, {B, a.q_heads, row}, dev);
  const TensorView k_v(knew.get(), a.kv_dtype, {B, 1, row}, dev);
  const TensorView o_v(out.get(), a.kv_dtype, {B, a.q_heads, kLoraRank}, dev);
  const attention::IndexerQuery query{.q = static_cast<const float*>(iq.get()),
                                      .w = static_cast<const float*>(iw.get()),
                                      .heads = a.index_heads,
                                      .dim = a.index_dim,
                                      .device = dev};
  std::vector<int32_t> topk(static_cast<size_t>(B * a.topk));

  using Clock = std::chrono::steady_clock;
  auto since_ms = [](Clock::time_point t0) { return seconds_since(t0) * 1e3; };
  auto dense_ms = [&] {
    backend->init_forward_metadata(batch);
    plat->synchronize_stream();
    const auto t0 = Clock::now();
    backend->forward(q_v, k_v, TensorView(), spec, batch, o_v, attention::SaveKv::kNo);
    plat->synchronize_stream();
    return since_ms(t0);
  };
  struct DsaSample {
    double first = 0, indexer = 0, attention = 0, layer = 0;
  };
  // One step: its first layer pays the step's sparse plan; then the same layer twice more,
  // once with a synchronisation between the indexer and the attention (the breakdown) and once
  // without (the layer as the model runs it).
  auto dsa_ms = [&] {
    backend->init_forward_metadata(batch);
    plat->synchronize_stream();
    DsaSample s;
    auto t0 = Clock::now();
    backend->apply_index_topk(layer, query, a.topk);
    backend->forward(q_v, k_v, TensorView(), spec, batch, o_v, attention::SaveKv::kNo);
    plat->synchronize_stream();
    s.first = since_ms(t0);
    t0 = Clock::now();
    backend->apply_index_topk(layer, query, a.topk);
    plat->synchronize_stream();
    s.indexer = since_ms(t0);
    t0 = Clock::now();
    backend->forward(q_v, k_v, TensorView(), spec, batch, o_v, attention::SaveKv::kNo);
    plat->synchronize_stream();
    s.attention = since_ms(t0);
    t0 = Clock::now();
    backend->apply_index_topk(layer, query, a.topk);
    backend->forward(q_v, k_v, TensorView(), spec, batch, o_v, attention::SaveKv::kNo);
    plat->synchronize_stream();
    s.layer = since_ms(t0);
    return s;
  };
  for (int w = 0; w < a.warmup; ++w) {
    dense_ms();
    dsa_ms();
  }
  std::vector<double> dense, first, indexer, attn, step;
  for (int it = 0; it < a.iters; ++it) {
    dense.push_back(dense_ms());
    const DsaSample s = dsa_ms();
    first.push_back(s.first);
    indexer.push_back(s.indexer);
    attn.push_back(s.attention);
    step.push_back(s.layer);
  }
  // Every row selected min(topk, kv_len) real positions (rows see kv_len > topk tokens).
  backend->init_forward_metadata(batch);
  backend->select_index_topk(layer, query, a.topk, topk, {});
  const int64_t selected =
      std::count_if(topk.begin(), topk.end(), [](int32_t p) { return p >= 0; });
  PAGODA_REQUIRE(selected == std::min<int64_t>(a.topk, a.kv_len) * B, kInternal,
                 "kernels --op dsa-decode: the indexer selected {} positions, expected {}",
                 selected, std::min<int64_t>(a.topk, a.kv_len) * B);

  const double row_bytes = static_cast<double>(row * es);
  const double dense_bytes = static_cast<double>(B) * a.kv_len * row_bytes;
  const double index_bytes = static_cast<double>(B) * a.kv_len * (a.index_dim + 4);
  const double sparse_bytes = static_cast<double>(B) * std::min(a.topk, a.kv_len) * row_bytes;
  const double index_flops = 2.0 * B * a.kv_len * a.index_heads * a.index_dim;
  auto clock = dev.is_cuda() ? make_cuda_clock(/*flush=*/false) : make_host_clock(a.threads, false);
  const double copy_gbps = clock->copy_gbps();
  const double m_dense = median(dense), m_index = median(indexer), m_attn = median(attn),
               m_step = median(step);
  nlohmann::json j;
  j["op"] = "dsa-decode";
  j["backend"] = backend->name();
  j["batch"] = a.batch;
  j["kv_len"] = a.kv_len;
  j["q_heads"] = a.q_heads;
  j["page_size"] = a.page_size;
  j["kv_dtype"] = dtype_name(a.kv_dtype);
  j["index_heads"] = a.index_heads;
  j["index_dim"] = a.index_dim;
  j["topk"] = a.topk;
  j["iters"] = a.iters;
  j["timer"] = "steady_clock_synchronized";
  j["dense_ms"] = m_dense;
  j["dsa_ms"] = m_step;
  j["indexer_ms"] = m_index;
  j["sparse_attention_ms"] = m_attn;
  j["first_layer_ms"] = median(first);
  j["dsa_over_dense"] = m_step / m_dense;
  j["indexer_share"] = m_index / (m_index + m_attn);
  j["samples_dense_ms"] = dense;
  j["samples_dsa_ms"] = step;
  j["samples_indexer_ms"] = indexer;
  j["samples_sparse_attention_ms"] = attn;
  j["samples_first_layer_ms"] = first;
  j["dense_gbps"] = dense_bytes / (m_dense * 1e-3) / 1e9;
  j["indexer_gbps"] = index_bytes / (m_index * 1e-3) / 1e9;
  j["indexer_tflops"] = index_flops / (m_index * 1e-3) / 1e12;
  j["sparse_gbps"] = sparse_bytes / (m_attn * 1e-3) / 1e9;
  j["copy_kind"] = clock->copy_name();
  j["copy_gbps"] = copy_gbps;
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf(
      "%s dsa-decode B%d L%d h%d topk %d: dense %.4f ms (%.0f GB/s), DSA layer %.4f ms "
      "(indexer %.4f: %.0f GB/s of index rows, %.2f TFLOP/s; sparse attention %.4f; first layer "
      "of a step %.4f); DSA / dense %.3f; copy %.0f GB/s (%s)\n",
      backend->name().c_str(), a.batch, a.kv_len, a.q_heads, a.topk, m_dense,
      j["dense_gbps"].get<double>(), m_step, m_index, j["indexer_gbps"].get<double>(),
      j["indexer_tflops"].get<double>(), m_attn, median(first), m_step / m_dense, copy_gbps,
      clock->copy_name().c_str());
}

}  // namespace pagoda::cli
