#include "pagoda/core/dtype.h"

#include <array>
#include <utility>

namespace pagoda {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kFp8E4M3: return "fp8_e4m3";
    case DType::kFp8E5M2: return "fp8_e5m2";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, DType>, 20> kNames{{
      {"f32", DType::kF32},         {"float32", DType::kF32},     {"float", DType::kF32},
      {"f16", DType::kF16},         {"float16", DType::kF16},     {"half", DType::kF16},
      {"fp16", DType::kF16},        {"bf16", DType::kBF16},       {"bfloat16", DType::kBF16},
      {"fp8_e4m3", DType::kFp8E4M3}, {"e4m3", DType::kFp8E4M3},   {"fp8", DType::kFp8E4M3},
      {"fp8_e5m2", DType::kFp8E5M2}, {"e5m2", DType::kFp8E5M2},   {"i32", DType::kI32},
      {"int32", DType::kI32},       {"i64", DType::kI64},         {"int64", DType::kI64},
      {"u8", DType::kU8},           {"uint8", DType::kU8},
  }};
  for (const auto& [n, t] : kNames) {
    if (n == name) return t;
  }
  return std::nullopt;
}

}  // namespace pagoda
