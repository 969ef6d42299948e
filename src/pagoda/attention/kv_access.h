#pragma once
/// Helpers every backend shares to touch the KvPool: writing the step's new K/V and viewing a
/// layer's cache in the page size a PagedPlan was built for. Host-side; no kernels here.

#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/layer.h"
#include "pagoda/core/tensor_view.h"

namespace pagoda::kv {
class KvPool;
}

namespace pagoda::attention {

/// Writes the new tokens' K/V of `layer` into `pool` at batch.out_cache_loc (KvPool::set_kv:
/// stored = convert(x / scale)). k is [num_tokens, Hkv, Dqk], v [num_tokens, Hkv, Dv]; for MLA k
/// is the latent row [num_tokens, 1, rank + rope] and v must be empty. Throws kInvalidArgument
/// (pool unchanged) when layer.k_scale / v_scale differ from the pool's scales for the layer, or
/// anything set_kv rejects. Mutates the pool.
void save_new_kv(kv::KvPool& pool, const AttentionLayer& layer, const ForwardBatch& batch,
                 const TensorView& k, const TensorView& v);

/// K and V of one layer as BatchAttention caches.
struct PagedCacheViews {
  TensorView k;  ///< [num_pages, page_size, Hkv, Dqk]
  TensorView v;  ///< [num_pages, page_size, Hkv, Dv] (MLA: strided view into the latent rows)
};

/// The pool's views of `layer` in `plan_page_size` granularity: the pool's page size, or 1 (a
/// token-granular view [num_slots, 1, Hkv, D] of the same memory) when the plan fell back.
/// Throws kInvalidArgument when plan_page_size is neither. Does not mutate.
PagedCacheViews paged_cache_views(const kv::KvPool& pool, const AttentionLayer& layer,
                                  int plan_page_size);

}  // namespace pagoda::attention
