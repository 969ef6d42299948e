#include <gtest/gtest.h>

#include "pagoda/core/error.h"
#include "pagoda/core/tensor_view.h"

namespace pagoda {
namespace {

TEST(TensorView, ContiguousStridesAndSlices) {
  float data[24] = {};
  TensorView v(data, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(-1), 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.nbytes(), 96u);
  TensorView s = v.slice0(1, 2);
  EXPECT_EQ(s.data_as<float>(), data + 12);
  EXPECT_EQ(s.size(0), 1);
  EXPECT_EQ(v.reshaped({6, 4}).size(0), 6);
  EXPECT_EQ(v.describe(), "[2, 3, 4] f32 cpu");
}

TEST(TensorView, BadInputThrows) {
  float data[4] = {};
  TensorView v(data, DType::kF32, {4});
  EXPECT_THROW(v.slice0(2, 5), Error);
  EXPECT_THROW(v.reshaped({3}), Error);
  TensorView strided(data, DType::kF32, {2, 2}, {1, 2});
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_THROW(strided.reshaped({4}), Error);
}

}  // namespace
}  // namespace pagoda
