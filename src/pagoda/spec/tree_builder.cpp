#include "pagoda/spec/tree_builder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pagoda/core/error.h"

namespace pagoda::spec {

TreeBuilder::TreeBuilder(int32_t root_token, int32_t topk, int32_t steps)
    : topk_(topk), steps_(steps), beam_(DraftTree::root_only(root_token)) {
  PAGODA_REQUIRE(topk >= 1, kInvalidArgument, "spec topk must be >= 1 (got {})", topk);
  PAGODA_REQUIRE(steps >= 1, kInvalidArgument, "spec steps must be >= 1 (got {})", steps);
}

void TreeBuilder::expand(std::span<const Candidate> children) {
  PAGODA_REQUIRE(!done(), kInvalidArgument, "tree builder already expanded {} steps", steps_);
  const int32_t nf = frontier_size();
  PAGODA_REQUIRE(static_cast<int64_t>(children.size()) == int64_t{nf} * topk_, kInvalidArgument,
                 "expand got {} children for {} frontier nodes × topk {}", children.size(), nf,
                 topk_);
  for (const Candidate& c : children)
    PAGODA_REQUIRE(!std::isnan(c.logprob) && c.logprob <= 0.f, kInvalidArgument,
                   "child log-prob {} is not <= 0", c.logprob);
  const int32_t first_new = static_cast<int32_t>(cands_.size());
  const int32_t frontier_first = beam_.size() - nf;
  for (int32_t f = 0; f < nf; ++f) {
    const int32_t parent = step_ == 0 ? -1 : frontier_cands_[static_cast<size_t>(f)];
    const float base = parent < 0 ? 0.f : cands_[static_cast<size_t>(parent)].score;
    for (int32_t t = 0; t < topk_; ++t) {
      const Candidate& c = children[static_cast<size_t>(f * topk_ + t)];
      cands_.push_back(Cand{c.token, base + c.logprob, parent});
    }
  }
  // The beam: the best topk new candidates (score descending, then candidate order).
  std::vector<int32_t> order(cands_.size() - static_cast<size_t>(first_new));
  std::iota(order.begin(), order.end(), first_new);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return cands_[static_cast<size_t>(a)].score > cands_[static_cast<size_t>(b)].score;
  });
  order.resize(static_cast<size_t>(topk_));
  std::sort(order.begin(), order.end());
  std::vector<int32_t> next;
  for (int32_t ci : order) {
    const Cand& c = cands_[static_cast<size_t>(ci)];
    int32_t parent_node = 0;
    if (c.parent >= 0) {
      const auto it = std::find(frontier_cands_.begin(), frontier_cands_.end(), c.parent);
      parent_node = frontier_first + static_cast<int32_t>(it - frontier_cands_.begin());
    }
    beam_.add(c.token, parent_node);
    next.push_back(ci);
  }
  frontier_cands_ = std::move(next);
  ++step_;
}

DraftTree TreeBuilder::finish(int32_t num_draft_tokens) const {
  PAGODA_REQUIRE(num_draft_tokens >= 1, kInvalidArgument,
                 "num_draft_tokens must be >= 1 (got {})", num_draft_tokens);
  std::vector<int32_t> order(cands_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return cands_[static_cast<size_t>(a)].score > cands_[static_cast<size_t>(b)].score;
  });
  order.resize(std::min(order.size(), static_cast<size_t>(num_draft_tokens - 1)));
  std::sort(order.begin(), order.end());
  DraftTree tree = DraftTree::root_only(beam_.tokens[0]);
  std::vector<int32_t> node_of(cands_.size(), -1);
  for (int32_t ci : order) {
    const Cand& c = cands_[static_cast<size_t>(ci)];
    const int32_t parent = c.parent < 0 ? 0 : node_of[static_cast<size_t>(c.parent)];
    if (parent < 0) continue;  // parent dropped (only with equal scores): skip the subtree
    node_of[static_cast<size_t>(ci)] = tree.add(c.token, parent);
  }
  return tree;
}

void top_candidates(std::span<const float> logits, int32_t k, std::vector<Candidate>& out) {
  PAGODA_REQUIRE(k >= 1 && static_cast<size_t>(k) <= logits.size(), kInvalidArgument,
                 "top_candidates: k {} outside [1, {}]", k, logits.size());
  const size_t first = out.size();
  out.resize(first + static_cast<size_t>(k), Candidate{-1, 0.f});
  Candidate* best = out.data() + first;  // sorted: logit desc, id asc (token -1 = empty)
  int32_t filled = 0;
  float mx = logits[0];
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    mx = std::max(mx, l);
    // Ids come in ascending order: an equal logit never displaces an earlier (lower) id.
    if (filled == k && !(l > logits[static_cast<size_t>(best[k - 1].token)])) continue;
    int32_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && l > logits[static_cast<size_t>(best[pos - 1].token)]) {
      best[pos] = best[pos - 1];
      --pos;
    }
    best[pos].token = static_cast<int32_t>(i);
  }
  double sum = 0.0;  // f32 exponentials (vectorisable), summed in double
  for (float l : logits) sum += static_cast<double>(std::exp(l - mx));
  const double lse = static_cast<double>(mx) + std::log(sum);
  for (int32_t t = 0; t < k; ++t)
    best[t].logprob = std::min(
        static_cast<float>(static_cast<double>(logits[static_cast<size_t>(best[t].token)]) - lse),
        0.f);
}

}  // namespace pagoda::spec
