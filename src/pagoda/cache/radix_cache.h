#pragma once
/// RadixCache: a page-aligned radix tree from token ids (+ namespace) to KV slots, shared between
/// requests (sglang_spec §4). Contract: prefix_cache.h and docs/design/cache.md.
///
/// Structure. Every non-root node holds a key segment and its slots (equal lengths, a positive
/// multiple of page_size, whole pages) in one KeyArena block, released when the node is evicted;
/// when the slots are one run of consecutive pages (the usual case) only the tokens and the run's
/// first page are stored and the slots are generated.
/// Children live in one open-addressing table for the whole tree, keyed by (parent, hash of
/// (namespace, first page of the child's key)) and verified on lookup. Node boundaries, splits and
/// matches are page aligned. Locks (inc_lock_ref) count requests whose path runs through a node; a
/// node with lock_ref 0 is evictable, and unlocked childless nodes sit in an intrusive binary heap
/// ordered by (EvictionPolicy key, node id) (heap positions in a dense array). A touch that
/// raises a leaf's key is applied lazily when the leaf reaches the top (policy keys never drop
/// when a node is used; a drop is applied at once), so a match does not sift the heap. Nodes come from
/// an internal pool and are reused, so stale handles are detected by a generation id.
///
/// Costs. match_prefix: one hash probe and one memcmp-style comparison of the whole edge per node
/// on the path, one memcpy of its slots; O(log leaves) to refresh a touched leaf; no heap
/// allocation into a warm caller buffer (a split allocates the new node's buffer). insert: the
/// same plus one block for the new leaf, one vectorised pass over the value for its page runs,
/// and O(pages) page validation of runs, done once. evict: O(log leaves) per leaf plus the
/// allocator's O(pages) free (a large evict settles lazy keys in one O(leaves) rebuild first).
///
/// The allocator is any kv::PageRefs (kv::PageAllocator in production); the request table is only
/// needed by cache_finished_req / cache_unfinished_req / admit.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagoda/cache/eviction_policy.h"
#include "pagoda/cache/key_arena.h"
#include "pagoda/cache/prefix_cache.h"

namespace pagoda::cache {

/// An evictable leaf as the eviction policy sees it (introspection for tests and tools).
struct EvictableLeaf {
  NodeHandle node;
  EvictionKey key;
  int64_t length = 0;  ///< tokens evicting it frees
};

class RadixCache final : public PrefixCache {
 public:
  /// An empty tree over `allocator` (its page_size is the tree's) and `table`. `policy` defaults
  /// to LRU. All three must outlive the cache; the cache never owns pages beyond its references.
  RadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
             std::unique_ptr<EvictionPolicy> policy = nullptr);
  /// An empty tree over any page-reference owner and optionally no request table (match /
  /// insert / locks / evict only; cache_*_req throw kFailedPrecondition without one).
  explicit RadixCache(kv::PageRefs& pages, std::unique_ptr<EvictionPolicy> policy = nullptr,
                      kv::ReqToTokenTable* table = nullptr);
  ~RadixCache() override;

  std::string_view name() const override { return "radix"; }
  const EvictionPolicy& policy() const { return *policy_; }
  /// Installs an observer of stored / removed nodes (replaces any previous one; nullptr clears).
  void set_event_listener(CacheEventListener listener) { listener_ = std::move(listener); }

  using PrefixCache::match_prefix;
  PrefixMatch match_prefix(const RadixKey& key, int64_t max_prefix_len,
                           std::vector<SlotIndex>& out) override;
  InsertResult insert(const RadixKey& key, std::span<const SlotIndex> slots,
                      InsertOptions options = {}) override;
  void inc_lock_ref(NodeHandle node) override;
  void dec_lock_ref(NodeHandle node) override;
  void cache_finished_req(CacheRequest& req, int64_t kv_len,
                          FinishPolicy policy = FinishPolicy::kInsert) override;
  void cache_unfinished_req(CacheRequest& req, int64_t fill_len) override;
  int64_t evict(int64_t num_tokens) override;
  int64_t evictable_size() const override { return evictable_size_; }
  int64_t protected_size() const override { return protected_size_; }
  const CacheStats& stats() const override { return stats_; }
  void check_integrity() const override;

  /// Number of nodes, root excluded.
  int64_t num_nodes() const { return num_nodes_; }
  /// lock_ref of a node (the root reports 1). Throws on a stale handle.
  int32_t lock_ref(NodeHandle node) const;
  /// Tokens stored in the subtree edge of `node` (its key length; 0 for the root). Throws on a
  /// stale handle.
  int64_t node_length(NodeHandle node) const;
  /// The slots of the last min(max_tokens, depth) positions of the path root -> `node` (depth =
  /// the node's end position), in position order, into `out` (overwritten). O(path nodes +
  /// tokens written). Throws on a stale handle.
  void path_tail_slots(NodeHandle node, int64_t max_tokens, std::vector<SlotIndex>& out) const;
  /// The node's end position (tokens from the root to the end of its edge). Throws on a stale
  /// handle.
  int64_t node_depth(NodeHandle node) const;
  /// Whether `handle` names a node still in the tree (false once it was evicted; the root is
  /// always live). Never throws.
  bool is_live(NodeHandle handle) const;
  /// The parent of `node` (no node for the root). A split keeps a node's handle on the lower
  /// part (the edge's end) and gives the upper part a new node. Throws on a stale handle.
  NodeHandle parent(NodeHandle node) const;
  /// The root (the node of an empty match).
  NodeHandle root() const;
  /// Every evictable leaf in eviction order (policy key, then node id), computed by a walk of the
  /// tree, independently of the internal heap; evict() must take them in this order.
  /// O(nodes log nodes); for tests and tools.
  std::vector<EvictableLeaf> evictable_leaves() const;
  /// Evicts every unlocked node; returns the tokens evicted.
  int64_t evict_all() { return evict(std::numeric_limits<int64_t>::max()); }

 private:
  /// One entry of the child table; `node == nullptr` marks an empty entry.
  struct ChildEntry {
    uint64_t key = 0;
    PrefixNode* node = nullptr;
  };
  /// An evictable leaf in the heap; the key is kept inline so sifting reads only the array.
  struct HeapEntry {
    EvictionKey key;
    uint64_t id;
    PrefixNode* node;
    uint32_t index;  ///< node->index: moving an entry updates heap_pos_, not the node
  };
  /// One edge of a peeked insert path: the child and how many of its tokens matched.
  struct PathStep {
    PrefixNode* child;
    int64_t len;
  };
  /// A maximal run of consecutive whole pages in an insert value, from token position `pos`.
  struct ValueRun {
    int64_t pos;
    int64_t first_page;
    int64_t pages;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };

  PrefixNode* new_node(PrefixNode* parent, int32_t ns);
  void recycle(PrefixNode* node);
  PrefixNode* require_live(NodeHandle handle) const;
  uint64_t page_hash(int32_t ns, const int32_t* first_page) const;
  uint64_t child_key(const PrefixNode* parent, uint64_t page_hash) const;
  PrefixNode* find_child(const PrefixNode* node, int32_t ns, const int32_t* page) const;
  /// The same with page_hash(ns, page) already computed.
  PrefixNode* find_child_hashed(const PrefixNode* node, int32_t ns, const int32_t* page,
                                uint64_t hash) const;
  void link_child(PrefixNode* parent, PrefixNode* child);
  void unlink_child(PrefixNode* child);
  void relink_child(PrefixNode* old_child, PrefixNode* new_child);
  void rehash_children(size_t capacity);
  PrefixNode* split(PrefixNode* child, int64_t len);
  /// Walks the tree without changing it: the matched length of `tokens` (page aligned), the path
  /// (scratch_path_), and the caller slots that duplicate tree pages (scratch_dups_, when
  /// `collect_dups`; needs the value's runs in scratch_value_runs_).
  int64_t peek_prefix_len(int32_t ns, std::span<const int32_t> tokens,
                          std::span<const SlotIndex> slots, bool collect_dups);
  /// Writes the matched slots to (*out)[0, filled) (see append_slots); returns the deepest
  /// matched node.
  PrefixNode* match_walk(int32_t ns, std::span<const int32_t> tokens, std::vector<SlotIndex>* out,
                         size_t& filled);
  /// Applies an insert along scratch_path_ (recorded by peek_prefix_len, `pos` tokens matched;
  /// the new pages' runs in scratch_runs_):
  /// touches, hit counts, priorities, the split, then the new leaf. Returns the last node.
  PrefixNode* insert_apply(int32_t ns, std::span<const int32_t> tokens,
                           std::span<const SlotIndex> slots, const InsertOptions& options,
                           int64_t pos);
  /// Validates against the allocator (before any change), then inserts.
  InsertResult insert_checked(std::string_view extra_key, std::span<const int32_t> tokens,
                              std::span<const SlotIndex> value, const InsertOptions& options);
  /// Page structure of an insert value: every page-sized block is one whole page (no allocator).
  void require_whole_pages(std::span<const SlotIndex> slots) const;
  /// The same check, leaving the value's maximal page runs in scratch_value_runs_: one
  /// vectorised pass over the slots (64 per step), then per-page checks only to name an error.
  void value_runs(std::span<const SlotIndex> slots);
  /// Calls f(position, first_page, pages) for each part of a value run inside token positions
  /// [begin, end) (page aligned).
  template <typename F>
  void for_each_run_in(int64_t begin, int64_t end, F&& f) const {
    const int64_t p = page_size();
    for (const ValueRun& r : scratch_value_runs_) {
      const int64_t lo = std::max(begin, r.pos);
      const int64_t hi = std::min(end, r.pos + r.pages * p);
      if (lo < hi) f(lo, r.first_page + (lo - r.pos) / p, (hi - lo) / p);
    }
  }
  /// Appends the page runs of value positions [begin, end) to `out`.
  void runs_in(int64_t begin, int64_t end, std::vector<kv::PageRun>& out) const;
  /// Appends the page runs of whole-page `slots` to `out`.
  void collect_page_runs(std::span<const SlotIndex> slots, std::vector<kv::PageRun>& out) const;
  /// Appends pages [first, first + count) to `runs`, merging with the last run when adjacent.
  static void add_page(std::vector<kv::PageRun>& runs, int64_t first, int64_t count);
  /// Adds to scratch_dups_ the pages of mine[0, n) (whole pages) that differ from node's slots.
  /// (mine = the value at position pos; the value's runs are in scratch_value_runs_.)
  void collect_dups_of(const PrefixNode* node, const SlotIndex* mine, int64_t pos, int64_t n);
  /// Writes node's first n slots to (*out)[filled, filled + n), growing *out only when it is
  /// shorter, and advances `filled` (generated for a one-run node, copied otherwise).
  void append_slots(const PrefixNode* node, int64_t n, std::vector<SlotIndex>* out,
                    size_t& filled) const;
  /// Throws kFailedPrecondition unless the request holds its own reference (beyond the tree's)
  /// on every page of `own` (catches a double finish that would drop the tree's reference).
  void require_request_owns(std::span<const SlotIndex> own) const;
  int32_t ns_lookup(std::string_view extra_key) const;
  int32_t ns_intern(std::string_view extra_key);
  int64_t aligned(int64_t len) const { return len / page_size() * page_size(); }
  bool in_tree(size_t page) const { return (tree_pages_[page / 64] >> (page % 64)) & 1; }
  bool any_in_tree(size_t page, size_t count) const;
  void set_in_tree(size_t page, size_t count, bool on);
  /// Calls f(first_slot, first_page (int64), num_pages) for each maximal run of consecutive whole pages
  /// in `slots` (page-aligned runs of page_size slots): a loop of compares, not one call per page.
  template <typename F>
  void for_each_page_run(std::span<const SlotIndex> slots, F&& f) const {
    const auto p = static_cast<size_t>(page_size());
    const SlotIndex* v = slots.data();
    const size_t n = slots.size();
    for (size_t i = 0; i < n;) {
      size_t j = i + p;
      while (j < n && int64_t{v[j]} == int64_t{v[j - p]} + static_cast<int64_t>(p)) j += p;
      f(v[i], page_id(v[i]), (j - i) / p);
      i = j;
    }
  }
  /// slot / page_size (a shift when page_size is a power of two: no division per page).
  size_t page_of(SlotIndex slot) const { return static_cast<size_t>(page_id(slot)); }
  /// The same, signed (a negative slot gives a negative page, which the allocator rejects).
  int64_t page_id(SlotIndex slot) const {
    return page_shift_ >= 0 ? int64_t{slot} >> page_shift_ : int64_t{slot} / page_size();
  }
  void touch(PrefixNode* node);
  /// Puts `node` in or out of the evictable-leaf heap according to its state, refreshing its key.
  void sync_evictable(PrefixNode* node);
  static bool heap_less(const HeapEntry& a, const HeapEntry& b) {
    return a.key < b.key || (a.key == b.key && a.id < b.id);
  }
  void heap_place(const HeapEntry& entry, size_t pos) {
    heap_[pos] = entry;
    heap_pos_[entry.index] = static_cast<int32_t>(pos);
  }
  /// Moves heap_[pos] up or down to its place (the rest of the heap ordered).
  void heap_sift(size_t pos);
  /// Moves heap_[pos] down only (its subtrees ordered).
  void heap_sift_down(size_t pos);
  void heap_remove(PrefixNode* node);
  /// Recomputes every heap key from its node's stats and rebuilds the heap (O(n)).
  void settle_heap();
  void emit(CacheEvent event, const PrefixNode* node);

  std::unique_ptr<EvictionPolicy> policy_;
  CacheEventListener listener_;
  int32_t page_shift_ = -1;  ///< log2(page_size) when a power of two
  KeyArena arena_;  ///< node buffers
  /// The node pool: chunks of kNodeChunk nodes, filled in order (node->index is the position).
  std::vector<std::unique_ptr<PrefixNode[]>> node_chunks_;
  std::vector<PrefixNode*> free_nodes_;
  PrefixNode* root_ = nullptr;
  std::vector<ChildEntry> children_;  ///< open addressing, linear probing, power-of-two size
  size_t num_children_ = 0;
  std::vector<HeapEntry> heap_;  ///< evictable leaves, min-heap by (evict key, id)
  /// heap_pos_[node->index]: the node's position in heap_, -1 when not in it. A dense array, so
  /// a sift touches no node.
  std::vector<int32_t> heap_pos_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> namespaces_;
  int64_t evictable_size_ = 0;
  int64_t protected_size_ = 0;
  int64_t num_nodes_ = 0;
  uint64_t clock_ = 0;
  uint64_t next_id_ = 1;
  CacheStats stats_;
  /// One bit per page: the tree holds a reference on it (a page is stored in at most one node).
  std::vector<uint64_t> tree_pages_;
  std::vector<SlotIndex> scratch_kv_;
  std::vector<SlotIndex> scratch_tree_;
  std::vector<kv::PageRun> scratch_dups_;  ///< pages handed back by a kTransfer insert
  std::vector<kv::PageRun> scratch_known_;
  std::vector<ValueRun> scratch_value_runs_;
  std::vector<kv::PageRun> scratch_evict_;
  std::vector<SlotIndex> scratch_emit_;
  std::vector<PathStep> scratch_path_;
  /// Runs of consecutive pages (first page, count) of the leaf being inserted.
  std::vector<kv::PageRun> scratch_runs_;
};

}  // namespace pagoda::cache
