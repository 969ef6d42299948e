// PageRefs page-run operations (retain_pages / free_pages / require_held_pages): PageAllocator's
// O(pages) overrides against the slot-list operations on a twin allocator and a plain refcount
// model, on random runs (ascending, shuffled, inside free groups, bad input), plus the default
// PageRefs expansion and the backup/restore rules. PAGODA_TEST_SEED=<n> replays a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/kv/page_allocator.h"
#include "test_seed.h"

namespace pagoda::kv {
namespace {

std::vector<SlotIndex> slots_of(std::span<const PageRun> runs, int32_t page_size) {
  std::vector<SlotIndex> out;
  for (const PageRun& r : runs) {
    for (int64_t s = int64_t{r.first} * page_size; s < (int64_t{r.first} + r.count) * page_size;
         ++s) {
      out.push_back(static_cast<SlotIndex>(s));
    }
  }
  return out;
}

std::vector<int32_t> refcounts(const PageAllocator& a) {
  std::vector<int32_t> out;
  for (int32_t p = 0; p <= a.num_pages(); ++p) out.push_back(a.refcount(PageId(p)));
  return out;
}

/// Runs the same call on both allocators: both succeed, or both throw the same code and change
/// nothing. Returns whether it succeeded.
template <typename F, typename G>
bool same_outcome(PageAllocator& runs_side, PageAllocator& slots_side, F&& by_runs, G&& by_slots) {
  const auto before = refcounts(runs_side);
  std::optional<ErrorCode> e1, e2;
  try {
    by_runs();
  } catch (const Error& e) {
    e1 = e.code();
  }
  try {
    by_slots();
  } catch (const Error& e) {
    e2 = e.code();
  }
  EXPECT_EQ(e1.has_value(), e2.has_value());
  if (e1 && e2) {
    EXPECT_EQ(*e1, *e2);
  }
  if (e1) {
    EXPECT_EQ(refcounts(runs_side), before);
  }
  return !e1;
}

TEST(PageRuns, MatchSlotOperationsOnRandomRuns) {
  const testing::TestSeed seed;
  for (int32_t P : {1, 4, 16}) {
    std::mt19937_64 rng(seed ^ static_cast<uint64_t>(P));
    constexpr int32_t kPages = 2048;
    PageAllocator a(kPages, P), b(kPages, P);
    std::vector<int32_t> model(kPages + 1, 0);
    for (int op = 0; op < 4000; ++op) {
      const auto r = rng() % 100;
      if (r < 25) {  // allocate: both hand out the same pages (same free-list order)
        const int64_t n = int64_t(1 + rng() % 64) * P;
        auto x = a.alloc(n);
        auto y = b.alloc(n);
        ASSERT_EQ(x.has_value(), y.has_value());
        if (x) {
          ASSERT_EQ(*x, *y) << "op " << op;
          for (size_t i = 0; i < x->size(); i += size_t(P)) ++model[size_t((*x)[i] / P)];
        }
        continue;
      }
      if (r < 30) {  // open or close a free group on both
        if (a.in_free_group()) {
          a.free_group_end();
          b.free_group_end();
        } else {
          a.free_group_begin();
          b.free_group_begin();
        }
        continue;
      }
      // Random runs over random pages (held or not), shuffled half the time, sometimes
      // overlapping or out of range.
      std::vector<PageRun> runs;
      const int nruns = 1 + int(rng() % 5);
      for (int k = 0; k < nruns; ++k) {
        const int32_t first = rng() % 50 == 0 ? int32_t(rng() % 3) - 1
                                              : 1 + int32_t(rng() % kPages);
        int32_t count = 1 + int32_t(rng() % 24);
        if (rng() % 40 != 0) count = std::min(count, kPages + 1 - std::max(first, 1));
        if (rng() % 60 == 0) count = 0;
        runs.push_back(PageRun{first, count});
      }
      if (rng() % 2 == 0) {
        std::sort(runs.begin(), runs.end(), [](auto& x, auto& y) { return x.first < y.first; });
      } else {
        std::shuffle(runs.begin(), runs.end(), rng);
      }
      bool valid = true;
      std::vector<int32_t> seen(kPages + 1, 0);
      for (const PageRun& run : runs) {
        if (run.count < 1 || run.first < 1 || int64_t{run.first} + run.count - 1 > kPages) {
          valid = false;
          continue;
        }
        for (int32_t p = run.first; p < run.first + run.count; ++p) {
          valid = valid && model[size_t(p)] > 0 && seen[size_t(p)]++ == 0;
        }
      }
      const auto slots = valid ? slots_of(runs, P) : std::vector<SlotIndex>{};
      const auto kind = rng() % 3;
      bool ok;
      if (!valid) {  // the slot side cannot express every bad run: only the run side is checked
        const auto before = refcounts(a);
        EXPECT_THROW(kind == 0   ? a.free_pages(runs)
                     : kind == 1 ? a.retain_pages(runs)
                                 : a.require_held_pages(runs),
                     Error)
            << "op " << op;
        EXPECT_EQ(refcounts(a), before);
        continue;
      }
      if (kind == 0) {
        ok = same_outcome(a, b, [&] { a.free_pages(runs); }, [&] { b.free(slots); });
        if (ok) {
          for (const PageRun& run : runs) {
            for (int32_t p = run.first; p < run.first + run.count; ++p) --model[size_t(p)];
          }
        }
      } else if (kind == 1) {
        ok = same_outcome(a, b, [&] { a.retain_pages(runs); }, [&] { b.retain(slots); });
        if (ok) {
          for (const PageRun& run : runs) {
            for (int32_t p = run.first; p < run.first + run.count; ++p) ++model[size_t(p)];
          }
        }
      } else {
        ok = same_outcome(a, b, [&] { a.require_held_pages(runs); },
                          [&] { b.require_held_runs(slots); });
      }
      ASSERT_TRUE(ok) << "op " << op << ": valid runs rejected";
      ASSERT_EQ(refcounts(a), refcounts(b)) << "op " << op;
      for (int32_t p = 1; p <= kPages; ++p) ASSERT_EQ(a.refcount(PageId(p)), model[size_t(p)]);
      ASSERT_EQ(a.num_free_pages(), b.num_free_pages());
      ASSERT_EQ(a.num_pending_pages(), b.num_pending_pages());
      if (op % 256 == 0) a.check_integrity();
    }
    if (a.in_free_group()) {
      a.free_group_end();
      b.free_group_end();
    }
    // Same free-list order afterwards: the next allocations agree page for page.
    EXPECT_EQ(a.alloc(a.available_size()), b.alloc(b.available_size()));
    a.check_integrity();
  }
}

TEST(PageRuns, ErrorsNameTheRunAndChangeNothing) {
  PageAllocator a(16, 4);
  const auto s = *a.alloc(8 * 4);  // pages 1..8
  const auto before = refcounts(a);
  auto expect_code = [&](ErrorCode code, std::vector<PageRun> runs) {
    try {
      a.free_pages(runs);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find("page"), std::string::npos) << e.what();
    }
    EXPECT_EQ(refcounts(a), before);
  };
  expect_code(ErrorCode::kOutOfRange, {{0, 1}});                  // reserved page 0
  expect_code(ErrorCode::kOutOfRange, {{15, 3}});                 // past the last page
  expect_code(ErrorCode::kInvalidArgument, {{2, 0}});             // empty run
  expect_code(ErrorCode::kFailedPrecondition, {{7, 3}});          // pages 9 not allocated
  expect_code(ErrorCode::kInvalidArgument, {{5, 2}, {1, 5}});     // page 5 twice, unordered
  expect_code(ErrorCode::kInvalidArgument, {{1, 2}, {2, 1}});     // page 2 twice
  a.check_integrity();
  (void)s;
}

TEST(PageRuns, FreedRunLeavesSmallestPageOnTopAndBlocksRestore) {
  PageAllocator a(32, 16);
  (void)*a.alloc(10 * 16);  // pages 1..10
  const AllocatorState state = a.backup_state();
  const PageRun runs[] = {{2, 3}, {7, 2}};
  a.free_pages(runs);
  EXPECT_THROW(a.restore_state(state), Error);  // a free since the backup
  EXPECT_EQ(a.refcount(PageId(2)), 0);
  EXPECT_EQ(a.refcount(PageId(8)), 0);
  EXPECT_EQ((*a.alloc(16))[0], 2 * 16);  // smallest freed page first
  // Pages given back by restore_state are free: naming them is rejected.
  const AllocatorState s2 = a.backup_state();
  const auto fresh = *a.alloc(2 * 16);
  a.restore_state(s2);
  const PageRun restored{fresh[0] / 16, 1};
  EXPECT_THROW(a.require_held_pages({&restored, 1}), Error);
  a.check_integrity();
}

/// A PageRefs that only implements the slot operations (forwarding to an allocator): the
/// page-run calls take the default expansion.
class SlotOnly final : public PageRefs {
 public:
  explicit SlotOnly(PageAllocator& a) : a_(a) {}
  int32_t page_size() const override { return a_.page_size(); }
  int32_t num_pages() const override { return a_.num_pages(); }
  int32_t refcount(PageId p) const override { return a_.refcount(p); }
  void retain(std::span<const SlotIndex> s) override { a_.retain(s); }
  void free(std::span<const SlotIndex> s) override { a_.free(s); }
  void require_held_runs(std::span<const SlotIndex> s) const override { a_.require_held_runs(s); }

 private:
  PageAllocator& a_;
};

TEST(PageRuns, DefaultExpansionMatchesOverride) {
  PageAllocator a(64, 4), b(64, 4);
  (void)*a.alloc(40 * 4);
  (void)*b.alloc(40 * 4);
  SlotOnly via_slots(b);
  PageRefs& generic = via_slots;
  const std::vector<PageRun> runs = {{3, 4}, {20, 1}, {30, 5}};
  a.retain_pages(runs);
  generic.retain_pages(runs);
  EXPECT_EQ(refcounts(a), refcounts(b));
  a.free_pages(runs);
  generic.free_pages(runs);
  a.free_pages(runs);
  generic.free_pages(runs);
  EXPECT_EQ(refcounts(a), refcounts(b));
  const PageRun bad{50, 2};  // never allocated
  EXPECT_THROW(generic.require_held_pages({&bad, 1}), Error);
  EXPECT_THROW(a.require_held_pages({&bad, 1}), Error);
  EXPECT_EQ(a.alloc(a.available_size()), b.alloc(b.available_size()));
}

}  // namespace
}  // namespace pagoda::kv
