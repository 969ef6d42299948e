// bench_dsa: one DeepSeek-sparse-attention layer on the cpu backend, the mask path
// (SparseAttentionPath::kMask: the step's plan + a bit per (row, position), every key visited)
// against the gather path (kGather, the cpu backend's: only the selected latent rows).
// Per iteration: set_sparse_topk (the selection's plan) + forward (plan + attention), as the
// engine runs a DSA layer. Absorbed MLA, latent 512 + rope 64, f32 pool and queries (the CPU
// engine's dtypes), page 64, 16 q heads (DeepSeek-V2-Lite's count; V3.2 has 128), k = 2,048
// (V3.2's index_topk), each row's selection random distinct visible positions in random order.
//   decode/<context>:  4 decode rows, contexts <context> - 0..3
//   prefill/<context>: one request, a 128-token chunk ending at <context>
// BM_DsaGatherPlan/<context>: sparse_gather_plan alone (the host plan every backend's
// set_sparse_topk builds, the cuda backend's included) for 16 decode rows at <context>, issue
// 50's DSA decode shape (B16, k 2,048).
// Results: docs/design/dsa.md ("Gather path").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/attention/dsa.h"
#include "pagoda/attention/host_paged_backend.h"
#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"

namespace {

using namespace pagoda;

constexpr int kRank = 512, kRope = 64, kDim = kRank + kRope, kHeads = 16, kTopk = 2048;
constexpr int kPage = 64, kChunk = 128, kDecodeRows = 4;

void run_layer(benchmark::State& state, bool prefill, attention::SparseAttentionPath path) {
  const int context = static_cast<int>(state.range(0));
  const int bs = prefill ? 1 : kDecodeRows;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto platform = platform::make_cpu_platform();
  const int pages_per_req = (context + kPage - 1) / kPage;
  kv::KvPool pool({.layout = kv::KvLayout::kMla, .num_layers = 1,
                   .num_pages = bs * pages_per_req + 1, .page_size = kPage,
                   .dtype = DType::kF32, .kv_lora_rank = kRank, .rope_dim = kRope,
                   .index_head_dim = 128},
                  platform->allocator());
  kv::ReqToTokenTable table(bs + 1, context);
  attention::ForwardBatch f{.mode = prefill ? attention::ForwardMode::kExtend
                                            : attention::ForwardMode::kDecode,
                            .batch_size = bs};
  std::vector<float> rows(static_cast<size_t>(context) * kDim);
  for (int b = 0; b < bs; ++b) {
    const int len = prefill ? context : context - b;
    std::vector<SlotIndex> slots(static_cast<size_t>(len));
    std::iota(slots.begin(), slots.end(), (1 + b * pages_per_req) * kPage);
    for (float& x : rows) x = normal(rng);
    pool.set_kv(LayerId{0}, slots, TensorView(rows.data(), DType::kF32, {len, 1, kDim}),
                TensorView());
    const ReqSlot row = *table.alloc();
    table.write(row, 0, slots);
    f.req_pool_indices.push_back(row.value());
    f.seq_lens.push_back(len);
    const int news = prefill ? kChunk : 1;
    if (prefill) {
      f.extend_prefix_lens.push_back(len - news);
      f.extend_seq_lens.push_back(news);
    }
    for (int p = len - news; p < len; ++p) {
      f.positions.push_back(p);
      f.out_cache_loc.push_back(slots[p]);
    }
  }
  const attention::BackendContext ctx{.platform = platform.get(), .kv_pool = &pool,
                                      .req_to_token = &table};
  std::unique_ptr<attention::AttentionBackend> backend;
  if (path == attention::SparseAttentionPath::kGather) {
    backend = std::make_unique<backends::CpuBackend>(ctx);
  } else {
    backend = std::make_unique<attention::HostPagedBackend>(
        ctx, "cpu-mask", backends::CpuBackend::static_capabilities(),
        backends::make_cpu_batch_attention({}), attention::SparseAttentionPath::kMask);
  }
  backend->init_forward_metadata(f);
  const attention::IndexerMetadata& meta = *backend->get_indexer_metadata();
  const int t = f.num_tokens();
  std::vector<int32_t> topk(static_cast<size_t>(t) * kTopk, -1);
  std::vector<int32_t> all;
  for (int r = 0; r < t; ++r) {
    all.resize(static_cast<size_t>(meta.row_visible[r]));
    std::iota(all.begin(), all.end(), 0);
    const int keep = std::min(kTopk, meta.row_visible[r]);
    for (int j = 0; j < keep; ++j) {  // partial Fisher-Yates: random distinct positions
      std::swap(all[j], all[j + rng() % (all.size() - j)]);
      topk[static_cast<size_t>(r) * kTopk + j] = all[j];
    }
  }
  std::vector<float> q(static_cast<size_t>(t) * kHeads * kDim), out(static_cast<size_t>(t) * kHeads * kRank);
  for (float& x : q) x = normal(rng);
  const attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = kHeads,
                                        .num_kv_heads = 1, .head_dim_qk = kDim,
                                        .head_dim_v = kRank, .scaling = 0.07f, .is_mla = true};
  const TensorView qv(q.data(), DType::kF32, {t, kHeads, kDim});
  const TensorView ov(out.data(), DType::kF32, {t, kHeads, kRank});
  for (auto _ : state) {
    backend->set_sparse_topk(topk, kTopk);
    backend->forward(qv, TensorView(), TensorView(), layer, f, ov, attention::SaveKv::kNo);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows"] = t;
}

void BM_DsaGatherPlan(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0)), bs = 16;
  std::mt19937 rng(11);
  kv::ReqToTokenTable table(bs, context);
  attention::ForwardBatch f{.mode = attention::ForwardMode::kDecode, .batch_size = bs};
  std::vector<SlotIndex> slots(static_cast<size_t>(context));
  for (int b = 0; b < bs; ++b) {
    std::iota(slots.begin(), slots.end(), 64 + b * context);
    const ReqSlot row = *table.alloc();
    table.write(row, 0, slots);
    f.req_pool_indices.push_back(row.value());
    f.seq_lens.push_back(context);
    f.positions.push_back(context - 1);
    f.out_cache_loc.push_back(slots.back());
  }
  const attention::IndexerMetadata meta = attention::build_indexer_metadata(f, table);
  std::vector<int32_t> topk(static_cast<size_t>(bs) * kTopk), all(static_cast<size_t>(context));
  for (int r = 0; r < bs; ++r) {
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < kTopk; ++j) {  // partial Fisher-Yates: random distinct positions
      std::swap(all[j], all[j + rng() % (all.size() - j)]);
      topk[static_cast<size_t>(r) * kTopk + j] = all[j];
    }
  }
  for (auto _ : state) {
    attention::PagedPlan plan = attention::sparse_gather_plan(meta, topk, kTopk);
    benchmark::DoNotOptimize(plan.kv_indices.data());
  }
}

void BM_DsaDecodeMask(benchmark::State& s) { run_layer(s, false, attention::SparseAttentionPath::kMask); }
void BM_DsaDecodeGather(benchmark::State& s) { run_layer(s, false, attention::SparseAttentionPath::kGather); }
void BM_DsaPrefillMask(benchmark::State& s) { run_layer(s, true, attention::SparseAttentionPath::kMask); }
void BM_DsaPrefillGather(benchmark::State& s) { run_layer(s, true, attention::SparseAttentionPath::kGather); }

BENCHMARK(BM_DsaGatherPlan)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_DsaDecodeMask)->Arg(4096)->Arg(8192)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DsaDecodeGather)->Arg(4096)->Arg(8192)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DsaPrefillMask)->Arg(4096)->Arg(8192)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
BENCHMARK(BM_DsaPrefillGather)->Arg(4096)->Arg(8192)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
