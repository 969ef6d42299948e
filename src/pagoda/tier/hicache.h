#pragma once
/// HiCache: the hierarchical KV cache (SGLang's HiRadixCache; sglang_memory_tiers §1). A
/// PrefixCache over three tiers: the device radix tree (cache::RadixCache, unchanged), a host
/// tier of KV pages in pinned host memory (HostTier over a kv::HostKvPool), and the copies
/// between them (TierController on a platform::CopyStream). Contract: docs/design/tier.md.
///
/// - Device tier: every PrefixCache call goes to the radix tree; sizes, locks and eviction order
///   are the tree's, so the engine's page accounting is unchanged (host pages are counted
///   separately; a page is never counted in both).
/// - Host tier: pages keyed by their chained PageKey. Write policies: kWriteThrough backs up
///   every page the tree newly stores (batched, asynchronous); kWriteThroughSelective backs up a
///   page once admissions have hit it `selective_threshold` times; kWriteBack backs up only when
///   the device evicts it (and then waits). Device eviction of a page whose host copy is missing
///   makes one (write_through / write_back) when the host tier has room; the host tier evicts
///   its LRU leaves to make room, so a full host pool degrades to the device-only cache.
/// - Storage tier: pages leaving the host tier are written to a StorageBackend (batched); a
///   queued request's continuation is read ahead by a Prefetcher thread (prefetch()), adopted
///   into the host tier at admit(), and the prefetch policy decides whether the admission
///   waits for it (admission_ready()).
/// - admit(): matches the device prefix, then its continuation in the host tier
///   (match_tiers()), allocates device pages for that continuation all or nothing (evicting
///   unlocked device leaves; when it cannot, the request recomputes), queues the load-back,
///   stores the pages in the tree and admits the whole prefix. The forward then waits per layer
///   (begin_forward() / end_forward() around the step).
///
/// Not thread-safe: the scheduler thread owns it; the copies run on the copy stream.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/cache/radix_cache.h"
#include "pagoda/kv/host_pool.h"
#include "pagoda/kv/kv_pool.h"
#include "pagoda/platform/platform.h"
#include "pagoda/tier/config.h"
#include "pagoda/tier/controller.h"
#include "pagoda/tier/host_tier.h"
#include "pagoda/tier/page_key.h"
#include "pagoda/tier/prefetcher.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {

/// Tokens found per tier and what moved (cumulative).
struct TierStats {
  int64_t device_hit_tokens = 0;    ///< admitted prefix tokens already on the device
  int64_t host_hit_tokens = 0;      ///< admitted prefix tokens loaded back from the host tier
  int64_t storage_hit_tokens = 0;   ///< admitted prefix tokens fetched from storage
  int64_t load_skipped_tokens = 0;  ///< host hits recomputed: no device room for the load-back
  int64_t backup_skipped_pages = 0; ///< backups dropped: the host tier had no room
  int64_t host_evicted_pages = 0;
  int64_t host_pages = 0;           ///< pages in the host tier now
  int64_t host_capacity_pages = 0;
  TransferStats transfer;
  bool has_storage = false;
  StorageStats storage;        ///< the scheduler's and the prefetch thread's backends
  int64_t prefetch_jobs = 0;   ///< read-aheads started for queued requests
  int64_t prefetch_pages = 0;  ///< pages they brought into the host tier
  int64_t prefetch_waits = 0;  ///< admissions the prefetch policy held back (scheduler rounds)
};

/// What the tiers hold for a key: the device prefix, then its continuation in the host tier.
struct TierMatch {
  int64_t device_len = 0;
  int64_t host_len = 0;
};

class HiCache final : public cache::PrefixCache {
 public:
  /// A hierarchical cache over the device `allocator` / `table` / `device_pool` (the worker's)
  /// and a new host pool of `config.host` on `platform`'s pinned memory. With a storage tier,
  /// `open_storage` (default: make_storage(config.storage)) is called twice: the scheduler's
  /// backend and the prefetch thread's. Throws Error(kInvalidArgument) for a bad config or a
  /// storage that cannot be opened, kUnsupported when the platform has no copy stream.
  /// With tensor parallelism `device_pool` is rank 0's shard and `peers` the other ranks: every
  /// page copy is mirrored to them (TierController); a storage tier is then kUnsupported (a
  /// page record would need every rank's shard). Everything passed must outlive the cache.
  HiCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table, kv::KvPool& device_pool,
          platform::Platform& platform, const HiCacheConfig& config,
          StorageFactory open_storage = {}, TierPeers* peers = nullptr);
  ~HiCache() override;

  std::string_view name() const override { return "hicache"; }

  /// Device-only match (no load-back); see match_tiers() for all tiers.
  cache::PrefixMatch match_prefix(const cache::RadixKey& key, int64_t max_prefix_len,
                                  std::vector<SlotIndex>& out) override;
  using PrefixCache::match_prefix;
  cache::InsertResult insert(const cache::RadixKey& key, std::span<const SlotIndex> slots,
                             cache::InsertOptions options = {}) override;
  void inc_lock_ref(cache::NodeHandle node) override { device_.inc_lock_ref(node); }
  void dec_lock_ref(cache::NodeHandle node) override { device_.dec_lock_ref(node); }
  void cache_finished_req(cache::CacheRequest& req, int64_t kv_len,
                          cache::FinishPolicy policy = cache::FinishPolicy::kInsert) override;
  void cache_unfinished_req(cache::CacheRequest& req, int64_t fill_len) override;
  /// Evicts device leaves (backing pages up per the write policy first); returns tokens.
  int64_t evict(int64_t num_tokens) override;
  int64_t evictable_size() const override { return device_.evictable_size(); }
  int64_t protected_size() const override { return device_.protected_size(); }
  /// match_calls / queried / matched count admissions (matched = device + host hits loaded);
  /// inserted / evicted are the device tree's.
  const cache::CacheStats& stats() const override;
  void check_integrity() const override;
  /// Match, load back the host continuation (all or nothing), lock (see the file comment).
  void admit(cache::CacheRequest& req, int64_t max_prefix_len) override;
  /// Unlocks like PrefixCache::unadmit; the admission is not counted (its load-back stays:
  /// the pages are in the tree, and the next admission that uses them counts them as host hits).
  void unadmit(cache::CacheRequest& req) override;
  /// With a storage tier: starts reading the pages of req's prefix continuation that neither
  /// the device nor the host tier holds (at most the host tier's capacity in flight overall).
  void prefetch(const cache::CacheRequest& req, int64_t max_prefix_len) override;
  /// The prefetch policy: best_effort: always; wait_complete: once req's read-ahead is done;
  /// timeout: once it is done or its deadline passed. `block` waits for that.
  bool admission_ready(const cache::CacheRequest& req, bool block) override;
  void forget(const cache::CacheRequest& req) override;
  /// Pages of req's read-ahead that have arrived so far, or -1 when it has none (tests, logs).
  int64_t prefetch_arrived(const cache::CacheRequest& req) const;

  /// Device prefix and host continuation of key[:min(len, max_prefix_len)], page aligned.
  /// Touches the device tree like match_prefix; changes nothing else.
  TierMatch match_tiers(const cache::RadixKey& key, int64_t max_prefix_len);
  /// Around each forward: counts the step's admissions (hits per tier), submits queued copies
  /// and gates the device pool per layer: begin_forward(begin_step()).
  void begin_forward() { begin_forward(begin_step()); }
  /// The two halves, for the overlap scheduler: begin_step() on the scheduler's thread when the
  /// step is launched (counts its admissions, takes the copies queued for it), begin_forward()
  /// and end_forward() on the step thread around its forward.
  StepCopies begin_step();
  void begin_forward(StepCopies copies) { controller_.begin_forward(std::move(copies)); }
  void end_forward() { controller_.end_forward(); }
  /// The overlap scheduler's wait for the step in flight, run before every synchronize (device
  /// evictions, host evictions, write-back): TierController::set_step_barrier.
  void set_step_barrier(std::function<void()> barrier) {
    controller_.set_step_barrier(std::move(barrier));
  }
  /// Submits every queued copy and waits for all of them.
  void synchronize() { controller_.synchronize(); }
  /// Evicts the whole host tier (an idle engine's drain); returns pages evicted.
  int64_t drain_host();

  TierStats tier_stats() const;
  const HostTier& host() const { return host_; }
  const kv::HostKvPool& host_pool() const { return host_pool_; }
  const cache::RadixCache& device() const { return device_; }

 private:
  /// Where a tree page's KV came from, until an admission counts it.
  enum class Origin : uint8_t { kCounted, kHost, kStorage };
  struct TreePage {
    PageKey key;
    PageKey parent;
    int32_t hits = 0;
    bool in_tree = false;
    Origin origin = Origin::kCounted;
  };
  /// An admission not yet counted: counted by begin_forward() unless unadmit() drops it.
  struct Admission {
    const cache::CacheRequest* req = nullptr;
    int64_t queried = 0;
    int64_t skipped = 0;
    std::vector<int32_t> pages;  ///< the admitted prefix's device pages
  };
  int32_t page_of(SlotIndex slot) const { return slot / page_size(); }
  /// Records the keys of the tree pages holding tokens[:len] (after an insert) and applies the
  /// write-through policy to the new ones.
  void note_tree_pages(std::string_view extra_key, std::span<const int32_t> tokens, int64_t len);
  /// Backs up device `pages` (tree pages with recorded keys) that the host tier lacks, as many
  /// as it has room for, parents first. With `wait`, blocks until the copies are done.
  void backup_pages(std::span<const int32_t> pages, bool wait);
  /// Called by the tree for every removed node (its pages are already released).
  void on_removed(std::span<const SlotIndex> slots);
  /// After a device eviction: host copies per policy, then the pages' records are dropped.
  void finish_evictions();
  /// Loads keys_[first, first + total) (host entries, pinned; the first `from_host` were in the
  /// host tier, the rest came from storage) onto new device pages after `m`, all or nothing,
  /// and stores them in the tree. False (nothing changed) when the device has no room.
  bool load_back(const cache::CacheRequest& req, const cache::PrefixMatch& m, size_t first,
                 int64_t total, int64_t from_host);
  /// Brings keys_[from, to)'s leading pages present in storage into the host tier (pinned);
  /// stops at a miss, a corrupt page, a full host tier, or the timeout policy's deadline.
  /// Returns the pages now in the host tier.
  int64_t fetch_from_storage(std::string_view extra_key, size_t from, size_t to);
  /// Moves the arrived pages of req's read-ahead (if any) into the host tier and drops it;
  /// returns whether it had one.
  bool adopt_prefetch(const cache::CacheRequest& req);
  /// Writes the pages queued by host evictions to storage (one batch).
  void flush_puts();
  /// The key of page keys_[index]'s parent.
  PageKey parent_key(std::string_view extra_key, size_t index) const;
  /// Host-tier continuation of keys_[from, to): the number of consecutive pages present.
  int64_t host_run(size_t from, size_t to) const;

  HiCacheConfig config_;
  kv::PageAllocator* allocator_;
  kv::HostKvPool host_pool_;
  HostTier host_;
  TierController controller_;
  std::unique_ptr<StorageBackend> storage_;  ///< null without a storage tier
  std::vector<std::byte> staging_;           ///< one page, for storage reads
  std::vector<PageKey> put_keys_;            ///< host evictions waiting for flush_puts()
  std::vector<std::vector<std::byte>> put_pages_;
  /// A queued request's read-ahead: its pages' parent (the key before the first) and deadline.
  struct Prefetch {
    std::shared_ptr<PrefetchJob> job;
    PageKey parent;
    std::chrono::steady_clock::time_point deadline;
  };
  std::unordered_map<const cache::CacheRequest*, Prefetch> prefetches_;
  int64_t prefetch_inflight_pages_ = 0;
  std::unique_ptr<Prefetcher> prefetcher_;  ///< null without a storage tier
  std::vector<TreePage> tree_pages_;      ///< per device page id
  std::vector<int32_t> evicted_;          ///< device pages removed by the current evict()
  std::vector<PageKey> keys_;             ///< scratch: page keys of one request
  std::vector<SlotIndex> scratch_;
  mutable cache::CacheStats stats_;
  TierStats tier_;
  std::vector<Admission> pending_;  ///< admissions since the last begin_forward()
  cache::RadixCache device_;  ///< last: destroyed first, while its listener's state still lives
};

}  // namespace pagoda::tier
