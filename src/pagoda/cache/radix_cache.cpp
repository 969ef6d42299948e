#include "pagoda/cache/radix_cache.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {

/// A tree node (see radix_cache.h). `id` is a generation: a recycled node gets a new one.
struct PrefixNode {
  PrefixNode* parent = nullptr;
  /// [len tokens | len slots] in an arena block; only the tokens when the slots are one run of
  /// consecutive whole pages (run_page >= 0: slot i is run_page * page_size + i). Null when empty.
  int32_t* data = nullptr;
  KeyArena::Block block;
  int64_t len = 0;
  uint64_t id = 0;
  uint64_t hash = 0;  ///< page_hash(ns, first page of key); with the parent, its child-table key
  int32_t ns = 0;
  int32_t lock_ref = 0;
  int32_t num_children = 0;
  uint32_t index = 0;  ///< pool index (fixed for the node's storage): its heap_pos_ entry
  uint64_t entry_key = 0;  ///< its child-table key (child_key(parent, hash)), set when linked
  int64_t run_page = -1;  ///< first page when the slots are one run of consecutive pages, else -1
  NodeStats stats;

  const int32_t* key() const { return data; }
  /// The stored slots; only when run_page < 0.
  const SlotIndex* stored_value() const { return data + len; }
  std::span<const int32_t> key_span() const { return {key(), static_cast<size_t>(len)}; }
  /// Replaces the buffer with a copy of key[0, n) and, when `v` is not null, value[0, n) (the
  /// sources may lie in the old buffer: it is released after the copy); run_page is set to `run`
  /// (>= 0 exactly when v is null). Unchanged if the allocation throws.
  void assign(KeyArena& arena, const int32_t* k, const SlotIndex* v, int64_t n, int64_t run) {
    const auto cells = static_cast<size_t>(v != nullptr ? 2 * n : n);
    const KeyArena::Block fresh = arena.allocate(cells);
    std::memcpy(fresh.data, k, static_cast<size_t>(n) * sizeof(int32_t));
    if (v != nullptr) std::memcpy(fresh.data + n, v, static_cast<size_t>(n) * sizeof(SlotIndex));
    if (data != nullptr) arena.release(block);
    block = fresh;
    data = fresh.data;
    len = n;
    run_page = run;
  }
};

namespace {

constexpr size_t kMinChildTable = 64;
/// Nodes per pool chunk.
constexpr size_t kNodeChunk = 256;
/// Heaps smaller than this are not settled in bulk (the lazy path is as cheap there). Small, so
/// the property tests (trees of up to ~100 leaves) exercise both paths.
constexpr size_t kSettleMinLeaves = 16;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 29);
}

/// Leading equal elements of a[0, n) and b[0, n): one memcmp over the whole run when it matches
/// (the common case), else a blockwise search for the first difference.
/// Whether v[i] == first + i for every i (one branch-free, vectorisable pass; wrap-around is
/// harmless: the page range is checked by the allocator).
bool is_linear(const SlotIndex* v, size_t n, uint32_t first) {
  uint32_t diff = 0;
  for (size_t i = 0; i < n; ++i) {
    diff |= static_cast<uint32_t>(v[i]) ^ (first + static_cast<uint32_t>(i));
  }
  return diff == 0;
}

size_t common_prefix(const int32_t* a, const int32_t* b, size_t n) {
  if (std::memcmp(a, b, n * sizeof(int32_t)) == 0) return n;
  constexpr size_t kBlock = 64;
  size_t i = 0;
  while (i + kBlock <= n && std::memcmp(a + i, b + i, kBlock * sizeof(int32_t)) == 0) i += kBlock;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

RadixCache::RadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
                       std::unique_ptr<EvictionPolicy> policy)
    : RadixCache(static_cast<kv::PageRefs&>(allocator), std::move(policy)) {
  table_ = &table;
}

RadixCache::RadixCache(kv::PageRefs& pages, std::unique_ptr<EvictionPolicy> policy,
                       kv::ReqToTokenTable* table)
    : PrefixCache(pages, table), policy_(policy ? std::move(policy) : make_lru_policy()) {
  tree_pages_.assign((static_cast<size_t>(pages.num_pages()) + 64) / 64, 0);
  const int32_t p = pages.page_size();
  page_shift_ = (p & (p - 1)) == 0 ? std::countr_zero(static_cast<uint32_t>(p)) : -1;
  children_.assign(kMinChildTable, ChildEntry{});
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
    // Nodes are allocated kNodeChunk at a time and never move (handles point at them).
    const size_t count = heap_pos_.size();
    if (count % kNodeChunk == 0) node_chunks_.push_back(std::make_unique<PrefixNode[]>(kNodeChunk));
    node = &node_chunks_.back()[count % kNodeChunk];
    node->index = static_cast<uint32_t>(heap_pos_.size());
    heap_pos_.push_back(-1);
  }
  node->parent = parent;
  node->id = next_id_++;
  node->ns = ns;
  node->lock_ref = 0;
  node->num_children = 0;
  heap_pos_[node->index] = -1;
  node->run_page = -1;
  node->hash = 0;
  node->stats = NodeStats{.last_access = clock_, .creation = node->id};
  return node;
}

void RadixCache::recycle(PrefixNode* node) {
  node->parent = nullptr;
  if (node->data != nullptr) arena_.release(node->block);  // its slab may go back to the heap
  node->data = nullptr;
  node->len = 0;
  node->id = 0;  // any handle to it is now stale
  free_nodes_.push_back(node);
}

PrefixNode* RadixCache::require_live(NodeHandle handle) const {
  PAGODA_REQUIRE(handle.node != nullptr, kInvalidArgument, "null node handle");
  PAGODA_REQUIRE(handle.id != 0 && handle.node->id == handle.id, kFailedPrecondition,
                 "stale node handle (node {} was evicted)", handle.id);
  return handle.node;
}

uint64_t RadixCache::page_hash(int32_t ns, const int32_t* first_page) const {
  uint64_t h = mix(0x51ED27u, static_cast<uint64_t>(ns));
  const int32_t p = page_size();
  int32_t i = 0;
  for (; i + 1 < p; i += 2) {
    h = mix(h, static_cast<uint32_t>(first_page[i]) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(first_page[i + 1])) << 32));
  }
  if (i < p) h = mix(h, static_cast<uint32_t>(first_page[i]));
  return h;
}

uint64_t RadixCache::child_key(const PrefixNode* parent, uint64_t hash) const {
  return mix(hash, parent->id);
}

PrefixNode* RadixCache::find_child(const PrefixNode* node, int32_t ns, const int32_t* page) const {
  return find_child_hashed(node, ns, page, page_hash(ns, page));
}

PrefixNode* RadixCache::find_child_hashed(const PrefixNode* node, int32_t ns,
                                          const int32_t* page, uint64_t hash) const {
  const uint64_t key = child_key(node, hash);
  const size_t mask = children_.size() - 1;
  const auto bytes = static_cast<size_t>(page_size()) * sizeof(int32_t);
  for (size_t i = key & mask;; i = (i + 1) & mask) {
    const ChildEntry& e = children_[i];
    if (e.node == nullptr) return nullptr;
    if (e.key == key && e.node->parent == node && e.node->ns == ns &&
        std::memcmp(e.node->key(), page, bytes) == 0) {
      return e.node;
    }
  }
}

void RadixCache::rehash_children(size_t capacity) {
  std::vector<ChildEntry> old(capacity, ChildEntry{});
  old.swap(children_);
  const size_t mask = capacity - 1;
  for (const ChildEntry& e : old) {
    if (e.node == nullptr) continue;
    size_t i = e.key & mask;
    while (children_[i].node != nullptr) i = (i + 1) & mask;
    children_[i] = e;
  }
}

void RadixCache::link_child(PrefixNode* parent, PrefixNode* child) {
  if ((num_children_ + 1) * 2 > children_.size()) rehash_children(children_.size() * 2);
  child->hash = page_hash(child->ns, child->key());
  const uint64_t key = child_key(parent, child->hash);
  child->entry_key = key;
  const size_t mask = children_.size() - 1;
  size_t i = key & mask;
  while (children_[i].node != nullptr) i = (i + 1) & mask;
  children_[i] = ChildEntry{key, child};
  ++parent->num_children;
  ++num_children_;
}

void RadixCache::relink_child(PrefixNode* old_child, PrefixNode* new_child) {
  const uint64_t key = old_child->entry_key;
  new_child->entry_key = key;
  const size_t mask = children_.size() - 1;
  size_t i = key & mask;
  while (children_[i].node != old_child) i = (i + 1) & mask;
  children_[i].node = new_child;
}

void RadixCache::unlink_child(PrefixNode* child) {
  const uint64_t key = child->entry_key;
  const size_t mask = children_.size() - 1;
  size_t i = key & mask;
  while (children_[i].node != child) i = (i + 1) & mask;
  // Backward-shift deletion keeps every probe sequence unbroken without tombstones.
  for (size_t j = (i + 1) & mask; children_[j].node != nullptr; j = (j + 1) & mask) {
    const size_t home = children_[j].key & mask;
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      children_[i] = children_[j];
      i = j;
    }
  }
  children_[i] = ChildEntry{};
  --child->parent->num_children;
  --num_children_;
  if (children_.size() > kMinChildTable && num_children_ * 8 < children_.size()) {
    rehash_children(children_.size() / 2);  // give memory back as the tree shrinks
  }
}

int32_t RadixCache::ns_lookup(std::string_view extra_key) const {
  auto it = namespaces_.find(extra_key);
  return it == namespaces_.end() ? -1 : it->second;
}

int32_t RadixCache::ns_intern(std::string_view extra_key) {
  if (const int32_t ns = ns_lookup(extra_key); ns >= 0) return ns;
  const auto ns = static_cast<int32_t>(namespaces_.size());
  namespaces_.emplace(std::string(extra_key), ns);
  return ns;
}

void RadixCache::heap_sift(size_t pos) {
  const HeapEntry e = heap_[pos];
  const size_t start = pos;
  while (pos > 0) {
    const size_t up = (pos - 1) / 2;
    if (!heap_less(e, heap_[up])) break;
    heap_place(heap_[up], pos);
    pos = up;
  }
  if (pos != start) {
    heap_place(e, pos);
    return;
  }
  heap_sift_down(pos);
}


void RadixCache::heap_sift_down(size_t pos) {
  const HeapEntry e = heap_[pos];
  const size_t size = heap_.size();
  for (;;) {
    size_t c = 2 * pos + 1;
    if (c >= size) break;
    if (c + 1 < size && heap_less(heap_[c + 1], heap_[c])) ++c;
    if (!heap_less(heap_[c], e)) break;
    heap_place(heap_[c], pos);
    pos = c;
  }
  heap_place(e, pos);
}

void RadixCache::heap_remove(PrefixNode* node) {
  const auto pos = static_cast<size_t>(heap_pos_[node->index]);
  const HeapEntry last = heap_.back();
  heap_.pop_back();
  heap_pos_[node->index] = -1;
  if (pos < heap_.size()) {
    heap_place(last, pos);
    heap_sift(pos);
  }
}

bool RadixCache::any_in_tree(size_t page, size_t count) const {
  for (const size_t end = page + count; page < end;) {
    const size_t lo = page % 64;
    const size_t n = std::min<size_t>(64 - lo, end - page);
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << lo;
    if ((tree_pages_[page / 64] & mask) != 0) return true;
    page += n;
  }
  return false;
}

void RadixCache::set_in_tree(size_t page, size_t count, bool on) {
  for (const size_t end = page + count; page < end;) {
    const size_t lo = page % 64;
    const size_t n = std::min<size_t>(64 - lo, end - page);
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1) << lo;
    if (on) {
      tree_pages_[page / 64] |= mask;
    } else {
      tree_pages_[page / 64] &= ~mask;
    }
    page += n;
  }
}

void RadixCache::touch(PrefixNode* node) {
  node->stats.last_access = clock_;
  if (heap_pos_[node->index] >= 0) sync_evictable(node);
}

void RadixCache::sync_evictable(PrefixNode* node) {
  const bool evictable_leaf = node != root_ && node->lock_ref == 0 && node->num_children == 0;
  if (!evictable_leaf) {
    if (heap_pos_[node->index] >= 0) heap_remove(node);
    return;
  }
  const EvictionKey key = policy_->key(node->stats);
  const int32_t at = heap_pos_[node->index];
  if (at < 0) {
    heap_.push_back(HeapEntry{key, node->id, node, node->index});
    heap_pos_[node->index] = static_cast<int32_t>(heap_.size() - 1);
    heap_sift(heap_.size() - 1);
    return;
  }
  // A smaller key moves the entry at once; a larger one (a touch: LRU time, LFU hits, priority
  // only grow) is applied lazily when the entry reaches the top in evict(). The stored key is
  // then a lower bound of the real one, which keeps the eviction order exact.
  HeapEntry& entry = heap_[static_cast<size_t>(at)];
  if (key < entry.key) {
    entry.key = key;
    heap_sift(static_cast<size_t>(at));
  }
}

void RadixCache::settle_heap() {
  const size_t n = heap_.size();
  constexpr size_t kAhead = 8;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&heap_[i + kAhead].node->stats);
    heap_[i].key = policy_->key(heap_[i].node->stats);
  }
  // Floyd's heapify: sift-down only (a sift-up here would move an unordered parent down).
  for (size_t i = n / 2; i-- > 0;) heap_sift_down(i);
}

void RadixCache::emit(CacheEvent event, const PrefixNode* node) {
  if (!listener_) return;
  size_t filled = 0;
  append_slots(node, node->len, &scratch_emit_, filled);
  scratch_emit_.resize(filled);
  listener_(event, node->key_span(), scratch_emit_);
}

PrefixNode* RadixCache::split(PrefixNode* child, int64_t len) {
  // parent -> child becomes parent -> upper -> child; upper takes key[:len] / value[:len].
  PrefixNode* upper = new_node(child->parent, child->ns);
  const bool run = child->run_page >= 0;
  upper->assign(arena_, child->key(), run ? nullptr : child->stored_value(), len, child->run_page);
  upper->hash = child->hash;  // same first page, same parent: it takes over the child's entry
  upper->lock_ref = child->lock_ref;
  upper->stats = child->stats;
  relink_child(child, upper);
  const int64_t rest = child->len - len;
  child->assign(arena_, child->key() + len, run ? nullptr : child->stored_value() + len, rest,
                run ? child->run_page + len / page_size() : -1);
  child->parent = upper;
  link_child(upper, child);
  ++num_nodes_;
  return upper;
}

int64_t RadixCache::peek_prefix_len(int32_t ns, std::span<const int32_t> tokens,
                                    std::span<const SlotIndex> slots, bool collect_dups) {
  const auto n = static_cast<int64_t>(tokens.size());
  const PrefixNode* node = root_;
  int64_t pos = 0;
  scratch_path_.clear();
  while (pos < n) {
    if (node->num_children == 0) break;  // a leaf: no lookup needed
    PrefixNode* child = find_child(node, ns, tokens.data() + pos);
    if (child == nullptr) break;
    const int64_t m = std::min(child->len, n - pos);
    const int64_t plen = aligned(static_cast<int64_t>(
        common_prefix(child->key(), tokens.data() + pos, static_cast<size_t>(m))));
    if (collect_dups && plen > 0) collect_dups_of(child, slots.data() + pos, pos, plen);
    scratch_path_.push_back(PathStep{child, plen});
    pos += plen;
    if (plen < child->len) break;
    node = child;
  }
  return pos;
}

void RadixCache::collect_dups_of(const PrefixNode* node, const SlotIndex* mine, int64_t pos,
                                 int64_t n) {
  const int64_t p = page_size();
  if (node->run_page < 0) {
    const SlotIndex* tree = node->stored_value();
    if (std::memcmp(tree, mine, static_cast<size_t>(n) * sizeof(SlotIndex)) == 0) return;
    // Pages where the caller passed its own slots are duplicates it hands over. The value is
    // whole pages (checked), so the first slot of each page decides.
    for (int64_t j = 0; j < n; j += p) {
      if (mine[j] != tree[j]) add_page(scratch_dups_, page_id(mine[j]), 1);
    }
    return;
  }
  // A one-run node against the value's runs: each overlapping segment agrees everywhere or
  // nowhere (both sides are consecutive pages there). O(runs), no slot read.
  for_each_run_in(pos, pos + n, [&](int64_t at, int64_t first_page, int64_t pages) {
    if (first_page != node->run_page + (at - pos) / p) add_page(scratch_dups_, first_page, pages);
  });
}

void RadixCache::add_page(std::vector<kv::PageRun>& runs, int64_t first, int64_t count) {
  if (!runs.empty() && int64_t{runs.back().first} + runs.back().count == first) {
    runs.back().count += static_cast<int32_t>(count);
  } else {
    runs.push_back(kv::PageRun{static_cast<int32_t>(first), static_cast<int32_t>(count)});
  }
}

void RadixCache::collect_page_runs(std::span<const SlotIndex> slots,
                                   std::vector<kv::PageRun>& out) const {
  for_each_page_run(slots, [&](SlotIndex, int64_t page, size_t count) {
    out.push_back(kv::PageRun{static_cast<int32_t>(page), static_cast<int32_t>(count)});
  });
}

void RadixCache::runs_in(int64_t begin, int64_t end, std::vector<kv::PageRun>& out) const {
  for_each_run_in(begin, end, [&](int64_t, int64_t first_page, int64_t pages) {
    out.push_back(kv::PageRun{static_cast<int32_t>(first_page), static_cast<int32_t>(pages)});
  });
}

void RadixCache::append_slots(const PrefixNode* node, int64_t n, std::vector<SlotIndex>* out,
                              size_t& filled) const {
  const size_t need = filled + static_cast<size_t>(n);
  if (out->size() < need) out->resize(need);
  SlotIndex* o = out->data() + filled;
  filled = need;
  if (node->run_page < 0) {
    std::memcpy(o, node->stored_value(), static_cast<size_t>(n) * sizeof(SlotIndex));
    return;
  }
  const auto base = static_cast<uint32_t>(node->run_page * page_size());
  const auto count = static_cast<uint32_t>(n);
  for (uint32_t i = 0; i < count; ++i) o[i] = static_cast<SlotIndex>(base + i);
}

PrefixNode* RadixCache::match_walk(int32_t ns, std::span<const int32_t> tokens,
                                   std::vector<SlotIndex>* out, size_t& filled) {
  const auto n = static_cast<int64_t>(tokens.size());
  PrefixNode* node = root_;
  touch(node);
  int64_t pos = 0;
  uint64_t hash = 0;
  int64_t hashed_at = -1;  // the position whose page hash is in `hash`
  while (pos < n) {
    if (node->num_children == 0) break;  // a leaf: no lookup needed
    if (hashed_at != pos) hash = page_hash(ns, tokens.data() + pos);
    PrefixNode* child = find_child_hashed(node, ns, tokens.data() + pos, hash);
    if (child == nullptr) break;
    const int64_t m = std::min(child->len, n - pos);
    if (m == child->len && pos + m < n && child->num_children > 0) {
      // The next lookup's table slot, if the whole edge matches: its miss overlaps the compare.
      hashed_at = pos + m;
      hash = page_hash(ns, tokens.data() + hashed_at);
      __builtin_prefetch(&children_[child_key(child, hash) & (children_.size() - 1)]);
    }
    const int64_t plen = aligned(static_cast<int64_t>(
        common_prefix(child->key(), tokens.data() + pos, static_cast<size_t>(m))));
    touch(child);
    const bool partial = plen < child->len;
    if (partial) child = split(child, plen);
    append_slots(child, plen, out, filled);
    pos += plen;
    node = child;
    if (partial) break;
  }
  return node;
}

PrefixMatch RadixCache::match_prefix(const RadixKey& key, int64_t max_prefix_len,
                                     std::vector<SlotIndex>& out) {
  PAGODA_REQUIRE(max_prefix_len >= 0, kInvalidArgument, "max_prefix_len {} < 0", max_prefix_len);
  ++clock_;
  const int64_t capped = std::min(static_cast<int64_t>(key.tokens.size()), max_prefix_len);
  ++stats_.match_calls;
  stats_.queried_tokens += capped;
  const int32_t ns = ns_lookup(key.extra_key);
  const int64_t len = aligned(capped);
  if (ns < 0 || len == 0) {
    out.clear();
    return PrefixMatch{0, NodeHandle{root_, root_->id}};
  }
  // The slots are written over the buffer's old contents, which it grows only when short (so a
  // warm buffer is neither reallocated nor zero-filled), then it is cut to the match.
  size_t filled = 0;
  PrefixNode* last = match_walk(ns, key.tokens.first(static_cast<size_t>(len)), &out, filled);
  out.resize(filled);
  const auto matched = static_cast<int64_t>(filled);
  stats_.matched_tokens += matched;
  return PrefixMatch{matched, NodeHandle{last, last->id}};
}

void RadixCache::value_runs(std::span<const SlotIndex> slots) {
  // Maximal runs of consecutive slots, found 64 slots per vectorised step; each must start a page
  // and cover whole pages, else the per-page check names the first bad position.
  scratch_value_runs_.clear();
  const auto p = static_cast<size_t>(page_size());
  const SlotIndex* v = slots.data();
  const size_t n = slots.size();
  constexpr size_t kBlock = 64;
  for (size_t i = 0; i < n;) {
    const auto first = static_cast<uint32_t>(v[i]);
    size_t j = i + 1;
    while (j + kBlock <= n && is_linear(v + j, kBlock, first + static_cast<uint32_t>(j - i))) {
      j += kBlock;
    }
    while (j < n && static_cast<uint32_t>(v[j]) == first + static_cast<uint32_t>(j - i)) ++j;
    const size_t end = i + (j - i) / p * p;
    if (v[i] % page_size() != 0 || end == i) [[unlikely]] {
      require_whole_pages(slots);
      PAGODA_CHECK(false, "value_runs: position {} is not a whole page", i);
    }
    scratch_value_runs_.push_back(ValueRun{static_cast<int64_t>(i), page_id(v[i]),
                                           static_cast<int64_t>((end - i) / p)});
    i = end;
  }
}

void RadixCache::require_whole_pages(std::span<const SlotIndex> slots) const {
  const auto p = static_cast<size_t>(page_size());
  if (p == 1) return;  // every slot is a whole page; the allocator checks the rest
  for (size_t i = 0; i < slots.size(); i += p) {
    PAGODA_REQUIRE(slots[i] % page_size() == 0, kInvalidArgument,
                   "insert: slot {} at position {} does not start a page", slots[i], i);
    for (size_t j = 1; j < p; ++j) {
      PAGODA_REQUIRE(slots[i + j] == slots[i] + static_cast<SlotIndex>(j), kInvalidArgument,
                     "insert: positions [{}, {}) are not one whole page (slot {} at {})", i,
                     i + p, slots[i + j], i + j);
    }
  }
}

void RadixCache::require_request_owns(std::span<const SlotIndex> own) const {
  for (SlotIndex s : own) {
    if (s % page_size() != 0) continue;
    const int32_t page = s / page_size();
    PAGODA_REQUIRE(allocator_->refcount(PageId(page)) > (in_tree(static_cast<size_t>(page)) ? 1 : 0),
                   kFailedPrecondition,
                   "the request holds no reference of its own on page {} (slot {}): finished "
                   "twice, or its row points at tree pages beyond cache_protected_len",
                   page, s);
  }
}

PrefixNode* RadixCache::insert_apply(int32_t ns, std::span<const int32_t> tokens,
                                     std::span<const SlotIndex> slots,
                                     const InsertOptions& options, int64_t pos) {
  // Replays the path peek_prefix_len recorded (nothing changed the tree since).
  const auto n = static_cast<int64_t>(tokens.size());
  PrefixNode* node = root_;
  touch(node);
  for (const PathStep& step : scratch_path_) {
    PrefixNode* child = step.child;
    child->stats.priority = std::max(child->stats.priority, options.priority);
    if (options.kind == InsertKind::kFinished) ++child->stats.hit_count;
    touch(child);
    if (step.len < child->len) child = split(child, step.len);
    node = child;
  }
  if (pos == n) return node;
  PrefixNode* leaf = new_node(node, ns);
  // One run of pages (what allocations hand out): the tree stores the tokens and the run only.
  const bool one_run = scratch_runs_.size() == 1 && scratch_runs_[0].first >= 0;
  leaf->assign(arena_, tokens.data() + pos, one_run ? nullptr : slots.data() + pos, n - pos,
               one_run ? int64_t{scratch_runs_[0].first} : -1);
  leaf->stats.priority = options.priority;
  leaf->stats.hit_count = options.kind == InsertKind::kFinished ? 1 : 0;
  for (const kv::PageRun& r : scratch_runs_) {
    set_in_tree(static_cast<size_t>(r.first), static_cast<size_t>(r.count), true);
  }
  link_child(node, leaf);
  ++num_nodes_;
  evictable_size_ += leaf->len;
  stats_.inserted_tokens += leaf->len;
  sync_evictable(node);
  sync_evictable(leaf);
  emit(CacheEvent::kStored, leaf);
  return leaf;
}

InsertResult RadixCache::insert_checked(std::string_view extra_key,
                                        std::span<const int32_t> tokens,
                                        std::span<const SlotIndex> value,
                                        const InsertOptions& options) {
  const int32_t ns = ns_lookup(extra_key);  // -1: a new namespace, nothing cached yet
  // Validate before any change, each page once against the allocator: a read-only peek finds the
  // matched length, records the path and the duplicates (as page runs); the path is applied
  // after the checks. The value's page structure was checked by the caller, which left its page
  // runs in scratch_value_runs_.
  const bool transfer = options.ownership == SlotOwnership::kTransfer;
  scratch_dups_.clear();
  scratch_path_.clear();
  const int64_t pre = ns < 0 ? 0 : peek_prefix_len(ns, tokens, value, transfer);
  const auto n = static_cast<int64_t>(value.size());
  scratch_runs_.clear();
  runs_in(pre, n, scratch_runs_);  // the new leaf's pages
  // A page the tree already stores cannot be stored again, nor handed over as a duplicate.
  const size_t tree_bits = tree_pages_.size() * 64;
  for (const std::vector<kv::PageRun>* runs : {&scratch_runs_, &scratch_dups_}) {
    for (const kv::PageRun& r : *runs) {
      // Pages outside the pool are left to the allocator's checks below.
      PAGODA_REQUIRE(r.first < 0 || static_cast<size_t>(r.first) + static_cast<size_t>(r.count) >
                                        tree_bits ||
                         !any_in_tree(static_cast<size_t>(r.first), static_cast<size_t>(r.count)),
                     kInvalidArgument,
                     "insert: slots of pages [{}, {}) name pages the tree already stores elsewhere",
                     r.first, int64_t{r.first} + r.count);
    }
  }
  if (!transfer) {
    scratch_known_.clear();
    runs_in(0, pre, scratch_known_);
    allocator_->require_held_pages(scratch_known_);
    allocator_->retain_pages(scratch_runs_);  // validates; the first change
  } else if (scratch_dups_.empty()) {
    allocator_->require_held_pages(scratch_runs_);  // the tree adopts the caller's references
  } else {
    // One validation of everything the caller hands over (duplicates and new pages together, so
    // a page named in both is caught), then the duplicates go back to the allocator.
    const size_t num_dups = scratch_dups_.size();
    scratch_dups_.insert(scratch_dups_.end(), scratch_runs_.begin(), scratch_runs_.end());
    allocator_->require_held_pages(scratch_dups_);
    allocator_->free_pages(std::span<const kv::PageRun>(scratch_dups_).first(num_dups));
  }
  ++clock_;
  const int32_t ns_id = ns >= 0 ? ns : ns_intern(extra_key);
  PrefixNode* last = insert_apply(ns_id, tokens, value, options, pre);
  return InsertResult{.prefix_len = pre,
                      .total_len = static_cast<int64_t>(tokens.size()),
                      .last_node = NodeHandle{last, last->id}};
}

InsertResult RadixCache::insert(const RadixKey& key, std::span<const SlotIndex> slots,
                                InsertOptions options) {
  const int64_t len = aligned(static_cast<int64_t>(key.tokens.size()));
  PAGODA_REQUIRE(static_cast<int64_t>(slots.size()) >= len, kInvalidArgument,
                 "insert: {} slots for {} page-aligned tokens", slots.size(), len);
  const auto value = slots.first(static_cast<size_t>(len));
  value_runs(value);
  if (len == 0) {
    ++clock_;
    return InsertResult{.prefix_len = 0, .total_len = 0, .last_node = {root_, root_->id}};
  }
  return insert_checked(key.extra_key, key.tokens.first(static_cast<size_t>(len)), value, options);
}

void RadixCache::inc_lock_ref(NodeHandle handle) {
  for (PrefixNode* n = require_live(handle); n != root_; n = n->parent) {
    if (n->lock_ref++ == 0) {
      evictable_size_ -= n->len;
      protected_size_ += n->len;
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
      evictable_size_ += n->len;
      protected_size_ -= n->len;
      sync_evictable(n);
    }
  }
}

int32_t RadixCache::lock_ref(NodeHandle handle) const { return require_live(handle)->lock_ref; }

int64_t RadixCache::node_length(NodeHandle handle) const { return require_live(handle)->len; }

bool RadixCache::is_live(NodeHandle handle) const {
  return handle.node != nullptr && handle.id != 0 && handle.node->id == handle.id;
}

NodeHandle RadixCache::parent(NodeHandle handle) const {
  const PrefixNode* n = require_live(handle);
  return n == root_ ? NodeHandle{} : NodeHandle{n->parent, n->parent->id};
}

NodeHandle RadixCache::root() const { return NodeHandle{root_, root_->id}; }

int64_t RadixCache::node_depth(NodeHandle handle) const {
  int64_t depth = 0;
  for (const PrefixNode* n = require_live(handle); n != root_; n = n->parent) depth += n->len;
  return depth;
}

void RadixCache::path_tail_slots(NodeHandle handle, int64_t max_tokens,
                                 std::vector<SlotIndex>& out) const {
  PAGODA_REQUIRE(max_tokens >= 0, kInvalidArgument, "path_tail_slots: max_tokens {} < 0",
                 max_tokens);
  std::vector<const PrefixNode*> path;  // deepest first, until max_tokens are covered
  int64_t covered = 0;
  for (const PrefixNode* n = require_live(handle); n != root_ && covered < max_tokens;
       n = n->parent) {
    path.push_back(n);
    covered += n->len;
  }
  size_t filled = 0;
  for (auto it = path.rbegin(); it != path.rend(); ++it) append_slots(*it, (*it)->len, &out, filled);
  out.resize(filled);
  const int64_t skip = std::max<int64_t>(0, covered - max_tokens);
  out.erase(out.begin(), out.begin() + skip);
}

int64_t RadixCache::evict(int64_t num_tokens) {
  PAGODA_REQUIRE(num_tokens >= 0, kInvalidArgument, "evict({}) < 0", num_tokens);
  // A large eviction settles every lazily raised key first (one pass, then an O(n) heapify)
  // instead of one extra sift per stale entry it meets at the top.
  if (heap_.size() >= kSettleMinLeaves && num_tokens >= evictable_size_ / 8) settle_heap();
  int64_t evicted = 0;
  while (evicted < num_tokens && !heap_.empty()) {
    HeapEntry& top = heap_.front();
    const EvictionKey key = policy_->key(top.node->stats);
    if (key != top.key) {  // a lazily raised key: settle it and look again
      top.key = key;
      heap_sift(0);
      continue;
    }
    PrefixNode* leaf = top.node;
    // Start the loads the removal needs (bitset word, child-table slot, parent) before the heap
    // sift, so their misses overlap it.
    if (leaf->run_page >= 0) {
      __builtin_prefetch(&tree_pages_[static_cast<size_t>(leaf->run_page) / 64]);
    }
    __builtin_prefetch(&children_[leaf->entry_key & (children_.size() - 1)]);
    __builtin_prefetch(leaf->parent);
    heap_remove(leaf);
    // The likely next victim: its node loads while this one is taken apart.
    if (!heap_.empty()) __builtin_prefetch(&heap_.front().node->stats);
    PAGODA_CHECK(leaf->lock_ref == 0 && leaf->num_children == 0, "evicting node {}", leaf->id);
    scratch_evict_.clear();
    if (leaf->run_page >= 0) {  // one run: no slots to read
      scratch_evict_.push_back(kv::PageRun{static_cast<int32_t>(leaf->run_page),
                                           static_cast<int32_t>(leaf->len / page_size())});
    } else {
      collect_page_runs({leaf->stored_value(), static_cast<size_t>(leaf->len)}, scratch_evict_);
    }
    allocator_->free_pages(scratch_evict_);
    for (const kv::PageRun& r : scratch_evict_) {
      set_in_tree(static_cast<size_t>(r.first), static_cast<size_t>(r.count), false);
    }
    evicted += leaf->len;
    evictable_size_ -= leaf->len;
    ++stats_.evicted_nodes;
    emit(CacheEvent::kRemoved, leaf);
    PrefixNode* parent = leaf->parent;
    unlink_child(leaf);
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
  const auto kv = table().read(req.req_slot, 0, kv_len);
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
    const InsertResult r =
        insert(RadixKey{std::span(req.tokens).first(key_slots.size()), req.extra_key}, key_slots,
               InsertOptions{.priority = req.priority});
    PAGODA_CHECK_GE(r.prefix_len, req.cache_protected_len);
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
  const auto kv = table().read(req.req_slot, 0, fill_len);
  scratch_kv_.assign(kv.begin(), kv.end());
  const std::span<const SlotIndex> all(scratch_kv_);
  const auto protected_len = static_cast<size_t>(req.cache_protected_len);
  allocator_->require_held_runs(all.subspan(protected_len));
  require_request_owns(all.subspan(protected_len));
  const auto key_len = static_cast<size_t>(aligned(fill_len));
  const auto key_slots = all.first(key_len);
  require_whole_pages(key_slots);
  const auto key_tokens = std::span<const int32_t>(req.tokens).first(key_len);
  int64_t prefix_len = 0;
  if (key_len == 0) {
    ++clock_;
  } else {
    prefix_len = insert(RadixKey{key_tokens, req.extra_key}, key_slots,
                        InsertOptions{.priority = req.priority, .kind = InsertKind::kChunked})
                     .prefix_len;
  }
  PAGODA_CHECK_GE(prefix_len, req.cache_protected_len);
  allocator_->free(all.subspan(protected_len, key_len - protected_len));
  // Re-match: the request now points at the tree's slots for [0, key_len).
  size_t filled = 0;
  PrefixNode* node = key_len == 0 ? root_
                                  : match_walk(ns_lookup(req.extra_key), key_tokens,
                                               &scratch_tree_, filled);
  scratch_tree_.resize(filled);
  PAGODA_CHECK_EQ(scratch_tree_.size(), key_len);
  table().write(req.req_slot, req.cache_protected_len,
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

std::vector<EvictableLeaf> RadixCache::evictable_leaves() const {
  std::vector<std::pair<uint64_t, EvictableLeaf>> found;
  for (const ChildEntry& e : children_) {
    const PrefixNode* n = e.node;
    if (n == nullptr || n->lock_ref != 0 || n->num_children != 0) continue;
    found.emplace_back(n->id, EvictableLeaf{.node = NodeHandle{const_cast<PrefixNode*>(n), n->id},
                                            .key = policy_->key(n->stats),
                                            .length = n->len});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.second.key < b.second.key || (a.second.key == b.second.key && a.first < b.first);
  });
  std::vector<EvictableLeaf> out;
  out.reserve(found.size());
  for (const auto& [id, leaf] : found) out.push_back(leaf);
  return out;
}

void RadixCache::check_integrity() const {
  PAGODA_CHECK(root_->len == 0 && root_->lock_ref == 1 && heap_pos_[root_->index] == -1);
  const int64_t p = page_size();
  PAGODA_CHECK((children_.size() & (children_.size() - 1)) == 0 &&
               children_.size() >= kMinChildTable);
  PAGODA_CHECK(num_children_ * 2 <= children_.size(), "child table over half full");
  // The child table: every entry is a live node under its key, reachable by a lookup.
  std::unordered_map<const PrefixNode*, std::vector<const PrefixNode*>> kids;
  size_t entries = 0;
  for (const ChildEntry& e : children_) {
    if (e.node == nullptr) continue;
    ++entries;
    const PrefixNode* c = e.node;
    PAGODA_CHECK(c->id != 0 && c->parent != nullptr, "recycled or orphan node in the table");
    PAGODA_CHECK(c->len >= p, "node {} key shorter than a page", c->id);
    PAGODA_CHECK_EQ(c->hash, page_hash(c->ns, c->key()));
    PAGODA_CHECK_EQ(e.key, child_key(c->parent, c->hash));
    PAGODA_CHECK_EQ(e.key, c->entry_key);
    PAGODA_CHECK(find_child(c->parent, c->ns, c->key()) == c, "node {} not found by lookup",
                 c->id);
    kids[c->parent].push_back(c);
  }
  PAGODA_CHECK_EQ(entries, num_children_);
  int64_t evictable = 0, protected_tokens = 0, nodes = 0, leaves = 0;
  std::unordered_map<int32_t, int32_t> tree_refs;
  std::vector<const PrefixNode*> stack{root_};
  while (!stack.empty()) {
    const PrefixNode* node = stack.back();
    stack.pop_back();
    int64_t child_locks = 0;
    const auto it = kids.find(node);
    const size_t num_kids = it == kids.end() ? 0 : it->second.size();
    PAGODA_CHECK_EQ(static_cast<size_t>(node->num_children), num_kids);
    if (it != kids.end()) {
      for (const PrefixNode* c : it->second) {
        PAGODA_CHECK(node == root_ || c->ns == node->ns, "namespace changes below the root");
        child_locks += c->lock_ref;
        stack.push_back(c);
      }
    }
    if (node == root_) continue;
    ++nodes;
    PAGODA_CHECK(node->len > 0 && node->len % p == 0, "node {} key length {}", node->id,
                 node->len);
    std::vector<SlotIndex> slots;
    size_t filled = 0;
    append_slots(node, node->len, &slots, filled);
    const SlotIndex* v = slots.data();
    for (int64_t i = 0; i < node->len; ++i) {
      PAGODA_CHECK_EQ(v[i], v[i - i % p] + static_cast<SlotIndex>(i % p));
      if (i % p == 0) {
        PAGODA_CHECK_EQ(v[i] % p, 0);
        ++tree_refs[static_cast<int32_t>(v[i] / p)];
      }
    }
    if (node->run_page >= 0) {
      PAGODA_CHECK_EQ(static_cast<int64_t>(page_of(v[0])), node->run_page);
      PAGODA_CHECK_EQ(static_cast<int64_t>(page_of(v[node->len - p])),
                      node->run_page + node->len / p - 1);
      for (int64_t i = p; i < node->len; i += p) PAGODA_CHECK_EQ(v[i], v[i - p] + p);
    }
    PAGODA_CHECK(node->lock_ref >= child_locks, "node {} lock_ref {} < children's {}", node->id,
                 node->lock_ref, child_locks);
    (node->lock_ref > 0 ? protected_tokens : evictable) += node->len;
    const bool evictable_leaf = node->lock_ref == 0 && node->num_children == 0;
    PAGODA_CHECK_EQ(heap_pos_[node->index] >= 0, evictable_leaf);
    if (evictable_leaf) {
      ++leaves;
      const auto pos = static_cast<size_t>(heap_pos_[node->index]);
      PAGODA_CHECK(pos < heap_.size() && heap_[pos].node == node && heap_[pos].id == node->id,
                   "leaf {} not at its heap position", node->id);
      PAGODA_CHECK(!(policy_->key(node->stats) < heap_[pos].key),
                   "heap key above the policy key, node {}", node->id);
    }
  }
  PAGODA_CHECK_EQ(evictable, evictable_size_);
  PAGODA_CHECK_EQ(protected_tokens, protected_size_);
  PAGODA_CHECK_EQ(nodes, num_nodes_);
  PAGODA_CHECK_EQ(static_cast<int64_t>(arena_.blocks_in_use()), nodes);  // one block per node
  PAGODA_CHECK_EQ(static_cast<size_t>(nodes), num_children_);
  PAGODA_CHECK_EQ(leaves, static_cast<int64_t>(heap_.size()));
  for (size_t i = 1; i < heap_.size(); ++i) {
    PAGODA_CHECK(!heap_less(heap_[i], heap_[(i - 1) / 2]), "heap order broken at {}", i);
  }
  for (size_t page = 0; page < tree_pages_.size() * 64; ++page) {
    auto it = tree_refs.find(static_cast<int32_t>(page));
    PAGODA_CHECK_EQ(in_tree(page) ? 1 : 0, it == tree_refs.end() ? 0 : it->second);
  }
  for (const auto& [page, refs] : tree_refs) {
    PAGODA_CHECK(allocator_->refcount(PageId(page)) >= refs,
                 "page {}: allocator refcount {} < {} tree references", page,
                 allocator_->refcount(PageId(page)), refs);
  }
}

}  // namespace pagoda::cache
