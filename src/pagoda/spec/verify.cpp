#include "pagoda/spec/verify.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::spec {

AcceptResult greedy_accept(const DraftTree& tree, std::span<const int32_t> target) {
  tree.validate();
  PAGODA_REQUIRE(static_cast<int64_t>(target.size()) == tree.size(), kInvalidArgument,
                 "{} target tokens for a tree of {} nodes", target.size(), tree.size());
  const RetrieveIndices r = retrieve_indices(tree);
  AcceptResult out;
  int32_t x = 0;
  for (;;) {
    const int32_t want = target[static_cast<size_t>(x)];
    int32_t c = r.first_child[static_cast<size_t>(x)];
    while (c >= 0 && tree.tokens[static_cast<size_t>(c)] != want)
      c = r.next_sibling[static_cast<size_t>(c)];
    out.tokens.push_back(want);
    if (c < 0) return out;
    out.nodes.push_back(c);
    x = c;
  }
}

AcceptResult sample_accept(const DraftTree& tree,
                           const std::function<std::span<const double>(int32_t)>& probs,
                           const std::function<double()>& uniform) {
  tree.validate();
  const RetrieveIndices r = retrieve_indices(tree);
  AcceptResult out;
  std::vector<double> residual;
  int32_t x = 0;
  for (;;) {
    const std::span<const double> p = probs(x);
    residual.assign(p.begin(), p.end());
    double mass = 0.0;
    for (double v : residual) mass += v;
    PAGODA_REQUIRE(mass > 0.0, kInvalidArgument, "target distribution of node {} has no mass",
                   x);
    int32_t accepted = -1;
    for (int32_t c = r.first_child[static_cast<size_t>(x)]; c >= 0;
         c = r.next_sibling[static_cast<size_t>(c)]) {
      const int32_t tok = tree.tokens[static_cast<size_t>(c)];
      PAGODA_REQUIRE(tok >= 0 && static_cast<size_t>(tok) < residual.size(), kInvalidArgument,
                     "draft token {} outside the vocabulary of {}", tok, residual.size());
      const double q = residual[static_cast<size_t>(tok)];
      if (q > 0.0 && uniform() * mass < q) {
        accepted = c;
        break;
      }
      residual[static_cast<size_t>(tok)] = 0.0;
      mass = 0.0;  // recomputed: subtraction would drift
      for (double v : residual) mass += v;
      if (mass <= 0.0) break;
    }
    if (accepted >= 0) {
      out.nodes.push_back(accepted);
      out.tokens.push_back(tree.tokens[static_cast<size_t>(accepted)]);
      x = accepted;
      continue;
    }
    // Bonus: inverse CDF over the residual (the original when no child was tried).
    int32_t pick = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
    if (mass > 0.0) {
      const double u = uniform() * mass;
      double cum = 0.0;
      for (size_t i = 0; i < residual.size(); ++i) {
        if (residual[i] <= 0.0) continue;
        cum += residual[i];
        pick = static_cast<int32_t>(i);
        if (u < cum) break;
      }
    }
    out.tokens.push_back(pick);
    return out;
  }
}

}  // namespace pagoda::spec
