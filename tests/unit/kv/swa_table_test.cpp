// SwaTable (the window layers' request table, updated incrementally) against a from-scratch
// rebuild: random sequences of new requests (some starting after a cached prefix), extends,
// decodes, re-pointed chunks (the radix cache swapping a request's pages for others, as
// cache_unfinished_req does) and retractions / finishes that free rows for reuse, with each
// request releasing the SWA pages its window slid past (as the scheduler does). After every
// update the row's [0, kv_len) must equal the rebuild: page 0 (slot i % P) below the window's
// first page, the full slot's SWA slot from there. Each update must also write only
// O(new tokens + rewritten positions + window) positions, never the whole row. Pages 1 / 4 / 16,
// windows 0 / 3 / 17 / 40; the seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kv/swa_table.h"
#include "test_seed.h"

namespace pagoda::kv {
namespace {

struct TableReq {
  ReqSlot row{0};
  int64_t kv_len = 0;
  std::vector<int32_t> pages;  ///< full pages in position order
  int64_t released = 0;        ///< leading pages whose SWA side was released
  int64_t last_first = 0;      ///< the first query of its last step
  int64_t changed_from = 0;    ///< the lowest position written since its last step
};

class SwaTableWorkload {
 public:
  SwaTableWorkload(int32_t page, int window_left, uint64_t seed)
      : p_(page),
        wl_(window_left),
        full_alloc_(4096, page),
        swa_alloc_(4096, page),
        pages_(full_alloc_, swa_alloc_),
        full_(kRows, kLen),
        table_(full_, pages_, window_left),
        rng_(seed) {}

  void step() {
    const int op = pick(10);
    if (reqs_.empty() || (op < 2 && full_.num_free_rows() > 0)) {
      start();
    } else if (op < 6) {
      grow(any(), 1 + pick(pick(4) == 0 ? 60 : 3));  // a chunk, or decode-sized steps
    } else if (op < 7) {
      grow(any(), 1);  // decode
    } else if (op < 9) {
      repoint(any());
    } else {
      end(any());
    }
  }

  int64_t updates = 0, written = 0, row_lengths = 0;

 private:
  static constexpr int32_t kRows = 6;
  static constexpr int32_t kLen = 600;

  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  int32_t any() {
    auto it = reqs_.begin();
    std::advance(it, pick(static_cast<int>(reqs_.size())));
    return it->first;
  }

  /// Full pages (each with an SWA page) until `req` covers `len` positions; writes nothing.
  void cover(TableReq& req, int64_t len) {
    const int64_t need = (len + p_ - 1) / p_ - static_cast<int64_t>(req.pages.size());
    if (need <= 0) return;
    const auto got = pages_.alloc_pages(static_cast<int32_t>(need));
    ASSERT_TRUE(got.has_value());
    req.pages.insert(req.pages.end(), got->begin(), got->end());
  }
  SlotIndex slot_of(const TableReq& req, int64_t i) const {
    return static_cast<SlotIndex>(req.pages[static_cast<size_t>(i / p_)] * p_ + i % p_);
  }
  void write_slots(const TableReq& req, int64_t begin, int64_t end) {
    std::vector<SlotIndex> s;
    for (int64_t i = begin; i < end; ++i) s.push_back(slot_of(req, i));
    full_.write(req.row, begin, s);
  }

  void start() {
    TableReq req;
    req.row = *full_.alloc();
    const int64_t len = 1 + pick(150);
    cover(req, len);
    write_slots(req, 0, len);  // a cached prefix and the extend, written at admission
    const int64_t first = pick(2) == 0 ? 0 : pick(static_cast<int>(len));
    req.last_first = len;  // no earlier window: the rebuild of [0, len) is the bound
    const int32_t id = next_id_++;
    reqs_[id] = req;
    run(reqs_[id], first, len);
  }

  void grow(int32_t id, int64_t n) {
    TableReq& req = reqs_[id];
    n = std::min<int64_t>(n, kLen - req.kv_len);
    if (n <= 0) return end(id);
    cover(req, req.kv_len + n);
    write_slots(req, req.kv_len, req.kv_len + n);
    req.changed_from = std::min(req.changed_from, req.kv_len);
    run(req, req.kv_len, req.kv_len + n);
  }

  /// Swaps whole pages [a, b) of a request (still holding their SWA side) for fresh ones and
  /// rewrites those positions: the full slots (and so the SWA slots) change under the row.
  void repoint(int32_t id) {
    TableReq& req = reqs_[id];
    const int64_t whole = req.kv_len / p_;
    if (whole <= req.released) return;
    const int64_t a = req.released + pick(static_cast<int>(whole - req.released));
    const int64_t b = a + 1 + pick(static_cast<int>(whole - a));
    const auto fresh = pages_.alloc_pages(static_cast<int32_t>(b - a));
    ASSERT_TRUE(fresh.has_value());
    std::vector<int32_t> old(req.pages.begin() + a, req.pages.begin() + b);
    std::copy(fresh->begin(), fresh->end(), req.pages.begin() + a);
    write_slots(req, a * p_, b * p_);
    pages_.free(old, /*with_swa=*/true);
    req.changed_from = std::min(req.changed_from, a * p_);
  }

  void end(int32_t id) {
    TableReq& req = reqs_[id];
    const std::vector<int32_t> gone(req.pages.begin(), req.pages.begin() + req.released);
    const std::vector<int32_t> live(req.pages.begin() + req.released, req.pages.end());
    pages_.free(gone, false);
    pages_.free(live, true);
    full_.free(req.row);
    reqs_.erase(id);
  }

  /// One step of `req`: the update, its check against the rebuild, then the dead pages' SWA
  /// sides released.
  void run(TableReq& req, int64_t first, int64_t kv_len) {
    req.kv_len = kv_len;
    ReqToTokenTable& out = table_.table();
    out.mark_clean(req.row, kLen);  // its own dirty range counts what this update writes
    table_.update(req.row, first, kv_len);
    const ReqToTokenTable::DirtyRange w = out.dirty(req.row);
    ++updates;
    written += w.end - w.begin;
    row_lengths += kv_len;
    // What the full row wrote since the last step, plus the window's slide since then.
    EXPECT_LE(w.end - w.begin, (kv_len - req.changed_from) + (kv_len - req.last_first) + wl_ +
                                   2 * p_)
        << "the update rewrote more than the changed positions and the window";
    req.changed_from = kv_len;
    req.last_first = first;
    // The rebuild, from scratch.
    const int64_t lo = std::max<int64_t>(0, first - wl_) / p_ * p_;
    const auto full = full_.read(req.row, 0, kv_len);
    const auto got = out.read(req.row, 0, kv_len);
    for (int64_t i = 0; i < kv_len; ++i) {
      const SlotIndex want = i < lo ? static_cast<SlotIndex>(i % p_)
                                    : pages_.swa_slot(full[static_cast<size_t>(i)]);
      ASSERT_EQ(got[static_cast<size_t>(i)], want)
          << "row " << req.row.value() << " position " << i << " (lo " << lo << ", kv_len "
          << kv_len << ", update " << updates << ")";
    }
    const int64_t dead = SwaPages::swa_dead_pages(kv_len, wl_, p_);
    if (dead > req.released) {
      pages_.release_swa(std::span(req.pages).subspan(static_cast<size_t>(req.released),
                                                      static_cast<size_t>(dead - req.released)));
      req.released = dead;
    }
  }

  int32_t p_;
  int wl_;
  PageAllocator full_alloc_, swa_alloc_;
  SwaPages pages_;
  ReqToTokenTable full_;
  SwaTable table_;
  std::mt19937_64 rng_;
  std::map<int32_t, TableReq> reqs_;
  int32_t next_id_ = 0;
};

TEST(SwaTable, IncrementalUpdateEqualsARebuild) {
  const testing::TestSeed seed;
  int64_t updates = 0, written = 0, row_lengths = 0;
  for (int32_t page : {1, 4, 16}) {
    for (int window : {0, 3, 17, 40}) {
      SCOPED_TRACE(::testing::Message() << "page " << page << " window_left " << window);
      SwaTableWorkload w(page, window, seed + static_cast<uint64_t>(page * 100 + window));
      for (int i = 0; i < 1500 && !::testing::Test::HasFailure(); ++i) w.step();
      updates += w.updates;
      written += w.written;
      row_lengths += w.row_lengths;
    }
  }
  std::printf("%lld updates wrote %lld positions (a full rewrite would write %lld)\n",
              static_cast<long long>(updates), static_cast<long long>(written),
              static_cast<long long>(row_lengths));
  EXPECT_LT(written, row_lengths / 2);
}

TEST(SwaTable, BadRowsAndRangesAreRefused) {
  PageAllocator full_alloc(16, 4), swa_alloc(16, 4);
  SwaPages pages(full_alloc, swa_alloc);
  ReqToTokenTable full(2, 32);
  SwaTable table(full, pages, 3);
  EXPECT_THROW(SwaTable(full, pages, -1), Error);
  EXPECT_THROW(table.update(ReqSlot(1), 0, 4), Error);  // row not in use
  const ReqSlot row = *full.alloc();
  EXPECT_THROW(table.update(row, 4, 4), Error);   // no query
  EXPECT_THROW(table.update(row, 0, 33), Error);  // past the context
  EXPECT_THROW(table.update(ReqSlot(3), 0, 4), Error);
  EXPECT_EQ(table.window_begin(10), 4);  // (10 - 3) rounded down to a page of 4
  EXPECT_EQ(table.window_begin(2), 0);
}

}  // namespace
}  // namespace pagoda::kv
