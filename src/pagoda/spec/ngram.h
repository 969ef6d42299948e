#pragma once
/// NgramDrafter: prompt-lookup drafting (no model). The request's own context (prompt + output)
/// is searched for earlier occurrences of its last w tokens (w from max_window down to
/// min_window); the tokens that followed each occurrence (most recent first) are merged into a
/// tree rooted at the last token: at most `topk` children per node, depth <= `steps`, at most
/// `num_draft_tokens` nodes. Nothing found → the root alone (the caller then decodes normally).
/// Stateless: one backward pass over the context (O(context) compares of the last token, plus
/// O(max_window) per occurrence), then a sort of the occurrences. Thread-safe (const).

#include <cstdint>
#include <span>

#include "pagoda/spec/draft_tree.h"

namespace pagoda::spec {

struct NgramConfig {
  int32_t min_window = 1;  ///< shortest suffix matched (>= 1)
  int32_t max_window = 6;  ///< longest suffix matched (>= min_window)
  /// Throws Error(kInvalidArgument) naming the bad field.
  void validate() const;
};

class NgramDrafter {
 public:
  explicit NgramDrafter(const NgramConfig& config = {});
  /// The draft tree for `context` (non-empty; its last token is the root). Requires topk >= 1,
  /// steps >= 1, num_draft_tokens >= 1 (kInvalidArgument naming the field).
  DraftTree propose(std::span<const int32_t> context, int32_t topk, int32_t steps,
                    int32_t num_draft_tokens) const;

 private:
  NgramConfig config_;
};

}  // namespace pagoda::spec
