#pragma once
/// MambaRadixCache: the prefix cache of a hybrid model, attention plus Mamba2 layers (SGLang's
/// MambaRadixCache; sglang_memory_tiers.md §3b; docs/design/state_pool.md "Prefix reuse").
/// A RadixCache keeps the attention layers' KV pages. A linear layer has no per-token KV: a hit
/// must also give back the recurrent state that the skipped tokens would have built. So some
/// tree nodes hold a snapshot, one kv::StatePool slot with every linear layer's state after the
/// node's last token.
///
/// Rules.
///  - match_prefix: the RadixCache's match, cut back to the deepest node on its path that holds
///    a snapshot (the root, 0 tokens, when none does). The slots are cut to that length.
///  - admit: that match, the lock, then a copy of the node's snapshot into req.state_slot (copy
///    on write: the node keeps its snapshot). A request admitted here must hold a state slot
///    (req.state_slot >= 0, zeroed: a miss starts from the zero state).
///  - cache_finished_req (kInsert) and cache_unfinished_req: the RadixCache's, then a snapshot
///    of req.state_slot for the node ending at the request's KV length, when that length is page
///    aligned (always at page 1; chunk ends are aligned) and the node has none yet. A finish at
///    an unaligned length snapshots req.aligned_state_slot instead, for the node ending at the
///    length rounded down to a page, when req.aligned_state_len is that length. The slot comes
///    from the pool; when none is free the least recently used snapshot is dropped for it, and
///    when every slot is a request's there is no snapshot. kNoInsert takes none.
///  - A node evicted from the tree gives its slot back (found by a sweep at the next evict or
///    snapshot: handles are generation checked). evict_states drops least recently used
///    snapshots only; their KV stays. A split leaves the snapshot on the lower node (the edge's
///    end), so the new upper node has none.
///  - Snapshots are never locked: a hit copies the state at admission.
///  - insert() (no request) stores KV only: such a prefix is not a hit until a request's finish
///    or chunk end snapshots it.
///
/// Costs: a match walks the path up from the deepest matched node (O(path nodes)) and does one
/// hash lookup per node; a snapshot is one StatePool::copy_slot; choosing the snapshot to drop
/// scans the snapshots (O(snapshots)).
///
/// Stats: match_calls, queried_tokens and matched_tokens count the cut-back matches; inserted
/// and evicted counts are the tree's. Thread rules: as RadixCache (the scheduler thread owns the
/// cache, the tree, the allocator, the table and the state pool).

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagoda/cache/prefix_cache.h"
#include "pagoda/cache/radix_cache.h"
#include "pagoda/kv/state_pool.h"

namespace pagoda::cache {

/// State slots one running request holds: its own, plus the aligned-state slot
/// (CacheRequest::aligned_state_slot) when the snapshot cache runs at page > 1.
constexpr int32_t request_state_slots(bool snapshot_cache, int page_size) {
  return snapshot_cache && page_size > 1 ? 2 : 1;
}

/// Snapshot counters, cumulative since construction.
struct StateSnapshotStats {
  int64_t taken = 0;      ///< snapshots copied into a node's slot
  int64_t restored = 0;   ///< hits that copied a snapshot into a request's slot
  int64_t dropped = 0;    ///< snapshots dropped to free a slot (evict_states)
  int64_t released = 0;   ///< snapshots released because their node left the tree
  int64_t no_slot = 0;    ///< snapshots not taken: every slot was a request's
  int64_t unaligned = 0;  ///< finishes not snapshotted: KV length not page aligned and no
                          ///< aligned state at its last page boundary
};

class MambaRadixCache final : public PrefixCache {
 public:
  /// An empty cache over `allocator` (the tree's pages), `table` and `states` (the model's state
  /// pool, shared with the scheduler's requests). All three must outlive it.
  MambaRadixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table,
                  kv::StatePool& states);
  /// Leaves the pool alone: the slots the snapshots hold stay held (the engine drops the pool
  /// with the cache).
  ~MambaRadixCache() override = default;

  std::string_view name() const override { return "mamba_radix"; }

  using PrefixCache::match_prefix;
  PrefixMatch match_prefix(const RadixKey& key, int64_t max_prefix_len,
                           std::vector<SlotIndex>& out) override;
  InsertResult insert(const RadixKey& key, std::span<const SlotIndex> slots,
                      InsertOptions options = {}) override;
  void inc_lock_ref(NodeHandle node) override { tree_.inc_lock_ref(node); }
  void dec_lock_ref(NodeHandle node) override { tree_.dec_lock_ref(node); }
  void cache_finished_req(CacheRequest& req, int64_t kv_len,
                          FinishPolicy policy = FinishPolicy::kInsert) override;
  void cache_unfinished_req(CacheRequest& req, int64_t fill_len) override;
  int64_t evict(int64_t num_tokens) override;
  int64_t evictable_size() const override { return tree_.evictable_size(); }
  int64_t protected_size() const override { return tree_.protected_size(); }
  const CacheStats& stats() const override;
  /// The tree's checks, then: every snapshot's slot is held, no slot is named twice.
  void check_integrity() const override;
  /// Match, lock and restore (see the rules). Throws kInvalidArgument (nothing changed) when
  /// req.state_slot is not a held slot of the pool.
  void admit(CacheRequest& req, int64_t max_prefix_len) override;

  /// Drops up to `n` snapshots, least recently used (taken or restored) first, after releasing
  /// those of evicted nodes; returns the slots freed (those released count too).
  int32_t evict_states(int32_t n);
  /// The pool slots the snapshots hold, one entry each (for StatePool::leaked), including those
  /// of evicted nodes not yet swept.
  std::vector<int32_t> state_slots() const;
  /// Snapshots held, including those of evicted nodes not yet swept.
  int32_t num_states() const { return static_cast<int32_t>(snapshots_.size()); }
  /// Whether live `node` holds a snapshot.
  bool has_state(NodeHandle node) const;
  const StateSnapshotStats& state_stats() const { return state_stats_; }
  /// The KV tree (introspection for tests and tools).
  const RadixCache& tree() const { return tree_; }

 private:
  struct Snapshot {
    NodeHandle node;
    int32_t slot = -1;
    uint64_t last_use = 0;
  };
  /// The deepest node at or above `node` with a live snapshot (the root when none).
  NodeHandle state_ancestor(NodeHandle node) const;
  /// Snapshots `slot` (the request's state after `len` tokens) for the node ending at `len`
  /// (the rules above).
  void snapshot(const CacheRequest& req, int64_t len, int32_t slot);
  /// Releases the snapshots of evicted nodes; returns how many.
  int32_t sweep();

  RadixCache tree_;
  kv::StatePool* states_;
  std::unordered_map<uint64_t, Snapshot> snapshots_;  ///< by node id
  uint64_t clock_ = 0;
  std::vector<SlotIndex> scratch_;
  CacheStats counts_;             ///< this cache's match counters
  mutable CacheStats merged_;     ///< stats(): counts_ with the tree's insert / evict counters
  StateSnapshotStats state_stats_;
};

}  // namespace pagoda::cache
