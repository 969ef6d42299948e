// Property test: SwaRadixCache (window-aware radix cache over a full and an SWA pool) against a
// small model written independently of it. The model keeps the cached pages as a map from the
// token prefix ending at a page boundary to {full page, window side present, locks}; it knows
// nothing of nodes, splits or the cut code (cache::swa_usable_prefix). Random streams of
// request-like inserts (fresh pages from both pools, a random leading part of their window side
// already released, kTransfer or kRetain; a cached tombstone the caller brings the window side of
// is revived), matches (+ lock), unlocks, full evictions and window
// evictions. Checks after every operation: match length and slots equal the model's (longest
// cached prefix, cut back to where the window before the match point is resident), insert's
// prefix_len, each page's window locks, that evictions only take unlocked pages (whole leaves for
// the full side, unlocked window sides for the SWA side) and stop only when nothing evictable is
// left, both pools' referenced-page counts, and check_integrity(). Pages 1, 16, 64; the seed is
// printed (PAGODA_TEST_SEED replays it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "cache_workload.h"

#include "pagoda/cache/swa_radix_cache.h"
#include "test_seed.h"

namespace pagoda::cache {
namespace {

using Key = std::vector<int32_t>;

struct MPage {
  int32_t page = 0;
  bool swa = true;
  int full_locks = 0;  ///< held locks whose match covers this page
  int swa_locks = 0;   ///< held locks whose window reads this page
};

struct MLock {
  NodeHandle node;
  std::vector<Key> full;  ///< prefixes the lock protects
  std::vector<Key> swa;   ///< prefixes whose window side it protects
};

class SwaCacheModel {
 public:
  SwaCacheModel(int32_t p, int window, int32_t full_pages, int32_t swa_pages, uint64_t seed)
      : p_(p),
        w_(window),
        full_(full_pages, p),
        swa_(swa_pages, p),
        pages_(full_, swa_),
        cache_(pages_, nullptr, window),
        rng_(seed) {}

  void step() {
    const int op = static_cast<int>(rng_() % 20);
    if (op < 7) {
      insert();
    } else if (op < 13) {
      match(/*lock=*/op < 10);
    } else if (op < 16) {
      unlock();
    } else if (op < 18) {
      evict_full(1 + static_cast<int64_t>(rng_() % 4) * p_);
    } else {
      evict_swa(1 + static_cast<int64_t>(rng_() % 4));
    }
    check();
  }

  void drain() {
    while (!locks_.empty()) unlock();
    evict_full(int64_t{1} << 40);
    check();
    ASSERT_TRUE(map_.empty());
    ASSERT_EQ(full_.num_referenced_pages(), 0);
    ASSERT_EQ(swa_.num_referenced_pages(), 0);
  }

  int64_t matched = 0, cut = 0, swa_evicted = 0, full_evicted = 0, tombstone_inserts = 0,
          revived = 0;

 private:
  /// A random sequence sharing prefixes with earlier ones (alphabet of 3 tokens).
  Key random_tokens() {
    Key t;
    if (!seqs_.empty() && rng_() % 4 != 0) {
      const Key& base = seqs_[rng_() % seqs_.size()];
      t.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng_() % (base.size() + 1)));
    }
    const int64_t extra = static_cast<int64_t>(rng_() % (4 * p_ + 2));
    for (int64_t i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(rng_() % 3));
    const size_t cap = static_cast<size_t>(10 * p_);
    if (t.size() > cap) t.resize(cap);
    return t;
  }

  Key prefix(const Key& t, int64_t len) const {
    return Key(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(len));
  }

  /// Pages of the model's chain for t, from the root, up to floor(limit / P).
  int64_t chain(const Key& t, int64_t limit) const {
    int64_t k = 0;
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(t.size()), limit) / p_;
    while (k < n && map_.count(prefix(t, (k + 1) * p_))) ++k;
    return k;
  }

  /// The model's usable match: the longest m in {n} ∪ {multiples of P below n} whose window
  /// [m - W, m) lies in pages with their window side.
  int64_t usable(const Key& t, int64_t n_tokens) const {
    for (int64_t m = n_tokens; m > 0; m = (m - 1) / p_ * p_) {
      bool ok = true;
      for (int64_t pos = std::max<int64_t>(0, m - w_); pos < m && ok; ++pos)
        ok = map_.at(prefix(t, (pos / p_ + 1) * p_)).swa;
      if (ok) return m;
    }
    return 0;
  }

  bool make_room(int64_t pages) {
    for (int tries = 0; tries < 2; ++tries) {
      if (full_.num_free_pages() >= pages && swa_.num_free_pages() >= pages) return true;
      if (swa_.num_free_pages() < pages) evict_swa(pages - swa_.num_free_pages());
      if (full_.num_free_pages() < pages || swa_.num_free_pages() < pages)
        evict_full((pages - std::min(full_.num_free_pages(), swa_.num_free_pages())) * p_);
    }
    return full_.num_free_pages() >= pages && swa_.num_free_pages() >= pages;
  }

  void insert() {
    Key t = random_tokens();
    const int64_t n = static_cast<int64_t>(t.size()) / p_;
    if (n == 0) return;
    if (!make_room(n)) return;
    std::optional<std::vector<int32_t>> got = pages_.alloc_pages(static_cast<int32_t>(n));
    ASSERT_TRUE(got.has_value());
    // A request's window slid past its leading pages: their window side is gone already.
    const int64_t dead = kv::SwaPages::swa_dead_pages(n * p_, w_, p_);
    const int64_t released = dead == 0 ? 0 : static_cast<int64_t>(rng_() % (dead + 1));
    pages_.release_swa(std::span(*got).first(static_cast<size_t>(released)));
    std::vector<SlotIndex> slots;
    for (int32_t page : *got)
      for (int32_t i = 0; i < p_; ++i) slots.push_back(page * p_ + i);
    const int64_t existing = chain(t, n * p_);
    const bool transfer = rng_() % 2 == 0;
    const InsertResult r = cache_.insert(
        RadixKey{t, ""}, slots,
        InsertOptions{.ownership = transfer ? SlotOwnership::kTransfer : SlotOwnership::kRetain});
    ASSERT_EQ(r.prefix_len, existing * p_) << "insert prefix_len";
    // A cached tombstone comes back to life with the window side of the caller's duplicate.
    for (int64_t k = 0; k < existing; ++k) {
      MPage& mp = map_.at(prefix(t, (k + 1) * p_));
      if (!mp.swa && k >= released) {
        mp.swa = true;
        ++revived;
      }
    }
    if (!transfer) kv::SwaPageRefs(pages_).free(slots);
    for (int64_t k = existing; k < n; ++k) {
      map_[prefix(t, (k + 1) * p_)] = MPage{.page = (*got)[static_cast<size_t>(k)],
                                             .swa = k >= released};
      tombstone_inserts += k < released;
    }
    seqs_.push_back(t);
    if (seqs_.size() > 24) seqs_.erase(seqs_.begin());
  }

  void match(bool lock) {
    Key t = random_tokens();
    if (!seqs_.empty() && rng_() % 2 == 0) t = seqs_[rng_() % seqs_.size()];
    const int64_t limit = rng_() % 4 == 0 ? static_cast<int64_t>(rng_() % (t.size() + 1))
                                          : kNoPrefixLimit;
    std::vector<SlotIndex> out;
    const PrefixMatch m = cache_.match_prefix(RadixKey{t, ""}, limit, out);
    const int64_t n = chain(t, limit) * p_;
    const int64_t want = usable(t, n);
    ASSERT_EQ(m.length, want) << "match length (chain " << n << ")";
    ASSERT_EQ(static_cast<int64_t>(out.size()), want);
    for (int64_t pos = 0; pos < want; ++pos)
      ASSERT_EQ(out[static_cast<size_t>(pos)],
                map_.at(prefix(t, (pos / p_ + 1) * p_)).page * p_ + pos % p_)
          << "slot of position " << pos;
    matched += want;
    cut += n - want;
    if (!lock) return;
    cache_.inc_lock_ref(m.last_node);
    MLock l{.node = m.last_node};
    for (int64_t k = 0; k < want / p_; ++k) l.full.push_back(prefix(t, (k + 1) * p_));
    for (int64_t k = std::max<int64_t>(0, want - w_) / p_; k < want / p_; ++k)
      l.swa.push_back(prefix(t, (k + 1) * p_));
    for (const Key& k : l.full) ++map_.at(k).full_locks;
    for (const Key& k : l.swa) ++map_.at(k).swa_locks;
    locks_.push_back(std::move(l));
  }

  void unlock() {
    if (locks_.empty()) return;
    const size_t i = rng_() % locks_.size();
    cache_.dec_lock_ref(locks_[i].node);
    for (const Key& k : locks_[i].full) --map_.at(k).full_locks;
    for (const Key& k : locks_[i].swa) --map_.at(k).swa_locks;
    locks_.erase(locks_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void evict_full(int64_t tokens) {
    const int64_t got = cache_.evict(tokens);
    int64_t removed = 0;
    std::vector<Key> gone;
    for (const auto& [k, mp] : map_)
      if (full_.refcount(PageId{mp.page}) == 0) gone.push_back(k);
    for (const Key& k : gone) {
      ASSERT_EQ(map_.at(k).full_locks, 0) << "evicted a locked page";
      map_.erase(k);
      ++removed;
    }
    // The rest is still a tree: every cached prefix's parent page is cached.
    for (const auto& [k, mp] : map_) {
      if (static_cast<int64_t>(k.size()) > p_) {
        ASSERT_TRUE(map_.count(prefix(k, static_cast<int64_t>(k.size()) - p_)))
            << "full eviction left a hole in a cached prefix";
      }
    }
    ASSERT_EQ(got, removed * p_);
    full_evicted += got;
    if (got < tokens) {
      for (const auto& [k, mp] : map_) ASSERT_GT(mp.full_locks, 0) << "evict stopped early";
    }
  }

  void evict_swa(int64_t num_pages) {
    const int64_t got = cache_.evict_swa(num_pages);
    int64_t lost = 0;
    for (auto& [k, mp] : map_) {
      if (mp.swa && !pages_.has_swa(mp.page)) {
        ASSERT_EQ(mp.swa_locks, 0) << "released a window-locked page";
        mp.swa = false;
        ++lost;
      }
      ASSERT_TRUE(mp.swa || !pages_.has_swa(mp.page)) << "a window side came back";
    }
    ASSERT_EQ(got, lost);
    swa_evicted += got;
    if (got < num_pages) {
      for (const auto& [k, mp] : map_) ASSERT_TRUE(!mp.swa || mp.swa_locks > 0) << "stopped early";
    }
  }

  void check() {
    cache_.check_integrity();
    int64_t with_swa = 0;
    for (const auto& [k, mp] : map_) {
      ASSERT_EQ(full_.refcount(PageId{mp.page}), 1);
      ASSERT_EQ(pages_.has_swa(mp.page), mp.swa);
      ASSERT_EQ(cache_.swa_lock_ref(mp.page), mp.swa_locks) << "window locks";
      with_swa += mp.swa;
    }
    ASSERT_EQ(full_.num_referenced_pages(), static_cast<int32_t>(map_.size()));
    ASSERT_EQ(swa_.num_referenced_pages(), with_swa);
    ASSERT_EQ(cache_.total_size(), static_cast<int64_t>(map_.size()) * p_);
  }

  int32_t p_;
  int w_;
  kv::PageAllocator full_;
  kv::PageAllocator swa_;
  kv::SwaPages pages_;
  SwaRadixCache cache_;
  std::mt19937_64 rng_;
  std::map<Key, MPage> map_;
  std::vector<MLock> locks_;
  std::vector<Key> seqs_;
};

class SwaCacheProperty : public ::testing::TestWithParam<int32_t> {};

TEST_P(SwaCacheProperty, RandomStreamMatchesModel) {
  const int32_t p = GetParam();
  const pagoda::testing::TestSeed seed(pagoda::testing::process_seed());  // one for every case
  std::printf("page_size %d\n", p);
  std::mt19937_64 pick(seed ^ static_cast<uint64_t>(p));
  int64_t matched = 0, cut = 0, swa_evicted = 0, tombstones = 0, revived = 0;
  for (int round = 0; round < 6; ++round) {
    // Windows from below one page to a few pages; the SWA pool is smaller than the full one.
    const int window = 1 + static_cast<int>(pick() % static_cast<uint64_t>(3 * p + 4));
    SwaCacheModel model(p, window, 48, 20 + static_cast<int32_t>(pick() % 12), pick());
    for (int i = 0; i < 700 && !::testing::Test::HasFatalFailure(); ++i) model.step();
    if (!::testing::Test::HasFatalFailure()) model.drain();
    ASSERT_FALSE(::testing::Test::HasFatalFailure())
        << "window " << window;
    matched += model.matched;
    cut += model.cut;
    swa_evicted += model.swa_evicted;
    tombstones += model.tombstone_inserts;
    revived += model.revived;
  }
  std::printf("  matched %lld tokens, cut %lld, window sides evicted %lld, tombstones inserted "
              "%lld, revived %lld\n",
              static_cast<long long>(matched), static_cast<long long>(cut),
              static_cast<long long>(swa_evicted), static_cast<long long>(tombstones),
              static_cast<long long>(revived));
  EXPECT_GT(matched, 0) << "never hit: the stream tests too little";
  EXPECT_GT(cut, 0) << "no match was ever cut by the window rule";
  EXPECT_GT(swa_evicted, 0) << "never evicted a window side";
  EXPECT_GT(revived, 0) << "no insert revived a tombstone";
}

INSTANTIATE_TEST_SUITE_P(Pages, SwaCacheProperty, ::testing::Values(1, 16, 64),
                         [](const auto& info) { return fmt::format("P{}", info.param); });

}  // namespace
}  // namespace pagoda::cache
