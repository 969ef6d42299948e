#include "pagoda/python/tensor_bridge.h"

#include <array>
#include <string>

#include "pagoda/core/error.h"

namespace nb = nanobind;

namespace pagoda::python {

std::optional<DType> dtype_of(const AnyArray& a) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes != 1) return std::nullopt;
  using Code = nb::dlpack::dtype_code;
  switch (static_cast<Code>(t.code)) {
    case Code::Float:
      if (t.bits == 32) return DType::kF32;
      if (t.bits == 16) return DType::kF16;
      return std::nullopt;
    case Code::Bfloat:
      return t.bits == 16 ? std::optional(DType::kBF16) : std::nullopt;
    case Code::Float8_E4M3FN:
      return DType::kFp8E4M3;
    case Code::Float8_E5M2:
      return DType::kFp8E5M2;
    case Code::Int:
      if (t.bits == 32) return DType::kI32;
      if (t.bits == 64) return DType::kI64;
      return std::nullopt;
    case Code::UInt:
    case Code::Bool:
      return t.bits == 8 ? std::optional(DType::kU8) : std::nullopt;
    default:
      return std::nullopt;
  }
}

TensorView to_view(const AnyArray& a, std::string_view dtype_override, std::string_view name) {
  DType dtype;
  if (dtype_override.empty()) {
    const std::optional<DType> own = dtype_of(a);
    PAGODA_REQUIRE(own.has_value(), kInvalidArgument,
                   "{}: unsupported array dtype (DLPack code {}, {} bits)", name, a.dtype().code,
                   a.dtype().bits);
    dtype = *own;
  } else {
    const std::optional<DType> named = parse_dtype(dtype_override);
    PAGODA_REQUIRE(named.has_value(), kInvalidArgument, "{}: unknown dtype '{}'", name,
                   dtype_override);
    PAGODA_REQUIRE(dtype_size(*named) * 8 == a.dtype().bits, kInvalidArgument,
                   "{}: dtype {} needs {}-bit elements, the array has {}-bit ones", name,
                   dtype_override, dtype_size(*named) * 8, a.dtype().bits);
    dtype = *named;
  }
  Device device;
  if (a.device_type() == nb::device::cpu::value) {
    device = Device::cpu();
  } else if (a.device_type() == nb::device::cuda::value) {
    device = Device::cuda(a.device_id());
  } else {
    throw_error(ErrorCode::kInvalidArgument, "{}: arrays must live on the CPU or a CUDA device "
                "(DLPack device type {})", name, a.device_type());
  }
  const int rank = static_cast<int>(a.ndim());
  PAGODA_REQUIRE(rank <= TensorView::kMaxDims, kInvalidArgument, "{}: rank {} exceeds {}", name,
                 rank, TensorView::kMaxDims);
  std::array<int64_t, TensorView::kMaxDims> shape{};
  std::array<int64_t, TensorView::kMaxDims> strides{};
  for (int d = 0; d < rank; ++d) {
    shape[d] = static_cast<int64_t>(a.shape(d));
    strides[d] = a.stride(d);
  }
  return TensorView(const_cast<void*>(a.data()), dtype, std::span(shape.data(), rank),
                    std::span(strides.data(), rank), device);
}

void register_error_translator() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const std::string text = e.message();
      switch (e.code()) {
        case ErrorCode::kInvalidArgument:
        case ErrorCode::kOutOfRange:
          PyErr_SetString(PyExc_ValueError, text.c_str());
          break;
        case ErrorCode::kUnsupported:
          PyErr_SetString(PyExc_NotImplementedError, text.c_str());
          break;
        default:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          break;
      }
    }
  });
}

}  // namespace pagoda::python
