#include "pagoda/spec/ngram.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::spec {

void NgramConfig::validate() const {
  PAGODA_REQUIRE(min_window >= 1, kInvalidArgument, "ngram min_window must be >= 1 (got {})",
                 min_window);
  PAGODA_REQUIRE(max_window >= min_window, kInvalidArgument,
                 "ngram max_window {} is below min_window {}", max_window, min_window);
}

NgramDrafter::NgramDrafter(const NgramConfig& config) : config_(config) { config.validate(); }

namespace {

/// Child of `node` with `token`, or -1.
int32_t find_child(const DraftTree& t, int32_t node, int32_t token, int32_t& num_children) {
  num_children = 0;
  int32_t found = -1;
  for (int32_t i = node + 1; i < t.size(); ++i) {
    if (t.parents[static_cast<size_t>(i)] != node) continue;
    ++num_children;
    if (t.tokens[static_cast<size_t>(i)] == token) found = i;
  }
  return found;
}

}  // namespace

DraftTree NgramDrafter::propose(std::span<const int32_t> ctx, int32_t topk, int32_t steps,
                                int32_t num_draft_tokens) const {
  PAGODA_REQUIRE(!ctx.empty(), kInvalidArgument, "ngram context is empty");
  PAGODA_REQUIRE(topk >= 1, kInvalidArgument, "spec topk must be >= 1 (got {})", topk);
  PAGODA_REQUIRE(steps >= 1, kInvalidArgument, "spec steps must be >= 1 (got {})", steps);
  PAGODA_REQUIRE(num_draft_tokens >= 1, kInvalidArgument,
                 "num_draft_tokens must be >= 1 (got {})", num_draft_tokens);
  const int64_t n = static_cast<int64_t>(ctx.size());
  DraftTree tree = DraftTree::root_only(ctx.back());
  for (int32_t w = std::min<int64_t>(config_.max_window, n - 1); w >= config_.min_window; --w) {
    const auto suffix = ctx.subspan(static_cast<size_t>(n - w));
    // Occurrences starting at p < n - w, most recent first; continuation ctx[p + w ...].
    for (int64_t p = n - w - 1; p >= 0; --p) {
      if (tree.size() >= num_draft_tokens) return tree;
      if (!std::equal(suffix.begin(), suffix.end(), ctx.begin() + p)) continue;
      int32_t node = 0;
      for (int64_t k = p + w; k < n && k < p + w + steps; ++k) {
        if (tree.size() >= num_draft_tokens) break;
        int32_t children = 0;
        const int32_t tok = ctx[static_cast<size_t>(k)];
        const int32_t child = find_child(tree, node, tok, children);
        if (child >= 0) {
          node = child;
          continue;
        }
        if (children >= topk) break;
        node = tree.add(tok, node);
      }
    }
  }
  return tree;
}

}  // namespace pagoda::spec
