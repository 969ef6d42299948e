#include <gtest/gtest.h>

#include "pagoda/core/check.h"
#include "pagoda/core/error.h"
#include "pagoda/core/ids.h"
#include "pagoda/core/status.h"

namespace pagoda {
namespace {

TEST(Error, RequireThrowsWithCodeAndMessage) {
  try {
    PAGODA_REQUIRE(1 + 1 == 3, kOutOfRange, "slot {} outside [0, {})", 7, 4);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_EQ(e.message(), "slot 7 outside [0, 4)");
    EXPECT_STREQ(e.what(), "out of range: slot 7 outside [0, 4)");
  }
}

TEST(Error, StatusConvertsToError) {
  EXPECT_NO_THROW(Status::ok().throw_if_error());
  Status bad(ErrorCode::kUnsupported, "head_dim 80");
  EXPECT_FALSE(bad.is_ok());
  EXPECT_THROW(bad.throw_if_error(), Error);
}

TEST(CheckDeathTest, CheckEqPrintsOperands) {
  int a = 3, b = 4;
  EXPECT_DEATH(PAGODA_CHECK_EQ(a, b), "lhs = 3, rhs = 4");
}

TEST(StrongId, DistinctAndOrdered) {
  PageId p(3);
  EXPECT_TRUE(p.valid());
  EXPECT_FALSE(PageId::invalid().valid());
  EXPECT_LT(PageId(1), PageId(2));
  EXPECT_EQ(fmt::format("{}", p), "3");
}

}  // namespace
}  // namespace pagoda
