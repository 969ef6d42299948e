#include "pagoda/cache/mamba_radix_cache.h"

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "pagoda/core/error.h"

namespace pagoda::cache {

MambaRadixCache::MambaRadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
                                 kv::StatePool& states)
    : PrefixCache(allocator, table), tree_(allocator, table), states_(&states) {}

bool MambaRadixCache::has_state(NodeHandle node) const {
  return tree_.is_live(node) && snapshots_.contains(node.id);
}

NodeHandle MambaRadixCache::state_ancestor(NodeHandle node) const {
  const NodeHandle root = tree_.root();
  for (NodeHandle n = node; n.has_node() && n != root; n = tree_.parent(n))
    if (snapshots_.contains(n.id)) return n;  // ids are never reused: a live node's own
  return root;
}

PrefixMatch MambaRadixCache::match_prefix(const RadixKey& key, int64_t max_prefix_len,
                                          std::vector<SlotIndex>& out) {
  const PrefixMatch m = tree_.match_prefix(key, max_prefix_len, out);
  const NodeHandle node = state_ancestor(m.last_node);
  const int64_t length = node == tree_.root() ? 0 : tree_.node_depth(node);
  out.resize(static_cast<size_t>(length));
  ++counts_.match_calls;
  counts_.queried_tokens += std::min(static_cast<int64_t>(key.tokens.size()), max_prefix_len);
  counts_.matched_tokens += length;
  return PrefixMatch{length, node};
}

InsertResult MambaRadixCache::insert(const RadixKey& key, std::span<const SlotIndex> slots,
                                     InsertOptions options) {
  return tree_.insert(key, slots, options);
}

void MambaRadixCache::admit(CacheRequest& req, int64_t max_prefix_len) {
  PAGODA_REQUIRE(req.state_slot >= 0 && req.state_slot < states_->num_slots() &&
                     states_->refcount(req.state_slot) > 0,
                 kInvalidArgument,
                 "{}: admitting a request needs the request's held state slot (got {} of a "
                 "{}-slot pool)",
                 name(), req.state_slot, states_->num_slots());
  PrefixCache::admit(req, max_prefix_len);
  if (req.cache_protected_len == 0) return;
  Snapshot& s = snapshots_.at(req.last_node.id);
  states_->copy_slot(s.slot, req.state_slot);
  s.last_use = ++clock_;
  ++state_stats_.restored;
}

void MambaRadixCache::cache_finished_req(CacheRequest& req, int64_t kv_len,
                                         FinishPolicy policy) {
  tree_.cache_finished_req(req, kv_len, policy);
  if (policy != FinishPolicy::kInsert) return;
  const int64_t aligned = kv_len / page_size() * page_size();
  if (aligned == kv_len) {
    snapshot(req, kv_len, req.state_slot);
  } else if (aligned > 0 && req.aligned_state_slot >= 0 && req.aligned_state_len == aligned) {
    snapshot(req, aligned, req.aligned_state_slot);
  } else {
    ++state_stats_.unaligned;
  }
}

void MambaRadixCache::cache_unfinished_req(CacheRequest& req, int64_t fill_len) {
  tree_.cache_unfinished_req(req, fill_len);
  if (fill_len % page_size() == 0) snapshot(req, fill_len, req.state_slot);
}

void MambaRadixCache::snapshot(const CacheRequest& req, int64_t len, int32_t slot) {
  if (slot < 0 || len <= 0) return;
  const RadixKey key{std::span(req.tokens).first(static_cast<size_t>(len)), req.extra_key};
  const PrefixMatch m = tree_.match_prefix(key, kNoPrefixLimit, scratch_);
  PAGODA_CHECK_EQ(m.length, len);  // the tree just stored tokens[:len]
  if (const auto it = snapshots_.find(m.last_node.id); it != snapshots_.end()) {
    it->second.last_use = ++clock_;  // the same tokens' state: keep the one it has
    return;
  }
  sweep();
  std::optional<int32_t> fresh = states_->try_alloc();
  if (!fresh && evict_states(1) > 0) fresh = states_->try_alloc();
  if (!fresh) {
    ++state_stats_.no_slot;
    return;
  }
  states_->copy_slot(slot, *fresh);
  snapshots_.emplace(m.last_node.id, Snapshot{m.last_node, *fresh, ++clock_});
  ++state_stats_.taken;
}

int32_t MambaRadixCache::sweep() {
  int32_t released = 0;
  for (auto it = snapshots_.begin(); it != snapshots_.end();) {
    if (tree_.is_live(it->second.node)) {
      ++it;
      continue;
    }
    states_->free(it->second.slot);
    it = snapshots_.erase(it);
    ++released;
  }
  state_stats_.released += released;
  return released;
}

int32_t MambaRadixCache::evict_states(int32_t n) {
  int32_t freed = sweep();
  while (freed < n && !snapshots_.empty()) {
    const auto lru = std::min_element(
        snapshots_.begin(), snapshots_.end(),
        [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    states_->free(lru->second.slot);
    snapshots_.erase(lru);
    ++state_stats_.dropped;
    ++freed;
  }
  return freed;
}

int64_t MambaRadixCache::evict(int64_t num_tokens) {
  const int64_t evicted = tree_.evict(num_tokens);
  sweep();
  return evicted;
}

const CacheStats& MambaRadixCache::stats() const {
  merged_ = with_match_counts(tree_.stats(), counts_);
  return merged_;
}

std::vector<int32_t> MambaRadixCache::state_slots() const {
  std::vector<int32_t> slots;
  slots.reserve(snapshots_.size());
  for (const auto& [id, s] : snapshots_) slots.push_back(s.slot);
  return slots;
}

void MambaRadixCache::check_integrity() const {
  tree_.check_integrity();
  std::unordered_set<int32_t> seen;
  for (const auto& [id, s] : snapshots_) {
    PAGODA_CHECK(id == s.node.id, "snapshot keyed by node {} names node {}", id, s.node.id);
    PAGODA_CHECK(s.slot >= 0 && s.slot < states_->num_slots() && states_->refcount(s.slot) > 0,
                 "snapshot of node {} names state slot {}, which is not held", id, s.slot);
    PAGODA_CHECK(seen.insert(s.slot).second, "state slot {} is named by two snapshots", s.slot);
  }
}

}  // namespace pagoda::cache
