#include "pagoda/tier/prefetcher.h"

namespace pagoda::tier {
namespace {

/// Pages per storage round trip: small enough that best_effort sees progress, large enough
/// that a remote store's latency is paid once per batch.
constexpr size_t kReadBatch = 8;

}  // namespace

PrefetchJob::PrefetchJob(std::vector<PageKey> keys, size_t page_bytes)
    : keys_(std::move(keys)), page_bytes_(page_bytes), data_(keys_.size()) {}

Prefetcher::Prefetcher(std::unique_ptr<StorageBackend> storage, size_t page_bytes)
    : storage_(std::move(storage)), page_bytes_(page_bytes), worker_([this] { run(); }) {}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    for (const auto& job : queue_) job->cancel();
  }
  work_cv_.notify_all();
  worker_.join();
}

std::shared_ptr<PrefetchJob> Prefetcher::start(std::vector<PageKey> keys) {
  auto job = std::make_shared<PrefetchJob>(std::move(keys), page_bytes_);
  {
    std::lock_guard lock(mu_);
    queue_.push_back(job);
  }
  work_cv_.notify_one();
  return job;
}

bool Prefetcher::wait(const PrefetchJob& job,
                      std::optional<std::chrono::steady_clock::time_point> deadline) {
  std::unique_lock lock(mu_);
  if (deadline)
    done_cv_.wait_until(lock, *deadline, [&] { return job.done(); });
  else
    done_cv_.wait(lock, [&] { return job.done(); });
  return job.done();
}

StorageStats Prefetcher::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Prefetcher::run() {
  for (;;) {
    std::shared_ptr<PrefetchJob> job;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    read(*job);
    {
      std::lock_guard lock(mu_);
      job->done_.store(true, std::memory_order_release);
      stats_ = storage_->stats();
    }
    done_cv_.notify_all();
  }
}

void Prefetcher::read(PrefetchJob& job) {
  if (job.cancelled_.load(std::memory_order_relaxed)) return;
  const auto present = static_cast<size_t>(storage_->batch_exists(job.keys_));
  size_t at = 0;
  while (at < present && !job.cancelled_.load(std::memory_order_relaxed)) {
    const size_t n = std::min(kReadBatch, present - at);
    std::vector<std::span<std::byte>> outs;
    for (size_t i = at; i < at + n; ++i) {
      job.data_[i].resize(job.page_bytes_);
      outs.emplace_back(job.data_[i]);
    }
    const auto got =
        static_cast<size_t>(storage_->batch_get(std::span(job.keys_).subspan(at, n), outs));
    at += got;
    {
      std::lock_guard lock(mu_);
      job.arrived_.store(static_cast<int64_t>(at), std::memory_order_release);
      stats_ = storage_->stats();
    }
    done_cv_.notify_all();
    if (got < n) break;  // a miss or a corrupt page: the prefix stops here
  }
  // Buffers past the arrived pages are never read: release them now.
  for (size_t i = at; i < job.data_.size(); ++i) std::vector<std::byte>().swap(job.data_[i]);
}

}  // namespace pagoda::tier
