// bench_swa_plan: the window layers' per-step planning on the cpu backend, a decode step of B
// requests at a 32k-token context with a 512-token window (Gemma-3-1B's local layers: 4 query
// heads, 1 KV head, head dim 256, window_left 511; f32 pool), planned from position 0 (the full
// walk: every position, page 0 below the window, as kv::SwaTable leaves the rows) against from
// each request's window's first page (ForwardBatch::kv_start, what the worker's window batch sets).
//   Plan/<walk>/<B>/<page>: build_paged_plan + CpuBatchAttention::plan (HostPagedBackend's
//                           init_forward_metadata and its first window layer's plan)
//   Step/<walk>/<B>/<page>: init_forward_metadata + one window layer's forward (the plan once
//                           per step, the attention once per window layer: 22 of 26 in Gemma-3-1B)
// walk 0 = full, 1 = window. Results: docs/design/kv.md §SWA ("Window plan").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "pagoda/attention/paged_plan.h"
#include "pagoda/backends/cpu/cpu_backend.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/platform/platform.h"

namespace {

using namespace pagoda;

constexpr int kContext = 32768, kWindowLeft = 511, kHq = 4, kHkv = 1, kDim = 256;

/// B decode requests at kContext keys whose rows hold, like the SWA table, an SWA page from the
/// window's first page on and the reserved page 0 below it; the pool has only those pages.
struct Step {
  std::unique_ptr<platform::Platform> platform = platform::make_cpu_platform();
  std::unique_ptr<kv::KvPool> pool;
  std::unique_ptr<kv::ReqToTokenTable> table;
  attention::ForwardBatch batch;

  Step(int bs, int page, bool window) {
    const int lo = (kContext - 1 - kWindowLeft) / page * page;  // first key the plan needs
    const int live = (kContext - lo + page - 1) / page;
    pool = std::make_unique<kv::KvPool>(
        kv::KvPoolConfig{.num_layers = 1, .num_pages = bs * live, .page_size = page,
                         .dtype = DType::kF32, .num_kv_heads = kHkv, .head_dim = kDim},
        platform->allocator());
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> rows(static_cast<size_t>(kContext - lo) * kHkv * kDim);
    table = std::make_unique<kv::ReqToTokenTable>(bs, kContext);
    batch = {.mode = attention::ForwardMode::kDecode, .batch_size = bs};
    for (int b = 0; b < bs; ++b) {
      std::vector<SlotIndex> slots(kContext);
      for (int i = 0; i < kContext; ++i)
        slots[i] = i < lo ? i % page : (1 + b * live + (i - lo) / page) * page + i % page;
      for (float& x : rows) x = normal(rng);
      const TensorView kv(rows.data(), DType::kF32, {kContext - lo, kHkv, kDim});
      pool->set_kv(LayerId{0}, std::span(slots).subspan(lo), kv, kv);
      const ReqSlot row = *table->alloc();
      table->write(row, 0, slots);
      batch.req_pool_indices.push_back(row.value());
      batch.seq_lens.push_back(kContext);
      batch.positions.push_back(kContext - 1);
      batch.out_cache_loc.push_back(slots[kContext - 1]);
      if (window) batch.kv_start.push_back(lo);
    }
  }
};

const attention::AttentionShape kShape{.num_qo_heads = kHq, .num_kv_heads = kHkv,
                                       .head_dim_qk = kDim, .head_dim_v = kDim,
                                       .q_dtype = DType::kF32, .kv_dtype = DType::kF32,
                                       .out_dtype = DType::kF32};

void BM_Plan(benchmark::State& state) {
  const bool window = state.range(0) != 0;
  const int bs = static_cast<int>(state.range(1)), page = static_cast<int>(state.range(2));
  Step s(bs, page, window);
  auto attn = backends::make_cpu_batch_attention({});
  for (auto _ : state) {
    const attention::PagedPlan plan = attention::build_paged_plan(s.batch, *s.table, page);
    attn->plan(plan.input(), kShape);
    benchmark::DoNotOptimize(plan.kv_indices.data());
  }
}

void BM_Step(benchmark::State& state) {
  const bool window = state.range(0) != 0;
  const int bs = static_cast<int>(state.range(1)), page = static_cast<int>(state.range(2));
  Step s(bs, page, window);
  backends::CpuBackend backend({.platform = s.platform.get(), .kv_pool = s.pool.get(),
                                .req_to_token = s.table.get()});
  std::vector<float> q(static_cast<size_t>(bs) * kHq * kDim, 0.5f), out(q.size());
  const attention::AttentionLayer layer{.layer_id = LayerId{0}, .num_q_heads = kHq,
                                        .num_kv_heads = kHkv, .head_dim_qk = kDim,
                                        .head_dim_v = kDim, .scaling = 0.0625f,
                                        .sliding_window = kWindowLeft};
  const TensorView qv(q.data(), DType::kF32, {bs, kHq, kDim});
  const TensorView ov(out.data(), DType::kF32, {bs, kHq, kDim});
  for (auto _ : state) {
    backend.init_forward_metadata(s.batch);
    backend.forward(qv, TensorView(), TensorView(), layer, s.batch, ov, attention::SaveKv::kNo);
    benchmark::DoNotOptimize(out.data());
  }
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"window", "B", "page"});
  for (int page : {1, 16})
    for (int bs : {1, 16})
      for (int window : {0, 1}) b->Args({window, bs, page});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_Plan)->Apply(args);
BENCHMARK(BM_Step)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
