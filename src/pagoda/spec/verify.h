#pragma once
/// Verification of one request's draft tree against the target model (sglang_spec §6).
///
/// The target computed, for every node i, what follows it: its greedy pick target[i] (greedy
/// requests) or its sampling distribution p_i (temperature > 0). Acceptance walks from the root:
///   greedy: the child whose token equals target[x] is accepted (first in node order); else
///           target[x] is the bonus token and the walk stops;
///   sampling (drafts are deterministic, a point mass): the children of x are tried in node
///           order; child c is accepted with probability r(c) / Σ r, where r starts as p_x and a
///           rejected token's mass is set to 0; when every child is rejected the bonus token is
///           drawn from r / Σ r. Each emitted token is therefore distributed exactly as p_x
///           (SpecInfer's multi-candidate rule), so the output distribution is the target's.
/// Pure functions; thread-safe.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "pagoda/spec/draft_tree.h"

namespace pagoda::spec {

struct AcceptResult {
  /// Accepted draft nodes (root excluded) in path order; node nodes[j] sits at depth j + 1.
  std::vector<int32_t> nodes;
  /// The new tokens: the tokens of `nodes`, then the bonus token (size nodes.size() + 1).
  std::vector<int32_t> tokens;
};

/// target[i] = the target's greedy token after node i ([tree.size()]).
AcceptResult greedy_accept(const DraftTree& tree, std::span<const int32_t> target);

/// probs(i) = the target's sampling distribution after node i ([vocab], >= 0, any positive
/// total); uniform() = a fresh uniform draw in [0, 1) per call. Throws kInvalidArgument for a
/// distribution without mass or a node token outside it.
AcceptResult sample_accept(const DraftTree& tree,
                           const std::function<std::span<const double>(int32_t)>& probs,
                           const std::function<double()>& uniform);

/// Acceptance counters of a run (cumulative).
struct AcceptStats {
  int64_t rounds = 0;          ///< verify steps
  int64_t verified = 0;        ///< requests verified (Σ batch sizes)
  int64_t draft_tokens = 0;    ///< draft nodes verified (root excluded)
  int64_t accepted = 0;        ///< draft nodes accepted
  int64_t emitted = 0;         ///< tokens emitted by verify (accepted + bonus, after truncation)
  /// Field-wise difference (the counts of a window between two snapshots).
  AcceptStats& operator-=(const AcceptStats& o) {
    rounds -= o.rounds;
    verified -= o.verified;
    draft_tokens -= o.draft_tokens;
    accepted -= o.accepted;
    emitted -= o.emitted;
    return *this;
  }
  /// Mean new tokens per request per verify (SGLang's accept length; 1 = nothing accepted).
  double mean_accept_length() const {
    return verified == 0 ? 0.0 : static_cast<double>(emitted) / static_cast<double>(verified);
  }
};

}  // namespace pagoda::spec
