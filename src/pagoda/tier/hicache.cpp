#include "pagoda/tier/hicache.h"

#include <algorithm>
#include <chrono>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::tier {
namespace {

/// Host evictions written to storage per round trip.
constexpr size_t kPutBatch = 32;

const HiCacheConfig& validated(const HiCacheConfig& c, bool tensor_parallel) {
  c.validate();
  PAGODA_REQUIRE(c.enabled(), kInvalidArgument,
                 "HiCache needs a host pool size (hicache_ratio or hicache_size)");
  PAGODA_REQUIRE(c.storage.empty() || !tensor_parallel, kUnsupported,
                 "the hierarchical cache's storage tier (hicache_storage '{}') does not run with "
                 "tensor parallelism yet (its page records would need every rank's heads): drop "
                 "the storage tier or run with one rank",
                 c.storage);
  return c;
}

}  // namespace

HiCache::HiCache(kv::PageAllocator& allocator, kv::ReqToTokenTable& table, kv::KvPool& device_pool,
                 platform::Platform& platform, const HiCacheConfig& config,
                 StorageFactory open_storage, TierPeers* peers)
    : PrefixCache(allocator, table),
      config_(validated(config, peers != nullptr)),
      allocator_(&allocator),
      host_pool_(device_pool.config(), config.host, platform.pinned_allocator()),
      host_(host_pool_.pages()),
      controller_(platform, device_pool, host_pool_, peers),
      tree_pages_(static_cast<size_t>(allocator.num_pages()) + 1),
      device_(allocator, table) {
  PAGODA_REQUIRE(device_pool.page_size() == allocator.page_size() &&
                     device_pool.config().num_pages == allocator.num_pages(),
                 kInvalidArgument, "HiCache: the device pool and the allocator differ in pages");
  PAGODA_REQUIRE(device_pool.config().index_head_dim == 0, kUnsupported,
                 "HiCache does not move DeepSeek sparse attention (DSA) index keys yet; run DSA "
                 "models without the hierarchical cache");
  host_.set_before_free([this] { controller_.synchronize(); });
  if (!config_.storage.empty()) {
    if (!open_storage) open_storage = [this] { return make_storage(config_.storage); };
    storage_ = open_storage();
    const auto page_bytes = static_cast<size_t>(kv::bytes_per_page(host_pool_.pool()));
    staging_.resize(page_bytes);
    prefetcher_ = std::make_unique<Prefetcher>(open_storage(), page_bytes);
    // A page leaving the host tier stays in storage (the copies into it are done: before_free):
    // queued here, written in batches by flush_puts().
    host_.set_on_evict([this, page_bytes](const PageKey& key, int32_t page) {
      put_keys_.push_back(key);
      put_pages_.emplace_back(page_bytes);
      kv::read_page(host_pool_.pool(), page, put_pages_.back());
      if (put_keys_.size() >= kPutBatch) flush_puts();
    });
  }
  device_.set_event_listener(
      [this](cache::CacheEvent event, std::span<const int32_t>, std::span<const SlotIndex> slots) {
        if (event == cache::CacheEvent::kRemoved) on_removed(slots);
      });
}

HiCache::~HiCache() {
  controller_.synchronize();
  flush_puts();
}

void HiCache::flush_puts() {
  if (put_keys_.empty()) return;
  std::vector<std::span<const std::byte>> data(put_pages_.begin(), put_pages_.end());
  storage_->batch_put(put_keys_, data);
  put_keys_.clear();
  put_pages_.clear();
}

cache::PrefixMatch HiCache::match_prefix(const cache::RadixKey& key, int64_t max_prefix_len,
                                         std::vector<SlotIndex>& out) {
  return device_.match_prefix(key, max_prefix_len, out);
}

cache::InsertResult HiCache::insert(const cache::RadixKey& key, std::span<const SlotIndex> slots,
                                    cache::InsertOptions options) {
  const cache::InsertResult r = device_.insert(key, slots, options);
  note_tree_pages(key.extra_key, key.tokens, r.total_len);
  return r;
}

void HiCache::cache_finished_req(cache::CacheRequest& req, int64_t kv_len,
                                 cache::FinishPolicy policy) {
  const int64_t len = kv_len / page_size() * page_size();
  device_.cache_finished_req(req, kv_len, policy);
  if (policy == cache::FinishPolicy::kInsert) note_tree_pages(req.extra_key, req.tokens, len);
}

void HiCache::cache_unfinished_req(cache::CacheRequest& req, int64_t fill_len) {
  device_.cache_unfinished_req(req, fill_len);
  note_tree_pages(req.extra_key, req.tokens, fill_len / page_size() * page_size());
}

void HiCache::note_tree_pages(std::string_view extra_key, std::span<const int32_t> tokens,
                              int64_t len) {
  if (len <= 0) return;
  const int32_t p = page_size();
  const cache::PrefixMatch m =
      device_.match_prefix(cache::RadixKey{tokens.first(static_cast<size_t>(len)), extra_key},
                           len, scratch_);
  PAGODA_CHECK_EQ(m.length, len);
  bool keyed = false;
  std::vector<int32_t> fresh;
  for (int64_t i = 0; i < len / p; ++i) {
    TreePage& tp = tree_pages_[static_cast<size_t>(page_of(scratch_[static_cast<size_t>(i * p)]))];
    if (tp.in_tree) continue;
    if (!keyed) {
      page_keys(extra_key, tokens, p, len / p, keys_);
      keyed = true;
    }
    tp = TreePage{.key = keys_[static_cast<size_t>(i)],
                  .parent = parent_key(extra_key, static_cast<size_t>(i)),
                  .hits = 0,
                  .in_tree = true,
                  .origin = Origin::kCounted};
    fresh.push_back(page_of(scratch_[static_cast<size_t>(i * p)]));
  }
  if (config_.write_policy == WritePolicy::kWriteThrough) backup_pages(fresh, false);
}

void HiCache::backup_pages(std::span<const int32_t> pages, bool wait) {
  std::vector<int32_t> dev;
  for (int32_t page : pages) {
    const TreePage& tp = tree_pages_[static_cast<size_t>(page)];
    if (!host_.contains(tp.key)) dev.push_back(page);
  }
  if (dev.empty()) return;
  const std::vector<int32_t> host = host_.reserve(static_cast<int64_t>(dev.size()));
  tier_.backup_skipped_pages += static_cast<int64_t>(dev.size() - host.size());
  dev.resize(host.size());
  if (dev.empty()) return;
  controller_.backup(dev, host);
  for (size_t i = 0; i < dev.size(); ++i) {
    const TreePage& tp = tree_pages_[static_cast<size_t>(dev[i])];
    host_.add(tp.key, tp.parent, host[i]);
  }
  if (wait) controller_.synchronize();
  if (storage_ != nullptr) flush_puts();
}

void HiCache::on_removed(std::span<const SlotIndex> slots) {
  const auto p = static_cast<size_t>(page_size());
  for (size_t i = 0; i < slots.size(); i += p) evicted_.push_back(page_of(slots[i]));
}

void HiCache::finish_evictions() {
  if (evicted_.empty()) return;
  // Pages not yet on the host are backed up first (write_back; write_through's stragglers).
  // A queued or running copy may still read (backup) or write (load-back) these pages; they go
  // back to the allocator's users only after this returns, and only the copies of these pages
  // are waited for (one wait, covering the backups just issued).
  if (config_.write_policy != WritePolicy::kWriteThroughSelective) {
    std::sort(evicted_.begin(), evicted_.end());  // page order ~ insertion order: parents first
    backup_pages(evicted_, false);
  }
  controller_.quiesce_pages(evicted_);
  for (int32_t page : evicted_) tree_pages_[static_cast<size_t>(page)] = TreePage{};
  evicted_.clear();
}

int64_t HiCache::evict(int64_t num_tokens) {
  const int64_t n = device_.evict(num_tokens);
  finish_evictions();
  return n;
}

int64_t HiCache::host_run(size_t from, size_t to) const {
  size_t j = from;
  while (j < to && host_.contains(keys_[j])) ++j;
  return static_cast<int64_t>(j - from);
}

TierMatch HiCache::match_tiers(const cache::RadixKey& key, int64_t max_prefix_len) {
  const int32_t p = page_size();
  const int64_t cap = std::min<int64_t>(max_prefix_len, static_cast<int64_t>(key.tokens.size())) / p;
  const cache::PrefixMatch m = device_.match_prefix(key, max_prefix_len, scratch_);
  TierMatch t{.device_len = m.length, .host_len = 0};
  if (m.length / p < cap) {
    page_keys(key.extra_key, key.tokens, p, cap, keys_);
    t.host_len = host_run(static_cast<size_t>(m.length / p), static_cast<size_t>(cap)) * p;
  }
  return t;
}

void HiCache::admit(cache::CacheRequest& req, int64_t max_prefix_len) {
  PAGODA_REQUIRE(!req.last_node.has_node(), kFailedPrecondition,
                 "admit: the request already holds a lock");
  const int32_t p = page_size();
  const cache::RadixKey key{req.tokens, req.extra_key};
  const int64_t queried = std::min<int64_t>(max_prefix_len, static_cast<int64_t>(req.tokens.size()));
  const int64_t cap = queried / p;
  cache::PrefixMatch m = device_.match_prefix(key, max_prefix_len, req.prefix_slots);
  const int64_t device_len = m.length;
  // Selective write-through: count the hit on every matched page.
  if (config_.write_policy == WritePolicy::kWriteThroughSelective) {
    std::vector<int32_t> due;
    for (int64_t i = 0; i < device_len / p; ++i) {
      const int32_t page = page_of(req.prefix_slots[static_cast<size_t>(i * p)]);
      if (++tree_pages_[static_cast<size_t>(page)].hits == config_.selective_threshold)
        due.push_back(page);
    }
    backup_pages(due, false);
  }
  int64_t skipped = 0;
  if (device_len / p < cap) {
    page_keys(req.extra_key, req.tokens, p, cap, keys_);
    const auto first = static_cast<size_t>(device_len / p);
    const auto end = static_cast<size_t>(cap);
    // Pinned: the room-making below (and adopting the read-ahead) may evict host pages, never
    // these.
    const auto run = static_cast<size_t>(host_run(first, end));
    for (size_t i = first; i < first + run; ++i) host_.pin(keys_[i]);
    size_t fetched = 0;
    if (adopt_prefetch(req)) {
      fetched = static_cast<size_t>(host_run(first + run, end));
      for (size_t i = first + run; i < first + run + fetched; ++i) host_.pin(keys_[i]);
    } else if (storage_ != nullptr && config_.prefetch != PrefetchPolicy::kBestEffort) {
      fetched = static_cast<size_t>(fetch_from_storage(req.extra_key, first + run, end));
    }
    const auto total = static_cast<int64_t>(run + fetched);
    const bool loaded = total > 0 && load_back(req, m, first, total, static_cast<int64_t>(run));
    if (total > 0 && !loaded) skipped = total * p;
    for (size_t i = first; i < first + run + fetched; ++i) host_.unpin(keys_[i]);
    if (loaded) m = device_.match_prefix(key, max_prefix_len, req.prefix_slots);
  } else {
    forget(req);
  }
  device_.inc_lock_ref(m.last_node);
  req.cache_protected_len = m.length;
  req.last_node = m.last_node;
  Admission a{.req = &req, .queried = queried, .skipped = skipped, .pages = {}};
  for (int64_t i = 0; i < m.length / p; ++i)
    a.pages.push_back(page_of(req.prefix_slots[static_cast<size_t>(i * p)]));
  pending_.push_back(std::move(a));
}

bool HiCache::load_back(const cache::CacheRequest& req, const cache::PrefixMatch& m, size_t first,
                        int64_t total, int64_t from_host) {
  const int32_t p = page_size();
  const int64_t device_len = m.length;
  device_.inc_lock_ref(m.last_node);  // the device prefix survives the room-making below
  const int64_t need = total * p;
  if (allocator_->available_size() < need) evict(need - allocator_->available_size());
  auto slots = allocator_->alloc(need);
  if (slots) {
    std::vector<int32_t> host_pages, dev_pages;
    for (int64_t i = 0; i < total; ++i) {
      const PageKey& k = keys_[first + static_cast<size_t>(i)];
      host_pages.push_back(host_.page_of(k));
      host_.touch(k);
      const int32_t page = page_of((*slots)[static_cast<size_t>(i * p)]);
      dev_pages.push_back(page);
      tree_pages_[static_cast<size_t>(page)] = TreePage{
          .key = k,
          .parent = parent_key(req.extra_key, first + static_cast<size_t>(i)),
          .hits = 0,
          .in_tree = true,
          .origin = i < from_host ? Origin::kHost : Origin::kStorage};
    }
    controller_.load(host_pages, dev_pages);
    std::vector<SlotIndex> all(req.prefix_slots.begin(), req.prefix_slots.begin() + device_len);
    all.insert(all.end(), slots->begin(), slots->end());
    const cache::InsertResult r = device_.insert(
        cache::RadixKey{std::span<const int32_t>(req.tokens).first(all.size()), req.extra_key},
        all, cache::InsertOptions{.ownership = cache::SlotOwnership::kTransfer});
    PAGODA_CHECK_EQ(r.prefix_len, device_len);
  }
  device_.dec_lock_ref(m.last_node);
  return slots.has_value();
}

int64_t HiCache::fetch_from_storage(std::string_view extra_key, size_t from, size_t to) {
  const std::span<const PageKey> want(keys_.data() + from, to - from);
  const int64_t present = storage_->batch_exists(want);
  if (present == 0) return 0;
  const auto deadline =
      std::chrono::steady_clock::now() + config_.prefetch_timeout(present * page_size());
  std::vector<int32_t> pages = host_.reserve(present);
  size_t used = 0;
  int64_t got = 0;
  for (int64_t i = 0; i < present; ++i) {
    const PageKey& k = want[static_cast<size_t>(i)];
    if (!host_.contains(k)) {
      if (used == pages.size()) break;  // the host tier is full
      if (config_.prefetch == PrefetchPolicy::kTimeout && std::chrono::steady_clock::now() > deadline)
        break;
      if (!storage_->get(k, staging_)) break;  // a miss or a corrupt page: recompute from here
      kv::write_page(host_pool_.pool(), pages[used], staging_);
      host_.add(k, parent_key(extra_key, from + static_cast<size_t>(i)), pages[used++]);
    }
    host_.pin(k);
    ++got;
  }
  host_.give_back(std::span<const int32_t>(pages).subspan(used));
  flush_puts();
  return got;
}

void HiCache::prefetch(const cache::CacheRequest& req, int64_t max_prefix_len) {
  if (prefetcher_ == nullptr || prefetches_.count(&req) != 0) return;
  const int32_t p = page_size();
  const int64_t cap =
      std::min<int64_t>(max_prefix_len, static_cast<int64_t>(req.tokens.size())) / p;
  const int64_t device_pages =
      device_.match_prefix(cache::RadixKey{req.tokens, req.extra_key}, max_prefix_len, scratch_)
          .length /
      p;
  if (device_pages >= cap) return;
  page_keys(req.extra_key, req.tokens, p, cap, keys_);
  const auto from = static_cast<size_t>(
      device_pages + host_run(static_cast<size_t>(device_pages), static_cast<size_t>(cap)));
  // In flight at most the host tier's capacity: adopted pages must find room there.
  const int64_t n = std::min<int64_t>(cap - static_cast<int64_t>(from),
                                      host_.capacity_pages() - prefetch_inflight_pages_);
  if (n <= 0) return;
  std::vector<PageKey> keys(keys_.begin() + static_cast<std::ptrdiff_t>(from),
                            keys_.begin() + static_cast<std::ptrdiff_t>(from) + n);
  prefetch_inflight_pages_ += n;
  ++tier_.prefetch_jobs;
  prefetches_.emplace(&req, Prefetch{.job = prefetcher_->start(std::move(keys)),
                                     .parent = parent_key(req.extra_key, from),
                                     .deadline = std::chrono::steady_clock::now() +
                                                 config_.prefetch_timeout(n * p)});
}

bool HiCache::admission_ready(const cache::CacheRequest& req, bool block) {
  const auto it = prefetches_.find(&req);
  if (it == prefetches_.end() || config_.prefetch == PrefetchPolicy::kBestEffort) return true;
  const Prefetch& f = it->second;
  const bool timed = config_.prefetch == PrefetchPolicy::kTimeout;
  if (f.job->done() || (timed && std::chrono::steady_clock::now() >= f.deadline)) return true;
  if (!block) {
    ++tier_.prefetch_waits;
    return false;
  }
  prefetcher_->wait(*f.job, timed ? std::optional(f.deadline) : std::nullopt);
  return true;
}

void HiCache::forget(const cache::CacheRequest& req) {
  const auto it = prefetches_.find(&req);
  if (it == prefetches_.end()) return;
  it->second.job->cancel();
  prefetch_inflight_pages_ -= static_cast<int64_t>(it->second.job->keys().size());
  prefetches_.erase(it);
}

int64_t HiCache::prefetch_arrived(const cache::CacheRequest& req) const {
  const auto it = prefetches_.find(&req);
  return it == prefetches_.end() ? -1 : it->second.job->arrived();
}

bool HiCache::adopt_prefetch(const cache::CacheRequest& req) {
  const auto it = prefetches_.find(&req);
  if (it == prefetches_.end()) return false;
  const std::shared_ptr<PrefetchJob> job = it->second.job;
  PageKey parent = it->second.parent;
  forget(req);  // cancels what has not arrived (best_effort, timeout)
  const int64_t arrived = job->arrived();
  int64_t want = 0;
  for (int64_t i = 0; i < arrived; ++i)
    want += !host_.contains(job->keys()[static_cast<size_t>(i)]);
  const std::vector<int32_t> pages = host_.reserve(want);
  size_t used = 0;
  for (int64_t i = 0; i < arrived; ++i) {
    const PageKey& k = job->keys()[static_cast<size_t>(i)];
    if (!host_.contains(k)) {
      if (used == pages.size()) break;  // the host tier is full: the rest is recomputed
      kv::write_page(host_pool_.pool(), pages[used], job->page(i));
      host_.add(k, parent, pages[used++]);
      ++tier_.prefetch_pages;
    }
    parent = k;
  }
  host_.give_back(std::span<const int32_t>(pages).subspan(used));
  flush_puts();
  return true;
}

PageKey HiCache::parent_key(std::string_view extra_key, size_t index) const {
  return index > 0 ? keys_[index - 1] : root_key(extra_key);
}

void HiCache::unadmit(cache::CacheRequest& req) {
  PrefixCache::unadmit(req);
  std::erase_if(pending_, [&](const Admission& a) { return a.req == &req; });
}

StepCopies HiCache::begin_step() {
  for (const Admission& a : pending_) {
    ++stats_.match_calls;
    stats_.queried_tokens += a.queried;
    stats_.matched_tokens += static_cast<int64_t>(a.pages.size()) * page_size();
    tier_.load_skipped_tokens += a.skipped;
    for (int32_t page : a.pages) {
      TreePage& tp = tree_pages_[static_cast<size_t>(page)];
      int64_t& hits = tp.origin == Origin::kHost      ? tier_.host_hit_tokens
                      : tp.origin == Origin::kStorage ? tier_.storage_hit_tokens
                                                      : tier_.device_hit_tokens;
      hits += page_size();
      tp.origin = Origin::kCounted;
    }
  }
  pending_.clear();
  return controller_.take();
}

int64_t HiCache::drain_host() {
  const int64_t n = host_.evict(host_.num_entries());
  if (storage_ != nullptr) flush_puts();
  return n;
}

const cache::CacheStats& HiCache::stats() const {
  const cache::CacheStats& d = device_.stats();
  stats_.inserted_tokens = d.inserted_tokens;
  stats_.evicted_tokens = d.evicted_tokens;
  stats_.evicted_nodes = d.evicted_nodes;
  return stats_;
}

TierStats HiCache::tier_stats() const {
  TierStats s = tier_;
  s.host_pages = host_.num_entries();
  s.host_evicted_pages = host_.evicted_pages();
  s.host_capacity_pages = host_.capacity_pages();
  s.transfer = controller_.stats();
  if (storage_ != nullptr) {
    s.has_storage = true;
    s.storage = storage_->stats();
    s.storage += prefetcher_->stats();
  }
  return s;
}

void HiCache::check_integrity() const {
  device_.check_integrity();
  host_pool_.pages().check_integrity();
  host_.check_integrity();
  PAGODA_CHECK(evicted_.empty(), "HiCache: {} evicted pages not finished", evicted_.size());
  int64_t in_tree = 0;
  for (const TreePage& tp : tree_pages_) in_tree += tp.in_tree;
  // Every page of the device tree is recorded once (its key is known), and no other page is.
  PAGODA_CHECK_EQ(in_tree * page_size(), device_.total_size());
}

}  // namespace pagoda::tier
