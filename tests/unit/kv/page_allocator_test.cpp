#include "pagoda/kv/page_allocator.h"

#include <gtest/gtest.h>

#include <vector>

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

using Slots = std::vector<SlotIndex>;

/// Snapshot of everything observable, to prove a throwing call changed nothing.
struct Snapshot {
  int64_t available;
  int32_t referenced;
  std::vector<int32_t> refcounts;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snap(const PageAllocator& a) {
  Snapshot s{a.available_size(), a.num_referenced_pages(), {}};
  for (int32_t p = 0; p <= a.num_pages(); ++p) s.refcounts.push_back(a.refcount(PageId(p)));
  return s;
}

template <typename F>
void expect_error_unchanged(PageAllocator& a, ErrorCode code, F&& f) {
  const Snapshot before = snap(a);
  try {
    f();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
  EXPECT_EQ(snap(a), before);
  a.check_integrity();
}

TEST(PageAllocator, ConstructionAndPageZeroReserved) {
  PageAllocator a(8, 4);
  EXPECT_EQ(a.page_size(), 4);
  EXPECT_EQ(a.num_pages(), 8);
  EXPECT_EQ(a.available_size(), 32);
  EXPECT_EQ(a.num_slots_total(), 36);
  EXPECT_EQ(a.refcount(PageId(0)), 0);
  auto all = a.alloc(32);
  ASSERT_TRUE(all);
  for (SlotIndex s : *all) EXPECT_GE(s, 4) << "page 0 handed out";
  EXPECT_EQ(a.available_size(), 0);
  EXPECT_FALSE(a.alloc(4));
  a.check_integrity();
  EXPECT_THROW(PageAllocator(-1, 4), Error);
  EXPECT_THROW(PageAllocator(4, 0), Error);
}

TEST(PageAllocator, AllocWholePagesAllOrNothing) {
  PageAllocator a(3, 4);
  auto s = a.alloc(8);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, (Slots{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_FALSE(a.alloc(8));  // one page left
  EXPECT_EQ(a.available_size(), 4);
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { (void)a.alloc(3); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { (void)a.alloc(-4); });
  EXPECT_EQ(a.alloc(0)->size(), 0u);
}

// sglang_spec §3.7 worked example, slot for slot (P = 4, 8 pages).
TEST(PageAllocator, SpecWorkedExample) {
  PageAllocator a(8, 4);
  auto r1 = a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{5}, Slots{-1});
  ASSERT_TRUE(r1);
  EXPECT_EQ(*r1, (Slots{4, 5, 6, 7, 8}));
  EXPECT_EQ(a.num_free_pages(), 6);  // [3..8]

  auto step2 = a.alloc_extend(std::vector<int32_t>{0, 5}, std::vector<int32_t>{6, 11},
                              Slots{-1, 8});
  ASSERT_TRUE(step2);
  EXPECT_EQ(*step2, (Slots{12, 13, 14, 15, 16, 17, 9, 10, 11, 20, 21, 22}));
  EXPECT_EQ(a.num_free_pages(), 3);  // [6, 7, 8]

  auto step3 = a.alloc_decode(std::vector<int32_t>{7, 12}, Slots{17, 22});
  ASSERT_TRUE(step3);
  EXPECT_EQ(*step3, (Slots{18, 23}));
  EXPECT_EQ(a.num_free_pages(), 3);

  auto step4 = a.alloc_decode(std::vector<int32_t>{8, 13}, Slots{18, 23});
  ASSERT_TRUE(step4);
  EXPECT_EQ(*step4, (Slots{19, 24}));
  EXPECT_EQ(a.num_free_pages(), 2);  // [7, 8]
  auto next = a.alloc(8);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->front(), 28);  // page 7 then page 8
  EXPECT_EQ(next->back(), 35);
  a.free(*next);

  // Step 5, the hazard: freeing [9, 10, 11] of page 2 without slot 8 is a partial free.
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { a.free(Slots{9, 10, 11}); });
  a.check_integrity();
}

TEST(PageAllocator, AllocExtendShortageChangesNothing) {
  PageAllocator a(2, 4);
  const Snapshot before = snap(a);
  EXPECT_FALSE(a.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{5, 4},
                              Slots{-1, -1}));
  EXPECT_EQ(snap(a), before);
  std::vector<SlotIndex> out(9);
  EXPECT_TRUE(a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{8}, Slots{-1},
                             std::span(out).first(8)));
}

TEST(PageAllocator, AllocExtendBadInputThrowsUnchanged) {
  PageAllocator a(8, 4);
  auto r = *a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{5}, Slots{-1});
  using V = std::vector<int32_t>;
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_extend(V{0, 0}, V{1}, Slots{-1}); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_extend(V{6}, V{5}, Slots{8}); });
  // misaligned last_loc: prefix 5 ends at offset 0 of its page, slot 9 is offset 1.
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_extend(V{5}, V{7}, Slots{9}); });
  // last_loc in a page nobody holds.
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition,
                         [&] { (void)a.alloc_extend(V{1}, V{2}, Slots{28}); });
  expect_error_unchanged(a, ErrorCode::kOutOfRange,
                         [&] { (void)a.alloc_extend(V{1}, V{2}, Slots{400}); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_extend(V{0}, V{2}, Slots{7}); });
  std::vector<SlotIndex> wrong(3);
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_extend(V{5}, V{7}, Slots{8}, wrong); });
  a.free(r);
}

TEST(PageAllocator, AllocDecodeAndBadInput) {
  PageAllocator a(4, 4);
  using V = std::vector<int32_t>;
  auto first = a.alloc_decode(V{1}, Slots{-1});  // empty prefix: fresh page
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, Slots{4});
  EXPECT_EQ(*a.alloc_decode(V{2}, Slots{4}), Slots{5});
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_decode(V{0}, Slots{-1}); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_decode(V{3}, Slots{4}); });  // 5 is the last
  expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                         [&] { (void)a.alloc_decode(V{3, 4}, Slots{5}); });
  (void)a.alloc(12);
  EXPECT_FALSE(a.alloc_decode(V{5}, Slots{7}));  // needs a fresh page, none left
  EXPECT_EQ(*a.alloc_decode(V{3}, Slots{5}), Slots{6});
}

TEST(PageAllocator, TokenAllocatorPageSizeOne) {
  PageAllocator a(6, 1);
  auto r = a.alloc_extend(std::vector<int32_t>{0, 0}, std::vector<int32_t>{2, 3}, Slots{-1, -1});
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (Slots{1, 2, 3, 4, 5}));
  EXPECT_EQ(*a.alloc_decode(std::vector<int32_t>{3}, Slots{2}), Slots{6});
  a.free(Slots{2, 1});
  EXPECT_EQ(*a.alloc(2), (Slots{1, 2}));  // smallest freed page reused first
  a.check_integrity();
}

TEST(PageAllocator, FreeIsLifoSmallestFirst) {
  PageAllocator a(6, 2);
  auto s = *a.alloc(12);
  a.free(Slots{10, 11, 4, 5});  // pages 5 and 2
  EXPECT_EQ(*a.alloc(2), (Slots{4, 5}));
  EXPECT_EQ(*a.alloc(2), (Slots{10, 11}));
}

TEST(PageAllocator, RefcountRetainAndRelease) {
  PageAllocator a(4, 4);
  auto s = *a.alloc(8);  // pages 1, 2
  const Slots page1{4, 5, 6, 7};
  a.retain(page1);
  EXPECT_EQ(a.refcount(PageId(1)), 2);
  a.free(s);  // page 1 -> 1 holder, page 2 -> free
  EXPECT_EQ(a.refcount(PageId(1)), 1);
  EXPECT_EQ(a.refcount(PageId(2)), 0);
  EXPECT_EQ(a.num_free_pages() + a.num_referenced_pages(), a.num_pages());
  a.free(Slots{4, 5});  // the used prefix of a page is a valid run
  EXPECT_EQ(a.refcount(PageId(1)), 0);
  EXPECT_EQ(a.available_size(), 16);
  a.check_integrity();
}

TEST(PageAllocator, BadFreesThrowUnchanged) {
  PageAllocator a(4, 4);
  auto s = *a.alloc(8);  // pages 1, 2
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.free(Slots{12}); });  // foreign
  expect_error_unchanged(a, ErrorCode::kOutOfRange, [&] { a.free(Slots{99}); });
  expect_error_unchanged(a, ErrorCode::kOutOfRange, [&] { a.free(Slots{-1}); });
  expect_error_unchanged(a, ErrorCode::kOutOfRange, [&] { a.free(Slots{0}); });  // page 0
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { a.free(Slots{4, 4}); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { a.free(Slots{5, 6}); });
  expect_error_unchanged(a, ErrorCode::kInvalidArgument, [&] { a.free(Slots{4, 6}); });
  // a valid run followed by a bad entry: nothing is freed.
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.free(Slots{4, 5, 12}); });
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.retain(Slots{12}); });
  a.free(s);
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.free(s); });  // double
  expect_error_unchanged(a, ErrorCode::kOutOfRange, [&] { (void)a.refcount(PageId(5)); });
}

TEST(PageAllocator, FreeGroupDefersReturn) {
  PageAllocator a(4, 2);
  auto s = *a.alloc(8);
  a.free_group_begin();
  EXPECT_TRUE(a.in_free_group());
  a.free(Slots{4, 5});
  a.free(Slots{2, 3});
  EXPECT_EQ(a.available_size(), 0);
  EXPECT_EQ(a.num_pending_pages(), 2);
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.free(Slots{2}); });
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.free_group_begin(); });
  a.check_integrity();
  a.free_group_end();
  EXPECT_EQ(a.available_size(), 4);
  EXPECT_EQ(a.num_pending_pages(), 0);
  EXPECT_EQ(*a.alloc(2), (Slots{2, 3}));
  EXPECT_THROW(a.free_group_end(), Error);
  a.check_integrity();
}

TEST(PageAllocator, BackupRestoreIsExact) {
  PageAllocator a(8, 4);
  auto keep = *a.alloc(4);
  const Snapshot before = snap(a);
  const AllocatorState state = a.backup_state();
  auto scratch = a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{9}, Slots{-1});
  ASSERT_TRUE(scratch);
  (void)a.alloc_decode(std::vector<int32_t>{10}, Slots{scratch->back()});
  a.restore_state(state);
  EXPECT_EQ(snap(a), before);
  a.check_integrity();
  // The same pages come out again, in the same order.
  auto again = a.alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{9}, Slots{-1});
  EXPECT_EQ(*again, *scratch);
  a.free(*again);
}

TEST(PageAllocator, RestoreAfterFreeIsRejected) {
  PageAllocator a(8, 4);
  auto keep = *a.alloc(4);
  const AllocatorState state = a.backup_state();
  auto scratch = *a.alloc(4);
  a.free(scratch);
  expect_error_unchanged(a, ErrorCode::kFailedPrecondition, [&] { a.restore_state(state); });
  PageAllocator other(8, 4);
  EXPECT_THROW(other.restore_state(state), Error);
}

TEST(PageAllocator, ClearResets) {
  PageAllocator a(5, 2);
  (void)a.alloc(6);
  a.clear();
  EXPECT_EQ(a.available_size(), 10);
  EXPECT_EQ(a.num_referenced_pages(), 0);
  EXPECT_EQ(*a.alloc(2), (Slots{2, 3}));
  a.check_integrity();
}

TEST(PageAllocator, UnorderedRunsAreValidatedWithoutSortingAndLeftUnchanged) {
  for (int32_t P : {1, 4}) {
    PageAllocator a(8, P);
    const auto s = *a.alloc(4 * P);  // pages 1..4
    auto run = [&](int page) {
      Slots r;
      for (int i = 0; i < P; ++i) r.push_back(page * P + i);
      return r;
    };
    auto cat = [](std::initializer_list<Slots> parts) {
      Slots out;
      for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
      return out;
    };
    // A page named twice, not adjacently, in a descending list: the duplicate marks are undone.
    expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                           [&] { a.free(cat({run(3), run(1), run(2), run(1)})); });
    expect_error_unchanged(a, ErrorCode::kInvalidArgument,
                           [&] { a.retain(cat({run(4), run(2), run(4)})); });
    // A descending free still leaves the smallest freed page on top of the free list.
    a.free(cat({run(4), run(2)}));
    auto next = a.alloc(P);
    ASSERT_TRUE(next);
    EXPECT_EQ((*next)[0], 2 * P);
    a.free(*next);
    a.free(cat({run(3), run(1)}));
    EXPECT_EQ(a.num_free_pages(), 8);
    a.check_integrity();
    (void)s;
  }
}

}  // namespace
}  // namespace pagoda::kv
