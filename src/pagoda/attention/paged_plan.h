#pragma once
/// Building the CSR page table of a step from a ForwardBatch and the ReqToTokenTable (host).
/// Every backend's init_forward_metadata starts here, so all of them interpret the batch the same
/// way. The result owns its arrays; `input()` views them as a PagedPlanInput.

#include <cstdint>
#include <vector>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/attention/forward_batch.h"

namespace pagoda::kv {
class ReqToTokenTable;
}

namespace pagoda::attention {

struct PagedPlan {
  std::vector<int32_t> qo_indptr;
  std::vector<int32_t> kv_indptr;
  std::vector<int32_t> kv_indices;
  std::vector<int32_t> kv_last_page_len;
  std::vector<uint8_t> custom_mask;  ///< packed (kTargetVerify)
  std::vector<int64_t> mask_indptr;
  /// The page size the indices are in: the pool's, or 1 when some row is not page-contiguous
  /// (e.g. a multi-step draft branch); the caller then views the pool as [num_slots, 1, H, D].
  int page_size = 1;

  /// A view of the owned arrays (valid while this plan lives and is not modified).
  PagedPlanInput input() const;
  /// An owning copy of `in`: what a BatchAttention keeps from plan().
  static PagedPlan copy_of(const PagedPlanInput& in);
  /// Number of requests (qo_indptr.size() - 1).
  int batch_size() const { return static_cast<int>(qo_indptr.size()) - 1; }
  /// Keys of request b: (pages - 1) * page_size + kv_last_page_len[b], 0 without pages.
  int64_t kv_len(int b) const {
    const int64_t pages = kv_indptr[b + 1] - kv_indptr[b];
    return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[b];
  }
};

/// Builds the plan for `batch` (decode, extend, mixed, verify with tree mask, draft steps).
/// Validates lengths against the table (Error(kOutOfRange) for rows or lengths beyond it) and
/// checks that page-granular rows really are page-contiguous. A request's keys start at its
/// ForwardBatch::kv_start (checked there; Error(kUnsupported) with a tree mask), so its cost is
/// O(keys from kv_start) per request: O(window) for the window layers' batch.
PagedPlan build_paged_plan(const ForwardBatch& batch, const kv::ReqToTokenTable& req_to_token,
                           int pool_page_size);

/// The ragged form of an extend step (AttentionBackend::gather_kv / forward_ragged).
struct RaggedPlan {
  /// Request b's extend_seq_lens[b] query rows over the keys of its window (every key: its
  /// seq_lens[b]), at page size 1: rows [o_b, o_b + keys_b) of one key buffer (o_b = Σ_{j<b}
  /// keys_j; kv_indices 0, 1, ..., n - 1).
  PagedPlan plan;
  /// The pool slot of each of those n rows: request b's window positions from its table row.
  std::vector<int32_t> slots;
  /// How the queries see the keys: kCausal (every key, or windows ending at each request's last
  /// key: bottom-right causal over the window) or kNonCausal (windows inside the prefixes).
  MaskKind mask = MaskKind::kCausal;
  /// The windows the plan was built for (both empty: every key).
  std::vector<int32_t> begin, end;
  /// Whether this plan was built for `windows`.
  bool covers(const KeyWindows& windows) const;
};

/// The ragged plans of one step, one per distinct KeyWindows (a backend's gather_kv /
/// forward_ragged): the expanded MLA form asks for the same windows at every layer, so each plan
/// is built once a step. clear() at a new step.
class RaggedPlans {
 public:
  /// The index of the step's plan for `windows`, built now (build_ragged_plan) when it has none;
  /// `built` says which.
  size_t find_or_build(const ForwardBatch& batch, const kv::ReqToTokenTable& req_to_token,
                       const KeyWindows& windows, bool& built);
  const RaggedPlan& operator[](size_t i) const { return plans_[i]; }
  void clear() { plans_.clear(); }

 private:
  std::vector<RaggedPlan> plans_;
};

/// Builds the ragged form of a kExtend / kMixed `batch` over `windows` (forward_batch.h
/// KeyWindows: their rules checked, Error(kInvalidArgument)); Error(kInvalidArgument) for another
/// mode or a non-empty kv_start, with build_paged_plan's checks of the lengths and the table.
/// Reads only the windows' table entries.
RaggedPlan build_ragged_plan(const ForwardBatch& batch, const kv::ReqToTokenTable& req_to_token,
                             const KeyWindows& windows = {});

}  // namespace pagoda::attention
