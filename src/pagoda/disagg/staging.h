#pragma once
/// The staged KV transfer of prefill–decode disaggregation (docs/design/pd.md "Staging"): KV moves
/// pool → pinned host staging → (KvTransfer put) → the peer's pinned staging → its pool, so the
/// transfer engine only ever sees host memory and the same code runs on a GPU (device pools,
/// copies on a CopyStream) and on the CPU platform (host pools, copies on its copy thread).
///
/// StagingPool: pinned pages with the KV pool's geometry (a kv::HostKvPool: per layer a K and a
/// V buffer, page p of a layer one contiguous block) and their own page allocator. Bounded: its
/// size is a server flag. Leases hand pages out and take them back when they die, so every exit
/// of a transfer (success, failure, exception) returns them.
///
/// send_staged (sender): chunk by chunk (as many pages as the staging can lease at once), each
/// layer's pages are copied pool → staging in one CopyStream::copy_batch with an event per layer;
/// layer l is put to the peer once its event completes, while the later layers still copy. The
/// checksum is XXH3 over the staged bytes (PagesChecksum, page-major, so chunks chain).
/// unstage (receiver): staging → pool, one copy_batch per layer, then waits for the copies.
///
/// Thread rules: StagingPool and its leases are thread-safe; send_staged and unstage make their
/// own copy stream per call, so concurrent rooms may run them on their own threads.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "pagoda/core/ids.h"
#include "pagoda/disagg/kv_transfer.h"
#include "pagoda/kv/host_pool.h"
#include "pagoda/platform/platform.h"

namespace pagoda::disagg {

class StagingPool;

/// Staging pages held by one transfer; back to their pool when the lease dies. Move-only.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(StagingLease&& other) noexcept;
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease();
  std::span<const PageId> pages() const { return pages_; }
  size_t size() const { return pages_.size(); }
  bool empty() const { return pages_.empty(); }

 private:
  friend class StagingPool;
  void release();
  StagingPool* pool_ = nullptr;
  std::vector<PageId> pages_;
};

class StagingPool {
 public:
  /// `pages` usable pages (>= 1; kInvalidArgument otherwise) of `device`'s geometry (MHA:
  /// kUnsupported for MLA) in memory from `pinned` (Platform::pinned_allocator()), which must
  /// outlive the pool.
  StagingPool(const kv::KvPoolConfig& device, int32_t pages, platform::Allocator& pinned);

  int32_t capacity() const { return host_.num_pages(); }
  int32_t free_pages() const;
  /// Up to `at_most` pages: as many as are free (possibly none).
  StagingLease take_up_to(int32_t at_most);
  /// Exactly `n` pages, or none when fewer are free. kInvalidArgument when n > capacity().
  StagingLease take(int32_t n);

  kv::KvPool& pool() { return host_.pool(); }
  const kv::KvPool& pool() const { return host_.pool(); }
  /// The pool's regions (regions_of): what a KvTransfer registers. Stable while the pool lives.
  const std::vector<MemRegion>& regions() const { return regions_; }
  const std::vector<uint64_t>& page_bytes() const { return page_bytes_; }

 private:
  friend class StagingLease;
  StagingLease lease(int32_t n);  ///< under mu_
  void give_back(std::span<const PageId> pages);
  kv::HostKvPool host_;
  std::vector<MemRegion> regions_;
  std::vector<uint64_t> page_bytes_;
  mutable std::mutex mu_;
};

/// Writes `ops` (staging → the peer's staging) and waits for them: KvTransfer::write with the
/// peer's descriptor and the time left, or a plain copy in a test.
using PutFn = std::function<TransferResult(std::span<const WriteOp> ops)>;

/// How send_staged ended: `transfer` as the put reported it (ok, or the failing put's error;
/// bytes: every byte put), the checksum of the staged bytes (complete when ok), and whether
/// `stop` ended it.
struct StagedSend {
  TransferResult transfer;
  uint64_t checksum = 0;
  bool stopped = false;
};

/// Sends pages src[i] of `pool` (`platform`'s device or host memory) into the peer's staging
/// pages dst[i] through `staging` (see the file comment). The copies wait for `after` (an event
/// of `platform`'s compute stream marking the last write of the source pages; nullptr: none).
/// `stop` is asked before each layer's put; waiting for free staging pages ends at `deadline`
/// (timed_out). Throws before any copy for lists of different lengths or a pool whose geometry
/// differs from the staging's (kInvalidArgument) and for a source page outside the pool
/// (kOutOfRange); a destination page outside the peer's staging is the put's to refuse
/// (KvTransfer::write throws kInvalidArgument). Returns every leased page on every exit, after
/// the copies into it finished.
StagedSend send_staged(platform::Platform& platform, const kv::KvPool& pool,
                       platform::Event* after, StagingPool& staging, std::span<const PageId> src,
                       std::span<const PageId> dst, const PutFn& put,
                       const std::function<bool()>& stop,
                       std::chrono::steady_clock::time_point deadline);

/// Copies staging pages staged[i] into pages dst[i] of `pool` (host → device on a GPU) on a copy
/// stream of `platform` that first waits for `after` (nullptr: none), and waits until they are
/// done. Throws kInvalidArgument / kOutOfRange (nothing copied) for bad lists or pages.
void unstage(platform::Platform& platform, const StagingPool& staging,
             std::span<const PageId> staged, kv::KvPool& pool, std::span<const PageId> dst,
             platform::Event* after);

}  // namespace pagoda::disagg
