#pragma once
/// Internal: the epilogue shared by direct work items and split-KV merges. Applies attention
/// sinks to a finished (normalised output, natural LSE) row and writes out / lse.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pagoda/core/float_convert.h"
#include "pagoda/kernels/cpu/attention_params.h"

namespace pagoda::kernels::cpu::detail {

inline constexpr float kLog2e = 1.44269504088896340736f;

/// Writes query row (token, qhead): o[0, Dv) is the normalised output (v_scale applied),
/// lse_nat the natural log-sum-exp over the visible keys (-inf when none was visible).
inline void write_output_row(const CpuAttentionParams& p, int64_t token, int qhead,
                             const float* o, float lse_nat) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float factor = 1.f;
  if (p.sinks != nullptr && lse_nat != neg_inf) {
    const float sink = p.sinks[qhead];
    const float mx = lse_nat > sink ? lse_nat : sink;
    const float with_sink = mx + std::log(std::exp(lse_nat - mx) + std::exp(sink - mx));
    factor = std::exp(lse_nat - with_sink);
    lse_nat = with_sink;
  }
  const int dv = p.head_dim_v;
  const int64_t off = token * p.out_stride_token + static_cast<int64_t>(qhead) * p.out_stride_head;
  switch (p.out_dtype) {
    case DType::kF32: {
      float* dst = static_cast<float*>(p.out) + off;
      for (int x = 0; x < dv; ++x) dst[x] = o[x] * factor;
      break;
    }
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + off;
      for (int x = 0; x < dv; ++x) dst[x] = f32_to_bf16_bits(o[x] * factor);
      break;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + off;
      for (int x = 0; x < dv; ++x) dst[x] = f32_to_f16_bits(o[x] * factor);
      break;
    }
    default:
      break;
  }
  if (p.lse != nullptr) {
    p.lse[token * p.lse_stride_token + static_cast<int64_t>(qhead) * p.lse_stride_head] =
        lse_nat == neg_inf ? neg_inf : lse_nat * kLog2e;
  }
}

}  // namespace pagoda::kernels::cpu::detail
