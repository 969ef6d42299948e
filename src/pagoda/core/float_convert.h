#pragma once
/// Exact scalar conversions between f32 and the 16- and 8-bit float formats (host side).
///
/// Encoding rounds to nearest, ties to even, with gradual underflow (subnormals), like the
/// hardware converters. Overflow behaviour per format:
///   f16, bf16: IEEE (overflow -> inf, NaN stays NaN);
///   fp8 e4m3fn, e5m2: saturating to the largest finite value (CUDA's __NV_SATFINITE, which the
///   KV-cache quantisers use); NaN stays NaN; +-inf saturates too.
/// Decoding is exact. All functions are constexpr and allocation-free.

#include <bit>
#include <cstdint>

namespace pagoda {

namespace detail {

/// A binary minifloat format with E exponent bits and M mantissa bits (sign bit on top).
struct MiniFloatFormat {
  int exp_bits;
  int mant_bits;
  int bias;
  uint32_t max_finite_code;  ///< largest finite magnitude code (sign bit clear)
  uint32_t nan_code;         ///< canonical quiet NaN code (sign bit clear)
  uint32_t inf_code;         ///< infinity code, or 0 when the format has none
  bool saturate;             ///< overflow -> max finite (true) or -> inf (false)
};

inline constexpr MiniFloatFormat kF16Format{5, 10, 15, 0x7BFF, 0x7E00, 0x7C00, false};
inline constexpr MiniFloatFormat kE4M3Format{4, 3, 7, 0x7E, 0x7F, 0, true};
inline constexpr MiniFloatFormat kE5M2Format{5, 2, 15, 0x7B, 0x7F, 0x7C, true};

constexpr uint32_t encode_minifloat(float x, const MiniFloatFormat& f) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 31) << (f.exp_bits + f.mant_bits);
  const int exp8 = static_cast<int>((bits >> 23) & 0xFF);
  const uint32_t mant23 = bits & 0x7FFFFF;
  if (exp8 == 0xFF) {
    if (mant23 != 0) return sign | f.nan_code;
    return sign | (f.saturate ? f.max_finite_code : f.inf_code);
  }
  if (exp8 == 0) return sign;  // f32 zero or subnormal: far below every target's smallest value
  const int e = exp8 - 127;
  const int emin = 1 - f.bias;
  const uint64_t sig = (uint64_t{1} << 23) | mant23;
  int shift = 23 - f.mant_bits;
  if (e < emin) shift += emin - e;
  if (shift > 25) return sign;
  uint64_t q = sig >> shift;
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  uint64_t code;
  if (e >= emin) {
    int ee = e;
    if (q == (uint64_t{1} << (f.mant_bits + 1))) {
      ++ee;
      q >>= 1;
    }
    const int64_t biased = ee + f.bias;
    if (biased >= (int64_t{1} << f.exp_bits)) {
      code = uint64_t{0xFFFFFFFF};
    } else {
      code = (static_cast<uint64_t>(biased) << f.mant_bits) | (q - (uint64_t{1} << f.mant_bits));
    }
  } else {
    code = q;  // subnormal; q == 2^M lands exactly on the smallest normal code
  }
  if (code > f.max_finite_code) {
    return sign | (f.saturate ? f.max_finite_code : f.inf_code);
  }
  return sign | static_cast<uint32_t>(code);
}

constexpr float decode_minifloat(uint32_t code, const MiniFloatFormat& f) {
  const uint32_t sign = (code >> (f.exp_bits + f.mant_bits)) & 1;
  const uint32_t mag = code & ((1u << (f.exp_bits + f.mant_bits)) - 1);
  const uint32_t exp_field = mag >> f.mant_bits;
  const uint32_t mant = mag & ((1u << f.mant_bits) - 1);
  const uint32_t sign32 = sign << 31;
  const bool is_nan = f.inf_code != 0 ? (exp_field == (1u << f.exp_bits) - 1 && mant != 0)
                                      : (mag == f.nan_code);
  if (is_nan) return std::bit_cast<float>(sign32 | 0x7FC00000u);
  if (f.inf_code != 0 && mag == f.inf_code) return std::bit_cast<float>(sign32 | 0x7F800000u);
  if (exp_field == 0) {
    // subnormal: mant * 2^(1 - bias - M), exact in f32
    const int e = 1 - f.bias - f.mant_bits;
    const float scale = std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23);
    const float v = static_cast<float>(mant) * scale;
    return sign ? -v : v;
  }
  const uint32_t e32 = exp_field - static_cast<uint32_t>(f.bias) + 127u;
  return std::bit_cast<float>(sign32 | (e32 << 23) | (mant << (23 - f.mant_bits)));
}

}  // namespace detail

/// f32 -> IEEE binary16 bits (RNE, overflow to inf).
constexpr uint16_t f32_to_f16_bits(float x) {
  return static_cast<uint16_t>(detail::encode_minifloat(x, detail::kF16Format));
}
/// IEEE binary16 bits -> f32 (exact).
constexpr float f16_bits_to_f32(uint16_t h) { return detail::decode_minifloat(h, detail::kF16Format); }

/// f32 -> bfloat16 bits (RNE; NaN stays a quiet NaN).
constexpr uint16_t f32_to_bf16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
/// bfloat16 bits -> f32 (exact).
constexpr float bf16_bits_to_f32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

/// f32 -> fp8 e4m3fn byte (RNE, saturating, NaN -> 0x7F with sign).
constexpr uint8_t f32_to_e4m3(float x) {
  return static_cast<uint8_t>(detail::encode_minifloat(x, detail::kE4M3Format));
}
/// fp8 e4m3fn byte -> f32 (exact).
constexpr float e4m3_to_f32(uint8_t v) { return detail::decode_minifloat(v, detail::kE4M3Format); }

/// f32 -> fp8 e5m2 byte (RNE, saturating, NaN -> 0x7F with sign).
constexpr uint8_t f32_to_e5m2(float x) {
  return static_cast<uint8_t>(detail::encode_minifloat(x, detail::kE5M2Format));
}
/// fp8 e5m2 byte -> f32 (exact).
constexpr float e5m2_to_f32(uint8_t v) { return detail::decode_minifloat(v, detail::kE5M2Format); }

}  // namespace pagoda

#include <cstddef>
#include <cstring>

#include "pagoda/core/dtype.h"

namespace pagoda {

/// Reads element i of a float array of dtype t as f32 (host memory). Integer dtypes are
/// converted by value. Exact for every float dtype.
inline float read_as_f32(const void* base, DType t, size_t i) {
  const auto* p = static_cast<const unsigned char*>(base);
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return f16_bits_to_f32(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return bf16_bits_to_f32(v); }
    case DType::kFp8E4M3: return e4m3_to_f32(p[i]);
    case DType::kFp8E5M2: return e5m2_to_f32(p[i]);
    case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return static_cast<float>(v); }
    case DType::kI64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return static_cast<float>(v); }
    case DType::kU8: return static_cast<float>(p[i]);
  }
  return 0.0f;
}

/// Writes f32 value v into element i of an array of dtype t (host memory), rounding as the
/// encoders above do. Integer dtypes truncate toward zero.
inline void write_from_f32(void* base, DType t, size_t i, float v) {
  auto* p = static_cast<unsigned char*>(base);
  switch (t) {
    case DType::kF32: std::memcpy(p + 4 * i, &v, 4); return;
    case DType::kF16: { uint16_t h = f32_to_f16_bits(v); std::memcpy(p + 2 * i, &h, 2); return; }
    case DType::kBF16: { uint16_t b = f32_to_bf16_bits(v); std::memcpy(p + 2 * i, &b, 2); return; }
    case DType::kFp8E4M3: p[i] = f32_to_e4m3(v); return;
    case DType::kFp8E5M2: p[i] = f32_to_e5m2(v); return;
    case DType::kI32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p + 4 * i, &x, 4); return; }
    case DType::kI64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p + 8 * i, &x, 8); return; }
    case DType::kU8: p[i] = static_cast<unsigned char>(v); return;
  }
}

}  // namespace pagoda
