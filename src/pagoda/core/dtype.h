#pragma once
/// Element types of tensors and KV storage. FP8 values are stored as raw bytes (uint8) and
/// interpreted through this tag; conversions live in float_convert.h (exact, host and device).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <fmt/format.h>

namespace pagoda {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFp8E4M3,  ///< OCP e4m3fn: no infinities, max 448, one NaN pattern per sign
  kFp8E5M2,  ///< OCP e5m2: IEEE-like, max 57344, has infinities
  kI32,
  kI64,
  kU8,
};

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kFp8E4M3: return 1;
    case DType::kFp8E5M2: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kFp8E4M3 ||
         t == DType::kFp8E5M2;
}
constexpr bool dtype_is_fp8(DType t) { return t == DType::kFp8E4M3 || t == DType::kFp8E5M2; }

/// Canonical short name: "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8".
std::string_view dtype_name(DType t);
/// Parses a canonical name or a common alias ("float32", "half", "bfloat16", "e4m3", "fp8", ...).
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace pagoda

template <>
struct fmt::formatter<pagoda::DType> : fmt::formatter<std::string_view> {
  auto format(pagoda::DType t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(pagoda::dtype_name(t), ctx);
  }
};
