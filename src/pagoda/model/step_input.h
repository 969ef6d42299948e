#pragma once
/// StepInput: one scheduled step as the scheduler describes it (per request: row, cached prefix,
/// the tokens computed now), and build_forward_batch, the one builder of its ForwardBatch
/// (positions, seq_lens, prefix / extend lengths per mode). The engine and the speculative
/// worker describe their steps this way; ModelWorker::run computes them (worker.h).
///
/// The scheduler owns memory: before the step it has allocated out_cache_loc and written every
/// request's ReqToTokenTable row for positions [0, prefix_len + tokens.size()).

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/attention/forward_batch.h"

namespace pagoda::model {

/// One request's part of a step.
struct StepSequence {
  int32_t req_slot = 0;    ///< ReqToTokenTable row (>= 1)
  int32_t prefix_len = 0;  ///< tokens of this request already in the KV cache
  /// Tokens computed this step (>= 1): the extend chunk, or the one token being decoded.
  std::span<const int32_t> tokens;
  /// Whether this request needs next-token logits (false for a non-final prefill chunk).
  bool want_logits = true;
};

struct StepInput {
  /// kExtend (every sequence extends), kDecode (every sequence has 1 token) or kMixed (extends
  /// followed by decodes; a decode sequence is a 1-token extend).
  attention::ForwardMode mode = attention::ForwardMode::kExtend;
  std::vector<StepSequence> seqs;
  /// [Σ tokens] the slots the new tokens' K/V go to, in sequence order.
  std::vector<int32_t> out_cache_loc;
};

/// Builds the ForwardBatch of `in` (positions = prefix_len + i; seq_lens = prefix_len + n;
/// extend lens in extend modes). Throws Error(kInvalidArgument) for an empty sequence, a decode
/// sequence with more than one token, or a wrong out_cache_loc length.
attention::ForwardBatch build_forward_batch(const StepInput& in);

}  // namespace pagoda::model
