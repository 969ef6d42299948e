#include "pagoda/attention/kv_access.h"

#include <cstring>

#include "pagoda/core/error.h"
#include "pagoda/kv/kv_pool.h"

namespace pagoda::attention {

void save_new_kv(kv::KvPool& pool, const AttentionLayer& layer, const ForwardBatch& batch,
                 const TensorView& k, const TensorView& v) {
  PAGODA_REQUIRE(pool.k_scale(layer.layer_id) == layer.k_scale &&
                     pool.v_scale(layer.layer_id) == layer.v_scale,
                 kInvalidArgument,
                 "layer {}: k/v scales {}/{} differ from the pool's {}/{} for that layer",
                 layer.layer_id, layer.k_scale, layer.v_scale, pool.k_scale(layer.layer_id),
                 pool.v_scale(layer.layer_id));
  PAGODA_REQUIRE(k.rank() >= 1 && k.size(0) == batch.num_tokens(), kInvalidArgument,
                 "new K {} does not have one row per query token ({})", k.describe(),
                 batch.num_tokens());
  pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v);
}

namespace {

TensorView token_granular(const TensorView& t) {
  // [pages, P, H, D] with stride(0) == P * stride(1)  ->  [pages * P, 1, H, D]
  PAGODA_REQUIRE(t.rank() == 4 && t.stride(0) == t.size(1) * t.stride(1), kInvalidArgument,
                 "cache view {} cannot be re-viewed token-granular", t.describe());
  return TensorView(t.data(), t.dtype(), {t.size(0) * t.size(1), 1, t.size(2), t.size(3)},
                    {t.stride(1), t.stride(1), t.stride(2), t.stride(3)}, t.device());
}

}  // namespace

PagedCacheViews paged_cache_views(const kv::KvPool& pool, const AttentionLayer& layer,
                                  int plan_page_size) {
  PAGODA_REQUIRE(plan_page_size == pool.page_size() || plan_page_size == 1, kInvalidArgument,
                 "plan page size {} is neither the pool's ({}) nor 1", plan_page_size,
                 pool.page_size());
  PagedCacheViews views{pool.k_view(layer.layer_id), pool.v_view(layer.layer_id)};
  if (plan_page_size != pool.page_size()) {
    views.k = token_granular(views.k);
    views.v = token_granular(views.v);
  }
  return views;
}

void check_gather_outputs(const kv::KvPool& pool, LayerId layer, int64_t rows,
                          const TensorView& k_out, const TensorView& v_out, std::string_view who) {
  const TensorView kc = pool.k_view(layer);
  const bool mla = pool.config().layout == kv::KvLayout::kMla;
  auto check = [&](const TensorView& t, const TensorView& cache, const char* what) {
    PAGODA_REQUIRE(t.rank() == 3 && t.size(0) == rows && t.size(1) == cache.size(2) &&
                       t.size(2) == cache.size(3) && t.dtype() == cache.dtype() &&
                       t.device() == pool.device() && (t.numel() == 0 || t.is_contiguous()) &&
                       (t.numel() == 0 || t.data() != nullptr),
                   kInvalidArgument,
                   "{}: gathered {} {} must be a contiguous [{}, {}, {}] {} tensor on {}", who,
                   what, t.describe(), rows, cache.size(2), cache.size(3), cache.dtype(),
                   pool.device().to_string());
  };
  check(k_out, kc, mla ? "latent rows" : "K");
  if (mla) {
    PAGODA_REQUIRE(v_out.rank() == 0 || v_out.numel() == 0, kInvalidArgument,
                   "{}: an MLA pool gathers its latent rows into k_out only (v_out {} must be "
                   "empty)",
                   who, v_out.describe());
  } else {
    check(v_out, pool.v_view(layer), "V");
  }
}

void gather_pool_rows(const kv::KvPool& pool, LayerId layer, std::span<const int32_t> slots,
                      const TensorView& k_out, const TensorView& v_out, std::string_view who) {
  const auto n = static_cast<int64_t>(slots.size());
  check_gather_outputs(pool, layer, n, k_out, v_out, who);
  PAGODA_REQUIRE(pool.device().is_cpu(), kUnsupported, "{}: gather_pool_rows reads host pools",
                 who);
  auto copy = [&](const TensorView& cache, int64_t row_elems, const TensorView& out) {
    const size_t row = static_cast<size_t>(row_elems) * dtype_size(cache.dtype());
    const auto* src = static_cast<const unsigned char*>(cache.data());
    auto* dst = static_cast<unsigned char*>(out.data());
    for (int64_t i = 0; i < n; ++i) {
      const int32_t s = slots[static_cast<size_t>(i)];
      PAGODA_REQUIRE(s >= 0 && s < pool.num_slots(), kOutOfRange,
                     "{}: slot {} outside the pool's {} slots", who, s, pool.num_slots());
      std::memcpy(dst + static_cast<size_t>(i) * row, src + static_cast<size_t>(s) * row, row);
    }
  };
  copy(pool.k_view(layer), pool.k_row_elems(), k_out);
  if (pool.config().layout != kv::KvLayout::kMla)
    copy(pool.v_view(layer), pool.v_row_elems(), v_out);
}

RaggedRun ragged_run(const AttentionLayer& layer, const RaggedPlan& plan, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& out,
                     std::string_view who) {
  const auto rows = static_cast<int64_t>(plan.slots.size());
  PAGODA_REQUIRE(!layer.is_mla, kInvalidArgument,
                 "{}: forward_ragged takes per-head K/V (layer {} is MLA)", who, layer.layer_id);
  PAGODA_REQUIRE(layer.mask == MaskKind::kCausal, kInvalidArgument,
                 "{}: forward_ragged of a non-causal layer {} (the windows decide what a query "
                 "sees)",
                 who, layer.layer_id);
  PAGODA_REQUIRE(plan.begin.empty() || (layer.sinks.empty() && layer.sliding_window < 0),
                 kUnsupported,
                 "{}: forward_ragged over key windows with attention sinks or a sliding window "
                 "(layer {}): their states would not merge by LSE",
                 who, layer.layer_id);
  PAGODA_REQUIRE(k.rank() == 3 && v.rank() == 3 && k.size(0) == rows && v.size(0) == rows &&
                     k.dtype() == v.dtype(),
                 kInvalidArgument, "{}: ragged K {} / V {} must be [{}, H, D] of one dtype", who,
                 k.describe(), v.describe(), rows);
  RaggedRun r{.shape = {.num_qo_heads = layer.num_q_heads,
                        .num_kv_heads = layer.num_kv_heads,
                        .head_dim_qk = layer.head_dim_qk,
                        .head_dim_v = layer.head_dim_v,
                        .q_dtype = q.dtype(),
                        .kv_dtype = k.dtype(),
                        .out_dtype = out.dtype()},
              .params = run_params_for(layer)};
  r.params.k_scale = r.params.v_scale = 1.f;
  r.params.mask = plan.mask;
  return r;
}

TensorView as_token_pages(const TensorView& t) {
  PAGODA_REQUIRE(t.rank() == 3, kInvalidArgument, "{} is not [n, H, D]", t.describe());
  return TensorView(t.data(), t.dtype(), {t.size(0), 1, t.size(1), t.size(2)},
                    {t.stride(0), t.stride(0), t.stride(1), t.stride(2)}, t.device());
}

}  // namespace pagoda::attention
