#include "pagoda/spec/draft_tree.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::spec {

int32_t DraftTree::add(int32_t token, int32_t parent) {
  PAGODA_REQUIRE(parent >= 0 && parent < size(), kInvalidArgument,
                 "draft tree parent {} outside [0, {})", parent, size());
  tokens.push_back(token);
  parents.push_back(parent);
  return size() - 1;
}

void DraftTree::validate() const {
  PAGODA_REQUIRE(!tokens.empty(), kInvalidArgument, "draft tree is empty (it needs a root)");
  PAGODA_REQUIRE(tokens.size() == parents.size(), kInvalidArgument,
                 "draft tree has {} tokens but {} parents", tokens.size(), parents.size());
  PAGODA_REQUIRE(parents[0] == -1, kInvalidArgument, "draft tree parents[0] is {} (must be -1)",
                 parents[0]);
  for (int32_t i = 1; i < size(); ++i)
    PAGODA_REQUIRE(parents[i] >= 0 && parents[i] < i, kInvalidArgument,
                   "draft tree parents[{}] = {} is not an earlier node", i, parents[i]);
}

std::vector<int32_t> DraftTree::depths() const {
  std::vector<int32_t> d(tokens.size(), 0);
  for (size_t i = 1; i < d.size(); ++i) d[i] = d[static_cast<size_t>(parents[i])] + 1;
  return d;
}

std::vector<int32_t> DraftTree::path_to(int32_t node) const {
  PAGODA_REQUIRE(node >= 0 && node < size(), kInvalidArgument, "node {} outside [0, {})", node,
                 size());
  std::vector<int32_t> path;
  for (int32_t i = node; i >= 0; i = parents[static_cast<size_t>(i)]) path.push_back(i);
  std::reverse(path.begin(), path.end());
  return path;
}

void append_verify_mask(const DraftTree& tree, int32_t prefix_len, std::vector<uint8_t>& mask,
                        int32_t first_row) {
  tree.validate();
  PAGODA_REQUIRE(prefix_len >= 0, kInvalidArgument, "prefix_len {} < 0", prefix_len);
  PAGODA_REQUIRE(first_row >= 0 && first_row < tree.size(), kInvalidArgument,
                 "first_row {} outside [0, {})", first_row, tree.size());
  const size_t n = static_cast<size_t>(tree.size());
  const size_t first = static_cast<size_t>(first_row);
  const size_t cols = static_cast<size_t>(prefix_len) + n;
  const size_t base = mask.size();
  mask.resize(base + (n - first) * cols, 0);
  for (size_t i = first; i < n; ++i) {
    uint8_t* row = mask.data() + base + (i - first) * cols;
    std::fill(row, row + prefix_len, uint8_t{1});
    for (int32_t j = static_cast<int32_t>(i); j >= 0; j = tree.parents[static_cast<size_t>(j)])
      row[static_cast<size_t>(prefix_len + j)] = 1;
  }
}

RetrieveIndices retrieve_indices(const DraftTree& tree) {
  tree.validate();
  const size_t n = static_cast<size_t>(tree.size());
  RetrieveIndices r{std::vector<int32_t>(n, -1), std::vector<int32_t>(n, -1)};
  std::vector<int32_t> last_child(n, -1);
  for (int32_t i = 1; i < tree.size(); ++i) {
    const size_t p = static_cast<size_t>(tree.parents[static_cast<size_t>(i)]);
    if (last_child[p] < 0) {
      r.first_child[p] = i;
    } else {
      r.next_sibling[static_cast<size_t>(last_child[p])] = i;
    }
    last_child[p] = i;
  }
  return r;
}

void pad_tree(DraftTree& tree, int32_t size) {
  PAGODA_REQUIRE(size >= tree.size(), kInvalidArgument, "cannot pad a tree of {} nodes to {}",
                 tree.size(), size);
  while (tree.size() < size) tree.add(tree.tokens[0], 0);
}

}  // namespace pagoda::spec
