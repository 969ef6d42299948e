#include "pagoda/kv/req_to_token.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

using Slots = std::vector<SlotIndex>;

TEST(ReqToTokenTable, AllocSkipsRowZeroAndReusesFifo) {
  ReqToTokenTable t(3, 8);
  EXPECT_EQ(t.max_reqs(), 3);
  EXPECT_EQ(t.max_context_len(), 8);
  EXPECT_EQ(t.alloc()->value(), 1);
  EXPECT_EQ(t.alloc()->value(), 2);
  EXPECT_EQ(t.alloc()->value(), 3);
  EXPECT_FALSE(t.alloc());
  t.free(ReqSlot(2));
  t.free(ReqSlot(1));
  EXPECT_EQ(t.num_free_rows(), 2);
  EXPECT_EQ(t.alloc()->value(), 2);
  EXPECT_TRUE(t.in_use(ReqSlot(2)));
  EXPECT_FALSE(t.in_use(ReqSlot(1)));
  t.check_integrity();
}

TEST(ReqToTokenTable, WriteAndRead) {
  ReqToTokenTable t(2, 8);
  const ReqSlot r = *t.alloc();
  t.write(r, 2, Slots{10, 11, 12});
  auto row = t.row(r);
  EXPECT_EQ(row.size(), 8u);
  EXPECT_EQ(row[2], 10);
  EXPECT_EQ(row[4], 12);
  auto part = t.read(r, 3, 2);
  EXPECT_EQ(Slots(part.begin(), part.end()), (Slots{11, 12}));
  EXPECT_EQ(t.data()[r.value() * t.row_stride() + 3], 11);
  EXPECT_TRUE(t.device().is_cpu());
  for (SlotIndex s : t.row(ReqSlot(0))) EXPECT_EQ(s, 0);
}

TEST(ReqToTokenTable, BadInputThrowsUnchanged) {
  ReqToTokenTable t(2, 4);
  const ReqSlot r = *t.alloc();
  t.write(r, 0, Slots{1, 2, 3, 4});
  auto expect_code = [](ErrorCode code, auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  expect_code(ErrorCode::kOutOfRange, [&] { t.write(r, 2, Slots{9, 9, 9}); });  // beyond context
  expect_code(ErrorCode::kOutOfRange, [&] { t.write(r, -1, Slots{9}); });
  expect_code(ErrorCode::kFailedPrecondition, [&] { t.write(ReqSlot(2), 0, Slots{9}); });
  expect_code(ErrorCode::kFailedPrecondition, [&] { t.write(ReqSlot(0), 0, Slots{9}); });
  expect_code(ErrorCode::kOutOfRange, [&] { t.write(ReqSlot(3), 0, Slots{9}); });
  expect_code(ErrorCode::kOutOfRange, [&] { (void)t.read(r, 3, 2); });
  expect_code(ErrorCode::kOutOfRange, [&] { (void)t.row(ReqSlot(-1)); });
  expect_code(ErrorCode::kOutOfRange, [&] { t.free(ReqSlot(0)); });
  expect_code(ErrorCode::kFailedPrecondition, [&] { t.free(ReqSlot(2)); });
  EXPECT_EQ(Slots(t.row(r).begin(), t.row(r).end()), (Slots{1, 2, 3, 4}));
  EXPECT_EQ(t.num_free_rows(), 1);
  t.free(r);
  expect_code(ErrorCode::kFailedPrecondition, [&] { t.free(r); });
  EXPECT_EQ(t.num_free_rows(), 2);
  t.check_integrity();
  EXPECT_THROW(ReqToTokenTable(1, 0), Error);
}

// The mirror protocol of the tensor-parallel leader: copy a row's dirty range cut at `upto` into
// another table, mark [0, upto) clean. After every sync the mirror must hold the row's first
// `upto` entries exactly as the table does, over random writes (rows reused, overlapping and
// out-of-order ranges, syncs cut short) — checked against the table itself, not the ranges.
// Two mirrors (the followers' and the SWA table's) sync on independent random schedules: each
// must stay exact through its own ranges.
TEST(ReqToTokenTable, DirtyRangesKeepAMirrorExact) {
  const uint32_t seed = 0xD1A7;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  constexpr int kRows = 6, kLen = 300;
  ReqToTokenTable t(kRows, kLen);
  using Mirror = ReqToTokenTable::Mirror;
  std::vector<SlotIndex> mirrors[2] = {
      std::vector<SlotIndex>(static_cast<size_t>(kRows + 1) * kLen, 0),
      std::vector<SlotIndex>(static_cast<size_t>(kRows + 1) * kLen, 0)};
  std::vector<ReqSlot> rows;
  while (auto r = t.alloc()) rows.push_back(*r);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  int64_t sent = 0, written = 0;
  for (int step = 0; step < 4000; ++step) {
    const ReqSlot row = rows[static_cast<size_t>(pick(kRows))];
    if (pick(3) != 0) {  // write a random range (decode: one entry; extend: many)
      const int len = pick(4) == 0 ? 1 + pick(80) : 1;
      const int begin = pick(kLen - len + 1);
      Slots v(static_cast<size_t>(len));
      for (SlotIndex& x : v) x = 1 + pick(1 << 20);
      t.write(row, begin, v);
      written += len;
      for (Mirror m : {Mirror::kFollowers, Mirror::kSwaTable}) {
        const ReqToTokenTable::DirtyRange d = t.dirty(row, m);
        ASSERT_LE(d.begin, begin);
        ASSERT_GE(d.end, begin + len);
      }
      continue;
    }
    const int64_t upto = 1 + pick(kLen);
    const int which = pick(2);
    const auto m = static_cast<Mirror>(which);
    std::vector<SlotIndex>& mirror = mirrors[which];
    const ReqToTokenTable::DirtyRange d = t.dirty(row, m);
    if (d.begin < d.end && d.begin < upto) {
      const int64_t end = std::min(d.end, upto);
      const auto src = t.read(row, d.begin, end - d.begin);
      std::copy(src.begin(), src.end(), mirror.begin() + row.value() * kLen + d.begin);
      sent += end - d.begin;
    }
    t.mark_clean(row, upto, m);
    const ReqToTokenTable::DirtyRange after = t.dirty(row, m);
    ASSERT_TRUE(after.begin == after.end || after.begin >= upto);
    const auto have = t.read(row, 0, upto);
    for (int64_t i = 0; i < upto; ++i) {
      ASSERT_EQ(mirror[static_cast<size_t>(row.value() * kLen + i)], have[static_cast<size_t>(i)])
          << "row " << row.value() << " position " << i << " step " << step;
    }
  }
  // For the record: a covering range can resend unchanged entries between two writes.
  std::printf("entries written %lld, sent %lld\n", static_cast<long long>(written),
              static_cast<long long>(sent));
  EXPECT_GT(sent, 0);
  EXPECT_THROW((void)t.dirty(ReqSlot(kRows + 1)), Error);
  EXPECT_THROW(t.mark_clean(ReqSlot(-1), 0), Error);
  // A write that throws leaves the range as it was.
  t.mark_clean(rows[0], kLen);
  EXPECT_THROW(t.write(rows[0], kLen - 1, Slots{1, 2}), Error);
  EXPECT_EQ(t.dirty(rows[0]).begin, t.dirty(rows[0]).end);
}

}  // namespace
}  // namespace pagoda::kv
