#include "pagoda/disagg/staging.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "pagoda/core/error.h"
#include "pagoda/disagg/kv_layout.h"

namespace pagoda::disagg {
namespace {

constexpr auto kStagingRetry = std::chrono::milliseconds(1);

const kv::KvPoolConfig& mha_only(const kv::KvPoolConfig& c) {
  PAGODA_REQUIRE(c.layout == kv::KvLayout::kMha, kUnsupported,
                 "disaggregation supports MHA KV pools only (this model's pool is MLA)");
  return c;
}

std::vector<int32_t> page_ints(std::span<const PageId> pages) {
  std::vector<int32_t> out;
  out.reserve(pages.size());
  for (PageId p : pages) out.push_back(p.value());
  return out;
}

/// Enqueues the copies of runs `runs` of `layer` from `from` to `to` on `stream` as one batch.
void copy_layer(platform::CopyStream& stream, const kv::KvPool& from, kv::KvPool& to,
                int32_t layer, std::span<const kv::PageCopy> runs,
                std::vector<platform::CopyStream::Op>& ops) {
  ops.clear();
  kv::copy_layer_pages(from, to, LayerId{layer}, runs,
                       [&ops](void* d, const void* s, size_t n) { ops.push_back({d, s, n}); });
  stream.copy_batch(ops);
}

/// Waits for a copy stream's copies when it leaves scope (also on an exception), so the staging
/// pages a lease declared before it returns are no longer written.
struct DrainOnExit {
  platform::CopyStream& stream;
  ~DrainOnExit() {
    try {
      stream.synchronize();
    } catch (const std::exception&) {  // a failed device: nothing left to wait for
    }
  }
};

}  // namespace

StagingLease::StagingLease(StagingLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), pages_(std::move(other.pages_)) {}

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    pages_ = std::move(other.pages_);
  }
  return *this;
}

StagingLease::~StagingLease() { release(); }

void StagingLease::release() {
  if (pool_ != nullptr && !pages_.empty()) pool_->give_back(pages_);
  pages_.clear();
  pool_ = nullptr;
}

StagingPool::StagingPool(const kv::KvPoolConfig& device, int32_t pages,
                         platform::Allocator& pinned)
    : host_(mha_only(device), pages, pinned),
      regions_(regions_of(host_.pool())),
      page_bytes_(page_bytes_of(host_.pool())) {}

int32_t StagingPool::free_pages() const {
  std::lock_guard lock(mu_);
  return host_.pages().num_free_pages();
}

StagingLease StagingPool::lease(int32_t n) {
  StagingLease out;
  if (n <= 0) return out;
  const int32_t p = host_.pages().page_size();
  const auto slots = host_.pages().alloc(int64_t{n} * p);
  if (!slots) return out;
  out.pool_ = this;
  for (int32_t i = 0; i < n; ++i)
    out.pages_.emplace_back((*slots)[static_cast<size_t>(i) * static_cast<size_t>(p)] / p);
  return out;
}

StagingLease StagingPool::take_up_to(int32_t at_most) {
  std::lock_guard lock(mu_);
  return lease(std::min(at_most, host_.pages().num_free_pages()));
}

StagingLease StagingPool::take(int32_t n) {
  PAGODA_REQUIRE(n >= 0 && n <= capacity(), kInvalidArgument,
                 "{} staging pages requested, the staging pool has {}", n, capacity());
  std::lock_guard lock(mu_);
  return lease(n);
}

void StagingPool::give_back(std::span<const PageId> pages) {
  std::vector<kv::PageRun> runs;
  runs.reserve(pages.size());
  for (PageId p : pages) runs.push_back({p.value(), 1});
  std::lock_guard lock(mu_);
  host_.pages().free_pages(runs);
}

StagedSend send_staged(platform::Platform& platform, const kv::KvPool& pool,
                       platform::Event* after, StagingPool& staging, std::span<const PageId> src,
                       std::span<const PageId> dst, const PutFn& put,
                       const std::function<bool()>& stop,
                       std::chrono::steady_clock::time_point deadline) {
  PAGODA_REQUIRE(src.size() == dst.size(), kInvalidArgument,
                 "staged send: {} source pages for {} destination pages", src.size(), dst.size());
  PAGODA_REQUIRE(page_bytes_of(pool) == staging.page_bytes() &&
                     pool.page_size() == staging.pool().page_size(),
                 kInvalidArgument, "staged send: the pool and the staging differ in geometry");
  const int32_t layers = pool.num_layers();
  const std::vector<int32_t> src_ids = page_ints(src);
  for (int32_t p : src_ids)
    PAGODA_REQUIRE(p >= 1 && p <= pool.config().num_pages, kOutOfRange,
                   "staged send: page {} outside the pool's pages [1, {}]", p,
                   pool.config().num_pages);
  StagedSend out;
  PagesChecksum checksum;
  const std::unique_ptr<platform::CopyStream> stream = platform.make_copy_stream();
  if (after != nullptr) stream->wait(*after);
  std::vector<platform::CopyStream::Op> ops;
  size_t done = 0;
  while (done < src.size()) {
    const auto want = static_cast<int32_t>(
        std::min<size_t>(src.size() - done, static_cast<size_t>(staging.capacity())));
    StagingLease lease = staging.take_up_to(want);
    if (lease.empty()) {
      if (std::chrono::steady_clock::now() > deadline) {
        out.transfer.timed_out = true;
        out.transfer.error = "no staging page came free before the deadline";
        return out;
      }
      std::this_thread::sleep_for(kStagingRetry);
      continue;
    }
    const DrainOnExit drain{*stream};  // before `lease` returns its pages
    const size_t n = lease.size();
    const std::vector<int32_t> staged_ids = page_ints(lease.pages());
    const auto runs = kv::page_copy_runs(std::span(src_ids).subspan(done, n), staged_ids);
    std::vector<std::unique_ptr<platform::Event>> layer_done;
    for (int32_t l = 0; l < layers; ++l) {
      copy_layer(*stream, pool, staging.pool(), l, runs, ops);
      layer_done.push_back(stream->record());
    }
    const std::vector<WriteOp> writes =
        page_write_ops(lease.pages(), dst.subspan(done, n), staging.page_bytes());
    const size_t per_region = writes.size() / staging.page_bytes().size();
    for (int32_t l = 0; l < layers; ++l) {
      layer_done[static_cast<size_t>(l)]->synchronize();
      if (stop && stop()) {
        out.stopped = true;
        return out;
      }
      const TransferResult r =
          put(std::span(writes).subspan(2 * static_cast<size_t>(l) * per_region, 2 * per_region));
      out.transfer.bytes += r.bytes;
      if (!r.ok) {
        out.transfer.timed_out = r.timed_out;
        out.transfer.error = r.error;
        return out;
      }
    }
    checksum.update(staging.regions(), staging.page_bytes(), lease.pages());
    done += n;
  }
  out.transfer.ok = true;
  out.checksum = checksum.digest();
  return out;
}

void unstage(platform::Platform& platform, const StagingPool& staging,
             std::span<const PageId> staged, kv::KvPool& pool, std::span<const PageId> dst,
             platform::Event* after) {
  const auto runs = kv::page_copy_runs(page_ints(staged), page_ints(dst));
  const std::unique_ptr<platform::CopyStream> stream = platform.make_copy_stream();
  if (after != nullptr) stream->wait(*after);
  std::vector<platform::CopyStream::Op> ops;
  const DrainOnExit drain{*stream};
  for (int32_t l = 0; l < pool.num_layers(); ++l)
    copy_layer(*stream, staging.pool(), pool, l, runs, ops);
  stream->synchronize();
}

}  // namespace pagoda::disagg
