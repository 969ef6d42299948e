#pragma once
/// Scheduler: continuous batching over a paged KV pool with a prefix cache (sglang_spec §3.8,
/// §4.5, §4.6). Each schedule() call decides one step and does all of its memory work:
///
///   1. decode set D = running requests; make room for one token each (evict the tree, then
///      retract requests in SGLang's order; a lone request that cannot grow is aborted);
///   2. prefill admission (if any request waits and the mode allows): the chunked request first,
///      then the waiting queue in policy order (FCFS / longest prefix match): match the prefix
///      (capped at len − 1), lock it, compute the exact pages the extend needs, evict exactly
///      that shortfall from the tree, allocate, write the row; the last request may be cut to a
///      page-aligned chunk;
///   3. allocate the decode slots of D.
///
/// The engine then runs the step and calls complete_extend / complete_decode / finish.
/// Ownership of pages between requests and the tree: docs/design/engine.md. Not thread-safe.

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "pagoda/attention/forward_mode.h"
#include "pagoda/cache/mamba_radix_cache.h"
#include "pagoda/cache/prefix_cache.h"
#include "pagoda/cache/swa_radix_cache.h"
#include "pagoda/engine/request.h"
#include "pagoda/kv/page_allocator.h"
#include "pagoda/kv/req_to_token.h"
#include "pagoda/kv/state_pool.h"
#include "pagoda/kv/swa_pages.h"

namespace pagoda::engine {

enum class SchedulePolicy : uint8_t {
  kFcfs,                ///< arrival order (retracted requests go back to the front)
  kLongestPrefixMatch,  ///< longest cached prefix first (FCFS when more than 128 wait)
};

/// SGLang's new_token_ratio: the fraction of each running request's remaining max_new_tokens
/// reserved at admission; decays per decode step, reset upward after a retraction.
struct NewTokenRatio {
  double init = 0.7;
  double min = 0.1;
  double decay = 0.001;
};

struct SchedulerConfig {
  int32_t max_running_requests = 64;
  /// 0 disables chunked prefill; otherwise a positive multiple of the page size: the token
  /// budget of one prefill batch, the last request cut to fit.
  int32_t chunk_size = 0;
  /// Token budget of one prefill batch without chunking (a longer single request still runs).
  int32_t max_prefill_tokens = 8192;
  SchedulePolicy policy = SchedulePolicy::kFcfs;
  /// Decode requests ride along in prefill steps (ForwardMode::kMixed).
  bool mixed_batches = true;
  NewTokenRatio new_token_ratio{};

  /// Throws Error(kInvalidArgument) naming the first bad field for pages of `page_size` tokens.
  void validate(int32_t page_size) const;
};

/// One request's part of a scheduled step.
struct ScheduledSeq {
  Req* req = nullptr;
  int64_t prefix_len = 0;  ///< tokens already in the KV cache
  int64_t num_tokens = 0;  ///< tokens computed this step (decode: 1)
  bool completes_fill = true;  ///< extend reaches the end of tokens → sample a token
  bool is_decode = false;      ///< a decode token (kDecode, or the decode part of kMixed)
};

struct ScheduledStep {
  attention::ForwardMode mode = attention::ForwardMode::kIdle;
  std::vector<ScheduledSeq> seqs;          ///< extends first, then decodes
  std::vector<SlotIndex> out_cache_loc;    ///< Σ num_tokens, in seqs order
  std::vector<Req*> retracted;             ///< moved back to the waiting queue this step
  std::vector<Req*> aborted;               ///< finished with kError this step
  bool empty() const { return seqs.empty(); }
};

/// Counters (cumulative).
struct SchedulerStats {
  int64_t admitted = 0;
  int64_t fill_tokens = 0;     ///< tokens requested at admission (prompt, or prompt+output on resume)
  int64_t cached_tokens = 0;   ///< of which reused from the prefix cache
  int64_t retractions = 0;
  int64_t aborted = 0;
  int64_t peak_used_tokens = 0;  ///< max over steps of pool tokens not free and not evictable
  /// SWA pool: the most SWA pages one request held privately after a step's releases (its
  /// window plus the partial page; docs/design/engine.md §SWA).
  int64_t peak_swa_pages_per_request = 0;
  int64_t swa_released_pages = 0;  ///< window sides released by running requests
};

class Scheduler {
 public:
  /// Uses (never owns) the allocator, table and cache; all must outlive the scheduler.
  /// max_context_len bounds a request's tokens. Throws kInvalidArgument on a bad config.
  Scheduler(const SchedulerConfig& config, kv::PageAllocator& allocator,
            kv::ReqToTokenTable& table, cache::PrefixCache& cache);

  /// Puts the window layers on the SWA pool (docs/design/engine.md §SWA): every page the
  /// scheduler allocates gets its SWA page (make_room evicts both pools: the cache's window
  /// sides first, then whole leaves), and after every step a request releases the window side
  /// of its private pages no later query reads (window_left: the model's largest window).
  /// `cache` is the window-aware radix cache, or nullptr (no prefix cache). Before any request.
  void use_swa(kv::SwaPages& pages, cache::SwaRadixCache* cache, int window_left);
  /// Gives every admitted request a slot of `pool` (a hybrid model's Mamba2 state,
  /// docs/design/state_pool.md): taken at admission with the request row (the admission waits
  /// when none is free) and freed with the row at finish, abort, cancel and retraction. A
  /// retracted request's state is dropped: it is re-admitted with a fresh slot and prefills its
  /// tokens (prompt and output so far) again. The slot is taken before the prefix match, so the
  /// prefix cache is either one that reuses nothing (ChunkCache) or `snapshots`, the cache that
  /// restores a hit's state into the slot (cache::MambaRadixCache; its snapshots give way, least
  /// recently used first, when a request finds no free slot). Before any request.
  void use_state_pool(kv::StatePool& pool, cache::MambaRadixCache* snapshots = nullptr) {
    state_ = &pool;
    state_cache_ = snapshots;
  }
  /// The state slots active requests hold (StatePool::leaked's holders, with state_cache()'s
  /// state_slots()).
  std::vector<int32_t> request_state_slots() const;
  /// The state-snapshot cache of use_state_pool, or nullptr.
  const cache::MambaRadixCache* state_cache() const { return state_cache_; }
  /// SWA pages privately held by active requests (their private pages that kept the window
  /// side).
  int64_t request_private_swa_pages() const;

  const SchedulerConfig& config() const { return config_; }
  /// Appends a new request (state kWaiting) to the waiting queue.
  void enqueue(Req* req);
  /// Decides and prepares the next step (see the file comment). Empty when there is nothing to
  /// run. Never throws for lack of memory: it waits, retracts or aborts instead.
  ScheduledStep schedule();

  /// After the forward: an extend of `seq` finished. A non-final chunk goes through
  /// cache_unfinished_req and stays the chunked request; a completed fill moves to decoding.
  void complete_extend(const ScheduledSeq& seq);
  /// After the forward: the decode token of `req` and the n − 1 tokens a speculative round
  /// accepted after it (n >= 1; their slots are already in its row) are now in the cache
  /// (kv_len + n).
  void complete_decode(Req* req, int64_t n = 1);
  /// Releases a finished request: cache_finished_req (insert), free the row, leave the queues.
  void finish(Req* req);
  /// finish() that hands the request's row to the caller instead of freeing it (the overlap
  /// loop frees it once the in-flight step that reads it is done).
  ReqSlot finish_keep_row(Req* req);
  /// Overlap loop: takes back the last complete_decode of `req` (its extra token is discarded):
  /// kv_len − 1, and the page that decode slot opened is freed.
  void undo_decode(Req* req);
  /// Ends a live request on the user's behalf (Engine::abort): a waiting request leaves the
  /// queue; an admitted one is released like finish() (its computed KV goes to the tree, which
  /// may reuse it). The request ends kFinished with `reason`. No effect on a finished request.
  void cancel(Req* req, FinishReason reason);

  bool has_work() const { return !waiting_.empty() || !running_.empty() || chunked_ != nullptr; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size() + (chunked_ ? 1 : 0); }
  const SchedulerStats& stats() const { return stats_; }
  double new_token_ratio() const { return new_token_ratio_; }
  /// Whether the next step would prefill: a chunked request continues, or a waiting request
  /// has a free running slot and request row (memory is checked only when admitting).
  bool wants_prefill() const {
    return chunked_ != nullptr ||
           (!waiting_.empty() &&
            running_.size() < static_cast<size_t>(config_.max_running_requests) &&
            table_->num_free_rows() > 0);
  }
  /// Evicts the tree until `tokens` are free; true when they are. Changes nothing else (a
  /// speculative round's draft slots, SpecMemory::reserve_tokens).
  bool reserve_tokens(int64_t tokens) { return make_room(tokens); }
  /// Pages privately held by active requests (row[cache_protected_len : kv_len], distinct),
  /// transferring and held ones included.
  int64_t request_private_pages() const;

  // Prefill–decode disaggregation (docs/design/pd.md).
  /// Decode side: reserves a row and the pages of `req`'s prompt KV (positions [0, prompt_len))
  /// like an admission: the prefix cache's match (capped at prompt_len - 1, locked; its length
  /// is out.cached_tokens: those pages need no transfer), a free running slot and row, and room
  /// for the other pages plus the reserved growth of the running and transferring requests
  /// (evicting the tree as needed). `req` must be kWaiting and not queued. On success it is
  /// kPrefilling, kv_len = prompt_len, and parked until complete_transfer / cancel; false:
  /// nothing changed.
  bool preallocate(Req* req);
  /// Decode side: the prompt KV of a preallocated `req` arrived (its first token appended by
  /// the caller): it joins the running requests (kDecoding).
  void complete_transfer(Req* req);
  /// Prefill side: a finished request (GenerateRequest::hold_kv) leaves the running requests but
  /// keeps its row, lock and KV (state kFinished) until release_held().
  void hold(Req* req);
  /// Releases a held request like finish() (its KV goes to the prefix cache).
  void release_held(Req* req);
  /// Requests parked by preallocate() or hold() (they hold KV but are not stepped).
  size_t num_parked() const { return transferring_.size() + held_.size(); }

 private:
  /// Tokens of new pages the decode set needs this step.
  int64_t decode_need_tokens(const std::vector<Req*>& reqs) const;
  /// Evicts the tree so that >= tokens are free; true when they are.
  bool make_room(int64_t tokens);
  /// Ensures decode memory for running_, retracting (and at worst aborting) as SGLang does.
  void prepare_decode_memory(ScheduledStep& step);
  void schedule_prefill(ScheduledStep& step, int64_t reserved_tokens);
  /// Admits one request or continues the chunked one: allocates its next extend into `step`.
  /// Returns false (nothing changed) when it does not fit.
  bool add_extend(Req* req, int64_t& budget, int64_t reserved_tokens, ScheduledStep& step);
  void alloc_decode(ScheduledStep& step);
  void retract(Req* req);
  void abort(Req* req, std::string message);
  /// Releases a request's KV without inserting it and frees its row.
  void release_no_insert(Req* req);
  /// Gives req a free state slot, and with the snapshot cache at page > 1 its aligned-state slot
  /// (dropping snapshots when too few are free); false when there are not enough.
  bool alloc_state(Req* req);
  /// After a step: at a page-aligned kv_len, copies req's state into its aligned-state slot.
  void note_aligned_state(Req* req);
  /// Frees req's state slots (hybrid models), if it holds them.
  void free_state(Req* req);
  void sort_waiting();
  int64_t reserved_for_running() const;
  int64_t pages_for(int64_t from_len, int64_t to_len) const;
  void update_peak();
  /// "the pool holds N tokens" (and the SWA pool's size), for the exhaustion errors.
  std::string pool_capacity() const;
  /// SWA pool: gives the fresh pages among `slots` (new allocations) their SWA pages.
  void attach_swa(std::span<const SlotIndex> slots);
  /// SWA pool: releases the window side of req's private pages below its window.
  void release_swa(Req* req);
  /// Calls f(req) for every active request (running, transferring, held, chunked).
  template <typename F>
  void for_each_active(F&& f) const {
    for (const Req* r : running_) f(r);
    for (const Req* r : transferring_) f(r);
    for (const Req* r : held_) f(r);
    if (chunked_ != nullptr) f(chunked_);
  }

  SchedulerConfig config_;
  kv::PageAllocator* allocator_;
  kv::ReqToTokenTable* table_;
  cache::PrefixCache* cache_;
  kv::SwaPages* swa_ = nullptr;            ///< the SWA pool (use_swa), else null
  kv::StatePool* state_ = nullptr;         ///< the state pool (use_state_pool), else null
  cache::MambaRadixCache* state_cache_ = nullptr;  ///< its snapshot cache (use_state_pool)
  cache::SwaRadixCache* swa_cache_ = nullptr;
  int swa_window_ = 0;
  int32_t page_size_;
  std::deque<Req*> waiting_;
  std::vector<Req*> running_;  ///< decoding requests, in admission order
  Req* chunked_ = nullptr;     ///< the request in the middle of a chunked prefill
  std::vector<Req*> transferring_;  ///< preallocated, waiting for their prompt KV (PD decode)
  std::vector<Req*> held_;          ///< finished, KV held for a transfer (PD prefill)
  double new_token_ratio_;
  SchedulerStats stats_;
};

}  // namespace pagoda::engine
