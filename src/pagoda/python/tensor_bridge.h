#pragma once
/// The seam between Python arrays and pagoda's TensorView (docs/design/python.md).
///
/// Arrays cross through DLPack (nanobind's nb::ndarray): NumPy arrays on the CPU, torch tensors on
/// the CPU or a CUDA device, with any strides. No copy is made: the view aliases the caller's
/// memory, which the caller keeps alive for the duration of the call that receives the view.
/// Where DLPack has no code for a dtype the caller may name it (`dtype_override`): "bf16" over a
/// 2-byte integer array (NumPy has no bfloat16), "fp8_e4m3" / "fp8_e5m2" over a 1-byte array.

#include <optional>
#include <string_view>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "pagoda/core/tensor_view.h"

namespace pagoda::python {

/// Any array: any framework, device, dtype, rank and strides; read-only arrays accepted.
using AnyArray = nanobind::ndarray<nanobind::ro>;

/// The DType of an array's DLPack dtype (f32, f16, bf16, fp8 e4m3fn / e5m2, i32, i64, u8), or
/// nullopt for any other.
std::optional<DType> dtype_of(const AnyArray& a);

/// A TensorView aliasing `a` (shape, element strides, device). `dtype_override` empty: the
/// array's own dtype, which must be one dtype_of() knows; otherwise a parse_dtype() name whose
/// element size equals the array's. Throws Error(kInvalidArgument) naming `name` otherwise.
TensorView to_view(const AnyArray& a, std::string_view dtype_override, std::string_view name);

/// Registers the translation of pagoda::Error into Python exceptions: kInvalidArgument and
/// kOutOfRange -> ValueError, kUnsupported -> NotImplementedError, the rest -> RuntimeError.
void register_error_translator();

}  // namespace pagoda::python
