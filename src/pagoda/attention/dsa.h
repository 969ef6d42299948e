#pragma once
/// DeepSeek sparse attention (DSA) on the attention side: the indexer metadata a backend builds
/// once per step (SGLang's get_indexer_metadata) and the sparse mask that restricts one forward
/// to the indexer's top-k positions. The indexer itself (projections, scores, top-k) is the
/// model's (model/dsa_indexer.h); its keys live in the KvPool beside the latent rows.
///
/// Supported modes: kDecode (not a draft step), kExtend, kMixed. Speculative modes (verify,
/// draft extend, multi-step draft) are Error(kUnsupported) naming DSA.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/paged_plan.h"

namespace pagoda::kv {
class ReqToTokenTable;
}

namespace pagoda::attention {

/// One step's indexer view of the batch (host memory).
struct IndexerMetadata {
  std::vector<int32_t> row_request;  ///< [num_tokens] request b of query row t
  /// [num_tokens] row t sees positions [0, row_visible[t]) of its request (causal: the row's
  /// own position + 1).
  std::vector<int32_t> row_visible;
  std::vector<int32_t> slot_indptr;  ///< [bs + 1]
  /// Request b's position p lives in pool slot slots[slot_indptr[b] + p] (p < its kv length).
  std::vector<int32_t> slots;
  int32_t max_visible = 0;  ///< max over rows of row_visible (0 for an empty batch)
};

/// Builds the metadata of `batch` from the request table. Error(kUnsupported) for speculative
/// modes, kOutOfRange for lengths beyond the table.
IndexerMetadata build_indexer_metadata(const ForwardBatch& batch,
                                       const kv::ReqToTokenTable& req_to_token);

/// Writes into plan.custom_mask / plan.mask_indptr the BatchAttention custom mask (packed bits,
/// row-major [qo_len, kv_len] per request, little-endian in each byte) under which query row t
/// sees exactly the positions topk[t·k, (t+1)·k) lists (-1 entries are unused). Checks each
/// listed position against the row's visible range (Error(kOutOfRange)) and the sizes
/// (kInvalidArgument); the plan is unchanged on error.
void apply_sparse_mask(PagedPlan& plan, const IndexerMetadata& meta,
                       std::span<const int32_t> topk, int k);

}  // namespace pagoda::attention
