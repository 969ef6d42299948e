#include "pagoda/cache/radix_cache.h"

#include <algorithm>
#include <cstring>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {

/// A tree node (see radix_cache.h). `id` is a generation: a recycled node gets a new one.
struct PrefixNode {
  PrefixNode* parent = nullptr;
  std::vector<int32_t> key;
  std::vector<SlotIndex> value;
  std::unordered_multimap<uint64_t, PrefixNode*> children;
  uint64_t id = 0;
  int32_t ns = 0;
  int32_t lock_ref = 0;
  NodeStats stats;
  bool in_evict_set = false;
  EvictionKey evict_key{};
};

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}

}  // namespace

RadixCache::RadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
                       std::unique_ptr<EvictionPolicy> policy)
    : PrefixCache(allocator, table), policy_(policy ? std::move(policy) : make_lru_policy()) {
  tree_page_refs_.assign(static_cast<size_t>(allocator.num_pages()) + 1, 0);
  namespaces_.emplace("", 0);
  root_ = new_node(nullptr, 0);
  root_->lock_ref = 1;
}

RadixCache::~RadixCache() = default;

PrefixNode* RadixCache::new_node(PrefixNode* parent, int32_t ns) {
  PrefixNode* node;
  if (!free_nodes_.empty()) {
    node = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    node = &node_pool_.emplace_back();
  }
  node->parent = parent;
  node->id = next_id_++;
  node->ns = ns;
  node->lock_ref = 0;
  node->stats = NodeStats{.last_access = clock_, .creation = node->id};
  node->in_evict_set = false;
  return node;
}

void RadixCache::recycle(PrefixNode* node) {
  node->parent = nullptr;
  node->key.clear();
  node->value.clear();
  node->children.clear();
  node->id = 0;  // any handle to it is now stale
  free_nodes_.push_back(node);
}

PrefixNode* RadixCache::require_live(NodeHandle handle) const {
  PAGODA_REQUIRE(handle.node != nullptr, kInvalidArgument, "null node handle");
  PAGODA_REQUIRE(handle.id != 0 && handle.node->id == handle.id, kFailedPrecondition,
                 "stale node handle (node {} was evicted)", handle.id);
  return handle.node;
}

uint64_t RadixCache::child_hash(int32_t ns, std::span<const int32_t> first_page) const {
  uint64_t h = mix(0x51ED27u, static_cast<uint64_t>(ns));
  for (int32_t t : first_page) h = mix(h, static_cast<uint32_t>(t));
  return h;
}

PrefixNode* RadixCache::find_child(const PrefixNode* node, int32_t ns,
                                   std::span<const int32_t> page) const {
  auto [it, end] = node->children.equal_range(child_hash(ns, page));
  for (; it != end; ++it) {
    const PrefixNode* c = it->second;
    if (c->ns == ns && std::equal(page.begin(), page.end(), c->key.begin())) return it->second;
  }
  return nullptr;
}

int64_t RadixCache::matched_pages_len(std::span<const int32_t> a,
                                      std::span<const int32_t> b) const {
  const int64_t n = aligned(static_cast<int64_t>(std::min(a.size(), b.size())));
  const int64_t p = page_size();
  int64_t i = 0;
  while (i < n && std::memcmp(a.data() + i, b.data() + i, static_cast<size_t>(p) * 4) == 0) i += p;
  return i;
}

int32_t RadixCache::ns_lookup(std::string_view extra_key) const {
  auto it = namespaces_.find(std::string(extra_key));
  return it == namespaces_.end() ? -1 : it->second;
}

int32_t RadixCache::ns_intern(std::string_view extra_key) {
  auto [it, added] =
      namespaces_.emplace(std::string(extra_key), static_cast<int32_t>(namespaces_.size()));
  return it->second;
}

void RadixCache::touch(PrefixNode* node) {
  node->stats.last_access = clock_;
  if (node->in_evict_set) sync_evictable(node);
}

void RadixCache::sync_evictable(PrefixNode* node) {
  if (node->in_evict_set) {
    evictable_leaves_.erase(EvictEntry{node->evict_key, node->id});
    node->in_evict_set = false;
  }
  if (node != root_ && node->lock_ref == 0 && node->children.empty()) {
    node->evict_key = policy_->key(node->stats);
    evictable_leaves_.emplace(EvictEntry{node->evict_key, node->id}, node);
    node->in_evict_set = true;
  }
}

void RadixCache::emit(CacheEvent event, const PrefixNode* node) {
  if (listener_) listener_(event, node->key, node->value);
}

PrefixNode* RadixCache::split(PrefixNode* child, int64_t len) {
  // parent -> child becomes parent -> upper -> child; upper takes key[:len] / value[:len].
  PrefixNode* parent = child->parent;
  PrefixNode* upper = new_node(parent, child->ns);
  upper->key.assign(child->key.begin(), child->key.begin() + len);
  upper->value.assign(child->value.begin(), child->value.begin() + len);
  upper->lock_ref = child->lock_ref;
  upper->stats = child->stats;
  child->key.erase(child->key.begin(), child->key.begin() + len);
  child->value.erase(child->value.begin(), child->value.begin() + len);
  const uint64_t h = child_hash(child->ns, std::span(upper->key).first(page_size()));
  for (auto [it, end] = parent->children.equal_range(h); it != end; ++it) {
    if (it->second == child) {
      it->second = upper;
      break;
    }
  }
  child->parent = upper;
  upper->children.emplace(child_hash(child->ns, std::span(child->key).first(page_size())), child);
  ++num_nodes_;
  return upper;
}

PrefixNode* RadixCache::match_walk(int32_t ns, std::span<const int32_t> tokens,
                                   std::vector<SlotIndex>& out) {
  const auto p = static_cast<size_t>(page_size());
  PrefixNode* node = root_;
  touch(node);
  size_t pos = 0;
  while (pos < tokens.size()) {
    PrefixNode* child = find_child(node, ns, tokens.subspan(pos, p));
    if (child == nullptr) break;
    const auto plen = static_cast<size_t>(matched_pages_len(child->key, tokens.subspan(pos)));
    touch(child);
    if (plen < child->key.size()) child = split(child, static_cast<int64_t>(plen));
    out.insert(out.end(), child->value.begin(), child->value.end());
    pos += plen;
    node = child;
  }
  return node;
}

MatchResult RadixCache::match_prefix(const RadixKey& key, int64_t max_prefix_len) {
  PAGODA_REQUIRE(max_prefix_len >= 0, kInvalidArgument, "max_prefix_len {} < 0", max_prefix_len);
  ++clock_;
  const int64_t capped = std::min(static_cast<int64_t>(key.tokens.size()), max_prefix_len);
  ++stats_.match_calls;
  stats_.queried_tokens += capped;
  MatchResult result;
  const int32_t ns = ns_lookup(key.extra_key);
  const int64_t len = aligned(capped);
  if (ns < 0 || len == 0) {
    result.last_node = NodeHandle{root_, root_->id};
    return result;
  }
  result.slots.reserve(static_cast<size_t>(len));
  PrefixNode* last = match_walk(ns, key.tokens.first(static_cast<size_t>(len)), result.slots);
  stats_.matched_tokens += static_cast<int64_t>(result.slots.size());
  result.last_node = NodeHandle{last, last->id};
  return result;
}

void RadixCache::require_whole_pages(std::span<const SlotIndex> slots) const {
  const auto p = static_cast<size_t>(page_size());
  for (size_t i = 0; i < slots.size(); i += p) {
    PAGODA_REQUIRE(slots[i] % page_size() == 0, kInvalidArgument,
                   "insert: slot {} at position {} does not start a page", slots[i], i);
    for (size_t j = 1; j < p; ++j) {
      PAGODA_REQUIRE(slots[i + j] == slots[i] + static_cast<SlotIndex>(j), kInvalidArgument,
                     "insert: positions [{}, {}) are not one whole page (slot {} at {})", i,
                     i + p, slots[i + j], i + j);
    }
  }
  allocator_->require_held_runs(slots);
}

void RadixCache::require_request_owns(std::span<const SlotIndex> own) const {
  for (SlotIndex s : own) {
    if (s % page_size() != 0) continue;
    const int32_t page = s / page_size();
    PAGODA_REQUIRE(allocator_->refcount(PageId(page)) > tree_page_refs_[page], kFailedPrecondition,
                   "the request holds no reference of its own on page {} (slot {}): finished "
                   "twice, or its row points at tree pages beyond cache_protected_len",
                   page, s);
  }
}

int64_t RadixCache::insert_walk(int32_t ns, std::span<const int32_t> tokens,
                                std::span<const SlotIndex> slots, InsertOptions options) {
  const auto p = static_cast<size_t>(page_size());
  PrefixNode* node = root_;
  touch(node);
  size_t pos = 0;
  while (pos < tokens.size()) {
    PrefixNode* child = find_child(node, ns, tokens.subspan(pos, p));
    if (child == nullptr) break;
    const auto plen = static_cast<size_t>(matched_pages_len(child->key, tokens.subspan(pos)));
    child->stats.priority = std::max(child->stats.priority, options.priority);
    if (options.kind == InsertKind::kFinished) ++child->stats.hit_count;
    touch(child);
    if (plen < child->key.size()) child = split(child, static_cast<int64_t>(plen));
    pos += plen;
    node = child;
  }
  const auto prefix_len = static_cast<int64_t>(pos);
  if (pos < tokens.size()) {
    PrefixNode* leaf = new_node(node, ns);
    leaf->key.assign(tokens.begin() + static_cast<int64_t>(pos), tokens.end());
    leaf->value.assign(slots.begin() + static_cast<int64_t>(pos), slots.end());
    leaf->stats.priority = options.priority;
    leaf->stats.hit_count = options.kind == InsertKind::kFinished ? 1 : 0;
    allocator_->retain(leaf->value);
    for (size_t i = 0; i < leaf->value.size(); i += p) ++tree_page_refs_[leaf->value[i] / page_size()];
    node->children.emplace(child_hash(ns, std::span(leaf->key).first(p)), leaf);
    ++num_nodes_;
    evictable_size_ += static_cast<int64_t>(leaf->key.size());
    stats_.inserted_tokens += static_cast<int64_t>(leaf->key.size());
    sync_evictable(node);
    sync_evictable(leaf);
    emit(CacheEvent::kStored, leaf);
  }
  return prefix_len;
}

int64_t RadixCache::insert(const RadixKey& key, std::span<const SlotIndex> slots,
                           InsertOptions options) {
  const int64_t len = aligned(static_cast<int64_t>(key.tokens.size()));
  PAGODA_REQUIRE(static_cast<int64_t>(slots.size()) >= len, kInvalidArgument,
                 "insert: {} slots for {} page-aligned tokens", slots.size(), len);
  const auto value = slots.first(static_cast<size_t>(len));
  require_whole_pages(value);
  ++clock_;
  if (len == 0) return 0;
  return insert_walk(ns_intern(key.extra_key), key.tokens.first(static_cast<size_t>(len)), value,
                     options);
}

void RadixCache::inc_lock_ref(NodeHandle handle) {
  for (PrefixNode* n = require_live(handle); n != root_; n = n->parent) {
    if (n->lock_ref++ == 0) {
      const auto size = static_cast<int64_t>(n->key.size());
      evictable_size_ -= size;
      protected_size_ += size;
      sync_evictable(n);
    }
  }
}

void RadixCache::dec_lock_ref(NodeHandle handle) {
  PrefixNode* node = require_live(handle);
  for (PrefixNode* n = node; n != root_; n = n->parent) {
    PAGODA_REQUIRE(n->lock_ref > 0, kFailedPrecondition,
                   "dec_lock_ref on node {} that is not locked", n->id);
  }
  for (PrefixNode* n = node; n != root_; n = n->parent) {
    if (--n->lock_ref == 0) {
      const auto size = static_cast<int64_t>(n->key.size());
      evictable_size_ += size;
      protected_size_ -= size;
      sync_evictable(n);
    }
  }
}

int32_t RadixCache::lock_ref(NodeHandle handle) const { return require_live(handle)->lock_ref; }

int64_t RadixCache::evict(int64_t num_tokens) {
  PAGODA_REQUIRE(num_tokens >= 0, kInvalidArgument, "evict({}) < 0", num_tokens);
  int64_t evicted = 0;
  while (evicted < num_tokens && !evictable_leaves_.empty()) {
    PrefixNode* leaf = evictable_leaves_.begin()->second;
    evictable_leaves_.erase(evictable_leaves_.begin());
    leaf->in_evict_set = false;
    PAGODA_CHECK(leaf->lock_ref == 0 && leaf->children.empty(), "evicting node {}", leaf->id);
    allocator_->free(leaf->value);
    for (size_t i = 0; i < leaf->value.size(); i += static_cast<size_t>(page_size())) {
      --tree_page_refs_[leaf->value[i] / page_size()];
    }
    const auto size = static_cast<int64_t>(leaf->key.size());
    evicted += size;
    evictable_size_ -= size;
    ++stats_.evicted_nodes;
    emit(CacheEvent::kRemoved, leaf);
    PrefixNode* parent = leaf->parent;
    const uint64_t h = child_hash(leaf->ns, std::span(leaf->key).first(page_size()));
    for (auto [it, end] = parent->children.equal_range(h); it != end; ++it) {
      if (it->second == leaf) {
        parent->children.erase(it);
        break;
      }
    }
    recycle(leaf);
    --num_nodes_;
    sync_evictable(parent);
  }
  stats_.evicted_tokens += evicted;
  return evicted;
}

void RadixCache::cache_finished_req(CacheRequest& req, int64_t kv_len, FinishPolicy policy) {
  require_request(req, kv_len);
  if (req.last_node.has_node()) require_live(req.last_node);
  const auto kv = table_->read(req.req_slot, 0, kv_len);
  scratch_kv_.assign(kv.begin(), kv.end());
  const std::span<const SlotIndex> all(scratch_kv_);
  const auto protected_len = static_cast<size_t>(req.cache_protected_len);
  const auto own = all.subspan(protected_len);
  allocator_->require_held_runs(own);
  require_request_owns(own);
  const int64_t key_len = aligned(kv_len);
  if (policy == FinishPolicy::kInsert && key_len > 0) {
    const auto key_slots = all.first(static_cast<size_t>(key_len));
    require_whole_pages(key_slots);
    ++clock_;
    const int64_t prefix_len =
        insert_walk(ns_intern(req.extra_key), std::span(req.tokens).first(key_slots.size()),
                    key_slots, InsertOptions{.priority = req.priority});
    PAGODA_CHECK_GE(prefix_len, req.cache_protected_len);
  }
  // The tree holds its own references now; the request drops all of its own: duplicates of tree
  // pages and the unaligned tail return to the free list, newly stored pages stay with the tree.
  allocator_->free(own);
  if (req.last_node.has_node()) dec_lock_ref(req.last_node);
  req.last_node = NodeHandle{};
  req.prefix_slots.clear();
  req.cache_protected_len = 0;
}

void RadixCache::cache_unfinished_req(CacheRequest& req, int64_t fill_len) {
  require_request(req, fill_len);
  if (req.last_node.has_node()) require_live(req.last_node);
  const auto kv = table_->read(req.req_slot, 0, fill_len);
  scratch_kv_.assign(kv.begin(), kv.end());
  const std::span<const SlotIndex> all(scratch_kv_);
  const auto protected_len = static_cast<size_t>(req.cache_protected_len);
  allocator_->require_held_runs(all.subspan(protected_len));
  require_request_owns(all.subspan(protected_len));
  const auto key_len = static_cast<size_t>(aligned(fill_len));
  const auto key_slots = all.first(key_len);
  require_whole_pages(key_slots);
  const int32_t ns = ns_intern(req.extra_key);
  const auto key_tokens = std::span<const int32_t>(req.tokens).first(key_len);
  ++clock_;
  const int64_t prefix_len =
      key_len == 0 ? 0
                   : insert_walk(ns, key_tokens, key_slots,
                                 InsertOptions{.priority = req.priority, .kind = InsertKind::kChunked});
  PAGODA_CHECK_GE(prefix_len, req.cache_protected_len);
  allocator_->free(all.subspan(protected_len, key_len - protected_len));
  // Re-match: the request now points at the tree's slots for [0, key_len).
  scratch_tree_.clear();
  PrefixNode* node = key_len == 0 ? root_ : match_walk(ns, key_tokens, scratch_tree_);
  PAGODA_CHECK_EQ(scratch_tree_.size(), key_len);
  table_->write(req.req_slot, req.cache_protected_len,
                std::span<const SlotIndex>(scratch_tree_).subspan(protected_len));
  const NodeHandle new_node{node, node->id};
  if (req.last_node.has_node()) dec_lock_ref(req.last_node);
  inc_lock_ref(new_node);
  req.cache_protected_len = static_cast<int64_t>(key_len);
  req.prefix_slots.assign(scratch_tree_.begin(), scratch_tree_.end());
  req.prefix_slots.insert(req.prefix_slots.end(), all.begin() + static_cast<int64_t>(key_len),
                          all.end());
  req.last_node = new_node;
}

void RadixCache::check_integrity() const {
  PAGODA_CHECK(root_->key.empty() && root_->value.empty() && root_->lock_ref == 1);
  const auto p = static_cast<size_t>(page_size());
  int64_t evictable = 0, protected_tokens = 0, nodes = 0, leaves = 0;
  std::unordered_map<int32_t, int32_t> tree_refs;
  std::vector<const PrefixNode*> stack{root_};
  while (!stack.empty()) {
    const PrefixNode* node = stack.back();
    stack.pop_back();
    int64_t child_locks = 0;
    for (const auto& [h, c] : node->children) {
      PAGODA_CHECK(c->parent == node, "node {} has a wrong parent", c->id);
      PAGODA_CHECK(c->id != 0, "recycled node linked under node {}", node->id);
      PAGODA_CHECK(c->key.size() >= p, "node {} key shorter than a page", c->id);
      PAGODA_CHECK_EQ(h, child_hash(c->ns, std::span(c->key).first(p)));
      PAGODA_CHECK(node == root_ || c->ns == node->ns, "namespace changes below the root");
      child_locks += c->lock_ref;
      stack.push_back(c);
    }
    if (node == root_) continue;
    ++nodes;
    PAGODA_CHECK_EQ(node->key.size(), node->value.size());
    PAGODA_CHECK(!node->key.empty() && node->key.size() % p == 0, "node {} key length {}",
                 node->id, node->key.size());
    for (size_t i = 0; i < node->value.size(); ++i) {
      PAGODA_CHECK_EQ(node->value[i], node->value[i - i % p] + static_cast<SlotIndex>(i % p));
      if (i % p == 0) {
        PAGODA_CHECK_EQ(node->value[i] % page_size(), 0);
        ++tree_refs[node->value[i] / page_size()];
      }
    }
    PAGODA_CHECK(node->lock_ref >= child_locks, "node {} lock_ref {} < children's {}", node->id,
                 node->lock_ref, child_locks);
    (node->lock_ref > 0 ? protected_tokens : evictable) += static_cast<int64_t>(node->key.size());
    const bool evictable_leaf = node->lock_ref == 0 && node->children.empty();
    PAGODA_CHECK_EQ(node->in_evict_set, evictable_leaf);
    if (evictable_leaf) {
      ++leaves;
      PAGODA_CHECK(node->evict_key == policy_->key(node->stats), "stale eviction key, node {}",
                   node->id);
      auto it = evictable_leaves_.find(EvictEntry{node->evict_key, node->id});
      PAGODA_CHECK(it != evictable_leaves_.end() && it->second == node, "leaf {} not in the set",
                   node->id);
    }
  }
  PAGODA_CHECK_EQ(evictable, evictable_size_);
  PAGODA_CHECK_EQ(protected_tokens, protected_size_);
  PAGODA_CHECK_EQ(nodes, num_nodes_);
  PAGODA_CHECK_EQ(leaves, static_cast<int64_t>(evictable_leaves_.size()));
  for (size_t page = 0; page < tree_page_refs_.size(); ++page) {
    auto it = tree_refs.find(static_cast<int32_t>(page));
    PAGODA_CHECK_EQ(tree_page_refs_[page], it == tree_refs.end() ? 0 : it->second);
  }
  for (const auto& [page, refs] : tree_refs) {
    PAGODA_CHECK(allocator_->refcount(PageId(page)) >= refs,
                 "page {}: allocator refcount {} < {} tree references", page,
                 allocator_->refcount(PageId(page)), refs);
  }
}

}  // namespace pagoda::cache
