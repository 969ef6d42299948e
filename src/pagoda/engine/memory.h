#pragma once
/// EngineMemory: the engine's host-side memory bookkeeping — the PageAllocator, the
/// ReqToTokenTable and the prefix cache (RadixCache, ChunkCache, MambaRadixCache or HiCache with
/// its host tier) — and the audits that nothing leaks between them, the live requests and a
/// hybrid model's state pool (docs/design/engine.md
/// §4). The Engine builds it (Engine::memory()); tests, `pagoda bench` and the server read it.
///
/// Thread rules: the engine's thread, between steps.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "pagoda/cache/prefix_cache.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/kv/swa_pages.h"
#include "pagoda/tier/hicache.h"

namespace pagoda::engine {

/// Page references nobody owns: Σ refcount over pages 1..num_pages of `refs` − `owned_refs`
/// (the references the engine can account for: one per tree page, one per request-private page).
/// Counts references, not pages: a page retained twice by one owner counts once extra. O(pages).
int64_t unowned_page_references(const kv::PageRefs& refs, int64_t owned_refs);

class EngineMemory {
 public:
  /// What the memory cannot see by itself: how many requests wait or run, the pages requests
  /// hold privately (Scheduler::request_private_pages) and the request rows live requests hold.
  struct Owners {
    std::function<int64_t()> live_requests;
    std::function<int64_t()> request_private_pages;
    std::function<int64_t()> live_rows;
    /// SWA pool only: the SWA pages requests hold privately (Scheduler::request_private_swa_pages).
    std::function<int64_t()> request_private_swa_pages;
    /// Hybrid models only: the worker's state pool and the slots its known holders own (the
    /// active requests' and the prefix cache's snapshots, one entry per reference).
    const kv::StatePool* states = nullptr;
    std::function<std::vector<int32_t>()> state_holders;
  };

  /// An allocator of `num_pages` pages of `page_size` tokens and a table of `max_reqs` rows of
  /// `max_context_len` slots; the cache comes later (set_cache: the hierarchical cache copies to
  /// and from the worker's pool, built after the allocator and table).
  EngineMemory(int32_t num_pages, int32_t page_size, int32_t max_reqs, int32_t max_context_len);
  ~EngineMemory();
  EngineMemory(const EngineMemory&) = delete;
  EngineMemory& operator=(const EngineMemory&) = delete;

  /// Installs the prefix cache (over allocator() and table()) and the owners. `hicache` is the
  /// same cache when it is the hierarchical one, else nullptr.
  void set_cache(std::unique_ptr<cache::PrefixCache> cache, tier::HiCache* hicache, Owners owners);
  /// Drops the cache first (the hierarchical cache finishes its copies into the worker's pool).
  void reset_cache();

  /// Adds the sliding-window pool (docs/design/engine.md §SWA): an allocator of `swa_pages`
  /// pages joined to allocator() by a kv::SwaPages. Before the cache and any allocation.
  void enable_swa(int32_t swa_pages);
  /// The SWA pool's pages map and its PageRefs view, or nullptr without one.
  kv::SwaPages* swa_pages() const { return swa_pages_.get(); }
  kv::SwaPageRefs* swa_refs() const { return swa_refs_.get(); }
  /// SWA pages with a reference nobody the engine knows of holds: Σ SWA refcount − the tree's
  /// pages that kept their window side − request-private SWA pages (0 unless a bug, or without
  /// an SWA pool). O(pages).
  int64_t leaked_swa_pages() const;
  /// Free / all pages of the SWA pool (0 / 0 without one).
  int64_t swa_free_pages() const { return swa_ ? swa_->num_free_pages() : 0; }
  int64_t swa_total_pages() const { return swa_ ? swa_->num_pages() : 0; }

  kv::PageAllocator& allocator() { return *allocator_; }
  kv::ReqToTokenTable& table() { return *table_; }
  cache::PrefixCache& cache() { return *cache_; }
  const cache::PrefixCache& cache() const { return *cache_; }
  /// The hierarchical cache, or nullptr.
  tier::HiCache* hicache() const { return hicache_; }

  /// Page references held by nobody the engine knows of: Σ refcount over all pages − tree pages
  /// − request-private pages (a page the tree retained twice counts twice). 0 unless there is a
  /// bug. O(num_pages).
  int64_t leaked_pages() const;
  /// When idle (no request waiting or running): every page is either free or held by the tree
  /// (free + tree == total). Always true while requests are live.
  bool idle_pages_accounted() const;
  /// Request rows in use by no live request (0 unless there is a bug).
  int64_t leaked_rows() const;
  /// Hybrid models: the state slots held more often than their known holders account for
  /// (StatePool::leaked; empty without a state pool or unless there is a bug).
  std::vector<int32_t> leaked_states() const;
  /// When idle: evicts the whole prefix cache (every page back to the allocator) and returns the
  /// tokens evicted. Throws Error(kFailedPrecondition) while requests are waiting or running.
  int64_t drain_prefix_cache();
  /// When idle: also empties the hierarchical cache's host tier (after drain_prefix_cache) and
  /// returns the host pages evicted (0 without one). Throws like drain_prefix_cache.
  int64_t drain_host_cache();
  /// Host-tier page references nobody owns (host allocator references − host-tier entries; 0
  /// without a hierarchical cache or unless there is a bug).
  int64_t leaked_host_pages() const;
  /// Pages with refcount 0 / all pages (after drain_prefix_cache() on an idle engine these are
  /// equal unless a reference leaked).
  int64_t free_pages() const { return allocator_->num_free_pages(); }
  int64_t total_pages() const { return allocator_->num_pages(); }
  /// Pages whose refcount is not 0 (O(pages)).
  int64_t referenced_pages() const;
  /// Aborts (PAGODA_CHECK) when allocator, table, cache or state-pool invariants are broken or
  /// anything leaked.
  void check_integrity() const;

 private:
  std::unique_ptr<kv::PageAllocator> allocator_;
  std::unique_ptr<kv::ReqToTokenTable> table_;
  std::unique_ptr<kv::PageAllocator> swa_;
  std::unique_ptr<kv::SwaPages> swa_pages_;
  std::unique_ptr<kv::SwaPageRefs> swa_refs_;
  std::unique_ptr<cache::PrefixCache> cache_;
  tier::HiCache* hicache_ = nullptr;  ///< cache_ when the hierarchical cache is on
  Owners owners_;
};

}  // namespace pagoda::engine
