#pragma once
/// ForwardBatch: the attention-relevant description of one engine step (sglang_spec §2.2).
/// Built by the model runner (or a test) on the host once per step; backends read it in
/// init_forward_metadata (plan) and in forward (run). All arrays are host memory, int32, and in
/// batch order. Backends that run on a device upload what they need while planning.
///
/// Per-mode meaning of the lengths (b = request index, bs = batch_size):
///   kDecode:       seq_lens[b] includes the token being decoded; one query token per request;
///                  extend_* are empty; num_tokens = bs (bs * topk in a multi-step draft step).
///   kExtend/kMixed/kDraftExtend: seq_lens[b] = extend_prefix_lens[b] + extend_seq_lens[b];
///                  request b's query tokens are rows [Σ_{j<b} ext_j, Σ_{j≤b} ext_j) of q.
///                  A decode request inside kMixed has extend_seq_lens[b] = 1. kDraftExtend:
///                  extend_seq_lens[b] is request b's accepted count, 1..spec.num_steps + 1
///                  (checked when spec.num_steps > 0), attended causally after its prefix.
///   kTargetVerify: seq_lens[b] is the committed length WITHOUT the draft tokens;
///                  extend_seq_lens[b] = spec.num_draft_tokens, extend_prefix_lens[b] = seq_lens[b];
///                  the kv range of request b is seq_lens[b] + num_draft_tokens, masked by
///                  spec.tree_mask.
///   kIdle:         batch_size 0.
/// req_to_token row req_pool_indices[b] holds the slots of positions [0, kv_len) of request b
/// (after out_cache_loc has been written into it for this step's new tokens).
///
/// kv_start (empty = all 0) leaves a request's first keys out of the plan (SGLang's sliding-window
/// kv_start_idx): request b's keys are positions [kv_start[b], kv_len) only, and its row is read
/// from there. Every mask is relative to a row's last key (bottom-right causal, the sliding
/// window), so dropping keys changes nothing as long as none of them is visible to any of the
/// request's queries: the caller must keep kv_start[b] <= (first query position) - window_left
/// (or 0) for every window the step's layers use, and a multiple of the pool's page size
/// (build_paged_plan checks kv_start[b] <= first query position and the page multiple). The
/// window layers' batch (model/llama_worker.h, window_batch) sets it so that their plan is
/// O(window) instead of O(kv_len); not with a tree mask (kTargetVerify) or DSA index keys.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/forward_mode.h"

namespace pagoda::attention {

/// Speculative-decoding inputs (sglang_spec §6). Absent fields mean "not a speculative step".
struct SpecInfo {
  int topk = 1;              ///< EAGLE top-k branching (K)
  int num_steps = 0;         ///< draft steps (S)
  int num_draft_tokens = 0;  ///< verify tree size D, including the root/bonus token
  /// kTargetVerify: SGLang FULL_MASK layout. For request b, D rows × (seq_lens[b] + D) columns of
  /// 0/1 bytes, row-major, requests concatenated: block b starts at Σ_{j<b} D * (seq_lens[j] + D).
  /// Prefix columns are all 1; draft column j of row i is 1 when j == i or j is an ancestor of i.
  std::vector<uint8_t> tree_mask;
  /// Multi-step draft (mode kDecode): the 0-based step; -1 when this is not a draft step.
  /// At step i every request b expands into topk rows (row b * topk + t), each with one query
  /// token, whose kv is req_to_token[req b, 0:seq_lens[b]] ++ draft_slots[b][t][0:i+1].
  int draft_step = -1;
  /// [bs][topk][num_steps] slots holding the draft tokens' KV, flattened. Any slots: the planner
  /// falls back to token-granular (page size 1) indexing when a branch is not page-contiguous.
  std::vector<int32_t> draft_slots;
};

/// The keys of each request that one ragged call covers (AttentionBackend::gather_kv /
/// forward_ragged): request b's positions [begin[b], end[b]). Both spans empty: every key the
/// request sees, [0, seq_lens[b]). Otherwise both have batch_size entries, 0 <= begin <= end <=
/// seq_lens[b], and the call's non-empty windows either all end at seq_lens[b] (a causal call:
/// each query sees the window's keys up to its own position) or all end at or before
/// extend_prefix_lens[b] (every query sees every key). A long prefix is attended in such
/// windows and their states merged by LSE (SGLang's chunked prefix cache for MLA).
struct KeyWindows {
  std::span<const int32_t> begin, end;
  bool all() const { return begin.empty() && end.empty(); }
};

struct ForwardBatch {
  ForwardMode mode = ForwardMode::kIdle;
  int batch_size = 0;                      ///< number of requests (bs)
  std::vector<int32_t> req_pool_indices;   ///< [bs] rows of the ReqToTokenTable (0 = padding)
  std::vector<int32_t> seq_lens;           ///< [bs] see the per-mode table above
  std::vector<int32_t> extend_prefix_lens; ///< [bs] extend modes only
  std::vector<int32_t> extend_seq_lens;    ///< [bs] extend modes only
  std::vector<int32_t> positions;          ///< [num_tokens] position of each query token
  std::vector<int32_t> out_cache_loc;      ///< [num_tokens] slot each new token's K/V is written to
  std::vector<int32_t> kv_start;           ///< [bs] or empty: first key position per request (above)
  SpecInfo spec;

  /// Number of query tokens in this step (rows of q).
  int num_tokens() const { return static_cast<int>(out_cache_loc.size()); }
  /// Σ seq_lens (host), as sglang's seq_lens_sum.
  int64_t seq_lens_sum() const {
    int64_t s = 0;
    for (int32_t v : seq_lens) s += v;
    return s;
  }
  bool is_draft_step() const { return spec.draft_step >= 0; }
};

}  // namespace pagoda::attention
