#pragma once
/// Prefetcher: the storage tier's read-ahead thread (SGLang's prefetch thread). While a request
/// waits in the queue, the pages of its prefix continuation that the device and host tiers lack
/// are read from storage into buffers of the job; at admission the cache adopts the pages that
/// have arrived into the host tier (HiCache::admit) and the prefetch policy decides how long the
/// admission may wait (docs/design/tier.md "Prefetch").
///
/// Threads: one worker thread owns its own StorageBackend (opened for it; backends are not
/// thread-safe) and runs jobs in FIFO order. A job's pages are published in order: page i may be
/// read by the owner once arrived() > i (release / acquire); the worker never touches it again.
/// Everything else is called from one owner thread (the scheduler's).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "pagoda/tier/page_key.h"
#include "pagoda/tier/storage.h"

namespace pagoda::tier {

/// The read-ahead of one request: pages keys()[0, n), in order, until the first page that is
/// absent or corrupt, or until cancel().
class PrefetchJob {
 public:
  explicit PrefetchJob(std::vector<PageKey> keys, size_t page_bytes);
  const std::vector<PageKey>& keys() const { return keys_; }
  /// Pages read so far (the leading ones).
  int64_t arrived() const { return arrived_.load(std::memory_order_acquire); }
  /// The worker finished with the job (read every page it could, or was cancelled).
  bool done() const { return done_.load(std::memory_order_acquire); }
  /// Stops the worker at its next page boundary; arrived pages stay readable.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  /// Page i's bytes (i < arrived()).
  std::span<const std::byte> page(int64_t i) const { return data_[static_cast<size_t>(i)]; }

 private:
  friend class Prefetcher;
  std::vector<PageKey> keys_;
  size_t page_bytes_;
  std::vector<std::vector<std::byte>> data_;  ///< one buffer per key, filled by the worker
  std::atomic<int64_t> arrived_{0};
  std::atomic<bool> done_{false};
  std::atomic<bool> cancelled_{false};
};

class Prefetcher {
 public:
  /// The worker reads pages of `page_bytes` with `storage` (owned, used by the worker only).
  Prefetcher(std::unique_ptr<StorageBackend> storage, size_t page_bytes);
  /// Cancels every job and joins the worker.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// Queues a read-ahead of `keys` (chained page keys of one prefix, in order).
  std::shared_ptr<PrefetchJob> start(std::vector<PageKey> keys);
  /// Blocks until `job` is done or `deadline` (none: no limit) passes; returns job.done().
  bool wait(const PrefetchJob& job,
            std::optional<std::chrono::steady_clock::time_point> deadline);
  /// The worker's backend counters (a copy taken after its last batch).
  StorageStats stats() const;

 private:
  void run();
  void read(PrefetchJob& job);

  std::unique_ptr<StorageBackend> storage_;
  size_t page_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  ///< a job was queued, or stop
  std::condition_variable done_cv_;  ///< a job finished or published pages
  std::deque<std::shared_ptr<PrefetchJob>> queue_;
  bool stop_ = false;
  StorageStats stats_;  ///< guarded by mu_
  std::thread worker_;  ///< last: starts after everything above exists
};

}  // namespace pagoda::tier
