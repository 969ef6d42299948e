#include "pagoda/spec/ngram.h"

#include <algorithm>
#include <vector>

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
  const int32_t wmax = static_cast<int32_t>(std::min<int64_t>(config_.max_window, n - 1));
  if (wmax < config_.min_window) return tree;
  // Window w matches where ctx[e - w + 1, e] equals the last w tokens (e < n - 1), and the
  // continuation starts at e + 1 whatever w is. So one backward pass finds every earlier end e
  // of the last token with its match length (capped at wmax); windows from long to short, most
  // recent first, is then the order (length desc, e desc). A later window's visit of the same e
  // would walk nodes its first visit made (or stop where it stopped), so each e is visited once.
  struct Hit {
    int32_t len;
    int64_t end;
  };
  std::vector<Hit> hits;
  const int32_t last = ctx[static_cast<size_t>(n - 1)];
  for (int64_t e = n - 2; e >= 0; --e) {
    if (ctx[static_cast<size_t>(e)] != last) continue;
    int32_t len = 1;
    while (len < wmax && e - len >= 0 &&
           ctx[static_cast<size_t>(e - len)] == ctx[static_cast<size_t>(n - 1 - len)]) {
      ++len;
    }
    if (len >= config_.min_window) hits.push_back({len, e});
  }
  std::stable_sort(hits.begin(), hits.end(),
                   [](const Hit& x, const Hit& y) { return x.len > y.len; });
  for (const Hit& h : hits) {
    if (tree.size() >= num_draft_tokens) return tree;
    int32_t node = 0;
    for (int64_t k = h.end + 1; k < n && k <= h.end + steps; ++k) {
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
  return tree;
}

}  // namespace pagoda::spec
