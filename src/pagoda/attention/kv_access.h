#pragma once
/// Helpers every backend shares to touch the KvPool: writing the step's new K/V and viewing a
/// layer's cache in the page size a PagedPlan was built for. Host-side; no kernels here.

#include <cstdint>
#include <span>
#include <string_view>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/layer.h"
#include "pagoda/attention/paged_plan.h"
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

/// Checks gather_kv's outputs for `rows` rows of `layer` (AttentionBackend::gather_kv): k_out
/// [rows, Hkv, Dk] and, MHA pools, v_out [rows, Hkv, Dv] (MLA pools: k_out [rows, 1, rank +
/// rope], v_out empty), each in the pool's dtype, contiguous and on the pool's device. Throws
/// kInvalidArgument whose message starts with `who`.
void check_gather_outputs(const kv::KvPool& pool, LayerId layer, int64_t rows,
                          const TensorView& k_out, const TensorView& v_out, std::string_view who);

/// Copies the rows of `slots` of `layer` (K, and V for MHA pools) into k_out / v_out, checked by
/// check_gather_outputs first. Host pools (the CUDA backend gathers on its device).
void gather_pool_rows(const kv::KvPool& pool, LayerId layer, std::span<const int32_t> slots,
                      const TensorView& k_out, const TensorView& v_out, std::string_view who);

/// forward_ragged's arguments checked and what it runs with (AttentionBackend::forward_ragged)
/// over `plan` (the call's windows): a causal layer that is not MLA, and no sinks or sliding
/// window with windows (kUnsupported); k [rows, Hkv, Dqk] and v [rows, Hkv, Dv] of one dtype
/// (rows: the plan's keys; q, out, lse and the dims are BatchAttention::run's to check); the
/// shape (KV dtype k's) and the layer's run parameters without fp8 scales, with the plan's mask.
/// Throws kInvalidArgument whose message starts with `who`.
struct RaggedRun {
  AttentionShape shape;
  RunParams params;
};
RaggedRun ragged_run(const AttentionLayer& layer, const RaggedPlan& plan, const TensorView& q,
                     const TensorView& k, const TensorView& v, const TensorView& out,
                     std::string_view who);

/// A [n, H, D] tensor as a page-size-1 BatchAttention cache [n, 1, H, D] (same memory and
/// strides). Throws kInvalidArgument for another rank.
TensorView as_token_pages(const TensorView& t);

}  // namespace pagoda::attention
