#include <gtest/gtest.h>

#include <vector>

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

TEST(TensorView, RuntimeExtentsAndStrides) {
  float data[24] = {};
  const std::vector<int64_t> shape{2, 4, 3};
  const std::vector<int64_t> strides{12, 1, 4};  // a permuted view of [2, 3, 4]
  TensorView v(data, DType::kF32, shape, strides, Device::cuda(1));
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.size(1), 4);
  EXPECT_EQ(v.stride(2), 4);
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.device(), Device::cuda(1));
  EXPECT_EQ(v.numel(), 24);
  const std::vector<int64_t> bad_shape{2, -1};
  const std::vector<int64_t> two{1, 1};
  EXPECT_THROW(TensorView(data, DType::kF32, bad_shape, two, Device::cpu()), Error);
  EXPECT_THROW(TensorView(data, DType::kF32, shape, two, Device::cpu()), Error);
  const std::vector<int64_t> seven(7, 1);
  EXPECT_THROW(TensorView(data, DType::kF32, seven, seven, Device::cpu()), Error);
}

}  // namespace
}  // namespace pagoda
