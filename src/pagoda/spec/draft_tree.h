#pragma once
/// DraftTree: the token tree one request's verify step checks (sglang_spec §6), and what the
/// attention side needs from it: depths (positions), the packed verify mask and SGLang's
/// retrieve arrays. Contract: docs/design/spec.md.
///
/// Node 0 is the root: the request's last committed token, whose K/V is not in the cache yet.
/// Every other node i has parents[i] < i (parents come first), so node order is a topological
/// order and depth(i) <= i. Node i is computed at position committed_len + depth(i).
/// Values, host memory; not thread-safe (no shared state).

#include <cstdint>
#include <span>
#include <vector>

namespace pagoda::spec {

struct DraftTree {
  std::vector<int32_t> tokens;   ///< [n] token id of each node; tokens[0] is the root
  std::vector<int32_t> parents;  ///< [n] parent node; parents[0] == -1

  /// A tree of the root alone.
  static DraftTree root_only(int32_t root_token) { return DraftTree{{root_token}, {-1}}; }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  /// Appends node (token, parent) and returns its index. Requires 0 <= parent < size().
  int32_t add(int32_t token, int32_t parent);
  /// Throws Error(kInvalidArgument) naming the field: empty tree, size mismatch, parents[0] != -1
  /// or a parent not before its child.
  void validate() const;
  /// [n] depth of each node (root 0).
  std::vector<int32_t> depths() const;
  /// Node indices of the path root → node, root first (length depth(node) + 1).
  std::vector<int32_t> path_to(int32_t node) const;
};

/// Appends the verify mask of one request to `mask` in SpecInfo::tree_mask's FULL_MASK layout:
/// rows first_row..n−1 × (prefix_len + n) bytes, row-major; prefix columns 1; draft column j of
/// row i is 1 when j == i or j is an ancestor of i. prefix_len = committed tokens with K/V (>= 0).
/// first_row > 0 is the mask of a forward of only nodes first_row..n−1 whose earlier nodes' K/V
/// are already cached right after the prefix (a drafter's frontier). Requires
/// 0 <= first_row < n.
void append_verify_mask(const DraftTree& tree, int32_t prefix_len, std::vector<uint8_t>& mask,
                        int32_t first_row = 0);

/// SGLang's retrieve arrays of a tree (verify walks them on the device): for node i,
/// first_child[i] / next_sibling[i] (-1 when none), children in index order.
struct RetrieveIndices {
  std::vector<int32_t> first_child;   ///< SGLang's retrieve_next_token
  std::vector<int32_t> next_sibling;  ///< SGLang's retrieve_next_sibling
};
RetrieveIndices retrieve_indices(const DraftTree& tree);

/// Pads `tree` with leaves under the root (token = the root's token) to exactly `size` nodes so
/// a batch's trees share one size (SpecInfo::num_draft_tokens). A pad node is a real guess: it is
/// accepted only when the target predicts it, so padding never changes the output.
/// Requires size >= tree.size().
void pad_tree(DraftTree& tree, int32_t size);

}  // namespace pagoda::spec
