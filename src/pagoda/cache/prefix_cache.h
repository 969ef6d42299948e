#pragma once
/// PrefixCache: the interface every prefix cache implements (SGLang's BasePrefixCache; sglang_spec
/// §4). RadixCache shares KV pages between requests; ChunkCache shares nothing. Normative
/// contract, ownership and state machine: docs/design/cache.md.
///
/// Ownership. Pages are reference counted by kv::PageAllocator. A request holds one reference to
/// every page it allocated (positions [cache_protected_len, seq_len) of its req-to-token row); the
/// tree holds one reference to every page stored in its nodes. Positions [0, cache_protected_len)
/// of a request point at tree pages that the request protects with a lock (inc_lock_ref), not a
/// reference. cache_finished_req / cache_unfinished_req move pages from the request to the tree.
///
/// Thread rules: not thread-safe; the scheduler thread owns the cache, its allocator and table.

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/core/ids.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"

namespace pagoda::cache {

/// A tree node. Opaque outside RadixCache.
struct PrefixNode;

/// A handle to a tree node, valid until the node is evicted (a stale handle is detected through
/// its generation `id` and rejected with kFailedPrecondition). A default handle is "no node".
struct NodeHandle {
  PrefixNode* node = nullptr;
  uint64_t id = 0;
  bool has_node() const { return node != nullptr; }
  bool operator==(const NodeHandle&) const = default;
};

/// A lookup key: token ids plus a namespace (SGLang's extra_key: adapter id, cache salt...). Keys
/// in different namespaces never share nodes. Non-owning.
struct RadixKey {
  std::span<const int32_t> tokens;
  std::string_view extra_key;
};

/// No cap on a match.
inline constexpr int64_t kNoPrefixLimit = std::numeric_limits<int64_t>::max();

/// The scheduler's match cap (§4.2): at least one token is computed, so at most input_len - 1
/// tokens are reused, and at most logprob_start_len when logprobs are requested (>= 0).
inline int64_t scheduler_prefix_limit(int64_t input_len, int64_t logprob_start_len = -1) {
  const int64_t cap = input_len > 0 ? input_len - 1 : 0;
  return logprob_start_len >= 0 && logprob_start_len < cap ? logprob_start_len : cap;
}

/// Result of match_prefix: the slots of the matched prefix (a multiple of page_size long) and the
/// deepest matched node (the root when nothing matched; no node for ChunkCache).
struct MatchResult {
  std::vector<SlotIndex> slots;
  NodeHandle last_node;
};

/// Result of the allocation-free match_prefix overload: the matched length (the slots are in the
/// caller's buffer) and the deepest matched node.
struct PrefixMatch {
  int64_t length = 0;
  NodeHandle last_node;
};

/// Who owns the caller's page references after insert (see PrefixCache::insert).
enum class SlotOwnership : uint8_t {
  /// The tree takes its own reference on the pages it newly stores; the caller keeps every
  /// reference it had and releases all of them itself (free(slots[:L]) after insert).
  kRetain,
  /// The caller hands over its references on slots[:L]: the tree adopts them for the pages it
  /// newly stores and releases them itself for duplicates of pages it already holds. Positions
  /// where the caller passed the tree's own slots (from a match) are left alone. After insert the
  /// caller owns nothing in slots[:L] and must not free it (a second free of a duplicate throws).
  kTransfer,
};

/// SGLang's InsertResult: how many leading tokens were already cached, the tokens the tree holds
/// for the key after the insert (L, the page-aligned key length), and the node holding the last
/// page of the key (the root when L == 0). Converts to prefix_len for older callers.
struct InsertResult {
  int64_t prefix_len = 0;
  int64_t total_len = 0;
  NodeHandle last_node;
  operator int64_t() const { return prefix_len; }  // NOLINT(google-explicit-constructor)
};

enum class InsertKind : uint8_t {
  kFinished,  ///< a finished request or an explicit insert: bumps hit counts
  kChunked,   ///< a chunked-prefill self-insert: does not bump hit counts
};

struct InsertOptions {
  int32_t priority = 0;  ///< raises the priority of every node on the path (max)
  InsertKind kind = InsertKind::kFinished;
  SlotOwnership ownership = SlotOwnership::kRetain;
};

enum class FinishPolicy : uint8_t {
  kInsert,    ///< store the page-aligned KV in the tree (normal finish)
  kNoInsert,  ///< free it (retraction, abort, deterministic mode)
};

/// What the cache needs of a request (a scheduler embeds or mirrors it). `tokens` are all tokens
/// so far (prompt + output). The cache reads and rewrites the request's req-to-token row.
struct CacheRequest {
  std::vector<int32_t> tokens;
  std::string extra_key;
  ReqSlot req_slot;
  int32_t priority = 0;
  /// Length of the prefix owned by the tree (a multiple of page_size); never freed by the request.
  int64_t cache_protected_len = 0;
  /// The locked node; no node when the request holds no lock.
  NodeHandle last_node;
  /// Slots of the reused prefix: tree slots, then (after chunked prefill) the request's own
  /// partial last page.
  std::vector<SlotIndex> prefix_slots;
  /// Hybrid models: the request's slot in the kv::StatePool (-1: none). MambaRadixCache restores
  /// a hit's state into it at admit and snapshots it when the request's KV goes into the tree.
  int32_t state_slot = -1;
  /// Hybrid models at page size > 1: a second slot the scheduler keeps holding the state after
  /// the request's last page-aligned KV length that a step ended at (aligned_state_len; -1:
  /// none). A finish whose KV length is not page aligned snapshots it for the node ending at
  /// that length (MambaRadixCache).
  int32_t aligned_state_slot = -1;
  int64_t aligned_state_len = -1;
};

/// Hit and eviction counters (tokens), cumulative since construction.
struct CacheStats {
  int64_t match_calls = 0;
  int64_t queried_tokens = 0;   ///< Σ min(len(key), max_prefix_len)
  int64_t matched_tokens = 0;   ///< Σ matched length
  int64_t inserted_tokens = 0;  ///< tokens newly stored in the tree
  int64_t evicted_tokens = 0;
  int64_t evicted_nodes = 0;
  double hit_rate() const {
    return queried_tokens == 0 ? 0.0
                               : static_cast<double>(matched_tokens) /
                                     static_cast<double>(queried_tokens);
  }
};

/// A cache that wraps a tree and cuts its matches (SwaRadixCache, MambaRadixCache): the tree's
/// insert and evict counters with the wrapper's own match counters.
inline CacheStats with_match_counts(CacheStats tree, const CacheStats& matches) {
  tree.match_calls = matches.match_calls;
  tree.queried_tokens = matches.queried_tokens;
  tree.matched_tokens = matches.matched_tokens;
  return tree;
}

enum class CacheEvent : uint8_t { kStored, kRemoved };
/// Observer of tree changes (SGLang's KV events): the key segment and slots of a node stored or
/// removed. Called synchronously; must not call back into the cache.
using CacheEventListener =
    std::function<void(CacheEvent, std::span<const int32_t> key, std::span<const SlotIndex> slots)>;

class PrefixCache {
 public:
  /// The cache uses (never owns) `allocator` and `table`; both must outlive it.
  PrefixCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table)
      : allocator_(&allocator), table_(&table) {}
  /// A cache over any page-reference owner, optionally without a request table: match_prefix,
  /// insert, locks and evict work; cache_finished_req / cache_unfinished_req / admit need a
  /// table and throw kFailedPrecondition without one.
  explicit PrefixCache(kv::PageRefs& pages, kv::ReqToTokenTable* table = nullptr)
      : allocator_(&pages), table_(table) {}
  virtual ~PrefixCache() = default;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  virtual std::string_view name() const = 0;
  int32_t page_size() const { return allocator_->page_size(); }

  /// Longest cached prefix of key.tokens[:min(len, max_prefix_len)] rounded down to page_size.
  /// Mutates: splits a node when the match ends inside it, refreshes access times, counts stats.
  /// The slots are only safe to use after inc_lock_ref(result.last_node). Allocates the result.
  MatchResult match_prefix(const RadixKey& key, int64_t max_prefix_len = kNoPrefixLimit);
  /// The same match into a caller-owned buffer: `out` is overwritten with the matched slots
  /// (resized to the match length; its capacity is reused, so a warm buffer means no heap
  /// allocation). Returns the length and the deepest matched node.
  virtual PrefixMatch match_prefix(const RadixKey& key, int64_t max_prefix_len,
                                   std::vector<SlotIndex>& out) = 0;
  /// Stores key.tokens[:L] -> slots[:L], L = len rounded down to page_size; slots[:L] must be whole
  /// held pages. Returns how many leading tokens were already present (the tree keeps its own
  /// slots there), L, and the node holding the key's last page.
  /// Ownership (options.ownership):
  ///  - kRetain (default): the tree takes its own reference on the pages it newly stores; the
  ///    caller keeps all its references and frees all of slots[:L] afterwards (freeing only the
  ///    duplicates, the SGLang habit, leaks the new pages under this rule).
  ///  - kTransfer (SGLang's rule, done by the tree): the caller's references on slots[:L] pass to
  ///    the tree, which keeps the new pages and frees the duplicates itself; the caller frees
  ///    nothing of slots[:L] (only what lies beyond L).
  /// Every check (lengths, whole pages, held pages) runs before any change.
  virtual InsertResult insert(const RadixKey& key, std::span<const SlotIndex> slots,
                              InsertOptions options = {}) = 0;
  /// Protects the path from `node` to the root against eviction (counted). Throws on a stale handle.
  virtual void inc_lock_ref(NodeHandle node) = 0;
  /// Undoes one inc_lock_ref; throws kFailedPrecondition (unchanged) when not locked.
  virtual void dec_lock_ref(NodeHandle node) = 0;

  /// Request finished (§4.5): with kInsert stores tokens[:floor_P(kv_len)] with the row's slots,
  /// then releases the request's references on row[cache_protected_len : kv_len] (duplicates and
  /// the unaligned tail go back to the free list) and unlocks last_node. Afterwards the request
  /// holds nothing (last_node cleared, prefix_slots empty, cache_protected_len 0); the caller
  /// frees its row. Throws (unchanged) on inconsistent lengths, an unused row or stale handle.
  virtual void cache_finished_req(CacheRequest& req, int64_t kv_len,
                                  FinishPolicy policy = FinishPolicy::kInsert) = 0;
  /// A prefill chunk ended at fill_len (§4.5): stores tokens[:floor_P(fill_len)], rewrites the row
  /// with the tree's slots, moves the lock to the new deepest node and sets cache_protected_len
  /// and prefix_slots (tree slots + the request's private partial page).
  virtual void cache_unfinished_req(CacheRequest& req, int64_t fill_len) = 0;

  /// Evicts unlocked leaves (policy order) until >= num_tokens tokens are freed or none is left;
  /// returns the tokens evicted. Pages return to the allocator (pending inside a free group).
  virtual int64_t evict(int64_t num_tokens) = 0;
  /// Tokens in unlocked / locked nodes.
  virtual int64_t evictable_size() const = 0;
  virtual int64_t protected_size() const = 0;
  int64_t total_size() const { return evictable_size() + protected_size(); }
  virtual const CacheStats& stats() const = 0;
  /// Aborts (PAGODA_CHECK) when an internal invariant is broken.
  virtual void check_integrity() const = 0;

  /// Scheduler admission: match (capped at max_prefix_len), set req.prefix_slots,
  /// cache_protected_len and last_node, and lock it. Requires req to hold no lock. A tiered
  /// cache (tier::HiCache) first brings the lower tiers' continuation of the match back to the
  /// device, so the prefix it admits may be longer than match_prefix's.
  virtual void admit(CacheRequest& req, int64_t max_prefix_len);
  /// Undoes admit() for a request the scheduler did not schedule after all: unlocks last_node
  /// and clears prefix_slots, cache_protected_len and last_node (a tiered cache also takes the
  /// admission back out of its hit statistics). Throws (unchanged) like dec_lock_ref.
  virtual void unadmit(CacheRequest& req);
  /// A request entered the scheduler's queue: a tiered cache starts reading the lower tiers'
  /// continuation of its prefix in the background (tier::HiCache: the storage prefetch). No-op
  /// here.
  virtual void prefetch(const CacheRequest& req, int64_t max_prefix_len) {
    (void)req;
    (void)max_prefix_len;
  }
  /// Whether the scheduler may admit the queued `req` now (a tiered cache's prefetch policy
  /// may want it to wait for its pages). With `block`, waits until it may (the policy's limit)
  /// and returns true. Always true here.
  virtual bool admission_ready(const CacheRequest& req, bool block) {
    (void)req;
    (void)block;
    return true;
  }
  /// A queued request left without being admitted (cancelled): drops its prefetch. No-op here.
  virtual void forget(const CacheRequest& req) { (void)req; }

 protected:
  /// Validates the request-side arguments of cache_*_req; throws before any change.
  void require_request(const CacheRequest& req, int64_t len) const;

  /// Throws kFailedPrecondition when the cache was built without a request table.
  kv::ReqToTokenTable& table() const;

  kv::PageRefs* allocator_;
  kv::ReqToTokenTable* table_;
};

}  // namespace pagoda::cache
