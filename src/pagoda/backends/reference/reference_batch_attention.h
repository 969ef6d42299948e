#pragma once
/// The reference (oracle) BatchAttention: plain host loops with fp64 accumulation over the CSR
/// page table, honouring every convention of attention/batch_attention.h. Slow by design; every
/// other implementation is checked against it (tests/conformance).

#include <memory>

#include "pagoda/attention/batch_attention.h"
#include "pagoda/attention/dsa.h"

namespace pagoda::backends {

/// Fault injection for the conformance harness's deliberately broken backends (the mutant
/// family, one fault each; see backends/conformance). The defaults are the correct oracle;
/// production code never changes them.
struct ReferenceFaults {
  int causal_shift = 0;            ///< added to the causal boundary (-1 hides the diagonal)
  bool drop_sinks = false;         ///< ignore RunParams::sinks
  int window_shift = 0;            ///< added to window_left (+1 lets one key too many in)
  bool skip_softcap = false;       ///< ignore RunParams::logit_cap
  bool flip_mask_bit = false;      ///< custom mask: flip the last bit of each request's mask
  bool page_off_by_one = false;    ///< read each request's last page at page id + 1
  /// Keys beyond split_chunk are a second split-KV chunk whose (o, lse) pair is merged with the
  /// first chunk's using natural-log LSEs where base 2 is required (0: no split).
  int bad_split_merge_chunk = 0;
  bool ignore_kv_scale = false;    ///< fp8 dequantisation without k_scale / v_scale
  bool interleaved_gqa = false;    ///< q head h reads kv head h % Hkv instead of h / group
  /// Each (query, head) ignores its visible key of smallest logit (when it sees at least two):
  /// the worst-case single dropped key, used to prove the LSE check's resolution.
  bool drop_weakest_key = false;
  /// Custom mask: the window measured from the query's row index (kv_len - qo_len + i) instead
  /// of its position in the mask (issue 52: a tree node's index is not its position).
  bool window_by_index = false;
  /// The backend's DSA indexer (select_index_topk; not the BatchAttention's arithmetic).
  attention::IndexerFaults indexer;
};

/// Creates the oracle. Host memory only (every view must be on the CPU). Not thread-safe.
std::unique_ptr<attention::BatchAttention> make_reference_batch_attention(
    ReferenceFaults faults = {});

}  // namespace pagoda::backends
