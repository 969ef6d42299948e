#pragma once
/// DeepSeek sparse attention (DSA) on the attention side: the indexer metadata a backend builds
/// once per step (SGLang's get_indexer_metadata), the indexer's scores and top-k over the pool's
/// index keys (AttentionBackend::select_index_topk; index_topk_host on host pools), and the two
/// ways a host backend restricts one forward to the selected positions: a custom mask over the
/// step's plan, or a gather plan over the selected slots only (SparseAttentionPath). The
/// indexer's projections (queries, head weights, keys) are the model's (model/dsa_indexer.h);
/// its keys live in the KvPool beside the latent rows.
///
/// A selection is topk [rows, k] (rows = the step's query tokens): row t attends to exactly the
/// positions topk[t·k, (t+1)·k) lists, in any order, -1 entries unused. Both paths reject a
/// position the row does not see (IndexerMetadata::sees; Error(kOutOfRange), also for entries below
/// -1), a position listed twice in a row (kInvalidArgument) and wrong sizes (kInvalidArgument).
///
/// Supported modes: kDecode (not a draft step), kExtend, kMixed and kTargetVerify (each row sees
/// the committed prefix and its own path of the draft tree). Draft modes (draft extend,
/// multi-step draft) are Error(kUnsupported) naming DSA.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/forward_batch.h"
#include "pagoda/attention/paged_plan.h"
#include "pagoda/core/device.h"
#include "pagoda/core/ids.h"

namespace pagoda::kv {
class KvPool;
class ReqToTokenTable;
}  // namespace pagoda::kv

namespace pagoda::attention {

/// One step's indexer view of the batch (host memory).
struct IndexerMetadata {
  std::vector<int32_t> row_request;  ///< [num_tokens] request b of query row t
  /// [num_tokens] row t sees positions [0, row_visible[t]) of its request (causal: the row's
  /// own position + 1).
  std::vector<int32_t> row_visible;
  std::vector<int32_t> slot_indptr;  ///< [bs + 1] (empty: see build_indexer_metadata)
  /// Request b's position p lives in pool slot slots[slot_indptr[b] + p] (p < its kv length).
  std::vector<int32_t> slots;
  int32_t max_visible = 0;  ///< max over rows of row_visible (0 for an empty batch)
  /// The model's indexer selects even when no row sees more than k positions (rows that see
  /// fewer keep them all: dense MLA up to rounding), so that the step's launches do not depend
  /// on its lengths: a backend sets it for CUDA-graph steps (captured once, replayed at any
  /// context). Otherwise such a step skips the selection and runs dense MLA exactly.
  bool always_select = false;
  /// kTargetVerify only (else empty / 0): the draft tree's nodes sit at positions
  /// [row_tree_begin[t], row_tree_begin[t] + tree_size) of row t's request, and row t sees draft
  /// position row_tree_begin[t] + j only when row_tree_bits[t * tree_size + j] is 1 (j is the
  /// row's own node or an ancestor: SpecInfo::tree_mask).
  int32_t tree_size = 0;
  std::vector<int32_t> row_tree_begin;
  std::vector<uint8_t> row_tree_bits;

  /// Whether row t sees position pos of its request: pos in [0, row_visible[t]) and, in a tree
  /// verify, not a draft node off the row's path.
  bool sees(int64_t t, int32_t pos) const {
    if (pos < 0 || pos >= row_visible[static_cast<size_t>(t)]) return false;
    if (tree_size == 0 || pos < row_tree_begin[static_cast<size_t>(t)]) return true;
    return row_tree_bits[static_cast<size_t>(t * tree_size + pos -
                                             row_tree_begin[static_cast<size_t>(t)])] != 0;
  }
};

/// Builds the metadata of `batch` from the request table. Error(kUnsupported) for draft modes and
/// a ForwardBatch::kv_start, kOutOfRange for lengths beyond the table, kInvalidArgument for a
/// verify tree mask of the wrong size. Without `slots`, slot_indptr and slots stay empty (a
/// backend that reads positions through its own page table: O(rows) instead of O(keys); the
/// host paths need them).
IndexerMetadata build_indexer_metadata(const ForwardBatch& batch,
                                       const kv::ReqToTokenTable& req_to_token, bool slots = true);

/// One layer's indexer queries for the step's rows (f32), as the model computes them:
/// q [rows, heads, dim] with RoPE applied (the indexer rounds each head to the key grid itself:
/// index_topk_host), w [rows, heads] the head weights (already scaled by (heads·dim)^-½). dim must
/// be the pool's index_head_dim. `device` is where q and w live: host memory for every backend; a
/// backend on a GPU also takes them in its device's memory (the CUDA model ops' indexer), the host
/// backends refuse that (check_index_query).
struct IndexerQuery {
  const float* q = nullptr;
  const float* w = nullptr;
  int32_t heads = 0;
  int32_t dim = 0;
  Device device = Device::cpu();
};

/// Faults for the conformance mutants (the reference backend's): none by default.
struct IndexerFaults {
  bool key_page_shift = false;  ///< each key read one page further on (slot + page size)
  bool ignore_scale = false;    ///< the stored fp8 codes used without their scale
  bool drop_best = false;       ///< each row's best position left out of its selection
};

/// The argument checks of every select_index_topk (index_topk_host's, below): kInvalidArgument
/// for a pool without index keys, k or heads < 1, a dim other than the pool's index_head_dim,
/// null q or w, a topk of other than rows x k entries or scores neither empty nor that size,
/// and q.device neither the host nor `accepted` (the backend's device; the host backends pass
/// the CPU, so device queries are refused by name).
void check_index_query(const kv::KvPool& pool, const IndexerMetadata& meta, const IndexerQuery& q,
                       int k, size_t topk_size, size_t scores_size,
                       Device accepted = Device::cpu());

/// The lightning indexer's selection over a host pool's index keys of `layer`: for each query
/// row t and every position p the row sees (meta.sees),
///   score(t, p) = Σ_h w[t, h] · ReLU(q̂[t, h] · key(p)),
/// key(p) the stored key of slot meta.slots[...] dequantised (e4m3 code · its scale) and q̂[t, h]
/// the query head on the same grid (kv::round_to_index_grid: e4m3 codes with a power-of-two
/// scale per head, as DeepSeek-V3.2 quantises its indexer queries; every backend's indexer
/// does this, so a query-key product is a product of two e4m3 codes times two powers of two),
/// products and sums in f64 in the order h, then d; topk[t·k, (t+1)·k) receives the min(k, seen)
/// best positions in (score descending, position ascending) order — ties go to the earlier token —
/// padded with -1, and scores (empty, or the same shape) their scores as f32 (-inf where -1).
/// kInvalidArgument (nothing written) for sizes that disagree with meta, q or k < 1, a dim other
/// than the pool's index_head_dim or a pool without index keys; kUnsupported for a device pool.
/// O(rows · seen · heads · dim).
void index_topk_host(const kv::KvPool& pool, LayerId layer, const IndexerMetadata& meta,
                     const IndexerQuery& q, int k, std::span<int32_t> topk, std::span<float> scores,
                     const IndexerFaults& faults = {});

/// How HostPagedBackend runs a forward after set_sparse_topk.
enum class SparseAttentionPath : uint8_t {
  /// apply_sparse_mask over the step's plan: every key of the request is still visited (O(kv)
  /// per row) and a prefill's mask is qo × kv bits. The reference backend's path: the simplest
  /// statement of the semantics, and an oracle for kGather.
  kMask,
  /// sparse_gather_plan: each query row is a request of its own over exactly its selected
  /// slots (page size 1): O(k) per row in compute and memory. The cpu backend's path.
  kGather,
};

/// Writes into plan.custom_mask / plan.mask_indptr the BatchAttention custom mask (packed bits,
/// row-major [qo_len, kv_len] per request, little-endian in each byte) under which query row t
/// sees exactly the positions topk[t·k, (t+1)·k) lists (-1 entries are unused). Checks each
/// listed position as above; the plan is unchanged on error.
void apply_sparse_mask(PagedPlan& plan, const IndexerMetadata& meta,
                       std::span<const int32_t> topk, int k);

/// The plan under which query row t attends to exactly its selected positions, without a mask:
/// request t of the plan is row t alone (qo_len 1, so causal masking hides nothing) over the
/// pool slots of its selected positions (meta.slots), in ascending position order, with page
/// size 1 (view the pool token-granular: paged_cache_views(pool, layer, 1)). A row that selects
/// nothing gets no keys (out 0, lse -inf). The output rows keep the step's token order. Checks
/// as above. O(k log k) per row (the sort), never O(kv).
PagedPlan sparse_gather_plan(const IndexerMetadata& meta, std::span<const int32_t> topk, int k);

/// Positions row t sees (meta.sees over [0, row_visible[t])): what an indexer keeps of it is
/// min(k, this).
int32_t row_seen(const IndexerMetadata& meta, int64_t t);

/// The plan sparse_gather_plan returns for every selection an indexer makes (row t keeps
/// min(k, row_seen(t)) positions), with each kv_indices entry 0: a backend that selects on its
/// device writes row t's selected slots into kv_indices[kv_indptr[t], kv_indptr[t + 1]) there
/// (in any order: the row's attention does not depend on it), so one such plan serves every
/// layer of the step. kInvalidArgument for k < 1 or rows x k past int32. O(rows) (O(visible)
/// per row of a tree verify).
PagedPlan sparse_gather_shape(const IndexerMetadata& meta, int k);

}  // namespace pagoda::attention
