#pragma once
/// TreeBuilder: SGLang's EAGLE draft-tree construction (sglang_spec §6), model-free. A drafter
/// model runs `steps` forwards; forward s computes the current beam tree (beam_tree()) and hands
/// the top-`topk` children of each frontier node to expand():
///
///   step 0:  the root's topk children are the candidates and the beam;
///   step s:  each of the topk beam nodes proposes topk children (cumulative score = parent score
///            + log-prob), topk² candidates; the best topk (score, then index) become the beam.
///
/// finish(D) keeps the best D − 1 of all topk + (steps − 1)·topk² candidates (a child never
/// scores above its parent, so every kept node's parent is kept) in candidate order, which makes
/// parents come first. Node i of the result is computed at committed_len + depth(i).
/// Not thread-safe; a value per request and round.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/spec/draft_tree.h"

namespace pagoda::spec {

/// One proposed child: its token and log-probability under the drafter (<= 0, may be -inf).
struct Candidate {
  int32_t token = 0;
  float logprob = 0.f;
};

/// Appends the `k` best tokens of one logits row (higher logit first; ties: lower id) with their
/// log-probabilities (log-softmax, computed in double, clamped to <= 0) to `out`. One pass for
/// the top k (k small: insertion into a sorted array) and one for the normaliser; no allocation
/// besides `out`. Requires 1 <= k <= logits.size() (Error(kInvalidArgument) otherwise).
void top_candidates(std::span<const float> logits, int32_t k, std::vector<Candidate>& out);

class TreeBuilder {
 public:
  /// Requires topk >= 1 and steps >= 1 (Error kInvalidArgument naming the field).
  TreeBuilder(int32_t root_token, int32_t topk, int32_t steps);

  /// Root + every beam node so far (what the drafter forwards next); the frontier is its last
  /// frontier_size() nodes.
  const DraftTree& beam_tree() const { return beam_; }
  int32_t frontier_size() const { return step_ == 0 ? 1 : topk_; }
  /// Expansions done so far (0..steps).
  int32_t step() const { return step_; }
  bool done() const { return step_ == steps_; }
  /// Adds the children of the frontier: children[f * topk + t] is the t-th child of frontier node
  /// f (frontier_size() * topk entries). Throws kInvalidArgument for a wrong count, a log-prob
  /// above 0 or NaN, or when done().
  void expand(std::span<const Candidate> children);
  /// The verify tree of min(num_draft_tokens, 1 + candidates) nodes. Requires num_draft_tokens >= 1.
  DraftTree finish(int32_t num_draft_tokens) const;

  /// Nodes of the largest beam tree a drafter forwards: 1 + (steps − 1)·topk.
  static int32_t max_beam_nodes(int32_t topk, int32_t steps) { return 1 + (steps - 1) * topk; }

 private:
  struct Cand {
    int32_t token;
    float score;
    int32_t parent;  ///< candidate index, -1 = root
  };
  int32_t topk_, steps_, step_ = 0;
  DraftTree beam_;
  std::vector<Cand> cands_;
  std::vector<int32_t> frontier_cands_;  ///< candidate index of each frontier node (step >= 1)
};

}  // namespace pagoda::spec
