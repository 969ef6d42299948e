#include "cache_workload.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>

#include <fmt/format.h>

#include "pagoda/cache/chunk_cache.h"
#include "pagoda/cache/radix_cache.h"
#include "pagoda/core/error.h"

namespace pagoda::testing {

struct CacheWorkload::Req {
  cache::CacheRequest cr;
  std::vector<uint64_t> tags;   ///< tags[i]: identity of tokens[0..i] in the request's namespace
  std::vector<SlotIndex> slots; ///< what the request's row must hold for [0, seq_len)
  int32_t seq_len = 0;          ///< tokens whose KV is computed
  int64_t protected_len = 0;
  bool prefill_done() const { return seq_len == static_cast<int32_t>(cr.tokens.size()); }
  void push_token(int32_t t) {
    uint64_t h = tags.empty() ? std::hash<std::string>()(cr.extra_key) ^ 0xC0FFEEull : tags.back();
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    tags.push_back(h ^ (h >> 31));
    cr.tokens.push_back(t);
  }
};

namespace {

constexpr uint64_t kNoTag = 0;

}  // namespace

CacheWorkload::CacheWorkload(const WorkloadConfig& config) : config_(config), P_(config.page_size) {
  alloc_ = std::make_unique<kv::PageAllocator>(config.num_pages, config.page_size);
  table_ = std::make_unique<kv::ReqToTokenTable>(config.max_reqs, config.max_context_len);
  if (config.chunk_cache) {
    cache_ = std::make_unique<cache::ChunkCache>(*alloc_, *table_);
  } else {
    auto radix = std::make_unique<cache::RadixCache>(*alloc_, *table_,
                                                     cache::make_eviction_policy(config.policy));
    radix->set_event_listener([this](cache::CacheEvent e, std::span<const int32_t>,
                                     std::span<const SlotIndex> slots) { on_event(e, slots); });
    cache_ = std::move(radix);
  }
  page_tag_.assign(static_cast<size_t>(config.num_pages) + 1, kNoTag);
  content_.assign(static_cast<size_t>(alloc_->num_slots_total()), kNoTag);
}

CacheWorkload::~CacheWorkload() = default;

const cache::CacheStats& CacheWorkload::stats() const { return cache_->stats(); }

void CacheWorkload::fail(const std::string& what) const {
  throw WorkloadMismatch(fmt::format("step {}: {}", steps_, what));
}

std::vector<int32_t> CacheWorkload::make_prompt(ChoiceSource& src) {
  const int32_t limit = config_.max_context_len / 2;
  std::vector<int32_t> t;
  if (!history_.empty() && src.next(5) < 2) {
    t = history_[src.next(static_cast<uint32_t>(history_.size()))];  // follow-up turn
  } else {
    const int32_t sys = static_cast<int32_t>(src.next(4));  // shared system prompts
    for (int32_t i = 0; i < sys * P_ + 3 * sys; ++i) t.push_back(1000 * (sys + 1) + i);
  }
  const int32_t extra = 1 + static_cast<int32_t>(src.next(static_cast<uint32_t>(3 * P_ + 5)));
  for (int32_t i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(src.next(4)));
  if (static_cast<int32_t>(t.size()) > limit) t.resize(static_cast<size_t>(limit));
  return t;
}

std::vector<SlotIndex> CacheWorkload::expected_match(const Req& r, int64_t cap) const {
  std::vector<SlotIndex> out;
  if (config_.chunk_cache) return out;
  const int64_t len = std::min<int64_t>(cap, static_cast<int64_t>(r.cr.tokens.size())) / P_ * P_;
  for (int64_t end = P_; end <= len; end += P_) {
    auto it = tree_.find(r.tags[static_cast<size_t>(end - 1)]);
    if (it == tree_.end()) break;
    for (int32_t j = 0; j < P_; ++j) out.push_back(it->second * P_ + j);
  }
  return out;
}

void CacheWorkload::model_insert(Req& r, int64_t key_len) {
  if (config_.chunk_cache) return;
  std::vector<int32_t> expected_new;
  bool present = true;
  for (int64_t end = P_; end <= key_len; end += P_) {
    const uint64_t tag = r.tags[static_cast<size_t>(end - 1)];
    if (tree_.count(tag)) {
      if (!present) fail("model tree is not prefix-closed");
      continue;
    }
    present = false;
    const int32_t page = r.slots[static_cast<size_t>(end - P_)] / P_;
    tree_.emplace(tag, page);
    page_tag_[page] = tag;
    expected_new.push_back(page);
  }
  std::sort(expected_new.begin(), expected_new.end());
  std::sort(stored_pages_.begin(), stored_pages_.end());
  if (stored_pages_ != expected_new) {
    fail(fmt::format("insert stored pages {} but the model expected {}",
                     fmt::join(stored_pages_, ","), fmt::join(expected_new, ",")));
  }
  stored_pages_.clear();
}

void CacheWorkload::on_event(cache::CacheEvent event, std::span<const SlotIndex> slots) {
  for (size_t i = 0; i < slots.size(); i += static_cast<size_t>(P_)) {
    const int32_t page = slots[i] / P_;
    if (event == cache::CacheEvent::kStored) {
      stored_pages_.push_back(page);
      continue;
    }
    const uint64_t tag = page_tag_[page];
    auto it = tree_.find(tag);
    if (tag == kNoTag || it == tree_.end() || it->second != page) {
      fail(fmt::format("evicted page {} that the model does not have in the tree", page));
    }
    for (const auto& r : reqs_) {
      for (int64_t k = 0; k < r->protected_len; k += P_) {
        if (r->slots[static_cast<size_t>(k)] / P_ == page) {
          fail(fmt::format("evicted page {} locked by request row {}", page, r->cr.req_slot.value()));
        }
      }
    }
    tree_.erase(it);
    page_tag_[page] = kNoTag;
  }
}

bool CacheWorkload::extend(Req& r, int32_t new_len) {
  const int32_t pre = r.seq_len;
  const SlotIndex last = pre == 0 ? -1 : r.slots.back();
  const std::vector<int32_t> pre_v{pre}, seq_v{new_len};
  const std::vector<SlotIndex> last_v{last};
  auto out = alloc_->alloc_extend(pre_v, seq_v, last_v);
  if (!out) {
    const int64_t need = ((new_len + P_ - 1) / P_ - (pre + P_ - 1) / P_) * int64_t{P_};
    cache_->evict(need - alloc_->available_size());
    out = alloc_->alloc_extend(pre_v, seq_v, last_v);
    if (!out) return false;
  }
  for (size_t i = 0; i < out->size(); ++i) {
    content_[static_cast<size_t>((*out)[i])] = r.tags[static_cast<size_t>(pre) + i];
  }
  r.slots.insert(r.slots.end(), out->begin(), out->end());
  table_->write(r.cr.req_slot, pre, *out);
  r.seq_len = new_len;
  return true;
}

void CacheWorkload::continue_prefill(Req& r, ChoiceSource& src) {
  const auto len = static_cast<int32_t>(r.cr.tokens.size());
  const int32_t fill =
      src.next(2) == 0 ? len : r.seq_len + 1 + static_cast<int32_t>(src.next(static_cast<uint32_t>(len - r.seq_len)));
  if (!extend(r, fill)) {
    finish(r, cache::FinishPolicy::kNoInsert);
    return;
  }
  if (fill == len) return;  // the last chunk: the request now decodes
  const int64_t key_len = fill / P_ * P_;
  cache_->cache_unfinished_req(r.cr, fill);
  model_insert(r, key_len);
  if (!config_.chunk_cache) {
    const auto tree = expected_match(r, key_len);
    std::copy(tree.begin(), tree.end(), r.slots.begin());
    r.protected_len = key_len;
  }
  if (r.cr.cache_protected_len != r.protected_len ||
      r.cr.prefix_slots != std::vector<SlotIndex>(r.slots.begin(), r.slots.begin() + fill)) {
    fail("cache_unfinished_req left prefix_slots / cache_protected_len different from the model");
  }
}

void CacheWorkload::admit(ChoiceSource& src) {
  if (table_->num_free_rows() == 0) return;
  auto owned = std::make_unique<Req>();
  Req& r = *owned;
  r.cr.extra_key = src.next(4) == 0 ? "salt" : "";
  for (int32_t t : make_prompt(src)) r.push_token(t);
  r.cr.priority = static_cast<int32_t>(src.next(3));
  const auto len = static_cast<int64_t>(r.cr.tokens.size());
  const auto expected = expected_match(r, cache::scheduler_prefix_limit(len));
  cache_->admit(r.cr, cache::scheduler_prefix_limit(len));
  if (r.cr.prefix_slots != expected) {
    fail(fmt::format("match of {} tokens returned {} slots, model expects {}", len,
                     r.cr.prefix_slots.size(), expected.size()));
  }
  r.slots = expected;
  r.seq_len = static_cast<int32_t>(expected.size());
  r.protected_len = r.seq_len;
  r.cr.req_slot = *table_->alloc();
  table_->write(r.cr.req_slot, 0, r.slots);
  reqs_.push_back(std::move(owned));
  continue_prefill(r, src);
}

void CacheWorkload::decode(ChoiceSource& src) {
  if (reqs_.empty()) return;
  Req& r = *reqs_[src.next(static_cast<uint32_t>(reqs_.size()))];
  if (!r.prefill_done()) {
    continue_prefill(r, src);
    return;
  }
  if (r.seq_len + 1 > config_.max_context_len) {
    finish(r, cache::FinishPolicy::kInsert);
    return;
  }
  r.push_token(static_cast<int32_t>(src.next(4)));
  const std::vector<int32_t> seq_v{r.seq_len + 1};
  const std::vector<SlotIndex> last_v{r.slots.back()};
  auto out = alloc_->alloc_decode(seq_v, last_v);
  if (!out) {
    cache_->evict(P_);
    out = alloc_->alloc_decode(seq_v, last_v);
  }
  if (!out) {  // retract: the token never got KV
    r.cr.tokens.pop_back();
    r.tags.pop_back();
    finish(r, cache::FinishPolicy::kNoInsert);
    return;
  }
  content_[static_cast<size_t>((*out)[0])] = r.tags.back();
  r.slots.push_back((*out)[0]);
  table_->write(r.cr.req_slot, r.seq_len, *out);
  ++r.seq_len;
}

void CacheWorkload::finish(Req& r, cache::FinishPolicy policy) {
  // Trim tokens without KV (an aborted chunked prefill) so the key matches the row.
  r.cr.tokens.resize(static_cast<size_t>(r.seq_len));
  r.tags.resize(static_cast<size_t>(r.seq_len));
  cache_->cache_finished_req(r.cr, r.seq_len, policy);
  if (policy == cache::FinishPolicy::kInsert) {
    model_insert(r, r.seq_len / P_ * P_);
    if (history_.size() < 16) {
      history_.push_back(r.cr.tokens);
    } else {
      history_[static_cast<size_t>(steps_) % history_.size()] = r.cr.tokens;
    }
  } else if (!stored_pages_.empty()) {
    fail("cache_finished_req(kNoInsert) stored pages");
  }
  table_->free(r.cr.req_slot);
  auto it = std::find_if(reqs_.begin(), reqs_.end(), [&](const auto& p) { return p.get() == &r; });
  reqs_.erase(it);
}

void CacheWorkload::finish_some(ChoiceSource& src) {
  const bool group = src.next(2) == 0;
  if (group) alloc_->free_group_begin();
  const uint32_t n = 1 + src.next(2);
  for (uint32_t i = 0; i < n && !reqs_.empty(); ++i) {
    Req& r = *reqs_[src.next(static_cast<uint32_t>(reqs_.size()))];
    finish(r, src.next(8) == 0 ? cache::FinishPolicy::kNoInsert : cache::FinishPolicy::kInsert);
  }
  if (group) alloc_->free_group_end();
}

void CacheWorkload::scratch(ChoiceSource& src) {
  const int64_t before = alloc_->available_size();
  const auto state = alloc_->backup_state();
  const auto pages = static_cast<int64_t>(src.next(static_cast<uint32_t>(alloc_->num_free_pages()) + 1));
  auto out = alloc_->alloc(pages * P_);
  if (!out) fail("alloc of available pages failed");
  alloc_->restore_state(state);
  if (alloc_->available_size() != before) fail("restore_state did not restore the free list");
}

void CacheWorkload::bad_input(ChoiceSource& src) {
  const int64_t avail = alloc_->available_size(), total = cache_->total_size();
  const int32_t referenced = alloc_->num_referenced_pages();
  auto expect_throw = [&](const char* what, auto&& f) {
    try {
      f();
    } catch (const Error&) {
      if (alloc_->available_size() != avail || alloc_->num_referenced_pages() != referenced ||
          cache_->total_size() != total) {
        fail(fmt::format("{}: threw but changed state", what));
      }
      return;
    }
    fail(fmt::format("{}: accepted bad input", what));
  };
  const uint32_t kind = src.next(3);
  if (kind == 0) {
    const auto page = 1 + static_cast<int32_t>(src.next(static_cast<uint32_t>(config_.num_pages)));
    if (alloc_->refcount(PageId(page)) != 0) return;
    const std::vector<SlotIndex> slots{page * P_};
    expect_throw("free of a free page", [&] { alloc_->free(slots); });
  } else if (kind == 1 && !reqs_.empty()) {
    Req& r = *reqs_[src.next(static_cast<uint32_t>(reqs_.size()))];
    expect_throw("finish beyond the tokens",
                 [&] { cache_->cache_finished_req(r.cr, static_cast<int64_t>(r.cr.tokens.size()) + 1); });
  } else if (!reqs_.empty()) {
    Req& r = *reqs_[src.next(static_cast<uint32_t>(reqs_.size()))];
    const std::vector<SlotIndex> one{0};
    expect_throw("row write beyond the context",
                 [&] { table_->write(r.cr.req_slot, config_.max_context_len, one); });
  }
}

void CacheWorkload::step(ChoiceSource& src) {
  ++steps_;
  const uint32_t op = src.next(100);
  if (op < 25) {
    admit(src);
  } else if (op < 70) {
    decode(src);
  } else if (op < 85) {
    finish_some(src);
  } else if (op < 91) {
    cache_->evict(src.next(static_cast<uint32_t>(8 * P_)));
  } else if (op < 96) {
    scratch(src);
  } else {
    bad_input(src);
  }
  check_all();
}

void CacheWorkload::drain() {
  while (!reqs_.empty()) finish(*reqs_.back(), cache::FinishPolicy::kInsert);
  cache_->evict(std::numeric_limits<int64_t>::max());
  check_all();
  if (alloc_->available_size() != int64_t{config_.num_pages} * P_ || cache_->total_size() != 0 ||
      !tree_.empty()) {
    fail("after draining, the pool is not whole again");
  }
}

void CacheWorkload::check_all() {
  alloc_->check_integrity();
  table_->check_integrity();
  cache_->check_integrity();
  std::vector<int32_t> refs(static_cast<size_t>(config_.num_pages) + 1, 0);
  std::set<int32_t> locked;
  for (const auto& r : reqs_) {
    if (r->cr.cache_protected_len != r->protected_len) fail("cache_protected_len differs");
    const auto row = table_->read(r->cr.req_slot, 0, r->seq_len);
    if (!std::equal(row.begin(), row.end(), r->slots.begin(), r->slots.end())) {
      fail(fmt::format("row {} differs from the model", r->cr.req_slot.value()));
    }
    for (int32_t i = 0; i < r->seq_len; ++i) {
      const SlotIndex s = r->slots[static_cast<size_t>(i)];
      if (content_[static_cast<size_t>(s)] != r->tags[static_cast<size_t>(i)]) {
        fail(fmt::format("row {} position {}: slot {} holds another token's KV",
                         r->cr.req_slot.value(), i, s));
      }
      if (s % P_ != 0) continue;
      (i < r->protected_len ? static_cast<void>(locked.insert(s / P_)) : static_cast<void>(++refs[s / P_]));
    }
  }
  for (const auto& [tag, page] : tree_) ++refs[static_cast<size_t>(page)];
  int32_t referenced = 0;
  for (int32_t p = 1; p <= config_.num_pages; ++p) {
    const int32_t have = alloc_->refcount(PageId(p));
    if (have != refs[static_cast<size_t>(p)]) {
      fail(fmt::format("page {}: allocator refcount {} but the model counts {} holders", p, have,
                       refs[static_cast<size_t>(p)]));
    }
    referenced += have > 0 ? 1 : 0;
  }
  if (alloc_->num_free_pages() + referenced != config_.num_pages) fail("free + referenced != total");
  const auto tree_tokens = static_cast<int64_t>(tree_.size()) * P_;
  const auto locked_tokens = static_cast<int64_t>(locked.size()) * P_;
  if (cache_->total_size() != tree_tokens || cache_->protected_size() != locked_tokens) {
    fail(fmt::format("cache sizes total {} / protected {}, model {} / {}", cache_->total_size(),
                     cache_->protected_size(), tree_tokens, locked_tokens));
  }
  for (int32_t page : locked) {
    if (!tree_.count(page_tag_[static_cast<size_t>(page)])) fail("a locked page is not in the tree");
  }
}

}  // namespace pagoda::testing
