#include "pagoda/core/tensor_view.h"

#include <fmt/format.h>

#include "pagoda/core/error.h"

namespace pagoda {

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  PAGODA_REQUIRE(rank_ <= kMaxDims, kInvalidArgument, "tensor rank {} exceeds {}", rank_, kMaxDims);
  int i = 0;
  for (int64_t s : shape) {
    PAGODA_REQUIRE(s >= 0, kInvalidArgument, "negative extent {} in dim {}", s, i);
    shape_[i++] = s;
  }
  int64_t stride = 1;
  for (int d = rank_ - 1; d >= 0; --d) {
    strides_[d] = stride;
    stride *= shape_[d];
  }
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides, Device device)
    : TensorView(data, dtype, shape, device) {
  PAGODA_REQUIRE(strides.size() == shape.size(), kInvalidArgument,
                 "strides rank {} != shape rank {}", strides.size(), shape.size());
  int i = 0;
  for (int64_t s : strides) strides_[i++] = s;
}

TensorView::TensorView(void* data, DType dtype, std::span<const int64_t> shape,
                       std::span<const int64_t> strides, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  PAGODA_REQUIRE(rank_ <= kMaxDims, kInvalidArgument, "tensor rank {} exceeds {}", rank_, kMaxDims);
  PAGODA_REQUIRE(strides.size() == shape.size(), kInvalidArgument,
                 "strides rank {} != shape rank {}", strides.size(), shape.size());
  for (int d = 0; d < rank_; ++d) {
    PAGODA_REQUIRE(shape[d] >= 0, kInvalidArgument, "negative extent {} in dim {}", shape[d], d);
    shape_[d] = shape[d];
    strides_[d] = strides[d];
  }
}

int64_t TensorView::numel() const {
  if (rank_ == 0) return data_ ? 1 : 0;
  int64_t n = 1;
  for (int d = 0; d < rank_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = rank_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::string dims;
  for (int d = 0; d < rank_; ++d) dims += fmt::format("{}{}", d ? ", " : "", shape_[d]);
  return fmt::format("[{}] {} {}", dims, dtype_name(dtype_), device_.to_string());
}

TensorView TensorView::reshaped(std::initializer_list<int64_t> shape) const {
  PAGODA_REQUIRE(is_contiguous(), kInvalidArgument, "reshape of a non-contiguous view {}",
                 describe());
  TensorView out(data_, dtype_, shape, device_);
  PAGODA_REQUIRE(out.numel() == numel(), kInvalidArgument, "reshape {} -> {} changes numel",
                 describe(), out.describe());
  return out;
}

TensorView TensorView::slice0(int64_t begin, int64_t end) const {
  PAGODA_REQUIRE(rank_ >= 1 && 0 <= begin && begin <= end && end <= shape_[0], kOutOfRange,
                 "slice [{}, {}) of {}", begin, end, describe());
  TensorView out = *this;
  out.data_ = static_cast<char*>(data_) + begin * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  out.shape_[0] = end - begin;
  return out;
}

}  // namespace pagoda
