#include "pagoda/attention/kv_access.h"

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

}  // namespace pagoda::attention
