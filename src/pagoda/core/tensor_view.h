#pragma once
/// TensorView: a non-owning view of a strided tensor (pointer, dtype, shape, strides, device).
/// Strides are in elements. Views never allocate or free; the owner (a KvPool, a workspace, the
/// caller) guarantees the memory outlives every view of it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "pagoda/core/device.h"
#include "pagoda/core/dtype.h"

namespace pagoda {

class TensorView {
 public:
  static constexpr int kMaxDims = 6;

  TensorView() = default;
  /// A contiguous (row-major) view of `shape`.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             Device device = Device::cpu());
  /// A view with explicit strides (in elements); `strides` must have the same rank as `shape`.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, Device device = Device::cpu());
  /// A view of any rank up to kMaxDims from runtime extents and strides (in elements; same
  /// rank), e.g. an array that crossed a language boundary (DLPack).
  TensorView(void* data, DType dtype, std::span<const int64_t> shape,
             std::span<const int64_t> strides, Device device);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  int64_t size(int dim) const { return shape_[normalize(dim)]; }
  int64_t stride(int dim) const { return strides_[normalize(dim)]; }
  /// Product of the shape (0 for an empty view).
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr || numel() == 0; }
  /// True when strides are row-major contiguous.
  bool is_contiguous() const;
  /// "[a, b, c] bf16 cuda:0"
  std::string describe() const;
  /// Same memory viewed with another contiguous shape of equal numel (requires contiguity).
  TensorView reshaped(std::initializer_list<int64_t> shape) const;
  /// The sub-view [begin, end) along dim 0.
  TensorView slice0(int64_t begin, int64_t end) const;

 private:
  int normalize(int dim) const { return dim < 0 ? dim + rank_ : dim; }
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::cpu();
  int rank_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

}  // namespace pagoda
