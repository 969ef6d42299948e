// SwaPages (the sliding-window side of a hybrid KV pool) against a brute-force model: random
// requests grow, release the SWA pages their window slid past, finish into a "tree" that keeps
// their pages (full and, where still present, window side) and is evicted side by side. Every
// token's KV is a tag written into a full-pool array and an SWA-pool array at its slots; after
// every step each running request reads back all its positions from the full pool and its whole
// window from the SWA pool, so a page freed while still needed (and reused by someone else) is
// caught. Also: the counts of referenced pages equal the model's, the SWA pages a request holds
// stay within swa_live_pages_bound, and nothing leaks. The seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kv/swa_pages.h"
#include "test_seed.h"

namespace pagoda::kv {
namespace {

struct Holder {
  std::vector<int32_t> pages;  ///< full pages, in position order
  int64_t kv_len = 0;          ///< tokens written (requests) / covered (tree entries)
  int64_t swa_from = 0;        ///< pages [0, swa_from) hold no SWA reference of this holder
  int64_t tag = 0;             ///< KV tag base of the request that wrote the tokens
};

class SwaModel {
 public:
  SwaModel(int32_t page, int window_left, int32_t full_pages, int32_t swa_pages, uint64_t seed)
      : p_(page),
        wl_(window_left),
        full_(full_pages, page),
        swa_(swa_pages, page),
        pages_(full_, swa_),
        full_kv_(static_cast<size_t>(full_.num_slots_total()), -1),
        swa_kv_(static_cast<size_t>(swa_.num_slots_total()), -1),
        rng_(seed) {}

  void step() {
    const int op = static_cast<int>(rng_() % 10);
    if (op < 2 || running_.empty()) {
      start();
    } else if (op < 7) {
      grow(pick(running_));
    } else if (op < 9) {
      finish(pick(running_));
    } else if (!tree_.empty()) {
      evict(pick(tree_));
    }
    check();
  }

  PageAllocator& full() { return full_; }
  PageAllocator& swa() { return swa_; }
  int64_t steps_refused = 0;

 private:
  template <typename M>
  int64_t pick(const M& m) {
    auto it = m.begin();
    std::advance(it, static_cast<long>(rng_() % m.size()));
    return it->first;
  }

  void start() {
    Holder h;
    h.tag = next_tag_;
    next_tag_ += int64_t{1} << 32;
    const int64_t id = next_id_++;
    running_[id] = h;
    grow(id);
  }

  /// Adds 1..3 pages' worth of tokens (a chunk of prefill or some decode steps), then releases
  /// the SWA pages the window slid past.
  void grow(int64_t id) {
    Holder& h = running_.at(id);
    const int64_t add = 1 + static_cast<int64_t>(rng_() % (3 * p_));
    const int64_t need = (h.kv_len + add + p_ - 1) / p_ - static_cast<int64_t>(h.pages.size());
    if (need > 0) {
      auto got = pages_.alloc_pages(static_cast<int32_t>(need));
      if (!got) {  // retract: the request gives everything back, as the scheduler would
        ++steps_refused;
        free_holder(h);
        running_.erase(id);
        return;
      }
      h.pages.insert(h.pages.end(), got->begin(), got->end());
    }
    for (int64_t pos = h.kv_len; pos < h.kv_len + add; ++pos) {
      const SlotIndex s = slot(h, pos);
      full_kv_[static_cast<size_t>(s)] = h.tag + pos;
      const SlotIndex w = pages_.swa_slot(s);
      ASSERT_GE(w, 0) << "a fresh page has no SWA page";
      swa_kv_[static_cast<size_t>(w)] = h.tag + pos;
    }
    h.kv_len += add;
    const int64_t dead = SwaPages::swa_dead_pages(h.kv_len, wl_, p_);
    if (dead > h.swa_from) {
      pages_.release_swa(std::span(h.pages).subspan(static_cast<size_t>(h.swa_from),
                                                    static_cast<size_t>(dead - h.swa_from)));
      h.swa_from = dead;
    }
  }

  /// Half the time the finished request's pages go to the tree (which takes its own references:
  /// full on all, window side where the request still had it), then the request lets go.
  void finish(int64_t id) {
    Holder h = running_.at(id);
    running_.erase(id);
    if (rng_() % 2 == 0 && !h.pages.empty()) {
      pages_.retain(std::span(h.pages).first(static_cast<size_t>(h.swa_from)), false);
      pages_.retain(std::span(h.pages).subspan(static_cast<size_t>(h.swa_from)), true);
      tree_[id] = h;
    }
    free_holder(h);
  }

  void free_holder(const Holder& h) {
    const auto head = std::span(h.pages).first(static_cast<size_t>(h.swa_from));
    const auto tail = std::span(h.pages).subspan(static_cast<size_t>(h.swa_from));
    pages_.free(head, false);
    pages_.free(tail, true);
  }

  /// The tree drops a node's window KV (a tombstone keeps the full KV) or the whole node.
  void evict(int64_t id) {
    Holder& h = tree_.at(id);
    if (rng_() % 2 == 0 && h.swa_from < static_cast<int64_t>(h.pages.size())) {
      pages_.release_swa(std::span(h.pages).subspan(static_cast<size_t>(h.swa_from)));
      h.swa_from = static_cast<int64_t>(h.pages.size());
      return;
    }
    free_holder(h);
    tree_.erase(id);
  }

  SlotIndex slot(const Holder& h, int64_t pos) const {
    return h.pages[static_cast<size_t>(pos / p_)] * p_ + static_cast<SlotIndex>(pos % p_);
  }

  void check() {
    pages_.check_integrity();
    std::set<int32_t> full_held, swa_held;
    auto note = [&](const Holder& h) {
      for (size_t i = 0; i < h.pages.size(); ++i) {
        full_held.insert(h.pages[i]);
        if (static_cast<int64_t>(i) >= h.swa_from) swa_held.insert(h.pages[i]);
      }
    };
    for (const auto& [id, h] : running_) {
      note(h);
      for (int64_t pos = 0; pos < h.kv_len; ++pos)
        ASSERT_EQ(full_kv_[static_cast<size_t>(slot(h, pos))], h.tag + pos) << "full KV lost";
      for (int64_t pos = std::max<int64_t>(0, h.kv_len - wl_); pos < h.kv_len; ++pos) {
        const SlotIndex w = pages_.swa_slot(slot(h, pos));
        ASSERT_GE(w, 0) << "window position " << pos << " of " << h.kv_len << " has no SWA page";
        ASSERT_EQ(swa_kv_[static_cast<size_t>(w)], h.tag + pos) << "window KV overwritten";
      }
      const int64_t held = static_cast<int64_t>(h.pages.size()) - h.swa_from;
      ASSERT_LE(held, SwaPages::swa_live_pages_bound(wl_, p_)) << "kv_len " << h.kv_len;
    }
    for (const auto& [id, h] : tree_) note(h);
    ASSERT_EQ(full_.num_referenced_pages(), static_cast<int32_t>(full_held.size()));
    int32_t mapped = 0;
    for (int32_t p : full_held) mapped += pages_.has_swa(p) ? 1 : 0;
    ASSERT_EQ(mapped, static_cast<int32_t>(swa_held.size()));
    ASSERT_EQ(swa_.num_referenced_pages(), mapped);
  }

  int32_t p_;
  int wl_;
  PageAllocator full_, swa_;
  SwaPages pages_;
  std::vector<int64_t> full_kv_, swa_kv_;
  std::mt19937_64 rng_;
  std::map<int64_t, Holder> running_, tree_;
  int64_t next_id_ = 0, next_tag_ = 0;

 public:
  void drain_all() {
    while (!running_.empty()) finish(running_.begin()->first);
    while (!tree_.empty()) {
      free_holder(tree_.begin()->second);
      tree_.erase(tree_.begin());
    }
  }
};

TEST(SwaPages, RandomWorkloadsMatchTheModel) {
  const testing::TestSeed seed;
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 24; ++round) {
    const int32_t page = std::vector<int32_t>{1, 2, 4, 16}[rng() % 4];
    const int wl = std::vector<int>{0, 1, 5, 17, 40}[rng() % 5];
    const int32_t full_pages = 64 + static_cast<int32_t>(rng() % 64);
    const int32_t swa_pages = 8 + static_cast<int32_t>(rng() % 40);
    SCOPED_TRACE(::testing::Message() << "round " << round << " page " << page << " window_left "
                                      << wl << " pools " << full_pages << "/" << swa_pages);
    SwaModel m(page, wl, full_pages, swa_pages, rng());
    for (int i = 0; i < 300 && !::testing::Test::HasFatalFailure(); ++i) m.step();
    if (::testing::Test::HasFatalFailure()) return;
    m.drain_all();
    EXPECT_EQ(m.full().num_referenced_pages(), 0) << "leaked full pages";
    EXPECT_EQ(m.swa().num_referenced_pages(), 0) << "leaked SWA pages";
  }
}

TEST(SwaPages, BadInputIsRefusedUnchanged) {
  PageAllocator full(8, 4), swa(4, 4);
  SwaPages p(full, swa);
  auto pages = p.alloc_pages(2);
  ASSERT_TRUE(pages.has_value());
  EXPECT_FALSE(p.alloc_pages(3).has_value());  // the SWA pool has 2 left
  EXPECT_EQ(full.num_referenced_pages(), 2);
  const int32_t a = (*pages)[0];
  p.release_swa({&a, 1});
  EXPECT_FALSE(p.has_swa(a));
  EXPECT_EQ(p.swa_slot(a * 4 + 1), -1);
  EXPECT_THROW(p.release_swa({&a, 1}), Error);  // already released
  EXPECT_THROW(p.free({&a, 1}, true), Error);   // no SWA side to drop
  const int32_t twice[] = {(*pages)[1], (*pages)[1]};
  EXPECT_THROW(p.release_swa(twice), Error);
  EXPECT_TRUE(p.has_swa((*pages)[1]));
  // A second holder of the window side cannot outlive the full side.
  p.retain({&twice[0], 1}, true);                     // full 2, SWA 2
  p.free({&twice[0], 1}, false);                      // a holder keeps a stray SWA reference
  EXPECT_THROW(p.free({&twice[0], 1}, true), Error);  // the last full holder cannot leave it
  EXPECT_TRUE(p.has_swa(twice[0]));
  p.release_swa({&twice[0], 1});  // the stray reference goes
  p.free({&twice[0], 1}, true);
  p.free({&a, 1}, false);
  p.check_integrity();
  EXPECT_EQ(full.num_referenced_pages(), 0);
  EXPECT_EQ(swa.num_referenced_pages(), 0);
  PageAllocator other(8, 2);
  EXPECT_THROW(SwaPages(full, other), Error);
}

// KV bytes of one 32k-token request of the Gemma-3-1B layout (26 layers: 22 sliding with a
// 512-token window, 4 global; 1 KV head of 256, bf16), prefilled in 4096-token chunks then 64
// decode steps, page 16: the pages it holds, counted by the allocators, times the bytes of a
// page of each pool's layers, against the same request in one full pool for every layer. A
// chunk's SWA pages are all written by its forward before the window slides, so the SWA pool's
// peak is one chunk plus the window.
TEST(SwaPages, Gemma3LayoutHoldsAQuarterOfTheFullPoolBytes) {
  constexpr int32_t kPage = 16;
  constexpr int kWindowLeft = 511;
  constexpr int64_t kLocal = 22, kGlobal = 4, kTokenLayerBytes = 2 * 256 * 2;  // K+V, bf16
  constexpr int64_t kContext = 32768;
  constexpr int64_t kChunk = 4096;
  PageAllocator full(kContext / kPage + 8, kPage), swa(kChunk / kPage + 40, kPage);
  SwaPages p(full, swa);
  std::vector<int32_t> pages;
  int64_t len = 0, swa_from = 0;
  int32_t swa_peak = 0;
  auto advance = [&](int64_t n) {
    const int64_t need = (len + n + kPage - 1) / kPage - static_cast<int64_t>(pages.size());
    if (need > 0) {
      auto got = p.alloc_pages(static_cast<int32_t>(need));
      ASSERT_TRUE(got.has_value()) << "at " << len;
      pages.insert(pages.end(), got->begin(), got->end());
    }
    swa_peak = std::max(swa_peak, swa.num_referenced_pages());
    len += n;
    const int64_t dead = SwaPages::swa_dead_pages(len, kWindowLeft, kPage);
    p.release_swa(std::span(pages).subspan(static_cast<size_t>(swa_from),
                                           static_cast<size_t>(dead - swa_from)));
    swa_from = dead;
  };
  while (len < kContext - 64 && !::testing::Test::HasFatalFailure())
    advance(std::min<int64_t>(kChunk, kContext - 64 - len));
  for (int i = 0; i < 64 && !::testing::Test::HasFatalFailure(); ++i) advance(1);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int64_t page_bytes = kPage * kTokenLayerBytes;
  const int64_t hybrid = full.num_referenced_pages() * page_bytes * kGlobal +
                         swa.num_referenced_pages() * page_bytes * kLocal;
  const int64_t dense = full.num_referenced_pages() * page_bytes * (kGlobal + kLocal);
  std::printf(
      "gemma3-1b layout, %lld tokens: full pool %d pages, SWA pool %d pages (peak %d, "
      "during a %lld-token chunk); KV %.1f MiB with the SWA pool vs %.1f MiB in one full "
      "pool (%.3fx)\n",
      static_cast<long long>(len), full.num_referenced_pages(), swa.num_referenced_pages(),
      swa_peak, static_cast<long long>(kChunk), hybrid / 1048576.0, dense / 1048576.0,
      static_cast<double>(hybrid) / static_cast<double>(dense));
  EXPECT_LE(swa.num_referenced_pages(), SwaPages::swa_live_pages_bound(kWindowLeft, kPage));
  EXPECT_LE(hybrid * 4, dense);
  p.free(std::span(pages).first(static_cast<size_t>(swa_from)), false);
  p.free(std::span(pages).subspan(static_cast<size_t>(swa_from)), true);
  EXPECT_EQ(full.num_referenced_pages() + swa.num_referenced_pages(), 0);
}

}  // namespace
}  // namespace pagoda::kv
