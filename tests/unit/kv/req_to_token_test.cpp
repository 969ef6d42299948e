#include "pagoda/kv/req_to_token.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace pagoda::kv
