#include "pagoda/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::engine {

using attention::ForwardMode;

namespace {
/// SGLang's SGLANG_RETRACT_DECODE_STEPS: decode steps of headroom assumed after a retraction.
constexpr int64_t kRetractDecodeSteps = 20;
/// SGLang falls back from LPM to FCFS when the queue is longer than this.
constexpr size_t kLpmMaxQueue = 128;
}  // namespace

void SchedulerConfig::validate(int32_t page_size) const {
  PAGODA_REQUIRE(page_size >= 1, kInvalidArgument, "page size must be >= 1 (got {})", page_size);
  PAGODA_REQUIRE(max_running_requests >= 1, kInvalidArgument,
                 "max_running_requests must be >= 1 (got {})", max_running_requests);
  PAGODA_REQUIRE(chunk_size >= 0 && chunk_size % page_size == 0, kInvalidArgument,
                 "chunk size {} must be 0 (off) or a positive multiple of the page size {}",
                 chunk_size, page_size);
  PAGODA_REQUIRE(max_prefill_tokens >= 1, kInvalidArgument,
                 "max_prefill_tokens must be >= 1 (got {})", max_prefill_tokens);
  const auto& r = new_token_ratio;
  PAGODA_REQUIRE(r.min >= 0.0 && r.init >= r.min && r.init <= 1.0 && r.decay >= 0.0,
                 kInvalidArgument, "new_token_ratio needs 0 <= min <= init <= 1, decay >= 0");
}

Scheduler::Scheduler(const SchedulerConfig& config, kv::PageAllocator& allocator,
                     kv::ReqToTokenTable& table, cache::PrefixCache& cache)
    : config_(config),
      allocator_(&allocator),
      table_(&table),
      cache_(&cache),
      page_size_(allocator.page_size()),
      new_token_ratio_(config.new_token_ratio.init) {
  config.validate(page_size_);
}

void Scheduler::enqueue(Req* req) {
  req->state = RequestState::kWaiting;
  waiting_.push_back(req);
  cache_->prefetch(req->cache, cache::scheduler_prefix_limit(req->num_tokens()));
}

int64_t Scheduler::pages_for(int64_t from_len, int64_t to_len) const {
  const int64_t p = page_size_;
  return (to_len + p - 1) / p - (from_len + p - 1) / p;
}

int64_t Scheduler::decode_need_tokens(const std::vector<Req*>& reqs) const {
  int64_t pages = 0;
  for (const Req* r : reqs)
    if (r->kv_len % page_size_ == 0) ++pages;
  return pages * page_size_;
}

bool Scheduler::make_room(int64_t tokens) {
  const int64_t avail = allocator_->available_size();
  if (avail < tokens) cache_->evict(tokens - avail);
  if (allocator_->available_size() < tokens) return false;
  if (swa_ == nullptr) return true;
  // The SWA pool: the cache's window sides first (tombstones), then whole leaves.
  const int64_t pages = (tokens + page_size_ - 1) / page_size_;
  kv::PageAllocator& swa = swa_->swa();
  if (swa.num_free_pages() < pages && swa_cache_ != nullptr)
    swa_cache_->evict_swa(pages - swa.num_free_pages());
  while (swa.num_free_pages() < pages &&
         cache_->evict((pages - swa.num_free_pages()) * page_size_) > 0) {
  }
  return swa.num_free_pages() >= pages;
}

std::string Scheduler::pool_capacity() const {
  const int64_t full = int64_t{allocator_->num_pages()} * page_size_;
  if (swa_ == nullptr) return fmt::format("the pool holds {} tokens", full);
  return fmt::format("the pool holds {} tokens and the SWA pool {} (it must hold a prefill chunk "
                     "plus every running request's window)",
                     full, int64_t{swa_->swa().num_pages()} * page_size_);
}

void Scheduler::use_swa(kv::SwaPages& pages, cache::SwaRadixCache* cache, int window_left) {
  PAGODA_CHECK(waiting_.empty() && running_.empty() && chunked_ == nullptr);
  PAGODA_REQUIRE(pages.page_size() == page_size_ && &pages.full() == allocator_ &&
                     window_left >= 0,
                 kInvalidArgument, "use_swa: pages over another pool or window_left {} < 0",
                 window_left);
  swa_ = &pages;
  swa_cache_ = cache;
  swa_window_ = window_left;
}

void Scheduler::attach_swa(std::span<const SlotIndex> slots) {
  if (swa_ == nullptr) return;
  std::vector<int32_t> fresh;
  for (SlotIndex s : slots)
    if (s % page_size_ == 0) fresh.push_back(s / page_size_);
  const bool ok = swa_->attach_swa(fresh);
  PAGODA_CHECK(ok, "no SWA pages after make_room");
}

void Scheduler::release_swa(Req* req) {
  if (swa_ == nullptr) return;
  const int64_t dead = kv::SwaPages::swa_dead_pages(req->kv_len, swa_window_, page_size_);
  const int64_t from =
      std::max(req->swa_released_pages, req->cache.cache_protected_len / page_size_);
  if (from < dead) {
    const auto row = table_->read(req->cache.req_slot, from * page_size_, (dead - from) * page_size_);
    std::vector<int32_t> pages;
    for (int64_t k = 0; k < dead - from; ++k)
      pages.push_back(row[static_cast<size_t>(k * page_size_)] / page_size_);
    swa_->release_swa(pages);
    stats_.swa_released_pages += dead - from;
  }
  req->swa_released_pages = std::max(req->swa_released_pages, dead);
  const int64_t held =
      pages_for(0, req->kv_len) - std::max(req->swa_released_pages,
                                           req->cache.cache_protected_len / page_size_);
  stats_.peak_swa_pages_per_request = std::max(stats_.peak_swa_pages_per_request, held);
}

int64_t Scheduler::request_private_swa_pages() const {
  int64_t pages = 0;
  if (swa_ == nullptr) return 0;
  for_each_active([&](const Req* r) {
    const auto row = table_->row(r->cache.req_slot);
    for (int64_t k = r->cache.cache_protected_len / page_size_; k < pages_for(0, r->kv_len); ++k)
      pages += swa_->has_swa(row[static_cast<size_t>(k * page_size_)] / page_size_);
  });
  return pages;
}

int64_t Scheduler::reserved_for_running() const {
  double reserved = 0.0;
  for (const Req* r : running_)
    reserved += static_cast<double>(r->max_new_tokens - r->num_output()) * new_token_ratio_;
  for (const Req* r : transferring_)
    reserved += static_cast<double>(r->max_new_tokens) * new_token_ratio_;
  if (chunked_ != nullptr) {
    reserved += static_cast<double>(chunked_->num_tokens() - chunked_->kv_len);
    reserved += static_cast<double>(chunked_->max_new_tokens - chunked_->num_output()) *
                new_token_ratio_;
  }
  return static_cast<int64_t>(std::ceil(reserved));
}

ScheduledStep Scheduler::schedule() {
  ScheduledStep step;
  const bool want_prefill = chunked_ != nullptr || !waiting_.empty();
  if (!config_.mixed_batches && want_prefill) {
    schedule_prefill(step, 0);
    if (!step.empty()) {
      step.mode = ForwardMode::kExtend;
      update_peak();
      return step;
    }
  }
  prepare_decode_memory(step);
  if (config_.mixed_batches && want_prefill && step.retracted.empty())
    schedule_prefill(step, decode_need_tokens(running_));
  const bool has_extend = !step.seqs.empty();
  alloc_decode(step);
  const bool has_decode = !running_.empty();
  if (has_extend && has_decode) {
    step.mode = ForwardMode::kMixed;
  } else if (has_extend) {
    step.mode = ForwardMode::kExtend;
  } else if (has_decode) {
    step.mode = ForwardMode::kDecode;
  }
  if (has_decode) {
    new_token_ratio_ =
        std::max(config_.new_token_ratio.min, new_token_ratio_ - config_.new_token_ratio.decay);
  }
  update_peak();
  return step;
}

void Scheduler::prepare_decode_memory(ScheduledStep& step) {
  if (running_.empty() || make_room(decode_need_tokens(running_))) return;
  // SGLang's retract_decode: sort by (len(output), -len(input)) descending, pop from the end.
  int64_t decoded = 0, max_new = 0;
  for (const Req* r : running_) {
    decoded += r->num_output();
    max_new += r->max_new_tokens;
  }
  const size_t before = running_.size();
  std::vector<Req*> order = running_;
  std::stable_sort(order.begin(), order.end(), [](const Req* a, const Req* b) {
    if (a->num_output() != b->num_output()) return a->num_output() > b->num_output();
    return a->prompt_len < b->prompt_len;
  });
  while (!order.empty() && !make_room(decode_need_tokens(order))) {
    if (order.size() == 1 && chunked_ != nullptr) {
      Req* c = std::exchange(chunked_, nullptr);
      retract(c);
      step.retracted.push_back(c);
      continue;
    }
    Req* victim = order.back();
    order.pop_back();
    if (order.empty()) {
      abort(victim, fmt::format("KV cache exhausted: the request needs {} tokens but {}",
                                victim->kv_len + 1, pool_capacity()));
      step.aborted.push_back(victim);
    } else {
      retract(victim);
      step.retracted.push_back(victim);
    }
  }
  std::vector<Req*> kept;
  for (Req* r : running_)
    if (std::find(order.begin(), order.end(), r) != order.end()) kept.push_back(r);
  running_ = std::move(kept);
  if (running_.size() < before && max_new > 0) {
    const double estimate =
        static_cast<double>(decoded + kRetractDecodeSteps * static_cast<int64_t>(before)) /
        static_cast<double>(max_new);
    new_token_ratio_ = std::min(1.0, std::max(estimate, config_.new_token_ratio.min));
  }
}

void Scheduler::sort_waiting() {
  if (config_.policy != SchedulePolicy::kLongestPrefixMatch || waiting_.size() > kLpmMaxQueue)
    return;
  std::vector<std::pair<int64_t, Req*>> keyed;
  keyed.reserve(waiting_.size());
  for (Req* r : waiting_) {
    const auto m = cache_->match_prefix(cache::RadixKey{r->cache.tokens, r->cache.extra_key},
                                        cache::scheduler_prefix_limit(r->num_tokens()));
    keyed.emplace_back(static_cast<int64_t>(m.slots.size()), r);
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) waiting_[i] = keyed[i].second;
}

void Scheduler::schedule_prefill(ScheduledStep& step, int64_t reserved_tokens) {
  int64_t budget = config_.chunk_size > 0 ? config_.chunk_size : config_.max_prefill_tokens;
  int64_t reserved = reserved_tokens + reserved_for_running();
  if (chunked_ != nullptr && !add_extend(chunked_, budget, reserved, step)) return;
  if (waiting_.empty()) return;
  sort_waiting();
  while (!waiting_.empty() && budget > 0) {
    const size_t admitted_now =
        std::count_if(step.seqs.begin(), step.seqs.end(),
                      [&](const ScheduledSeq& s) { return s.req != chunked_; });
    if (running_.size() + transferring_.size() + (chunked_ ? 1 : 0) + admitted_now >=
            static_cast<size_t>(config_.max_running_requests) ||
        table_->num_free_rows() == 0) {
      break;
    }
    Req* r = waiting_.front();
    const bool alone = running_.empty() && chunked_ == nullptr && step.seqs.empty();
    // The cache's prefetch policy may hold the queue's head for its pages (FCFS order is kept;
    // running requests go on). With nothing else to run, wait here for what the policy allows.
    if (!cache_->admission_ready(r->cache, alone)) break;
    if (!add_extend(r, budget, reserved, step)) {
      if (alone) {
        // Nothing else holds memory and it still does not fit: it never will.
        waiting_.pop_front();
        abort(r, fmt::format("KV cache exhausted: the request needs {} tokens but {}",
                             r->num_tokens(), pool_capacity()));
        step.aborted.push_back(r);
        continue;
      }
      break;
    }
    waiting_.pop_front();
    reserved += static_cast<int64_t>(
        std::ceil(static_cast<double>(r->max_new_tokens - r->num_output()) * new_token_ratio_));
  }
}

bool Scheduler::add_extend(Req* req, int64_t& budget, int64_t reserved_tokens,
                           ScheduledStep& step) {
  const bool is_new = req->state == RequestState::kWaiting;
  // A hybrid model's request takes its (zero) state slot first: a prefix hit restores the
  // state into it at admit (cache::MambaRadixCache).
  if (is_new && state_ != nullptr && !alloc_state(req)) return false;
  if (is_new) cache_->admit(req->cache, cache::scheduler_prefix_limit(req->num_tokens()));
  const int64_t prefix_len =
      is_new ? static_cast<int64_t>(req->cache.prefix_slots.size()) : req->kv_len;
  auto undo = [&] {
    if (is_new) {
      cache_->unadmit(req->cache);
      free_state(req);
    }
    return false;
  };
  const int64_t remaining = req->num_tokens() - prefix_len;
  PAGODA_CHECK_GT(remaining, 0);
  int64_t n = remaining;
  if (n > budget) {
    if (config_.chunk_size > 0) {
      n = (prefix_len + budget) / page_size_ * page_size_ - prefix_len;
      if (n <= 0) return undo();
    } else if (!step.seqs.empty()) {
      return undo();
    }
  }
  const bool alone = running_.empty() && step.seqs.empty() &&
                     (chunked_ == nullptr || chunked_ == req);
  const int64_t hard = pages_for(prefix_len, prefix_len + n) * page_size_;
  const int64_t future =
      (remaining - n) + static_cast<int64_t>(std::ceil(
                            static_cast<double>(req->max_new_tokens - req->num_output()) *
                            new_token_ratio_));
  const int64_t capacity = allocator_->available_size() + cache_->evictable_size();
  if (!alone && hard + reserved_tokens + future > capacity) return undo();
  if (swa_ != nullptr && !alone) {
    // The SWA pool: this extend's pages and the next page of every running request's window.
    const int64_t swa_capacity = swa_->swa().num_free_pages() +
                                 (swa_cache_ != nullptr ? swa_cache_->swa_evictable_pages() : 0);
    if (hard / page_size_ + static_cast<int64_t>(running_.size()) > swa_capacity) return undo();
  }
  if (!make_room(hard)) return undo();
  if (is_new) {
    const auto row = table_->alloc();
    if (!row) return undo();
    req->cache.req_slot = *row;
    table_->write(*row, 0, req->cache.prefix_slots);
  }
  const ReqSlot row = req->cache.req_slot;
  const int32_t pre = static_cast<int32_t>(prefix_len);
  const int32_t seq = static_cast<int32_t>(prefix_len + n);
  const SlotIndex last_loc = pre > 0 ? table_->row(row)[pre - 1] : -1;
  auto slots = allocator_->alloc_extend(std::span(&pre, 1), std::span(&seq, 1),
                                        std::span(&last_loc, 1));
  PAGODA_CHECK(slots.has_value(), "alloc_extend failed after make_room({})", hard);
  attach_swa(*slots);
  table_->write(row, prefix_len, *slots);
  step.out_cache_loc.insert(step.out_cache_loc.end(), slots->begin(), slots->end());
  step.seqs.push_back(ScheduledSeq{.req = req,
                                   .prefix_len = prefix_len,
                                   .num_tokens = n,
                                   .completes_fill = n == remaining,
                                   .is_decode = false});
  if (is_new) {
    ++stats_.admitted;
    stats_.fill_tokens += req->num_tokens();
    stats_.cached_tokens += prefix_len;
    if (!req->admitted_once) req->out.cached_tokens = prefix_len;
    req->admitted_once = true;
    req->state = RequestState::kPrefilling;
    req->kv_len = prefix_len;
  }
  budget -= n;
  return true;
}

void Scheduler::alloc_decode(ScheduledStep& step) {
  if (running_.empty()) return;
  // Admission kept available + evictable >= this need (it reserved it), so this cannot fail.
  const bool room = make_room(decode_need_tokens(running_));
  PAGODA_CHECK(room, "no room for the decode tokens after admission");
  std::vector<int32_t> seq_lens;
  std::vector<SlotIndex> last_loc;
  for (const Req* r : running_) {
    PAGODA_CHECK_GE(r->kv_len, 1);
    seq_lens.push_back(static_cast<int32_t>(r->kv_len + 1));
    last_loc.push_back(table_->row(r->cache.req_slot)[r->kv_len - 1]);
  }
  auto slots = allocator_->alloc_decode(seq_lens, last_loc);
  PAGODA_CHECK(slots.has_value(), "alloc_decode failed after prepare_decode_memory");
  attach_swa(*slots);
  for (size_t i = 0; i < running_.size(); ++i) {
    Req* r = running_[i];
    table_->write(r->cache.req_slot, r->kv_len, std::span(&(*slots)[i], 1));
    step.seqs.push_back(ScheduledSeq{
        .req = r, .prefix_len = r->kv_len, .num_tokens = 1, .completes_fill = true,
        .is_decode = true});
    step.out_cache_loc.push_back((*slots)[i]);
  }
}

void Scheduler::complete_extend(const ScheduledSeq& seq) {
  Req* req = seq.req;
  req->kv_len = seq.prefix_len + seq.num_tokens;
  note_aligned_state(req);
  release_swa(req);  // before the chunk is cached: dead pages go in as tombstones
  if (!seq.completes_fill) {
    cache_->cache_unfinished_req(req->cache, req->kv_len);
    chunked_ = req;
    req->state = RequestState::kPrefilling;
    return;
  }
  if (chunked_ == req) chunked_ = nullptr;
  req->state = RequestState::kDecoding;
  running_.push_back(req);
}

void Scheduler::complete_decode(Req* req, int64_t n) {
  PAGODA_CHECK_GE(n, 1);
  req->kv_len += n;
  note_aligned_state(req);
  release_swa(req);
  if (n > 1) update_peak();  // a speculative round's kept tokens
}

void Scheduler::finish(Req* req) { table_->free(finish_keep_row(req)); }

ReqSlot Scheduler::finish_keep_row(Req* req) {
  cache_->cache_finished_req(req->cache, req->kv_len, cache::FinishPolicy::kInsert);
  const ReqSlot row = req->cache.req_slot;
  req->cache.req_slot = ReqSlot{};
  free_state(req);
  req->state = RequestState::kFinished;
  std::erase(running_, req);
  if (chunked_ == req) chunked_ = nullptr;
  return row;
}

void Scheduler::undo_decode(Req* req) {
  PAGODA_CHECK_GE(req->kv_len, 2);
  --req->kv_len;
  if (req->kv_len % page_size_ == 0) {  // the decode slot opened a fresh page
    const SlotIndex slot = table_->row(req->cache.req_slot)[req->kv_len];
    allocator_->free(std::span(&slot, 1));
  }
}

void Scheduler::cancel(Req* req, FinishReason reason) {
  if (req->state == RequestState::kFinished) return;
  if (req->state == RequestState::kWaiting) {
    std::erase(waiting_, req);
    cache_->forget(req->cache);
    req->state = RequestState::kFinished;
  } else if (std::erase(transferring_, req) > 0) {  // its KV never arrived: nothing to cache
    release_no_insert(req);
    req->state = RequestState::kFinished;
  } else {
    finish(req);
  }
  req->out.finish_reason = reason;
}

void Scheduler::release_no_insert(Req* req) {
  cache_->cache_finished_req(req->cache, req->kv_len, cache::FinishPolicy::kNoInsert);
  table_->free(req->cache.req_slot);
  req->cache.req_slot = ReqSlot{};
  free_state(req);
  req->kv_len = 0;
  req->swa_released_pages = 0;
}

bool Scheduler::alloc_state(Req* req) {
  // With the snapshot cache at page > 1, a second slot keeps the state at the last page
  // boundary a step ended at (CacheRequest::aligned_state_slot).
  const int need = cache::request_state_slots(state_cache_ != nullptr, page_size_);
  // Radix snapshots give way to running requests (the least recently used first).
  if (state_->num_free() < need && state_cache_ != nullptr)
    state_cache_->evict_states(need - state_->num_free());
  if (state_->num_free() < need) return false;
  req->cache.state_slot = state_->alloc();
  if (need == 2) {
    req->cache.aligned_state_slot = state_->alloc();
    req->cache.aligned_state_len = -1;
  }
  return true;
}

void Scheduler::free_state(Req* req) {
  // Zeroed: a re-admission starts from a fresh state.
  if (req->cache.state_slot >= 0) state_->free(req->cache.state_slot);
  if (req->cache.aligned_state_slot >= 0) state_->free(req->cache.aligned_state_slot);
  req->cache.state_slot = -1;
  req->cache.aligned_state_slot = -1;
  req->cache.aligned_state_len = -1;
}

void Scheduler::note_aligned_state(Req* req) {
  if (req->cache.aligned_state_slot < 0 || req->kv_len % page_size_ != 0) return;
  state_->copy_slot(req->cache.state_slot, req->cache.aligned_state_slot);
  req->cache.aligned_state_len = req->kv_len;
}

std::vector<int32_t> Scheduler::request_state_slots() const {
  std::vector<int32_t> slots;
  for_each_active([&](const Req* r) {
    if (r->cache.state_slot >= 0) slots.push_back(r->cache.state_slot);
    if (r->cache.aligned_state_slot >= 0) slots.push_back(r->cache.aligned_state_slot);
  });
  return slots;
}

void Scheduler::retract(Req* req) {
  release_no_insert(req);
  req->state = RequestState::kWaiting;
  ++req->out.num_retractions;
  ++stats_.retractions;
  waiting_.push_front(req);
}

void Scheduler::abort(Req* req, std::string message) {
  // A request refused at admission (it alone does not fit) holds no row, lock or pages.
  if (req->cache.req_slot.valid()) release_no_insert(req);
  req->state = RequestState::kFinished;
  req->out.finish_reason = FinishReason::kError;
  req->out.error = std::move(message);
  ++stats_.aborted;
}

int64_t Scheduler::request_private_pages() const {
  int64_t pages = 0;
  auto count = [&](const Req* r) {
    pages += pages_for(0, r->kv_len) - r->cache.cache_protected_len / page_size_;
  };
  for_each_active(count);
  return pages;
}

bool Scheduler::preallocate(Req* req) {
  PAGODA_CHECK(req->state == RequestState::kWaiting && !req->cache.req_slot.valid(),
               "preallocate of a request that is queued or holds memory");
  const size_t live = running_.size() + transferring_.size() + (chunked_ ? 1 : 0);
  if (live >= static_cast<size_t>(config_.max_running_requests) || table_->num_free_rows() == 0)
    return false;
  const int64_t len = req->prompt_len;
  cache_->admit(req->cache, cache::scheduler_prefix_limit(len));
  const auto prefix = static_cast<int64_t>(req->cache.prefix_slots.size());
  const int64_t hard = pages_for(prefix, len) * page_size_;
  const auto future = static_cast<int64_t>(
      std::ceil(static_cast<double>(req->max_new_tokens) * new_token_ratio_));
  const int64_t capacity = allocator_->available_size() + cache_->evictable_size();
  std::optional<ReqSlot> row;
  const bool fits = live == 0 || hard + reserved_for_running() + future <= capacity;
  if (fits && make_room(hard)) row = table_->alloc();
  if (!row) {
    cache_->unadmit(req->cache);
    return false;
  }
  req->cache.req_slot = *row;
  table_->write(*row, 0, req->cache.prefix_slots);
  const auto pre = static_cast<int32_t>(prefix);
  const auto seq = static_cast<int32_t>(len);
  const SlotIndex last_loc = pre > 0 ? table_->row(*row)[pre - 1] : -1;
  auto slots = allocator_->alloc_extend(std::span(&pre, 1), std::span(&seq, 1),
                                        std::span(&last_loc, 1));
  PAGODA_CHECK(slots.has_value(), "alloc_extend failed after make_room({})", hard);
  attach_swa(*slots);
  table_->write(*row, prefix, *slots);
  req->kv_len = len;
  req->state = RequestState::kPrefilling;
  req->admitted_once = true;
  req->out.cached_tokens = prefix;
  transferring_.push_back(req);
  ++stats_.admitted;
  stats_.fill_tokens += len;
  stats_.cached_tokens += prefix;
  update_peak();
  return true;
}

void Scheduler::complete_transfer(Req* req) {
  PAGODA_CHECK(std::erase(transferring_, req) == 1, "complete_transfer of a request not preallocated");
  req->state = RequestState::kDecoding;
  running_.push_back(req);
}

void Scheduler::hold(Req* req) {
  std::erase(running_, req);
  if (chunked_ == req) chunked_ = nullptr;
  req->state = RequestState::kFinished;
  held_.push_back(req);
}

void Scheduler::release_held(Req* req) {
  PAGODA_CHECK(std::erase(held_, req) == 1, "release_held of a request that is not held");
  finish(req);
}

void Scheduler::update_peak() {
  const int64_t total = int64_t{allocator_->num_pages()} * page_size_;
  const int64_t used = total - allocator_->available_size() - cache_->evictable_size();
  stats_.peak_used_tokens = std::max(stats_.peak_used_tokens, used);
}

}  // namespace pagoda::engine
