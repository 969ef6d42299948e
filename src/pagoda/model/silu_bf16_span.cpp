// silu_mul_bf16_span (silu_bf16_span.h): the vectorized inner loop of model::silu_mul_bf16.
#include "pagoda/model/silu_bf16_span.h"

#include <algorithm>
#include <bit>

namespace pagoda::model {

namespace {

/// exp(x) for the SwiGLU gate: Cephes' expf polynomial on x - n ln2, scaled by 2^n built in the
/// exponent bits; x clamped to [-87, 88] (2^n stays a normal f32). Past the clamp silu's g / (1 +
/// e) is g to f32 precision (g > 87), or a magnitude below about |g| 1e-38 where the true value
/// is smaller still (g < -88): both zero next to anything the GEMM adds them to. Inline
/// arithmetic, no libm call. NaN stays NaN (silu's numerator g carries it).
inline float exp_poly(float x) {
  // NaN becomes 88 (std::min returns its first argument when unordered), so the int conversion
  // below stays defined; g / (1 + e) is NaN all the same.
  x = std::max(-87.f, std::min(88.f, x));
  // Round to nearest by adding 1.5 * 2^23 (|x log2 e| < 2^22), not std::nearbyint: that is a
  // libm call on baseline x86-64 and keeps the loop below from vectorizing.
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const auto scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

}  // namespace

// Cloned per ISA; the compiler vectorizes each clone (this file is built with
// -fno-trapping-math: without it GCC keeps exp_poly's clamp as branches). The bf16 rounding is
// f32_to_bf16_bits' written as selects, without its early return.
__attribute__((target_clones("avx512f", "avx2", "default"))) void silu_mul_bf16_span(
    const float* g, const float* u, uint16_t* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const auto bits = std::bit_cast<uint32_t>(g[i] / (1.f + exp_poly(-g[i])) * u[i]);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16;
    const uint32_t quiet_nan = (bits >> 16) | 0x40;
    o[i] = static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
  }
}

}  // namespace pagoda::model
