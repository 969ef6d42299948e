#include "pagoda/cache/swa_radix_cache.h"

#include <algorithm>
#include <tuple>

#include "pagoda/cache/swa_match.h"
#include "pagoda/core/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cache {

SwaRadixCache::SwaRadixCache(kv::SwaPages& pages, kv::ReqToTokenTable* table, int window_left,
                             std::unique_ptr<EvictionPolicy> policy)
    : PrefixCache(refs_, table),
      pages_(&pages),
      refs_(pages),
      tree_(refs_, std::move(policy), table),
      window_left_(window_left),
      stamp_(static_cast<size_t>(pages.full().num_pages()) + 1, {0, 0}),
      swa_lock_(static_cast<size_t>(pages.full().num_pages()) + 1, 0) {
  PAGODA_REQUIRE(window_left >= 0, kInvalidArgument, "SWA cache window_left {} < 0", window_left);
  tree_.set_event_listener(
      [this](CacheEvent event, std::span<const int32_t>, std::span<const SlotIndex> slots) {
        const int32_t p = page_size();
        if (event == CacheEvent::kStored) ++clock_;
        for (size_t i = 0; i < slots.size(); i += static_cast<size_t>(p)) {
          const int32_t page = slots[i] / p;
          if (event == CacheEvent::kStored) {
            stamp(page, static_cast<int64_t>(i));
          } else {
            stamp_[static_cast<size_t>(page)] = {0, 0};
          }
        }
      });
}

void SwaRadixCache::stamp(int32_t page, int64_t rank) {
  stamp_[static_cast<size_t>(page)] = {clock_, rank};
}

PrefixMatch SwaRadixCache::match_prefix(const RadixKey& key, int64_t max_prefix_len,
                                        std::vector<SlotIndex>& out) {
  PrefixMatch m = tree_.match_prefix(key, max_prefix_len, out);
  const int64_t usable = swa_usable_prefix(out, *pages_, window_left_);
  if (usable < m.length) {
    m = tree_.match_prefix(key, usable, out);  // ends the match (and splits) at the cut
    PAGODA_CHECK_EQ(m.length, usable);
  }
  ++match_stats_.match_calls;
  match_stats_.queried_tokens += std::min(static_cast<int64_t>(key.tokens.size()), max_prefix_len);
  match_stats_.matched_tokens += m.length;
  ++clock_;
  const int32_t p = page_size();
  for (int64_t i = 0; i < m.length; i += p) stamp(out[static_cast<size_t>(i)] / p, i);
  return m;
}

void SwaRadixCache::revive(const RadixKey& key, std::span<const SlotIndex> slots) {
  const int32_t p = page_size();
  const auto len = static_cast<int64_t>(std::min(key.tokens.size(), slots.size())) / p * p;
  if (len == 0) return;
  // The tree's pages for the key (a match: it may split a node and refreshes access times; its
  // counters are not the cache's, stats() keeps its own).
  tree_.match_prefix(RadixKey{key.tokens.first(static_cast<size_t>(len)), key.extra_key}, len,
                     scratch_);
  for (size_t i = 0; i < scratch_.size(); i += static_cast<size_t>(p)) {
    const int32_t tree_page = scratch_[i] / p;
    const int32_t mine = slots[i] / p;
    if (tree_page != mine && !pages_->has_swa(tree_page) && mine > 0 &&
        mine <= pages_->full().num_pages() && pages_->has_swa(mine) &&
        pages_->full().refcount(PageId{mine}) == 1 && pages_->full().refcount(PageId{tree_page}) == 1)
      pages_->move_swa(mine, tree_page);
  }
}

InsertResult SwaRadixCache::insert(const RadixKey& key, std::span<const SlotIndex> slots,
                                   InsertOptions options) {
  const size_t len = std::min(key.tokens.size(), slots.size()) /
                     static_cast<size_t>(page_size()) * static_cast<size_t>(page_size());
  refs_.require_held_runs(slots.first(len));  // before revive changes anything
  revive(key, slots);
  return tree_.insert(key, slots, options);
}

void SwaRadixCache::lock_window(NodeHandle node) {
  tree_.path_tail_slots(node, window_left_, scratch_);
  std::vector<int32_t> held;
  const int32_t p = page_size();
  for (size_t i = 0; i < scratch_.size(); ++i) {
    const int32_t page = scratch_[i] / p;
    if ((i == 0 || scratch_[i] % p == 0) && pages_->has_swa(page)) held.push_back(page);
  }
  for (int32_t page : held) ++swa_lock_[static_cast<size_t>(page)];
  locked_[node.id].push_back(std::move(held));
}

void SwaRadixCache::unlock_window(uint64_t id) {
  auto it = locked_.find(id);
  PAGODA_CHECK(it != locked_.end() && !it->second.empty(), "no window lock of node {}", id);
  for (int32_t page : it->second.back()) {
    PAGODA_CHECK_GT(swa_lock_[static_cast<size_t>(page)], 0);
    --swa_lock_[static_cast<size_t>(page)];
  }
  it->second.pop_back();
  if (it->second.empty()) locked_.erase(it);
}

void SwaRadixCache::inc_lock_ref(NodeHandle node) {
  tree_.inc_lock_ref(node);
  lock_window(node);
}

void SwaRadixCache::dec_lock_ref(NodeHandle node) {
  tree_.dec_lock_ref(node);  // throws (unchanged) when not locked
  unlock_window(node.id);
}

void SwaRadixCache::cache_finished_req(CacheRequest& req, int64_t kv_len, FinishPolicy policy) {
  const NodeHandle old = req.last_node;
  require_request(req, kv_len);
  if (policy == FinishPolicy::kInsert) {
    const int64_t key_len = kv_len / page_size() * page_size();
    revive(RadixKey{std::span<const int32_t>(req.tokens).first(static_cast<size_t>(key_len)),
                    req.extra_key},
           table().read(req.req_slot, 0, key_len));
  }
  tree_.cache_finished_req(req, kv_len, policy);
  if (old.has_node()) unlock_window(old.id);
}

void SwaRadixCache::cache_unfinished_req(CacheRequest& req, int64_t fill_len) {
  const NodeHandle old = req.last_node;
  require_request(req, fill_len);
  const int64_t key_len = fill_len / page_size() * page_size();
  revive(RadixKey{std::span<const int32_t>(req.tokens).first(static_cast<size_t>(key_len)),
                  req.extra_key},
         table().read(req.req_slot, 0, key_len));
  tree_.cache_unfinished_req(req, fill_len);
  lock_window(req.last_node);
  if (old.has_node()) unlock_window(old.id);
}

bool SwaRadixCache::swa_evictable(int32_t page) const {
  const auto i = static_cast<size_t>(page);
  // A tree page held by the tree alone (a request's reference would make it shared).
  return stamp_[i].first != 0 && swa_lock_[i] == 0 && pages_->has_swa(page) &&
         pages_->full().refcount(PageId{page}) == 1;
}

int64_t SwaRadixCache::evict_swa(int64_t num_pages) {
  PAGODA_REQUIRE(num_pages >= 0, kInvalidArgument, "evict_swa({}) < 0", num_pages);
  if (num_pages == 0) return 0;
  std::vector<std::tuple<uint64_t, int64_t, int32_t>> order;
  for (int32_t page = 1; page <= pages_->full().num_pages(); ++page)
    if (swa_evictable(page))
      order.emplace_back(stamp_[static_cast<size_t>(page)].first,
                         stamp_[static_cast<size_t>(page)].second, page);
  const auto n = static_cast<size_t>(std::min<int64_t>(num_pages, static_cast<int64_t>(order.size())));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end());
  std::vector<int32_t> victims;
  victims.reserve(n);
  for (size_t i = 0; i < n; ++i) victims.push_back(std::get<2>(order[i]));
  pages_->release_swa(victims);
  return static_cast<int64_t>(n);
}

int64_t SwaRadixCache::swa_evictable_pages() const {
  int64_t n = 0;
  for (int32_t page = 1; page <= pages_->full().num_pages(); ++page) n += swa_evictable(page);
  return n;
}

int64_t SwaRadixCache::swa_tree_pages() const {
  int64_t n = 0;
  for (int32_t page = 1; page <= pages_->full().num_pages(); ++page)
    n += stamp_[static_cast<size_t>(page)].first != 0 && pages_->has_swa(page);
  return n;
}

const CacheStats& SwaRadixCache::stats() const {
  stats_ = with_match_counts(tree_.stats(), match_stats_);
  return stats_;
}

void SwaRadixCache::check_integrity() const {
  tree_.check_integrity();
  pages_->check_integrity();
  pages_->check_holders_share();
  std::vector<int32_t> locks(swa_lock_.size(), 0);
  for (const auto& [id, lists] : locked_) {
    PAGODA_CHECK(!lists.empty());
    for (const auto& list : lists)
      for (int32_t page : list) ++locks[static_cast<size_t>(page)];
  }
  int64_t tree_pages = 0;
  for (int32_t page = 1; page <= pages_->full().num_pages(); ++page) {
    const auto i = static_cast<size_t>(page);
    PAGODA_CHECK(locks[i] == swa_lock_[i], "window locks of page {}", page);
    const bool in_tree = stamp_[i].first != 0;
    tree_pages += in_tree;
    if (in_tree) PAGODA_CHECK_GE(pages_->full().refcount(PageId{page}), 1);
    // A window-locked page is a tree page that kept its window side.
    if (swa_lock_[i] > 0) PAGODA_CHECK(in_tree && pages_->has_swa(page), "page {}", page);
  }
  PAGODA_CHECK_EQ(tree_pages * page_size(), tree_.total_size());
}

}  // namespace pagoda::cache
