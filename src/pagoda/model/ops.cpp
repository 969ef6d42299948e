#include "pagoda/model/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "pagoda/core/check.h"
#include "pagoda/model/silu_bf16_span.h"

namespace pagoda::model {

void set_blas_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

void linear(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
            float beta) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.f, x, static_cast<int>(k), w, static_cast<int>(k), beta, y,
              static_cast<int>(n));
}

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
              float eps) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kParallelMinElems)
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * dim;
    float* o = out + t * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

namespace {

/// Calls f(t, i, n) for spans [i, i + n) of the rows t < rows of a gated activation of width
/// `inter`, over the threads: chunks of a row, so one decode row still spreads over them.
template <typename F>
void over_row_chunks(int64_t rows, int64_t inter, const F& f) {
  constexpr int64_t kChunk = 2048;
  const int64_t chunks = (inter + kChunk - 1) / kChunk;
#pragma omp parallel for collapse(2) schedule(static) if (rows * inter >= kParallelMinElems)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t c = 0; c < chunks; ++c)
      f(t, c * kChunk, std::min(inter, (c + 1) * kChunk) - c * kChunk);
}

}  // namespace

void silu_mul(const float* gate_up, float* out, int64_t rows, int64_t inter) {
  over_row_chunks(rows, inter, [&](int64_t t, int64_t i0, int64_t n) {
    const float* g = gate_up + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = i0; i < i0 + n; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  });
}

void silu_mul_bf16(const float* gate_up, uint16_t* out, int64_t rows, int64_t inter) {
  over_row_chunks(rows, inter, [&](int64_t t, int64_t i, int64_t n) {
    const float* g = gate_up + t * 2 * inter + i;
    silu_mul_bf16_span(g, g + inter, out + t * inter + i, n);
  });
}

void gelu_tanh_mul(const float* gate_up, float* out, int64_t rows, int64_t inter) {
  const float k = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
  for (int64_t t = 0; t < rows; ++t) {
    const float* g = gate_up + t * 2 * inter;
    const float* u = g + inter;
    float* o = out + t * inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float x = g[i];
      o[i] = 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x))) * u[i];
    }
  }
}

void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

Rope::Rope(const RopeConfig& c, int head_dim, int rotary_dim) : head_dim_(head_dim) {
  PAGODA_CHECK(head_dim % 2 == 0);
  PAGODA_CHECK(rotary_dim >= 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0);
  // The frequencies of a rotary_dim-wide RoPE; the pairs past it get 0 (no rotation).
  const int dim = rotary_dim > 0 ? rotary_dim : head_dim;
  const int half = dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    // HF: 1 / theta ** (arange(0, D, 2).float() / D), computed in f32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq_[i] = 1.0 / std::pow(c.theta, static_cast<double>(expo));
  }
  if (c.scaling == RopeScalingKind::kLinear) {
    for (double& f : inv_freq_) f /= c.factor;
  } else if (c.scaling == RopeScalingKind::kLlama3) {
    const double old_len = static_cast<double>(c.original_max_position);
    const double low_wavelen = old_len / c.low_freq_factor;
    const double high_wavelen = old_len / c.high_freq_factor;
    for (double& f : inv_freq_) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = f / c.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
        f = (1.0 - smooth) * f / c.factor + smooth * f;
      }
    }
  } else if (c.scaling == RopeScalingKind::kYarn) {
    // DeepSeek's YaRN: original frequencies below the correction range, interpolated (/ factor)
    // above it, a linear ramp between; cos / sin scaled by mscale / mscale_all_dim's mscale.
    const double max_pos = static_cast<double>(c.original_max_position);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(c.theta));
    };
    const double low = std::max(std::floor(correction_dim(c.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(c.beta_slow)), double(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      inv_freq_[i] = inv_freq_[i] / c.factor * ramp + inv_freq_[i] * (1.0 - ramp);
    }
    attention_factor_ =
        yarn_get_mscale(c.factor, c.mscale) / yarn_get_mscale(c.factor, c.mscale_all_dim);
  }
  inv_freq_.resize(static_cast<size_t>(head_dim / 2), 0.0);
  inv_freq_f32_.assign(inv_freq_.begin(), inv_freq_.end());
}

void Rope::apply(float* x, std::span<const int32_t> positions, int num_heads) const {
  const int half = head_dim_ / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (size_t t = 0; t < positions.size(); ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * inv_freq_f32_[i];
      cos_t[i] = std::cos(angle);
      sin_t[i] = std::sin(angle);
    }
    float* row = x + static_cast<int64_t>(t) * num_heads * head_dim_;
    for (int h = 0; h < num_heads; ++h) {
      float* v = row + h * head_dim_;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_t[i] - b * sin_t[i];
        v[i + half] = b * cos_t[i] + a * sin_t[i];
      }
    }
  }
}

}  // namespace pagoda::model
